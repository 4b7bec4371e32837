"""Native step loops: a run of recomputed steps handed to compiled code in one call.

A recomputation between checkpoints (``Forward(n0, n1)`` recording nothing, over steps that ran
before) replays the step's trace (stepper/step/trace.py) once per step from Python: each replay takes new
versions from the pool, packs every launch's arguments and calls each kernel through ctypes, about
30-40 us a step on top of the kernels. Here the whole run is one foreign call instead: the trace's
launches are packed once (`compiler.runtime.launch.packed_forward`), and a small C++ driver
(driver.h and loop.cpp, beside this module) calls their CPU forward entry points back to back, step
after step, writing the current buffers' pointers into the packed arguments before each step.

The buffer ring: the state the run starts from is read by the first step only; each state then
alternates between two versions, A and B, so step k reads what step k-1 wrote and never a buffer it
writes. B is the starting version itself where nothing else holds it (the live state's own version,
free once the first step has read it), so a run holds no more versions than the Python path. Scratch buffers are reused by every
step (nothing records them). What the Python path zero-fills on each take (s.next when the model's
`zero_buffers`, scratch asked with zero) the driver zero-fills before each step, so every launch
sees the same inputs as a replay from Python and the state comes out with the same bits: same entry
points, same packed arguments, same serial flags, same order.

A whole-state copy, ``sp.copy(s.next.up, s.prev.u)`` or a kernel's ``up_next[i, j] = u[i, j]``
(compiler/passes/identity_stores.py), is a buffer rename in a run of two steps or more: each
step skips the copy (the copy launch, or the kernel's copying stores: it runs a variant without them)
and the next step reads u's buffer itself as its prev.up (`renamed_copies`; u then turns over
three buffers, or two where the step may write s.next.u over the s.prev.up it reads:
`in_place_renames`); the state a run returns has as its up the u the run wrote before its last
step, so it owns its buffers (a run of one step copies: its u is the caller's). Recordings
kept for the reverse sweep rename on every step where the copy's source is kept (`advance_keeping`:
the record of step k + 1 holds step k's source array itself, one array kept where the copy kept
two), and so do a native stretch's one-step advances (native_sweep.py).

What moves with the step index moves in the driver: a launch argument that is a row of a
time-indexed input (``s.series.x``, `Model.series`) is a slot the driver points at row n before
step n's launches. A step run for the first time with a running loss runs the loss's launches
too, right after the step's, as the Python path does, and the driver reads the one-element loss
out after each step (`advance`'s ``losses``); a recomputation runs the step's launches only.

A run of recordings kept for the reverse sweep (StoreAll's forward sweep) is one call too
(`advance_keeping`): each step writes versions of its own of the states its reversal reads, which
it keeps; the rest take turns in two versions, or are renamed copies of kept ones.
"""
from __future__ import annotations

import ctypes
import logging
from pathlib import Path

from compiler.backends.cpu_build import build_cpu_library, load_cpu_library
from compiler.runtime.launch import packed_forward
from compiler.runtime.tape import settle

from ...step.state import State
from ...step.trace import SeriesRows, Slot

__all__ = ["NativeLoops"]

log = logging.getLogger(__name__)

# The driver's C++ (driver.h, loop.cpp, sweep.cpp) lives beside this module and ships with the package.
SOURCES = Path(__file__).resolve().parent


def native_library(source: str, name: str) -> ctypes.CDLL:
    """The library built from `source` (loop.cpp or sweep.cpp, which include driver.h) by the
    kernels' build code: content-hash cached (driver.h is part of the key), checked, timed out."""
    return load_cpu_library(build_cpu_library((SOURCES / source).read_text(), name, include_dirs=[SOURCES]))


class _Launch(ctypes.Structure):
    _fields_ = [("entry", ctypes.c_void_p), ("buf", ctypes.c_void_p), ("serial", ctypes.c_int64)]


class _Patch(ctypes.Structure):
    _fields_ = [("launch", ctypes.c_int64), ("offset", ctypes.c_int64), ("slot", ctypes.c_int64)]


class _StateSlots(ctypes.Structure):
    _fields_ = [("prev", ctypes.c_int64), ("next", ctypes.c_int64), ("spare", ctypes.c_void_p)]


class _Zero(ctypes.Structure):
    _fields_ = [("slot", ctypes.c_int64), ("nbytes", ctypes.c_int64)]


class _Series(ctypes.Structure):
    _fields_ = [("slot", ctypes.c_int64), ("base", ctypes.c_void_p), ("stride", ctypes.c_int64)]


class _Time(ctypes.Structure):
    _fields_ = [("series", ctypes.c_void_p), ("n_series", ctypes.c_int64), ("n", ctypes.c_int64),
                ("loss_slot", ctypes.c_int64), ("loss_size", ctypes.c_int64), ("losses", ctypes.c_void_p)]


class _Rename(ctypes.Structure):
    _fields_ = [("to", ctypes.c_int64), ("from_", ctypes.c_int64), ("in_place", ctypes.c_int64)]


class _Renames(ctypes.Structure):
    _fields_ = [("pairs", ctypes.c_void_p), ("n_pairs", ctypes.c_int64), ("copies", ctypes.c_void_p),
                ("instead", ctypes.c_void_p), ("n_copies", ctypes.c_int64), ("n_zeros", ctypes.c_int64),
                ("saved", ctypes.c_void_p)]


_driver = None


def _driver_functions():
    """The driver's entry points (sp_advance, sp_advance_each), built (or loaded from the kernel
    cache) on first use."""
    global _driver
    if _driver is None:
        library = native_library("loop.cpp", "stepper_native_loop")
        tables = [ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                  ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64]
        # (the tables go in as addresses: plain ints convert fastest; then renames or None, the time)
        for fn, extra in ((library.sp_advance, [ctypes.c_void_p] * 2), (library.sp_advance_each, [ctypes.c_void_p] * 3)):
            fn.argtypes = tables + extra
            fn.restype = None
        _driver = (library.sp_advance, library.sp_advance_each)
    return _driver


class _Plan:
    """One trace's launches packed for the driver, with the tables that do not change between
    runs: the step's launches, then its running loss's (run only where a run reads the losses
    out). Slot numbering: the states' prev versions, then their next versions, then the scratch
    buffers the launches use, then the rows of the series they read (moved by the driver)."""

    def __init__(self, trace, states: list[str], prev: State, nxt: State, scratch: dict, zero_next: bool,
                 rows: SeriesRows, n: int):
        launches = trace.launches
        self.step_launches = trace.step_launches
        used = {a.name for t in launches for a in t.args if type(a) is Slot and a.group == "scratch"}
        self.scratch = [spec for spec in trace.scratch if spec[0] in used]
        index = {("prev", name): k for k, name in enumerate(states)}
        index.update({("next", name): len(states) + k for k, name in enumerate(states)})
        index.update({("scratch", spec[0]): 2 * len(states) + k for k, spec in enumerate(self.scratch)})
        first_row = 2 * len(states) + len(self.scratch)
        index.update({("series", name): first_row + k for k, name in enumerate(rows.names)})
        groups = {"prev": prev, "next": nxt, "scratch": scratch, "series": rows.views(n)}
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
        self.n_slots = first_row + len(rows.names)
        self.states = (_StateSlots * len(states))(*[_StateSlots(k, len(states) + k, None) for k in range(len(states))])
        self.series = (_Series * max(len(rows.names), 1))(
            *[_Series(first_row + k, base, stride) for k, (base, stride) in enumerate(rows.bases)])
        loss = trace.loss
        self.reads_losses = loss is not None and loss.group == "scratch"
        self.time = _Time(ctypes.addressof(self.series), len(rows.names), 0,
                          index[("scratch", loss.name)] if self.reads_losses else -1,
                          scratch[loss.name]._data.nbytes if self.reads_losses else 0, None)
        copies = renamed_copies(launches, nxt)
        pairs = [pair for _, launch_pairs, _ in copies for pair in launch_pairs]
        renamed = {to for to, _ in pairs}
        # no fill where the first launch writes the whole buffer (StepTrace.covered)
        covered = trace.covered({**{("next", name): nxt[name].shape for name in states},
                                 **{("scratch", spec[0]): spec[1] for spec in self.scratch}})
        zeros = [_Zero(len(states) + k, nxt[name]._data.nbytes) for k, name in enumerate(states)
                 if name not in renamed and ("next", name) not in covered] if zero_next else []
        zeros += [_Zero(2 * len(states) + k, scratch[name]._data.nbytes)
                  for k, (name, shape, dtype, zero) in enumerate(self.scratch)
                  if zero is not False and (zero or zero_next) and ("scratch", name) not in covered]
        always = len(zeros)                          # then the fills of the renamed states' s.next: where the copy runs
        zeros += [_Zero(len(states) + states.index(name), nxt[name]._data.nbytes) for name in renamed
                  if zero_next and ("next", name) not in covered]
        self.zeros = (_Zero * len(zeros))(*zeros)
        self.renames = None
        self.rename_pairs = pairs                    # (to, from) state names
        self.in_place = in_place_renames(launches, pairs, covered)     # those of them written in place
        if copies:
            renames = [_Rename(states.index(to), states.index(src), (to, src) in self.in_place) for to, src in pairs]
            self._renaming = ((_Rename * len(pairs))(*renames),       # kept alive with the plan
                              (ctypes.c_int64 * len(copies))(*[k for k, _, _ in copies]),
                              (ctypes.c_void_p * len(copies))(*[instead for _, _, instead in copies]),
                              (ctypes.c_void_p * (3 * len(pairs)))())
            table, indices, instead, saved = self._renaming
            self.renames = _Renames(ctypes.addressof(table), len(pairs), ctypes.addressof(indices),
                                    ctypes.addressof(instead), len(copies), always, ctypes.addressof(saved))


def renamed_copies(launches, nxt: State) -> list[tuple[int, list, int | None]]:
    """The launches that copy whole states, ``s.next.to = s.prev.src``, which a run of steps does
    by renaming buffers (see sp_run in driver.h): ``(launch index, [(to, src), ...], what runs instead)``.
    A copy launch (``sp.copy(s.next.to, s.prev.src)``) runs nothing instead; a kernel whose
    identity stores (compiler/passes/identity_stores.py) copy runs without them. Each copy must
    cover the whole state, nothing else of the step may touch s.next.to, `src` must be another
    state of the same shape and dtype, not itself renamed and the source of this copy only, and
    `to` no copy's source."""
    from compiler.runtime.copy_kernels import is_copy_kernel, renamed_forward

    def whole_state(t, src, dest) -> bool:
        return type(src) is Slot and src.group == "prev" and type(dest) is Slot and dest.group == "next" \
            and src.name != dest.name and t.dims == nxt[dest.name].shape \
            and nxt[src.name].shape == nxt[dest.name].shape and nxt[src.name].dtype == nxt[dest.name].dtype

    found = []
    for k, t in enumerate(launches):
        if is_copy_kernel(t.kernel):
            slots, instead = ([t.args] if len(t.args) == 2 else []), None
        elif t.kernel.compiled().identity is not None:
            args = {p.name: a for p, a in zip(t.kernel.params, t.args)}
            slots = [(args[src], args[out]) for out, src in t.kernel.compiled().identity.copies.items()]
            instead = renamed_forward(t.kernel)
        else:
            continue
        if not slots or not all(whole_state(t, src, dest) for src, dest in slots):
            continue
        dests = [dest for _, dest in slots]
        if any(type(a) is Slot and a in dests for j, u in enumerate(launches) for a in u.args if j != k) \
                or any(sum(type(a) is Slot and a == dest for a in t.args) != 1 for dest in dests):
            continue
        found.append((k, [(dest.name, src.name) for src, dest in slots], instead))
    targets = [to for _, pairs, _ in found for to, _ in pairs]
    sources = [src for _, pairs, _ in found for _, src in pairs]
    return [(k, pairs, instead) for k, pairs, instead in found
            if all(src not in targets and to not in sources and sources.count(src) == 1 for to, src in pairs)]


def in_place_renames(launches, pairs: list, covered: frozenset) -> set[tuple[str, str]]:
    """The renamed copies (to, src) whose s.next.src a run of steps may write into the buffer of
    s.prev.to (see sp_run in driver.h): the first launch touching s.next.src writes it whole without
    reading it (`covered`), as the output of an in-place pair of its kernel (`Compiled.in_place`,
    compiler/passes/in_place.py) whose input is s.prev.to, each bound once in that launch, and no
    later launch (the running loss's included) reads s.prev.to, whose values are gone by then."""
    found = set()
    for to, src in pairs:
        inp, out = Slot("prev", to), Slot("next", src)
        if ("next", src) not in covered:
            continue
        first = next(k for k, t in enumerate(launches) if any(type(a) is Slot and a == out for a in t.args))
        t = launches[first]
        bound = {p.name: a for p, a in zip(t.kernel.params, t.args) if type(a) is Slot}
        if any(bound.get(i) == inp and bound.get(o) == out for i, o in t.kernel.compiled().in_place) \
                and sum(a in (inp, out) for a in bound.values()) == 2 \
                and not any(type(a) is Slot and a == inp for t in launches[first + 1:] for a in t.args):
            found.add((to, src))
    return found


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
    calls for 14,748 steps at 10,000 steps and 100 snapshots), so a call's own cost counts.
    `series`: the model's time-indexed inputs (`Model.series`), whose rows the driver moves."""

    def __init__(self, pool, states: dict, series: dict | None = None):
        self.pool = pool
        self._names = list(states)
        self._kinds = [pool.kind(spec.shape, spec.dtype) for spec in states.values()]
        self._series = series or {}
        self._plan: tuple | None = None            # (trace, _Plan, its call arguments)
        self._rows: tuple | None = None            # (trace, SeriesRows)
        self._broken = pool.device != "cpu"        # the driver calls CPU entry points only
        self.steps = 0                              # steps run natively (for stats and tests)
        self.calls = 0
        self.renamed_copies = 0                     # copies not run: their buffers renamed (sp_advance)

    def rows(self, trace) -> SeriesRows:
        if self._rows is None or self._rows[0] is not trace:
            self._rows = (trace, SeriesRows(self._series, trace))
        return self._rows[1]

    def _prepare(self, trace, prev: State, a: list, scratch: dict, n: int):
        plan = _Plan(trace, self._names, prev, State(dict(zip(self._names, a))), scratch, self.pool.zero,
                     self.rows(trace), n)
        slots = (ctypes.c_void_p * max(plan.n_slots, 1))()
        args = (ctypes.addressof(plan.launches), plan.step_launches, ctypes.addressof(plan.patches),
                len(plan.patches), ctypes.addressof(slots), ctypes.addressof(plan.states), len(self._names),
                ctypes.addressof(plan.zeros), len(plan.zeros))
        self._plan = (trace, plan, slots, args)
        return self._plan

    def _functions(self, trace, n1: int, losses):
        """The driver's entry points, or None where the Python path must run `trace`'s steps up to
        n1 (with their running losses where `losses` is not None)."""
        if self._broken or not trace or not self.rows(trace).fits(n1):
            return None
        if losses is not None and (trace.loss is None or trace.loss.group != "scratch"):
            return None
        try:
            return _driver_functions()
        except Exception as exc:                    # no compiler, a failed build: Python still works
            log.warning("native step loops are off (%s); recomputations run step by step", exc)
            self._broken = True
            return None

    def _ready(self, trace, prev: State, a: list, n: int):
        """`trace`'s plan and call arguments (planned now on `prev` -> `a` if it is new) and the
        scratch buffers a call lends its launches (taken from the pool: the caller releases them)."""
        pool = self.pool
        ready = self._plan if self._plan is not None and self._plan[0] is trace else None
        specs = ready[1].scratch if ready is not None else trace.scratch
        scratch = {spec[0]: pool.acquire(spec[1], spec[2], False) for spec in specs}
        if ready is None:
            try:
                ready = self._prepare(trace, prev, a, scratch, n)
            except BaseException:
                pool.release_all(scratch.values())
                raise
            for name in [name for name in scratch if name not in {s[0] for s in ready[1].scratch}]:
                pool.release(scratch.pop(name))
        return ready, scratch

    @staticmethod
    def _timed(plan, args: tuple, n: int, losses) -> tuple:
        """The call arguments for steps from n, the running losses read out into `losses` (a
        float64 NumPy array, one per step) where it is given: the loss's launches run too."""
        time = plan.time
        time.n = n
        time.losses = losses.ctypes.data if losses is not None else None
        if losses is not None:
            args = (args[0], len(plan.launches), *args[2:])
        return args

    def advance(self, trace, prev: State, steps: int, n: int = 0, losses=None) -> State | None:
        """Run `steps` (>= 1) steps of `trace` from `prev` (step `n` first), taking over the
        caller's hold on it; return the new state (one hold, the caller's), or None to say: use
        the Python path (`prev` is then still the caller's). Recomputations compute no running
        loss; with `losses` (a float64 array of `steps` elements) each step's is written there."""
        functions = self._functions(trace, n + steps, losses)
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
            (_, plan, slots, args), scratch = self._ready(trace, prev, a, n)
            slots[:len(starts) * 2 + len(scratch)] = [*map(_ptr, starts), *map(_ptr, a), *map(_ptr, scratch.values())]
            for k, arr in enumerate(b):
                plan.states[k].spare = _ptr(arr)
            args = self._timed(plan, args, n, losses)
            settle()                                 # launches a Tape holds run first
            functions[0](steps, *args, ctypes.addressof(plan.renames) if plan.renames is not None else None,
                         ctypes.addressof(plan.time))
        except BaseException:
            pool.release_all((*a, *scratch.values()))
            pool.release_all([x for x, s in zip(b, starts) if x is not s])
            raise
        # The result is in the prev slots, each a buffer of a, b or the start (renamed copies move
        # buffers between states of one kind); every one of them not in it goes back (the caller's
        # hold on the start included, taken over).
        held = {_ptr(arr): arr for arr in (*starts, *a, *b)}
        result = {name: held[slots[k]] for k, name in enumerate(self._names)}
        kept = {id(arr) for arr in result.values()}
        for arr in (*a, *b, *scratch.values()):
            arr._storage.version += 1                # written, as launches mark what they write
        pool.release_all([*scratch.values(), *(arr for arr in held.values() if id(arr) not in kept)])
        self.steps += steps
        self.calls += 1
        if plan.renames is not None:
            self.renamed_copies += steps * plan.renames.n_pairs if steps > 1 else 0
        return State(result)

    def advance_keeping(self, trace, prev: State, steps: int, keep, n: int = 0, losses=None) -> list[State] | None:
        """Run `steps` (>= 1) steps of `trace` from `prev` (step `n` first), each into versions of
        its own (a recording kept for the reverse sweep: StoreAll's); return the state after each
        step, each held once (the caller's), or None to say: use the Python path. The states but
        the last hold only the names in `keep` (what their reversal reads): the others take turns
        in two versions (what the run writes, nothing keeps). `prev` and its holds are left as they
        are. `losses` as in `advance`. Same launches, fills and order as `steps` calls of
        `advance`: the same bits.

        Where every whole-state copy's source is kept (`renamed_copies`), no copy runs: each step's
        copy is the array its source kept the step before (one array kept where the copy kept two;
        a state holds an array once per state that has it)."""
        functions = self._functions(trace, n + steps, losses)
        if functions is None:
            return None
        pool = self.pool
        take, names, kinds = pool.take, self._names, self._kinds
        last = [take(kind, False) for kind in kinds]
        scratch = {}
        taken = list(last)
        try:
            (_, plan, slots, args), scratch = self._ready(trace, prev, last, n)
            pairs = {names.index(to): names.index(src) for to, src in plan.rename_pairs}
            if not all(names[src] in keep for src in pairs.values()):
                pairs = {}
            # (one version for a run of two steps, whose only intermediate state is the one in between)
            turns = [[take(kind, False) for _ in range(min(2, steps - 1))] if name not in keep and s not in pairs
                     else [] for s, (name, kind) in enumerate(zip(names, kinds))]
            taken += [a for turn in turns for a in turn]
            for to in pairs:                         # (a copy's array is its source's)
                pool.release(last[to])
                taken.remove(last[to])
            versions = [[prev[name] for name in names]]
            for k in range(1, steps + 1):
                version = []
                for s, kind in enumerate(kinds):
                    if s in pairs:
                        a = versions[-1][pairs[s]]
                    elif k == steps:
                        a = last[s]
                    elif turns[s]:
                        a = turns[s][k % len(turns[s])]
                    else:
                        a = take(kind, False)
                        taken.append(a)
                    version.append(a)
                versions.append(version)
            states = len(names)
            slots[2 * states:2 * states + len(scratch)] = list(map(_ptr, scratch.values()))    # the driver sets the rest
            pointers = (ctypes.c_void_p * (states * (steps + 1)))(*map(_ptr, (a for v in versions for a in v)))
            args = self._timed(plan, args, n, losses)
            settle()                                 # launches a Tape holds run first
            renames = ctypes.addressof(plan.renames) if pairs else None
            functions[1](steps, *args, ctypes.addressof(pointers), renames, ctypes.addressof(plan.time))
        except BaseException:
            pool.release_all((*taken, *scratch.values()))
            raise
        for arr in (*taken, *scratch.values()):
            arr._storage.version += 1                # written, as launches mark what they write
        kept = [State({name: a for name, a in zip(names, version) if name in keep}) for version in versions[1:-1]]
        result = [*kept, State(dict(zip(names, versions[-1])))]
        # each state holds its arrays once: an array taken here starts with one hold, one of prev's
        # with none of ours (the caller's passes to the record of prev); what no state has goes back
        holders: dict[int, list] = {}
        for state in result:
            for a in state.values():
                holders.setdefault(id(a), [a, 0])[1] += 1
        ours = {id(a) for a in taken}
        pool.retain_all([a for a, count in holders.values() for _ in range(count - (id(a) in ours))])
        pool.release_all((*scratch.values(), *(a for a in taken if id(a) not in holders)))
        self.steps += steps
        self.calls += 1
        self.renamed_copies += steps * len(pairs)
        return result
