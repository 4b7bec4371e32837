"""Crash-safe checkpoints a rollout resumes from: one HDF5 file per checkpoint, in one directory.

A kill can lose at most the checkpoint being written, by construction rather than by luck: HDF5
does not make its own index updates atomic, so no file that holds a completed checkpoint is ever
opened for writing again. Layout of a checkpoint directory ``run.ckpt/``::

    run.ckpt/step-000000000040.h5    a complete checkpoint: a snapshot file (layout.py) holding the
    run.ckpt/step-000000000060.h5    one snapshot /snapshots/000000000060, complete=1
    run.ckpt/.step-000000000080.h5.tmp   the one being written; never read, removed on the next open

Writing step n: the file is built in memory (HDF5's "core" driver), written to the ``.tmp`` name
with plain ``os.write`` (so a full disk is an ``OSError`` we handle, never a crash inside HDF5),
flushed and fsynced, renamed to ``step-n.h5`` (atomic), and the directory is fsynced so the rename
itself survives a power cut. Only then are checkpoints older than the newest `KEEP` deleted.

Each file is a normal snapshot file: ``HDF5Storage(file, mode="r")`` or plain h5py read it::

    with h5py.File("run.ckpt/step-000000000060.h5", "r") as f:
        x = f["snapshots/000000000060/x"][...]

One writer at a time: the writer holds an exclusive ``flock`` on the directory itself, taken before
anything in it is touched, so a second job on the same path fails at once and changes nothing.
"""

from __future__ import annotations

import errno
import os
import re
import warnings

import h5py

from . import layout
from .errors import SnapshotCorruptError, StorageError
from .filelock import lock_path
from .snapshot import Snapshot, check_step, copy_arrays, freeze, make_metadata

__all__ = ["CheckpointDirectory", "KEEP", "checkpoint_file"]

KEEP = 2            # complete checkpoints kept: the newest, and one more in case it is damaged later
_NAME = re.compile(r"^step-(\d{12})\.h5$")
_TMP = re.compile(r"^\.step-\d{12}\.h5\.tmp$")


def checkpoint_file(directory: str, step: int) -> str:
    return os.path.join(directory, f"step-{step:012d}.h5")


def list_checkpoints(directory: str) -> list[int]:
    """Steps of the complete checkpoints in ``directory``, ascending."""
    return sorted(int(m.group(1)) for m in map(_NAME.match, os.listdir(directory)) if m)


def _is_ours(name: str) -> bool:
    return bool(_NAME.match(name) or _TMP.match(name))


class CheckpointDirectory:
    """The checkpoints of one rollout in directory ``path`` (see the module docstring).

    ``mode="w"``: a new run; the directory is created, and must be empty or, with
    ``overwrite=True``, hold only checkpoints (which are then deleted). ``mode="a"``: continue a
    run (``resume``); the directory must exist and hold at least one checkpoint.
    """

    def __init__(self, path, mode: str = "w", *, overwrite: bool = False) -> None:
        self.path = os.path.abspath(os.fspath(path))
        if mode not in ("w", "a"):
            raise ValueError(f"mode={mode!r}; use 'w' (new run) or 'a' (resume)")
        self._check_path(mode)
        self._dirfd = self._lock()
        try:
            names = os.listdir(self.path)
            foreign = sorted(n for n in names if not _is_ours(n))
            if foreign:
                raise StorageError(
                    f"{self.path} holds files that are not checkpoints ({', '.join(foreign[:5])}); "
                    "choose another checkpoint= path")
            for name in names:                  # a killed writer's partial file: never read
                if _TMP.match(name):
                    os.unlink(os.path.join(self.path, name))
            self._steps = list_checkpoints(self.path)
            if mode == "w" and self._steps:
                if not overwrite:
                    raise StorageError(
                        f"{self.path} holds the checkpoints of an earlier run (steps "
                        f"{', '.join(map(str, self._steps))}); continue it with model.resume({self.path!r}) "
                        "or start again with overwrite=True")
                for step in self._steps:
                    os.unlink(checkpoint_file(self.path, step))
                self._steps = []
                os.fsync(self._dirfd)
        except BaseException:
            self.close()
            raise

    def _check_path(self, mode: str) -> None:
        if mode == "a":
            if not os.path.isdir(self.path):
                what = ("a file, not a checkpoint directory (rollouts used to write one snapshot file: read its "
                        "snapshots with HDF5Storage(path, mode='r'))" if os.path.exists(self.path) else
                        "no such directory")
                raise StorageError(f"cannot resume from {self.path}: {what}")
            return
        if os.path.exists(self.path) and not os.path.isdir(self.path):
            raise StorageError(
                f"checkpoint={self.path} is an existing file, not a checkpoint directory; checkpoints "
                "are a directory of HDF5 files: choose another path (nothing was changed)")
        parent = os.path.dirname(self.path)
        if not os.path.isdir(parent):
            raise StorageError(f"cannot create checkpoint directory {self.path}: directory {parent} does "
                               "not exist; create it first or choose another path")
        try:
            os.makedirs(self.path, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot create checkpoint directory {self.path}: {exc.strerror}; fix the "
                               "permissions or choose another path") from exc

    def _lock(self) -> int:
        return lock_path(self.path, exclusive=True, what="checkpoint directory")

    # -- the interface a rollout uses ------------------------------------------
    def steps(self) -> list[int]:
        return list(self._steps)

    def __contains__(self, step) -> bool:
        return step in self._steps

    def write(self, step: int, arrays, metadata: dict | None = None) -> None:
        """Make the checkpoint of ``step`` durable, then delete all but the newest `KEEP`.

        On a full disk (or any I/O error) raises `StorageError`; the earlier checkpoints are
        untouched and the partial file is removed.
        """
        self._check_open()
        step = check_step(step)
        copies = copy_arrays(arrays)
        image = _file_image(step, copies, make_metadata(step, copies, metadata))
        final = checkpoint_file(self.path, step)
        tmp = os.path.join(self.path, f".step-{step:012d}.h5.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                view = memoryview(image)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, final)
            os.fsync(self._dirfd)
        except OSError as exc:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            hint = ("the disk is full or a file-size limit was hit: free space or raise the limit"
                    if exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT) else
                    "fix the directory's permissions or choose another path")
            raise StorageError(
                f"writing the checkpoint of step {step} to {final} failed ({exc.strerror or exc}); {hint}. "
                f"The checkpoints written before it are intact: steps {self._steps}") from exc
        if step not in self._steps:
            self._steps = sorted([*self._steps, step])
        for old in self._steps[:-KEEP]:
            try:
                os.unlink(checkpoint_file(self.path, old))
            except FileNotFoundError:
                pass
        self._steps = self._steps[-KEEP:]

    def read_latest(self) -> Snapshot:
        """The newest checkpoint that reads back intact (checksums checked); an older one, with a
        warning, if the newest was damaged after it was written."""
        self._check_open()
        errors = []
        for step in reversed(self._steps):
            try:
                snap = read_checkpoint(checkpoint_file(self.path, step), step)
            except StorageError as exc:
                errors.append(str(exc))
                continue
            if errors:
                warnings.warn(f"resuming from an older checkpoint (step {step}): {'; '.join(errors)}",
                              RuntimeWarning, stacklevel=3)
            return snap
        if not errors:
            raise StorageError(f"{self.path} holds no checkpoint to resume from")
        raise SnapshotCorruptError(f"no checkpoint in {self.path} reads back intact: {'; '.join(errors)}")

    def close(self) -> None:
        if self._dirfd is not None:
            os.close(self._dirfd)           # releases the lock
            self._dirfd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._dirfd is None:
            raise StorageError(f"the checkpoint directory {self.path} was closed")


def _file_image(step: int, arrays: dict, metadata: dict) -> bytes:
    """The bytes of a snapshot file holding one complete snapshot, built in memory."""
    with h5py.File(f"checkpoint-{step}.h5", "w", driver="core", backing_store=False,
                   libver=layout.LIBVER) as f:
        layout.init_file(f)
        group = layout.write_snapshot(f, step, arrays, metadata, None, None, 2 << 20)
        layout.commit(f, step, group)
        f.flush()
        return f.id.get_file_image()


def read_checkpoint(path: str, step: int) -> Snapshot:
    """One checkpoint file, read and checked; every failure is a StorageError naming the file."""
    try:
        with h5py.File(path, "r", locking=False) as f:
            arrays, metadata = layout.read_snapshot(f, step)
    except StorageError:
        raise
    except (OSError, RuntimeError, KeyError, ValueError) as exc:
        raise SnapshotCorruptError(f"the checkpoint {path} cannot be read: {exc}") from exc
    return freeze(step, arrays, metadata)

