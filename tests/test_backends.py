"""Compile-and-load steps of both backends, fed with hand-written C++/CUDA source.

CPU tests need a C++ compiler; NVRTC tests need cuda-bindings and an NVRTC wheel (no GPU); tests
marked ``cuda`` need a GPU and skip without one.
"""
from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from compiler.backends import (BuildError, CompilerNotFoundError, build_cpu_library, compile_cuda,
                               cuda_available, find_compiler, find_cxx, load_cpu_library)
from compiler.backends import cpu_build, cudasim, nvrtc

REPO = Path(__file__).resolve().parents[1]

OPENMP_SUM = textwrap.dedent("""\
    #include <omp.h>
    extern "C" long long parallel_sum(long long n) {
        long long s = 0;
        #pragma omp parallel for reduction(+ : s)
        for (long long i = 0; i < n; ++i) s += i;
        return s;
    }
    extern "C" int max_threads(void) { return omp_get_max_threads(); }
    """)

SQUARE = 'extern "C" double square(double x) { return x * x; }\n'


def _fn(lib, name, restype, *argtypes):
    f = getattr(lib, name)
    f.restype, f.argtypes = restype, list(argtypes)
    return f


# --- CPU: build, load, call --------------------------------------------------------------------------

def test_openmp_sum_is_exact(tmp_path):
    lib = load_cpu_library(build_cpu_library(OPENMP_SUM, "parallel_sum", cache_dir=tmp_path))
    parallel_sum = _fn(lib, "parallel_sum", ctypes.c_longlong, ctypes.c_longlong)
    assert parallel_sum(10_000_001) == 10_000_001 * 10_000_000 // 2
    assert find_compiler(tmp_path).openmp
    assert _fn(lib, "max_threads", ctypes.c_int)() >= 1


def test_library_lives_in_the_cache_dir_with_its_source(tmp_path):
    path = build_cpu_library(SQUARE, "square", cache_dir=tmp_path)
    assert path.parent == tmp_path and path.name.startswith("square-")
    sources = list(tmp_path.glob("square-*.cpp"))
    assert [p.read_text() for p in sources] == [SQUARE]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "temporary files left behind"


def test_loading_twice_returns_the_same_handle(tmp_path):
    path = build_cpu_library(SQUARE, "square", cache_dir=tmp_path)
    assert load_cpu_library(path) is load_cpu_library(str(path))
    assert _fn(load_cpu_library(path), "square", ctypes.c_double, ctypes.c_double)(1.5) == 2.25


def test_cache_hit_runs_no_compiler(tmp_path, monkeypatch):
    first = build_cpu_library(SQUARE, "square", cache_dir=tmp_path)

    def no_subprocess(*args, **kwargs):
        raise AssertionError(f"a cache hit ran {args[0]!r}")
    monkeypatch.setattr(subprocess, "run", no_subprocess)
    assert build_cpu_library(SQUARE, "square", cache_dir=tmp_path) == first


def test_cache_key_covers_source_flags_and_headers(tmp_path):
    include = tmp_path / "include"
    include.mkdir()
    (include / "prelude.h").write_text("#define SCALE 2.0\n")
    source = '#include "prelude.h"\nextern "C" double scale(double x) { return SCALE * x; }\n'
    cache = tmp_path / "cache"
    a = build_cpu_library(source, "scale", include_dirs=[include], cache_dir=cache)
    assert _fn(load_cpu_library(a), "scale", ctypes.c_double, ctypes.c_double)(1.5) == 3.0

    assert build_cpu_library(source + "\n", "scale", include_dirs=[include], cache_dir=cache) != a
    assert build_cpu_library(source, "scale", include_dirs=[include], cache_dir=cache, flags=["-g"]) != a
    (include / "prelude.h").write_text("#define SCALE 3.0\n")
    b = build_cpu_library(source, "scale", include_dirs=[include], cache_dir=cache)
    assert b != a
    assert _fn(load_cpu_library(b), "scale", ctypes.c_double, ctypes.c_double)(1.5) == 4.5


def _run_python(code: str, **env) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **env}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env,
                          cwd=REPO, timeout=120)


def test_another_process_loads_the_cached_library_without_a_compiler(tmp_path):
    build_cpu_library(SQUARE, "square", cache_dir=tmp_path)
    child = _run_python(textwrap.dedent(f"""\
        import ctypes
        from compiler.backends import build_cpu_library, load_cpu_library
        lib = load_cpu_library(build_cpu_library({SQUARE!r}, "square", cache_dir={str(tmp_path)!r}))
        lib.square.restype = ctypes.c_double
        print(lib.square(ctypes.c_double(3.0)))
        """), CXX="/nonexistent/c++")
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == "9.0"


def test_without_a_compiler_an_uncached_build_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    with pytest.raises(CompilerNotFoundError, match="/nonexistent/c\\+\\+"):
        build_cpu_library(SQUARE, "square", cache_dir=tmp_path)


def test_concurrent_builds_of_one_source_agree(tmp_path):
    code = textwrap.dedent(f"""\
        from compiler.backends import build_cpu_library, load_cpu_library
        path = build_cpu_library({OPENMP_SUM!r}, "parallel_sum", cache_dir={str(tmp_path)!r})
        load_cpu_library(path)
        print(path)
        """)
    full_env = {**os.environ, "PYTHONPATH": str(REPO)}
    children = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=full_env) for _ in range(4)]
    outputs = [c.communicate(timeout=120) for c in children]
    assert all(c.returncode == 0 for c in children), [err for _, err in outputs]
    assert len({out.strip() for out, _ in outputs}) == 1
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "temporary files left behind"


# --- CPU: errors ---------------------------------------------------------------------------------------

def test_build_error_points_at_the_users_line(tmp_path):
    source = 'extern "C" void ok() {}\n#line 7 "user.py"\nextern "C" int broken(int x) { return x + ; }\n'
    with pytest.raises(BuildError) as info:
        build_cpu_library(source, "broken", cache_dir=tmp_path)
    err = info.value
    message = str(err)
    assert "user.py:7" in message
    assert "-std=c++17" in message and err.command in message
    assert "user.py:7" in err.log
    assert err.source_path == tmp_path / "broken.failed.cpp"
    assert err.source_path.read_text() == source and str(err.source_path) in message
    assert not list(tmp_path.glob("broken-*.so")) and not list(tmp_path.glob(".*"))


def test_compiler_not_found_lists_candidates_and_install_hints(monkeypatch):
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setenv("PATH", "")
    with pytest.raises(CompilerNotFoundError) as info:
        find_cxx()
    message = str(info.value)
    for expected in ("c++", "g++", "clang++", "apt-get install g++", "xcode-select --install",
                     "conda install", "$CXX"):
        assert expected in message
    assert isinstance(info.value, RuntimeError)


def test_a_wrong_cxx_is_named_not_silently_replaced(monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    monkeypatch.setenv("PATH", "")
    with pytest.raises(CompilerNotFoundError, match=r"\$CXX is set to '/nonexistent/c\+\+'") as info:
        find_cxx()
    assert "apt-get install g++" in str(info.value)


def test_cxx_may_carry_arguments(monkeypatch):
    real = find_cxx()[0]
    monkeypatch.setenv("CXX", f"{real} -Wall")
    assert find_cxx() == (real, "-Wall")


def _compiler_refusing(flag: str, path: Path) -> Path:
    """A wrapper around the real C++ compiler for which `flag` is an unsupported option."""
    path.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        for a in "$@"; do [ "$a" = "{flag}" ] && {{ echo "unsupported option '{flag}'" >&2; exit 1; }}; done
        exec {find_cxx()[0]} "$@"
        """))
    path.chmod(0o755)
    return path


VECTOR_OPS = textwrap.dedent("""\
    #include <cmath>
    extern "C" void mix(const float* a, const float* b, float* out, int n) {
        for (int i = 0; i < n; ++i) {
            float x = a[i], y = b[i];
            out[i] = 2.0f * x - y + 0.25f * (x * y) / (1.5f + y * y) - 1e-3f * x * x * x
                     + std::sqrt(x * x + y * y) + (x < y ? x : y);
        }
    }
    """)


def test_native_and_portable_builds_give_the_same_bits(tmp_path, monkeypatch):
    # -march=native widens the vectors only: without FMA contraction or fast-math, every element
    # is the same IEEE operations in the same order.
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal(1003).astype(np.float32) for _ in range(2))
    real = find_cxx()[0]
    wrapper = _compiler_refusing("-march=native", tmp_path / "portable-c++")
    results = {}
    for kind in ("native", "portable"):
        if kind == "portable":
            monkeypatch.setenv("CXX", str(wrapper))
        cache = tmp_path / kind
        compiler = find_compiler(cache)
        path = build_cpu_library(VECTOR_OPS, "mix", cache_dir=cache)
        if kind == "portable":
            assert not compiler.native and "-march=native" not in compiler.flags()
            assert cpu_build.cpu_tag() not in path.name
        elif not compiler.native:
            pytest.skip(f"{real} does not support -march=native")
        else:
            assert path.name.endswith(f"-{cpu_build.cpu_tag()}{cpu_build.LIB_SUFFIX}")
        out = np.empty_like(a)
        f = _fn(load_cpu_library(path), "mix", None, *[ctypes.c_void_p] * 3, ctypes.c_int)
        f(a.ctypes.data, b.ctypes.data, out.ctypes.data, a.size)
        results[kind] = out
    np.testing.assert_array_equal(results["native"].view(np.uint32), results["portable"].view(np.uint32))


def test_compiler_without_openmp_builds_serial_libraries(tmp_path, monkeypatch):
    # A wrapper that behaves like Apple clang: -fopenmp is an error.
    wrapper = _compiler_refusing("-fopenmp", tmp_path / "no-openmp-c++")
    monkeypatch.setenv("CXX", str(wrapper))
    cache = tmp_path / "cache"
    compiler = find_compiler(cache)
    assert not compiler.openmp and "-fopenmp" not in compiler.flags()
    records = [json.loads(p.read_text()) for p in (cache / "compilers").glob("*.json")]
    assert [r["openmp"] for r in records] == [False]

    source = 'extern "C" long long serial_sum(long long n) {\n long long s = 0;\n' \
             ' #pragma omp parallel for reduction(+ : s)\n for (long long i = 0; i < n; ++i) s += i;\n return s; }\n'
    lib = load_cpu_library(build_cpu_library(source, "serial_sum", cache_dir=cache))
    assert _fn(lib, "serial_sum", ctypes.c_longlong, ctypes.c_longlong)(1001) == 500500


# --- NVRTC (no GPU needed) -------------------------------------------------------------------------------

def _require_nvrtc():
    try:
        return nvrtc.nvrtc_version()
    except nvrtc.NvrtcNotFoundError as e:
        pytest.skip(str(e))


CUDA_SOURCE = textwrap.dedent("""\
    #include "prelude.h"
    #line 1 "user.py"
    template <typename T> struct Pair { T first; T second; };
    template <typename T> __device__ T twice(T x) { return x + x; }
    extern "C" __global__ void accumulate(float* total_f, double* total_d, Pair<float> p, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i >= n) return;
        atomicAdd(total_f, twice(p.first) * SCALE);
        atomicAdd(total_d, (double)p.second);
    }
    """)
PRELUDE = {"prelude.h": "#define SCALE 1.0f\n"}


def test_nvrtc_compiles_templates_structs_and_atomics_to_ptx(tmp_path):
    major, minor = _require_nvrtc()
    assert major >= 12
    ptx = compile_cuda(CUDA_SOURCE, "accumulate", headers=PRELUDE, cache_dir=tmp_path)
    text = ptx.decode()
    assert ".entry accumulate(" in text
    assert ".target sm_75" in text
    assert "atom.global.add.f32" in text and "atom.global.add.f64" in text
    assert not ptx.endswith(b"\0")


def test_nvrtc_cache_hit_does_not_compile(tmp_path, monkeypatch):
    _require_nvrtc()
    first = compile_cuda(CUDA_SOURCE, "accumulate", headers=PRELUDE, cache_dir=tmp_path)

    def no_compile(*args, **kwargs):
        raise AssertionError("a cache hit ran NVRTC")
    monkeypatch.setattr(nvrtc, "_compile", no_compile)
    assert compile_cuda(CUDA_SOURCE, "accumulate", headers=PRELUDE, cache_dir=tmp_path) == first
    with pytest.raises(AssertionError):   # a changed header is a different key
        compile_cuda(CUDA_SOURCE, "accumulate", headers={"prelude.h": "#define SCALE 2.0f\n"},
                     cache_dir=tmp_path)
    assert len(list(tmp_path.glob("accumulate-*.ptx"))) == 1


def test_nvrtc_cubin_needs_a_real_architecture(tmp_path):
    _require_nvrtc()
    cubin = compile_cuda(CUDA_SOURCE, "accumulate", arch=75, headers=PRELUDE, output="cubin",
                         cache_dir=tmp_path)
    assert cubin.startswith(b"\x7fELF")
    with pytest.raises(ValueError, match="sm_75"):
        compile_cuda(CUDA_SOURCE, "accumulate", arch="compute_75", output="cubin", cache_dir=tmp_path)
    with pytest.raises(ValueError, match="output"):
        compile_cuda(CUDA_SOURCE, "accumulate", output="fatbin", cache_dir=tmp_path)


def test_nvrtc_include_dirs(tmp_path):
    _require_nvrtc()
    include = tmp_path / "include"
    include.mkdir()
    (include / "prelude.h").write_text(PRELUDE["prelude.h"])
    ptx = compile_cuda(CUDA_SOURCE, "accumulate", include_dirs=[include], cache_dir=tmp_path / "c")
    assert b".entry accumulate(" in ptx


def test_nvrtc_build_error_points_at_the_users_line(tmp_path):
    _require_nvrtc()
    source = '#line 7 "user.py"\nextern "C" __global__ void broken(float* x) { x[0] = ; }\n'
    with pytest.raises(BuildError) as info:
        compile_cuda(source, "broken", cache_dir=tmp_path)
    err = info.value
    assert "user.py:7" in str(err) and "user.py(7)" in err.log
    assert "--gpu-architecture=compute_75" in str(err)
    assert err.source_path.read_text() == source and str(err.source_path) in str(err)
    assert not list(tmp_path.glob("broken-*"))


def test_missing_nvrtc_says_how_to_install(monkeypatch):
    import builtins
    real_import = builtins.__import__

    def no_cuda(name, *args, **kwargs):
        if name.startswith("cuda"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)
    monkeypatch.setattr(nvrtc, "_nvrtc_module", None)
    monkeypatch.setattr(builtins, "__import__", no_cuda)
    with pytest.raises(nvrtc.NvrtcNotFoundError) as info:
        nvrtc.nvrtc_version()
    message = str(info.value)
    assert "cuda.bindings.nvrtc" in message and "cuda.nvrtc" in message
    assert "pip install cuda-python nvidia-cuda-nvrtc-cu12" in message


# --- CUDA driver (GPU only) -------------------------------------------------------------------------------

def test_cuda_available_never_raises():
    assert cuda_available() in (True, False)


def test_launch_arguments_are_checked_without_a_gpu():
    from compiler.backends import cuda_driver as cd
    assert bytes(cd._as_ctypes(np.float32(1.5))) == np.float32(1.5).tobytes()
    assert bytes(cd._as_ctypes(np.int64(-2))) == np.int64(-2).tobytes()
    c = ctypes.c_int32(3)
    assert cd._as_ctypes(c) is c
    with pytest.raises(TypeError, match="ctypes values or NumPy scalars"):
        cd._as_ctypes(3)
    assert cd._dim3(7, "grid") == (7, 1, 1)
    assert cd._dim3((2, 3), "grid") == (2, 3, 1)
    with pytest.raises(ValueError, match="block"):
        cd._dim3((1, 1, 1, 1), "block")
    with pytest.raises(ValueError, match="grid"):
        cd._dim3(0, "grid")


needs_gpu = pytest.mark.skipif(not cuda_available() or cudasim.enabled(),
                               reason="loads PTX/CUBIN: needs a CUDA GPU (the simulator runs CUDA source instead)")

SAXPY = textwrap.dedent("""\
    struct Params { float a; int n; };
    extern "C" __global__ void saxpy(const float* x, float* y, Params p) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < p.n) y[i] = p.a * x[i] + y[i];
    }
    """)


class _Params(ctypes.Structure):
    _fields_ = [("a", ctypes.c_float), ("n", ctypes.c_int32)]


def _run_saxpy(image: bytes) -> np.ndarray:
    from cuda.bindings import driver
    from compiler.backends import cuda_driver as cd
    module = cd.load_module(image)
    saxpy = cd.get_function(module, "saxpy")
    n = 1000
    x = np.arange(n, dtype=np.float32)
    y = np.ones(n, dtype=np.float32)
    dx = cd._check(driver.cuMemAlloc(x.nbytes), "cuMemAlloc")
    dy = cd._check(driver.cuMemAlloc(y.nbytes), "cuMemAlloc")
    try:
        cd._check(driver.cuMemcpyHtoD(dx, x.ctypes.data, x.nbytes), "cuMemcpyHtoD")
        cd._check(driver.cuMemcpyHtoD(dy, y.ctypes.data, y.nbytes), "cuMemcpyHtoD")
        cd.launch(saxpy, grid=(n + 127) // 128, block=128,
                  args=[ctypes.c_void_p(int(dx)), ctypes.c_void_p(int(dy)), _Params(2.0, n)])
        cd.synchronize()
        cd._check(driver.cuMemcpyDtoH(y.ctypes.data, dy, y.nbytes), "cuMemcpyDtoH")
    finally:
        driver.cuMemFree(dx)
        driver.cuMemFree(dy)
    return y


@pytest.mark.cuda
@needs_gpu
def test_cubin_for_the_device_launches(tmp_path):
    from compiler.backends import device_arch
    major, minor = device_arch(0)
    assert (major, minor) >= (7, 5)
    cubin = compile_cuda(SAXPY, "saxpy", arch=f"sm_{major}{minor}", output="cubin", cache_dir=tmp_path)
    y = _run_saxpy(cubin)
    np.testing.assert_array_equal(y, 2.0 * np.arange(1000, dtype=np.float32) + 1.0)


@pytest.mark.cuda
@needs_gpu
def test_ptx_launches_through_the_driver_jit(tmp_path):
    from compiler.backends import CudaError
    ptx = compile_cuda(SAXPY, "saxpy", cache_dir=tmp_path)
    try:
        y = _run_saxpy(ptx)
    except CudaError as e:
        if "UNSUPPORTED_PTX_VERSION" in str(e):
            pytest.skip(f"the driver is older than NVRTC {nvrtc.nvrtc_version()}: {e}")
        raise
    np.testing.assert_array_equal(y, 2.0 * np.arange(1000, dtype=np.float32) + 1.0)


@pytest.mark.cuda
@needs_gpu
def test_launch_accepts_numpy_scalars(tmp_path):
    from compiler.backends import cuda_driver as cd
    from cuda.bindings import driver
    major, minor = cd.device_arch(0)
    source = 'extern "C" __global__ void store(double* out, double v, int k) { out[0] = v * k; }\n'
    module = cd.load_module(compile_cuda(source, "store", arch=f"sm_{major}{minor}", output="cubin",
                                         cache_dir=tmp_path))
    out = cd._check(driver.cuMemAlloc(8), "cuMemAlloc")
    try:
        cd.launch(cd.get_function(module, "store"), 1, 1,
                  [ctypes.c_void_p(int(out)), np.float64(1.25), np.int32(4)])
        cd.synchronize()
        host = np.zeros(1)
        cd._check(driver.cuMemcpyDtoH(host.ctypes.data, out, 8), "cuMemcpyDtoH")
    finally:
        driver.cuMemFree(out)
    assert host[0] == 5.0
