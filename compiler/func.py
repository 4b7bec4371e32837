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

    def __init__(self, fn, native: "NativeSource | None" = None):
        self.fn = fn
        self.native = native
        self.grad: Func | None = None       # set by @func_grad(self)
        self.replay: Func | None = None     # set by @func_replay(self)
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


@dataclass(frozen=True)
class NativeSource:
    snippet: str
    adj_snippet: str | None
    filename: str
    lineno: int          # the decorator's line: compiler errors in the snippet point here


def func_grad(f: Func):
    """Replace the generated adjoint of `f` with your own.

    The decorated function takes f's inputs followed by the adjoints of f's outputs and adds to
    the inputs' adjoints with ``adjoint[x] += ...``::

        @stepper.func_grad(safe_sqrt)
        def adj_safe_sqrt(x: float, adj_ret: float):
            adjoint[x] += adj_ret * 0.5 / stepper.max(stepper.sqrt(x), 1e-6)
    """
    _expect_func(f, "func_grad")

    def register(g):
        f.grad = Func(g)
        return f.grad
    return register


def func_replay(f: Func):
    """What runs in place of `f` when the adjoint kernel replays the forward: use it for functions
    with side effects (atomics, counters) whose results the replay must read back, not redo."""
    _expect_func(f, "func_replay")

    def register(g):
        f.replay = Func(g)
        return f.replay
    return register


def func_native(snippet: str, adj_snippet: str | None = None):
    """A device function written in C++ (CPU) / CUDA (GPU): `snippet` is its body, its arguments
    are the decorated function's (annotated) arguments, and it returns the annotated type.
    `adj_snippet` is the body of its adjoint: it reads the arguments and ``adj_ret`` (the output's
    adjoint) and adds to ``adj_<arg>`` for each argument. Without it, differentiating through the function
    (on a Tape, with arrays that require grad) is an error naming it."""
    frame = inspect.stack()[1]

    def register(fn):
        return Func(fn, NativeSource(snippet, adj_snippet, frame.filename, frame.lineno))
    return register


def _expect_func(f, name):
    if not isinstance(f, Func):
        raise TypeError(f"@{name}(f) expects a @func, got {f!r}")


class _AdjointMarker:
    """`adjoint[x] += value` inside a @func_grad body adds to the adjoint of input x."""

    def __getitem__(self, key):
        raise RuntimeError("adjoint[...] can only be used inside a @func_grad function")

    def __repr__(self) -> str:
        return "<adjoint>"


adjoint = _AdjointMarker()
