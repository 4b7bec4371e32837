"""Snapshot storage benchmarks (pytest-benchmark; numbers, no timing asserts).

    python -m pytest benchmarks/test_bench_storage.py --benchmark-columns=min,median,max

Goals from the issue, printed as extra_info next to each result:
- HDF5 write/read of a 64 MiB snapshot at >= 80 % of a raw file write/read of the same bytes;
- < 100 us overhead per 40 KiB snapshot;
- most disk time hidden behind compute when writes overlap a synthetic step.
"""

import time

import numpy as np
import pytest

from checkpoint.storage import HDF5Storage

BIG = {"x": np.random.default_rng(0).standard_normal(8 << 20)}  # 64 MiB of float64
SMALL = {"x": np.random.default_rng(1).standard_normal(5 << 10)}  # 40 KiB


def _counter():
    count = iter(range(1 << 40))
    return lambda: next(count)


def _report(benchmark, key, from_median):
    """Record a figure derived from the median time (there is none under --benchmark-disable)."""
    if not benchmark.disabled:
        benchmark.extra_info[key] = from_median(benchmark.stats["median"])


# -- 64 MiB throughput, HDF5 against raw file I/O -------------------------------
def test_raw_write_64mib(benchmark, tmp_path):
    data, nxt = BIG["x"], _counter()

    def write():
        with open(tmp_path / f"raw{nxt() % 4}.bin", "wb") as fh:
            fh.write(data.data)

    benchmark.pedantic(write, rounds=8, warmup_rounds=1)
    _report(benchmark, "MiB/s", lambda median: 64 / median)


@pytest.mark.parametrize("compression", [None, "lzf"])
def test_hdf5_write_64mib(benchmark, tmp_path, compression):
    nxt = _counter()
    with HDF5Storage(tmp_path / "big.h5", compression=compression, background=False) as store:
        # Four steps in turn, as a schedule would reuse slots: steady-state file size.
        benchmark.pedantic(lambda: store.write(nxt() % 4, BIG), rounds=8, warmup_rounds=1)
    _report(benchmark, "MiB/s", lambda median: 64 / median)


def test_raw_read_64mib(benchmark, tmp_path):
    path = tmp_path / "raw.bin"
    path.write_bytes(BIG["x"].tobytes())
    out = np.empty_like(BIG["x"])

    def read():
        with open(path, "rb") as fh:
            fh.readinto(out.data)

    benchmark.pedantic(read, rounds=8, warmup_rounds=1)
    _report(benchmark, "MiB/s", lambda median: 64 / median)


@pytest.mark.parametrize("compression", [None, "lzf"])
def test_hdf5_read_64mib(benchmark, tmp_path, compression):
    with HDF5Storage(tmp_path / "big.h5", compression=compression, background=False) as store:
        store.write(0, BIG)
        benchmark.pedantic(lambda: store.read(0), rounds=8, warmup_rounds=1)
    _report(benchmark, "MiB/s", lambda median: 64 / median)


# -- per-snapshot overhead for 40 KiB snapshots -------------------------------------
@pytest.mark.parametrize("background", [False, True], ids=["inline", "write-behind"])
def test_hdf5_write_40kib_per_snapshot(benchmark, tmp_path, background):
    """Inline: the whole cost (group, dataset, attributes, flushes). Write-behind:
    what the caller waits for while the I/O thread keeps up (copy + enqueue)."""
    nxt = _counter()
    with HDF5Storage(tmp_path / "small.h5", background=background, max_pending=1 << 16) as store:
        start = time.perf_counter()
        benchmark.pedantic(lambda: store.write(nxt(), SMALL), rounds=500, warmup_rounds=10)
        flush_start = time.perf_counter()
        store.flush()
        end = time.perf_counter()
        benchmark.extra_info["flush after the rounds, s"] = end - flush_start
        # The rate the disk side keeps up: all writes from the first to the end of the final flush.
        benchmark.extra_info["sustained us per snapshot"] = (end - start) / nxt() * 1e6
    _report(benchmark, "us per snapshot", lambda median: median * 1e6)


def test_plain_h5py_40kib_one_dataset_per_snapshot(benchmark, tmp_path):
    """The reference the issue quotes: h5py, one contiguous dataset per snapshot, no checks."""
    import h5py
    nxt = _counter()
    with h5py.File(tmp_path / "plain.h5", "w") as f:
        benchmark.pedantic(lambda: f.create_dataset(str(nxt()), data=SMALL["x"]), rounds=500, warmup_rounds=10)
    _report(benchmark, "us per snapshot", lambda median: median * 1e6)


# -- fraction of disk time hidden behind compute ------------------------------------
def _busy(seconds, scratch=np.ones(1 << 14)):
    """A synthetic step: NumPy work (which releases the GIL, as compiled kernels do)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        np.sin(scratch, out=scratch)


@pytest.mark.parametrize("background", [False, True], ids=["inline", "write-behind"])
def test_disk_time_hidden_behind_compute(benchmark, tmp_path, background):
    """10 steps of 60 ms compute, each writing an 8 MiB snapshot.

    hidden = 1 - (run time - compute time) / (time of the same writes alone);
    the storage's own estimate, 1 - blocked_seconds / io_seconds, is printed too.
    """
    steps, step_seconds = 10, 0.06
    snap = {"x": np.random.default_rng(2).standard_normal(1 << 20)}
    nxt = _counter()

    with HDF5Storage(tmp_path / "io_alone.h5", background=False) as store:
        store.write(0, snap)  # warm up the file and the page cache
        start = time.perf_counter()
        for step in range(steps):
            store.write(step, snap)
        io_alone = time.perf_counter() - start

    with HDF5Storage(tmp_path / "run.h5", background=background) as store:
        store.write(0, snap)
        store.flush()

        def run():
            base = nxt() * steps
            for step in range(steps):
                _busy(step_seconds)
                store.write(base + step, snap)
            store.flush()

        benchmark.pedantic(run, rounds=3, warmup_rounds=1)
        stats = store.stats
    if benchmark.disabled:          # --benchmark-disable: ran once for correctness, nothing timed
        return
    exposed = benchmark.stats["median"] - steps * step_seconds
    benchmark.extra_info["io alone, s"] = io_alone
    benchmark.extra_info["exposed io, s"] = exposed
    benchmark.extra_info["hidden fraction"] = 1 - exposed / io_alone
    benchmark.extra_info["1 - blocked/io"] = 1 - stats.blocked_seconds / stats.io_seconds
