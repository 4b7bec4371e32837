"""Snapshots kept in host memory: the RAM tier of a schedule."""

from __future__ import annotations

import time
from typing import Mapping

import numpy as np

from .base import Storage
from .errors import SnapshotMissingError, StorageClosedError, describe_steps
from .snapshot import Snapshot, check_step, copy_arrays, freeze, make_metadata

__all__ = ["MemoryStorage"]


class MemoryStorage(Storage):
    """Keeps snapshots in host memory.

    ``write`` copies the arrays, so the caller may reuse its buffers at once.
    ``read`` returns **read-only views** of the stored copies (no copy, so a
    read costs nothing); write ``arr.copy()`` if you need to modify one. Writing
    into a view raises ``ValueError: assignment destination is read-only``
    instead of silently changing the stored snapshot.

    >>> store = MemoryStorage()
    >>> store.write(3, {"x": np.zeros(4)}, {"t": 0.3})
    >>> store.read(3).metadata["t"]
    0.3
    """

    def __init__(self, device: str = "cpu") -> None:
        super().__init__()
        if device != "cpu":
            raise ValueError(
                f"MemoryStorage(device={device!r}) is not available: only device='cpu' is "
                "supported by MemoryStorage until the CUDA backend lands. Pass host (NumPy) "
                "arrays and use device='cpu'."
            )
        self.device = device
        self._snapshots: dict[int, Snapshot] = {}
        self._nbytes = 0          # kept up to date: schedules ask after every write
        self._closed = False

    def __repr__(self) -> str:
        return f"MemoryStorage(device={self.device!r}, steps={len(self._snapshots)}, nbytes={self.nbytes})"

    def write(self, step: int, arrays: Mapping[str, np.ndarray], metadata: dict | None = None) -> None:
        self._check_open()
        step = check_step(step)
        start = time.perf_counter()
        copies = copy_arrays(arrays)
        for array in copies.values():
            array.flags.writeable = False
        snapshot = freeze(step, copies, make_metadata(step, copies, metadata))
        replaced = self._snapshots.get(step)
        self._nbytes += snapshot.nbytes - (replaced.nbytes if replaced is not None else 0)
        self._snapshots[step] = snapshot
        elapsed = time.perf_counter() - start
        self._counters.add(
            snapshots_written=1, bytes_written=snapshot.nbytes, io_seconds=elapsed, blocked_seconds=elapsed
        )

    def read(self, step: int) -> Snapshot:
        self._check_open()
        stored = self._lookup(step)
        # Views of read-only arrays cannot be made writeable again, unlike the
        # owning arrays themselves, so a caller cannot edit the stored copy.
        views = {name: array.view() for name, array in stored.arrays.items()}
        self._counters.add(snapshots_read=1, bytes_read=stored.nbytes)
        return freeze(stored.step, views, dict(stored.metadata))

    def delete(self, step: int) -> None:
        self._check_open()
        snapshot = self._lookup(step)
        self._nbytes -= snapshot.nbytes
        del self._snapshots[snapshot.step]

    def steps(self) -> list[int]:
        return sorted(self._snapshots)

    def __contains__(self, step: object) -> bool:
        return step in self._snapshots

    @property
    def nbytes(self) -> int:
        return self._nbytes

    def close(self) -> None:
        """Drop all snapshots; further use raises StorageClosedError."""
        self._snapshots.clear()
        self._nbytes = 0
        self._closed = True

    def _lookup(self, step: int) -> Snapshot:
        step = check_step(step)
        try:
            return self._snapshots[step]
        except KeyError:
            raise SnapshotMissingError(
                f"memory storage has no snapshot of step {step}; stored steps: {describe_steps(self.steps())}"
            ) from None

    def _check_open(self) -> None:
        if self._closed:
            raise StorageClosedError("this MemoryStorage was closed; create a new one to store snapshots")

