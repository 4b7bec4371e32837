"""Native step loops: a run of recomputed steps handed to compiled code in one call.

A recomputation between checkpoints (``Forward(n0, n1)`` recording nothing, over steps that ran
before) replays the step's trace (stepper/trace.py) once per step from Python: each replay takes new
versions from the pool, packs every launch's arguments and calls each kernel through ctypes, about
30-40 us a step on top of the kernels. Here the whole run is one foreign call instead: the trace's
launches are packed once (`compiler.runtime.launch.packed_forward`), and a small C++ driver calls their
CPU forward entry points back to back, step after step, writing the current buffers' pointers into
the packed arguments before each step.

The buffer ring: the state the run starts from is read by the first step only; each state then
alternates between two versions, A and B, so step k reads what step k-1 wrote and never a buffer it
writes. B is the starting version itself where nothing else holds it (the live state's own version,
free once the first step has read it), so a run holds no more versions than the Python path. Scratch buffers are reused by every
step (nothing records them). What the Python path zero-fills on each take (s.next when the model's
`zero_buffers`, scratch asked with zero) the driver zero-fills before each step, so every launch
sees the same inputs as a replay from Python and the state comes out with the same bits: same entry
points, same packed arguments, same serial flags, same order.

A run of recordings kept for the reverse sweep (StoreAll's forward sweep) is one call too
(`advance_keeping`): each step writes versions of its own of the states its reversal reads, which
it keeps; the rest take turns in two versions.
"""
from __future__ import annotations

import ctypes
import logging

from compiler.backends.cpu_build import build_cpu_library, load_cpu_library
from compiler.runtime.launch import packed_forward
from compiler.runtime.tape import settle

from .state import State
from .trace import Slot

__all__ = ["NativeLoops"]

log = logging.getLogger(__name__)

_DRIVER = r"""
#include <cstdint>
#include <cstring>
typedef void (*forward_t)(const char*, int);
struct sp_launch { forward_t entry; char* buf; int64_t serial; };
struct sp_patch { int64_t launch; int64_t offset; int64_t slot; };   // buf + offset <- slots[slot]
struct sp_state { int64_t prev; int64_t next; void* spare; };        // slot indices, the second new version
struct sp_zero { int64_t slot; int64_t nbytes; };

// Runs `steps` steps. slots[] holds the buffers of the first step; after step k each state's prev
// slot takes what its next slot held, and its next slot the buffer that is free again (the spare
// after the first step: the starting state is never written). On return the prev slots hold the
// last step's result and the next slots the other version.
extern "C" void sp_advance(int64_t steps, const sp_launch* launches, int64_t n_launches,
                           const sp_patch* patches, int64_t n_patches, void** slots,
                           const sp_state* states, int64_t n_states, const sp_zero* zeros, int64_t n_zeros) {
    for (int64_t k = 0; k < steps; ++k) {
        for (int64_t p = 0; p < n_patches; ++p)
            std::memcpy(launches[patches[p].launch].buf + patches[p].offset, &slots[patches[p].slot], sizeof(void*));
        for (int64_t z = 0; z < n_zeros; ++z)
            std::memset(slots[zeros[z].slot], 0, (size_t)zeros[z].nbytes);
        for (int64_t l = 0; l < n_launches; ++l)
            launches[l].entry(launches[l].buf, (int)launches[l].serial);
        for (int64_t s = 0; s < n_states; ++s) {
            void* old = slots[states[s].prev];
            slots[states[s].prev] = slots[states[s].next];
            slots[states[s].next] = k == 0 ? states[s].spare : old;
        }
    }
}

// Runs `steps` steps, step k from versions[k] into versions[k + 1] (n_states buffers each, in state
// order): steps that each keep their result (records kept for the reverse sweep).
extern "C" void sp_advance_each(int64_t steps, const sp_launch* launches, int64_t n_launches,
                                const sp_patch* patches, int64_t n_patches, void** slots,
                                const sp_state* states, int64_t n_states, const sp_zero* zeros, int64_t n_zeros,
                                void* const* versions) {
    for (int64_t k = 0; k < steps; ++k) {
        for (int64_t s = 0; s < n_states; ++s) {
            slots[states[s].prev] = versions[k * n_states + s];
            slots[states[s].next] = versions[(k + 1) * n_states + s];
        }
        sp_advance(1, launches, n_launches, patches, n_patches, slots, states, n_states, zeros, n_zeros);
    }
}
"""


class _Launch(ctypes.Structure):
    _fields_ = [("entry", ctypes.c_void_p), ("buf", ctypes.c_void_p), ("serial", ctypes.c_int64)]


class _Patch(ctypes.Structure):
    _fields_ = [("launch", ctypes.c_int64), ("offset", ctypes.c_int64), ("slot", ctypes.c_int64)]


class _StateSlots(ctypes.Structure):
    _fields_ = [("prev", ctypes.c_int64), ("next", ctypes.c_int64), ("spare", ctypes.c_void_p)]


class _Zero(ctypes.Structure):
    _fields_ = [("slot", ctypes.c_int64), ("nbytes", ctypes.c_int64)]


_driver = None


def _driver_functions():
    """The driver's entry points (sp_advance, sp_advance_each), built (or loaded from the kernel
    cache) on first use."""
    global _driver
    if _driver is None:
        library = load_cpu_library(build_cpu_library(_DRIVER, "stepper_native_loop"))
        tables = [ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                  ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64]
        # (the tables go in as addresses: plain ints convert fastest)
        for fn, extra in ((library.sp_advance, []), (library.sp_advance_each, [ctypes.c_void_p])):
            fn.argtypes = tables + extra
            fn.restype = None
        _driver = (library.sp_advance, library.sp_advance_each)
    return _driver


class _Plan:
    """One trace's step launches packed for the driver, with the tables that do not change between
    runs. Slot numbering: the states' prev versions, then their next versions, then the scratch
    buffers the step's launches use."""

    def __init__(self, trace, states: list[str], prev: State, nxt: State, scratch: dict, zero_next: bool):
        launches = trace.launches[:trace.step_launches]        # a recomputation computes no loss
        used = {a.name for t in launches for a in t.args if type(a) is Slot and a.group == "scratch"}
        self.scratch = [spec for spec in trace.scratch if spec[0] in used]
        index = {("prev", name): k for k, name in enumerate(states)}
        index.update({("next", name): len(states) + k for k, name in enumerate(states)})
        index.update({("scratch", spec[0]): 2 * len(states) + k for k, spec in enumerate(self.scratch)})
        groups = {"prev": prev, "next": nxt, "scratch": scratch}
        self.buffers, patches = [], []
        self.launches = (_Launch * len(launches))()
        for k, t in enumerate(launches):
            args = [groups[a.group][a.name] if type(a) is Slot else a for a in t.args]
            entry, packed, serial, offsets = packed_forward(t.kernel, t.dims, args, t.deterministic)
            buf = ctypes.create_string_buffer(packed, len(packed))
            self.buffers.append(buf)                 # the driver patches them: they must stay alive
            self.launches[k] = _Launch(entry, ctypes.addressof(buf), serial)
            patches += [_Patch(k, offsets[j], index[(a.group, a.name)]) for j, a in enumerate(t.args) if type(a) is Slot]
        self.patches = (_Patch * len(patches))(*patches)
        self.n_slots = 2 * len(states) + len(self.scratch)
        self.states = (_StateSlots * len(states))(*[_StateSlots(k, len(states) + k, None) for k in range(len(states))])
        zeros = [_Zero(len(states) + k, nxt[name]._data.nbytes) for k, name in enumerate(states)] if zero_next else []
        zeros += [_Zero(2 * len(states) + k, scratch[name]._data.nbytes)
                  for k, (name, shape, dtype, zero) in enumerate(self.scratch) if zero is not False and (zero or zero_next)]
        self.zeros = (_Zero * len(zeros))(*zeros)


def _ptr(arr) -> int:
    """`arr`'s data pointer: the one its launch slot cached (an array's memory never moves), else
    asked once and kept (array.ptr goes through NumPy's ctypes view, ~3 us a call)."""
    d = arr.__dict__
    abi = d.get("_launch_abi")
    if abi is not None:
        return abi[0]
    ptr = d.get("_native_ptr")
    if ptr is None:
        ptr = d["_native_ptr"] = arr.ptr
    return ptr


class NativeLoops:
    """Runs recomputations of a traced step for a Sweep (see the module docstring). `advance`
    returns None where it cannot help (no trace, or the driver could not be built), and the caller
    keeps to the Python path. Revolve's recomputations come one or two steps at a time (9,899
    calls for 14,748 steps at 10,000 steps and 100 snapshots), so a call's own cost counts."""

    def __init__(self, pool, states: dict):
        self.pool = pool
        self._names = list(states)
        self._kinds = [pool.kind(spec.shape, spec.dtype) for spec in states.values()]
        self._plan: tuple | None = None            # (trace, _Plan, its call arguments)
        self._broken = pool.device != "cpu"        # the driver calls CPU entry points only
        self.steps = 0                              # steps run natively (for stats and tests)
        self.calls = 0

    def _prepare(self, trace, prev: State, a: list, scratch: dict):
        plan = _Plan(trace, self._names, prev, State(dict(zip(self._names, a))), scratch, self.pool.zero)
        slots = (ctypes.c_void_p * max(plan.n_slots, 1))()
        args = (ctypes.addressof(plan.launches), len(plan.launches), ctypes.addressof(plan.patches),
                len(plan.patches), ctypes.addressof(slots), ctypes.addressof(plan.states), len(self._names),
                ctypes.addressof(plan.zeros), len(plan.zeros))
        self._plan = (trace, plan, slots, args)
        return self._plan

    def _functions(self, trace):
        """The driver's entry points, or None where the Python path must run `trace`'s steps."""
        if self._broken or not trace or trace.reads_series:
            return None
        try:
            return _driver_functions()
        except Exception as exc:                    # no compiler, a failed build: Python still works
            log.warning("native step loops are off (%s); recomputations run step by step", exc)
            self._broken = True
            return None

    def _ready(self, trace, prev: State, a: list):
        """`trace`'s plan and call arguments (planned now on `prev` -> `a` if it is new) and the
        scratch buffers a call lends its launches (taken from the pool: the caller releases them)."""
        pool = self.pool
        ready = self._plan if self._plan is not None and self._plan[0] is trace else None
        specs = ready[1].scratch if ready is not None else trace.scratch
        scratch = {spec[0]: pool.acquire(spec[1], spec[2], False) for spec in specs}
        if ready is None:
            try:
                ready = self._prepare(trace, prev, a, scratch)
            except BaseException:
                pool.release_all(scratch.values())
                raise
            for name in [name for name in scratch if name not in {s[0] for s in ready[1].scratch}]:
                pool.release(scratch.pop(name))
        return ready, scratch

    def advance(self, trace, prev: State, steps: int) -> State | None:
        """Run `steps` (>= 1) recomputations of `trace` from `prev`, taking over the caller's hold
        on it; return the new state (one hold, the caller's), or None to say: use the Python path
        (`prev` is then still the caller's)."""
        functions = self._functions(trace)
        if functions is None:
            return None
        pool = self.pool
        take, holds = pool.take, pool.holds
        starts = [prev[name] for name in self._names]
        a = [take(kind, False) for kind in self._kinds]
        # the second version: the starting one where only the caller holds it (see the docstring)
        b = [s if holds(s) == 1 else take(kind, False) for s, kind in zip(starts, self._kinds)]
        scratch = {}
        try:
            (_, plan, slots, args), scratch = self._ready(trace, prev, a)
            slots[:] = [*map(_ptr, starts), *map(_ptr, a), *map(_ptr, scratch.values())] or [None]
            for k, arr in enumerate(b):
                plan.states[k].spare = _ptr(arr)
            settle()                                 # launches a Tape holds run first
            functions[0](steps, *args)
        except BaseException:
            pool.release_all((*a, *scratch.values()))
            pool.release_all([x for x, s in zip(b, starts) if x is not s])
            raise
        result, release = {}, list(scratch.values())
        for k, name in enumerate(self._names):
            mine, other = (a[k], b[k]) if slots[k] == _ptr(a[k]) else (b[k], a[k])
            result[name] = mine
            release.append(other)
            mine._storage.version += 1               # written, as launches mark what they write
            other._storage.version += 1
            if b[k] is not starts[k]:
                release.append(starts[k])            # the caller's hold, taken over
        for arr in scratch.values():
            arr._storage.version += 1
        pool.release_all(release)
        self.steps += steps
        self.calls += 1
        return State(result)

    def advance_keeping(self, trace, prev: State, steps: int, keep) -> list[State] | None:
        """Run `steps` (>= 1) steps of `trace` from `prev`, each into versions of its own (a
        recording kept for the reverse sweep: StoreAll's); return the state after each step, each
        held once (the caller's), or None to say: use the Python path. The states but the last hold
        only the names in `keep` (what their reversal reads): the others take turns in two versions
        (what the run writes, nothing keeps). `prev` and its holds are left as they are. Same
        launches, fills and order as `steps` calls of `advance`: the same bits."""
        functions = self._functions(trace)
        if functions is None:
            return None
        pool = self.pool
        take = pool.take
        last = [take(kind, False) for kind in self._kinds]
        turns = [[take(kind, False) for _ in range(2)] if name not in keep and steps > 1 else []
                 for name, kind in zip(self._names, self._kinds)]
        versions = [[turns[s][k % 2] if turns[s] else take(kind, False) for s, kind in enumerate(self._kinds)]
                    for k in range(1, steps)] + [last]
        taken = [*last, *(a for turn in turns for a in turn),
                 *(a for version in versions[:-1] for a, turn in zip(version, turns) if not turn)]
        scratch = {}
        try:
            (_, plan, slots, args), scratch = self._ready(trace, prev, last)
            states = len(self._names)
            slots[2 * states:] = list(map(_ptr, scratch.values()))    # the driver sets the states' slots
            pointers = (ctypes.c_void_p * (states * (steps + 1)))(
                *map(_ptr, (prev[name] for name in self._names)), *map(_ptr, (a for v in versions for a in v)))
            settle()                                 # launches a Tape holds run first
            functions[1](steps, *args, ctypes.addressof(pointers))
        except BaseException:
            pool.release_all((*taken, *scratch.values()))
            raise
        for arr in (*taken, *scratch.values()):
            arr._storage.version += 1                # written, as launches mark what they write
        pool.release_all((*scratch.values(), *(a for turn in turns for a in turn)))
        self.steps += steps
        self.calls += 1
        kept = [State({name: a for name, a, turn in zip(self._names, version, turns) if not turn})
                for version in versions[:-1]]
        return [*kept, State(dict(zip(self._names, last)))]
