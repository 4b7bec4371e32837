"""`gradient`: the loss of a rollout and its gradients, by a checkpointed reverse sweep.

The schedule decides what is stored and recomputed; `executor.Sweep` carries it out. Any schedule
from checkpoint/ works, and any schedule speaking the same action vocabulary (checkpoint_schedules').
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from checkpoint import Online, Revolve, StorageType, from_checkpoint_schedules

from ..errors import ModelError
from ..execute.disk_plan import price_disk, warn_if_large
from ..execute.executor import Sweep
from ..execute.snapshots import TierStats, Tiers, resolve_storage
from ..step.state import State, check_initial
from .progress import progress_bar

__all__ = ["gradient", "GradientResult", "GradientStats", "prepare_schedule"]


@dataclass(frozen=True)
class GradientStats:
    """What a gradient run did and cost.

    ``forward_steps`` counts every step run (recomputations and recording runs included) and equals
    the schedule's own count; ``snapshots`` holds a `TierStats` per tier (RAM, DISK);
    ``peak_memory_bytes`` is the most the run held at once in state versions, scratch buffers,
    gradients and RAM snapshots (``peak_buffer_bytes`` + RAM snapshots at that time).
    ``launches_skipped``: launches of recorded steps that were reversed at once, whose results
    nothing read, so they never ran (the adjoint replays the forward from the step's inputs).
    ``native_steps``: recomputations of a traced step run by the native step loop (one call per
    ``Forward`` action instead of Python once per step; stepper/execute/fast/native_loop.py).
    ``native_reversals``: recorded steps reversed from their trace without a tape (recorded
    natively, keeping only the state they start from; stepper/execute/fast/native_reverse.py).
    ``renamed_copies``: whole-state copies (``sp.copy(s.next.a, s.prev.b)``, or a kernel's
    ``a_next[i] = b[i]``) a native run did by renaming buffers instead of copying: on those steps
    the copy launch did not run, or the kernel ran without its copying stores.
    """
    steps: int
    forward_steps: int
    recorded_steps: int
    reverse_steps: int
    snapshots: dict = field(default_factory=dict)
    peak_memory_bytes: int = 0
    peak_buffer_bytes: int = 0
    peak_ram_snapshot_bytes: int = 0
    forward_seconds: float = 0.0
    adjoint_seconds: float = 0.0
    io_seconds: float = 0.0          # time the run waited for snapshot storage
    total_seconds: float = 0.0
    launches_skipped: int = 0
    native_steps: int = 0
    native_reversals: int = 0
    renamed_copies: int = 0

    def snapshots_written(self, tier=StorageType.RAM) -> int:
        return self.snapshots.get(tier, TierStats()).snapshots_written

    def snapshots_read(self, tier=StorageType.RAM) -> int:
        return self.snapshots.get(tier, TierStats()).snapshots_read


@dataclass(frozen=True)
class GradientResult:
    """``loss`` (a float: terminal + running), ``grads`` (``{name: array}`` for every float initial
    state and every parameter), ``final`` (the final State, a copy) and ``stats``."""
    loss: float
    grads: dict
    final: State
    stats: GradientStats


def _is_peer(schedule) -> bool:
    return (type(schedule).__module__ or "").startswith("checkpoint_schedules")


def _uses_disk(schedule) -> bool:
    try:
        if _is_peer(schedule):
            import checkpoint_schedules as cs
            return bool(schedule.uses_storage_type(cs.StorageType.DISK))
        return bool(schedule.uses_storage_type(StorageType.DISK))
    except (AttributeError, TypeError):
        return False


def prepare_schedule(schedule, steps, until):
    """(schedule, action converter or None) after checking it fits `steps` and `until`.

    `schedule`: a schedule object (ours or checkpoint_schedules'), a callable ``steps -> schedule``,
    or None: ``Revolve(steps, ceil(sqrt(steps)))``, or ``Online(32)`` with `until`."""
    if schedule is None:
        if until is not None or steps is None:
            schedule = Online(32)
        else:
            schedule = Revolve(steps, max(1, min(steps, math.isqrt(steps - 1) + 1)))
    elif callable(schedule) and not hasattr(schedule, "__iter__"):
        schedule = schedule(steps)
    if isinstance(schedule, str) or not hasattr(schedule, "__iter__"):
        raise ModelError(f"schedule must be a checkpointing schedule object (e.g. Revolve(steps, 20), "
                         f"Online(16)) or a function steps -> schedule, got {type(schedule).__name__} {schedule!r}")
    max_n = getattr(schedule, "max_n", None)
    online = hasattr(schedule, "finalize") and max_n is None
    if getattr(schedule, "is_exhausted", False) or getattr(schedule, "_stream", None) is not None:
        raise ModelError(f"this {type(schedule).__name__} has already been run; a schedule runs once, "
                         "so create a new one (or pass a function steps -> schedule)")
    if online:
        if steps is None and until is None:
            raise ModelError("an online schedule needs steps= (a maximum) or until= (a stopping condition)")
    else:
        if until is not None:
            raise ModelError(f"until= needs an online schedule (Online(snapshots)), whose length is "
                             f"learned during the run; {type(schedule).__name__} has a fixed max_n")
        if steps is None:
            raise ModelError("steps= is required with an offline schedule")
        if max_n is not None and max_n != steps:
            raise ModelError(f"the schedule {type(schedule).__name__} was made for max_n={max_n} steps, but "
                             f"the run has steps={steps}; create it with the same number of steps")
    return schedule, (from_checkpoint_schedules if _is_peer(schedule) else None)


def _check_steps(steps):
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise ModelError(f"steps must be an int >= 1, got {steps!r}")


def start_sweep(model, initial, steps, *, schedule=None, storage=None, running_loss=None, until=None,
                deterministic=True, check_finite=False, progress=None, desc="gradient"):
    """Check everything that can be checked before the run, then build the Sweep (no step run yet)."""
    _check_steps(steps)
    model._check_ready()
    values = check_initial(model.states, initial, model.device)
    schedule, convert = prepare_schedule(schedule, steps, until)
    tiers = Tiers(*resolve_storage(storage, _uses_disk(schedule)))
    try:
        schedule = price_disk(schedule, model, values, tiers.tiers.get(StorageType.DISK))
        if _uses_disk(schedule):
            warn_if_large(schedule, steps, model.state_bytes)     # before anything is written
    except BaseException:
        tiers.close()
        raise
    total = getattr(schedule, "forward_steps", None)
    bar = progress_bar(progress, None if total is None or steps is None else total + steps, desc)
    return Sweep(model, values, steps, schedule, tiers, deterministic=deterministic,
                 running_loss=running_loss, until=until, check_finite=check_finite, progress=bar,
                 convert=convert)


def finish_stats(sweep: Sweep, started: float) -> GradientStats:
    return GradientStats(
        steps=sweep.steps, forward_steps=sweep.forward_steps, recorded_steps=sweep.recorded_steps,
        reverse_steps=sweep.reverse_steps, snapshots=sweep.tiers.stats(),
        peak_memory_bytes=sweep.peak_bytes, peak_buffer_bytes=sweep.pool.peak_allocated_bytes,
        peak_ram_snapshot_bytes=sweep.tiers.peak_ram_bytes, forward_seconds=sweep.forward_seconds,
        adjoint_seconds=sweep.adjoint_seconds, io_seconds=sweep.tiers.io_seconds,
        total_seconds=time.perf_counter() - started, launches_skipped=sweep.launches_skipped,
        native_steps=sweep.native.steps, native_reversals=sweep.reversal.steps,
        renamed_copies=sweep.native.renamed_copies)


def gradient(model, initial, steps=None, loss=None, schedule=None, storage=None, *, running_loss=None,
             until=None, deterministic=True, check_finite=False, progress=None) -> GradientResult:
    """See `Model.gradient`."""
    if loss is None and running_loss is None:
        raise ModelError("gradient() needs loss= (a function of the final state) and/or running_loss= "
                         "(a function of each step's s)")
    started = time.perf_counter()
    sweep = start_sweep(model, initial, steps, schedule=schedule, storage=storage, running_loss=running_loss,
                        until=until, deterministic=deterministic, check_finite=check_finite,
                        progress=progress)
    for p in model.params.values():
        p.grad._zero_memory()       # gradient() returns this run's gradients, not a sum over runs
    try:
        final_live = sweep.forward()
        final = State({name: _copy(a) for name, a in final_live.items()})
        adjoint = sweep.reverse(loss=loss)
        grads = dict(adjoint)
        for name, p in model.params.items():
            grads[name] = _copy(p.grad)
        stats = finish_stats(sweep, started)
        return GradientResult(sweep.loss, grads, final, stats)
    finally:
        sweep.close()


def _copy(arr):
    from compiler import clone
    return clone(arr, requires_grad=False)
