"""The typed IR between Python's AST and C++.

Two kinds of values: `Temp`s are assigned exactly once per execution of their block (SSA within
straight-line code) and `Var`s are mutable locals that carry values across control flow (user
variables, loop-carried state, flags). Adjoint rules read Temps only; that is what makes the reverse
sweep correct when Vars are overwritten later. Control flow is structured (If, Loop); `break`,
`continue` and `return` are lowered to flags by the frontend, so every started iteration runs to
its end and the reverse sweep can mirror it exactly.

Every statement carries the user's source location so codegen can emit `#line` directives and
errors can point at the user's code.
"""
from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import Union

from .types import ArrayType, ValueType


@dataclass(frozen=True)
class Loc:
    filename: str
    lineno: int
    col: int = 0

    def __str__(self) -> str:
        return f"{self.filename}:{self.lineno}"


_ids = itertools.count()


@dataclass(frozen=True, eq=False)
class Temp:
    type: ValueType
    id: int = field(default_factory=lambda: next(_ids))

    @property
    def name(self) -> str:
        return f"t{self.id}"


@dataclass(frozen=True, eq=False)
class Var:
    hint: str
    type: ValueType
    id: int = field(default_factory=lambda: next(_ids))

    @property
    def name(self) -> str:
        return f"v{self.id}_{self.hint}"


@dataclass(frozen=True)
class Const:
    value: object          # a Python number or bool; 0 for the zero vector/matrix
    type: ValueType
    weak: bool = False     # an untyped Python literal, which adopts its partner's type


@dataclass(frozen=True)
class Param:
    name: str
    type: ValueType | ArrayType
    index: int


@dataclass(frozen=True)
class ArrayRef:
    """An array argument, or its adjoint array (in adjoint functions)."""
    param: Param
    adjoint: bool = False

    @property
    def type(self) -> ArrayType:
        return self.param.type


Operand = Union[Temp, Const]


# ---- statements -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Op:
    """`out = op(args)`: a pure builtin (arithmetic, math, casts, constructors, extract/insert)."""
    out: Temp
    op: str
    args: tuple[Operand, ...]
    loc: Loc


@dataclass(frozen=True)
class ReadVar:
    out: Temp
    var: Var
    loc: Loc


@dataclass(frozen=True)
class Assign:
    var: Var
    value: Operand
    loc: Loc


@dataclass(frozen=True)
class ReadParam:
    """`out = <scalar kernel argument>`."""
    out: Temp
    param: Param
    loc: Loc


@dataclass(frozen=True)
class ThreadIndex:
    out: Temp
    axis: int
    loc: Loc


@dataclass(frozen=True)
class ArrayDim:
    """`out = array.shape[axis]` (int32)."""
    out: Temp
    array: ArrayRef
    axis: int
    loc: Loc


@dataclass(frozen=True)
class Load:
    out: Temp
    array: ArrayRef
    indices: tuple[Operand, ...]
    loc: Loc
    or_zero: bool = False       # zero where the indices are outside the array (a select's side not taken)


@dataclass(frozen=True)
class Store:
    array: ArrayRef
    indices: tuple[Operand, ...]
    value: Operand
    loc: Loc


@dataclass(frozen=True)
class Atomic:
    """`out = atomic_<kind>(array[indices], value)`; out is the old value (None if unused)."""
    kind: str                 # "add", "sub", "min", "max"
    out: Temp | None
    array: ArrayRef
    indices: tuple[Operand, ...]
    value: Operand
    loc: Loc


@dataclass(frozen=True)
class Print:
    fmt: str
    args: tuple[Operand, ...]
    loc: Loc


@dataclass(frozen=True)
class If:
    cond: Operand
    then: tuple
    orelse: tuple
    loc: Loc


@dataclass(frozen=True)
class Loop:
    """A structured loop. Range form when `counter` is set: counter = start, start+step, ...
    while counter is before stop. Every form stops before an iteration when any `exit_flags` is
    set (lowered `break`/`return`). Bodies always run to their end (jumps are lowered to guards)."""
    body: tuple
    loc: Loc
    counter: Var | None = None
    start: Operand | None = None
    stop: Operand | None = None
    step: Operand | None = None
    exit_flags: tuple[Var, ...] = ()


@dataclass(frozen=True)
class ReverseLoop:
    """Adjoint functions only: runs `body` with `index` = count-1 down to 0."""
    index: Var
    count: Operand
    body: tuple
    loc: Loc


@dataclass(frozen=True)
class Push:
    """Adjoint functions only: push values onto this thread's tape (or count words, in count mode)."""
    values: tuple[Operand, ...]
    loc: Loc


@dataclass(frozen=True)
class Pop:
    """Adjoint functions only: pop values into vars, in the reverse order of the matching Push."""
    vars: tuple[Var, ...]
    loc: Loc


@dataclass(frozen=True)
class ReverseMark:
    """Adjoint functions only: where the replay ends and the reverse sweep begins. A counting launch
    (which measures the loop tape) stops here. A statement type of its own, so that every pass that
    rebuilds a body keeps it for what it is."""
    loc: Loc


@dataclass(frozen=True)
class AccumGrad:
    """Adjoint functions only: `adj_array[indices] += value` (no-op without a grad). Atomic unless the
    launch is serial, or `exclusive`: no other thread of the launch touches that element.
    `fresh_bit` (gather forms: the only accumulation into each element of the array): when that
    bit of the launch's fresh mask is set, the gradient's memory is new and stands for zeros, and
    the accumulation stores ``0 + value`` without reading it (the same bits as adding to a zero)."""
    array: ArrayRef
    indices: tuple[Operand, ...]
    value: Operand
    loc: Loc
    exclusive: bool = False
    fresh_bit: int | None = None


@dataclass(frozen=True)
class ReadGrad:
    """Adjoint functions only: `out = adj_array[indices]` (zero without a grad)."""
    out: Temp
    array: ArrayRef
    indices: tuple[Operand, ...]
    loc: Loc


@dataclass(frozen=True)
class ScratchStore:
    """Two-pass gather forms only (compiler/passes/transpose.py): store `value` as element `index`
    (the thread's flat index in the launch) of a scratch array of one value per thread of the
    launch, which starts `offset` bytes per thread into the launch's scratch memory. `count`: the
    array's elements where that is not the launch's thread count (a halo form's launch grown by a
    halo: its int64 Temp). `row`: the element's index along the first axis, where the launch has
    more axes than one (the CPU may keep a ring of those rows: codegen/scratch.py)."""
    offset: int
    index: Operand
    value: Operand
    loc: Loc
    count: Operand | None = None
    row: Operand | None = None


@dataclass(frozen=True)
class ScratchLoad:
    """Two-pass gather forms only: `out` = element `index` of the scratch array at `offset`, which
    the launch's first pass stored (`count` and `row` as for ScratchStore)."""
    out: Temp
    offset: int
    index: Operand
    loc: Loc
    count: Operand | None = None
    row: Operand | None = None


@dataclass(frozen=True)
class CustomAdjoint:
    """A call of a @func with a user adjoint (@func_grad). The forward runs `body`; the reverse
    sweep sets `adj_outputs` from the adjoints of `outputs`, zeroes `adj_inputs`, runs `reverse`
    (the user's adjoint, itself forward IR) and adds `adj_inputs` to the adjoints of `inputs`."""
    body: tuple
    inputs: tuple[Operand, ...]
    outputs: tuple[Temp, ...]
    adj_inputs: tuple[Var | None, ...]
    adj_outputs: tuple[Var, ...]
    reverse: tuple
    loc: Loc


@dataclass(frozen=True)
class CustomReplay:
    """A call of a @func with a @func_replay: the forward runs `body`, the adjoint's replay (and its
    reverse sweep) use `replay`, which computes the same result Vars without the side effects."""
    body: tuple
    replay: tuple
    loc: Loc


Stmt = Union[CustomAdjoint, CustomReplay, Op, ReadVar, Assign, ReadParam, ThreadIndex, ArrayDim, Load, Store, Atomic, Print, If, Loop,
             ReverseLoop, Push, Pop, ReverseMark, AccumGrad, ReadGrad, ScratchStore, ScratchLoad]


@dataclass(frozen=True)
class Function:
    name: str
    params: tuple[Param, ...]
    body: tuple
    loc: Loc
    tid_ndim: int = 1


def walk(body):
    """Every statement in `body`, nested ones included, in program order."""
    for s in body:
        yield s
        if isinstance(s, If):
            yield from walk(s.then)
            yield from walk(s.orelse)
        elif isinstance(s, (Loop, ReverseLoop)):
            yield from walk(s.body)
        elif isinstance(s, CustomAdjoint):
            yield from walk(s.body)
            yield from walk(s.reverse)
        elif isinstance(s, CustomReplay):
            yield from walk(s.body)
            yield from walk(s.replay)


def forward_walk(body, in_loop=False):
    """(statement, inside a loop?) for the statements the forward executes, in program order (not
    the replacement code that only the adjoint runs)."""
    for s in body:
        yield s, in_loop
        if isinstance(s, If):
            yield from forward_walk(s.then, in_loop)
            yield from forward_walk(s.orelse, in_loop)
        elif isinstance(s, (Loop, CustomAdjoint, CustomReplay)):
            yield from forward_walk(s.body, in_loop or isinstance(s, Loop))


def defined_temps(s) -> tuple[Temp, ...]:
    out = getattr(s, "out", None)
    return (out,) if isinstance(out, Temp) else ()


def used_operands(s) -> tuple:
    if isinstance(s, Op):
        return s.args
    if isinstance(s, (Load, ReadGrad)):
        return s.indices
    if isinstance(s, (Store, Atomic, AccumGrad)):
        return (*s.indices, s.value)
    if isinstance(s, ScratchStore):
        return (s.index, s.value) + ((s.count,) if s.count is not None else ())
    if isinstance(s, ScratchLoad):
        return (s.index,) + ((s.count,) if s.count is not None else ())
    if isinstance(s, Assign):
        return (s.value,)
    if isinstance(s, (Print, Push)):
        return s.args if isinstance(s, Print) else s.values
    if isinstance(s, If):
        return (s.cond,)
    if isinstance(s, Loop):
        return tuple(x for x in (s.start, s.stop, s.step) if x is not None)
    if isinstance(s, ReverseLoop):
        return (s.count,)
    return ()


def assigned_vars(body) -> list[Var]:
    """Vars assigned anywhere in `body` (loop counters included), first assignment first."""
    seen: dict[int, Var] = {}
    for s in walk(body):
        if isinstance(s, Assign):
            seen.setdefault(s.var.id, s.var)
        elif isinstance(s, Loop) and s.counter is not None:
            seen.setdefault(s.counter.id, s.counter)
        elif isinstance(s, Pop):
            for v in s.vars:
                seen.setdefault(v.id, v)
        elif isinstance(s, ReverseLoop):
            seen.setdefault(s.index.id, s.index)
    return list(seen.values())


class Rewriter:
    """Copies IR, statement by statement, for passes that rebuild a body: `stmt` gives what a
    statement becomes (a list: none, itself rebuilt, or several), `operand` what a Temp or Var
    becomes. `value` rebuilds a statement field by field, nested blocks through `block`."""

    def block(self, body) -> list:
        out = []
        for s in body:
            out += self.stmt(s)
        return out

    def stmt(self, s) -> list:
        return [self.value(s)]

    def operand(self, x):
        return x

    def value(self, x):
        if isinstance(x, (Temp, Var)):
            return self.operand(x)
        if isinstance(x, tuple):
            if x and _is_stmt(x[0]):
                return tuple(self.block(x))
            return tuple(self.value(v) for v in x)
        if _is_stmt(x):
            return dataclasses.replace(x, **{f.name: self.value(getattr(x, f.name))
                                             for f in dataclasses.fields(x) if f.name != "loc"})
        return x


def _is_stmt(x) -> bool:
    return dataclasses.is_dataclass(x) and hasattr(x, "loc") and not isinstance(x, type)
