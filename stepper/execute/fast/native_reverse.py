"""Native reversal of a traced step: from the state it started from, without a tape.

A step the executor records natively keeps only its start state (Sweep._keep_natively): every
recording of a binomial schedule's reverse sweep, ``Forward(n, n + 1)`` then ``Reverse(n + 1, n)``
at once, and StoreAll's. Through the tape a reversal is a StepTape, a RecordedOp per launch, its
adjoint packed afresh and gradients set and unset on every array: about 70 us of Python a step,
more than a 256x256 stencil's kernels. Here the step's trace (stepper/step/trace.py) is planned once:
every launch's forward and adjoint arguments are packed (`packed_forward`, `packed_adjoint`) and
what Tape.backward would do around them is written down (which new gradients a gather form
overwrites whole, which it zero-fills first, the running loss's seed). A step then patches the
pointers of its own versions into the packed arguments and calls the entry points: the step's
launches whose outputs a later launch reads (nothing reads the step's outputs: adjoints replay the
forward from the inputs; StepTrace.unread), then the adjoints in reverse order (a running loss's
last where it may be: StepTrace.reversal_order). Same entry points,
same arguments, same order, same fills as the tape: the same bits.

On a GPU the plan is the same and each packed launch and adjoint is queued through the driver
from Python (`compiler.backends.cuda_launch`, as the tape would queue it), one call each: no tape,
no argument packing, no gradients set and unset. (Not timed on a GPU yet: `benchmarks/gpu.py`'s
native-loops row turns both off with `Sweep.native_loops`, its reversals row this alone.) A GPU
step recorded for later (StoreAll's) is run by replaying its trace from Python into versions of its
own, without a tape (GraphLoops.advance_keeping), and keeps the state it started from, as on the CPU.

Planned only for steps whose kernels all have adjoints without loop tapes and whose running loss
(if any) is a scratch buffer; any other step keeps the tape path. Arrays that are not the step's
own (parameters) are the same every step: packed once, their gradients added to as on the tape.
"""
from __future__ import annotations

import ctypes
import struct

from compiler.runtime.copy_kernels import is_copy_kernel
from compiler.runtime.launch import packed_adjoint, packed_forward
from compiler.runtime.tape import settle

from ...step.state import State
from ...step.trace import SeriesRows, Slot
from ...step.versions import set_grad
from .native_loop import _ptr

__all__ = ["Kept", "NativeReversal", "kept_part"]

_FORWARD = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int)
_ADJOINT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                            ctypes.c_int, ctypes.c_void_p, ctypes.c_int)
_POINTER = struct.Struct("<Q")


class Kept:
    """A step recorded natively (Sweep._keep_natively): the state it started from and its trace,
    from which its reversal replays it; nothing else is kept. Of the state only what the reversal
    reads (`StepTrace.reversal_reads`): a state it never reads is not there (its reversal packs a
    stand-in's pointer, or none, in its place). `n`: the step's index (the rows of its series)."""
    __slots__ = ("prev", "trace", "n")

    def __init__(self, prev: State, trace, n: int):
        self.prev, self.trace, self.n = prev, trace, n


def kept_part(pool, state: State, names) -> State:
    """The part of `state` a Kept record keeps (its states in `names`, their holds passing on);
    the holds on the rest are released here."""
    if all(name in names for name in state):
        return state
    pool.release_all([a for name, a in state.items() if name not in names])
    return State({name: a for name, a in state.items() if name in names})


class _Fills(dict):
    """Tape.backward's pending new gradients (by storage id) that notes which ones were zero-filled
    (`zero_fresh` pops them; a gather form that overwrites one deletes it instead)."""

    def __init__(self, grads):
        super().__init__((id(g._storage), g) for g in grads)
        self.filled: list = []

    def pop(self, key, default=None):
        if key in self:
            self.filled.append(key)
        return super().pop(key, default)


class _Plan:
    """One trace's step, packed. Keys name each step's arrays: ("prev", name), ("next", name),
    ("scratch", name) and their gradients ("gprev", name), ("carry", name) (s.next's: the carried
    adjoint) and ("gscratch", name); ("series", name) the step's row of a series (not
    differentiated: only the forward arguments point at it). Built in two halves, as a step runs:
    the launches from the step's versions, then the adjoints once the gradients are there."""

    def __init__(self, trace, arrays: dict, device: str):
        self.trace, self.device, self.cpu = trace, device, device == "cpu"
        self.groups = groups = {"prev": {}, "next": {}, "scratch": {}, "series": {}}
        for (group, name), a in arrays.items():
            groups[group][name] = a
        self.buffers = []                   # every packed buffer, kept alive for its address
        self.forward_patches = []           # (buffer, byte offset, key): the step's pointers
        self.series_patches = []            # (buffer, byte offset, series name): its rows
        self.forward, self._launches = [], []
        self.reads_next = False
        for k, t in enumerate(trace.launches):
            args = [groups[a.group][a.name] if type(a) is Slot else a for a in t.args]
            entry, packed, serial, offsets = packed_forward(t.kernel, t.dims, args, t.deterministic, device)
            buf = self._keep(packed)
            self.forward_patches += [(buf, offset, (a.group, a.name)) for a, offset in zip(t.args, offsets)
                                     if type(a) is Slot and a.group != "series"]
            self.series_patches += [(buf, offset, a.name) for a, offset in zip(t.args, offsets)
                                    if type(a) is Slot and a.group == "series"]
            if k not in trace.unread:                   # outputs some later launch reads
                self.forward.append((_FORWARD(entry), ctypes.addressof(buf), serial, entry) if self.cpu
                                    else (entry, buf))
            uses = t.kernel.compiled().uses
            self.reads_next |= any(type(a) is Slot and a.group == "next" and uses[p.name].reads
                                   for a, p in zip(t.args, t.kernel.params))
            self._launches.append((t, args, buf, offsets))
        self.adjoints = None                # the second half

    def plan_adjoints(self, arrays: dict, deterministic: bool) -> None:
        """The adjoints in the order Tape.backward runs them, with its fills, from this step's
        gradients in `arrays` (set on the arrays while planning, as on a tape)."""
        groups = self.groups
        grad_key = {("prev", n): ("gprev", n) for n in groups["prev"] if ("gprev", n) in arrays}
        grad_key.update({("next", n): ("carry", n) for n in groups["next"] if ("carry", n) in arrays})
        grad_key.update({("scratch", n): ("gscratch", n) for n in groups["scratch"] if ("gscratch", n) in arrays})
        by_storage = {id(a._storage): key for key, a in arrays.items()}
        for key, grad in grad_key.items():
            set_grad(arrays[key], arrays[grad])
        try:
            fills = _Fills(arrays[key] for key in arrays if key[0] in ("gprev", "gscratch"))
            self.seed = None
            loss = self.trace.loss
            if loss is not None:                        # Tape.backward seeds before the first adjoint
                self.seed = grad_key[(loss.group, loss.name)]
                fills.pop(id(arrays[self.seed]._storage))
            self.adjoint_patches, adjoints, self.renames = [], [], []
            order = [self._launches[k] for k in self.trace.reversal_order]
            for j, (t, args, buf, offsets) in enumerate(order):
                fills.filled.clear()
                fresh = set(fills)
                packed = packed_adjoint(t.kernel, t.dims, args, deterministic, fills, self.device)
                if packed is None:
                    continue
                rename = _renamed_adjoint(t, fresh, fills, arrays, order[j + 1:])
                if rename is not None:
                    self.renames.append(rename)
                    continue
                entry, adj_packed, serial = packed
                adj = self._keep(adj_packed)
                for a, offset in zip(args, offsets):
                    # a parameter's gradient is the same array every step: packed once
                    if offset is not None and a.grad is not None and id(a.grad._storage) in by_storage:
                        self.adjoint_patches.append((adj, offset, by_storage[id(a.grad._storage)]))
                zero = [by_storage[key] for key in fills.filled]
                adjoints.append((zero, _ADJOINT(entry), ctypes.addressof(buf), ctypes.addressof(adj), serial, entry)
                                if self.cpu else (zero, entry, buf, adj))
            self.zero_after = [by_storage[key] for key in fills]
            self.nbytes = {key: a._data.nbytes for key, a in arrays.items()}
            self.adjoints = adjoints
        finally:
            for key in grad_key:
                set_grad(arrays[key], None)

    def _keep(self, packed: bytes):
        buf = ctypes.create_string_buffer(packed, len(packed))
        self.buffers.append(buf)
        return buf


def _renamed_adjoint(t, fresh: set, fills: _Fills, arrays: dict, later) -> tuple | None:
    """(src, dest) where the adjoint of launch `t`, a whole-state copy ``s.next.dest = s.prev.src``
    (`is_copy_kernel`), just stored ``gprev.src = carry.dest`` whole (the gradient was pending in
    `fresh` and its gather form overwrote it: not zero-filled) and no adjoint after it (`later`)
    touches carry.dest: then the reversal gives gprev.src the carry's array instead of running
    the copy, as the forward renames the copy itself. The FWI step's reversal: 4% of a Revolve
    gradient at 1024^2. None otherwise."""
    if not is_copy_kernel(t.kernel):
        return None
    src, dest = t.args
    if type(src) is not Slot or type(dest) is not Slot or src.group != "prev" or dest.group != "next":
        return None
    grad, carry = ("gprev", src.name), ("carry", dest.name)
    if grad not in arrays or carry not in arrays:
        return None
    key = id(arrays[grad]._storage)
    if key not in fresh or key in fills or key in fills.filled:
        return None
    if any(type(a) is Slot and a == Slot("next", dest.name) for launch, *_ in later for a in launch.args):
        return None
    return src.name, dest.name


def plannable(trace) -> bool:
    """Whether `trace`'s step can be reversed natively (see the module docstring)."""
    if not trace or not trace.differentiable:
        return False
    if trace.loss is not None and trace.loss.group != "scratch":
        return False
    return not any(t.kernel.compiled().needs_tape for t in trace.launches)


def _patch(patches, arrays: dict) -> None:
    pack = _POINTER.pack_into
    for buf, offset, key in patches:
        pack(buf, offset, _ptr(arrays[key]))


class NativeReversal:
    """Records and reverses traced steps for a Sweep (see the module docstring)."""

    def __init__(self, pool, states: dict, deterministic: bool, series: dict | None = None):
        self.pool = pool
        self._series = series or {}
        self._rows: tuple | None = None           # (trace, SeriesRows)
        self.deterministic = deterministic
        self._kinds = [(name, pool.kind(spec.shape, spec.dtype)) for name, spec in states.items()]
        self._plan: _Plan | None = None
        self._refused = None                      # the last trace `plannable` refused
        self.steps = 0

    def applies(self, trace) -> bool:
        if self._plan is not None and self._plan.trace is trace:
            return True
        if trace is self._refused or not plannable(trace):
            self._refused = trace
            return False
        return True

    def rows(self, trace) -> SeriesRows:
        if self._rows is None or self._rows[0] is not trace:
            self._rows = (trace, SeriesRows(self._series, trace))
        return self._rows[1]

    def reverse(self, trace, prev: State, carry: dict, n: int) -> dict:
        """Step n from `prev` (the caller's hold passes here) with `trace` and reverse it at once
        from `carry` (the adjoint of the step's result, by state name; its hold passes here too);
        return the adjoint of `prev` (held once, the caller's)."""
        pool = self.pool
        take, acquire, acquire_like = pool.take, pool.acquire, pool.acquire_like
        # only what the launches run forward below touch, or an adjoint loads, is filled as a
        # step's take fills it (StepTrace.reversal_fills)
        fills = trace.reversal_fills
        nxt = {name: take(kind, None if ("next", name) in fills else False) for name, kind in self._kinds}
        scratch = {name: acquire(shape, dtype, zero if ("scratch", name) in fills else False)
                   for name, shape, dtype, zero in trace.scratch}
        # a kept state the reversal does not read (see Kept) has a stand-in, unread, unwritten
        stand_ins = {name: take(kind, False) for name, kind in self._kinds if name not in prev}
        arrays = {("prev", n): a for n, a in (*prev.items(), *stand_ins.items())}
        arrays.update({("next", n): a for n, a in nxt.items()})
        arrays.update({("scratch", n): a for n, a in scratch.items()})
        plan = self._plan if self._plan is not None and self._plan.trace is trace else None
        grads: dict = {}
        renamed: dict = {}                         # gprev name -> the carry's name whose array it takes
        try:
            rows = self.rows(trace)
            if plan is None:
                plan = _Plan(trace, {**arrays, **{("series", name): a for name, a in rows.views(n).items()}},
                             pool.device)
            _patch(plan.forward_patches, arrays)
            for buf, offset, name in plan.series_patches:
                _POINTER.pack_into(buf, offset, rows.pointer(rows.names.index(name), n))
            settle()                                   # launches a Tape holds run first
            if plan.cpu:
                for entry, buf, serial, _ in plan.forward:
                    entry(buf, serial)
            else:
                for run, buf in plan.forward:
                    run(buf.raw)
            if not plan.reads_next:
                # as _reverse_step: s.next's memory can serve the gradients below
                pool.release_all(nxt.values())
                nxt = {}
            renamed = dict(plan.renames) if plan.adjoints is not None else {}
            grads = {("gprev", n): carry[renamed[n]] if n in renamed else acquire_like(arrays[("prev", n)], zero=False)
                     for n in carry}
            grads.update({("gscratch", n): acquire_like(a, zero=False) for n, a in scratch.items() if a.dtype.is_float})
            arrays.update(grads)
            arrays.update({("carry", n): g for n, g in carry.items()})
            if plan.adjoints is None:
                plan.plan_adjoints(arrays, self.deterministic)
                self._plan = plan
                for src, dest in plan.renames:          # the gradient taken above gives way to the carry's
                    pool.release(grads[("gprev", src)])
                    grads[("gprev", src)] = arrays[("gprev", src)] = carry[dest]
                renamed = dict(plan.renames)
            _patch(plan.adjoint_patches, arrays)
            self._run_adjoints(plan, arrays)
        except BaseException:                           # (a renamed gradient is still the carry's)
            pool.release_all((*nxt.values(), *scratch.values(), *stand_ins.values(),
                              *(g for key, g in grads.items() if key[0] != "gprev" or key[1] not in renamed)))
            raise
        given = set(renamed.values())                   # the carry's arrays that are gradients now
        pool.release_all((*nxt.values(), *scratch.values(), *(g for n, g in carry.items() if n not in given),
                          *prev.values(), *stand_ins.values()))
        pool.release_all([g for key, g in grads.items() if key[0] == "gscratch"])
        self.steps += 1
        return {n: grads[("gprev", n)] for n in carry}

    @staticmethod
    def _run_adjoints(plan: _Plan, arrays: dict) -> None:
        if plan.seed is not None:
            arrays[plan.seed]._write_host(1)           # 0 + 1, as Tape.backward seeds a new gradient
        if not plan.cpu:
            for zero, run, buf, adj in plan.adjoints:
                for key in zero:
                    arrays[key]._zero_memory()
                run(buf.raw, adj.raw)
            for key in plan.zero_after:
                arrays[key]._zero_memory()
            return
        for zero, entry, buf, adj, serial, _ in plan.adjoints:
            for key in zero:
                ctypes.memset(_ptr(arrays[key]), 0, plan.nbytes[key])
            entry(buf, adj, None, 0, 0, None, serial)
        for key in plan.zero_after:
            ctypes.memset(_ptr(arrays[key]), 0, plan.nbytes[key])
