"""The interior variant of a thread body: an IR -> IR pass that settles boundary tests in advance.

Stencils guard their neighbour loads (``if j > 0: lap += u[i, j - 1]``). A load under a branch keeps
the C++ compiler from vectorising the thread loop, although for all but a thread or two at each end
of a row the branch always goes the same way. This pass finds every comparison between a thread
index (``tid()[k]`` plus a constant) and a bound that the launch fixes (integer constants, array
extents, integer scalar arguments, the launch's own extents, and sums and differences of these),
and decides it for the threads in the middle of the launch: a bound made of constants alone sits
near the start of the axis (the middle lies above it), any other bound near the end (the middle
lies below it). The variant has each such comparison replaced by the value it takes in the middle,
and records the box where that holds: per axis, the middle starts at the largest of `lower` and
ends before the smallest of `upper`. The entry point evaluates those bounds once per launch and
runs the variant inside the box, the original body outside it, so the result is the same whatever
the bounds' values (an empty box runs the original everywhere).
"""
from __future__ import annotations

from dataclasses import dataclass

from . import ir
from .types import bool_, int32

# A bound is an integer the launch fixes: a constant plus signed terms, each one of
# ("dim", array name, axis), ("scalar", parameter name) or ("extent", axis) (the launch's own).
Term = tuple


@dataclass(frozen=True)
class Bound:
    const: int = 0
    terms: tuple[tuple[int, Term], ...] = ()

    def __add__(self, other: "Bound") -> "Bound":
        return Bound(self.const + other.const, self.terms + other.terms)

    def __neg__(self) -> "Bound":
        return Bound(-self.const, tuple((-sign, t) for sign, t in self.terms))

    def shifted(self, k: int) -> "Bound":
        return Bound(self.const + k, self.terms)

    @property
    def near_start(self) -> bool:
        """Constants alone: the bound sits near the start of its axis."""
        return not self.terms


@dataclass(frozen=True)
class Interior:
    """`function` is valid for the threads whose index k lies in [max(lower[k]), min(upper[k]))
    on every axis (an axis with no bounds: all of it)."""
    function: ir.Function
    lower: tuple[tuple[Bound, ...], ...]
    upper: tuple[tuple[Bound, ...], ...]


def interior_variant(fn: ir.Function, name: str, lower=None, upper=None) -> Interior | None:
    """The interior variant of `fn`, named `name`, or None where `fn` tests no thread index against
    a bound and no bounds are given. `lower`/`upper` add bounds per axis that the caller's body
    needs (the gather form's margins). The result has `fn`'s parameters and verifies like `fn`."""
    ndim = fn.tid_ndim
    lower = [list(b) for b in lower] if lower else [[] for _ in range(ndim)]
    upper = [list(b) for b in upper] if upper else [[] for _ in range(ndim)]
    offsets = tid_offsets(fn.body, ndim)
    bounds = _bounds(fn.body, fn.params)
    decided: dict[int, bool] = {}
    for s in ir.walk(fn.body):
        if isinstance(s, ir.Op) and s.op in _FLIP:
            decision = _decide(s, offsets, bounds)
            if decision is not None:
                axis, value, low, high = decision
                decided[s.out.id] = value
                if low is not None:
                    lower[axis].append(low)
                if high is not None:
                    upper[axis].append(high)
    if not decided and not any(lower) and not any(upper):
        return None
    body = _Settle(decided).block(fn.body)
    return Interior(ir.Function(name, fn.params, tuple(body), fn.loc, ndim),
                    tuple(map(tuple, lower)), tuple(map(tuple, upper)))


# ---- which values are tid + constant, and which are bounds ---------------------------------------
def tid_offsets(body, ndim: int) -> dict[int, tuple[int, int]]:
    """Temp and Var ids whose value is ``tid()[axis] + offset``, as (axis, offset)."""
    return _track(body, _tid_rule(ndim))


def _bounds(body, params) -> dict[int, Bound]:
    return _track(body, _bound_rule)


def _track(body, rule) -> dict:
    """Values known by `rule` (a function of a statement and what is known so far), carried
    through locals. A Var counts only when it is assigned once, at the top level (so that
    assignment reaches every later read)."""
    assigned: dict[int, int] = {}
    for s in ir.walk(body):
        if isinstance(s, ir.Assign):
            assigned[s.var.id] = assigned.get(s.var.id, 0) + 1
        for v in _other_writes(s):
            assigned[v.id] = 2
    top = {id(s) for s in body}
    known: dict = {}
    for s in ir.walk(body):
        if isinstance(s, ir.ReadVar) and s.var.id in known:
            known[s.out.id] = known[s.var.id]
        elif isinstance(s, ir.Assign) and id(s) in top and assigned[s.var.id] == 1 \
                and isinstance(s.value, ir.Temp) and s.value.id in known:
            known[s.var.id] = known[s.value.id]
        else:
            value = rule(s, known)
            if value is not None:
                known[s.out.id] = value
    return known


def _tid_rule(ndim: int):
    def rule(s, known):
        if isinstance(s, ir.ThreadIndex) and s.axis < ndim:
            return (s.axis, 0)
        if isinstance(s, ir.Op) and s.op in ("add", "sub") and s.out.type == int32:
            a, b = s.args
            if isinstance(a, ir.Temp) and a.id in known and int_const(b) is not None:
                axis, off = known[a.id]
                return (axis, off + int_const(b) * (1 if s.op == "add" else -1))
            if s.op == "add" and isinstance(b, ir.Temp) and b.id in known and int_const(a) is not None:
                axis, off = known[b.id]
                return (axis, off + int_const(a))
        return None
    return rule


def _bound_rule(s, known) -> Bound | None:
    if isinstance(s, ir.ArrayDim) and not s.array.adjoint:
        return Bound(0, ((1, ("dim", s.array.param.name, s.axis)),))
    if isinstance(s, ir.ReadParam) and s.param.type == int32:
        return Bound(0, ((1, ("scalar", s.param.name)),))
    if isinstance(s, ir.Op) and s.op in ("add", "sub") and s.out.type == int32:
        a, b = (_bound_of(x, known) for x in s.args)
        if a is not None and b is not None:
            return a + (b if s.op == "add" else -b)
    return None


def _bound_of(x, known) -> Bound | None:
    if int_const(x) is not None:
        return Bound(int_const(x))
    return known.get(x.id) if isinstance(x, ir.Temp) else None


def _other_writes(s):
    if isinstance(s, ir.Loop) and s.counter is not None:
        yield s.counter
    elif isinstance(s, ir.ReverseLoop):
        yield s.index
    elif isinstance(s, ir.Pop):
        yield from s.vars


def int_const(x) -> int | None:
    if isinstance(x, ir.Const) and x.type == int32 and not isinstance(x.value, bool):
        return int(x.value)
    return None


# ---- deciding a comparison -----------------------------------------------------------------------
_FLIP = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le", "eq": "eq", "ne": "ne"}


def _decide(s: ir.Op, offsets, bounds):
    """(axis, value in the middle, lower bound or None, upper bound or None) for a comparison of a
    thread index with a bound, else None."""
    a, b = s.args
    op = s.op
    if not (isinstance(a, ir.Temp) and a.id in offsets):
        a, b, op = b, a, _FLIP[op]
    if not (isinstance(a, ir.Temp) and a.id in offsets):
        return None
    bound = _bound_of(b, bounds)
    if bound is None:
        return None
    axis, off = offsets[a.id]
    at = bound.shifted(-off)             # the test is now `index op at`
    # `index < at` and `index >= at` switch at `at`; `index <= at`, `index > at`, `==`, `!=` at at + 1
    # (for ==/!= the middle just avoids `at` itself: above it or below it).
    split = at if op in ("lt", "ge") else at.shifted(1)
    if at.near_start:                    # the middle lies above the bound
        value = op in ("gt", "ge", "ne")
        return axis, value, split, None
    value = op in ("lt", "le", "ne")     # the middle lies below it
    return axis, value, None, (at if op in ("eq", "ne") else split)


class _Settle(ir.Rewriter):
    """Copies a body with each decided comparison dropped and its uses replaced by the constant."""

    def __init__(self, decided: dict[int, bool]):
        self.decided = decided

    def stmt(self, s) -> list:
        if isinstance(s, ir.Op) and s.out.id in self.decided:
            return []
        return [self.value(s)]

    def operand(self, x):
        if isinstance(x, ir.Temp) and x.id in self.decided:
            return ir.Const(self.decided[x.id], bool_)
        return x


__all__ = ["Bound", "Interior", "interior_variant", "tid_offsets", "int_const"]
