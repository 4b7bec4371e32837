"""How much a gradient run plans to write to disk, said before the run when it is a lot.

The disk tier of a checkpointed gradient holds at most a schedule-given number of snapshots at
once, each one state. That number is known before any step runs for our schedules, so a run that
would fill gigabytes says so first (a `DiskVolumeWarning` with the count, the bytes and the fix)."""
from __future__ import annotations

import warnings

from checkpoint import MultiLevel, Online, Revolve, StorageType, StoreAll

__all__ = ["DiskVolumeWarning", "planned_disk_snapshots", "warn_if_large"]

# Above this a run says how much it will write before writing it.
REPORT_BYTES = 2 * 2**30


class DiskVolumeWarning(UserWarning):
    """A gradient run plans to keep more than a few GiB of snapshots on disk."""


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
