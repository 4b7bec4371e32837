"""Raw compile/load costs of the backends, before any frontend or codegen work.

    python -m pytest benchmarks/test_bench_compile.py --benchmark-only -q

cold: a source the cache has never seen (the compiler runs); warm: the same source again (a cache
hit: hashing, a stat, and a dict lookup for the loaded library). The fresh-process warm case is what
a user's second run pays: imports excluded, compiler identity (`--version`) included.
"""
from __future__ import annotations

import itertools
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from compiler.backends import build_cpu_library, compile_cuda, load_cpu_library, nvrtc

REPO = Path(__file__).resolve().parents[1]

CPU_SOURCE = textwrap.dedent("""\
    #include <omp.h>
    struct vec3 { float x, y, z; };
    static inline vec3 axpy(float a, vec3 x, vec3 y) { return {a * x.x + y.x, a * x.y + y.y, a * x.z + y.z}; }
    extern "C" void integrate(const vec3* x, const vec3* v, vec3* out, float dt, long long n) {
        #pragma omp parallel for
        for (long long i = 0; i < n; ++i) out[i] = axpy(dt, v[i], x[i]);
    }
    """)

CUDA_SOURCE = textwrap.dedent("""\
    struct vec3 { float x, y, z; };
    __device__ inline vec3 axpy(float a, vec3 x, vec3 y) { return {a * x.x + y.x, a * x.y + y.y, a * x.z + y.z}; }
    extern "C" __global__ void integrate(const vec3* x, const vec3* v, vec3* out, float dt, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) out[i] = axpy(dt, v[i], x[i]);
    }
    """)

_fresh = itertools.count()


def _unseen(source: str) -> str:
    return f"{source}// variant {os.getpid()}-{next(_fresh)}\n"


def test_cpu_cold_build(benchmark, tmp_path):
    build_cpu_library(_unseen(CPU_SOURCE), "integrate", cache_dir=tmp_path)   # probe OpenMP once
    benchmark.pedantic(lambda src: load_cpu_library(build_cpu_library(src, "integrate", cache_dir=tmp_path)),
                       setup=lambda: ((_unseen(CPU_SOURCE),), {}), rounds=5)


def test_cpu_warm_build_and_load(benchmark, tmp_path):
    load_cpu_library(build_cpu_library(CPU_SOURCE, "integrate", cache_dir=tmp_path))
    benchmark(lambda: load_cpu_library(build_cpu_library(CPU_SOURCE, "integrate", cache_dir=tmp_path)))


def test_cpu_warm_load_in_a_fresh_process(benchmark, tmp_path):
    build_cpu_library(CPU_SOURCE, "integrate", cache_dir=tmp_path)
    code = textwrap.dedent(f"""\
        import time
        from compiler.backends import build_cpu_library, load_cpu_library
        t0 = time.perf_counter()
        load_cpu_library(build_cpu_library({CPU_SOURCE!r}, "integrate", cache_dir={str(tmp_path)!r}))
        print((time.perf_counter() - t0) * 1e3)
        """)
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def child_ms() -> float:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
        return float(out.stdout)
    times = benchmark.pedantic(lambda: [child_ms() for _ in range(5)], rounds=1)
    benchmark.extra_info["in_child_ms"] = times
    print(f"\nwarm build+load in a fresh process: {min(times):.1f} ms min, {max(times):.1f} ms max")


def _require_nvrtc():
    try:
        nvrtc.nvrtc_version()
    except nvrtc.NvrtcNotFoundError as e:
        pytest.skip(str(e))


def test_nvrtc_cold_ptx(benchmark, tmp_path):
    _require_nvrtc()
    benchmark.pedantic(lambda src: compile_cuda(src, "integrate", cache_dir=tmp_path),
                       setup=lambda: ((_unseen(CUDA_SOURCE),), {}), rounds=5)


def test_nvrtc_cold_cubin(benchmark, tmp_path):
    _require_nvrtc()
    benchmark.pedantic(lambda src: compile_cuda(src, "integrate", arch="sm_80", output="cubin", cache_dir=tmp_path),
                       setup=lambda: ((_unseen(CUDA_SOURCE),), {}), rounds=5)


def test_nvrtc_warm_ptx(benchmark, tmp_path):
    _require_nvrtc()
    compile_cuda(CUDA_SOURCE, "integrate", cache_dir=tmp_path)
    benchmark(lambda: compile_cuda(CUDA_SOURCE, "integrate", cache_dir=tmp_path))
