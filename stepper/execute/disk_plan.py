"""A gradient run's disk plan: its disk costs measured before the run, and its volume said first
when it is a lot.

A `MultiLevel` told no disk costs is planned again with measured ones (`price_disk`): one snapshot
of the model's state written and read in the run's own disk storage, against one step of the
model, so the plan weighs disk traffic against recomputation in the run's own units.

The disk tier of a checkpointed gradient holds at most a schedule-given number of snapshots at
once, each one state. That number is known before any step runs for our schedules, so a run that
would fill gigabytes says so first (a `DiskVolumeWarning` with the count, the bytes and the fix)."""
from __future__ import annotations

import contextlib
import contextvars
import time
import warnings

import numpy as np

from checkpoint import MultiLevel, Online, Revolve, StorageType, StoreAll
from compiler.runtime.tape import outside_tapes

__all__ = ["DiskVolumeWarning", "agreed_costs", "planned_disk_snapshots", "price_disk", "warn_if_large"]

# Steps timed to price one step (after a run of them that compiles and warms up).
PRICE_STEPS = 8

# How processes that must plan the same schedule agree on measured costs (see `agreed_costs`).
_agree: contextvars.ContextVar = contextvars.ContextVar("agree", default=None)


@contextlib.contextmanager
def agreed_costs(agree):
    """Within the block, measured disk costs go through ``agree((write, read)) -> (write, read)``
    before planning: MPI ranks run one schedule in lockstep, and each measures its own disk and
    steps, so they must plan with the same numbers (stepper/distributed/domain.py passes the maximum
    over ranks)."""
    token = _agree.set(agree)
    try:
        yield
    finally:
        _agree.reset(token)

# Above this a run says how much it will write before writing it.
REPORT_BYTES = 2 * 2**30


class DiskVolumeWarning(UserWarning):
    """A gradient run plans to keep more than a few GiB of snapshots on disk."""


def price_disk(schedule, model, initial: dict, disk) -> object:
    """`schedule`, or a MultiLevel without given costs planned again with measured ones when the
    run has a `disk` storage: write and read seconds of one snapshot (`Storage.measure_costs`)
    over the seconds of one step (a short rollout from the initial state, timed once warm)."""
    if not isinstance(schedule, MultiLevel) or schedule.costs_given or disk is None or not schedule.disk_used:
        return schedule
    example = {name: np.zeros(spec.shape + spec.dtype.inner_shape, spec.dtype.np_dtype)
               for name, spec in model.states.items()}
    write_s, read_s = disk.measure_costs(example)
    with outside_tapes(True):           # a rollout inside a user's Tape would record itself there
        model.rollout(initial, PRICE_STEPS, progress=False)
        start = time.perf_counter()
        model.rollout(initial, PRICE_STEPS, progress=False)
        step_s = max((time.perf_counter() - start) / PRICE_STEPS, 1e-9)
    costs = (write_s / step_s, read_s / step_s)
    agree = _agree.get()
    return schedule.priced(*(agree(costs) if agree is not None else costs))


def planned_disk_snapshots(schedule, steps) -> int | None:
    """The most snapshots `schedule` keeps on disk at once, or None if it does not say."""
    disk = StorageType.DISK
    if isinstance(schedule, MultiLevel):
        return schedule.disk_used
    if isinstance(schedule, Revolve):
        return min(schedule.snapshots, schedule.max_n) if schedule.storage == disk else 0
    if isinstance(schedule, StoreAll):
        return schedule.max_n if schedule.storage == disk else 0
    if isinstance(schedule, Online):
        return schedule.snapshots_in_ram if schedule.storage == disk else 0
    return None


def warn_if_large(schedule, steps, state_bytes: int, limit: int | None = None) -> int | None:
    """The planned disk volume in bytes (None if unknown); warns first if it is above `limit`
    (default `REPORT_BYTES`)."""
    limit = REPORT_BYTES if limit is None else limit
    count = planned_disk_snapshots(schedule, steps)
    if count is None:
        return None
    volume = count * state_bytes
    if volume > limit:
        warnings.warn(f"this gradient plans up to {count} snapshots on disk at once, {volume / 2**30:.1f} GiB "
                      f"({state_bytes / 2**20:.1f} MiB a state) with {type(schedule).__name__}; make sure the "
                      f"storage has room, or give fewer disk snapshots", DiskVolumeWarning, stacklevel=4)
    return volume
