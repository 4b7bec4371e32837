"""Snapshots in one HDF5 file, written behind and prefetched on a background thread.

The file layout is documented in ``layout.py``. This module adds what the
stepper needs around it: an index of the steps, write-behind with a bounded
queue, prefetch, error hand-off from the I/O thread, and the path checks that
make a bad path fail at construction rather than an hour into a run.
"""

from __future__ import annotations

import copy
import os
import resource
import threading
import time
import warnings
import weakref
from concurrent.futures import Future
from typing import Mapping

import h5py
import numpy as np

from . import layout
from .background import BackgroundWorker, InlineWorker
from .base import Storage
from .filelock import lock_path
from .errors import (SnapshotIncompleteError, SnapshotMissingError, StorageClosedError, StorageError,
                     describe_steps)
from .snapshot import Snapshot, check_step, copy_arrays, freeze, make_metadata

__all__ = ["HDF5Storage"]

_COMPRESSIONS = (None, "gzip", "lzf")
_MODES = ("w", "a", "r")
_DAMAGED_FIX = ("HDF5 cannot recover snapshots from it. Write them again to a new path (a gradient's "
                "snapshots are scratch); resumable rollout checkpoints are kept one file each for this reason")
_ROOM_MARGIN = 1 << 20   # HDF5 metadata written with a snapshot and at close; a few KiB in practice


class HDF5Storage(Storage):
    """Snapshots in one HDF5 file, with checksums and crash-safe completion markers.

    ``path``: the file. ``mode``: ``"w"`` creates or truncates it, ``"a"``
    opens an existing file (or creates one) and keeps its complete snapshots,
    ``"r"`` opens one read-only; ``overwrite=False`` makes ``"w"`` refuse to truncate an existing
    file that is not a snapshot file. The path is locked before it is touched: a second writer
    (or a writer while someone reads) gets a `StorageError` and changes nothing. ``compression``: None, ``"gzip"`` (level in
    ``compression_opts``, 0-9) or ``"lzf"``. ``chunk_bytes``: target size of
    the HDF5 chunks that carry the fletcher32 checksums.

    With ``background=True`` (the default), ``write`` copies the arrays and
    returns; a background thread writes them while the caller computes, with at
    most ``max_pending`` snapshots queued (``write`` waits when the disk falls
    behind). A snapshot can be read back as soon as ``write`` returns. An I/O
    error on that thread is raised by the next call on the storage, and by
    ``close()``. ``read`` returns arrays that the caller owns.

    A process killed mid-write leaves the file readable: snapshots completed
    before are intact and the interrupted one is listed by ``incomplete_steps()``.
    """

    def __init__(self, path: str | os.PathLike, compression: str | None = None, mode: str = "w", *,
                 compression_opts: int | None = None, chunk_bytes: int = 2 << 20,
                 background: bool = True, max_pending: int = 2, overwrite: bool = True) -> None:
        super().__init__()
        self.path = os.path.abspath(os.fspath(path))
        _check_options(compression, compression_opts, mode, chunk_bytes, max_pending)
        self.compression, self.compression_opts = compression, compression_opts
        self.mode, self.chunk_bytes, self.max_pending = mode, int(chunk_bytes), max_pending
        _check_path(self.path, mode)
        self._lockfd = lock_path(self.path, exclusive=mode != "r", what="snapshot file", create=True) \
            if mode != "r" or os.path.isfile(self.path) else None
        try:
            if mode == "w" and not overwrite:
                _refuse_foreign(self.path)
            self._file = _open(self.path, mode)
        except BaseException:
            _release(self._lockfd)
            raise
        try:
            layout.tune_cache(self._file)
            if mode == "r":
                _check_format_readonly(self._file)
            else:
                layout.init_file(self._file)
            complete, incomplete = layout.scan(self._file)
        except BaseException as exc:
            self._file.close()
            _release(self._lockfd)
            if isinstance(exc, (OSError, RuntimeError, KeyError, ValueError)):
                raise StorageError(f"{self.path} is damaged: its root metadata cannot be read ({exc}); "
                                   f"{_DAMAGED_FIX}") from exc
            raise
        # Caller-visible state, shared with the I/O thread under _lock:
        # _index holds every readable step (on disk or pending) -> bytes;
        # _pending holds copies not yet committed, so reads never wait on them.
        self._lock = threading.Lock()
        self._index: dict[int, int] = complete
        self._incomplete: set[int] = set(incomplete)
        self._pending: dict[int, tuple[dict, dict]] = {}
        self._prefetched: dict[int, Future] = {}
        self._closed = False
        self._worker = BackgroundWorker(f"HDF5Storage({os.path.basename(self.path)})", max_pending) \
            if background else InlineWorker()
        # Finish queued writes even if the user forgets close(); holds no reference to self.
        self._finalizer = weakref.finalize(self, _shutdown, self._worker, self._file, self.path, self._lockfd)

    def __repr__(self) -> str:
        return (f"HDF5Storage({self.path!r}, compression={self.compression!r}, mode={self.mode!r}, "
                f"steps={len(self._index)})")

    # -- Storage interface --------------------------------------------------
    def write(self, step: int, arrays: Mapping[str, np.ndarray], metadata: dict | None = None) -> None:
        self._check_usable(writing=True)
        step = check_step(step)
        start = time.perf_counter()
        copies = copy_arrays(arrays)
        entry = (copies, make_metadata(step, copies, metadata))
        nbytes = sum(a.nbytes for a in copies.values())
        self._check_room(step, nbytes)
        copied = time.perf_counter() - start  # the copy is I/O done by the caller; the rest is counted by the task
        with self._lock:
            self._pending[step] = entry
            self._index[step] = nbytes
            self._incomplete.discard(step)
            self._prefetched.pop(step, None)
        self._worker.submit(self._write_task, step, entry)
        waited = time.perf_counter() - start
        self._counters.add(snapshots_written=1, bytes_written=nbytes, io_seconds=copied, blocked_seconds=waited)
        self._raise_background_error()

    def read(self, step: int) -> Snapshot:
        self._check_usable()
        step = check_step(step)
        start = time.perf_counter()
        with self._lock:
            entry = self._pending.get(step)
            future = self._prefetched.pop(step, None)
            known = step in self._index
        if entry is not None:
            arrays, metadata = {k: a.copy() for k, a in entry[0].items()}, copy.deepcopy(entry[1])
        elif not known:
            raise self._missing(step)
        else:
            if future is None:
                future = self._worker.submit(self._read_task, step, report=False)
            arrays, metadata = future.result()
        waited = time.perf_counter() - start
        nbytes = sum(a.nbytes for a in arrays.values())
        self._counters.add(snapshots_read=1, bytes_read=nbytes, blocked_seconds=waited,
                           io_seconds=waited if entry is not None else 0.0)
        return freeze(step, arrays, metadata)

    def prefetch(self, step: int) -> None:
        """Start reading ``step`` in the background; the next ``read(step)`` returns it.

        A hint: ignored when the step is still in the write-behind buffer or
        ``max_pending`` prefetches are already waiting to be read.
        """
        self._check_usable()
        step = check_step(step)
        with self._lock:
            if step not in self._index:
                raise self._missing(step)
            if step in self._pending or step in self._prefetched or len(self._prefetched) >= self.max_pending:
                return
        future = self._worker.submit(self._read_task, step, report=False)
        with self._lock:
            self._prefetched[step] = future

    def delete(self, step: int) -> None:
        self._check_usable(writing=True)
        step = check_step(step)
        with self._lock:
            if step not in self._index and step not in self._incomplete:
                raise self._missing(step)
            self._index.pop(step, None)
            self._pending.pop(step, None)
            self._prefetched.pop(step, None)
            self._incomplete.discard(step)
        self._worker.submit(self._delete_task, step)
        self._raise_background_error()

    def steps(self) -> list[int]:
        with self._lock:
            return sorted(self._index)

    def __contains__(self, step: object) -> bool:
        with self._lock:
            return step in self._index

    def incomplete_steps(self) -> list[int]:
        """Steps whose snapshot was interrupted (found on opening, or whose write failed).

        They are not readable; writing the step again replaces them, ``delete``
        removes them.
        """
        with self._lock:
            return sorted(self._incomplete)

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(self._index.values())

    def flush(self) -> None:
        """Wait until every snapshot written so far is complete on disk."""
        self._check_usable()
        start = time.perf_counter()
        self._worker.drain()
        self._counters.add(blocked_seconds=time.perf_counter() - start)
        self._raise_background_error()
        self._check_identity()

    def close(self) -> None:
        """Write everything still queued, close the file, then raise any I/O error left."""
        if self._closed:
            return
        self._closed = True
        self._finalizer.detach()
        try:
            self._worker.stop()
        finally:
            try:
                self._file.close()
            finally:
                try:
                    self._raise_background_error()
                    self._check_identity()
                finally:
                    _release(self._lockfd)

    # -- work done on the I/O thread -----------------------------------------
    def _write_task(self, step: int, entry: tuple[dict, dict]) -> None:
        start = time.perf_counter()
        try:
            group = layout.write_snapshot(self._file, step, entry[0], entry[1], self.compression,
                                          self.compression_opts, self.chunk_bytes)
            layout.commit(self._file, step, group)
        except Exception as exc:
            with self._lock:
                if self._pending.get(step) is entry:
                    del self._pending[step]
                    self._index.pop(step, None)
                    self._incomplete.add(step)
            raise StorageError(
                f"writing the snapshot of step {step} to {self.path} failed in the background: {exc}. "
                "Free disk space or fix the file's permissions, then write that step again"
            ) from exc
        finally:
            self._counters.add(io_seconds=time.perf_counter() - start)
        with self._lock:
            if self._pending.get(step) is entry:
                del self._pending[step]

    def _read_task(self, step: int) -> tuple[dict, dict]:
        start = time.perf_counter()
        try:
            return layout.read_snapshot(self._file, step)
        finally:
            self._counters.add(io_seconds=time.perf_counter() - start)

    def _delete_task(self, step: int) -> None:
        try:
            layout.delete_snapshot(self._file, step)
        except Exception as exc:
            raise StorageError(f"deleting the snapshot of step {step} from {self.path} failed: {exc}") from exc

    # -- helpers ---------------------------------------------------------------
    def _check_room(self, step: int, nbytes: int) -> None:
        """Refuse a write that the disk or the file-size limit cannot hold, before HDF5 tries it.

        HDF5 does not survive running out of space: its metadata cache is left half-flushed and the
        process dies later (SIGSEGV/SIGBUS) with the file damaged. Checking first keeps every
        completed snapshot and the file intact. The estimate is conservative (it ignores space
        HDF5 could reuse from deleted snapshots); a disk that another process fills between this
        check and the write can still reach HDF5's failure.
        """
        with self._lock:
            pending = sum(sum(a.nbytes for a in arrays.values()) for arrays, _ in self._pending.values())
        need = nbytes + pending + nbytes // 8 + _ROOM_MARGIN
        stat = os.statvfs(os.path.dirname(self.path))
        room, why = stat.f_bavail * stat.f_frsize, "the disk is full"
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        if limit != resource.RLIM_INFINITY:
            left = limit - os.path.getsize(self.path)
            if left < room:
                room, why = left, f"the process's file-size limit ({limit} bytes, ulimit -f) is reached"
        if need > room:
            raise StorageError(
                f"no room for the snapshot of step {step} ({nbytes} bytes) in {self.path}: {why} "
                f"({max(room, 0)} bytes left, {need} needed with HDF5's overhead and the queued writes). "
                f"Nothing was written; the snapshots stored so far are intact ({len(self.steps())} of them). "
                "Free space, or give the storage a path on a larger disk")

    def _check_identity(self) -> None:
        """Raise if the path no longer names the file we write: deleted or replaced while open,
        everything written since went to a file nobody can open again."""
        if self._lockfd is None or self.mode == "r":
            return
        mine = os.fstat(self._lockfd)
        try:
            now = os.stat(self.path)
        except FileNotFoundError:
            now = None
        if now is None or (now.st_dev, now.st_ino) != (mine.st_dev, mine.st_ino):
            what = "was deleted" if now is None else "was replaced by another file"
            raise StorageError(f"{self.path} {what} while this storage had it open: the snapshots written to "
                               "it are lost. Keep snapshot files in place until close(), then write them again")

    def _missing(self, step: int) -> StorageError:
        if step in self._incomplete:
            return SnapshotIncompleteError(
                f"the snapshot of step {step} in {self.path} is incomplete: its writer stopped before "
                "the completion marker was set; write that step again")
        return SnapshotMissingError(
            f"{self.path} has no snapshot of step {step}; stored steps: {describe_steps(sorted(self._index))}")

    def _check_usable(self, writing: bool = False) -> None:
        if self._closed:
            raise StorageClosedError(f"HDF5Storage({self.path!r}) was closed; open it again with mode='a'")
        self._raise_background_error()
        if writing and self.mode == "r":
            raise StorageError(f"{self.path} was opened read-only (mode='r'); open it with mode='a' to change it")

    def _raise_background_error(self) -> None:
        error = self._worker.take_error()
        if error is not None:
            raise error


def _check_options(compression, compression_opts, mode, chunk_bytes, max_pending) -> None:
    if compression not in _COMPRESSIONS:
        raise ValueError(f"compression={compression!r} is not supported; use one of {_COMPRESSIONS}")
    if compression_opts is not None and compression != "gzip":
        raise ValueError("compression_opts (the gzip level, 0-9) needs compression='gzip'")
    if compression == "gzip" and compression_opts is not None and compression_opts not in range(10):
        raise ValueError(f"gzip level must be 0-9, got compression_opts={compression_opts!r}")
    if mode not in _MODES:
        raise ValueError(f"mode={mode!r} is not supported; use 'w' (new file), 'a' (append) or 'r' (read)")
    if int(chunk_bytes) < 1:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    if max_pending < 1:
        raise ValueError(f"max_pending must be >= 1, got {max_pending}")


def _check_path(path: str, mode: str) -> None:
    """Fail now, with a message naming the path, rather than an hour into a run."""
    directory = os.path.dirname(path)
    if mode == "r" and not os.path.isfile(path):
        raise StorageError(f"cannot read snapshots from {path}: no such file")
    if mode != "r":
        if not os.path.isdir(directory):
            raise StorageError(f"cannot create snapshot file {path}: directory {directory} does not "
                               "exist; create it first or choose another path")
        target = path if os.path.exists(path) else directory
        if not os.access(target, os.W_OK):
            raise StorageError(f"cannot write snapshot file {path}: no write permission on {target}")


def _refuse_foreign(path: str) -> None:
    """Raise unless ``path`` is absent, empty, or one of our snapshot files (which "w" may replace)."""
    if not os.path.isfile(path) or os.path.getsize(path) == 0:
        return
    try:
        with h5py.File(path, "r", locking=False) as f:
            found = f.attrs.get("format")
    except (OSError, ValueError):
        found = None
    if isinstance(found, bytes):
        found = found.decode()
    if found != layout.FORMAT:
        raise StorageError(f"{path} holds something other than snapshots; nothing was changed. Choose "
                           "another path for the snapshots, or delete the file yourself")


def _open(path: str, mode: str) -> h5py.File:
    try:
        return h5py.File(path, mode, libver=layout.LIBVER, locking=False)   # we hold the lock (filelock.py)
    except (OSError, ValueError, RuntimeError) as exc:
        damaged = "truncated" in str(exc) or "signature" in str(exc) or isinstance(exc, RuntimeError)
        raise StorageError(f"cannot open snapshot file {path} with mode={mode!r}: {exc}"
                           + (f"; the file is damaged (cut short or overwritten): {_DAMAGED_FIX}" if damaged else "")
                           ) from exc


def _check_format_readonly(f: h5py.File) -> None:
    layout.check_format(f, writing=False)


def _release(fd) -> None:
    if fd is not None:
        os.close(fd)


def _shutdown(worker, file, path, lockfd) -> None:
    """Finalizer for an HDF5Storage that was never closed: keep its data, warn about errors."""
    try:
        worker.stop()
        error = worker.take_error()
        if error is not None:
            warnings.warn(f"HDF5Storage({path!r}) was not closed and a background write failed: {error}",
                          RuntimeWarning, stacklevel=1)
    finally:
        file.close()
        _release(lockfd)
