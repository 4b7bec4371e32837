"""Python-side handles for kernel-language functions: `@func` and the custom-adjoint decorators."""
from __future__ import annotations

import ast
import inspect
import textwrap
from dataclasses import dataclass


@dataclass
class Source:
    """A user function's parsed source, with the offsets that map AST positions to file positions."""
    tree: ast.FunctionDef
    filename: str
    first_line: int        # file line of the `def` (decorators excluded)
    indent: int            # columns removed by dedent
    lines: list[str]       # the file's lines, for error messages

    @classmethod
    def of(cls, fn) -> "Source":
        try:
            lines, first = inspect.getsourcelines(fn)
        except (OSError, TypeError) as e:
            raise ValueError(f"cannot read the source of {fn.__qualname__}: kernels must be defined in a "
                             f"file, not typed at an interactive prompt ({e})") from None
        text = "".join(lines)
        dedented = textwrap.dedent(text)
        indent = len(lines[0]) - len(lines[0].lstrip())
        tree = ast.parse(dedented).body[0]
        if not isinstance(tree, ast.FunctionDef):
            raise ValueError(f"{fn.__qualname__} is not a plain function definition")
        filename = inspect.getsourcefile(fn) or "<unknown>"
        try:
            with open(filename) as f:
                file_lines = f.read().splitlines()
        except OSError:
            file_lines = []
        return cls(tree, filename, first, indent, file_lines)

    def position(self, node) -> tuple[int, int]:
        return self.first_line + node.lineno - 1, node.col_offset + self.indent

    def line_text(self, lineno: int) -> str:
        return self.lines[lineno - 1] if 0 < lineno <= len(self.lines) else ""


class Func:
    """A device function (`@func`): inlined at each call site of a kernel or another func."""

    def __init__(self, fn):
        self.fn = fn
        self.__name__ = fn.__name__
        self.__qualname__ = fn.__qualname__
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn
        self._source = None

    @property
    def source(self) -> Source:
        if self._source is None:
            self._source = Source.of(self.fn)
        return self._source

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"@func {self.__name__} can only be called inside a @kernel or another @func")

    def __repr__(self) -> str:
        return f"<func {self.__qualname__}>"


def func(fn) -> Func:
    """Mark `fn` as a device function callable from kernels (inlined, differentiated with them).

    Example::

        @stepper.func
        def spring(x: stepper.vec3, k: float) -> stepper.vec3:
            return -k * x
    """
    return Func(fn)
