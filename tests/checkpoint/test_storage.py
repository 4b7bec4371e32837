"""The Storage contract, checked on every storage: round trips, metadata, counters."""

import numpy as np
import pytest

from checkpoint.storage import (HDF5Storage, MemoryStorage, SnapshotMissingError, Storage,
                                StorageClosedError)

DTYPES = [np.float32, np.float64, np.int32, np.int64]


@pytest.fixture(params=["memory", "hdf5", "hdf5-inline", "hdf5-gzip", "hdf5-lzf"])
def store(request, tmp_path):
    kind = request.param
    if kind == "memory":
        s = MemoryStorage()
    else:
        compression = {"hdf5-gzip": "gzip", "hdf5-lzf": "lzf"}.get(kind)
        s = HDF5Storage(tmp_path / "snaps.h5", compression=compression, background=kind != "hdf5-inline")
    yield s
    s.close()


def sample(step, n=257):
    """Arrays whose every bit depends on the step, covering the dtypes the stepper uses."""
    rng = np.random.default_rng(step)
    arrays = {f"a_{np.dtype(t).name}": rng.standard_normal(n).astype(t) if np.dtype(t).kind == "f"
              else rng.integers(np.iinfo(t).min, np.iinfo(t).max, n, dtype=t) for t in DTYPES}
    arrays["x"] = rng.standard_normal((n, 3))                       # vec3 positions
    arrays["v"] = rng.standard_normal((n, 3)).astype(np.float32)    # vec3 float32
    arrays["nan_inf"] = np.array([np.nan, np.inf, -np.inf, -0.0, 5e-324])
    arrays["scalar"] = np.array(7, dtype=np.int64)
    arrays["empty"] = np.zeros((0, 3), dtype=np.float32)
    arrays["flag"] = np.array([True, False, True])
    return arrays


def assert_bit_exact(got, expected):
    assert set(got) == set(expected)
    for name, array in expected.items():
        assert got[name].dtype == array.dtype, name
        assert got[name].shape == array.shape, name
        assert got[name].tobytes() == array.tobytes(), name


def test_is_a_storage(store):
    assert isinstance(store, Storage)


def test_round_trip_is_bit_exact(store):
    for step in (0, 5, 2**40):
        store.write(step, sample(step))
    for step in (0, 5, 2**40):
        snap = store.read(step)
        assert snap.step == step
        assert_bit_exact(snap.arrays, sample(step))
    store.flush()
    assert_bit_exact(store.read(5).arrays, sample(5))


def test_metadata_holds_step_time_shapes_dtypes_and_user_keys(store):
    store.write(3, {"x": np.zeros((4, 3), np.float32), "n": np.arange(2)},
                {"time": 0.25, "dt": 1e-3, "note": "warm-up", "tags": [1, 2]})
    store.flush()
    meta = store.read(3).metadata
    assert meta == {"step": 3, "time": 0.25, "shapes": {"x": (4, 3), "n": (2,)},
                    "dtypes": {"x": "<f4", "n": "<i8"}, "dt": 1e-3, "note": "warm-up", "tags": [1, 2]}


def test_time_defaults_to_wall_clock(store):
    import time
    before = time.time()
    store.write(0, {"x": np.zeros(1)})
    assert before <= store.read(0).metadata["time"] <= time.time()


def test_write_copies_the_callers_arrays(store):
    x = np.arange(6.0)
    store.write(1, {"x": x})
    x[:] = -1  # the stepper reuses its buffers at once
    store.flush()
    assert store.read(1).arrays["x"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_rewriting_a_step_replaces_it(store):
    store.write(1, {"x": np.zeros(3)})
    store.write(1, {"y": np.ones(2, np.int32)})
    store.flush()
    assert_bit_exact(store.read(1).arrays, {"y": np.ones(2, np.int32)})
    assert store.steps() == [1]


def test_steps_contains_delete_and_nbytes(store):
    for step in (9, 2, 4):
        store.write(step, {"x": np.zeros(10, np.float32), "i": np.zeros(3, np.int64)})
    assert store.steps() == [2, 4, 9]
    assert 4 in store and 3 not in store
    assert store.nbytes == 3 * (40 + 24)
    store.delete(4)
    store.flush()
    assert store.steps() == [2, 9] and 4 not in store
    assert store.nbytes == 2 * 64
    with pytest.raises(SnapshotMissingError, match="step 4"):
        store.read(4)
    with pytest.raises(SnapshotMissingError, match="step 4"):
        store.delete(4)


def test_stats_count_snapshots_and_bytes(store):
    store.write(0, {"x": np.zeros(100)})
    store.write(1, {"x": np.zeros(50, np.float32)})
    store.flush()
    store.read(0)
    stats = store.stats
    assert (stats.snapshots_written, stats.bytes_written) == (2, 1000)
    assert (stats.snapshots_read, stats.bytes_read) == (1, 800)
    assert stats.io_seconds > 0 and stats.blocked_seconds >= 0


def test_prefetch_then_read_returns_the_snapshot(store):
    store.write(2, sample(2))
    store.flush()
    store.prefetch(2)
    assert_bit_exact(store.read(2).arrays, sample(2))
    assert_bit_exact(store.read(2).arrays, sample(2))  # a second read goes to the store again


def test_measure_costs_returns_positive_times_and_leaves_no_trace(store):
    store.write(0, {"x": np.zeros(8)})
    write_s, read_s = store.measure_costs({"x": np.zeros(1000), "v": np.zeros((10, 3))})
    assert write_s > 0 and read_s > 0
    assert store.steps() == [0]
    assert store.stats.snapshots_written == 1 and store.stats.snapshots_read == 0


def test_context_manager_closes(tmp_path):
    with MemoryStorage() as store:
        store.write(0, {"x": np.zeros(1)})
    with pytest.raises(StorageClosedError):
        store.read(0)
    with HDF5Storage(tmp_path / "a.h5") as disk:
        disk.write(0, {"x": np.zeros(1)})
    with pytest.raises(StorageClosedError, match="a.h5"):
        disk.read(0)


@pytest.mark.parametrize("arrays, error, message", [
    ({}, ValueError, "at least one array"),
    ({"a/b": np.zeros(1)}, ValueError, "'a/b'"),
    ({"s": np.array(["text"])}, TypeError, "array 's' has dtype"),
    ([np.zeros(1)], TypeError, "dict of name"),
])
def test_bad_arrays_are_refused_naming_the_array(store, arrays, error, message):
    with pytest.raises(error, match=message):
        store.write(0, arrays)


@pytest.mark.parametrize("step, error", [(-1, ValueError), (1.5, TypeError), (True, TypeError)])
def test_bad_steps_are_refused(store, step, error):
    with pytest.raises(error, match="step"):
        store.write(step, {"x": np.zeros(1)})


def test_bad_metadata_is_refused_naming_the_key(store):
    with pytest.raises(ValueError, match="'shapes'"):
        store.write(0, {"x": np.zeros(1)}, {"shapes": 1})
    with pytest.raises(TypeError, match="JSON"):
        store.write(0, {"x": np.zeros(1)}, {"f": object()})


def test_memory_reads_are_read_only_views():
    store = MemoryStorage()
    store.write(0, {"x": np.arange(3.0)})
    x = store.read(0).arrays["x"]
    with pytest.raises(ValueError, match="read-only"):
        x[0] = 9.0
    with pytest.raises(ValueError):
        x.flags.writeable = True
    assert store.read(0).arrays["x"].tolist() == [0.0, 1.0, 2.0]


def test_hdf5_reads_are_owned_copies(tmp_path):
    with HDF5Storage(tmp_path / "s.h5") as store:
        store.write(0, {"x": np.arange(3.0)})
        pending = store.read(0).arrays["x"]  # may come from the write-behind buffer
        pending[0] = 9.0
        store.flush()
        assert store.read(0).arrays["x"].tolist() == [0.0, 1.0, 2.0]


def test_memory_device_other_than_cpu_is_a_clear_error():
    with pytest.raises(ValueError, match="only device='cpu' is supported by MemoryStorage until the CUDA"):
        MemoryStorage(device="cuda")
