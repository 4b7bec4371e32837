"""Forward-only rollouts: callbacks, recorded history, HDF5 checkpoints and `resume` after a crash.

Checkpoints go to a `CheckpointDirectory` (one fsynced, atomically renamed HDF5 file each), so a kill
loses at most the checkpoint being written; each records the model's fingerprint (dt, t0, state and
parameter shapes and dtypes, parameter values, the step's kernels and launches: fingerprint.py),
which `resume` checks; ``allow_changes=True`` continues anyway and records what changed.

Two versions of the state are live at a time: the step's input (``s.prev``) and its output
(``s.next``); the input goes back to the pool once the step is done.

Once the step function is `trusted` (its first two steps made the same launches and it read
neither s.n, s.t nor array data on the host: step_context.StepRunner), the steps between two
things the rollout must do (a callback, a recorded or checkpointed step, the end) run from the
trace in one call (native_loop.py on the CPU, graph_loop.py on a GPU), without the function and
its checks, which cost more than the kernels of a small step. The first step after each of
those runs the function, so a callback that changes what the step launches (a Python value the
function reads, say) is seen: that step's trace differs, and the rest of the run calls the
function. `until` and `check_finite`, which look at every step, keep every step on the function.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from checkpoint.storage.checkpoint_dir import CheckpointDirectory
from compiler.runtime.tape import active_tape

from ..errors import ModelError
from ..execute.executor import check_finite_state
from ..execute.fast.graph_loop import GraphLoops
from ..execute.fast.native_loop import NativeLoops
from ..step.fingerprint import fingerprint, mismatches, step_fingerprint
from ..step.state import State, check_initial, write_values
from ..step.step_context import StepRunner
from ..step.versions import BufferPool
from .progress import progress_bar

__all__ = ["rollout", "resume", "Rollout", "RolloutStats", "fingerprint"]

# Runs of trusted steps go to the native (CPU) or graph (GPU) loops; tests turn this off to compare.
native_loops = True


@dataclass(frozen=True)
class RolloutStats:
    steps: int                      # steps run by this call
    seconds: float
    peak_buffer_bytes: int          # state versions and scratch held at once
    checkpoints_written: int


class Rollout(State):
    """The final state of a rollout (``r.x``, ``r["x"]``), plus ``r.steps`` (the step it reached),
    ``r.history`` (``[(n, {name: ndarray})]`` with ``record_every``) and ``r.stats``."""

    def __init__(self, arrays, steps: int, history: list, stats: RolloutStats):
        super().__init__(arrays)
        object.__setattr__(self, "steps", steps)
        object.__setattr__(self, "history", history)
        object.__setattr__(self, "stats", stats)


def _check_every(name, value):
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ModelError(f"{name} must be an int >= 1, got {value!r}")


def rollout(model, initial, steps, *, callback=None, every: int = 1, record_every=None, checkpoint=None,
            checkpoint_every=None, until=None, check_finite=False, deterministic=False, progress=None,
            schedule=None, storage=None, overwrite=False):
    """See `Model.rollout`."""
    tape = active_tape()
    if tape is not None:
        if callback or record_every or checkpoint or until:
            raise ModelError("a rollout recorded on a Tape takes no callback, record_every, checkpoint or "
                             "until; run it outside the Tape for those")
        from .tape_op import record_rollout
        return record_rollout(model, tape, initial, steps, schedule=schedule, storage=storage,
                              check_finite=check_finite, progress=progress)
    if steps is None and until is None:
        raise ModelError("rollout() needs steps= (or until= with steps= as a maximum)")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 0):
        raise ModelError(f"steps must be an int >= 0, got {steps!r}")
    for name, value in (("every", every), ("record_every", record_every), ("checkpoint_every", checkpoint_every)):
        _check_every(name, value)
    model._check_ready()
    values = check_initial(model.states, initial, model.device)
    store = None
    if checkpoint is not None:
        if checkpoint_every is None:
            raise ModelError("checkpoint= needs checkpoint_every= (steps between snapshots)")
        # A bad path, another job's directory or an earlier run's checkpoints fail here, before the run.
        store = CheckpointDirectory(checkpoint, mode="w", overwrite=overwrite)
    elif checkpoint_every is not None:
        raise ModelError("checkpoint_every= needs checkpoint='run.ckpt' (a directory for the checkpoints)")
    meta = {"total_steps": steps, "checkpoint_every": checkpoint_every}
    if store is not None:
        meta.update(fingerprint(model))          # hashes every parameter's values: only where it is kept
    return _run(model, values, 0, steps, store, meta, callback=callback, every=every,
                record_every=record_every, until=until, check_finite=check_finite,
                deterministic=deterministic, progress=progress)


def resume(model, path, steps=None, *, callback=None, every: int = 1, record_every=None, until=None,
           check_finite=False, deterministic=False, progress=None, allow_changes=False):
    """See `Model.resume`."""
    model._check_ready()
    store = CheckpointDirectory(path, mode="a")
    try:
        snap = store.read_latest()
        done = snap.step
        meta = {k: snap.metadata[k] for k in ("total_steps", "checkpoint_every", "changes") if k in snap.metadata}
        resumed = _Resumed(str(store.path), done, dict(snap.metadata), bool(allow_changes))
        mine = fingerprint(model)
        resumed.check(meta, mine)
        meta.update(mine)
        values = check_initial(model.states, dict(snap.arrays), model.device, what=f"snapshot in {path}")
        total = steps if steps is not None else meta.get("total_steps")
        if total is None:
            raise ModelError(f"resume({path!r}): the run was open-ended (until=); pass steps=")
        if total < done:
            raise ModelError(f"resume({path!r}): the last checkpoint is at step {done}, beyond steps={total}")
        meta["total_steps"] = total
    except BaseException:
        store.close()
        raise
    return _run(model, values, done, total, store, meta, callback=callback, every=every,
                record_every=record_every, until=until, check_finite=check_finite,
                deterministic=deterministic, progress=progress, resumed=resumed)


@dataclass(frozen=True)
class _Resumed:
    """The checkpoint a `resume` starts from, against which the model is checked."""
    path: str
    step: int
    found: dict                      # its metadata
    allow_changes: bool

    def check(self, meta: dict, mine: dict) -> None:
        """Refuse to go on with a model that differs from the checkpoints' (what `mine` holds of
        it), or, with allow_changes, add the differences to `meta`'s ``changes`` (what the new
        checkpoints record)."""
        changed = mismatches(self.found, mine)
        if not changed:
            return
        if not self.allow_changes:
            raise ModelError(f"resume({self.path!r}): this model is not the one that wrote the checkpoints: "
                             + "; ".join(changed) + ". Resume with the model that wrote them, start a new "
                             "rollout, or pass allow_changes=True to continue with this model deliberately "
                             "(the new checkpoints record the changes)")
        meta["changes"] = [*meta.get("changes", []), {"step": self.step, "changed": changed}]


def _run(model, values, start, steps, store, meta, *, callback, every, record_every, until, check_finite,
         deterministic, progress, resumed: _Resumed | None = None):
    started = time.perf_counter()
    pool = BufferPool(model.device, model.zero_buffers)
    arrays = {}
    for name, spec in model.states.items():
        arrays[name] = pool.acquire(spec.shape, spec.dtype, zero=False)
        write_values(arrays[name], values[name])
    work = State(arrays)
    every_ck = meta.get("checkpoint_every")
    history, written = [], 0
    bar = progress_bar(progress, None if steps is None else steps - start, "rollout")
    n = start
    runner = StepRunner(model, pool, deterministic=deterministic, traced=True)
    loops = None
    if native_loops and until is None and not check_finite:
        loops = NativeLoops(pool, model.states, model._series) if model.device == "cpu" else \
            GraphLoops(pool, model.states, in_place=True, series=model._series)
    events = [k for k in (every if callback is not None else None, record_every,
                          every_ck if store is not None else None) if k]
    try:
        if check_finite:
            check_finite_state(work, None)
        if store is not None and start not in store:
            store.write(start, work.numpy(), meta)
            written += 1
        while steps is None or n < steps:
            # The step after an event runs its function (a callback may have changed what it
            # launches: the run then checks the trace again); the rest, up to the next event or
            # the end, run from the trace where the step is trusted.
            nxt, scratch, _tape, _ = runner.run(n, work)
            if n == start and store is not None:
                # the step's kernels are known once it ran: checked before anything is written
                kernels = step_fingerprint(runner.trace, _tape)
                if resumed is not None:
                    resumed.check(meta, kernels)
                meta.update(kernels)
            pool.release_all((*scratch.values(), *work.values()))
            work = nxt
            n += 1
            bar.update(1)
            ahead = min([steps if steps is not None else n] + [(n // k + 1) * k if n % k else n for k in events])
            nxt = loops.advance(runner.trace, work, ahead - n, n) if loops and runner.trusted and ahead > n else None
            if nxt is not None:
                bar.update(ahead - n)
                work, n = nxt, ahead
            if check_finite:
                check_finite_state(work, n - 1)
            if record_every and n % record_every == 0:
                history.append((n, {k: v.copy() for k, v in work.numpy().items()}))
            if store is not None and (n % every_ck == 0 or n == steps):
                store.write(n, work.numpy(), meta)
                written += 1
            if callback is not None and n % every == 0:
                callback(n, work)
            if until is not None and until(work):
                break
        if store is not None and n not in store:
            store.write(n, work.numpy(), meta)
            written += 1
    finally:
        bar.close()
        if store is not None:
            store.close()
    final = {name: pool.give_away(a) for name, a in work.items()}
    stats = RolloutStats(n - start, time.perf_counter() - started, pool.peak_allocated_bytes, written)
    return Rollout(final, n, history, stats)
