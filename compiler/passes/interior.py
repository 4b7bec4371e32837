"""The interior variant of a thread body: an IR -> IR pass that settles boundary tests in advance.

Stencils guard their neighbour loads (``if j > 0: lap += u[i, j - 1]``). A load under a branch keeps
the C++ compiler from vectorising the thread loop, although for all but a thread or two at each end
of a row the branch always goes the same way. This pass finds every comparison between a thread
index plus an offset and a bound, where offsets and bounds are integers the launch fixes (constants,
array extents, integer scalar arguments, the launch's own extents, and sums, differences and
integer multiples of these), and decides it for the threads in the middle of the launch: a bound
made of constants alone sits near the start of the axis (the middle lies above it), and so does one
of integer arguments alone that the index must exceed (``i + offset > 0``); any other bound sits
near the end (the middle lies below it). Periodic indices, ``(i + 1) % n`` or ``(i + n - 1) % n``
with n fixed by the launch, are ``i + 1`` and ``i - 1`` in the middle, and so are clamped indices,
``max(i - 1, 0)`` and ``min(i + 1, n - 1)``.

The variant has each such comparison replaced by the value it takes in the middle (an ``if`` on it
by the branch taken) and each periodic index by its plain value, and records the box where that
holds: per axis, the middle starts at the largest of `lower` and ends before the smallest of
`upper`. The entry point evaluates those bounds once per launch and runs the variant inside the
box, the original body outside it, so the result is the same whatever the bounds' values (an empty
box runs the original everywhere).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .. import ir
from ..types import bool_, int32
from .selects import written_arrays

# A bound is an integer the launch fixes: a constant plus signed terms, each one of
# ("dim", array name, axis), ("scalar", parameter name) or ("extent", axis) (the launch's own).
Term = tuple


@dataclass(frozen=True)
class Bound:
    """const + sum(coefficient * term): normalised (like terms merged, sorted), so equal bounds
    compare equal and a bound whose terms cancel is a constant."""
    const: int = 0
    terms: tuple[tuple[int, Term], ...] = ()

    def __post_init__(self):
        merged: dict = {}
        for coefficient, term in self.terms:
            merged[term] = merged.get(term, 0) + coefficient
        object.__setattr__(self, "terms", tuple(sorted((c, t) for t, c in merged.items() if c)))

    def __add__(self, other: "Bound") -> "Bound":
        return Bound(self.const + other.const, self.terms + other.terms)

    def __sub__(self, other: "Bound") -> "Bound":
        return self + -other

    def __neg__(self) -> "Bound":
        return Bound(-self.const, tuple((-c, t) for c, t in self.terms))

    def shifted(self, k: int) -> "Bound":
        return Bound(self.const + k, self.terms)

    def scaled(self, k: int) -> "Bound":
        return Bound(self.const * k, tuple((c * k, t) for c, t in self.terms))

    @property
    def near_start(self) -> bool:
        """Constants alone: the bound sits near the start of its axis."""
        return not self.terms

    def evaluate(self, dims, scalars, extents) -> int:
        """The value for a launch: `dims[name]` an array's shape, `scalars[name]` an integer
        argument, `extents` the launch's extents per axis of tid()."""
        total = self.const
        for c, t in self.terms:
            total += c * (dims[t[1]][t[2]] if t[0] == "dim" else scalars[t[1]] if t[0] == "scalar"
                          else extents[t[1]])
        return total


@dataclass(frozen=True)
class Wrapped:
    """A periodic index, ``(tid()[axis] + c) % divisor`` (Python's %), written in the kernel as
    ``(tid + c + k * divisor) % divisor`` (``(i + n - 1) % n`` is c = -1, k = 1)."""
    axis: int
    c: int
    divisor: Bound
    k: int


@dataclass(frozen=True)
class Clamped:
    """A clamped index, ``max(tid()[axis] + offset, bound)`` with a bound near the start (zero) or
    ``min(tid()[axis] + offset, bound)`` with one near the end (``n - 1``): `plain` is the Temp
    holding ``tid + offset``, which the index equals in the middle."""
    axis: int
    offset: Bound
    bound: Bound
    op: str
    plain: ir.Temp


@dataclass(frozen=True)
class Interior:
    """`function` is valid for the threads whose index k lies in [max(lower[k]), min(upper[k]))
    on every axis (an axis with no bounds: all of it). `row` (see `with_row`): the variant a CPU
    entry runs in the rows outside that box. `row_ends` (a forward's: near_faces.with_sides):
    (first, last), each an Interior or None, the body settled over a row's threads before the
    box and after it, which a CPU entry runs there. `face_rows` (a forward's too): per outer axis,
    (first, last) or None, the body settled over the rows before the box along that axis and after
    it, valid along the whole row, which a CPU entry runs a row at a call."""
    function: ir.Function
    lower: tuple[tuple[Bound, ...], ...]
    upper: tuple[tuple[Bound, ...], ...]
    row: "Interior | None" = None
    row_ends: tuple | None = None
    face_rows: tuple = ()


def interior_variant(fn: ir.Function, name: str, lower=None, upper=None, within=None,
                     axes=None) -> Interior | None:
    """The interior variant of `fn`, named `name`, or None where `fn` tests no thread index against
    a bound and no bounds are given. `lower`/`upper` add bounds per axis that the caller's body
    needs (the gather form's margins). `within` (per axis the largest lower bound and the smallest
    upper bound to allow, and a function that makes two bounds' terms comparable) leaves undecided
    the comparisons that would narrow the box past those (the gather form turns the branches on
    them into selects, compiler/passes/selects.py). `axes` (default: all) are the axes whose tests
    and indices are settled; the others stay as they are (the gather form's row variant settles the
    innermost axis alone). The result has `fn`'s parameters and verifies like `fn`."""
    ndim = fn.tid_ndim
    lower = [list(b) for b in lower] if lower else [[] for _ in range(ndim)]
    upper = [list(b) for b in upper] if upper else [[] for _ in range(ndim)]
    bounds = _bounds(fn.body)
    offsets = tid_offsets(fn.body, ndim, bounds)
    decided: dict[int, bool] = {}
    unwrapped: dict[int, list] = {}        # a periodic or clamped index's Temp -> the ops computing it plainly
    for s in ir.walk(fn.body):
        if isinstance(s, ir.Op) and s.op in _FLIP:
            decision = _decide(s, offsets, bounds)
            if decision is not None and within is not None and not _inside_limits(decision, within):
                decision = None
            if decision is not None and axes is not None and decision[0] not in axes:
                decision = None
            if decision is not None:
                axis, value, low, high = decision
                decided[s.out.id] = value
                if low is not None:
                    lower[axis].append(low)
                if high is not None:
                    upper[axis].append(high)
        elif isinstance(s, ir.Op) and axes is not None and isinstance(offsets.get(s.out.id), (Wrapped, Clamped)) \
                and offsets[s.out.id].axis not in axes:
            continue
        elif isinstance(s, ir.Op) and isinstance(offsets.get(s.out.id), Wrapped):
            # In the middle, x % d with x = tid + c + k d is x - k d: no division, unit-stride loads.
            w = offsets[s.out.id]
            x, d = s.args
            kd = ir.Temp(int32)
            unwrapped[s.out.id] = [ir.Op(kd, "mul", (d, ir.Const(w.k, int32)), s.loc),
                                   ir.Op(s.out, "sub", (x, kd), s.loc)]
            lower[w.axis].append(Bound(-w.c))
            upper[w.axis].append(w.divisor.shifted(-w.c))
        elif isinstance(s, ir.Op) and isinstance(offsets.get(s.out.id), Clamped):
            # In the middle, max(tid + c, lo) is tid + c from tid = lo - c on, min(tid + c, hi) up to hi - c.
            k = offsets[s.out.id]
            unwrapped[s.out.id] = [ir.Op(s.out, "add", (k.plain, ir.Const(0, int32)), s.loc)]
            if k.op == "max":
                lower[k.axis].append(k.bound - k.offset)
            else:
                upper[k.axis].append((k.bound - k.offset).shifted(1))
    if not decided and not unwrapped and not any(lower) and not any(upper):
        return None
    body = _Settle(decided, unwrapped).block(fn.body)
    return Interior(ir.Function(name, fn.params, tuple(body), fn.loc, ndim),
                    tuple(map(tuple, lower)), tuple(map(tuple, upper)))


def with_row(interior: Interior | None, fn: ir.Function) -> Interior | None:
    """`interior` (of `fn`, three or more axes) with `row`: `fn` settled along the innermost axis
    alone, which a CPU entry runs for the rows whose outer indices lie outside the box, a row at a
    call (codegen/cpu_loops.row_runner): their outer tests are the same the whole row, so the
    compiler unswitches the row's loop instead of calling the whole body a thread. Those rows took a
    third of a 3-D 64^3 8th-order forward kernel's time; with it the kernel runs 20% faster (a
    two-pass adjoint's pointwise pass gets one too: passes/gather.py). In 2-D they are a few rows
    (the 512^2 FWI forward gained 3%) and a module with them ran a wave's adjoint up to 35% slower
    in one A/B (its hot loop compiled alike: layout, not code), so 2-D kernels have none. A variant
    for the first and last threads of the rows inside the box, settled along the outer axes, gained
    nothing. Same statements in the same order as `fn`: the same bits."""
    if interior is None or fn.tid_ndim < 3:
        return interior
    return dataclasses.replace(interior, row=interior_variant(fn, fn.name + "_row", axes={fn.tid_ndim - 1}))


def settled_over(fn: ir.Function, name: str, box: dict, same=lambda b: b) -> Interior | None:
    """`fn`, named `name`, with each integer comparison decided where it takes one value for every
    thread whose index k lies in [max(starts), min(stops)) for each axis k -> (starts, stops) of
    `box` (Bounds), valid there (the variant's box); None where none is. What each integer value
    may be there is tracked as a range (below): the thread index, offsets from it, bounds the
    launch fixes, and the clamps a gather form's passes put around their neighbour's index. `same`
    makes two bounds' terms comparable (as `interior_variant`'s `within`). Where the middle variant
    decides a test the way it goes inside the box, this decides it near a face: at a row's first
    threads the neighbours' guards that hold only further in are false, and the passes they guard
    are dead code (a 3-D 8th-order gather adjoint's row ends, where a thread gathers from at most 4
    of its 25 neighbours)."""
    index = {k: (_few((same(b) for b in starts), True), _few((same(b).shifted(-1) for b in stops), False))
             for k, (starts, stops) in box.items()}
    ranges = _track(fn.body, _range_rule(index, same))
    decided = {}
    for s in ir.walk(fn.body):
        if isinstance(s, ir.Op) and s.op in _FLIP:
            value = _compare(s.op, *(_range_of(x, ranges) for x in s.args))
            if value is not None:
                decided[s.out.id] = value
    if not decided:
        return None
    body = _Settle(decided, {}).block(fn.body)
    lower = tuple(tuple(box[k][0]) if k in box else () for k in range(fn.tid_ndim))
    upper = tuple(tuple(box[k][1]) if k in box else () for k in range(fn.tid_ndim))
    return Interior(ir.Function(name, fn.params, tuple(body), fn.loc, fn.tid_ndim), lower, upper)


# ---- ranges: (lows, highs), Bounds a value is at least (at most) every one of -----------------------
_MOST = 6           # bounds kept per side of a range (sums multiply them)


def _at_most(x: Bound, y: Bound) -> bool:
    """x <= y whatever the launch."""
    d = y - x
    return not d.terms and d.const >= 0


def _few(bounds, low: bool) -> tuple:
    """Lower (`low`) or upper bounds without those another implies (a lower bound below another),
    at most _MOST of them."""
    unique = tuple(dict.fromkeys(bounds))
    kept = [x for k, x in enumerate(unique)
            if not any(_at_most(x, y) if low else _at_most(y, x) for y in unique[:k] + unique[k + 1:])]
    return tuple(kept)[:_MOST]


def _extreme(xs: tuple, ys: tuple, larger: bool) -> tuple:
    """Bounds on max(x, y) from above (`larger`), or on min(x, y) from below: per pair of bounds
    that compare, the larger (smaller)."""
    return _few(((y if _at_most(x, y) == larger else x) for x in xs for y in ys if _at_most(x, y) or _at_most(y, x)),
                low=not larger)


def _range_rule(index: dict, same):
    """A `_track` rule: the range of each int32 value for the threads whose index k has range
    index[k] (on other axes: from 0)."""
    def rule(s, known):
        if isinstance(s, ir.ThreadIndex):
            return index.get(s.axis, ((Bound(0),), ()))
        exact = {k: v[0][0] for k, v in known.items() if len(v[0]) == 1 and v[0] == v[1]}
        bound = _bound_rule(s, exact)
        if bound is not None:
            return (same(bound),), (same(bound),)
        if not (isinstance(s, ir.Op) and s.out.type == int32 and s.op in ("add", "sub", "max", "min")):
            return None
        (alo, ahi), (blo, bhi) = (_range_of(x, known) for x in s.args)
        if s.op == "add":
            return _few((x + y for x in alo for y in blo), True), _few((x + y for x in ahi for y in bhi), False)
        if s.op == "sub":
            return _few((x - y for x in alo for y in bhi), True), _few((x - y for x in ahi for y in blo), False)
        if s.op == "max":
            return _few(alo + blo, True), _extreme(ahi, bhi, larger=True)
        return _extreme(alo, blo, larger=False), _few(ahi + bhi, False)
    return rule


def _range_of(x, known) -> tuple:
    if int_const(x) is not None:
        return (Bound(int_const(x)),), (Bound(int_const(x)),)
    return known.get(x.id, ((), ())) if isinstance(x, ir.Temp) else ((), ())


def _below(a: tuple, b: tuple, strict: bool) -> bool:
    """Whether every value of range `a` is below (or at most, not `strict`) every value of `b`."""
    return any(_at_most(x.shifted(1) if strict else x, y) for x in a[1] for y in b[0])


def _compare(op: str, a: tuple, b: tuple) -> bool | None:
    """The value of `x op y` for every x in range `a` and y in range `b`, or None."""
    if op in ("gt", "ge"):
        return _compare(_FLIP[op], b, a)
    if op in ("eq", "ne"):
        apart = _below(a, b, strict=True) or _below(b, a, strict=True)
        return (op == "ne") if apart else None
    strict = op == "lt"
    if _below(a, b, strict):
        return True
    if _below(b, a, not strict):
        return False
    return None


def _inside_limits(decision, within) -> bool:
    """Whether a decided comparison's bound keeps the box within `within` (see interior_variant)."""
    axis, _, low, high = decision
    lows, highs, same = within
    if low is not None:
        d = same(low) - same(lows[axis])
        return d.near_start and d.const <= 0
    d = same(high) - same(highs[axis])
    return d.near_start and d.const >= 0


# ---- which values are tid + constant, and which are bounds ---------------------------------------
def tid_offsets(body, ndim: int, bounds: dict | None = None) -> dict:
    """Temp and Var ids whose value is ``tid()[axis] + offset``, as (axis, offset Bound), or a
    periodic index (`Wrapped`) or a clamped one (`Clamped`)."""
    return _track(body, _tid_rule(ndim, _bounds(body) if bounds is None else bounds))


def at_own_index(indices, offsets: dict, ndim: int) -> bool:
    """Whether `indices` are the thread's own index, tid()[0], ..., tid()[ndim - 1] (`offsets`:
    `tid_offsets` of the body they are in)."""
    return [offsets.get(x.id) if isinstance(x, ir.Temp) else None for x in indices] == \
        [(k, Bound()) for k in range(ndim)]


def writes_own_elements(fn: ir.Function) -> bool:
    """Whether each thread of `fn` writes only its own elements: no atomics, and every array it
    stores to loaded and stored at the thread's own index alone. Where those arrays share no
    memory with its other arguments, no thread touches memory another writes, so the CPU entry's
    loops vectorise without the compiler's run-time alias tests (SP_INDEPENDENT in prelude.h),
    which ran once a row over every pair of streams."""
    if any(isinstance(s, ir.Atomic) for s in ir.walk(fn.body)):
        return False
    stored = written_arrays(fn.body)
    offsets = tid_offsets(fn.body, fn.tid_ndim)
    return all(at_own_index(s.indices, offsets, fn.tid_ndim) for s in ir.walk(fn.body)
               if isinstance(s, (ir.Load, ir.Store)) and s.array.param.name in stored)


def _bounds(body) -> dict[int, Bound]:
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


def _tid_rule(ndim: int, bounds: dict):
    def rule(s, known):
        if isinstance(s, ir.ThreadIndex) and s.axis < ndim:
            return (s.axis, Bound())
        if not (isinstance(s, ir.Op) and s.out.type == int32):
            return None
        if s.op in ("add", "sub"):
            a, b = s.args
            if _affine(a, known) and _bound_of(b, bounds) is not None:
                axis, off = known[a.id]
                step = _bound_of(b, bounds)
                return (axis, off + step if s.op == "add" else off - step)
            if s.op == "add" and _affine(b, known) and _bound_of(a, bounds) is not None:
                axis, off = known[b.id]
                return (axis, off + _bound_of(a, bounds))
        if s.op in ("max", "min"):
            a, b = s.args if _affine(s.args[0], known) else reversed(s.args)
            bound = _bound_of(b, bounds)
            if _affine(a, known) and bound is not None and bound.near_start == (s.op == "max"):
                axis, off = known[a.id]
                return Clamped(axis, off, bound, s.op, a)
        if s.op == "mod" and _affine(s.args[0], known) and _bound_of(s.args[1], bounds) is not None:
            axis, off = known[s.args[0].id]
            d = _bound_of(s.args[1], bounds)
            # off = c + k d with c a constant (k from the first term's coefficients)
            k = 0
            if d.terms:
                cd, term = d.terms[0]
                co = dict((t, c) for c, t in off.terms).get(term, 0)
                k = co // cd if co % cd == 0 else 0
            c = off - d.scaled(k)
            if c.near_start:                     # a constant shift, modulo a bound the launch fixes
                return Wrapped(axis, c.const, d, k)
        return None
    return rule


def _affine(x, known) -> bool:
    return isinstance(x, ir.Temp) and isinstance(known.get(x.id), tuple)


def _bound_rule(s, known) -> Bound | None:
    if isinstance(s, ir.ArrayDim) and not s.array.adjoint:
        return Bound(0, ((1, ("dim", s.array.param.name, s.axis)),))
    if isinstance(s, ir.ReadParam) and s.param.type == int32:
        return Bound(0, ((1, ("scalar", s.param.name)),))
    if isinstance(s, ir.Op) and s.op in ("add", "sub") and s.out.type == int32:
        a, b = (_bound_of(x, known) for x in s.args)
        if a is not None and b is not None:
            return a + b if s.op == "add" else a - b
    if isinstance(s, ir.Op) and s.op == "mul" and s.out.type == int32:
        a, b = s.args
        if int_const(a) is not None and _bound_of(b, known) is not None:
            return _bound_of(b, known).scaled(int_const(a))
        if int_const(b) is not None and _bound_of(a, known) is not None:
            return _bound_of(a, known).scaled(int_const(b))
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
    if not _affine(a, offsets):
        a, b, op = b, a, _FLIP[op]
    if not _affine(a, offsets):
        return None
    bound = _bound_of(b, bounds)
    if bound is None:
        return None
    axis, off = offsets[a.id]
    at = bound - off                     # the test is now `index op at`
    # `index < at` and `index >= at` switch at `at`; `index <= at`, `index > at`, `==`, `!=` at at + 1
    # (for ==/!= the middle just avoids `at` itself: above it or below it).
    split = at if op in ("lt", "ge") else at.shifted(1)
    # Constants alone sit near the start of the axis, extents near its end. A bound of integer
    # arguments alone could be either (a block's global offset: `i + offset > 0` on a decomposed
    # grid); a guard is taken to hold in the middle, so `index > at` guards the start.
    if at.near_start or op in ("gt", "ge") and all(t[0] == "scalar" for _, t in at.terms):
        value = op in ("gt", "ge", "ne")
        return axis, value, split, None
    value = op in ("lt", "le", "ne")     # the middle lies below it
    return axis, value, None, (at if op in ("eq", "ne") else split)


class _Settle(ir.Rewriter):
    """Copies a body with each decided comparison dropped and its uses replaced by the constant
    (an `if` on one becomes the branch it takes; `and`, `or` and `where` on one fold, so that dead
    code elimination drops what a decided select discards), and each periodic index computed
    without its modulo."""

    def __init__(self, decided: dict[int, bool], unwrapped: dict[int, list]):
        self.decided, self.unwrapped = decided, unwrapped
        self.same: dict[int, object] = {}          # folded Temp id -> the operand it equals

    def stmt(self, s) -> list:
        if isinstance(s, ir.Op) and s.out.id in self.decided:
            return []
        if isinstance(s, ir.If) and isinstance(s.cond, ir.Temp) and s.cond.id in self.decided:
            return self.block(s.then if self.decided[s.cond.id] else s.orelse)   # the branch taken
        if isinstance(s, ir.Op) and s.out.id in self.unwrapped:
            return [self.value(op) for op in self.unwrapped[s.out.id]]
        if isinstance(s, ir.Op) and s.op in ("and", "or", "where"):
            folded = _fold(s.op, [self.operand(x) for x in s.args])
            if folded is not None:
                self.same[s.out.id] = folded
                return []
        return [self.value(s)]

    def operand(self, x):
        if isinstance(x, ir.Temp) and x.id in self.decided:
            return ir.Const(self.decided[x.id], bool_)
        if isinstance(x, ir.Temp) and x.id in self.same:
            return self.same[x.id]
        return x


def _fold(op: str, args: list):
    """What `op` on `args` equals where a boolean operand is a constant that settles it, or None."""
    flags = [bool(x.value) if isinstance(x, ir.Const) and x.type == bool_ else None for x in args]
    if op == "where":
        return None if flags[0] is None else args[1] if flags[0] else args[2]
    for k in (0, 1):
        if flags[k] is not None:
            absorbing = flags[k] is (op == "or")           # False for and, True for or
            return ir.Const(flags[k], bool_) if absorbing else args[1 - k]
    return None


__all__ = ["Bound", "Clamped", "Interior", "Wrapped", "at_own_index", "interior_variant", "tid_offsets",
           "writes_own_elements", "int_const",
           "with_row"]
