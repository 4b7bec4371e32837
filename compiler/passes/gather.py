"""The gather form of an adjoint: an IR -> IR pass that turns a stencil's scatter into gathers.

An adjoint scatters: the thread that read ``a[i - 1, j]`` adds to ``adj_a[i - 1, j]``. Neighbouring
threads hit the same elements, so the scatter needs atomics (float sums in whatever order threads
arrive) or a serial run. When every accumulation into an array's gradient sits at the thread's own
index plus a constant offset (``a[i + di, j + dj]``, per axis), the same sums can be gathered
instead: thread p, for each offset c, reruns the adjoint of thread ``p - c`` keeping only the
accumulations made at offset c, adds them up in a local, and finally adds the total to ``adj_a[p]``
once. No two threads write the same element, so the launch runs in parallel with plain adds, and
the order of every sum is fixed by the offsets alone: the result is the same on any number of
threads (deterministic without running serially).

Each offset's pass is a copy of the adjoint body with fresh locals, from which dead code
elimination (compiler/passes/dce.py) keeps what reaches that offset (in a 5-point stencil, a neighbour's
pass keeps a multiply). A pass runs thread ``p - c`` clamped into the launch (always a thread that
exists, so its loads are the ones the forward made) and keeps its sum only when ``p - c`` was
inside: no branch on the offset, so the thread loop still vectorises. Along a periodic index
(``(i + 1) % n`` with n the extent) the pass wraps ``p - c`` around the axis instead.

A clamped index (``max(i - 1, 0)``, ``min(i + 1, n - 1)`` with n the extent) is ``i + c`` except
for the first (last) |c| threads, which all land on the edge element. Such an accumulation takes
part in every pass from offset 0 to c on that axis: at c it is always kept (thread p - c lands on
p), at the others only by the edge thread (p == 0, or p == n - 1), which gathers what the clamped
threads put there. Each contribution is still counted by exactly one thread in exactly one pass.

Along the rows of the innermost axis whose outer indices are near a face, the threads inside the
innermost axis's box run the row variant: p - c clamped (or wrapped) along the outer axes, which
is the same for the whole row, and plain along the innermost one, whose tests are settled: the
clamped copy's values, vectorised along the row.

Arrays that do not qualify (an index that is not tid + constant on its own axis, a gradient the
kernel also reads, a rank other than the launch's) keep the scatter; it runs in the zero-offset
pass. Kernels whose loops keep a tape are left alone (their tape belongs to one thread).
"""
from __future__ import annotations

import dataclasses

from .. import ir
from ..types import bool_, int32
from .adjoint import is_reverse_mark
from .dce import eliminate_dead_code
from .selects import has_branches, select_branches, table_loads, written_arrays
from .interior import Bound, Interior, at_own_index, interior_variant, tid_offsets, with_row
from . import gather_sites
from .gather_form import GatherAdjoint
from .near_faces import bands_of, sides_of, without_dead_code
from .reassociate import reassociated
from . import transpose


def gather_adjoint(adjoint: ir.Function, two_pass: bool = True, halo: bool = True,
                   reassociate: bool = True) -> GatherAdjoint | None:
    """The gather form of `adjoint` (the output of `adjoint.adjoint_function`), or None where no
    array's accumulations qualify or the adjoint keeps a loop tape: in two passes where that applies
    (compiler/passes/transpose.py) unless `two_pass` is False, and then in the halo form where that
    applies (GatherAdjoint.halo) unless `halo` is False, its roots of equal factors summed before
    the factors apply (compiler/passes/reassociate.py) unless `reassociate` is False. Expects
    verified adjoint IR; the result verifies with ``single_definition=False`` and has the same
    parameters."""
    body = tuple(s for s in adjoint.body if not is_reverse_mark(s))
    if any(isinstance(s, ir.Push) for s in ir.walk(body)):
        return None
    offsets = tid_offsets(body, adjoint.tid_ndim)
    sites = [s for s in ir.walk(body) if isinstance(s, ir.AccumGrad)]
    read_grads = {s.array.param.name for s in ir.walk(body) if isinstance(s, ir.ReadGrad)}
    site_offset: dict[int, tuple] = {}
    site_bounds: dict[int, list] = {}
    site_clamps: dict[int, tuple] = {}      # per axis: None, or "max" / "min" for a clamped index
    eligible: dict[str, ir.Param] = {}
    rejected: set[str] = set(read_grads)
    for s in sites:
        name = s.array.param.name
        off = gather_sites.site_offset(s, offsets, adjoint.tid_ndim)
        if off is None:
            rejected.add(name)
        else:
            site_offset[id(s)], site_bounds[id(s)], site_clamps[id(s)] = off
            eligible[name] = s.array.param
    for name in rejected:
        eligible.pop(name, None)
    if not eligible:
        return None
    scatters = any(s.array.param.name not in eligible for s in sites)
    gathered = [s for s in sites if s.array.param.name in eligible]
    passes = sorted({c for s in gathered for c in gather_sites.site_passes(site_offset[id(s)], site_clamps[id(s)])})
    zero = ((0, False),) * adjoint.tid_ndim
    if scatters and zero not in passes:
        passes.insert(0, zero)
    extent_bounds = tuple(sorted({b for s in gathered for b in site_bounds[id(s)]}, key=repr))
    # The launch's extents, read off an array gathered at the thread's own index where there is
    # one (the launch checks that it spans the launch exactly; others may be wider).
    source = next((name for name in eligible if all(site_offset[id(s)] == zero for s in gathered
                                                     if s.array.param.name == name)), next(iter(eligible)))
    # Thread p - c is inside the launch for every pass c when c_max <= p < extent + c_min per axis.
    ndim = adjoint.tid_ndim
    lower = [(Bound(max(0, *(c[k][0] for c in passes))),) for k in range(ndim)]
    upper = [(Bound(min(0, *(c[k][0] for c in passes)), ((1, ("dim", source, k)),)),) for k in range(ndim)]
    # A table read at constant indices (w[r] under a neighbour's guard) is read unguarded in the
    # variants, each of whose boxes is empty unless the table holds those indices.
    tables = _table_reads(body)
    upper = [upper[k] + tuple(b for name, index in sorted(tables) for b in _empty_unless_inside(k, name, index))
             for k in range(ndim)]
    # Each pass copies the whole adjoint and keeps what reaches its offset: drop the rest here, not
    # in the C++ compiler (half the C++ lines of a stencil module).
    shifts = {name: [[site_offset[id(s)][k][0] for s in gathered if s.array.param.name == name] for k in range(ndim)]
              for name in eligible}
    widens = tuple(not scatters and not extent_bounds and
                   any(min(offsets[k]) >= 0 and max(offsets[k]) > 0 for offsets in shifts.values()) for k in range(ndim))
    # Two passes where the offsets' copies would each recompute a pointwise adjoint (transpose.py).
    # Arrays gathered at the thread's own index alone get their gradient in the pointwise pass.
    local = {name for name in eligible if all(site_offset[id(s)] == zero for s in gathered
                                              if s.array.param.name == name)}
    found = None
    if two_pass and not any(widens) and local != set(eligible):
        # (the zero-offset pass runs at thread p itself, so it recomputes what only it needs)
        found = transpose.roots(body, [s for s in gathered if s.array.param.name not in local
                                       and site_offset[id(s)] != zero], loaded=ndim >= 3)
    offsets, scratch_bytes = transpose.scratch_layout(found) if found else (None, 0)
    arrays = tuple((offsets[t.id], t.type.size) for t in found.values()) if found else ()
    # (a periodic or clamped index along the first axis may gather from its far end)
    reach = None if any(axis == 0 for axis, _ in extent_bounds) else max(abs(c[0][0]) for c in passes)
    skip = local if found else set()
    same = _same_extents(set(eligible) if not any(widens) else (), source)
    halo_form = _halo_form(adjoint, body, eligible, source, site_offset, site_clamps, gathered, passes, offsets,
                           skip, tables, reassociate) if found and halo else None
    if halo_form is not None:
        # every thread runs the halo form's pass: in the boxes, which keep the tables' upper bounds
        # (not the margin of p - c), as it is; elsewhere (a table too short for its reads, or an
        # entry without every gradient) with its table reads zero beyond the table. Its sums
        # (reassociate.py) then round alike everywhere: the same bits from every entry and device.
        fn, middle, pad, zero_roots = halo_form
        pointwise = _pointwise_passes(adjoint, body, eligible, local, found, offsets, source, same, zero_roots, pad)
        everywhere = _tables_or_zero(fn, adjoint.name.replace("_adjoint", "") + "_gather")
        fields = dict(pointwise_sides=pointwise[2], pointwise_row_sides=pointwise[3], halo=pad, scratch_arrays=arrays,
                      reach=reach)
        tables_only = tuple(bounds[1:] for bounds in upper)
        box = Interior(fn, ((),) * ndim, tables_only)
        if middle is not None and ndim > 1:
            # The thread's own tests along the outer axes settle in the middle rows (no selects for
            # them: the 3-D 64^3 float64 4th-order adjoint 1.11x the no-halo form's time, was 1.27x
            # with blends at every thread); the rows outside run `fn`, valid at every thread, as
            # `row`. Along a row the tests stay blends: settled there, the rows' ends ran scalar, a
            # stencil radius of threads at a time (1.25x).
            inner = ndim - 1
            row = Interior(dataclasses.replace(fn, name=fn.name.replace("_interior", "_row")), ((),) * ndim,
                           tuple(b if k == inner else () for k, b in enumerate(tables_only)))
            box = dataclasses.replace(middle, upper=tuple(m + t for m, t in zip(middle.upper, tables_only)))
            fields["row"] = row
        return GatherAdjoint(everywhere, box, tuple(eligible), scatters, source, widens, extent_bounds, *pointwise[:2],
                             scratch_bytes, **fields)
    build = lambda clamp: eliminate_dead_code(_build(adjoint, body, eligible, source, widens, site_offset,  # noqa: E731
                                                     site_clamps, passes, clamp, offsets, skip))
    unclamped = build(False)
    # In the interior the neighbours' guarded branches run unconditionally where the pointwise pass
    # can store a zero root where a root's branch is not taken (transpose.unguarded): no selects, one
    # loop over the interior's rows. (Near the faces the same made the 3-D 64^3 8th-order FWI
    # adjoint 10% slower: its rows' variants grew.)
    unguarded = transpose.unguarded(unclamped, written_arrays(body)) if found else None
    if unguarded is not None:
        unclamped = eliminate_dead_code(unguarded)
    # Where p - c is inside the launch for every c, the interior needs no wider margin: a test of
    # thread p - c's boundary guard that would narrow the box stays, its branch turned into selects
    # (a thread near the edge runs the form's slowest code). Where a branch stays (it loads), the
    # box narrows until every test is settled, which vectorises.
    within = ([b[0] for b in lower], [b[0] for b in upper], same)
    interior = interior_variant(unclamped, unclamped.name, lower, upper, within)
    selected = select_branches(interior.function, _own_loads(interior.function, eligible, widens, tables))
    if has_branches(selected):
        interior = interior_variant(unclamped, unclamped.name, lower, upper)
        selected = select_branches(interior.function)
    interior = dataclasses.replace(interior, function=eliminate_dead_code(selected))
    # Where the interior keeps neighbours' guards as selects, the threads at least a stencil radius
    # further in (most of a large launch) run a variant with every guard settled: no selects, no
    # masked loads (2-D 8th-order FWI adjoint ~10% faster than the selects alone).
    settled = None
    if any(isinstance(s, ir.Op) and s.op == "where" for s in ir.walk(interior.function.body)):
        settled = interior_variant(unclamped, unclamped.name + "_settled", lower, upper)
        if settled is not None:
            selected = select_branches(settled.function, _own_loads(settled.function, eligible, widens, tables))
            settled = None if has_branches(selected) else dataclasses.replace(
                settled, function=eliminate_dead_code(selected))
    # Rows of the innermost axis whose outer indices lie near a face: p - c clamped along the outer
    # axes (the same for the whole row), inside along the innermost one, settled there. And the
    # ends of the rows: clamped along the innermost axis alone, settled along the others (a few
    # threads a row, run one at a time, but without the fully clamped form's branches; settled
    # further at the row's first and last threads: see near_faces.sides_of).
    row = row_end = None
    if ndim > 1 and not any(widens):
        inner = ndim - 1
        row = _settled_variant(build, lower, upper, within, eligible, widens, tables, {inner}, "")
        row_end = _settled_variant(build, lower, upper, within, eligible, widens, tables, set(range(inner)), "_end")
    # The ends of the rows near an outer face (outside row_end's box) otherwise run the fully
    # clamped function a thread at a time, branches and all: 1 thread in 35 at 64^3 in 3-D at 8th
    # order, a fifth of the adjoint's time. Where its branches turn into selects, they run that
    # (in 3-D and up: in 2-D those threads are a few rows' ends, not worth the compile time).
    corner = None
    if row_end is not None and ndim > 2:
        whole = build(True)
        selected = select_branches(whole, _own_loads(whole, eligible, widens, frozenset()))
        if not has_branches(selected):
            corner = dataclasses.replace(eliminate_dead_code(selected), name=whole.name + "_corner")
    inner = ndim - 1
    sides = lambda fn, axis=inner: sides_of(fn, interior, source, same, axis) if fn is not None else None  # noqa: E731
    row_end_sides = sides(row_end.function if row_end is not None else None)
    corner_sides = sides(corner)
    row_sides = tuple(sides(row.function, k) for k in range(inner)) if row is not None else ()
    bands = bands_of(interior, settled, source, same) if settled is not None else None
    pointwise = (_pointwise_passes(adjoint, body, eligible, local, found, offsets, source, same, unguarded is not None)
                 if found else (None, None, None, ()))
    return GatherAdjoint(build(True), interior, tuple(eligible), scatters, source, widens, extent_bounds,
                         *pointwise[:2], scratch_bytes, row, row_end, settled, corner, row_end_sides,
                         corner_sides, row_sides, bands, *pointwise[2:], scratch_arrays=arrays, reach=reach)


def _halo_form(adjoint: ir.Function, body, eligible, source: str, site_offset, site_clamps, gathered, passes,
               offsets, skip, tables, reassociate: bool = True):
    """(the transposed pass, its middle with the thread's own tests settled or None, the halo per
    axis, whether the pointwise pass stores zero roots first) of the halo form (GatherAdjoint.halo),
    or None where it does not apply: where an accumulation is clamped or wraps, or the pass, its
    guards run unconditionally (transpose.unguarded), keeps a branch or reads anything at thread
    p - c but the roots (a load, a test of p - c's index). Thread p - c then matters only through
    its roots, which are zeros beyond the launch."""
    ndim = adjoint.tid_ndim
    if any(clamp for s in gathered for clamp in site_clamps[id(s)]) or any(w for c in passes for _, w in c):
        return None
    pad = tuple(max(abs(c[k][0]) for c in passes) for k in range(ndim))
    shifted: set[int] = set()
    fn = eliminate_dead_code(_build(adjoint, body, eligible, source, (False,) * ndim, site_offset, site_clamps,
                                    passes, False, offsets, skip, pad, shifted))
    unguarded = transpose.unguarded(fn, written_arrays(body))
    if unguarded is not None:
        fn = eliminate_dead_code(unguarded)
    # (what stays guarded runs at thread p itself: the zero-offset pass, its loads at p in bounds)
    blended = eliminate_dead_code(select_branches(fn, _own_loads(fn, eligible, (False,) * ndim, tables)))
    used = {x.id for s in ir.walk(blended.body) for x in ir.used_operands(s) if isinstance(x, ir.Temp)}
    if used & shifted or has_branches(blended):
        return None
    # the middle: the thread's own tests along the outer axes settled, where no branch stays
    middle = interior_variant(fn, fn.name, axes=set(range(ndim - 1)))
    if middle is not None:
        selected = select_branches(middle.function, _own_loads(middle.function, eligible, (False,) * ndim, tables))
        middle = None if has_branches(selected) else dataclasses.replace(
            middle, function=eliminate_dead_code(selected))
    if reassociate:
        written = written_arrays(body)
        blended = _reassociated(blended, written)
        if middle is not None:
            middle = dataclasses.replace(middle, function=_reassociated(middle.function, written))
    return blended, middle, pad, unguarded is not None


def _tables_or_zero(fn: ir.Function, name: str) -> ir.Function:
    """`fn`, named `name`, its reads at constant indices (a coefficient table's) zero where the table
    does not hold them: safe at every thread, whatever the tables' lengths."""
    class OrZero(ir.Rewriter):
        def stmt(self, s) -> list:
            s = self.value(s)
            if isinstance(s, ir.Load) and _table_read(s) is not None:
                s = dataclasses.replace(s, or_zero=True)
            return [s]
    return dataclasses.replace(fn, name=name, body=tuple(OrZero().block(fn.body)))


def _reassociated(fn: ir.Function, written: set[str]) -> ir.Function:
    """`fn` with its roots of equal factors summed first (compiler/passes/reassociate.py), or itself."""
    summed = reassociated(fn, written)
    return fn if summed is None else eliminate_dead_code(summed)


def _pointwise_passes(adjoint: ir.Function, body, eligible, local, found, offsets, source: str, same,
                      zero_roots: bool, halo=None) -> tuple:
    """A two-pass form's pointwise pass and its variants: GatherAdjoint's `pointwise`,
    `pointwise_interior`, `pointwise_sides` and `pointwise_row_sides`."""
    ndim = adjoint.tid_ndim
    base = adjoint.name.replace("_adjoint", "")
    bits = {param.name: k for k, param in enumerate(adjoint.params) if k < 63 and param.name in local}
    pointwise = eliminate_dead_code(transpose.pointwise_function(adjoint, body, set(eligible), bits, found, offsets,
                                                                 eligible[source], base + "_pointwise",
                                                                 zero_roots=zero_roots, pad=halo))
    # the rows outside the box, a quarter of a 3-D 64^3 8th-order launch's, a row at a call
    # (interior.with_row, 3-D and up): that FWI adjoint 4-9% faster
    pointwise_interior = without_dead_code(with_row(interior_variant(pointwise, base + "_pointwise_interior"),
                                                     pointwise))
    # its threads near a face ran a third of a 3-D 64^3 8th-order FWI pass's 369 us, doing nothing there
    sides, row_sides = None, ()
    if pointwise_interior is not None and ndim > 1:
        inner = ndim - 1
        sides = sides_of(pointwise, pointwise_interior, source, same, inner)
        row_of = pointwise_interior.row
        row_sides = tuple(sides_of(row_of.function, pointwise_interior, source, same, k)
                          for k in range(inner)) if row_of is not None else ()
    return pointwise, pointwise_interior, sides, row_sides


def _settled_variant(build, lower, upper, within, eligible, widens, tables, settled: set,
                     suffix: str) -> Interior | None:
    """The form with p - c clamped along the axes outside `settled` and inside along those, whose
    tests are settled there within the form's margins (`lower`, `upper`, `within`), its branches
    turned into selects; None where a branch stays. Named the clamped build's name + `suffix`."""
    ndim = len(lower)
    fn = build(tuple(k not in settled for k in range(ndim)))
    variant = interior_variant(fn, fn.name + suffix, [lower[k] if k in settled else () for k in range(ndim)],
                               [upper[k] if k in settled else () for k in range(ndim)], within, axes=settled)
    if variant is None:
        return None
    selected = select_branches(variant.function, _own_loads(variant.function, eligible, widens, tables))
    return None if has_branches(selected) else dataclasses.replace(variant, function=eliminate_dead_code(selected))


def _own_loads(fn: ir.Function, eligible, widens, tables) -> set[int]:
    """Ids of `fn`'s loads of a gathered array at the thread's own index, which every thread may
    make (such an array spans the launch exactly unless the form widens), and of its `tables`
    reads (the box of a variant is empty unless they are in bounds)."""
    reads = {id(s) for s in ir.walk(fn.body) if isinstance(s, ir.Load) and _table_read(s) in tables}
    if any(widens):
        return reads
    offsets = tid_offsets(fn.body, fn.tid_ndim)
    return reads | {id(s) for s in ir.walk(fn.body) if isinstance(s, (ir.Load, ir.ReadGrad))
                    and s.array.param.name in eligible and at_own_index(s.indices, offsets, fn.tid_ndim)}


def _table_read(s: ir.Load):
    """(array name, indices) of a load at constant indices, or None."""
    if all(isinstance(i, ir.Const) for i in s.indices):
        return s.array.param.name, tuple(int(i.value) for i in s.indices)
    return None


def _table_reads(body) -> frozenset:
    """`table_loads(body)` as `_table_read` gives them."""
    return frozenset(map(_table_read, table_loads(body)))


# Far beyond any launch extent: a table too short for one of its reads empties the box.
_EMPTY = 1 << 31


def _empty_unless_inside(axis: int, name: str, index: tuple) -> tuple:
    """Upper bounds on launch axis `axis` that leave it whole where array `name` holds `index` and
    empty it otherwise: per table axis d, the launch's extent plus _EMPTY times (extent d of `name`
    - index[d] - 1)."""
    if any(i < 0 for i in index):
        return (Bound(-_EMPTY),)
    return tuple(Bound(-_EMPTY * (i + 1), ((1, ("extent", axis)), (_EMPTY, ("dim", name, d)))) for d, i in enumerate(index))


def _same_extents(names, source: str):
    """A function normalising a bound: the extents of the arrays in `names` (which the launch
    checks span it exactly) written as `source`'s."""
    def same(bound: Bound) -> Bound:
        return Bound(bound.const, tuple((c, ("dim", source, t[2]) if t[0] == "dim" and t[1] in names else t)
                                        for c, t in bound.terms))
    return same


# ---- building the gather function ----------------------------------------------------------------
def _build(adjoint: ir.Function, body, eligible: dict[str, ir.Param], source: str, widens, site_offset,
           site_clamps, passes, clamp, scratch=None, skip=frozenset(), halo=None, shifted=None) -> ir.Function:
    """The gather function (see `_pass`); `halo`: a halo form's scratch layout (see GatherAdjoint.halo);
    `shifted`, a set given, gets the ids of the Temps holding thread p - c's indices."""
    loc = adjoint.loc
    ndim = adjoint.tid_ndim
    out: list = []
    p = [ir.Temp(int32) for _ in range(ndim)]
    out += [ir.ThreadIndex(p[k], k, loc) for k in range(ndim)]
    extent = [ir.Temp(int32) for _ in range(ndim)]          # the launch's (see gather_adjoint)
    out += [ir.ArrayDim(extent[k], ir.ArrayRef(eligible[source]), k, loc) for k in range(ndim)]
    # (arrays in `skip` get their gradients in a two-pass form's pointwise pass)
    totals = {name: ir.Var("gathered_" + name, param.type.dtype) for name, param in eligible.items()
              if name not in skip}
    out += [ir.Assign(v, ir.Const(-0.0, v.type), loc) for v in totals.values()]
    zero = ((0, False),) * ndim
    # `clamp`: whether p - c is clamped (wrapped) into the launch, per axis (a bool: every axis)
    clamp = tuple(clamp) if isinstance(clamp, tuple) else (clamp,) * ndim
    own = []             # per widening axis: thread p clamped into the launch, and whether it is in it
    for k in range(ndim):
        if not (clamp[k] and widens[k]):
            own.append(None)
            continue
        last, pk, ok = ir.Temp(int32), ir.Temp(int32), ir.Temp(bool_)
        out += [ir.Op(last, "sub", (extent[k], ir.Const(1, int32)), loc), ir.Op(pk, "min", (p[k], last), loc),
                ir.Op(ok, "lt", (p[k], extent[k]), loc)]
        own.append((pk, ok))
    flat = count = None
    if scratch:
        ops, *flat = transpose.flat_index(p, extent, loc, halo)
        out += ops
        if halo:
            ops, count = transpose.halo_count(extent, halo, loc)
            out += ops
    for c in passes:
        # what still scatters runs once per thread: in the zero-offset pass, or in a two-pass form's
        # pointwise pass (the thread's own adjoint, in the same thread order)
        out += _pass(body, c, p, extent, own, totals, site_offset, site_clamps, keep_scatter=c == zero and not scratch,
                     clamp=clamp, loc=loc, scratch=scratch, flat=flat, skip=skip, halo=halo, count=count,
                     shifted=shifted)
    # One write per element of each gathered gradient: where the launch says the gradient is new
    # memory (its bit of the fresh mask, bit k for parameter k), it stores instead of adding.
    # Only where the array has element p: a wider index space (see GatherAdjoint) runs threads
    # beyond a narrower array. The interior variant settles the test.
    bits = {param.name: k for k, param in enumerate(adjoint.params) if k < 63}
    for name, total in totals.items():
        value = ir.Temp(total.type)
        write = (ir.ReadVar(value, total, loc),
                 ir.AccumGrad(ir.ArrayRef(eligible[name], adjoint=True), tuple(p), value, loc, exclusive=True,
                              fresh_bit=bits.get(name)))
        has = None
        for k in (k for k in range(ndim) if widens[k]):
            dim, below = ir.Temp(int32), ir.Temp(bool_)
            out += [ir.ArrayDim(dim, ir.ArrayRef(eligible[name]), k, loc), ir.Op(below, "lt", (p[k], dim), loc)]
            has = _conjoin(out, has, below, loc)
        out += list(write) if has is None else [ir.If(has, write, (), loc)]
    name = adjoint.name.replace("_adjoint", "") + ("_gather" if all(clamp) else "_gather_row" if any(clamp)
                                                    else "_gather_interior")
    return ir.Function(name, adjoint.params, tuple(out), loc, ndim)


def _pass(body, c, p, extent, own, totals, site_offset, site_clamps, keep_scatter: bool, clamp: tuple, loc,
          scratch=None, flat=None, skip=frozenset(), halo=None, count=None, shifted=None) -> list:
    """Thread p's share of the pass at offset c (per axis: the offset, and whether it wraps around
    the axis): the adjoint of thread p - c (clamped into the launch, or wrapped around a periodic
    axis), its accumulations at offset c summed into fresh locals, added to `totals` only when
    p - c is a thread of the launch. Along an axis without `clamp`, p - c is known to be inside.
    `scratch` (root Temp id -> byte offset, two-pass forms): the roots are read, at p - c's flat
    index (`flat`: p's index and row, as transpose.flat_index gives them), from what the pointwise
    pass stored (`halo`, `count`: a halo form's layout and its arrays' elements). `shifted` (a set,
    or None) gets the ids of p - c's indices."""
    out: list = []
    t, inside, shifted_ids = [], None, shifted
    for k, (pk, (ck, periodic)) in enumerate(zip(p, c)):
        if ck == 0 and own[k] is None:
            t.append(pk)
            continue
        if ck and (not clamp[k] or periodic):
            shifted, tk = ir.Temp(int32), ir.Temp(int32)
            out.append(ir.Op(shifted if periodic and clamp[k] else tk, "sub", (pk, ir.Const(ck, int32)), loc))
            if periodic and clamp[k]:
                out.append(ir.Op(tk, "mod", (shifted, extent[k]), loc))    # Python's %: never negative
            t.append(tk)
            if shifted_ids is not None:
                shifted_ids.add(tk.id)
            continue
        if ck == 0:
            # thread p itself, which a wider index space (see GatherAdjoint) may run beyond the
            # launch: clamped to its last thread there, and not inside (worked out once, in _build)
            tk, ok = own[k]
        else:
            shifted, low, last, tk = ir.Temp(int32), ir.Temp(int32), ir.Temp(int32), ir.Temp(int32)
            ok_low, ok_high, ok = ir.Temp(bool_), ir.Temp(bool_), ir.Temp(bool_)
            out += [ir.Op(shifted, "sub", (pk, ir.Const(ck, int32)), loc),
                    ir.Op(last, "sub", (extent[k], ir.Const(1, int32)), loc),
                    ir.Op(low, "max", (shifted, ir.Const(0, int32)), loc),
                    ir.Op(tk, "min", (low, last), loc),
                    ir.Op(ok_low, "ge", (shifted, ir.Const(0, int32)), loc),
                    ir.Op(ok_high, "lt", (shifted, extent[k]), loc),
                    ir.Op(ok, "and", (ok_low, ok_high), loc)]
        inside = _conjoin(out, inside, ok, loc)
        t.append(tk)
    partial = {name: ir.Var(f"{v.hint}_{_label(c)}", v.type) for name, v in totals.items()}
    out += [ir.Assign(v, ir.Const(-0.0, v.type), loc) for v in partial.values()]
    at = None
    if scratch:
        # inside the launch p - c is p shifted by a constant: unit-stride loads of the roots
        ops, *at = (transpose.shifted_index(*flat, [ck for ck, _ in c], extent, loc, halo) if not any(clamp)
                    else transpose.flat_index(t, extent, loc, halo))
        out += ops
    copier = _Copier(t, c, partial, site_offset, keep_scatter, site_clamps, p, extent, scratch, at, skip, count)
    out += copier.block(body)
    for name, total in totals.items():
        part, cur, kept, new = ir.Temp(total.type), ir.Temp(total.type), ir.Temp(total.type), ir.Temp(total.type)
        out.append(ir.ReadVar(part, partial[name], loc))
        if inside is not None:
            out.append(ir.Op(kept, "where", (inside, part, ir.Const(0, total.type)), loc))
            part = kept
        out += [ir.ReadVar(cur, total, loc), ir.Op(new, "add", (cur, part), loc), ir.Assign(total, new, loc)]
    return out


def _conjoin(out: list, test, cond, loc):
    """`test and cond` (`cond` where there is no test yet), its op appended to `out`."""
    if test is None:
        return cond
    both = ir.Temp(bool_)
    out.append(ir.Op(both, "and", (test, cond), loc))
    return both


def _label(c) -> str:
    return "_".join(("m" if x < 0 else "p") + str(abs(x)) + ("w" if periodic else "") for x, periodic in c)


class _Copier(ir.Rewriter):
    """Copies the adjoint body for one pass: fresh Temps and Vars, thread indices replaced by the
    pass's (clamped) thread, accumulations at the pass's offset redirected into its locals, other
    gathered accumulations dropped, scattered ones kept only in the zero-offset pass."""

    def __init__(self, thread, offset, partial, site_offset, keep_scatter, site_clamps, p, extent, scratch=None,
                 at=None, skip=frozenset(), count=None):
        self.thread, self.offset, self.partial = thread, offset, partial
        self.site_offset, self.keep_scatter = site_offset, keep_scatter
        self.site_clamps, self.p, self.extent = site_clamps, p, extent
        self.scratch, self.at, self.skip, self.count = scratch or {}, at, skip, count
        self.names: dict[int, object] = {}

    def _edge_test(self, s) -> tuple[list, ir.Temp | None] | None:
        """For an accumulation in this pass: the statements computing when it is kept and the
        test (None: always), or None where it belongs to another pass. Off its own offset, a
        clamped accumulation is kept by the edge thread alone (p == 0 under max, p == n - 1 under
        min), which is where the clamped threads put it."""
        own = self.site_offset[id(s)]
        if own == self.offset:
            return [], None
        if self.offset not in gather_sites.site_passes(own, self.site_clamps[id(s)]):
            return None
        out, test = [], None
        for k, ((c, _), (e, _), clamp) in enumerate(zip(own, self.offset, self.site_clamps[id(s)])):
            if e == c:
                continue
            edge, at = ir.Const(0, int32), ir.Temp(bool_)
            if clamp == "min":
                edge = ir.Temp(int32)
                out.append(ir.Op(edge, "sub", (self.extent[k], ir.Const(1, int32)), s.loc))
            out.append(ir.Op(at, "eq", (self.p[k], edge), s.loc))
            test = _conjoin(out, test, at, s.loc)
        return out, test

    def stmt(self, s) -> list:
        if isinstance(s, ir.ThreadIndex):
            self.names[s.out.id] = self.thread[s.axis]
            return []
        out = getattr(s, "out", None)
        if isinstance(out, ir.Temp) and out.id in self.scratch:
            index, row = self.at
            return [ir.ScratchLoad(self.operand(out), self.scratch[out.id], index, s.loc, self.count, row)]
        if isinstance(s, ir.AccumGrad):
            name = s.array.param.name
            if name in self.skip:
                return []
            if name in self.partial:
                kept = self._edge_test(s)
                if kept is None:
                    return []
                out, test = kept
                acc = self.partial[name]
                cur, new, value = ir.Temp(acc.type), ir.Temp(acc.type), self.value(s.value)
                if test is not None:
                    where = ir.Temp(acc.type)
                    out.append(ir.Op(where, "where", (test, value, ir.Const(0, acc.type)), s.loc))
                    value = where
                return out + [ir.ReadVar(cur, acc, s.loc), ir.Op(new, "add", (cur, value), s.loc),
                              ir.Assign(acc, new, s.loc)]
            if not self.keep_scatter:
                return []
        return [self.value(s)]

    def operand(self, x):
        """Every Temp and Var renamed."""
        if x.id not in self.names:
            self.names[x.id] = ir.Temp(x.type) if isinstance(x, ir.Temp) else ir.Var(x.hint, x.type)
        return self.names[x.id]


__all__ = ["GatherAdjoint", "gather_adjoint"]
