"""State <-> snapshot storage: the RAM and DISK tiers a schedule writes to and reads from.

A RAM snapshot is, unless the caller gives a storage for RAM, the state itself: its versions stay
held in the buffer pool (`HeldStates`), with no copy either way. That is safe because a state never
changes once its step has run: steps write new versions (s.next), and the runtime refuses writes
into s.prev, parameters and the final state. A DISK snapshot (or a RAM one in a storage the caller
gave) is the state's arrays as NumPy (vectors as ``(n, 3)``), written through the checkpoint storage
layer: `HDF5Storage` for DISK, whose write-behind and prefetch threads overlap the I/O with the steps.

A GPU state bound for a storage leaves the device without stopping the host: `HostCopy` copies it
into pinned memory on a stream of its own while the next steps are queued, its versions held in
the pool so nothing overwrites them meanwhile, and the storage gets the values once the copy is
done (seen at a later call, or waited for when a snapshot needs them, when too many are in flight,
and at the end). The checkpoint layer never sees a device.
"""
from __future__ import annotations

import os
import time
from collections import OrderedDict
from dataclasses import dataclass

from checkpoint import HDF5Storage, StorageType
from checkpoint.storage import Storage, StorageStats
from compiler.runtime.host_copy import HostCopy

from ..errors import ModelError
from ..step.state import State
from ..step.versions import BufferPool

__all__ = ["HeldStates", "Tiers", "TierStats", "resolve_storage"]

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


class HeldStates:
    """The RAM tier when the caller gave no storage for it: snapshot n is the state itself (the same
    State object: States cannot be changed), each of its versions held once more in the buffer pool
    (`attach` gives the pool) until the snapshot is deleted. Counts its traffic like a Storage
    (`stats`); only the sweep's thread uses it, so plain counters do, without a Storage's lock."""

    def __init__(self):
        self.pool: BufferPool | None = None
        self._states: dict[int, tuple[State, int]] = {}     # n -> (the state, its bytes)
        self.nbytes = 0
        self._written = self._read = self._bytes_written = self._bytes_read = 0

    def attach(self, pool: BufferPool) -> None:
        self.pool = pool

    @property
    def stats(self) -> StorageStats:
        return StorageStats(snapshots_written=self._written, snapshots_read=self._read,
                            bytes_written=self._bytes_written, bytes_read=self._bytes_read)

    def __contains__(self, n: int) -> bool:
        return n in self._states

    def write(self, n: int, state: State) -> None:
        if n in self._states:
            self.delete(n)
        self.pool.retain_all(state.values())
        nbytes = sum(a.nbytes for a in state.values())
        self._states[n] = (state, nbytes)
        self.nbytes += nbytes
        self._written += 1
        self._bytes_written += nbytes

    def read(self, n: int) -> State:
        """Snapshot n as a State; the caller owns one hold on each of its versions."""
        state, nbytes = self._state(n)
        self.pool.retain_all(state.values())
        self._read += 1
        self._bytes_read += nbytes
        return state

    def arrays(self, n: int) -> dict:
        """Snapshot n as NumPy arrays (views), for a copy to another tier."""
        return self.peek(n).numpy()

    def peek(self, n: int) -> State:
        """Snapshot n's state, without a hold and without counting a read."""
        return self._state(n)[0]

    def delete(self, n: int) -> None:
        state, nbytes = self._states.pop(n)
        self.nbytes -= nbytes
        self.pool.release_all(state.values())

    def prefetch(self, n: int) -> None:
        pass

    def close(self) -> None:
        for n in list(self._states):
            self.delete(n)

    def _state(self, n: int) -> tuple[State, int]:
        try:
            return self._states[n]
        except KeyError:
            raise ModelError(f"the schedule reads RAM snapshot {n}, which it never wrote "
                             f"(held: {sorted(self._states)})") from None


def resolve_storage(storage, needs_disk: bool) -> tuple[dict, list]:
    """``({tier: Storage}, [storages we opened and must close])`` from the user's `storage`:
    None (RAM: the states held), a path (RAM held + DISK in that HDF5 file), a Storage (the DISK
    tier), or ``{StorageType.RAM: ..., StorageType.DISK: ...}``. A DISK tier that the schedule needs
    and nobody gave, or a path that cannot be written, is an error now, before any step runs."""
    tiers, owned = {}, []
    if isinstance(storage, dict):
        for key, value in storage.items():
            if key not in (_RAM, _DISK):
                raise ModelError(f"storage keys must be StorageType.RAM or StorageType.DISK, got {key!r}")
            if isinstance(value, (str, os.PathLike)):
                value = HDF5Storage(value, mode="w", overwrite=False)
                owned.append(value)
            if not isinstance(value, Storage):
                raise ModelError(f"storage[{key!r}] must be a checkpoint Storage or a path, got "
                                 f"{type(value).__name__}")
            tiers[key] = value
    elif isinstance(storage, (str, os.PathLike)):
        # A bad path, a file another job writes or a file that is not ours is a StorageError here.
        tiers[_DISK] = HDF5Storage(storage, mode="w", overwrite=False)
        owned.append(tiers[_DISK])
    elif isinstance(storage, Storage):
        tiers[_DISK] = storage
    elif storage is not None:
        raise ModelError(f"storage must be None, a path for HDF5 snapshots, a checkpoint Storage or a "
                         f"dict of them by StorageType, got {type(storage).__name__}")
    if _RAM not in tiers:
        tiers[_RAM] = HeldStates()
        owned.append(tiers[_RAM])
    if needs_disk and _DISK not in tiers:
        for s in owned:
            s.close()
        raise ModelError("the schedule stores snapshots on DISK but no disk storage was given; pass "
                         "storage='snapshots.h5' (or an HDF5Storage)")
    return tiers, owned


@dataclass
class _InFlight:
    """A GPU state on its way to a storage: the copy, the state (held in the pool until it is done)."""
    copy: HostCopy
    state: State
    metadata: dict | None


class Tiers:
    """Moves states in and out of the tiers, counting caller-side I/O time and peak RAM bytes."""

    # GPU snapshots copied to the host at once; one more waits for the oldest. Each holds its
    # state's device versions and a pinned host copy of them until its storage has it. 0 waits
    # for every copy at once (the synchronous path, for comparisons: benchmarks/gpu.py).
    MAX_IN_FLIGHT = 2

    def __init__(self, tiers: dict, owned: list):
        self.tiers = tiers
        self._owned = owned
        self._start = {tier: s.stats for tier, s in tiers.items()}
        self.io_seconds = 0.0                   # time this thread spent in storage calls
        self.ram_bytes = self.peak_ram_bytes = 0
        self.pool: BufferPool | None = None
        self._in_flight: OrderedDict[tuple, _InFlight] = OrderedDict()     # (tier, n) -> its copy

    def _storage(self, tier) -> Storage:
        try:
            return self.tiers[tier]
        except KeyError:
            raise ModelError(f"the schedule uses {tier!r}, which has no storage") from None

    def attach(self, pool: BufferPool) -> None:
        """The pool whose versions the run's states are (a held RAM tier keeps them there)."""
        self.pool = pool
        for storage in self.tiers.values():
            if isinstance(storage, HeldStates):
                storage.attach(pool)

    def _track_ram(self, tier) -> None:
        # `ram_bytes` counts what the pool does not: held snapshots are pool versions already.
        if tier is _RAM:
            storage = self.tiers[_RAM]
            self.ram_bytes = 0 if isinstance(storage, HeldStates) else storage.nbytes
            self.peak_ram_bytes = max(self.peak_ram_bytes, storage.nbytes)

    def write(self, tier, n: int, state: State, metadata=None) -> None:
        start = time.perf_counter()
        storage = self._storage(tier)
        self._land(tier, n)
        if isinstance(storage, HeldStates):
            storage.write(n, state)
        elif _on_gpu(state):
            self.pool.retain_all(state.values())
            self._send(tier, n, state, metadata)
        else:
            storage.write(n, state.numpy(), metadata)
        self.io_seconds += time.perf_counter() - start
        self._track_ram(tier)

    def _send(self, tier, n: int, state: State, metadata) -> None:
        """Start copying GPU `state` (held once for this) to the host for `tier`'s snapshot n."""
        self._land_finished()
        while self._in_flight and len(self._in_flight) >= self.MAX_IN_FLIGHT:
            self._land(*next(iter(self._in_flight)))
        self._in_flight[tier, n] = _InFlight(HostCopy(dict(state.items())), state, metadata)
        if not self.MAX_IN_FLIGHT:
            self._land(tier, n)

    def _land(self, tier, n: int) -> None:
        """Hand snapshot n's copy, if one is in flight, to its storage (waiting for it to finish)."""
        flight = self._in_flight.pop((tier, n), None)
        if flight is None:
            return
        try:
            self.tiers[tier].write(n, flight.copy.wait(), flight.metadata)
        finally:
            flight.copy.release()
            self.pool.release_all(flight.state.values())
        self._track_ram(tier)

    def _land_finished(self) -> None:
        for key in [key for key, flight in self._in_flight.items() if flight.copy.done()]:
            self._land(*key)

    def _land_all(self) -> None:
        while self._in_flight:
            self._land(*next(iter(self._in_flight)))

    def read_into(self, tier, n: int, specs) -> State:
        """Snapshot n as a State whose versions the caller holds once: a held RAM snapshot's own,
        else fresh versions loaded from the storage."""
        start = time.perf_counter()
        storage = self._storage(tier)
        self._land(tier, n)
        if isinstance(storage, HeldStates):
            state = storage.read(n)
        else:
            snap = storage.read(n)
            arrays = {}
            for name, spec in specs.items():
                arr = self.pool.acquire(spec.shape, spec.dtype, zero=False)
                arr._write_host(snap.arrays[name])
                arrays[name] = arr
            state = State(arrays)
        self.io_seconds += time.perf_counter() - start
        return state

    def copy(self, n: int, src, dst, specs) -> None:
        start = time.perf_counter()
        source, target = self._storage(src), self._storage(dst)
        self._land(src, n)
        self._land(dst, n)
        if isinstance(target, HeldStates):
            state = self.read_into(src, n, specs)
            target.write(n, state)
            self.pool.release_all(state.values())
        elif isinstance(source, HeldStates) and _on_gpu(held := source.peek(n)):
            self.pool.retain_all(held.values())
            self._send(dst, n, held, None)
        else:
            arrays = source.arrays(n) if isinstance(source, HeldStates) else dict(source.read(n).arrays)
            target.write(n, arrays)
        self.io_seconds += time.perf_counter() - start
        self._track_ram(dst)

    def delete(self, tier, n: int) -> None:
        start = time.perf_counter()
        self._land(tier, n)
        self._storage(tier).delete(n)
        self.io_seconds += time.perf_counter() - start
        self._track_ram(tier)

    def prefetch(self, tier, n: int) -> None:
        self._land_finished()
        storage = self.tiers.get(tier)
        if storage is not None and n in storage:
            storage.prefetch(n)

    def stats(self) -> dict:
        """``{StorageType: TierStats}`` of the traffic since this object was made."""
        self._land_all()
        out = {}
        for tier, s in self.tiers.items():
            now, then = s.stats, self._start[tier]
            out[tier] = TierStats(*(getattr(now, f) - getattr(then, f) for f in (
                "snapshots_written", "snapshots_read", "bytes_written", "bytes_read", "io_seconds",
                "blocked_seconds")))
        return out

    def close(self) -> None:
        """Delete what this run left in storages the user gave; close the storages we opened."""
        try:
            self._land_all()
        finally:
            for flight in self._in_flight.values():       # a failed landing: give the rest back
                flight.copy.release()
                self.pool.release_all(flight.state.values())
            self._in_flight.clear()
            for s in self._owned:
                s.close()
            self._owned = []


def _on_gpu(state: State) -> bool:
    return next(iter(state.values())).device != "cpu"
