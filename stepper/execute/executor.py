"""Runs a checkpointing schedule's actions on a model: the forward sweep, then the adjoint sweep.

`Sweep` is the driver that checkpoint/ schedules (and checkpoint_schedules' own) are written for:

- ``Forward(n0, n1, write_ics, write_adj_deps, storage)``: store the state at n0 in `storage` if
  `write_ics`; step n0 -> n1, keeping each step's tape and buffer versions if `write_adj_deps`
  (adjoint data "stored" in RAM or DISK is kept in memory too: a recorded step is live objects).
- ``Reverse(n1, n0)``: run the adjoints of steps n1-1 .. n0, carrying the state's adjoint.
- ``Copy``/``Move(n, from, to)``: load snapshot n as the live state (to WORK), move it between
  tiers, or delete it (to NONE).

The sweep runs in two halves, `forward` (up to EndForward, which leaves the final state live) and
`reverse` (from the final state's adjoint down to step 0), so that a rollout recorded on a Tape can
run the first half at once and the second in ``tape.backward()``.
"""
from __future__ import annotations

import time
from collections import deque

import numpy as np

from checkpoint import Copy, EndForward, EndReverse, Forward, Move, Reverse, StorageType
from compiler import array

from ..errors import ModelError, NonFiniteError
from ..step.state import State, write_values
from ..step.step_context import RecordedStep, StepRunner, StepTape, check_scalar_loss
from ..step.versions import BufferPool, set_grad
from .fast.graph_loop import GraphLoops
from .fast.native_loop import NativeLoops
from .fast.native_reverse import Kept, NativeReversal, kept_part
from .fast.native_sweep import NativeSweep
from .param_sums import ParamSums

__all__ = ["Sweep", "check_finite_state"]

_RAM, _DISK, _WORK, _NONE = StorageType.RAM, StorageType.DISK, StorageType.WORK, StorageType.NONE


def check_finite_state(state: State, step: int | None) -> None:
    """Raise NonFiniteError if any element of `state` (the result of `step`, or the initial state for
    None) is NaN or infinite."""
    for name, arr in state.items():
        values = arr.numpy()
        if values.dtype.kind == "f" and not np.isfinite(values).all():
            bad = np.argwhere(~np.isfinite(values))[0]
            index = tuple(int(i) for i in bad[:arr.ndim])
            if step is None:
                raise NonFiniteError(f"the initial state '{name}' holds {values[tuple(bad)]} at index {index}, before "
                                     "any step ran: fix the initial values", None, name, index)
            raise NonFiniteError(f"state '{name}' became {values[tuple(bad)]} at index {index} in step {step} "
                                 f"(the first step whose result is not finite; t = step * dt after it)",
                                 step, name, index)


class Sweep:
    """One execution of `schedule` (an iterable of our actions) for `model` from `initial`
    (``{name: ndarray}``). See the module docstring for what each action does."""

    # Recomputations of a traced step run as native loops (stepper/execute/fast/native_loop.py; on a GPU as
    # CUDA graphs, stepper/execute/fast/graph_loop.py); tests turn this off on an instance to compare with the
    # step-by-step path.
    native_loops = True

    def __init__(self, model, initial: dict, steps: int | None, schedule, tiers, *, deterministic: bool,
                 running_loss=None, until=None, check_finite: bool = False, progress=None, convert=None):
        self.model = model
        self.steps = steps
        self.schedule = schedule
        self.tiers = tiers
        self.deterministic = deterministic
        self.until = until
        self.check_finite = check_finite
        self.bar = progress
        self.online = hasattr(schedule, "finalize") and getattr(schedule, "max_n", 0) is None
        self._actions = iter(schedule)
        self._convert = convert
        self._ahead: deque = deque()
        self.pool = BufferPool(model.device, model.zero_buffers)
        tiers.attach(self.pool)
        self._runner = StepRunner(model, self.pool, deterministic=deterministic, running_loss=running_loss,
                                  traced=True)
        self.native = (NativeLoops if model.device == "cpu" else GraphLoops)(self.pool, model.states,
                                                                             series=model._series)
        self.reversal = NativeReversal(self.pool, model.states, deterministic, series=model._series)
        self.stretch = NativeSweep(self)
        self.work: State | None = self._load_initial(initial)
        if check_finite:
            check_finite_state(self.work, None)
        self.pos = 0
        self.recorded: dict[int, RecordedStep] = {}
        self.deps: dict = {_RAM: set(), _DISK: set()}     # steps whose adjoint data a tier "holds"
        self.carry: dict[str, array] | None = None        # adjoint of the state at self.adj
        self.param_sums: ParamSums | None = None           # float32 parameter gradients in float64
        self.adj = None
        self.seen = 0                                      # steps run at least once (first sweep)
        self.step_losses: list[float] = []
        self.terminal_loss = 0.0
        self.forward_steps = self.recorded_steps = self.reverse_steps = 0
        self.forward_seconds = self.adjoint_seconds = 0.0
        self.peak_bytes = 0
        self.ended_forward = False

    # -- the two halves ----------------------------------------------------------------------------
    def forward(self) -> State:
        """Run actions up to EndForward; return the final state (live, owned by the sweep)."""
        while not self.ended_forward:
            action = self._next(lookahead=False)
            if action is None:
                raise ModelError("the schedule ended before EndForward")
            self._run(action)
        return self.work

    def reverse(self, loss=None, seeds: dict | None = None) -> dict[str, array]:
        """From the final state's adjoint, made of `loss` (a function of the final State returning a
        one-element array) and/or `seeds` (``{name: ndarray}``), run actions up to EndReverse; return
        the adjoint of the initial state (``{name: array}``, owned by the caller)."""
        self.param_sums = ParamSums(self.model.params, self.model.device)
        self._seed(loss, seeds)
        action = None
        while True:
            if action is None:
                action = self._next(lookahead=True)
            if action is None:
                raise ModelError("the schedule ended before EndReverse")
            if isinstance(action, EndReverse):
                break
            kept = type(action) is Reverse and type(self.recorded.get(action.n1 - 1)) is Kept
            if kept and action.n1 - action.n0 > 1 and not self.stretch.ready():
                # its first step here plans the native reversal; a stretch can take the rest
                self._ahead.appendleft(Reverse(action.n1 - 1, action.n0, action.clear_adj_deps))
                action = Reverse(action.n1, action.n1 - 1, action.clear_adj_deps)
            elif (type(action) is not Reverse or kept) and self.stretch.ready():
                # as much of the sweep as runs natively, in one call (stepper/execute/fast/native_sweep.py)
                action, took = self.stretch.run(action)
                if took:
                    continue
            self._run(action)
            action = None
        if self.adj != 0:
            raise ModelError(f"the schedule ended its reverse sweep at step {self.adj}, not 0")
        self.param_sums.finish()
        adjoint = {name: self.pool.give_away(a) for name, a in self.carry.items()}
        self.carry = None
        return adjoint

    def rewind(self, final: dict, actions) -> None:
        """Make `final` (``{name: ndarray}``) the live state at the end of the run, the adjoint start
        there, and `actions` the schedule's actions from here on: a KeptTrajectory's next reverse
        sweep (records kept by ``Reverse(..., clear_adj_deps=False)`` are reversed again). What a
        reverse sweep that raised held is given back first."""
        if self.carry:
            self.pool.release_all(self.carry.values())
            self.carry = None
        self._ahead.clear()
        self._actions = iter(actions)
        self._set_work(self._load_initial(final))
        self.pos = self.adj = self.steps

    def close(self) -> None:
        """Release everything still held (snapshots, recorded steps, the live state) and close the
        progress bar: the end of every run, whether it finished or raised."""
        self.tiers.close()          # first: held RAM snapshots go back to the pool
        for rec in self.recorded.values():
            self._drop(rec)
        self.recorded.clear()
        self._set_work(None)
        if self.carry:
            self.pool.release_all(self.carry.values())
            self.carry = None
        # The runners refer back to the sweep and to each other: without these edges the whole run
        # (and every buffer its runners keep) is freed when the caller drops it, not when Python's
        # cycle collector next runs (a store-all gradient's ~490 MiB at 256^2 stayed until then).
        self._runner = self.native = self.reversal = self.stretch = None
        self.pool.clear()              # (after: what the runners kept is the next run's now)
        self.bar.close()

    @property
    def loss(self) -> float:
        """The terminal loss plus the running losses of steps 0 .. max_n-1, summed in step order."""
        total = self.terminal_loss
        for value in self.step_losses:
            total += value
        return total

    # -- actions -------------------------------------------------------------------------------------
    def _next(self, lookahead: bool):
        action = self._ahead.popleft() if self._ahead else self._pulled()
        if lookahead and action is not None and not isinstance(action, EndReverse):
            nxt = self._peek()
            if isinstance(nxt, (Copy, Move)) and nxt.to_storage is _WORK and nxt.n not in self.deps.get(
                    nxt.from_storage, ()):
                self.tiers.prefetch(nxt.from_storage, nxt.n)   # the read overlaps this action
        return action

    def _peek(self):
        """The action `_next` returns next (None at the end), left queued."""
        if not self._ahead:
            action = self._pulled()
            if action is None:
                return None
            self._ahead.append(action)
        return self._ahead[0]

    def _pulled(self):
        """The schedule's next action (converted), None at its end."""
        action = next(self._actions, None)
        return self._convert(action) if action is not None and self._convert else action

    def _run(self, action) -> None:
        kind = type(action)
        if kind is Forward:
            self._forward(self._with_next_records(action) if action.write_adj_deps else action)
        elif kind is Reverse:
            self._reverse(action)
        elif kind is Copy or kind is Move:
            self._transfer(action, kind is Move)
        elif kind is EndForward:
            if self.steps is not None and self.pos != self.steps:
                raise ModelError(f"the schedule ended its forward sweep at step {self.pos}, not {self.steps}")
            self.steps = self.pos
            self.adj = self.pos
            self.ended_forward = True
        else:
            raise ModelError(f"{action!r} is not a schedule action")
        self.peak_bytes = max(self.peak_bytes, self.pool.allocated_bytes + self.tiers.ram_bytes)

    def _forward(self, a: Forward) -> None:
        if self.work is None or a.n0 != self.pos:
            at = "no state is loaded" if self.work is None else f"the state is at step {self.pos}"
            raise ModelError(f"the schedule asks for {a!r} but {at}")
        if a.write_ics:
            self.tiers.write(a.storage, a.n0, self.work)
        record = a.write_adj_deps
        n1 = a.n1
        if not self.online and self.steps is not None and n1 > self.steps:
            raise ModelError(f"the schedule asks for {a!r} beyond the run's {self.steps} steps")
        # A recorded step reversed right after, and run before (its loss and the final state are
        # read the first time only), computes outputs nothing reads: its last launch can be skipped.
        ahead = self._ahead[0] if self._ahead else None
        dead_last = record and type(ahead) is Reverse and ahead.n1 == n1 and n1 - 1 < self.seen
        n = a.n0
        while n < n1:
            # Steps that ran before go native where traced; steps that did not, where the step is
            # also trusted (StepRunner.trusted: after its first steps, so asked again each time) and
            # nothing needs each of them (a check; a running loss the driver reads out is fine).
            runner = self._runner
            native_end = n1 if runner.trusted and not self.check_finite else min(n1, self.seen)
            last_dead = dead_last and n == n1 - 1
            reached = n
            if record and last_dead:
                reached = self._keep_natively(n, n + 1, outputs_dead=True)
            elif record and n < native_end:         # (a dead last step is left for the line above)
                reached = self._keep_natively(n, native_end - (dead_last and native_end == n1))
            elif native_end > n and self.native_loops and not self.online:
                reached = self._advance_native(n, native_end)
            if reached > n:
                n = reached
                continue
            self._step(n, record, last_dead)
            n += 1
            if self.online and self._stop(n):
                self.schedule.finalize(n)
                self.online = False
                self.steps = n           # `steps` was a maximum: the run is n steps long
                break
        if record and a.storage in (_RAM, _DISK):
            self.deps[a.storage].add(a.n0)

    def _losses(self, n: int, n1: int):
        """Where steps n .. n1-1 go native: the end of the run to make in one call (steps that ran
        before and steps that did not are separate calls) and, for steps that did not with a
        running loss, the array the driver writes their losses to."""
        if n < self.seen:
            return min(n1, self.seen), None
        return n1, np.empty(n1 - n) if self._runner.running_loss is not None else None

    def _record_losses(self, losses) -> None:
        if losses is not None:
            self.step_losses.extend(map(float, losses))

    def _advance_native(self, n: int, n1: int) -> int:
        """Run steps n .. n1-1 (run before, or trusted) in one native call where the step is traced;
        return the step reached (n where the Python path must do them)."""
        start = time.perf_counter()
        n1, losses = self._losses(n, n1)
        nxt = self.native.advance(self._runner.trace, self.work, n1 - n, n, losses)
        if nxt is None:
            return n
        self._record_losses(losses)
        self.work = nxt                  # `advance` took over the hold on the old state
        self.pos = n1
        self.seen = max(self.seen, n1)
        self.forward_steps += n1 - n
        self.forward_seconds += time.perf_counter() - start
        self.bar.update(n1 - n)
        return n1

    def _with_next_records(self, a: Forward) -> Forward:
        """StoreAll records step by step, an action each: `a` and the recordings queued right after
        it as one Forward (their tags are added here), so that `_forward` keeps them in one native
        call. Only actions the run has room for are taken: a mistake in one is still its error."""
        if self.online or a.write_ics or self.work is None or a.n0 != self.pos:
            return a                               # (a mistake in `a` is named as the schedule wrote it)
        n1, storage = a.n1, a.storage
        while True:
            nxt = self._peek()
            if not (type(nxt) is Forward and nxt.write_adj_deps and not nxt.write_ics and nxt.n0 == n1
                    and nxt.storage is storage and (self.steps is None or nxt.n1 <= self.steps)):
                break
            self._ahead.popleft()
            if storage in (_RAM, _DISK):
                self.deps[storage].add(nxt.n0)
            n1 = nxt.n1
        return a if n1 == a.n1 else Forward(a.n0, n1, False, True, storage)

    def _keep_natively(self, n: int, n1: int, outputs_dead: bool = False) -> int:
        """Record steps n .. n1-1 (run before, or trusted) natively, in one call: each keeps the
        state it starts from (the part its reversal reads, `StepTrace.reversal_reads`), from which
        its reversal (native_reverse.py) replays its launches, so no tape, scratch or s.next is
        kept. With `outputs_dead` (one step whose reversal comes next) it does not even run:
        nothing reads its results. Return the step reached (n where the tape path must record
        them)."""
        trace = self._runner.trace
        if not (self.native_loops and not self.online and self._runner.replays_recording()
                and self.reversal.applies(trace)):
            return n
        start = time.perf_counter()
        if outputs_dead:
            states = [None]                      # the record takes the live state's hold
            self._runner.launches_skipped += len(trace.unread)
        else:
            n1, losses = self._losses(n, n1)
            states = self.native.advance_keeping(trace, self.work, n1 - n, trace.reversal_reads, n, losses)
            if states is None:
                return n
            self._record_losses(losses)
        for k, prev in enumerate((kept_part(self.pool, self.work, trace.reversal_reads), *states[:-1]), n):
            self.recorded[k] = Kept(prev, trace, k)     # the live state's hold on prev passes to it
        self.work = states[-1]
        self.pos = n1
        self.seen = max(self.seen, n1)
        self.forward_steps += n1 - n
        self.recorded_steps += n1 - n
        self.forward_seconds += time.perf_counter() - start
        self.bar.update(n1 - n)
        return n1

    def _stop(self, n: int) -> bool:
        if self.steps is not None and n >= self.steps:
            return True
        return self.until is not None and bool(self.until(self.work))

    def _step(self, n: int, record: bool, outputs_dead: bool = False) -> None:
        start = time.perf_counter()
        prev = self.work
        pool = self.pool
        donors = self.carry.values() if record and self.carry else ()     # see GradSlots
        runner = self._runner
        if n < self.seen and not record:          # a recomputation of a step that ran (checked) before
            nxt, scratch, tape, loss = runner.rerun(n, prev)
        elif not record and runner.trusted and not self.check_finite and runner.running_loss is None:
            # A first run that a native loop would have taken, had it taken the run (a GPU's graph
            # loops take none without spare memory, as in a gradient's first sweep): the same
            # launches from the trace, without the step function (~100 us a step on an H100 host).
            nxt, scratch, tape, loss = runner.rerun(n, prev)
        elif n < self.seen and runner.replays_recording():
            nxt, scratch, tape, loss = runner.record_replay(n, prev, outputs_dead)
        else:
            nxt, scratch, tape, loss = runner.run(n, prev, record, donors, outputs_dead)
        if n >= self.seen:      # first time this step runs: its loss, finiteness, progress
            if loss is not None:
                self.step_losses.append(float(loss.numpy().reshape(-1)[0]))
            if self.check_finite:
                try:
                    check_finite_state(nxt, n)
                except NonFiniteError:
                    pool.release_all((*nxt.values(), *scratch.values()))
                    raise
            self.seen = n + 1
        if record:
            # The live state's hold on `prev` passes to the recorded step; `nxt`, live now and
            # recorded, gets a second hold.
            pool.retain_all(nxt.values())
            self.recorded[n] = RecordedStep(n, tape, prev, nxt, dict(scratch), loss)
            self.recorded_steps += 1
        else:
            pool.release_all(prev.values())
            if scratch:
                pool.release_all(scratch.values())
        self.work = nxt
        self.pos = n + 1
        self.forward_steps += 1
        self.forward_seconds += time.perf_counter() - start
        self.bar.update(1)

    @property
    def launches_skipped(self) -> int:
        return self._runner.launches_skipped

    def _set_work(self, state: State | None) -> None:
        """Make `state` the live state (the caller's hold passes to it), releasing the old one."""
        if self.work is not None:
            self.pool.release_all(self.work.values())
        self.work = state

    def _transfer(self, a, move: bool) -> None:
        n, src, dst = a.n, a.from_storage, a.to_storage
        if n in self.deps.get(src, ()):      # adjoint data: it stayed in memory, only the tag moves
            if move:
                self.deps[src].discard(n)
            if dst is _NONE:
                self._drop(self.recorded.pop(n))
            elif dst in (_RAM, _DISK):
                self.deps[dst].add(n)
            return
        if dst is _WORK:
            state = self.tiers.read_into(src, n, self.model.states)
            self._set_work(state)
            self.pos = n
        elif dst in (_RAM, _DISK):
            self.tiers.copy(n, src, dst, self.model.states)
        if move:
            self.tiers.delete(src, n)

    # -- the adjoint ---------------------------------------------------------------------------------
    def _seed(self, loss, seeds) -> None:
        start = time.perf_counter()
        work = self.work
        carry = {name: self.pool.acquire_like(a, zero=True) for name, a in work.items() if a.dtype.is_float}
        try:
            if seeds:
                for name, values in seeds.items():
                    if name in carry:
                        carry[name]._write_host(values)
            if loss is not None:
                self.terminal_loss = self._seed_loss(loss, work, carry)
        except BaseException:
            self.pool.release_all(carry.values())    # a sweep may be reversed again (KeptTrajectory)
            raise
        self.carry = carry
        self.adjoint_seconds += time.perf_counter() - start

    def _seed_loss(self, loss, work: State, carry: dict) -> float:
        """Run `loss` on the final state `work` on a tape and add its gradient into `carry`; return its value."""
        for name, a in work.items():
            if name in carry:
                a.grad = carry[name]
        protected = {id(a._storage): f"the final state '{name}'" for name, a in work.items()}
        tape = StepTape(protected, self.deterministic)
        try:
            with tape:
                value = check_scalar_loss(loss(work), "loss(state)")
            if value.grad is None:
                value.requires_grad = True
            tape.backward(loss=value)
            return float(value.numpy().reshape(-1)[0])
        finally:
            for a in work.values():
                a.grad = None

    def _reverse(self, a: Reverse) -> None:
        if a.n1 != self.adj:
            raise ModelError(f"the schedule asks for {a!r} but the adjoint is at step {self.adj}")
        if self.work is not None and self.pos > a.n0:
            self._set_work(None)     # nothing may run forward past the adjoint: the state is dead
        for k in range(a.n1 - 1, a.n0 - 1, -1):
            rec = self.recorded.get(k)
            if rec is None:
                raise ModelError(f"the schedule reverses step {k}, which it did not record")
            if type(rec) is Kept:
                self._reverse_kept(rec, keep=not a.clear_adj_deps)
            else:
                self._reverse_step(rec)
            if self.param_sums.due(k):       # as the native sweep does (op 3)
                self.param_sums.fold()
            if a.clear_adj_deps:
                del self.recorded[k]
                self._drop(rec)
            self.adj = k

    def _reverse_step(self, rec: RecordedStep) -> None:
        start = time.perf_counter()
        pool, carry, nxt = self.pool, self.carry, rec.next
        if rec.next_held and not any(map(rec.tape.has_read, nxt.values())):
            # Adjoints replay the forward from the step's inputs and never touch the primal values of
            # what the step only wrote, so s.next's memory can serve the previous state's gradient.
            pool.release_all(nxt.values())
            rec.next_held = False
        for name, a in nxt.items():
            if name in carry:
                set_grad(a, carry[name])
        # The carry holds exactly the float states (see _seed): those get gradients.
        prev_grads = [a for name, a in rec.prev.items() if name in carry]
        scratch_grads = [a for a in rec.scratch.values() if a.dtype.is_float and a._grad is None]
        # New gradient versions, not zero-filled: the tape fills what an adjoint would add to and
        # lets a gather form overwrite the rest (Tape.backward's `fresh`).
        fresh = [pool.acquire_like(a, zero=False) for a in (*prev_grads, *scratch_grads)]
        for a, grad in zip((*prev_grads, *scratch_grads), fresh):
            set_grad(a, grad)
        seeds = {}
        if rec.loss is not None:
            if rec.loss.grad is None:
                rec.loss.requires_grad = True
            seeds[rec.loss] = 1.0
        rec.tape.backward(grads=seeds, fresh=fresh)
        # The previous state's gradient is the new carry; the old carry (on s.next) and the scratch
        # gradients go back to the pool.
        self.carry = {name: a._grad for name, a in rec.prev.items() if name in carry}
        pool.release_all([a._grad for a in (*nxt.values(), *scratch_grads) if a._grad is not None])
        for a in (*nxt.values(), *prev_grads, *scratch_grads):
            set_grad(a, None)
        if rec.loss is not None and not pool.owns(rec.loss):
            rec.loss.grad._zero_memory()    # a user's array may serve every step
        self.reverse_steps += 1
        self.adjoint_seconds += time.perf_counter() - start
        self.bar.update(1)

    def _reverse_kept(self, rec: Kept, keep: bool) -> None:
        start = time.perf_counter()
        prev = rec.prev
        if keep:                                 # the record stays: `reverse` takes a hold of its own
            self.pool.retain_all(prev.values())
        else:
            rec.prev = None
        self.carry = self.reversal.reverse(rec.trace, prev, self.carry, rec.n)
        self.reverse_steps += 1
        self.adjoint_seconds += time.perf_counter() - start
        self.bar.update(1)

    def _drop(self, rec: RecordedStep) -> None:
        if type(rec) is Kept:
            if rec.prev is not None:
                self.pool.release_all(rec.prev.values())
            return
        self.pool.release_all(rec.prev.values())
        if rec.next_held:
            self.pool.release_all(rec.next.values())
        if rec.scratch:
            self.pool.release_all(rec.scratch.values())

    def _load_initial(self, initial: dict) -> State:
        arrays = {}
        for name, spec in self.model.states.items():
            arr = self.pool.acquire(spec.shape, spec.dtype, zero=False)
            write_values(arr, initial[name])
            arrays[name] = arr
        return State(arrays)
