"""The on-disk layout of HDF5 snapshot files, readable with plain h5py.

::

    /                         attrs: format="checkpoint-snapshots", format_version=1
    /snapshots/               one group per snapshot, named by the zero-padded step
    /snapshots/000000000042/  attrs: step (int64), time (float64),
                                     shapes (JSON {name: [dims]}), dtypes (JSON {name: "<f4"}),
                                     metadata (JSON of the user's metadata),
                                     complete (uint8: 0 while writing, 1 once durable)
    /snapshots/000000000042/x one dataset per array: chunked, fletcher32 checksum,
                              optional gzip/lzf; 0-d arrays are stored with shape (1,)

The completion marker is created as 0 with the group and set to 1 only after
every dataset and attribute has been flushed to the file, then flushed itself.
A process killed at any point before that leaves a group whose marker is 0,
which readers report as incomplete instead of returning half-written data.

These functions run on whichever single thread owns the h5py.File; they do no
locking and know nothing about queues.
"""

from __future__ import annotations

import json
import math

import h5py
import numpy as np

from .errors import SnapshotCorruptError, SnapshotIncompleteError, SnapshotMissingError, StorageError

__all__ = [
    "FORMAT", "FORMAT_VERSION", "SNAPSHOTS", "group_name", "chunk_shape", "init_file",
    "write_snapshot", "commit", "mark_complete", "read_snapshot", "delete_snapshot", "scan",
]

FORMAT = "checkpoint-snapshots"
FORMAT_VERSION = 1
SNAPSHOTS = "snapshots"
_USER_ATTRS = ("step", "time", "shapes", "dtypes")


def group_name(step: int) -> str:
    """Zero-padded so that h5ls and HDFView list snapshots in step order."""
    return f"{step:012d}"


def chunk_shape(shape: tuple[int, ...], itemsize: int, target_bytes: int) -> tuple[int, ...]:
    """Largest chunk of at most ``target_bytes`` made by halving leading dimensions.

    Big chunks keep the fletcher32 filter's per-chunk overhead small; splitting
    the slowest-varying dimension first keeps every chunk one contiguous slab
    of the C-ordered array.
    """
    chunk = list(shape)
    for axis in range(len(chunk)):
        while chunk[axis] > 1 and math.prod(chunk) * itemsize > target_bytes:
            chunk[axis] = (chunk[axis] + 1) // 2
    return tuple(chunk)


def init_file(f: h5py.File) -> None:
    """Stamp a new file with the format, or check that an existing one has it."""
    if SNAPSHOTS not in f and len(f) == 0:
        f.attrs["format"] = FORMAT
        f.attrs["format_version"] = FORMAT_VERSION
        f.create_group(SNAPSHOTS)
        f.flush()
        return
    found = f.attrs.get("format")
    if isinstance(found, bytes):
        found = found.decode()
    if found != FORMAT or SNAPSHOTS not in f:
        raise StorageError(
            f"{f.filename} is an HDF5 file but not a snapshot file (no '/{SNAPSHOTS}' group "
            f"with format={FORMAT!r}); pick another path or open it with mode='w' to overwrite it"
        )
    version = int(f.attrs.get("format_version", -1))
    if version != FORMAT_VERSION:
        raise StorageError(
            f"{f.filename} has snapshot format version {version}; this code reads version "
            f"{FORMAT_VERSION}"
        )


def write_snapshot(f: h5py.File, step: int, arrays: dict[str, np.ndarray], metadata: dict,
                   compression: str | None, compression_opts, chunk_bytes: int) -> None:
    """Write one snapshot's group with its marker still 0; ``commit`` finishes it."""
    snapshots = f[SNAPSHOTS]
    name = group_name(step)
    if name in snapshots:
        del snapshots[name]
    group = snapshots.create_group(name)
    # The marker exists from the start so that setting it later rewrites a byte
    # in place instead of growing the object header.
    group.attrs["complete"] = np.uint8(0)
    # On disk before any data, so that a crash from here on leaves a group that
    # reopening reports as incomplete rather than no trace at all.
    f.flush()
    for key, array in arrays.items():
        stored = array.reshape(1) if array.ndim == 0 else array
        if stored.size == 0:
            # Nothing to checksum, and HDF5 cannot chunk an empty extent.
            group.create_dataset(key, data=stored)
            continue
        group.create_dataset(
            key, data=stored, chunks=chunk_shape(stored.shape, stored.itemsize, chunk_bytes),
            fletcher32=True, compression=compression, compression_opts=compression_opts,
        )
    group.attrs["step"] = np.int64(step)
    group.attrs["time"] = np.float64(metadata["time"])
    group.attrs["shapes"] = json.dumps({k: list(v) for k, v in metadata["shapes"].items()})
    group.attrs["dtypes"] = json.dumps(metadata["dtypes"])
    group.attrs["metadata"] = json.dumps({k: v for k, v in metadata.items() if k not in _USER_ATTRS})


def mark_complete(f: h5py.File, step: int) -> None:
    f[SNAPSHOTS][group_name(step)].attrs.modify("complete", np.uint8(1))


def commit(f: h5py.File, step: int) -> None:
    """Make a written snapshot durable: data first, then the marker.

    Two flushes, because HDF5 writes its cached metadata in an order of its own
    choosing: the first puts every dataset in the file, the second the marker,
    so no crash can leave a marker that points at missing data.
    """
    f.flush()
    mark_complete(f, step)
    f.flush()


def delete_snapshot(f: h5py.File, step: int) -> None:
    snapshots = f[SNAPSHOTS]
    name = group_name(step)
    if name in snapshots:
        del snapshots[name]
        f.flush()


def scan(f: h5py.File) -> tuple[dict[int, int], list[int]]:
    """Return ({step: nbytes} of complete snapshots, sorted incomplete steps)."""
    complete, incomplete = {}, []
    try:
        names = list(f[SNAPSHOTS])
    except (OSError, KeyError, RuntimeError) as exc:
        raise StorageError(
            f"cannot list the snapshots in {f.filename}: {exc}; the file is damaged beyond "
            "what completion markers protect against"
        ) from exc
    for name in names:
        if not name.isdigit():
            continue  # not ours; plain h5py users may add groups
        step = int(name)
        try:
            group = f[SNAPSHOTS][name]
            if int(group.attrs.get("complete", 0)) != 1:
                incomplete.append(step)
                continue
            shapes, dtypes = _manifest(group)
            complete[step] = sum(math.prod(shapes[k]) * np.dtype(dtypes[k]).itemsize for k in shapes)
        except (OSError, KeyError, ValueError, TypeError, RuntimeError):
            incomplete.append(step)
    return complete, sorted(incomplete)


def read_snapshot(f: h5py.File, step: int) -> tuple[dict[str, np.ndarray], dict]:
    """Read and check one snapshot; every failure names the file and the step."""
    where = f"snapshot of step {step} in {f.filename}"
    group = f[SNAPSHOTS].get(group_name(step))
    if group is None:
        raise SnapshotMissingError(f"there is no {where}")
    try:
        if int(group.attrs.get("complete", 0)) != 1:
            raise SnapshotIncompleteError(
                f"the {where} is incomplete: its writer stopped before the completion marker "
                "was set (the process was probably killed); write that step again"
            )
        shapes, dtypes = _manifest(group)
        metadata = {"step": step, "time": float(group.attrs["time"]),
                    "shapes": shapes, "dtypes": dtypes, **json.loads(group.attrs["metadata"])}
    except StorageError:
        raise
    except (OSError, KeyError, ValueError, TypeError, RuntimeError) as exc:
        raise SnapshotCorruptError(f"the {where} has damaged metadata: {exc}") from exc
    extra = sorted(set(group) - set(shapes))
    if extra:
        raise SnapshotCorruptError(f"the {where} holds arrays not in its manifest: {extra}")
    return {key: _read_array(group, key, shapes[key], dtypes[key], where) for key in shapes}, metadata


def _manifest(group: h5py.Group) -> tuple[dict[str, tuple], dict[str, str]]:
    shapes = {k: tuple(v) for k, v in json.loads(group.attrs["shapes"]).items()}
    dtypes = json.loads(group.attrs["dtypes"])
    if set(shapes) != set(dtypes):
        raise ValueError("the 'shapes' and 'dtypes' attributes name different arrays")
    return shapes, dtypes


def _read_array(group: h5py.Group, key: str, shape: tuple, dtype: str, where: str) -> np.ndarray:
    dataset = group.get(key)
    if not isinstance(dataset, h5py.Dataset):
        raise SnapshotCorruptError(f"the {where} lacks its array {key!r}")
    stored_shape = (1,) if shape == () else shape
    if dataset.shape != stored_shape or dataset.dtype.str != dtype:
        raise SnapshotCorruptError(
            f"array {key!r} of the {where} is {dataset.dtype.str}{list(dataset.shape)} on disk "
            f"but its metadata says {dtype}{list(stored_shape)}"
        )
    out = np.empty(stored_shape, dtype=dtype)
    if out.size:
        try:
            dataset.read_direct(out)
        except (OSError, RuntimeError, ValueError) as exc:
            raise SnapshotCorruptError(
                f"array {key!r} of the {where} failed its checksum or could not be read "
                f"({exc}); the file was damaged after it was written"
            ) from exc
    return out.reshape(shape)
