"""Step traces: the launches a step made, with its own buffers as slots, so that a step that already
ran (checked, under its StepTape) can run again without its Python function.

A trace is read off a step's tape after its first run. Each launch keeps its kernel, dims and
`deterministic`, and each argument is either a slot (``Slot("prev", "u")``, ``Slot("next", "u")``,
``Slot("scratch", "force")``), filled with that step's versions at replay, or the value itself (a
scalar, a parameter, any other array the step only reads). A step is traced only when everything it
wrote went through a recorded CPU launch into s.next or s.scratch (a whole-array copy is one; no
partial copies, assign or fill_, no debug launches, no writes to arrays of its own making).

The executor replays a trace only while every step of the run has had the same one (a step function
whose launches do not depend on the step: the common case). That keeps one trace per run, and a step
whose trace differs turns replays off for the rest of the run. Replays rely on what recomputation
relies on anyway: a step function is a function of its state. It makes the same launches when it
runs again from the same state.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler import array
from compiler.runtime.launch import relaunch

__all__ = ["SeriesRows", "Slot", "StepTrace", "loss_reversed_last", "reverse_loss_last", "series_row", "trace_step"]


@dataclass(frozen=True, slots=True)
class Slot:
    """One of a step's own buffers: ``group`` is "prev", "next", "scratch" or "series" (the row of
    a time-indexed input, `Model.series`, for the step being run)."""
    group: str
    name: str


@dataclass(frozen=True, eq=False, slots=True)
class TracedLaunch:
    kernel: object
    dims: tuple
    args: tuple                # a Slot, or the argument itself
    deterministic: bool
    where: str                 # the user's launch line, for messages from a replayed step's tape


def _same_argument(a, b) -> bool:
    if isinstance(a, Slot) or isinstance(b, Slot):
        return a == b
    if isinstance(a, array) or isinstance(b, array):
        return a is b
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):              # a vector or matrix argument given as an array
        return a.dtype == b.dtype and np.array_equal(a, b)
    try:
        return bool(a == b)
    except (TypeError, ValueError):
        return False


@dataclass(frozen=True, eq=False, slots=True)
class StepTrace:
    launches: tuple[TracedLaunch, ...]
    scratch: tuple                 # (name, shape, dtype, zero) of each s.scratch buffer, in order
    loss: Slot | None              # the running loss's buffer
    differentiable: bool           # every kernel has an adjoint (else recording must raise, so it runs)
    step_launches: int             # the step function's launches; the running loss's follow them
    loss_last: bool                # the running loss's adjoints run after the step's (`loss_reversed_last`)
    unread: frozenset              # launches whose outputs no later launch reads (see `unread_launches`)
    reversal_reads: frozenset      # the states a reversal from the step's start reads (`reversal_reads`)
    reversal_fills: frozenset      # the buffers whose zero fill a reversal needs (`reversal_fills`)

    def covered(self, shapes: dict) -> frozenset:
        """The step's buffers, as (group, name), that the first launch touching them writes whole
        without reading (`Compiled.covers`, launched over the buffer's shape in `shapes`): the zero
        fill a step's take gives s.next and scratch is never seen there, so the native loops skip
        it (the FWI step's u_next: a 350 KB fill a step)."""
        seen, out = set(), set()
        for t in self.launches:
            covers = t.kernel.compiled().covers
            bound: dict = {}
            for a, p in zip(t.args, t.kernel.params):
                if type(a) is Slot:
                    bound.setdefault((a.group, a.name), []).append(p.name)
            for key, params in bound.items():
                if key not in seen and key in shapes and tuple(shapes[key]) == tuple(t.dims) and all(
                        name in covers for name in params):
                    out.add(key)
            seen |= bound.keys()
        return frozenset(out)

    @property
    def reversal_order(self) -> tuple:
        """The launches (by index) in the order their adjoints run: last to first, but for a running
        loss reversed last (`loss_reversed_last`), whose launches then follow the step's."""
        k = len(self.launches) if not self.loss_last else self.step_launches
        return (*range(k - 1, -1, -1), *range(len(self.launches) - 1, k - 1, -1))

    @property
    def series_names(self) -> tuple:
        """The time-indexed inputs (``s.series``) any launch of the step or its running loss reads."""
        return tuple(sorted({a.name for t in self.launches for a in t.args if type(a) is Slot and a.group == "series"}))

    def matches(self, tape, prev, nxt, scratch: dict, scratch_zero: dict, loss, step_ops: int, series=None) -> bool:
        """Whether the step that just ran under `tape` (as for `trace_step`) made this trace.
        Every first run of a step asks, so this walks the tape against the trace in place: building
        the step's own trace and comparing costs 11 us a step against 2.5 us. Arguments at a slot's
        place must be that slot's array and the rest the very values traced, so what `trace_step`
        found of the writes holds here too; only views of the step's buffers need looking at again."""
        ops = tape._ops
        if tape.writes_checked != len(ops) or len(ops) != len(self.launches) or len(scratch) != len(self.scratch) \
                or step_ops != self.step_launches:
            return False
        for (name, shape, dtype, zero), (have, a) in zip(self.scratch, scratch.items()):
            if name != have or a.shape != shape or a.dtype != dtype or scratch_zero.get(name) != zero:
                return False
        groups = {"prev": prev, "next": nxt, "scratch": scratch, "series": series or {}}
        if (loss is None) != (self.loss is None) or loss is not None and groups[self.loss.group].get(self.loss.name) is not loss:
            return False
        own_memory = None
        for op, traced in zip(ops, self.launches):
            if op.launch is None:
                return False
            kernel, dims, args, device, debug, deterministic = op.launch
            if kernel is not traced.kernel or tuple(dims) != traced.dims or deterministic != traced.deterministic \
                    or debug or len(args) != len(traced.args):
                return False
            for a, t in zip(args, traced.args):
                if type(t) is Slot:
                    if groups[t.group].get(t.name) is not a:
                        return False
                elif not _same_argument(a, t):
                    return False
                elif type(a) is array:         # the same array as before: still not a view of ours?
                    if own_memory is None:
                        own_memory = {id(b._storage) for group in groups.values() for b in group.values()}
                    if id(a._storage) in own_memory:
                        return False
        return True

    def run(self, prev, nxt, scratch: dict, tape=None, skip: frozenset = frozenset(), with_loss: bool = True,
            series=None) -> None:
        """The step's launches on these versions (`scratch` by name, already taken). With `tape`,
        each is also recorded there; those whose index is in `skip` are recorded without running.
        ``with_loss=False`` leaves out the running loss's launches (a recomputation needs no loss)."""
        groups = {"prev": prev, "next": nxt, "scratch": scratch, "series": series or {}}
        launches = self.launches if with_loss else self.launches[:self.step_launches]
        for k, t in enumerate(launches):
            args = [groups[a.group][a.name] if type(a) is Slot else a for a in t.args]
            relaunch(t.kernel, t.dims, args, t.deterministic, tape, t.where, run=k not in skip)


def series_row(name: str, values: array, n: int) -> array:
    """Row n of the time-indexed input `values` as step n reads it (``s.series.<name>``): a view,
    one element long for a 1-D `values`."""
    data = values._data
    if values.device == "cpu":
        data = data[n] if values.ndim > 1 else data[n:n + 1]
    else:                                    # device memory: a view at the row's offset
        shape = data.shape[1:] if values.ndim > 1 else (1, *data.shape[1:])
        data = type(data)(data.buffer, shape, data.dtype, data.offset + n * data.strides[0])
    return array._wrap(data, values.dtype, storage=values._storage, fn=f"s.series.{name}", device=values.device)


class SeriesRows:
    """The time-indexed inputs a trace reads, as native drivers move them: row n of a series
    starts at ``base + n * stride`` (its first dimension's stride), the row `series_row` views."""

    def __init__(self, series: dict, trace):
        self.names = trace.series_names
        self.arrays = [series[name] for name in self.names]
        self.bases = [(a.ptr, a.strides[0]) for a in self.arrays]

    def fits(self, n1: int) -> bool:
        """Whether every series has rows for steps up to n1 - 1 (else the Python path runs the
        steps and names the series that is short, at the step that needs the missing row)."""
        return all(a.shape[0] >= n1 for a in self.arrays)

    def views(self, n: int) -> dict:
        return {name: series_row(name, a, n) for name, a in zip(self.names, self.arrays)}

    def pointer(self, k: int, n: int) -> int:
        base, stride = self.bases[k]
        return base + n * stride


def trace_step(tape, prev, nxt, scratch: dict, scratch_zero: dict, loss, step_ops: int,
               series=None) -> StepTrace | None:
    """The trace of a step that just ran under `tape` (a StepTape) from `prev` into `nxt` with these
    scratch buffers, or None when the step cannot be replayed (see the module docstring). The first
    `step_ops` ops are the step function's, the rest the running loss's."""
    if tape.writes_checked != len(tape._ops):
        return None                  # a write the tape checked but did not record: a partial copy, fill_, ...
    slots = {}
    for group, arrays in (("prev", prev), ("next", nxt), ("scratch", scratch), ("series", series or {})):
        for name, a in arrays.items():
            slots[id(a)] = Slot(group, name)
    writable = {id(a) for a in (*nxt.values(), *scratch.values())}
    own_memory = {id(a._storage) for group in (prev, nxt, scratch) for a in group.values()}
    launches = []
    differentiable = True
    for op in tape._ops:
        if op.launch is None:
            return None
        kernel, dims, args, device, debug, deterministic = op.launch
        if debug:
            return None
        if any(id(a) not in writable for a in (*op.writes.values(), *op.accumulates.values())):
            return None              # writes into an array the step did not get from its pool
        if any(isinstance(a, array) and id(a) not in slots and id(a._storage) in own_memory for a in args):
            return None              # a view of one of the step's buffers: it would outlive them
        if kernel.compiled().adjoint_error is not None:
            differentiable = False
        launches.append(TracedLaunch(kernel, tuple(dims), tuple(slots.get(id(a), a) if isinstance(a, array) else a
                                                                for a in args), deterministic, op.where))
    if loss is not None and id(loss) not in slots:
        return None
    spec = tuple((name, a.shape, a.dtype, scratch_zero.get(name)) for name, a in scratch.items())
    unread = unread_launches(launches)
    return StepTrace(tuple(launches), spec, slots.get(id(loss)) if loss is not None else None, differentiable,
                     step_ops, loss_reversed_last(tape._ops, step_ops), unread, reversal_reads(launches, unread),
                     reversal_fills(launches, unread))


def loss_reversed_last(ops, step_ops: int) -> bool:
    """Whether the adjoints of a running loss's recorded ops (`ops[step_ops:]`, after the step's)
    may run after the step's adjoints rather than before: the loss reads nothing the step writes
    and writes nothing the step touches (a misfit of s.prev, a penalty on the parameters). Then
    they do (`reverse_loss_last`, `StepTrace.reversal_order`): the step's adjoints write the
    previous state's gradient whole (a gather form stores, a copy's adjoint copies) where the
    loss's adds into it would first have needed a zero fill, and the loss's adds, a few receivers'
    worth, land on top. In the FWI step's reversal a fill and an add over the grid go. The same
    gradient, rounded in another order; the tape and the native reversal both take this order, so
    their bits agree."""
    if step_ops >= len(ops):
        return False

    def storages(op_list, *kinds):
        return {id(a._storage) for op in op_list for kind in kinds for a in getattr(op, kind).values()}
    step, loss = ops[:step_ops], ops[step_ops:]
    written = storages(step, "writes", "accumulates")
    return not storages(loss, "reads") & written and \
        not storages(loss, "writes", "accumulates") & (written | storages(step, "reads"))


def reverse_loss_last(tape, step_ops: int) -> None:
    """Put the running loss's ops of a step's `tape` before the step's (see `loss_reversed_last`,
    which must hold), so that Tape.backward runs their adjoints last."""
    ops = tape._ops
    ops[:] = ops[step_ops:] + ops[:step_ops]


def unread_launches(launches) -> frozenset:
    """The launches (by index) whose outputs no later launch of the step reads, forward or in its
    adjoint: the last one at least. A recording reversed at once needs its step's outputs for
    nothing (each adjoint replays its launch from that launch's inputs), so it records those
    without running them: `sp.copy(s.next.up, s.prev.u)` after the kernel that writes s.next.u
    leaves both unrun."""
    def slots(t, wanted):
        uses = t.kernel.compiled().uses
        return {a for a, p in zip(t.args, t.kernel.params) if type(a) is Slot and p.name in uses
                and wanted(uses[p.name])}
    unread, read_later = set(), set()
    for k in range(len(launches) - 1, -1, -1):
        t = launches[k]
        if not slots(t, lambda u: u.stores or u.accumulates) & read_later:
            unread.add(k)
        read_later |= slots(t, lambda u: u.reads or u.adjoint_reads)
    return frozenset(unread)


def reversal_fills(launches, unread: frozenset) -> frozenset:
    """The buffers, as (group, name), whose zero fill (a step's take gives s.next and scratch
    one) a reversal needs: those the launches it runs forward (all but `unread`) touch, and
    those an adjoint loads (`Compiled.adjoint_loads`). The FWI step's reversal runs no launch
    forward and filled two 350 KB buffers a step for nothing."""
    def loaded(t, p):
        return p.name in t.kernel.compiled().adjoint_loads
    return frozenset((a.group, a.name) for k, t in enumerate(launches) for a, p in zip(t.args, t.kernel.params)
                     if type(a) is Slot and (k not in unread or loaded(t, p)))


def reversal_reads(launches, unread: frozenset) -> frozenset:
    """The names of the states (s.prev) whose values a reversal of the step from its start state
    reads: the inputs of the launches it runs forward (all but `unread`) and what the adjoints load
    (`Compiled.adjoint_loads`). A recording kept for later keeps only these: the wave step that
    writes ``next.up = prev.u`` reads prev.up in its forward, but its adjoint's derivative of
    ``-up`` is a constant, so StoreAll keeps prev.u alone, half the memory."""
    needed = set()
    for k, t in enumerate(launches):
        compiled = t.kernel.compiled()
        loads = compiled.adjoint_loads
        for a, p in zip(t.args, t.kernel.params):
            if type(a) is Slot and a.group == "prev" and (
                    p.name in loads or k not in unread and compiled.uses[p.name].reads):
                needed.add(a.name)
    return frozenset(needed)
