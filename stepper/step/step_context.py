"""What a step function sees (`StepContext`: ``s.prev``, ``s.next``, ``s.params``, ``s.t``, ``s.dt``,
``s.scratch``), the tape each step runs under (`StepTape`), and `StepRunner`, which runs steps.

Every step runs under its own `StepTape`. Besides the Tape's own check (no overwriting, within the
step, a buffer an earlier launch read), it refuses any write into ``s.prev`` or a parameter;
the runner reports a declared state whose version the step never moved (never wrote). The tape
also makes the step differentiable: the executor keeps it until the step's adjoint has run.
"""
from __future__ import annotations

import inspect
import operator
import os
from dataclasses import dataclass

from compiler import OverwriteError, Tape, array
from compiler.runtime.tape import host_accesses, outside_tapes

from ..errors import ModelError
from .state import State
from .trace import StepTrace, loss_reversed_last, reverse_loss_last, trace_step
from .trace_notes import warn_untraceable
from .versions import BufferPool, set_grad

__all__ = ["StepContext", "StepTape", "RecordedStep", "StepRunner"]


class StepTape(Tape):
    """A Tape that also refuses writes into the step's inputs (``s.prev`` and parameters)."""

    def __init__(self, protected: dict[int, str], deterministic: bool, ctx: "StepContext | None" = None):
        super().__init__(deterministic=deterministic)
        self._protected = protected          # id(storage) -> "s.prev.x" / "s.params.k"
        self._ctx = ctx                      # names the step's other buffers in messages
        self.writes_checked = 0              # recorded ops and host writes (see stepper/step/trace.py)

    def check_writes(self, op) -> None:
        self.writes_checked += 1
        protected = self._protected
        for arr in op.writes.values():
            if id(arr._storage) in protected:
                self._refuse_protected(op)
        for arr in op.accumulates.values():
            if id(arr._storage) in protected:
                self._refuse_protected(op)
        try:
            super().check_writes(op)
        except OverwriteError as exc:
            names = [label for label in map(self._label, op.writes.values()) if label]
            hint = (f"\nThat buffer is {names[0]}; inside a step, ask for a fresh one instead, e.g. "
                    f"s.scratch('another_name', ...).") if names else ""
            raise OverwriteError(f"{exc}{hint}") from None

    def end_step(self) -> None:
        """Forget what only the recording needed: a kept step then holds its ops and nothing more
        (fewer live objects for the garbage collector to walk while a store-all sweep grows)."""
        self._ctx = None
        self._protected = {}

    def _refuse_protected(self, op) -> None:
        for arg, arr in (*op.writes.items(), *op.accumulates.items()):
            label = self._protected.get(id(arr._storage))
            if label is not None:
                where = f" ({op.where})" if op.where else ""
                if label.startswith("s.prev."):
                    fix = (f"A step reads s.prev and writes s.next: write to s.next.{label[7:]} instead "
                           f"(s.prev is the previous step's result, which its gradient still needs).")
                elif label.startswith("s.params."):
                    fix = "Parameters are inputs of every step; compute into s.scratch(...) instead."
                else:
                    fix = "The loss reads the final state; compute into a new array instead."
                raise OverwriteError(f"{op.name}{where} writes argument '{arg}', which is {label}. {fix}")

    def _label(self, arr) -> str | None:
        """``"s.next.x"`` or ``"s.scratch('force')"`` if `arr` is one of the step's new buffers."""
        if self._ctx is None:
            return None
        for name, a in self._ctx.next.items():
            if a._storage is arr._storage:
                return f"s.next.{name}"
        for name, a in self._ctx._scratch.items():
            if a._storage is arr._storage:
                return f"s.scratch('{name}')"
        return None


class StepContext:
    """The argument of a step function: ``s.prev`` (the state at step n, read only), ``s.next`` (fresh
    arrays for the state at n + 1, zero-filled), ``s.params``, ``s.n`` (the step index), ``s.t``
    (= t0 + n dt), ``s.dt``, ``s.series`` (row n of each `Model.series` input) and
    ``s.scratch(name, shape, dtype)`` for temporary buffers."""

    def __init__(self, n: int, t: float, dt: float, prev: State, next: State, params: State,
                 pool: BufferPool, grads: "GradSlots | None" = None):
        self._n, self._t, self.dt = n, t, dt
        self.read_time = False              # whether the step function asked for s.n or s.t
        self.prev, self.next, self.params = prev, next, params
        self._pool = pool
        self._grads = grads
        self._scratch: dict[str, array] = {}
        self._scratch_zero: dict[str, bool | None] = {}      # the zero= each was asked with
        self.series = State({})                               # set by the runner (Model.series)

    @property
    def n(self) -> int:
        self.read_time = True
        return self._n

    @property
    def t(self) -> float:
        self.read_time = True
        return self._t

    def scratch(self, name: str, shape, dtype=float, zero: bool | None = None) -> array:
        """A buffer for this step only: a fresh version every step, so a later step never overwrites
        what this step's gradient needs. Zero-filled unless ``zero=False`` (default: the model's
        ``zero_buffers``). Asking twice for `name` in one step gives the same buffer."""
        from compiler.types import as_dtype
        dt = as_dtype(dtype)
        dims = (int(shape),) if isinstance(shape, int) else tuple(int(d) for d in shape)
        arr = self._scratch.get(name)
        if arr is not None:
            if arr.shape != dims or arr.dtype != dt:
                raise ModelError(f"s.scratch('{name}') was asked for with shape {arr.shape} of {arr.dtype} "
                                 f"earlier in this step and now with shape {dims} of {dt}; use another name")
            return arr
        arr = self._scratch[name] = self._pool.acquire(dims, dt, zero)
        self._scratch_zero[name] = zero
        if self._grads is not None:
            self._grads.attach(arr)
        return arr


@dataclass(eq=False, slots=True)
class RecordedStep:
    """A step kept for its adjoint: its tape and the versions it read and wrote (held in the pool)."""
    n: int
    tape: Tape                         # a StepTape, or a plain Tape replayed from the step trace
    prev: State
    next: State
    scratch: dict[str, array]
    loss: array | None = None
    next_held: bool = True            # False once the executor let s.next's memory go (see executor)


class GradSlots:
    """Stand-in gradients for a step while it records.

    What decides at record time whether an operation is differentiable (copies, clones, the
    compiler's check for kernels without an adjoint) asks ``requires_grad``, so the arrays a
    recorded step touches must carry gradients while it runs. Nothing writes a gradient before the
    adjoint, so one zero array per (shape, dtype) stands in for all of them; the executor attaches
    real gradients only while the step's adjoint runs. Arrays are pool versions, keyed by their Kind."""

    def __init__(self, pool: BufferPool, donors=()):
        self.pool = pool
        self.attached: list[array] = []
        self._shared: dict = {}
        # Arrays that live through the step anyway and that nothing writes during it (the adjoint
        # being carried) can stand in too, saving the allocation.
        self._donated = {pool.kind_like(d): d for d in donors}

    def attach(self, arr: array) -> None:
        if arr._grad is None and arr.dtype.is_float:
            kind = self.pool.kind_like(arr)
            grad = self._shared.get(kind)
            if grad is None:
                grad = self._donated.get(kind)
            if grad is None:
                grad = self._shared[kind] = self.pool.take(kind, zero=False)
            set_grad(arr, grad)
            self.attached.append(arr)

    def detach(self) -> None:
        for arr in self.attached:
            set_grad(arr, None)
        self.pool.release_all(self._shared.values())
        self.attached, self._shared = [], {}


def _where(fn) -> str:
    try:
        return f"{os.path.basename(inspect.getsourcefile(fn))}:{inspect.getsourcelines(fn)[1]}"
    except (OSError, TypeError):
        return getattr(fn, "__qualname__", "step")


def check_scalar_loss(value, what: str) -> array:
    if not isinstance(value, array):
        raise ModelError(f"{what} must return a one-element stepper array (the loss), got "
                         f"{type(value).__name__}")
    if value.size != 1 or value.dtype.inner_shape or not value.dtype.is_float:
        raise ModelError(f"{what} must return a one-element float array (a scalar loss), got an array of "
                         f"{value.dtype} with shape {value.shape}; reduce it to one value first")
    return value


# A version check per state per step: attrgetter reads the two attributes without a Python frame.
_version = operator.attrgetter("_storage.version")


_NO_SERIES = State({})


class StepRunner:
    """Runs steps of `model` with versions from `pool`. What every step needs from the model (the
    Kinds of its states' versions, the labels that name its parameters in messages) is worked out
    once, here, rather than on every step."""

    def __init__(self, model, pool: BufferPool, *, deterministic: bool, running_loss=None, traced: bool = False):
        self.model, self.pool = model, pool
        self.deterministic = deterministic
        self.running_loss = running_loss
        self._kinds = [(name, pool.kind(spec.shape, spec.dtype)) for name, spec in model.states.items()]
        self._params = model.params
        self._param_labels = {id(a._storage): "s.params." + name for name, a in self._params.items()}
        self.launches_skipped = 0
        # With `traced`, `run` reads each step's trace off its tape: `trace` is the one every step
        # has made so far (None before the first), False once a step could not be traced or two
        # differed (stepper/step/trace.py).
        self.traced = traced
        self.trace: StepTrace | None | bool = None
        # Steps run so far whose function and running loss read neither s.n, s.t nor array data
        # on the host (None once one did): see `trusted`.
        self._blind_runs: int | None = 0

    @property
    def trusted(self) -> bool:
        """Whether steps not run yet may run from the trace, without their function: every step so
        far (two at least) made the same launches, and neither the step function nor the running
        loss read s.n, s.t or array data on the host, so nothing they could branch on changes from
        step to step. (A function
        that changes its launches by state of its own, a call counter say, must read s.n instead.)"""
        return bool(self.trace) and (self._blind_runs or 0) >= 2

    def rerun(self, n: int, prev: State):
        """Run step n again from the state it ran from before (a recomputation between
        checkpoints), without a tape: that run checked its writes, and a step function is a
        function of its state, so this one makes the same launches. Nothing records or checks
        them and no running loss is computed; the launches keep the runner's `deterministic`, so
        the state comes out with the same bits. Every step's trace being the same, the launches
        run from it, without the step function. Returns what `run` does, with no tape and no loss."""
        if self.trace:
            nxt, scratch = self._replay(prev, with_loss=False, series=self._rows(n))
            return nxt, scratch, None, None
        model, pool = self.model, self.pool
        take = pool.take
        nxt = State({name: take(kind) for name, kind in self._kinds})
        ctx = StepContext(n, model.t0 + n * model.dt, model.dt, prev, nxt, self._params, pool)
        ctx.series = self._rows(n)
        try:
            with outside_tapes(self.deterministic):
                model.step_fn(ctx)
        except BaseException:
            pool.release_all((*nxt.values(), *ctx._scratch.values()))
            raise
        return nxt, ctx._scratch, None, None

    def replays_recording(self) -> bool:
        """Whether `record_replay` can stand in for recording a step that ran before."""
        return bool(self.trace) and self.trace.differentiable

    def record_replay(self, n: int, prev: State, outputs_dead: bool = False):
        """`run(n, prev, record=True, outputs_dead=...)` for a step that ran before, checked, from
        this state, built from the trace: its launches are recorded on a fresh tape (and run, but
        for those whose outputs no later launch reads when `outputs_dead`: StepTrace.unread)
        without the step function, its GradSlots or checks."""
        tape = Tape(self.deterministic)
        skip = self.trace.unread if outputs_dead else frozenset()
        nxt, scratch = self._replay(prev, tape=tape, skip=skip, series=self._rows(n))
        self.launches_skipped += len(skip)
        if self.trace.loss_last:
            reverse_loss_last(tape, self.trace.step_launches)
        loss = self.trace.loss
        return nxt, scratch, tape, scratch[loss.name] if loss is not None else None

    def _replay(self, prev: State, **run) -> tuple[State, dict]:
        """The trace's launches from `prev` into new versions (`run`: StepTrace.run's options);
        returns s.next and the scratch buffers, held once by the caller."""
        pool, trace = self.pool, self.trace
        take, acquire = pool.take, pool.acquire
        nxt = State({name: take(kind) for name, kind in self._kinds})
        scratch = {name: acquire(shape, dtype, zero) for name, shape, dtype, zero in trace.scratch}
        try:
            trace.run(prev, nxt, scratch, **run)
        except BaseException:
            pool.release_all((*nxt.values(), *scratch.values()))
            raise
        return nxt, scratch

    def _rows(self, n: int) -> State:
        return self.model.series_row(n) if self.model._series else _NO_SERIES

    def _observe(self, tape, prev, nxt, ctx, loss, step_ops: int) -> None:
        first = self.trace
        if self.trace is None:
            self.trace = trace_step(tape, prev, nxt, ctx._scratch, ctx._scratch_zero, loss, step_ops,
                                    ctx.series) or False
        elif not self.trace.matches(tape, prev, nxt, ctx._scratch, ctx._scratch_zero, loss, step_ops, ctx.series):
            self.trace = False
        if self.trace is False:       # say why, once per model: it runs correctly, only slower
            warn_untraceable(self.model, ctx._n, tape, first, prev, nxt, ctx._scratch, ctx.series)

    def run(self, n: int, prev: State, record: bool = False, donors=(), outputs_dead: bool = False):
        """Run step n from `prev`; return (next State, its scratch buffers by name, the tape, the loss
        array or None). The caller owns one hold on every next and scratch array. With `record`, the arrays
        carry gradients while the step runs (see GradSlots); none are left attached.

        `outputs_dead`: nothing will read what the step computes (a recorded step whose adjoint
        runs next: adjoints replay the forward from the step's inputs). Its launches are then held
        until something needs their results (Tape.defer_launches), and whatever is still held when
        the step ends, its last launch at least, is dropped unrun (`launches_skipped` counts them).
        The step's s.next, scratch and running loss then hold no values."""
        model, pool = self.model, self.pool
        take = pool.take
        nxt = State({name: take(kind) for name, kind in self._kinds})
        grads = None
        if record:
            grads = GradSlots(pool, donors)
            for a in prev.values():
                grads.attach(a)
            for a in nxt.values():
                grads.attach(a)
        ctx = StepContext(n, model.t0 + n * model.dt, model.dt, prev, nxt, self._params, pool, grads)
        ctx.series = self._rows(n)
        protected = {id(a._storage): "s.prev." + name for name, a in prev.items()}
        protected.update(self._param_labels)
        protected.update({id(a._storage): "s.series." + name for name, a in ctx.series.items()})
        tape = StepTape(protected, self.deterministic, ctx)
        if outputs_dead:
            tape.defer_launches()
        # Every write the runtime sees (launches, copies, assign, fill_) bumps the array's version.
        versions = list(map(_version, nxt.values()))
        loss = None
        try:
            try:
                with tape:
                    looked = host_accesses()
                    model.step_fn(ctx)
                    step_ops = len(tape._ops)            # the rest are the running loss's
                    if self.running_loss is not None:
                        loss = check_scalar_loss(self.running_loss(ctx), "running_loss(s)")
                    if self._blind_runs is not None:     # (the running loss runs from the trace too)
                        blind = not ctx.read_time and host_accesses() == looked
                        self._blind_runs = self._blind_runs + 1 if blind else None
            finally:
                self.launches_skipped += tape.drop_deferred()
            tape.end_step()
            if any(map(operator.eq, map(_version, nxt.values()), versions)):
                missing = [name for (name, a), v in zip(nxt.items(), versions) if a._storage.version == v]
                names = ", ".join(f"s.next.{m}" for m in missing)
                raise ModelError(
                    f"step function '{model.step_fn.__name__}' ({_where(model.step_fn)}) never wrote {names} "
                    f"(step {n}). Every declared state must be written each step, by a kernel, assign() or "
                    f"copy(); to keep a state unchanged write copy({names.split(', ')[0]}, "
                    f"{names.split(', ')[0].replace('s.next.', 's.prev.')}).")
        except BaseException:
            if grads is not None:
                grads.detach()
            pool.release_all((*nxt.values(), *ctx._scratch.values()))
            raise
        if grads is not None:
            grads.detach()
        if self.traced and self.trace is not False:
            self._observe(tape, prev, nxt, ctx, loss, step_ops)
        # as a trace's reversal runs them (after _observe, which reads the ops in their order); a step
        # that matched the trace has its answer
        if record and loss is not None and (self.trace.loss_last if self.trace else
                                            loss_reversed_last(tape._ops, step_ops)):
            reverse_loss_last(tape, step_ops)
        return nxt, ctx._scratch, tape, loss
