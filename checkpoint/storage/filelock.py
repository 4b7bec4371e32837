"""Advisory locks that keep two writers off one snapshot file or checkpoint directory.

HDF5 takes its own lock only after opening the file, and opening with mode "w" truncates it first:
a second job on the same path wiped the first job's file before failing with "unable to lock file".
So the lock is taken here, on our own descriptor, before HDF5 (or anything else) touches the path,
and HDF5's own locking is turned off (``locking=False``): its flock on a second descriptor would
conflict with ours. ``flock`` locks belong to the open file, so two storages in one process
exclude each other as two processes do; the kernel drops them when the process dies.
"""

from __future__ import annotations

import errno
import fcntl
import os

from .errors import StorageError

__all__ = ["lock_path"]


def lock_path(path: str, *, exclusive: bool, what: str, create: bool = False) -> int:
    """Open ``path`` (a file, or a directory) without truncating it and lock it; returns the
    descriptor, whose ``os.close`` releases the lock. Raises `StorageError` naming the path if
    another writer (or, for ``exclusive``, any reader) holds it."""
    if os.path.isdir(path):
        flags = os.O_RDONLY | os.O_DIRECTORY
    else:
        flags = (os.O_RDWR | (os.O_CREAT if create else 0)) if exclusive else os.O_RDONLY
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as exc:
        raise StorageError(f"cannot open {what} {path}: {exc.strerror}; fix its permissions or choose "
                           "another path") from exc
    try:
        fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise StorageError(
                f"{what} {path} is in use by another writer (a second job on the same path?); "
                "nothing was changed: wait for it to finish or choose another path") from None
        raise StorageError(f"cannot lock {what} {path}: {exc}") from exc
    return fd
