"""Checkpointing: schedules (pure generators of actions) and snapshot storage."""

from .actions import Copy, EndForward, EndReverse, Forward, Move, Reverse, StorageType
from .schedules import (MultiLevel, Online, Revolve, Schedule, StoreAll,
                        from_checkpoint_schedules, optimal_steps, to_checkpoint_schedules)
from .validate import CostSummary, validate
from .storage import HDF5Storage, MemoryStorage, Snapshot, StorageError

__all__ = [
    "StorageType", "Forward", "Reverse", "Copy", "Move", "EndForward", "EndReverse",
    "Schedule", "Revolve", "MultiLevel", "Online", "StoreAll", "optimal_steps",
    "validate", "CostSummary", "to_checkpoint_schedules", "from_checkpoint_schedules",
    # storage names (checkpoint/storage) are added below this line
    "MemoryStorage", "HDF5Storage", "Snapshot", "StorageError",
]
