"""Where OpenMP starts to pay: forward and adjoint entries of a cheap and an expensive kernel at
several grid sizes on 1 thread and on 2.

    python benchmarks/parallel_threshold.py [--rounds 7] [--calls 100] [--sizes 32 48 64 96 128 192 256]

The kernels are built with no parallel threshold (every launch may fork), then each entry point is
called back to back on the same buffers through ctypes (as a native step loop or a captured graph
calls it), once with one OpenMP thread and once with two, interleaved over the rounds. Prints
microseconds per call, median (min-max), the 2-thread / 1-thread ratio of the medians, and each
entry's cost estimate (compiler/codegen/threads.py's `thread_cost`) times the threads, which is
what the parallel threshold compares with `PARALLEL_WORK`.
"""

import argparse
import ctypes
import ctypes.util
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from compiler.codegen import threads                                   # noqa: E402

threads.PARALLEL_WORK = 0          # every launch may fork: the OpenMP thread count decides
import stepper as sp                                                   # noqa: E402
from compiler.runtime.launch import packed_adjoint, packed_forward    # noqa: E402

F2 = sp.array(dtype=float, ndim=2)
_FORWARD = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_int)
_ADJOINT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int64,
                            ctypes.c_int, ctypes.c_void_p, ctypes.c_int)


@sp.kernel
def cheap(up: F2, u: F2, u_next: F2):
    """The 2nd-order wave step."""
    i, j = sp.tid()
    n = u.shape[0]
    m = u.shape[1]
    value = 0.0
    if i > 0 and j > 0 and i < n - 1 and j < m - 1:
        x = u[i, j]
        lap = u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1] - 4.0 * x
        value = 2.0 * x - up[i, j] + 0.2 * lap
    u_next[i, j] = value


@sp.kernel
def expensive(up: F2, u: F2, damp: F2, u_next: F2):
    """An 8th-order, damped, nonlinear wave step with a transcendental term."""
    i, j = sp.tid()
    n = u.shape[0]
    m = u.shape[1]
    value = 0.0
    if i > 3 and j > 3 and i < n - 4 and j < m - 4:
        x = u[i, j]
        lap = -5.6944444 * x
        lap += 1.6 * (u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1])
        lap += -0.2 * (u[i - 2, j] + u[i + 2, j] + u[i, j - 2] + u[i, j + 2])
        lap += 0.025396825 * (u[i - 3, j] + u[i + 3, j] + u[i, j - 3] + u[i, j + 3])
        lap += -0.0017857143 * (u[i - 4, j] + u[i + 4, j] + u[i, j - 4] + u[i, j + 4])
        d = damp[i, j]
        value = (2.0 * x - (1.0 - d) * up[i, j] + 0.1 * lap - 0.001 * sp.sin(x) * x) / (1.0 + d)
    u_next[i, j] = value


class Entries:
    """A launch's forward and adjoint entries, packed once."""

    def __init__(self, kernel, n):
        rng = np.random.default_rng(0)
        arrays = [sp.array(rng.random((n, n)).astype(np.float32), requires_grad=True)
                  for _ in range(len(kernel.params))]
        arrays[-1].grad = sp.array(rng.random((n, n)).astype(np.float32))
        entry, self.buffer, self.serial, _ = packed_forward(kernel, (n, n), arrays, False)
        self.forward_entry = _FORWARD(entry)
        entry, self.adj_buffer, self.adj_serial = packed_adjoint(kernel, (n, n), arrays, False, {})
        self.adjoint_entry = _ADJOINT(entry)
        self.arrays = arrays
        compiled = kernel.compiled()
        self.cost = {"forward": threads.thread_cost(compiled.forward),
                     "adjoint": threads.thread_cost(compiled.gather.function)}

    def run(self, which: str, calls: int) -> float:
        t0 = time.perf_counter()
        if which == "forward":
            for _ in range(calls):
                self.forward_entry(self.buffer, self.serial)
        else:
            for _ in range(calls):
                self.adjoint_entry(self.buffer, self.adj_buffer, None, 0, 0, None, self.adj_serial)
        return (time.perf_counter() - t0) / calls


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--sizes", type=int, nargs="*", default=[32, 48, 64, 96, 128, 192, 256])
    args = ap.parse_args(argv)
    gomp = ctypes.CDLL(ctypes.util.find_library("gomp") or "libgomp.so.1")   # the kernels' OpenMP runtime
    launches = {(k.__name__, n): Entries(k, n) for k in (cheap, expensive) for n in args.sizes}
    keys = [(name, n, which) for name, n in launches for which in ("forward", "adjoint")]
    times = {(key, t): [] for key in keys for t in (1, 2)}
    for _ in range(args.rounds):
        for name, n, which in keys:
            for t in (1, 2):
                gomp.omp_set_num_threads(t)
                times[((name, n, which), t)].append(launches[(name, n)].run(which, args.calls))
    print(f"us per call: median (min-max) over {args.rounds} interleaved rounds of {args.calls} calls; "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'kernel':<10} {'entry':<8} {'n x n':>10} {'work':>10} {'1 thread':>22} {'2 threads':>22} {'2/1':>6}")
    for name, n, which in keys:
        cells, medians = [], []
        for t in (1, 2):
            xs = [x * 1e6 for x in times[((name, n, which), t)]]
            medians.append(statistics.median(xs))
            cells.append(f"{medians[-1]:8.1f} ({min(xs):.0f}-{max(xs):.0f})")
        work = launches[(name, n)].cost[which] * n * n
        print(f"{name:<10} {which:<8} {n:>4} x {n:<4} {work:>10} {cells[0]:>22} {cells[1]:>22} "
              f"{medians[1] / medians[0]:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
