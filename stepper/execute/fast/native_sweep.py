"""A stretch of a reverse sweep run natively: the schedule's actions worked out first, then one call.

With recomputations in native loops (stepper/execute/fast/native_loop.py) and each recorded step reversed at
once natively (stepper/execute/fast/native_reverse.py), what is left of a binomial reverse sweep in Python is
the executor's dispatch: four or so actions per reversed step (read a snapshot, advance, record and
reverse, the Reverse itself), each taking and releasing versions in the pool, about 60 us a
reversed step. Here the sweep hands over a stretch of actions that need nothing but RAM snapshots
held in the pool (`HeldStates`) and the two plans the step already has: they are worked out in
Python on plain counters (which version each action reads and writes, in the order the executor
would take and release them: stepper/execute/fast/stretch_versions.py), written into one table of operations, and
run by one call into C++ (sweep.cpp): ``0`` an advance (the native loop's ring, the same driver),
``1`` a step reversed from the state it started from (the native reversal's packed launches, fills and
adjoints): a step recorded and reversed at once, or one recorded natively before (`Kept`:
StoreAll's forward sweep keeps every step's start state, and its reverse sweep, a tag Move and a
Reverse per step, is one stretch), ``2`` an advance of one step whose whole-state copies are
renamed, its result sharing the copied array with the state it started from (`_renamed_step`),
``4`` an advance of more steps whose copies are renamed on every step (the ring's arrays
end where the driver leaves them: `ring_result`). Every operation starts with its step index
(the rows of the series the step reads). Then the pool's holds, the held snapshots, the live state, the carried adjoint and the statistics
are set to what the executor would have left. The operations are the ones the executor would have
run, on the same versions' roles, in the same order (a renamed copy holds what the copy would
have written): the same bits.

A stretch ends before the first action it cannot take (a DISK snapshot, a step recorded for
later, a schedule mistake: the executor then runs it as usual and says what is wrong).
"""
from __future__ import annotations

import ctypes
import time

import numpy as np

from checkpoint import Copy, EndReverse, Forward, Move, Reverse, StorageType
from compiler.runtime.tape import settle

from ...step.state import State
from ..snapshots import HeldStates
from .native_loop import _Launch, _Series, _ptr, native_library
from .native_reverse import Kept
from .stretch_versions import StretchVersions, Version

__all__ = ["NativeSweep"]

_RAM, _WORK, _NONE = StorageType.RAM, StorageType.WORK, StorageType.NONE

def ring_result(start: tuple, a: tuple, b: tuple, pairs: list, steps: int, in_place: tuple = ()) -> tuple:
    """The arrays (by state) that sp_advance with renamed copies `pairs` ((to, from) state
    indices; those in `in_place` written in place, `in_place_renames`) leaves in its prev slots
    after `steps` steps from `start`, `a` its first next versions and `b` its spares: the driver's
    slot moves, replayed on the arrays. After the first two steps they depend on the slots alone,
    so whole periods of them are skipped."""
    prev, nxt, spare = list(start), list(a), list(b)
    seen: dict = {}
    k = 0
    while k < steps:
        renaming = steps > 1
        if renaming:
            saved = [(prev[to], nxt[to], prev[src]) for to, src in pairs]
        for s in range(len(prev)):
            old = prev[s]
            prev[s] = nxt[s]
            nxt[s] = spare[s] if k == 0 else old
        if renaming:
            for (to, src), (to_prev, to_next, src_prev) in zip(pairs, saved):
                prev[to], nxt[to] = src_prev, to_next
                nxt[src] = spare[to] if k == 0 else prev[to] if (to, src) in in_place \
                    else spare[src] if k == 1 else to_prev
        k += 1
        if 2 <= k < steps - 1:
            key = (*map(id, prev), *map(id, nxt))
            if key in seen:
                period = k - seen[key]
                k += (steps - 1 - k) // period * period
            seen[key] = k
    return tuple(prev)


class _RPatch(ctypes.Structure):
    _fields_ = [("buf", ctypes.c_void_p), ("offset", ctypes.c_int64), ("slot", ctypes.c_int64)]


class _RCall(ctypes.Structure):
    _fields_ = [("entry", ctypes.c_void_p), ("fwd", ctypes.c_void_p), ("adj", ctypes.c_void_p),
                ("serial", ctypes.c_int64), ("zero_begin", ctypes.c_int64), ("zero_end", ctypes.c_int64)]


class _Fill(ctypes.Structure):
    _fields_ = [("slot", ctypes.c_int64), ("nbytes", ctypes.c_int64)]


class _PlanTables(ctypes.Structure):
    _fields_ = [("S", ctypes.c_int64), ("F", ctypes.c_int64),
                ("launches", ctypes.c_void_p), ("n_launches", ctypes.c_int64),
                ("patches", ctypes.c_void_p), ("n_patches", ctypes.c_int64),
                ("slots", ctypes.c_void_p), ("states", ctypes.c_void_p), ("zeros", ctypes.c_void_p),
                ("n_zeros", ctypes.c_int64),
                ("rforward", ctypes.c_void_p), ("n_rforward", ctypes.c_int64),
                ("rpatches", ctypes.c_void_p), ("n_rpatches", ctypes.c_int64),
                ("before", ctypes.c_void_p), ("n_before", ctypes.c_int64),
                ("seed_slot", ctypes.c_int64), ("seed_size", ctypes.c_int64),
                ("calls", ctypes.c_void_p), ("n_calls", ctypes.c_int64),
                ("fills", ctypes.c_void_p), ("after_begin", ctypes.c_int64), ("after_end", ctypes.c_int64),
                ("rslots", ctypes.c_void_p), ("renames", ctypes.c_void_p), ("time", ctypes.c_void_p),
                ("rseries", ctypes.c_void_p), ("n_rseries", ctypes.c_int64)]


_function = None


def _sweep_function():
    global _function
    if _function is None:
        fn = native_library("sweep.cpp", "stepper_native_sweep").sp_sweep
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
        fn.restype = None
        _function = fn
    return _function


class _Tables:
    """The two plans of one trace as the C++ driver reads them (kept alive with the plans)."""

    def __init__(self, advance_plan, advance_slots, reverse_plan, names, floats, trace, zero_next: bool, rows):
        S, F = len(names), len(floats)
        scratch = [spec[0] for spec in trace.scratch]
        gscratch = [name for name in scratch if ("gscratch", name) in reverse_plan.nbytes]
        index = {("prev", n): k for k, n in enumerate(names)}
        index.update({("next", n): S + k for k, n in enumerate(names)})
        index.update({("gprev", n): 2 * S + k for k, n in enumerate(floats)})
        index.update({("carry", n): 2 * S + F + k for k, n in enumerate(floats)})
        index.update({("scratch", n): 2 * S + 2 * F + k for k, n in enumerate(scratch)})
        index.update({("gscratch", n): 2 * S + 2 * F + len(scratch) + k for k, n in enumerate(gscratch)})
        first_row = len(index)
        index.update({("series", n): first_row + k for k, n in enumerate(rows.names)})
        self.rseries = (_Series * max(len(rows.names), 1))(
            *[_Series(first_row + k, base, stride) for k, (base, stride) in enumerate(rows.bases)])
        self.index, self.gscratch = index, gscratch
        rp = reverse_plan
        self.rslots = (ctypes.c_void_p * len(index))()
        self.rforward = (_Launch * max(len(rp.forward), 1))(*[_Launch(addr, buf, serial)
                                                             for _, buf, serial, addr in rp.forward])
        patches = [_RPatch(ctypes.addressof(buf), offset, index[key])
                   for buf, offset, key in (*rp.forward_patches, *rp.adjoint_patches)]
        patches += [_RPatch(ctypes.addressof(buf), offset, index[("series", name)])
                    for buf, offset, name in rp.series_patches]
        self.rpatches = (_RPatch * max(len(patches), 1))(*patches)
        # (as NativeReversal.reverse: only StepTrace.reversal_fills)
        before = [_Fill(index[("next", n)], rp.nbytes[("next", n)]) for n in names
                  if zero_next and ("next", n) in trace.reversal_fills]
        before += [_Fill(index[("scratch", name)], rp.nbytes[("scratch", name)])
                   for name, shape, dtype, zero in trace.scratch
                   if (zero or (zero is None and zero_next)) and ("scratch", name) in trace.reversal_fills]
        self.before = (_Fill * max(len(before), 1))(*before)
        fills, calls = [], []
        for zero, _, buf, adj, serial, entry in rp.adjoints:
            begin = len(fills)
            fills += [_Fill(index[key], rp.nbytes[key]) for key in zero]
            calls.append(_RCall(entry, buf, adj, serial, begin, len(fills)))
        after = len(fills)
        fills += [_Fill(index[key], rp.nbytes[key]) for key in rp.zero_after]
        self.calls = (_RCall * max(len(calls), 1))(*calls)
        self.fills = (_Fill * max(len(fills), 1))(*fills)
        seed_slot = index[rp.seed] if rp.seed is not None else -1
        seed_size = rp.nbytes[rp.seed] if rp.seed is not None else 0
        ap = advance_plan
        self.plan = _PlanTables(
            S, F, ctypes.addressof(ap.launches), ap.step_launches, ctypes.addressof(ap.patches), len(ap.patches),
            ctypes.addressof(advance_slots), ctypes.addressof(ap.states), ctypes.addressof(ap.zeros), len(ap.zeros),
            ctypes.addressof(self.rforward), len(rp.forward), ctypes.addressof(self.rpatches), len(patches),
            ctypes.addressof(self.before), len(before), seed_slot, seed_size,
            ctypes.addressof(self.calls), len(calls), ctypes.addressof(self.fills), after, len(fills),
            ctypes.addressof(self.rslots),
            ctypes.addressof(ap.renames) if ap.renames is not None else None,
            ctypes.addressof(ap.time), ctypes.addressof(self.rseries), len(rows.names))
        # the advance's renamed copies (state indices: to, from), which a one-step advance shares
        self.renamed = [(names.index(to), names.index(src)) for to, src in ap.rename_pairs]
        self.in_place = tuple((names.index(to), names.index(src)) for to, src in ap.in_place)
        # the reversal's renamed copy adjoints (gradient indices: gprev's, the carry's it takes)
        self.reverse_renames = [(floats.index(src), floats.index(dest)) for src, dest in rp.renames]
        self.advance_scratch = [spec[0] for spec in ap.scratch]
        self.time = ap.time
        self.advance_slots = advance_slots


class NativeSweep:
    """Runs stretches of a Sweep's reverse sweep natively (see the module docstring)."""

    def __init__(self, sweep):
        self.sweep = sweep
        self.names = list(sweep.model.states)
        self._tables: tuple | None = None          # (advance plan, reverse plan, _Tables)

    # -- whether a stretch can start -------------------------------------------------------------------
    def ready(self) -> bool:
        sw = self.sweep
        if not sw.native_loops or sw.online or sw.pool.device != "cpu" or sw.carry is None:
            return False
        if not isinstance(sw.tiers.tiers.get(_RAM), HeldStates) or sw.tiers._in_flight:
            return False
        trace = sw._runner.trace
        native, reversal = sw.native, sw.reversal
        return bool(trace) and native._plan is not None and native._plan[0] is trace \
            and reversal._plan is not None and reversal._plan.trace is trace and reversal._plan.adjoints is not None

    def _prepared(self) -> _Tables:
        sw = self.sweep
        advance_plan, advance_slots = sw.native._plan[1], sw.native._plan[2]
        reverse_plan = sw.reversal._plan
        if self._tables is None or self._tables[0] is not advance_plan or self._tables[1] is not reverse_plan:
            floats = [n for n in self.names if n in sw.carry]
            tables = _Tables(advance_plan, advance_slots, reverse_plan, self.names, floats, sw._runner.trace,
                             sw.pool.zero, sw.native.rows(sw._runner.trace))
            self._tables = (advance_plan, reverse_plan, tables)
        return self._tables[2]

    # -- one stretch ---------------------------------------------------------------------------------------
    def run(self, action):
        """Work out and run the stretch of actions from `action` on; return the first action it did
        not take (EndReverse at the end of the sweep; None if the schedule ended), which the caller
        runs as usual, and whether it took any."""
        sw = self.sweep
        plan = _Stretch(sw, self.names, self._prepared())
        taken = 0
        while type(action) is not EndReverse and plan.take(action):
            taken += 1
            action = sw._next(lookahead=False)
            if action is None:
                break
        if plan.pending_record is not None:          # a recording whose Reverse did not follow
            if action is not None:
                sw._ahead.appendleft(action)
            action, plan.pending_record = plan.pending_record, None
            taken -= 1
        if not taken:
            plan.abandon()
            return action, False
        if type(action) in (Copy, Move) and action.to_storage is _WORK and action.n not in sw.deps.get(
                action.from_storage, ()):
            sw.tiers.prefetch(action.from_storage, action.n)    # as Sweep._next would: the read overlaps the run
        plan.run_and_commit()
        return action, True


class _Stretch:
    """The versions, holds and operations of one stretch, worked out action by action the way the
    executor would run them (Sweep._forward, _transfer and _reverse, NativeLoops.advance,
    NativeReversal.reverse), then run and committed to the pool, the held snapshots and the sweep.
    Holds found on arrays beyond the ones counted here (a recorded step's, say) are left alone, and
    such arrays are never reused."""

    def __init__(self, sw, names, tables: _Tables):
        pool = sw.pool
        self.sw, self.pool, self.names, self.tables = sw, pool, names, tables
        self.kinds = [pool.kind(spec.shape, spec.dtype) for spec in sw.model.states.values()]
        self.floats = [k for k, n in enumerate(names) if n in sw.carry]
        self.grad_kinds = self.kinds if len(self.floats) == len(names) else [self.kinds[k] for k in self.floats]
        self.held = sw.tiers.tiers[_RAM]
        self.reads_next = sw.reversal._plan.reads_next
        self.unread = len(sw.reversal._plan.trace.unread)     # launches a recording reversed at once skips
        self.versions = StretchVersions(pool, self.kinds, self.grad_kinds)
        self.snaps = {n: self.versions.found(tuple(state[name] for name in names), self.kinds)
                      for n, (state, _) in self.held._states.items()}
        self.work = (self.versions.found(tuple(sw.work[name] for name in names), self.kinds)
                     if sw.work is not None else None)
        self.carry = self.versions.found(tuple(sw.carry[names[k]] for k in self.floats), self.grad_kinds)
        self.dropped: set[int] = set()           # steps recorded natively whose records went here
        self.pos, self.adj, self.seen = sw.pos, sw.adj, sw.seen
        self.ops: list[int] = []
        folds = sw.param_sums.fold_table()
        self.fold = [3, len(folds), *(w for entry in folds for w in entry)] if folds else []
        self.pending_record = None
        self.count = dict(forward=0, recorded=0, reverse=0, advanced=0, advances=0, reversals=0, skipped=0,
                          renamed=0, written=0, read=0, bytes_written=0, bytes_read=0)
        self.state_bytes = sw.model.state_bytes         # every version of the state, snapshots included
        self.ram = self.peak_ram = self.held.nbytes

    # -- actions ---------------------------------------------------------------------------------------------
    def take(self, action) -> bool:
        """Work out `action`; False (nothing changed) where a stretch cannot take it."""
        kind = type(action)
        if self.pending_record is not None:
            record = self.pending_record
            if kind is not Reverse or action.n1 != record.n1 or action.n0 != record.n0 or not action.clear_adj_deps \
                    or action.n1 != self.adj:
                return False
            self.pending_record = None
            if record.write_ics:
                self._write(record.n0)
            self._reverse(record.n0, self.work)
            self.work, self.pos = None, record.n1
            for key in ("forward", "recorded"):
                self.count[key] += 1
            self.count["skipped"] += self.unread
            return True
        if kind is Copy or kind is Move:
            return self._transfer(action, kind is Move)
        if kind is Forward:
            return self._forward(action)
        if kind is Reverse:
            return self._reverse_kept(action)
        return False

    def _transfer(self, a, move: bool) -> bool:
        if a.n in self.sw.deps.get(a.from_storage, ()):
            return self._move_tag(a, move)
        if a.from_storage is not _RAM or a.n not in self.snaps:
            return False
        if a.to_storage is _WORK:
            version = self.snaps[a.n]
            version.refs += 1
            if self.work is not None:
                self.versions.release(self.work)
            self.work = version
            self.pos = a.n
            self.count["read"] += 1
            self.count["bytes_read"] += self.state_bytes
        elif a.to_storage is not _NONE or not move:
            return False
        if move:
            self._delete(a.n)
        return True

    def _move_tag(self, a, move: bool) -> bool:
        """Sweep._transfer of a recorded step's tag (StoreAll's Move to WORK before each Reverse):
        the record stays in memory, only the tag moves. Dropping a record is left to the executor."""
        if a.to_storage is _NONE:
            return False
        deps = self.sw.deps
        if move:
            deps[a.from_storage].discard(a.n)
        if a.to_storage in (_RAM, StorageType.DISK):
            deps[a.to_storage].add(a.n)
        return True

    def _keeps(self, n: int) -> bool:
        """Whether step n was recorded natively (Kept) with the trace planned here, and its record
        is still there."""
        rec = self.sw.recorded.get(n)
        return type(rec) is Kept and rec.prev is not None and rec.trace is self.sw.reversal._plan.trace \
            and n not in self.dropped

    def _kept(self, n: int) -> Version:
        """The state step n kept (`_keeps`), its record's hold counted here."""
        prev = self.sw.recorded[n].prev
        return self.versions.found(tuple(prev.get(name) for name in self.names), self.kinds)

    def _forward(self, a) -> bool:
        if self.work is None or a.n0 != self.pos or a.n1 > self.seen:
            return False
        if a.write_ics and a.storage is not _RAM:
            return False
        if a.write_adj_deps:
            if a.n1 - a.n0 != 1 or a.storage in (_RAM, StorageType.DISK):
                return False
            self.pending_record = a             # taken with the Reverse that must follow
            return True
        if a.write_ics:
            self._write(a.n0)
        if a.n1 > a.n0:
            self._advance(a.n1 - a.n0)
        self.pos = a.n1
        return True

    def _write(self, n: int) -> None:
        if n in self.snaps:
            self._delete(n)
        self.work.refs += 1
        self.snaps[n] = self.work
        self.count["written"] += 1
        self.count["bytes_written"] += self.state_bytes
        self.ram += self.state_bytes
        self.peak_ram = max(self.peak_ram, self.ram)

    def _delete(self, n: int) -> None:
        self.versions.release(self.snaps.pop(n))
        self.ram -= self.state_bytes

    def _advance(self, steps: int) -> None:
        """NativeLoops.advance: a ring of two versions after the start, the start itself as the
        second where nothing else holds it. Its renamed copies (sp_advance) are every
        step's: they move arrays between the ring's states, so the result is the arrays the
        driver leaves in its slots (`ring_result`), regrouped; a one-step advance renames its
        copies too (`_renamed_step`)."""
        start = self.work
        renamed = self.tables.renamed
        if steps == 1 and renamed:
            self._renamed_step(start, renamed)
        else:
            a = self.versions.new(self.kinds)
            reuse = self.versions.alone(start)
            b = start if reuse else self.versions.new(self.kinds)
            ring = [a, b]
            result = ring_result(start.arrays, a.arrays, b.arrays, renamed, steps, self.tables.in_place) if renamed else None
            if result is not None and {id(x) for x in result} <= {id(x) for v in ring for x in v.arrays}:
                self.ops += [4, self.pos, steps, *start.ptrs, *a.ptrs, *b.ptrs]
                if not reuse:
                    self.versions.release(start)        # (never written: spares stand in for it)
                self.work = self.versions.regroup(result, self.kinds, ring)
                self.count["renamed"] += steps * len(renamed)
            else:
                self.ops += [0, self.pos, steps, *start.ptrs, *a.ptrs, *b.ptrs]
                if reuse:
                    start.refs += 1                     # the ring's; the live state's is released below
                mine, other = (a, b) if steps % 2 else (b, a)
                self.versions.release(other)
                self.versions.release(start)
                self.work = mine
        self.count["forward"] += steps
        self.count["advanced"] += steps
        self.count["advances"] += 1

    def _renamed_step(self, start: Version, renamed: list) -> None:
        """One step whose copies s.next.to = s.prev.src are renamed: the new version's `to` is the
        start's `src` array itself, shared by the two. Revolve's innermost recomputations are such
        steps, each keeping its result as a snapshot: the step writes one array less and the
        snapshots hold one less each. Where they outgrow the cache that counts: a 256^2 wave's
        one-step recomputation in a Revolve-200 gradient took 26 us with its copy, 20 us without."""
        result = self.versions.renamed(start, renamed)
        self.ops += [2, self.pos, *start.ptrs, *result.ptrs]
        self.versions.release(start)
        self.work = result
        self.count["renamed"] += len(renamed)

    def _reverse_kept(self, a) -> bool:
        """Sweep._reverse of steps recorded natively (Kept): each reversed from the state it kept,
        dropping the record, or keeping it where the action keeps adjoint data (a KeptTrajectory's
        reverse sweeps: the reversal then takes a hold of its own, as Sweep._reverse_kept does)."""
        steps = range(a.n1 - 1, a.n0 - 1, -1)
        if a.n1 != self.adj or not all(map(self._keeps, steps)):
            return False
        if self.work is not None and self.pos > a.n0:
            self.versions.release(self.work)      # nothing runs forward past the adjoint
            self.work = None
        if not a.clear_adj_deps:
            recorded, names = self.sw.recorded, self.names
            for k in steps:                       # the records keep their holds: only pointers here
                self._reverse(k, None, [0 if x is None else _ptr(x) for x in map(recorded[k].prev.get, names)])
            return True
        for k in steps:
            self._reverse(k, self._kept(k))
            self.dropped.add(k)
        return True

    def _reverse(self, n: int, prev: Version | None, prev_ptrs: list | None = None) -> None:
        """NativeReversal.reverse of step n from `prev` (its hold passes here), or from a record
        that keeps its hold (`prev_ptrs` only), and the carried adjoint."""
        renames = self.tables.reverse_renames
        if not self.reads_next and self.grad_kinds is self.kinds and not renames:
            gprev = self.versions.new(self.kinds)  # s.next, which nothing reads, in the gradient's memory
            nxt = gprev
        else:
            nxt = self.versions.new(self.kinds)
            if not self.reads_next:
                self.versions.release(nxt)         # its memory may serve the gradient below
            # a renamed copy adjoint's gradient is the carry's array (NativeReversal.reverse)
            gprev = self.versions.renamed(self.carry, renames) if renames else self.versions.new(self.grad_kinds)
        self.ops += [1, n, *(prev.ptrs if prev is not None else prev_ptrs), *nxt.ptrs, *gprev.ptrs, *self.carry.ptrs]
        if self.sw.param_sums.due(n):             # as Sweep._reverse folds
            self.ops += self.fold
        if self.reads_next:
            self.versions.release(nxt)
        self.versions.release(self.carry)
        if prev is not None:
            self.versions.release(prev)
        self.carry, self.adj = gprev, n
        self.count["reverse"] += 1
        self.count["reversals"] += 1

    # -- the end -----------------------------------------------------------------------------------------------
    def abandon(self) -> None:
        """Nothing ran: give back what was taken."""
        self.pool.release_all(self.versions.taken)

    def run_and_commit(self) -> None:
        sw, pool, tables = self.sw, self.pool, self.tables
        start = time.perf_counter()
        trace = sw._runner.trace
        scratch = {name: pool.acquire(shape, dtype, zero=False) for name, shape, dtype, _ in trace.scratch}
        gscratch = {name: pool.acquire_like(scratch[name], zero=False) for name in tables.gscratch}
        try:
            S = len(self.names)
            for k, name in enumerate(tables.advance_scratch):
                tables.advance_slots[2 * S + k] = _ptr(scratch[name])
            for group, arrays in (("scratch", scratch), ("gscratch", gscratch)):
                for name, arr in arrays.items():
                    tables.rslots[tables.index[(group, name)]] = _ptr(arr)
            if self.ops:
                tables.time.losses = None               # recomputations compute no running loss
                ops = np.array(self.ops, dtype=np.int64)
                settle()                                # launches a Tape holds run first
                _sweep_function()(ops.ctypes.data, len(ops), ctypes.addressof(tables.plan))
        finally:
            pool.release_all((*scratch.values(), *gscratch.values()))
        self._commit(time.perf_counter() - start)

    def _commit(self, seconds: float) -> None:
        """Holds, snapshots, live state, carry and statistics as the executor would have left them."""
        sw, pool, names = self.sw, self.pool, self.names
        for a, delta in self.versions.hold_changes():
            if delta > 0:
                pool.retain_all([a] * delta)
            elif delta < 0:
                pool.release_all([a] * -delta)
        held = self.held
        states = {tuple(id(state[name]) for name in names): state for state, _ in held._states.values()}
        held._states = {}
        for n, version in self.snaps.items():
            state = states.get(tuple(map(id, version.arrays))) or State(dict(zip(names, version.arrays)))
            held._states[n] = (state, self.state_bytes)
        held.nbytes = sum(nbytes for _, nbytes in held._states.values())
        c = self.count
        held._written += c["written"]
        held._read += c["read"]
        held._bytes_written += c["bytes_written"]
        held._bytes_read += c["bytes_read"]
        sw.tiers.peak_ram_bytes = max(sw.tiers.peak_ram_bytes, self.peak_ram)
        sw.work = State(dict(zip(names, self.work.arrays))) if self.work is not None else None
        sw.carry = {names[k]: a for k, a in zip(self.floats, self.carry.arrays)}
        sw.pos, sw.adj = self.pos, self.adj
        for n in self.dropped:
            del sw.recorded[n]
        sw.forward_steps += c["forward"]
        sw.recorded_steps += c["recorded"]
        sw.reverse_steps += c["reverse"]
        sw._runner.launches_skipped += c["skipped"]
        sw.native.steps += c["advanced"]
        sw.native.calls += c["advances"]
        sw.native.renamed_copies += c["renamed"]
        sw.reversal.steps += c["reversals"]
        sw.adjoint_seconds += seconds
        sw.peak_bytes = max(sw.peak_bytes, pool.allocated_bytes + sw.tiers.ram_bytes)
        sw.bar.update(c["forward"] + c["reverse"])
