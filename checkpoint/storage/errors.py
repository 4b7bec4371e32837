"""Errors raised by snapshot storages.

Every error names the storage (the HDF5 file, or "memory") and the step it is
about, and says what the user can do, because the stepper shows them to people
whose long run just stopped.
"""

from __future__ import annotations

__all__ = [
    "StorageError",
    "SnapshotMissingError",
    "SnapshotIncompleteError",
    "SnapshotCorruptError",
    "StorageClosedError",
    "describe_steps",
]


class StorageError(RuntimeError):
    """A snapshot could not be stored, found or read back.

    Subclasses say which; catch this one to handle them all. I/O failures that
    happened on the background thread are re-raised as ``StorageError`` with
    the original ``OSError`` chained as ``__cause__``.
    """


class SnapshotMissingError(StorageError):
    """The requested step was never written, or has been deleted."""


class SnapshotIncompleteError(StorageError):
    """The snapshot's completion marker is missing: its writer died mid-write."""


class SnapshotCorruptError(StorageError):
    """The snapshot is marked complete but its data fail a check (checksum,
    shape, dtype or a missing array)."""


class StorageClosedError(StorageError):
    """The storage was used after ``close()``."""


def describe_steps(steps: list[int], limit: int = 8) -> str:
    """Short listing of steps for error messages (schedules can hold thousands)."""
    if not steps:
        return "none"
    if len(steps) <= limit:
        return ", ".join(map(str, steps))
    head = ", ".join(map(str, steps[: limit // 2]))
    tail = ", ".join(map(str, steps[-limit // 2 :]))
    return f"{head}, ..., {tail} ({len(steps)} in all)"
