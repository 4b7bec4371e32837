"""Buffer versions: a pool of arrays, so that every step writes fresh buffers without allocating.

Each step asks for new versions of its outputs and scratch buffers; a version goes back to the pool
when nothing holds it any more (the live state, a recorded step waiting for its adjoint, a gradient
being carried). Holders count references with `retain_all`/`release_all`. Gradients are versions
too: the executor attaches pooled arrays as ``.grad`` only while a step's adjoint runs.
"""
from __future__ import annotations

import sys
import threading

import numpy as np

from compiler import array, empty
from compiler.runtime.memory import allocate

__all__ = ["BufferPool", "Kind", "release_memory", "set_grad"]

# The memory of the versions a finished run left free, handed to the next run's pools: an
# optimisation loop asks for the same versions every call, and new memory is not free of cost (a
# 256^2 FWI store-all gradient's ~400 MB of fresh pages took ~0.14 s of its 0.48 s, 1.4x, once runs
# gave their memory back on return). At most one run's free versions are kept: each run's replace
# the last's. By (device, memory shape, NumPy dtype).
_spare: dict[tuple, list] = {}
_spare_lock = threading.Lock()


def release_memory() -> None:
    """Give back the memory the last run left for the next one (``stepper.release_memory()``), e.g.
    before work that needs it; runs keep working, allocating anew."""
    with _spare_lock:
        _spare.clear()


def _unshared(arr: array) -> bool:
    """Whether nothing but the pool refers to `arr` and its memory (no view, no user, no graph)."""
    # (the free list, the caller's loop variable, this argument and getrefcount's; the array's own)
    return sys.getrefcount(arr) <= 4 and sys.getrefcount(arr._data) <= 2


def set_grad(arr: array, grad: array | None) -> None:
    """``arr.grad = grad`` for a gradient made from `arr`'s own shape and dtype (a pool version, or a
    carried adjoint of the same state): array.grad's checks cost about a microsecond, and every
    recorded and reversed step sets several gradients."""
    arr._grad = grad


class Kind:
    """The versions of one (shape, dtype) and the free ones among them. Hashed and compared by
    identity, so whoever asks for the same kind every step (a model's states, gradients keyed by
    kind) keeps the Kind and skips hashing the (shape, dtype) pair each time."""
    __slots__ = ("shape", "dtype", "free", "nbytes", "layout")

    def __init__(self, shape: tuple, dtype):
        self.shape, self.dtype = shape, dtype
        self.free: list[array] = []
        self.nbytes = 0                  # of one version; known once the first is allocated
        self.layout = None               # (device, memory shape, NumPy dtype, element type), from the first


class BufferPool:
    """Arrays by (shape, dtype), reused once released. Tracks bytes for the run's statistics:
    `live_bytes` (held now), `allocated_bytes` (held + free in the pool) and their peaks."""

    def __init__(self, device: str = "cpu", zero: bool = True):
        self.device = device
        self.zero = zero
        self._kinds: dict[tuple, Kind] = {}
        # id(array) -> [holders, the array, its Kind]. Every step acquires and releases several
        # versions, so one record keeps each of those to one dict operation.
        self._held: dict[int, list] = {}
        self.live_bytes = self.allocated_bytes = 0
        self.peak_live_bytes = self.peak_allocated_bytes = 0
        self.allocations = 0

    def kind(self, shape, dtype) -> Kind:
        """The Kind of versions with this shape (an int or a sequence of ints) and dtype."""
        key = (shape if type(shape) is tuple else (shape,) if isinstance(shape, (int, np.integer))
               else tuple(shape), dtype)
        kind = self._kinds.get(key)
        if kind is None:
            kind = self._kinds[key] = Kind(*key)
        return kind

    def kind_like(self, arr: array) -> Kind:
        """The Kind of `arr`'s shape and dtype (looked up by identity if the pool holds `arr`)."""
        held = self._held.get(id(arr))
        return held[2] if held is not None else self.kind(arr.shape, arr.dtype)

    def acquire(self, shape, dtype, zero: bool | None = None) -> array:
        """A version nobody else holds (reference count 1), zero-filled unless ``zero=False``."""
        return self.take(self.kind(shape, dtype), zero)

    def acquire_like(self, arr: array, zero: bool | None = None) -> array:
        return self.take(self.kind_like(arr), zero)

    def take(self, kind: Kind, zero: bool | None = None, prefer: array | None = None) -> array:
        """`acquire` for a Kind the caller kept; `prefer`: this version if it is free."""
        free = kind.free
        at = next((k for k, f in enumerate(free) if f is prefer), None) if prefer is not None else None
        if at is not None:
            arr = free.pop(at)
        elif free:
            arr = free.pop()
        else:
            arr = self._allocate(kind)
        if self.zero if zero is None else zero:
            arr._zero_memory()
        self._held[id(arr)] = [1, arr, kind]
        self.live_bytes += kind.nbytes
        if self.live_bytes > self.peak_live_bytes:
            self.peak_live_bytes = self.live_bytes
        return arr

    def _allocate(self, kind: Kind) -> array:
        if kind.layout is None:                   # the first: `empty` checks the shape and dtype
            arr = empty(kind.shape, dtype=kind.dtype, device=self.device)
            kind.layout = (arr.device, arr._data.shape, arr._data.dtype, arr.dtype)
            kind.nbytes = arr.nbytes
        else:                                     # StoreAll allocates a version or two every step
            device, shape, np_dtype, dtype = kind.layout
            try:
                with _spare_lock:
                    spare = _spare.get((device, shape, np_dtype))
                    data = spare.pop() if spare else None
                if data is None:
                    data = allocate(device, shape, np_dtype, False)
                arr = array._wrap(data, dtype, device=device)
            except MemoryError as e:
                raise MemoryError(f"a new version of shape {kind.shape} and dtype {dtype} on {device}: {e}") from None
        self.allocations += 1
        self.allocated_bytes += kind.nbytes
        self.peak_allocated_bytes = max(self.peak_allocated_bytes, self.allocated_bytes)
        return arr

    def owns(self, arr: array) -> bool:
        return id(arr) in self._held

    def holds(self, arr: array) -> int:
        """How many holds `arr` has (0 if the pool does not hold it)."""
        held = self._held.get(id(arr))
        return held[0] if held is not None else 0

    def retain_all(self, arrays) -> None:
        """One more hold on each of `arrays` (a state's, usually: one call per state, not per array)."""
        held = self._held
        for arr in arrays:
            held[id(arr)][0] += 1

    def release(self, arr: array) -> None:
        """Drop one hold; the last one returns the version to the pool (its grad is detached)."""
        self.release_all((arr,))

    def release_all(self, arrays, last: bool = False) -> None:
        """`release` each of `arrays`; with `last`, those freed are handed out after all others (a
        caller that wants them back, with `take(prefer=)`, finds them free more often)."""
        for arr in arrays:
            held = self._held[id(arr)]
            held[0] -= 1
            if not held[0]:
                del self._held[id(arr)]
                arr._grad = None
                kind = held[2]
                self.live_bytes -= kind.nbytes
                if last:
                    kind.free.insert(0, arr)
                else:
                    kind.free.append(arr)

    def give_away(self, arr: array) -> array:
        """Hand a held version to the caller for good: the pool forgets it (its bytes stay counted
        in the peaks, not in `live_bytes`)."""
        del self._held[id(arr)]
        nbytes = arr.nbytes
        self.live_bytes -= nbytes
        self.allocated_bytes -= nbytes
        return arr

    def clear(self) -> None:
        """The run is over: forget the free versions; their memory goes to the next run's pools
        (what nothing else refers to), in place of what an earlier run left there."""
        left: dict[tuple, list] = {}
        for kind in self._kinds.values():
            for arr in kind.free:
                self.allocated_bytes -= arr.nbytes
                if kind.layout is not None and _unshared(arr):
                    left.setdefault(kind.layout[:3], []).append(arr._data)
            kind.free.clear()      # in place: held versions still point at their Kind
        if left:                   # (a run that leaves nothing, a short evaluation's, takes nothing away)
            with _spare_lock:
                _spare.clear()
                _spare.update(left)

    @property
    def live(self) -> int:
        """How many versions are held now."""
        return len(self._held)
