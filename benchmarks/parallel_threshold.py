"""Where OpenMP starts to pay: the wave step kernel at several sizes on 1 thread and on all threads.

    python benchmarks/parallel_threshold.py [--rounds 7] [--calls 200]

For each grid size the kernel is called back to back on the same buffers (its entry point through
ctypes, as a captured graph replays it), once with one OpenMP thread and once with the default
count, interleaved over the rounds (1 all 1 all ...). Prints the medians and spreads (min-max) in
microseconds per call. compiler/codegen/targets.py's PARALLEL_THRESHOLD (threads per launch below
which a launch runs serially) comes from this table: on a busy 2-core machine a parallel launch
that waits at OpenMP's barrier for a descheduled thread costs far more than the work it splits.
"""
from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.peer_impls.ours import B, C, wave_step   # noqa: E402
import stepper as sp                                     # noqa: E402


def per_call(launch, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        launch.entry(launch.buffer, launch.serial)
    return (time.perf_counter() - t0) / calls


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--sizes", type=int, nargs="*", default=[32, 48, 64, 96, 128, 192, 256, 512])
    args = ap.parse_args(argv)
    launches = {}
    for n in args.sizes:
        a = [sp.array(np.random.default_rng(0).random((n, n), np.float32)) for _ in range(2)]
        out = [sp.zeros((n, n)) for _ in range(2)]
        with sp.capture() as graph:
            sp.launch(wave_step, (n, n), inputs=[*a, C, B], outputs=out)
        launches[n] = (graph.launches[0], a, out)
    gomp = ctypes.CDLL(ctypes.util.find_library("gomp") or "libgomp.so.1")   # the kernels' OpenMP runtime
    threads = gomp.omp_get_max_threads()
    times = {(n, t): [] for n in args.sizes for t in (1, threads)}
    for _ in range(args.rounds):
        for n in args.sizes:
            for t in (1, threads):
                gomp.omp_set_num_threads(t)
                times[(n, t)].append(per_call(launches[n][0], args.calls))
    gomp.omp_set_num_threads(threads)
    print(f"wave step kernel, us per call: median (min-max) over {args.rounds} interleaved rounds of "
          f"{args.calls} calls; load average {os.getloadavg()[0]:.1f}")
    print(f"{'n x n':>10} {'threads':>8} {'1 thread':>24} {f'{threads} threads':>24}")
    for n in args.sizes:
        cells = []
        for t in (1, threads):
            xs = [x * 1e6 for x in times[(n, t)]]
            cells.append(f"{statistics.median(xs):8.1f} ({min(xs):.0f}-{max(xs):.0f})")
        print(f"{n:>4} x {n:<4}{n * n:>8} {cells[0]:>24} {cells[1]:>24}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
