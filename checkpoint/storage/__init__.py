"""Snapshot storage: where a checkpointing schedule keeps the states it needs later.

``MemoryStorage`` keeps snapshots in RAM; ``HDF5Storage`` spills them to one
HDF5 file, with checksums, crash-safe completion markers, optional compression
and write-behind/prefetch on a background thread. Both implement ``Storage``.
"""

from .base import Storage, StorageStats
from .errors import (SnapshotCorruptError, SnapshotIncompleteError, SnapshotMissingError,
                     StorageClosedError, StorageError)
from .hdf5 import HDF5Storage
from .memory import MemoryStorage
from .snapshot import Snapshot

__all__ = [
    "Storage",
    "StorageStats",
    "Snapshot",
    "MemoryStorage",
    "HDF5Storage",
    "StorageError",
    "SnapshotMissingError",
    "SnapshotIncompleteError",
    "SnapshotCorruptError",
    "StorageClosedError",
]
