"""HDF5Storage: the documented layout, checksums, completion markers, errors."""

import json
import os

import h5py
import numpy as np
import pytest

from checkpoint.storage import (HDF5Storage, SnapshotCorruptError, SnapshotIncompleteError,
                                SnapshotMissingError, StorageError, layout)


def test_layout_is_readable_with_plain_h5py(tmp_path):
    path = tmp_path / "run.h5"
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    with HDF5Storage(path, compression="gzip") as store:
        store.write(42, {"x": x, "n": np.array(5)}, {"time": 0.5, "dt": 0.01})
    with h5py.File(path, "r") as f:
        assert f.attrs["format"] == "checkpoint-snapshots" and f.attrs["format_version"] == 2
        group = f["/snapshots/000000000042"]
        assert group.attrs["complete"] == 1
        assert json.loads(group.attrs["manifest"]) == {
            "step": 42, "time": 0.5, "shapes": {"x": [4, 3], "n": []}, "dtypes": {"x": "<f4", "n": "<i8"},
            "dt": 0.01}
        assert group["x"][...].tobytes() == x.tobytes()
        assert group["x"].fletcher32 and group["x"].compression == "gzip"
        assert group["n"][...].tolist() == [5]  # 0-d arrays are stored with shape (1,)


def test_chunks_are_large_slabs_of_leading_rows():
    assert layout.chunk_shape((1 << 24,), 4, 2 << 20) == (1 << 19,)
    assert layout.chunk_shape((1000, 3), 8, 2 << 20) == (1000, 3)
    assert layout.chunk_shape((1 << 20, 3), 8, 1 << 20) == (1 << 15, 3)
    assert layout.chunk_shape((3, 1 << 20), 8, 1 << 20) == (1, 1 << 17)


def corrupt_first_chunk(path, step, name):
    """Flip bytes in the middle of the first chunk of one dataset, on disk."""
    with h5py.File(path, "r") as f:
        info = f[f"snapshots/{step:012d}/{name}"].id.get_chunk_info(0)
    with open(path, "r+b") as fh:
        fh.seek(info.byte_offset + info.size // 2)
        data = fh.read(4)
        fh.seek(info.byte_offset + info.size // 2)
        fh.write(bytes(b ^ 0xFF for b in data))


@pytest.mark.parametrize("compression", [None, "lzf"])
def test_checksum_detects_bytes_flipped_on_disk(tmp_path, compression):
    path = tmp_path / "c.h5"
    with HDF5Storage(path, compression=compression) as store:
        store.write(7, {"x": np.linspace(0, 1, 100_000), "y": np.ones(10)})
        store.write(8, {"x": np.linspace(0, 1, 100_000)})
    corrupt_first_chunk(path, 7, "x")
    with HDF5Storage(path, mode="a") as store:
        assert store.steps() == [7, 8]  # corruption is found on read, where it is checked
        with pytest.raises(SnapshotCorruptError) as info:
            store.read(7)
        message = str(info.value)
        assert "step 7" in message and str(path) in message and "'x'" in message and "checksum" in message
        assert store.read(8).arrays["x"].tobytes() == np.linspace(0, 1, 100_000).tobytes()


def test_shape_or_dtype_that_disagree_with_metadata_are_refused(tmp_path):
    path = tmp_path / "m.h5"
    with HDF5Storage(path) as store:
        store.write(1, {"x": np.zeros(4)})
    with h5py.File(path, "a") as f:
        group = f["snapshots/000000000001"]
        manifest = json.loads(group.attrs["manifest"])
        group.attrs["manifest"] = json.dumps({**manifest, "dtypes": {"x": "<f4"}})
    with HDF5Storage(path, mode="r") as store:
        with pytest.raises(SnapshotCorruptError, match=r"'x' of the snapshot of step 1 in .*m\.h5 is <f8\[4\]"):
            store.read(1)


def test_missing_dataset_is_reported(tmp_path):
    path = tmp_path / "d.h5"
    with HDF5Storage(path) as store:
        store.write(1, {"x": np.zeros(4), "v": np.zeros(2)})
    with h5py.File(path, "a") as f:
        del f["snapshots/000000000001/v"]
    with HDF5Storage(path, mode="r") as store, pytest.raises(SnapshotCorruptError, match="lacks its array 'v'"):
        store.read(1)


def test_reopening_lists_complete_snapshots_and_reports_incomplete(tmp_path, monkeypatch):
    path = tmp_path / "i.h5"
    with HDF5Storage(path, background=False) as store:
        store.write(1, {"x": np.arange(3.0)})
        # A writer that dies before its marker: simulated by a marker that never gets set.
        monkeypatch.setattr(layout, "mark_complete", lambda f, step, group=None: None)
        store.write(2, {"x": np.arange(4.0)})
        monkeypatch.undo()
    with HDF5Storage(path, mode="a") as store:
        assert store.steps() == [1] and store.incomplete_steps() == [2]
        assert 2 not in store
        with pytest.raises(SnapshotIncompleteError, match=r"step 2 in .*i\.h5 is incomplete"):
            store.read(2)
        store.write(2, {"x": np.arange(5.0)})  # writing the step again repairs it
        assert store.incomplete_steps() == [] and store.steps() == [1, 2]
    with HDF5Storage(path, mode="r") as store:
        assert store.read(2).arrays["x"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_mode_w_truncates_and_mode_r_refuses_writes(tmp_path):
    path = tmp_path / "t.h5"
    with HDF5Storage(path) as store:
        store.write(1, {"x": np.zeros(1)})
    with HDF5Storage(path, mode="r") as store:
        assert store.steps() == [1]
        with pytest.raises(StorageError, match="read-only"):
            store.write(2, {"x": np.zeros(1)})
    with HDF5Storage(path, mode="w") as store:
        assert store.steps() == []


def test_unwritable_path_fails_at_construction_naming_it(tmp_path):
    missing = tmp_path / "no_such_dir" / "s.h5"
    with pytest.raises(StorageError, match=f"{missing}.*directory .*no_such_dir does not exist"):
        HDF5Storage(missing)
    not_a_dir = tmp_path / "file.txt"
    not_a_dir.write_text("x")
    with pytest.raises(StorageError, match="file.txt"):
        HDF5Storage(not_a_dir / "s.h5")
    with pytest.raises(StorageError, match=f"{not_a_dir}"):
        HDF5Storage(not_a_dir, mode="a")  # exists, but is not HDF5


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file permissions")
def test_read_only_directory_fails_at_construction(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with pytest.raises(StorageError, match="no write permission"):
        HDF5Storage(locked / "s.h5")


def test_foreign_hdf5_file_is_refused(tmp_path):
    path = tmp_path / "other.h5"
    with h5py.File(path, "w") as f:
        f["data"] = np.zeros(3)
    with pytest.raises(StorageError, match="not a snapshot file"):
        HDF5Storage(path, mode="a")


@pytest.mark.parametrize("kwargs, message", [
    ({"compression": "zstd"}, "compression='zstd' is not supported"),
    ({"mode": "x"}, "mode='x' is not supported"),
    ({"compression": "lzf", "compression_opts": 4}, "needs compression='gzip'"),
    ({"max_pending": 0}, "max_pending"),
])
def test_bad_options_are_clear_errors(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        HDF5Storage(tmp_path / "o.h5", **kwargs)


def test_missing_step_lists_what_is_stored(tmp_path):
    with HDF5Storage(tmp_path / "s.h5") as store:
        for step in range(20):
            store.write(step, {"x": np.zeros(1)})
        with pytest.raises(SnapshotMissingError, match=r"no snapshot of step 99; stored steps: 0, 1, 2, 3, \.\.\., 16, "
                                                       r"17, 18, 19 \(20 in all\)"):
            store.read(99)


def test_unicode_array_names_read_back_with_plain_h5py(tmp_path):
    path = tmp_path / "u.h5"
    with HDF5Storage(path) as store:
        store.write(1, {"température": np.arange(3.0)})
    with h5py.File(path, "r") as f:
        assert list(f["snapshots/000000000001"]) == ["température"]
    with HDF5Storage(path, mode="r") as store:
        assert store.read(1).arrays["température"].tolist() == [0.0, 1.0, 2.0]


def test_metadata_cache_stays_small_however_many_snapshots(tmp_path):
    # A growing cache made every flush, hence every snapshot, slower as the file filled up.
    with HDF5Storage(tmp_path / "c.h5", background=False) as store:
        for step in range(50):
            store.write(step, {"x": np.zeros(8)})
        config = store._file.id.get_mdc_config()
        assert config.max_size == config.initial_size <= 1 << 20 and config.incr_mode == 0
