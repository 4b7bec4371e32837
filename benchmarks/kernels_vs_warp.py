"""Issue 2's numbers, side by side with warp-lang on the CPU in one run:

- cold compile of a small module (forward + adjoint), and warm load from the cache in a new process;
- host overhead of one launch of a dim=1 kernel;
- a streaming kernel y = a*x + y on 2^24 float32: throughput against Warp's and against NumPy's copy.

Run: python benchmarks/kernels_vs_warp.py   (warp-lang optional: pip install -e ".[bench]")
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np

OURS_MODULE = textwrap.dedent("""
    import compiler as sp

    @sp.kernel
    def saxpy(a: float, x: sp.array(dtype=float), y: sp.array(dtype=float)):
        i = sp.tid()
        y[i] = a * x[i] + y[i]

    @sp.kernel
    def noop(x: sp.array(dtype=float)):
        i = sp.tid()

    @sp.kernel
    def spring(x: sp.array(dtype=sp.vec3), k: float, f: sp.array(dtype=sp.vec3)):
        i = sp.tid()
        f[i] = -k * x[i] * sp.length(x[i])
""")

WARP_MODULE = textwrap.dedent("""
    import warp as wp
    wp.config.quiet = True

    @wp.kernel
    def saxpy(a: float, x: wp.array(dtype=float), y: wp.array(dtype=float)):
        i = wp.tid()
        y[i] = a * x[i] + y[i]

    @wp.kernel
    def noop(x: wp.array(dtype=float)):
        i = wp.tid()

    @wp.kernel
    def spring(x: wp.array(dtype=wp.vec3), k: float, f: wp.array(dtype=wp.vec3)):
        i = wp.tid()
        f[i] = -k * x[i] * wp.length(x[i])
""")

OURS_LOAD = """
import time, sys; sys.path.insert(0, {d!r})
from compiler.backends import set_cache_dir; set_cache_dir({cache!r})
import compiler as sp, ours_mod
x = sp.zeros(1)
t = time.perf_counter(); sp.launch(ours_mod.noop, 1, inputs=[x]); print(time.perf_counter() - t)
"""

WARP_LOAD = """
import time, sys; sys.path.insert(0, {d!r})
import warp as wp; wp.config.kernel_cache_dir = {cache!r}; wp.config.quiet = True; wp.init()
import warp_mod
x = wp.zeros(1, dtype=float, device="cpu")
t = time.perf_counter(); wp.launch(warp_mod.noop, 1, inputs=[x], device="cpu"); print(time.perf_counter() - t)
"""


def _run(code: str) -> float:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def compile_times(have_warp: bool) -> dict:
    results = {}
    with tempfile.TemporaryDirectory() as d:
        open(os.path.join(d, "ours_mod.py"), "w").write(OURS_MODULE)
        open(os.path.join(d, "warp_mod.py"), "w").write(WARP_MODULE)
        cache = os.path.join(d, "ours_cache")
        results["ours cold compile (s)"] = _run(OURS_LOAD.format(d=d, cache=cache))
        results["ours warm load (s)"] = _run(OURS_LOAD.format(d=d, cache=cache))
        if have_warp:
            wcache = os.path.join(d, "warp_cache")
            results["warp cold compile (s)"] = _run(WARP_LOAD.format(d=d, cache=wcache))
            results["warp warm load (s)"] = _run(WARP_LOAD.format(d=d, cache=wcache))
    return results


def best_of(fn, repeat=7) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def runtime(have_warp: bool) -> dict:
    import compiler as sp
    sys.path.insert(0, tempfile.mkdtemp())
    open(os.path.join(sys.path[0], "ours_rt.py"), "w").write(OURS_MODULE)
    import ours_rt

    results = {}
    x1 = sp.zeros(1)
    launches = 20000
    sp.launch(ours_rt.noop, 1, inputs=[x1])
    results["ours launch overhead (us)"] = best_of(
        lambda: [sp.launch(ours_rt.noop, 1, inputs=[x1]) for _ in range(launches)], 3) / launches * 1e6
    n = 1 << 24
    x, y = sp.array(np.ones(n, np.float32)), sp.array(np.ones(n, np.float32))
    sp.launch(ours_rt.saxpy, n, inputs=[2.0, x, y])
    bytes_moved = 3 * 4 * n
    results["ours saxpy (GB/s)"] = bytes_moved / best_of(lambda: sp.launch(ours_rt.saxpy, n, inputs=[2.0, x, y])) / 1e9
    a, b = np.ones(n, np.float32), np.empty(n, np.float32)
    results["numpy copy (GB/s)"] = 2 * 4 * n / best_of(lambda: np.copyto(b, a)) / 1e9
    if have_warp:
        import warp as wp
        wp.config.quiet = True
        open(os.path.join(sys.path[0], "warp_rt.py"), "w").write(WARP_MODULE)
        import warp_rt
        w1 = wp.zeros(1, dtype=float, device="cpu")
        wp.launch(warp_rt.noop, 1, inputs=[w1], device="cpu")
        results["warp launch overhead (us)"] = best_of(
            lambda: [wp.launch(warp_rt.noop, 1, inputs=[w1], device="cpu") for _ in range(launches)], 3) / launches * 1e6
        wx = wp.array(np.ones(n, np.float32), device="cpu")
        wy = wp.array(np.ones(n, np.float32), device="cpu")
        wp.launch(warp_rt.saxpy, n, inputs=[2.0, wx, wy], device="cpu")
        results["warp saxpy (GB/s)"] = bytes_moved / best_of(
            lambda: wp.launch(warp_rt.saxpy, n, inputs=[2.0, wx, wy], device="cpu")) / 1e9
    return results


def main():
    try:
        import warp  # noqa: F401
        have_warp = True
    except ImportError:
        have_warp = False
        print("warp-lang not installed: measuring ours only (pip install warp-lang)")
    results = {**compile_times(have_warp), **runtime(have_warp)}
    for k, v in results.items():
        print(f"{k:32s} {v:10.4g}")
    if have_warp:
        print(f"\ncold compile ours/warp        {results['ours cold compile (s)'] / results['warp cold compile (s)']:.2f}"
              " (goal <= 0.5)")
        print(f"launch overhead ours/warp     {results['ours launch overhead (us)'] / results['warp launch overhead (us)']:.2f}"
              " (goal <= 1)")
        print(f"saxpy throughput ours/warp    {results['ours saxpy (GB/s)'] / results['warp saxpy (GB/s)']:.2f} (goal >= 1.5)")
    print(f"saxpy vs numpy copy           {results['ours saxpy (GB/s)'] / results['numpy copy (GB/s)']:.2f} (goal >= 0.7)")
    print(f"warm load                     {results['ours warm load (s)'] * 1e3:.1f} ms (goal < 20 ms)")


if __name__ == "__main__":
    main()
