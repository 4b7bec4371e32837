"""The baseline: record every step in one forward sweep, reverse them all, recompute nothing."""

from __future__ import annotations

from ..actions import END_FORWARD, END_REVERSE, Forward, Move, Reverse, StorageType
from .base import Schedule, check_steps

__all__ = ["StoreAll"]


class StoreAll(Schedule):
    """Forward(0, max_n) recording every step in `storage`, then one Reverse(max_n, 0).

    Exactly max_n forward steps and no snapshots; the adjoint dependencies of all steps are held
    at once, which is what the checkpointing schedules avoid.
    """

    def __init__(self, max_n: int, storage: StorageType = StorageType.RAM):
        super().__init__(check_steps(max_n))
        if storage not in (StorageType.RAM, StorageType.DISK, StorageType.WORK):
            raise ValueError("storage must be StorageType.RAM, StorageType.DISK or "
                             f"StorageType.WORK, got {storage!r}")
        self.storage = storage

    def _storages(self):
        return frozenset((self.storage,))

    def _actions(self):
        # Recorded data in RAM or DISK is one unit per step in checkpoint_schedules' convention,
        # so those storages record step by step; WORK records the whole range at once.
        end = self.max_n
        if self.storage is StorageType.WORK:
            self._n = end
            yield Forward(0, end, False, True, StorageType.WORK)
            yield END_FORWARD
            self._r = end
            yield Reverse(end, 0, True)
        else:
            for n in range(end):
                self._n = n + 1
                yield Forward(n, n + 1, False, True, self.storage)
            yield END_FORWARD
            for n in range(end - 1, -1, -1):
                self._n = n
                yield Move(n, self.storage, StorageType.WORK)
                self._r = end - n
                yield Reverse(n + 1, n, True)
        yield END_REVERSE
