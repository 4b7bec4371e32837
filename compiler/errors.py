"""The two errors users see: bad kernel source (`CompileError`) and a refused overwrite (`OverwriteError`).

Both speak about the user's code: where it is and how to fix it, never about our internals.
"""
from __future__ import annotations


class OverwriteError(RuntimeError):
    """Data that a recorded operation still needs for its gradient was, or would be, overwritten.

    Raised when a launch or copy on a recording `Tape` writes an array that an earlier recorded
    operation read, and by `Tape.backward` when such an array was modified after it was recorded.
    The message names the operations, the argument and the fix.
    """


class CompileError(Exception):
    """Kernel source that cannot be compiled, reported at the user's line like a C compiler would.

    ``str(err)`` reads::

        model.py:12:9: cannot assign float64 to 'x', which is float32
            x = y * 2.0
                ^
        hint: write float32(...) or give x a float64 initial value

    `lineno` is 1-based and `col` 0-based (as ``ast`` gives them: ``node.lineno``,
    ``node.col_offset``); the header shows the column 1-based, as compilers do. `end_col` (0-based,
    exclusive, optional) underlines the whole expression. Any of the location parts may be omitted.
    """

    def __init__(self, message: str, filename: str | None = None, lineno: int | None = None,
                 col: int | None = None, source_line: str | None = None, hint: str | None = None,
                 end_col: int | None = None):
        super().__init__(message, filename, lineno, col, source_line, hint, end_col)
        self.message = message
        self.filename = filename
        self.lineno = lineno
        self.col = col
        self.source_line = source_line
        self.hint = hint
        self.end_col = end_col

    def __str__(self) -> str:
        where = [str(part) for part in (self.filename, self.lineno) if part is not None]
        if where and self.lineno is not None and self.col is not None:
            where.append(str(self.col + 1))
        lines = [f"{':'.join(where)}: {self.message}" if where else self.message]
        if self.source_line is not None and self.source_line.strip():
            text = self.source_line.rstrip("\r\n")
            indent = len(text) - len(text.lstrip())
            lines.append("    " + text.strip())
            if self.col is not None and self.col >= indent:
                width = 1
                if self.end_col is not None and self.end_col > self.col + 1:
                    width = min(self.end_col, len(text)) - self.col
                lines.append("    " + " " * (self.col - indent) + "^" + "~" * max(width - 1, 0))
        if self.hint:
            lines.append(f"hint: {self.hint}")
        return "\n".join(lines)


def raise_if_out_of_bounds(module, kernel) -> None:
    """After a debug launch: raise IndexError at the kernel's line if its module recorded an
    out-of-bounds index (`module.error_site`, `error_index` and `sites`, on any device), and reset it."""
    site = module.error_site.value
    if site < 0:
        return
    module.error_site.value = -1
    name, arr, loc = module.sites[site]
    index = list(module.error_index)
    raise IndexError(f"{loc}: kernel '{kernel.__name__}' indexed array '{arr}' out of bounds at {index} "
                     "(first failure shown; checked because debug=True)")
