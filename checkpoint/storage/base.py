"""The Storage interface every snapshot tier implements, and its I/O counters.

Schedules (checkpoint/schedules) only say *which* step goes *where*; the
stepper moves snapshots through this interface, so a RAM tier and a disk tier
are interchangeable and their traffic is counted the same way.
"""

from __future__ import annotations

import abc
import statistics
import threading
import time
from dataclasses import dataclass, fields
from typing import Any, Mapping

import numpy as np

from .snapshot import Snapshot

__all__ = ["Storage", "StorageStats"]


@dataclass(frozen=True)
class StorageStats:
    """What a storage has done so far (read ``storage.stats``).

    ``io_seconds`` is time spent moving data (copies for memory, HDF5 calls for
    disk) on whichever thread did it; ``blocked_seconds`` is the part of it the
    caller waited for. With write-behind, ``1 - blocked/io`` is the fraction of
    I/O hidden behind compute.
    """

    snapshots_written: int = 0
    snapshots_read: int = 0
    bytes_written: int = 0
    bytes_read: int = 0
    io_seconds: float = 0.0
    blocked_seconds: float = 0.0


class Counters:
    """Thread-safe accumulator behind ``Storage.stats``.

    A lock, because the background writer adds I/O time while the caller adds
    read counts.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values = {f.name: f.default for f in fields(StorageStats)}

    def add(self, **increments: float) -> None:
        with self._lock:
            for name, value in increments.items():
                self._values[name] += value

    def snapshot(self) -> StorageStats:
        with self._lock:
            return StorageStats(**self._values)

    def restore(self, stats: StorageStats) -> None:
        with self._lock:
            self._values = {f.name: getattr(stats, f.name) for f in fields(StorageStats)}


class Storage(abc.ABC):
    """A place to keep snapshots: dicts of named NumPy arrays, keyed by step.

    Use it as a context manager so that ``close()`` (which flushes and re-raises
    any background I/O error) always runs::

        with MemoryStorage() as store:
            store.write(0, {"x": x0})
            x = store.read(0).arrays["x"]
    """

    def __init__(self) -> None:
        self._counters = Counters()

    # -- the interface ---------------------------------------------------
    @abc.abstractmethod
    def write(self, step: int, arrays: Mapping[str, np.ndarray], metadata: dict | None = None) -> None:
        """Store a copy of ``arrays`` as ``step``; replaces an existing snapshot of that step."""

    @abc.abstractmethod
    def read(self, step: int) -> Snapshot:
        """Return the snapshot of ``step``; raise SnapshotMissingError if there is none."""

    @abc.abstractmethod
    def delete(self, step: int) -> None:
        """Forget ``step``; raise SnapshotMissingError if there is none."""

    @abc.abstractmethod
    def steps(self) -> list[int]:
        """Sorted steps of the snapshots that ``read`` can return."""

    @property
    @abc.abstractmethod
    def nbytes(self) -> int:
        """Bytes of array data currently stored (uncompressed)."""

    def __contains__(self, step: object) -> bool:
        return step in self.steps()

    def prefetch(self, step: int) -> None:
        """Hint that ``step`` will be read soon. Storages without latency ignore it."""

    def flush(self) -> None:
        """Wait until every write so far is stored; re-raise background errors."""

    def close(self) -> None:
        """Flush, release resources and re-raise any pending background error."""

    # -- shared behaviour -----------------------------------------------
    @property
    def stats(self) -> StorageStats:
        """Counters of the traffic so far (a frozen copy)."""
        return self._counters.snapshot()

    def __enter__(self) -> "Storage":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def measure_costs(self, example_arrays: Mapping[str, np.ndarray], repeats: int = 3) -> tuple[float, float]:
        """Time one write (until flushed) and one read of a snapshot like ``example_arrays``.

        Returns ``(write_seconds, read_seconds)``, medians over ``repeats``
        trials, to hand to a multi-level schedule as its disk/RAM costs. The
        trials use a step after the last stored one and delete it again; they
        are left out of ``stats``.
        """
        if repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {repeats}")
        self.flush()
        before = self._counters.snapshot()
        scratch = max(self.steps(), default=-1) + 1
        writes, reads = [], []
        try:
            for _ in range(repeats):
                start = time.perf_counter()
                self.write(scratch, example_arrays)
                self.flush()
                writes.append(time.perf_counter() - start)
                start = time.perf_counter()
                self.read(scratch)
                reads.append(time.perf_counter() - start)
                self.delete(scratch)
            self.flush()
        finally:
            self._counters.restore(before)
        return statistics.median(writes), statistics.median(reads)
