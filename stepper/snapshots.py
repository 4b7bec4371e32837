"""State <-> snapshot storage: the RAM and DISK tiers a schedule writes to and reads from.

A snapshot is the state's arrays as NumPy (vectors as ``(n, 3)``), written through the checkpoint
storage layer: `MemoryStorage` for RAM, `HDF5Storage` for DISK, whose write-behind and prefetch
threads overlap the I/O with the steps.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np

from checkpoint import HDF5Storage, MemoryStorage, StorageType
from checkpoint.storage import Storage

from .errors import ModelError
from .state import State
from .versions import BufferPool

__all__ = ["Tiers", "TierStats", "resolve_storage"]

_RAM, _DISK = StorageType.RAM, StorageType.DISK


@dataclass(frozen=True)
class TierStats:
    """Snapshot traffic of one tier during one run."""
    snapshots_written: int = 0
    snapshots_read: int = 0
    bytes_written: int = 0
    bytes_read: int = 0
    io_seconds: float = 0.0          # time the storage spent moving data, on any thread
    blocked_seconds: float = 0.0     # the part of it the run waited for


def resolve_storage(storage, needs_disk: bool) -> tuple[dict, list]:
    """``({tier: Storage}, [storages we opened and must close])`` from the user's `storage`:
    None (RAM in memory), a path (RAM in memory + DISK in that HDF5 file), a Storage (the DISK
    tier), or ``{StorageType.RAM: ..., StorageType.DISK: ...}``. A DISK tier that the schedule needs
    and nobody gave, or a path that cannot be written, is an error now, before any step runs."""
    tiers, owned = {}, []
    if isinstance(storage, dict):
        for key, value in storage.items():
            if key not in (_RAM, _DISK):
                raise ModelError(f"storage keys must be StorageType.RAM or StorageType.DISK, got {key!r}")
            if isinstance(value, (str, os.PathLike)):
                value = HDF5Storage(value, mode="w")
                owned.append(value)
            if not isinstance(value, Storage):
                raise ModelError(f"storage[{key!r}] must be a checkpoint Storage or a path, got "
                                 f"{type(value).__name__}")
            tiers[key] = value
    elif isinstance(storage, (str, os.PathLike)):
        tiers[_DISK] = HDF5Storage(storage, mode="w")     # raises StorageError on a bad path
        owned.append(tiers[_DISK])
    elif isinstance(storage, Storage):
        tiers[_DISK] = storage
    elif storage is not None:
        raise ModelError(f"storage must be None, a path for HDF5 snapshots, a checkpoint Storage or a "
                         f"dict of them by StorageType, got {type(storage).__name__}")
    if _RAM not in tiers:
        tiers[_RAM] = MemoryStorage()
        owned.append(tiers[_RAM])
    if needs_disk and _DISK not in tiers:
        for s in owned:
            s.close()
        raise ModelError("the schedule stores snapshots on DISK but no disk storage was given; pass "
                         "storage='snapshots.h5' (or an HDF5Storage)")
    return tiers, owned


class Tiers:
    """Moves states in and out of the tiers, counting caller-side I/O time and peak RAM bytes."""

    def __init__(self, tiers: dict, owned: list):
        self.tiers = tiers
        self._owned = owned
        self._start = {tier: s.stats for tier, s in tiers.items()}
        self.io_seconds = 0.0                   # time this thread spent in storage calls
        self.ram_bytes = self.peak_ram_bytes = 0

    def _storage(self, tier) -> Storage:
        try:
            return self.tiers[tier]
        except KeyError:
            raise ModelError(f"the schedule uses {tier!r}, which has no storage") from None

    def _track_ram(self, tier) -> None:
        if tier is _RAM:
            self.ram_bytes = self.tiers[_RAM].nbytes
            self.peak_ram_bytes = max(self.peak_ram_bytes, self.ram_bytes)

    def write(self, tier, n: int, state: State, metadata=None) -> None:
        start = time.perf_counter()
        self._storage(tier).write(n, state.numpy(), metadata)
        self.io_seconds += time.perf_counter() - start
        self._track_ram(tier)

    def read_into(self, tier, n: int, pool: BufferPool, specs) -> State:
        """Load snapshot n into fresh versions (held once by the caller)."""
        start = time.perf_counter()
        snap = self._storage(tier).read(n)
        arrays = {}
        for name, spec in specs.items():
            arr = pool.acquire(spec.shape, spec.dtype, zero=False)
            np.copyto(arr.numpy(), snap.arrays[name])
            arrays[name] = arr
        self.io_seconds += time.perf_counter() - start
        return State(arrays)

    def copy(self, n: int, src, dst) -> None:
        start = time.perf_counter()
        snap = self._storage(src).read(n)
        self._storage(dst).write(n, dict(snap.arrays))
        self.io_seconds += time.perf_counter() - start
        self._track_ram(dst)

    def delete(self, tier, n: int) -> None:
        start = time.perf_counter()
        self._storage(tier).delete(n)
        self.io_seconds += time.perf_counter() - start
        self._track_ram(tier)

    def prefetch(self, tier, n: int) -> None:
        storage = self.tiers.get(tier)
        if storage is not None and n in storage:
            storage.prefetch(n)

    def stats(self) -> dict:
        """``{StorageType: TierStats}`` of the traffic since this object was made."""
        out = {}
        for tier, s in self.tiers.items():
            now, then = s.stats, self._start[tier]
            out[tier] = TierStats(*(getattr(now, f) - getattr(then, f) for f in (
                "snapshots_written", "snapshots_read", "bytes_written", "bytes_read", "io_seconds",
                "blocked_seconds")))
        return out

    def close(self) -> None:
        """Delete what this run left in storages the user gave; close the storages we opened."""
        for s in self._owned:
            s.close()
        self._owned = []
