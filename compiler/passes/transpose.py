"""The two-pass gather form of a stencil adjoint: the pointwise part once, then the transposed stencil.

The gather form (compiler/passes/gather.py) runs, for each offset c, the adjoint of thread p - c and
keeps what that thread accumulates at offset c. Where the value accumulated needs the pointwise part
of thread p - c's adjoint (its forward replay, a division by a local denominator, the partials of
nonlinear terms), an order-k stencil's adjoint costs one pointwise adjoint per offset: 17 in 2-D at
8th order. Hand-written adjoints split the work instead, and so does this form:

- the pointwise pass: thread q runs its adjoint once, without the gathered accumulations, and stores
  the values those accumulations are computed from (their *roots*) in scratch memory, one array of
  one value per thread of the launch for each root;
- the transposed pass: the gather form, each offset's copy reading thread p - c's roots from scratch
  where it computed them; dead code elimination drops what computed them, so what stays per offset is
  what lies between a root and the accumulation (a multiply by the stencil's weight).

A root is found by following an accumulation's value back through operations with one operand that
is not *free* (free: constants, scalar arguments, extents, thread indices, what is computed from
these alone, and loads at the same indices for every thread from arrays the kernel does not write: a
coefficient table's w[r]; the copy recomputes those at its own thread): the value is then a function of that
operand, and so on, up to an operation that combines two such values (its result is the root), a
load (a root kept in memory already: the copy loads it again, no scratch), or a read of a local that
branches on a value other than its root assign (the read is the root). In 3-D launches a loaded
value read in a branch (the incoming gradient under a neighbour's guard, in a wave whose neighbours
receive it times constants) is a root there, stored under the branch: so a zero stands where the
guard fails, and the interior runs the branch unguarded (below). That costs a pass over the launch
and saves the selects of the threads within two stencil radii of a face, where the one-pass form
tests every neighbour's guard: a large share of a 3-D grid (58% of 64^3 at 8th order) and a small
one of a 2-D grid (6% of 512^2). Measured on an AVX2 machine, the 3-D 64^3 wave adjoint went from
2.1-6.0x its forward to 1.8-3.4x; in 2-D at 512^2 it would have gone from 1.8-2.1x to 2.4-2.8x at
2nd and 4th order. A Laplacian's accumulations share one root (the adjoint of the Laplacian, say),
whatever the stencil's width. Only the roots of accumulations at a nonzero offset are stored: the
zero-offset pass runs at thread p itself and computes what it needs there, and an array
accumulated at the thread's own index alone gets its gradient written by the pointwise pass (one
write per element, as the one-pass form makes it).

A neighbour's copy runs under that neighbour's guard (``if i >= R and ...`` at p - c), which near the
interior's edges switches from thread to thread: selects, and variants settled further in (bands,
rows). Where all the guarded branch does is add the root times free factors, the pointwise pass
stores a zero root where the branch is not taken (it stores zeros first) and the interior runs the
branch unconditionally: w * 0 is +-0 (`unguarded`). The sums are then the same but for the sign of
a zero: where nothing else is added, -0.0 + 0.0 gives 0.0.

Where the transposed pass, its guards run unconditionally, needs nothing from thread p - c but its
roots (no load there, no test of its index), the form takes a halo (GatherAdjoint.halo): each
scratch array spans the launch grown by the stencil's radius at each end of each axis, zeros there
(the roots of threads that do not exist, which add +-0 as a failed guard's zero roots do). Every
thread then runs one branch-free pass, p - c read without clamping and without a test: none of the
variants near the faces, whose threads are a large share of a 3-D launch. What stays guarded runs
at thread p itself (the zero-offset pass), as selects (bit blends on the CPU: GCC leaves a float
select on a partly loop-invariant test scalar, which made the pass 4x slower). Each launch zeroes
the halo (memsets along its rows: at 64^3 and radius 4, 42% as many elements as the launch; on a
GPU a kernel of a block per row, sp_zero_halo). On an
AVX2 machine the 3-D 64^3 float32 wave adjoints went from 1.8-3.4x their forward to 1.8-2.6x, the
FWI stencil's (damping constant) from 2.7-3.5x to 2.3-2.7x.

Every accumulation is computed by the same operations from the same values as in the one-pass form,
and summed in the same order, so the two forms give the same bits (up to that sign of zero); the
halo form then sums the roots that share their factors before it applies them (a Laplacian's six
neighbours at distance k times w[k]: compiler/passes/reassociate.py), which rounds otherwise. Roots
defined in a branch are stored under it, and read under the same branch of the copy, whose
condition is computed the same way at the same thread; the copy's thread p - c is a thread of the
launch (clamped or wrapped into it), whose roots the pointwise pass stored. Accumulations that
still scatter (into a coefficient table read at constant indices, say) run in the pointwise pass,
once per thread in thread order, where the one-pass form runs them in its zero-offset pass. The
form applies where the one-pass form does not widen, has no loops (a loop's temps take many
values) and needs at least one root computed.
"""
from __future__ import annotations

from .. import ir
from ..builtins import cast_op
from ..types import int32, int64
from .selects import written_arrays

OTHER = "other"      # a local whose value depends on several roots (a branch merged them)
_FREE_DEFS = (ir.ThreadIndex, ir.ReadParam, ir.ArrayDim)
_MEMORY = (ir.Load, ir.ReadGrad)
# Above this many scratch arrays the pointwise pass stores more than the offsets' copies recompute.
MAX_ROOTS = 8


def roots(body, sites, loaded: bool = False) -> dict[int, ir.Temp] | None:
    """The roots (Temp id -> Temp) of the accumulations `sites` that must go through scratch memory
    (computed ones: loads are read again where needed; with `loaded`, a loaded value read in a
    branch too), or None where the form does not apply (a loop or a custom adjoint in `body`, no
    computed root, or more than MAX_ROOTS)."""
    if any(isinstance(s, (ir.Loop, ir.ReverseLoop, ir.CustomAdjoint, ir.CustomReplay, ir.Push, ir.Pop))
           for s in ir.walk(body)):
        return None
    labels = _Labels(written=written_arrays(body), loaded=loaded)
    labels.block(body)
    found = {}
    for s in sites:
        root = labels.of(s.value)
        if root is not None and not isinstance(labels.defs[root], _MEMORY):
            found[root] = labels.defs[root].out
    if not found or len(found) > MAX_ROOTS:
        return None
    return found


class _Labels:
    """Per Temp: None (free) or the id of its root Temp; per Var: the same, or OTHER."""

    def __init__(self, written: set[str], loaded: bool = False):
        self.temps: dict[int, int | None] = {}
        self.vars: dict[int, object] = {}          # unassigned: zero-initialised, free
        self.defs: dict[int, object] = {}          # root id -> its defining statement
        self.uniform: set[int] = set()             # free Temps with one value for every thread
        self.written = written                     # arrays the kernel stores into
        self.depth = 0                             # how many branches the statement is under
        self.loaded = loaded                       # a loaded value read in a branch is a root there

    def _is_uniform(self, x) -> bool:
        return isinstance(x, ir.Const) or (isinstance(x, ir.Temp) and x.id in self.uniform)

    def of(self, x):
        return self.temps.get(x.id) if isinstance(x, ir.Temp) else None

    def root(self, s) -> int:
        self.defs[s.out.id] = s
        return s.out.id

    def block(self, body) -> None:
        for s in body:
            self.stmt(s)

    def stmt(self, s) -> None:
        if isinstance(s, ir.If):
            self._branch(s)
        elif isinstance(s, ir.Assign):
            self.vars[s.var.id] = self.of(s.value)
        elif isinstance(s, ir.ReadVar):
            label = self.vars.get(s.var.id)
            # a value loaded outside a branch and read in it (the incoming gradient, under a
            # neighbour's guard) is a root there: stored under the branch, it stores a zero where
            # the branch is not taken, and the interior runs the branch unconditionally (`unguarded`)
            loaded = self.loaded and self.depth and label is not None and label is not OTHER \
                and isinstance(self.defs[label], _MEMORY)
            self.temps[s.out.id] = self.root(s) if label is OTHER or loaded else label
        elif isinstance(s, ir.Op):
            sources = {self.of(a) for a in s.args} - {None}
            self.temps[s.out.id] = sources.pop() if len(sources) == 1 else self.root(s) if sources else None
            if all(map(self._is_uniform, s.args)):
                self.uniform.add(s.out.id)
        elif isinstance(s, _FREE_DEFS):
            self.temps[s.out.id] = None
            if not isinstance(s, ir.ThreadIndex):
                self.uniform.add(s.out.id)
        elif (isinstance(s, ir.Load) and s.array.param.name not in self.written
              and all(map(self._is_uniform, s.indices))):
            # one value at every thread (a coefficient table's w[r]): a product with it keeps its
            # other operand's root, so a table's radii share one root, as a tuple's constants do
            self.temps[s.out.id] = None
            self.uniform.add(s.out.id)
        elif isinstance(getattr(s, "out", None), ir.Temp):
            self.temps[s.out.id] = self.root(s)

    def _branch(self, s: ir.If) -> None:
        """After a branch, a local it assigns depends on the condition's root and each side's."""
        before = dict(self.vars)
        self.depth += 1
        self.block(s.then)
        then, self.vars = self.vars, dict(before)
        self.block(s.orelse)
        self.depth -= 1
        orelse = self.vars
        merged = dict(before)
        cond = self.of(s.cond)
        for key in {x.var.id for x in ir.walk(s.then + s.orelse) if isinstance(x, ir.Assign)}:
            sources = {cond, then.get(key), orelse.get(key)} - {None}
            merged[key] = OTHER if OTHER in sources or len(sources) > 1 else (sources.pop() if sources else None)
        self.vars = merged


# The kinds of value `unguarded` tells apart.
_ZERO, _FREE, _THREAD = "zero", "free", "thread"     # _THREAD: free, but not the same at every thread


def unguarded(fn: ir.Function, written: set[str]) -> ir.Function | None:
    """The transposed pass `fn` with every branch run unconditionally whose work vanishes where its
    test fails, or None where no branch does. Such a branch reads roots stored under the same
    branch of the pointwise pass (the copy reads a root where the adjoint computed it), which stores
    a zero root where the branch is not taken (`pointwise_function`, `zero_roots`): what the branch
    computes from them is then +-0 (sums and differences of such values, products with free
    values), and what it adds to a local is that local's value plus +-0. So the branch's test (a
    neighbour's boundary guard, say) goes: no selects near the faces, one loop over the interior.
    The sums come out the same but for the sign of a zero (-0.0 + 0.0 is 0.0). A free factor is a
    constant, a scalar argument or a table entry (`written`: the arrays the kernel stores into,
    which are not tables); were one of them infinite, 0 * inf would put a NaN where the branch
    added nothing, but the forward multiplied by it at every thread that took the branch, so its
    result is not finite there already."""
    zeros: set[int] = set()                 # Vars holding +-0 here
    free: dict[int, str] = {}               # Temp id -> _FREE or _THREAD
    body, changed = [], False
    for s in fn.body:
        if isinstance(s, ir.If) and not s.orelse:
            inlined = _vanishing(s.then, zeros, free, written)
            if inlined is not None:
                statements, kinds = inlined
                body += statements
                changed = True
                free.update((t, kind) for t, kind in kinds.items() if kind in (_FREE, _THREAD))
                continue             # (the locals that held +-0 still do: `zeros` stands)
        body.append(s)
        if (kind := _kind(s, free, written)) in (_FREE, _THREAD):
            free[s.out.id] = kind
        if isinstance(s, ir.Assign) and isinstance(s.value, ir.Const) and s.value.value == 0:
            zeros.add(s.var.id)
        else:
            zeros.difference_update(v.id for v in ir.assigned_vars((s,)))
    return ir.Function(fn.name, fn.params, tuple(body), fn.loc, fn.tid_ndim) if changed else None


def _vanishing(then, zeros: set, free: dict, written) -> tuple[list, dict] | None:
    """(`then`'s statements, the kinds of the Temps they define) where all it does is add to locals
    values that are +-0 when the roots it reads are (and set locals that held +-0, `zeros`, to
    +-0); else None. `free`: the kinds of the Temps defined before it."""
    temps = dict(free)
    state: dict[int, object] = {}           # Var id -> _ZERO, or ("var", id): its value before plus +-0
    out: list = []
    for s in then:
        if isinstance(s, (ir.If, ir.Loop, ir.ReverseLoop, ir.CustomAdjoint, ir.CustomReplay)):
            return None                     # (a nested test may fail where the roots are not zero)
        out.append(s)
        if isinstance(s, ir.ReadVar):
            temps[s.out.id] = state.get(s.var.id, _ZERO if s.var.id in zeros else ("var", s.var.id))
        elif isinstance(s, ir.Assign):
            state[s.var.id] = _operand(s.value, temps)
        elif isinstance(s, (ir.ScratchLoad, ir.Op, ir.Load, ir.ReadParam, ir.ArrayDim, ir.ThreadIndex)):
            temps[s.out.id] = _kind(s, temps, written)
            if temps[s.out.id] is None and isinstance(s, ir.Load):
                return None                 # (a load that may fail where the branch is not taken)
        else:
            return None
    for var, value in state.items():
        if value != ("var", var) and not (value == _ZERO and var in zeros):
            return None
    return out, temps


def _kind(s, temps: dict, written):
    """What statement `s` defines, given its operands' kinds in `temps`: _ZERO (+-0 where the roots
    are), _FREE, _THREAD, a local's value plus +-0, or None (not known)."""
    if isinstance(s, ir.ScratchLoad):
        return _ZERO
    if isinstance(s, (ir.ReadParam, ir.ArrayDim)):
        return _FREE
    if isinstance(s, ir.ThreadIndex):
        return _THREAD
    if isinstance(s, ir.Load):
        # a table entry (the same element at every thread) is free; anything else may not be. Only
        # at constant indices: the variants' boxes are empty unless the table holds those
        # (gather._empty_unless_inside), so running it unguarded reads no element the forward did not
        constant = all(isinstance(i, ir.Const) for i in s.indices)
        return _FREE if constant and s.array.param.name not in written else None
    if isinstance(s, ir.Op):
        return _combined(s.op, [_operand(a, temps) for a in s.args])
    return None


def _operand(x, temps: dict):
    if isinstance(x, ir.Const):
        return _ZERO if x.value == 0 else _FREE if abs(float(x.value)) != float("inf") else None
    return temps.get(x.id)


def _combined(op: str, kinds: list):
    """What `op` makes of operands of `kinds`: free from free ones; +-0 from a product of +-0 and a
    free value or +-0, a quotient of +-0 by a free value, a negation or cast of +-0, a sum,
    difference or select of +-0s; a local's value plus +-0 from that value plus or minus +-0;
    else None (not known)."""
    free = (_FREE, _THREAD)
    if all(k == _FREE for k in kinds):
        return _FREE
    if all(k in free for k in kinds):
        return _THREAD
    if op == "mul" and _ZERO in kinds and all(k == _ZERO or k in free for k in kinds):
        return _ZERO
    if op == "div" and kinds[0] == _ZERO and kinds[1] in free:
        return _ZERO
    if (op == "neg" or op.startswith("cast")) and kinds == [_ZERO]:
        return _ZERO
    if op in ("add", "sub", "where"):
        values = kinds[1:] if op == "where" else kinds
        if all(k == _ZERO for k in values):
            return _ZERO
        local = next((k for k in values if isinstance(k, tuple)), None)
        if local is not None and (op == "add" and _ZERO in values or op == "sub" and values == [local, _ZERO]):
            return local
    return None


def flat_index(thread, extent, loc, pad=None) -> tuple[list, ir.Temp, ir.Temp | None]:
    """Statements computing thread `thread`'s flat index in the launch (int64, row-major over
    `extent`), the Temp holding it, and (where there are more axes than one) the Temp holding its
    row: its index along the first axis (ScratchStore.row); with `pad` (per axis) in the launch
    grown by pad[k] at each end of axis k (a halo form's scratch)."""
    out: list = []
    flat = None
    pad = pad or (0,) * len(thread)
    for tk, ek, pk in zip(thread, extent, pad):
        t64 = ir.Temp(int64)
        out.append(ir.Op(t64, cast_op(int64), (tk,), loc))
        if pk:
            grown = ir.Temp(int64)
            out.append(ir.Op(grown, "add", (t64, ir.Const(pk, int64)), loc))
            t64 = grown
        if flat is None:
            flat = row = t64
            continue
        scaled, total = ir.Temp(int64), ir.Temp(int64)
        e64, ops = _grown(ek, pk, loc)
        out += ops + [ir.Op(scaled, "mul", (flat, e64), loc), ir.Op(total, "add", (scaled, t64), loc)]
        flat = total
    return out, flat, (row if len(thread) > 1 else None)


def _grown(extent, pad: int, loc) -> tuple[ir.Temp, list]:
    """(extent + 2 pad as an int64 Temp, the statements computing it)."""
    e64 = ir.Temp(int64)
    out = [ir.Op(e64, cast_op(int64), (extent,), loc)]
    if pad:
        grown = ir.Temp(int64)
        out.append(ir.Op(grown, "add", (e64, ir.Const(2 * pad, int64)), loc))
        e64 = grown
    return e64, out


def halo_count(extent, pad, loc) -> tuple[list, ir.Temp]:
    """Statements computing the elements of a halo form's scratch array (the launch's `extent`
    grown by pad[k] at each end of axis k), and the int64 Temp holding it."""
    out, count = [], None
    for ek, pk in zip(extent, pad):
        e64, ops = _grown(ek, pk, loc)
        out += ops
        if count is not None:
            product = ir.Temp(int64)
            out.append(ir.Op(product, "mul", (count, e64), loc))
            e64 = product
        count = e64
    return out, count


def shifted_index(flat, row, offset, extent, loc, pad=None) -> tuple[list, ir.Temp, ir.Temp | None]:
    """Statements computing `flat` minus the flat shift of per-axis `offset` (thread p - c's index
    from thread p's, where p - c is known to lie inside the launch, or with `pad` inside the
    launch grown by its halo: see flat_index), and `row` (p's row, or None) shifted alike."""
    out: list = []
    if row is not None and offset[0]:
        shifted_row = ir.Temp(int64)
        out.append(ir.Op(shifted_row, "sub", (row, ir.Const(offset[0], int64)), loc))
        row = shifted_row
    shift = None
    pad = pad or (0,) * len(offset)
    for ck, ek, pk in zip(offset, extent, pad):
        if shift is not None:
            scaled = ir.Temp(int64)
            e64, ops = _grown(ek, pk, loc)
            out += ops + [ir.Op(scaled, "mul", (shift, e64), loc)]
            shift = scaled
        if ck or shift is not None:
            term = ir.Const(ck, int64)
            if shift is None:
                shift = term
            else:
                total = ir.Temp(int64)
                out.append(ir.Op(total, "add", (shift, term), loc))
                shift = total
    if shift is None:
        return out, flat, row
    result = ir.Temp(int64)
    out.append(ir.Op(result, "sub", (flat, shift), loc))
    return out, result, row


def scratch_layout(found: dict[int, ir.Temp]) -> tuple[dict[int, int], int]:
    """Each root's byte offset per thread (widest alignment first, so every array is aligned), and
    the bytes per thread in all."""
    order = sorted(found.values(), key=lambda t: (-_alignment(t.type), t.id))
    offsets, at = {}, 0
    for t in order:
        offsets[t.id] = at
        at += t.type.size
    return offsets, (at + 7) // 8 * 8


def _alignment(t) -> int:
    return 8 if getattr(t, "scalar", t).size == 8 else 4


def pointwise_function(adjoint: ir.Function, body, gathered: set[str], local: dict[str, int], found, offsets,
                       source: ir.Param, name: str, zero_roots: bool = False, pad=None) -> ir.Function:
    """The pointwise pass: the adjoint `body` without the accumulations into the `gathered` arrays,
    each root in `found` stored in scratch at `offsets` (bytes per thread) right where it is
    computed, and with `zero_roots` a zero stored first (for `unguarded`). The arrays in `local`
    (name -> the bit of the launch's fresh mask), gathered at the thread's own index alone, get
    their one write per element here: the same bits as the transposed pass would give them (it adds
    each to -0.0 twice, which changes no value). `pad`: a halo form's (see gather.py), whose
    scratch arrays span the launch grown by pad[k] at each end of axis k."""
    loc = adjoint.loc
    ndim = adjoint.tid_ndim
    q = [ir.Temp(int32) for _ in range(ndim)]
    extent = [ir.Temp(int32) for _ in range(ndim)]
    head = [ir.ThreadIndex(q[k], k, loc) for k in range(ndim)]
    head += [ir.ArrayDim(extent[k], ir.ArrayRef(source), k, loc) for k in range(ndim)]
    ops, flat, row = flat_index(q, extent, loc, pad)
    count = None
    if pad:
        more, count = halo_count(extent, pad, loc)
        ops += more
    if zero_roots:
        ops += [ir.ScratchStore(offsets[t.id], flat, ir.Const(0, t.type), loc, count, row) for t in found.values()]
    store = _Store(gathered, local, found, offsets, flat, row, loc, count)
    body = store.block(body)
    # the sum of each local array's accumulations, written once (in the order the one-pass form sums)
    tail = []
    for array, total in store.totals.values():
        value = ir.Temp(total.type)
        tail += [ir.ReadVar(value, total, loc), ir.AccumGrad(array, tuple(q), value, loc, exclusive=True,
                                                            fresh_bit=local[array.param.name])]
    head += [ir.Assign(total, ir.Const(-0.0, total.type), loc) for _, total in store.totals.values()]
    return ir.Function(name, adjoint.params, tuple(head + ops + body + tail), loc, ndim)


class _Store(ir.Rewriter):
    def __init__(self, gathered, local, found, offsets, flat, row, loc, count=None):
        self.gathered, self.local, self.found, self.offsets, self.flat = gathered, local, found, offsets, flat
        self.row, self.count = row, count
        self.totals: dict[str, tuple] = {}      # local array -> (its adjoint ArrayRef, the Var summing into it)
        self.loc = loc

    def stmt(self, s) -> list:
        if isinstance(s, ir.AccumGrad) and s.array.param.name in self.local:
            name = s.array.param.name
            if name not in self.totals:
                self.totals[name] = (s.array, ir.Var("gathered_" + name, s.array.type.dtype))
            total = self.totals[name][1]
            cur, new = ir.Temp(total.type), ir.Temp(total.type)
            return [ir.ReadVar(cur, total, s.loc), ir.Op(new, "add", (cur, s.value), s.loc),
                    ir.Assign(total, new, s.loc)]
        if isinstance(s, ir.AccumGrad) and s.array.param.name in self.gathered:
            return []
        out = [self.value(s)]
        t = getattr(s, "out", None)
        if isinstance(t, ir.Temp) and t.id in self.found:
            out.append(ir.ScratchStore(self.offsets[t.id], self.flat, t, s.loc, self.count, self.row))
        return out


__all__ = ["roots", "unguarded", "pointwise_function", "scratch_layout", "flat_index", "shifted_index", "halo_count",
           "MAX_ROOTS"]
