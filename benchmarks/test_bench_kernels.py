"""Kernels end to end, ours against warp-lang's (when installed) on the CPU: the parts of
kernels_vs_warp.py as pytest-benchmark tests, with its kernels and child-process probes.

    python -m pytest benchmarks/test_bench_kernels.py --benchmark-columns=min,median,max -s

- cold compile: the first launch of a module in a fresh process with an empty cache (frontend,
  codegen, the C++ compiler, load); warm: the same in a second fresh process (a cache hit). The
  time that counts is the one measured inside the child (``in_child_s``; imports excluded), not the
  round's wall time, which includes starting Python.
- launch overhead: one launch of a dim=1 kernel that does nothing (host-side cost).
- saxpy: y = a*x + y on 2^24 float32 (three 64 MiB streams), in GB/s, next to NumPy's copy.

Numbers, not tests: nothing here asserts on time. Goals (issue 2) go to extra_info.
"""
from __future__ import annotations

import importlib
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from kernels_vs_warp import OURS_LOAD, OURS_MODULE, WARP_LOAD, WARP_MODULE, _run  # noqa: E402

SAXPY_N = 1 << 24


def _note(benchmark, key, stat, scale):
    """extra_info[key] = scale(stat of the rounds); nothing under --benchmark-disable (no stats)."""
    if not benchmark.disabled:
        benchmark.extra_info[key] = scale(benchmark.stats[stat])


def _warp():
    wp = pytest.importorskip("warp")
    wp.config.quiet = True
    return wp


def _import_source(tmp_path_factory, name: str, source: str):
    """Import `source` as module `name` (kernels must live in files)."""
    folder = tmp_path_factory.mktemp(name)
    (folder / f"{name}.py").write_text(source)
    sys.path.insert(0, str(folder))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(folder))


@pytest.fixture(scope="module")
def ours(tmp_path_factory):
    return _import_source(tmp_path_factory, "bench_kernels_ours", OURS_MODULE)


@pytest.fixture(scope="module")
def warp_kernels(tmp_path_factory):
    _warp()
    return _import_source(tmp_path_factory, "bench_kernels_warp", WARP_MODULE)


# -- compile: cold (empty cache) and warm (cache hit), each in a fresh process ---------------------------
LOADERS = {"ours": OURS_LOAD, "warp": WARP_LOAD}


def _modules_folder(tmp_path):
    (tmp_path / "ours_mod.py").write_text(OURS_MODULE)
    (tmp_path / "warp_mod.py").write_text(WARP_MODULE)
    return str(tmp_path)


@pytest.mark.parametrize("who", ["ours", "warp"])
def test_compile_cold(benchmark, tmp_path, who):
    if who == "warp":
        _warp()
    folder, fresh = _modules_folder(tmp_path), iter(range(1 << 20))
    inside = []
    # A new cache folder every round: every round compiles from scratch.
    benchmark.pedantic(lambda cache: inside.append(_run(LOADERS[who].format(d=folder, cache=cache))),
                       setup=lambda: ((os.path.join(folder, f"cache{next(fresh)}"),), {}), rounds=3)
    benchmark.extra_info["in_child_s"] = min(inside)
    benchmark.extra_info["goal"] = "ours <= 0.5 x warp's"
    print(f"\n{who} cold compile, measured in the child: {min(inside):.3f} s")


@pytest.mark.parametrize("who", ["ours", "warp"])
def test_compile_warm(benchmark, tmp_path, who):
    if who == "warp":
        _warp()
    folder = _modules_folder(tmp_path)
    code = LOADERS[who].format(d=folder, cache=os.path.join(folder, "cache"))
    _run(code)                                  # fill the cache
    inside = []
    benchmark.pedantic(lambda: inside.append(_run(code)), rounds=5)
    benchmark.extra_info["in_child_s"] = min(inside)
    benchmark.extra_info["goal"] = "ours < 20 ms in the child"
    print(f"\n{who} warm load, measured in the child: {min(inside) * 1e3:.1f} ms")


# -- launch overhead -------------------------------------------------------------------------------------
def test_launch_overhead_ours(benchmark, ours):
    import compiler as sp
    x = sp.zeros(1)
    sp.launch(ours.noop, 1, inputs=[x])        # compile and load outside the measurement
    benchmark(sp.launch, ours.noop, 1, inputs=[x])
    _note(benchmark, "us", "median", lambda t: t * 1e6)
    benchmark.extra_info["goal"] = "<= warp's"


def test_launch_overhead_warp(benchmark, warp_kernels):
    wp = _warp()
    x = wp.zeros(1, dtype=float, device="cpu")
    wp.launch(warp_kernels.noop, 1, inputs=[x], device="cpu")
    benchmark(wp.launch, warp_kernels.noop, 1, inputs=[x], device="cpu")
    _note(benchmark, "us", "median", lambda t: t * 1e6)


# -- saxpy throughput ------------------------------------------------------------------------------------
def _gbps(benchmark, bytes_moved):
    _note(benchmark, "GB/s", "min", lambda t: bytes_moved / t / 1e9)


def test_saxpy_ours(benchmark, ours):
    import compiler as sp
    x, y = sp.array(np.ones(SAXPY_N, np.float32)), sp.array(np.ones(SAXPY_N, np.float32))
    sp.launch(ours.saxpy, SAXPY_N, inputs=[2.0, x, y])
    benchmark.pedantic(sp.launch, args=(ours.saxpy, SAXPY_N), kwargs={"inputs": [2.0, x, y]}, rounds=10,
                       warmup_rounds=1)
    _gbps(benchmark, 3 * 4 * SAXPY_N)
    benchmark.extra_info["goal"] = ">= 1.5 x warp's, >= 0.7 x NumPy's copy"


def test_saxpy_warp(benchmark, warp_kernels):
    wp = _warp()
    x = wp.array(np.ones(SAXPY_N, np.float32), device="cpu")
    y = wp.array(np.ones(SAXPY_N, np.float32), device="cpu")
    wp.launch(warp_kernels.saxpy, SAXPY_N, inputs=[2.0, x, y], device="cpu")
    benchmark.pedantic(wp.launch, args=(warp_kernels.saxpy, SAXPY_N),
                       kwargs={"inputs": [2.0, x, y], "device": "cpu"}, rounds=10, warmup_rounds=1)
    _gbps(benchmark, 3 * 4 * SAXPY_N)


def test_numpy_copy(benchmark):
    a, b = np.ones(SAXPY_N, np.float32), np.empty(SAXPY_N, np.float32)
    benchmark.pedantic(np.copyto, args=(b, a), rounds=10, warmup_rounds=1)
    _gbps(benchmark, 2 * 4 * SAXPY_N)
