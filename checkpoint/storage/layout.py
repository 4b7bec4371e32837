"""The on-disk layout of HDF5 snapshot files, readable with plain h5py.

::

    /                         attrs: format="checkpoint-snapshots", format_version=2
    /snapshots/               one group per snapshot, named by the zero-padded step
    /snapshots/000000000042/  attrs: complete (uint8: 0 while writing, 1 once durable)
                                     manifest (JSON string: {"step", "time",
                                               "shapes": {name: [dims]},
                                               "dtypes": {name: "<f4"}, plus the
                                               user's metadata keys})
    /snapshots/000000000042/x one dataset per array: chunked, fletcher32 checksum,
                              optional gzip/lzf; 0-d arrays are stored with shape (1,)

With plain h5py::

    group = h5py.File("run.h5", "r")["snapshots/000000000042"]
    assert group.attrs["complete"] == 1
    manifest = json.loads(group.attrs["manifest"])
    x = group["x"][...]          # h5py checks the fletcher32 checksums

The completion marker is created as 0 with the group and set to 1 only after
every dataset has been flushed to the file, then flushed itself. A process
killed at any point before that leaves a group whose marker is 0, which
readers report as incomplete instead of returning half-written data.

Objects are made with h5py's low-level API (h5g/h5d/h5a): it does the same
HDF5 calls as ``group.create_dataset`` and ``group.attrs[...]`` at about half
the cost, which matters for small snapshots written every few steps. Files use
the HDF5 1.8 object formats (``LIBVER``): compact group headers with checksums,
readable by any h5py. Not the 1.10 formats: their superblock marks a file
"open for writing" and HDF5 then refuses to reopen a file whose writer was
killed until someone runs ``h5clear``, which would defeat the markers.

These functions run on whichever single thread owns the h5py.File; they do no
locking and know nothing about queues.
"""

from __future__ import annotations

import functools
import json
import math

import h5py
import numpy as np
from h5py import h5a, h5d, h5f, h5g, h5p, h5s, h5t, h5z

from .errors import SnapshotCorruptError, SnapshotIncompleteError, SnapshotMissingError, StorageError

__all__ = [
    "FORMAT", "FORMAT_VERSION", "SNAPSHOTS", "LIBVER", "group_name", "chunk_shape", "tune_cache",
    "init_file",
    "write_snapshot", "commit", "mark_complete", "read_snapshot", "delete_snapshot", "scan",
]

FORMAT = "checkpoint-snapshots"
FORMAT_VERSION = 2
SNAPSHOTS = "snapshots"
LIBVER = ("v108", "latest")
_COMPLETE, _MANIFEST = b"complete", b"manifest"
_METADATA_CACHE_BYTES = 256 << 10
_GZIP_DEFAULT_LEVEL = 4  # h5py's default, so files match what create_dataset(compression="gzip") makes
_SCALAR = h5s.create(h5s.SCALAR)
_U8 = h5t.STD_U8LE
_NOT_COMPLETE, _COMPLETED = np.array(0, np.uint8), np.array(1, np.uint8)
_UTF8_NAMES = h5p.create(h5p.LINK_CREATE)  # array names as h5py's high-level API stores them
_UTF8_NAMES.set_char_encoding(h5t.CSET_UTF8)


def group_name(step: int) -> str:
    """Zero-padded so that h5ls and HDFView list snapshots in step order."""
    return f"{step:012d}"


def chunk_shape(shape: tuple[int, ...], itemsize: int, target_bytes: int) -> tuple[int, ...]:
    """Largest chunk of at most ``target_bytes`` made by halving leading dimensions.

    Splitting the slowest-varying dimension first keeps every chunk one
    contiguous slab of the C-ordered array; an array smaller than the target is
    one chunk, so a small snapshot costs one checksum and one write per array.
    """
    chunk = list(shape)
    for axis in range(len(chunk)):
        while chunk[axis] > 1 and math.prod(chunk) * itemsize > target_bytes:
            chunk[axis] = (chunk[axis] + 1) // 2
    return tuple(chunk)


def tune_cache(f: h5py.File) -> None:
    """Keep HDF5's metadata cache small and fixed in size.

    Every flush walks the whole cache, and by default the cache grows (to
    32 MiB) with the number of snapshots in the file: after 3000 snapshots
    each of a snapshot's flushes took 100-300 us instead of 10-70 us. Evicting
    clean entries of finished snapshots costs nothing, since only the newest
    snapshot's objects are in use.
    """
    config = f.id.get_mdc_config()
    config.set_initial_size = True
    config.initial_size = config.max_size = _METADATA_CACHE_BYTES
    config.min_size = min(config.min_size, _METADATA_CACHE_BYTES)
    config.incr_mode = config.flash_incr_mode = config.decr_mode = 0  # no adaptive resizing
    f.id.set_mdc_config(config)


def init_file(f: h5py.File) -> None:
    """Stamp a new file with the format, or check that an existing one has it."""
    if SNAPSHOTS not in f and len(f) == 0:
        f.attrs["format"] = FORMAT
        f.attrs["format_version"] = FORMAT_VERSION
        f.create_group(SNAPSHOTS)
        f.flush()
        return
    check_format(f, writing=True)


def check_format(f: h5py.File, writing: bool) -> None:
    """Raise unless ``f`` is a snapshot file of the version this code reads and writes."""
    found = f.attrs.get("format")
    if isinstance(found, bytes):
        found = found.decode()
    if found != FORMAT or SNAPSHOTS not in f:
        fix = "pick another path or open it with mode='w' to overwrite it" if writing else \
            "it was not written by HDF5Storage"
        raise StorageError(
            f"{f.filename} is an HDF5 file but not a snapshot file (no '/{SNAPSHOTS}' group "
            f"with format={FORMAT!r}); {fix}"
        )
    version = int(f.attrs.get("format_version", -1))
    if version != FORMAT_VERSION:
        raise StorageError(
            f"{f.filename} has snapshot format version {version}; this code reads version "
            f"{FORMAT_VERSION}: read it with the version of this package that wrote it"
        )


def write_snapshot(f: h5py.File, step: int, arrays: dict[str, np.ndarray], metadata: dict,
                   compression: str | None, compression_opts, chunk_bytes: int) -> h5g.GroupID:
    """Write one snapshot's group with its marker still 0; ``commit`` finishes it.

    Returns the open group, for ``commit``.
    """
    snapshots = h5g.open(f.id, SNAPSHOTS.encode())
    name = group_name(step).encode()
    if snapshots.links.exists(name):
        snapshots.unlink(name)
    group = h5g.create(snapshots, name, gcpl=_GROUP_CREATE)
    # The marker exists from the start so that setting it later rewrites a byte
    # in place instead of growing the object header.
    h5a.create(group, _COMPLETE, _U8, _SCALAR).write(_NOT_COMPLETE)
    _write_string_attr(group, _MANIFEST, json.dumps(metadata))
    # On disk before any data, so that a crash from here on leaves a group that
    # reopening reports as incomplete rather than no trace at all.
    h5f.flush(f.id)
    for key, array in arrays.items():
        stored = array.reshape(1) if array.ndim == 0 else array
        file_type = _file_type(stored.dtype)
        chunks = chunk_shape(stored.shape, stored.itemsize, chunk_bytes) if stored.size else None
        dataset = h5d.create(group, key.encode(), file_type, h5s.create_simple(stored.shape),
                             dcpl=_dataset_create(chunks, compression, compression_opts), lcpl=_UTF8_NAMES)
        if stored.size:
            dataset.write(h5s.ALL, h5s.ALL, stored, mtype=file_type)
    return group


def mark_complete(f: h5py.File, step: int, group: h5g.GroupID | None = None) -> None:
    """Set the marker of the snapshot of ``step`` (``group``, if it is open) to 1."""
    if group is None:
        group = h5g.open(f.id, f"{SNAPSHOTS}/{group_name(step)}".encode())
    h5a.open(group, _COMPLETE).write(_COMPLETED)


def commit(f: h5py.File, step: int, group: h5g.GroupID | None = None) -> None:
    """Make a written snapshot durable: data first, then the marker.

    Two flushes, because HDF5 writes its cached metadata in an order of its own
    choosing: the first puts every dataset in the file, the second the marker,
    so no crash can leave a marker that points at missing data.
    """
    h5f.flush(f.id)
    mark_complete(f, step, group)
    h5f.flush(f.id)


def delete_snapshot(f: h5py.File, step: int) -> None:
    snapshots = f[SNAPSHOTS].id
    name = group_name(step).encode()
    if snapshots.links.exists(name):
        snapshots.unlink(name)
        f.flush()


def scan(f: h5py.File) -> tuple[dict[int, int], list[int]]:
    """Return ({step: nbytes} of complete snapshots, sorted incomplete steps)."""
    complete, incomplete = {}, []
    try:
        snapshots = f[SNAPSHOTS]
        names = list(snapshots)
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
            group = h5g.open(snapshots.id, name.encode())
            if not _is_complete(group):
                incomplete.append(step)
                continue
            manifest = _manifest(group)
            complete[step] = sum(math.prod(shape) * np.dtype(manifest["dtypes"][k]).itemsize
                                 for k, shape in manifest["shapes"].items())
        except (OSError, KeyError, ValueError, TypeError, RuntimeError):
            incomplete.append(step)
    return complete, sorted(incomplete)


def read_snapshot(f: h5py.File, step: int) -> tuple[dict[str, np.ndarray], dict]:
    """Read and check one snapshot; every failure names the file and the step."""
    where = f"snapshot of step {step} in {f.filename}"
    snapshots = f[SNAPSHOTS].id
    name = group_name(step).encode()
    if not snapshots.links.exists(name):
        raise SnapshotMissingError(f"there is no {where}")
    try:
        group = h5g.open(snapshots, name)
        if not _is_complete(group):
            raise SnapshotIncompleteError(
                f"the {where} is incomplete: its writer stopped before the completion marker "
                "was set (the process was probably killed); write that step again"
            )
        metadata = _manifest(group)
        members = {group.get_objname_by_idx(i).decode() for i in range(group.get_num_objs())}
    except StorageError:
        raise
    except (OSError, KeyError, ValueError, TypeError, RuntimeError) as exc:
        raise SnapshotCorruptError(f"the {where} has damaged metadata: {exc}") from exc
    shapes, dtypes = metadata["shapes"], metadata["dtypes"]
    extra = sorted(members - set(shapes))
    if extra:
        raise SnapshotCorruptError(f"the {where} holds arrays not in its manifest: {extra}")
    arrays = {key: _read_array(group, key, shapes[key], dtypes[key], members, where) for key in shapes}
    return arrays, metadata


def _untimed(kind) -> h5p.PropID:
    # No modification times: they would dirty each object's header on every
    # write (h5py's high-level API turns them off too).
    plist = h5p.create(kind)
    plist.set_obj_track_times(False)
    return plist


_GROUP_CREATE = _untimed(h5p.GROUP_CREATE)


# The two memos below save ~20 us per array of a small snapshot; HDF5 copies a
# property list into each dataset it creates, so sharing them is safe.
@functools.lru_cache(maxsize=64)
def _dataset_create(chunks: tuple | None, compression: str | None, compression_opts) -> h5p.PropID:
    dcpl = _untimed(h5p.DATASET_CREATE)
    if chunks is None:  # HDF5 cannot chunk an empty extent, and there is nothing to checksum
        return dcpl
    dcpl.set_chunk(chunks)
    if compression == "gzip":
        dcpl.set_deflate(_GZIP_DEFAULT_LEVEL if compression_opts is None else compression_opts)
    elif compression == "lzf":
        dcpl.set_filter(h5z.FILTER_LZF, h5z.FLAG_OPTIONAL)
    dcpl.set_fletcher32()  # after compression, as h5py orders them
    return dcpl


@functools.lru_cache(maxsize=64)
def _file_type(dtype: np.dtype) -> h5t.TypeID:
    return h5t.py_create(dtype, logical=True)


def _write_string_attr(obj, name: bytes, text: str) -> None:
    data = np.array(text.encode())
    string_type = h5t.C_S1.copy()
    string_type.set_size(max(data.itemsize, 1))
    string_type.set_cset(h5t.CSET_UTF8)
    h5a.create(obj, name, string_type, _SCALAR).write(data, mtype=string_type)


def _is_complete(group) -> bool:
    # Reads go through h5py's high-level attributes, which convert whatever
    # string or integer type a plain-h5py user may have rewritten them with.
    return int(h5py.Group(group).attrs.get("complete", 0)) == 1


def _manifest(group) -> dict:
    """The snapshot's metadata, with shapes as tuples; raises ValueError/KeyError if malformed."""
    metadata = json.loads(h5py.Group(group).attrs["manifest"])
    if not isinstance(metadata, dict):
        raise ValueError("the 'manifest' attribute is not a JSON object")
    shapes = {k: tuple(v) for k, v in metadata["shapes"].items()}
    if set(shapes) != set(metadata["dtypes"]):
        raise ValueError("the manifest's 'shapes' and 'dtypes' name different arrays")
    metadata["shapes"] = shapes
    return metadata


def _read_array(group, key: str, shape: tuple, dtype: str, members: set, where: str) -> np.ndarray:
    try:
        dataset = h5d.open(group, key.encode()) if key in members else None
    except (OSError, KeyError, RuntimeError):
        dataset = None  # a link to something that is not a dataset
    if dataset is None:
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
            dataset.read(h5s.ALL, h5s.ALL, out, mtype=dataset.get_type())
        except (OSError, RuntimeError, ValueError) as exc:
            raise SnapshotCorruptError(
                f"array {key!r} of the {where} failed its checksum or could not be read "
                f"({exc}); the file was damaged after it was written"
            ) from exc
    return out.reshape(shape)
