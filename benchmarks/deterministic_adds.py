"""What a deterministic loss costs: one kernel adding n float32 values into one element, run three
ways through its CPU entry (the same packed launch): atomics in any order (not deterministic),
serially in thread order, and in parallel in fixed chunks (compiler/codegen/prelude.h, add_log).

    python benchmarks/deterministic_adds.py [--n 1000000] [--rounds 7]

Interleaved rounds of 20 calls each; medians with (min-max) in microseconds per launch.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import stepper as sp  # noqa: E402

F32 = sp.array(dtype=sp.float32)


@sp.kernel
def sum_squares(x: F32, out: F32):
    i = sp.tid()
    sp.atomic_add(out, 0, x[i] * x[i])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    x = sp.array(np.random.default_rng(0).standard_normal(args.n).astype(np.float32))
    out = sp.zeros(1, dtype=sp.float32)
    with sp.capture() as graph:                     # the packed launch, to call its entry directly
        sp.launch(sum_squares, args.n, inputs=[x], outputs=[out], deterministic=True)
    launch = graph.launches[0]
    ways = {"atomics (any order)": 0, "serial (thread order)": 1, "chunked (fixed order)": 2}
    times = {name: [] for name in ways}
    for _ in range(args.rounds):
        for name, flag in ways.items():
            start = time.perf_counter()
            for _ in range(20):
                launch.entry(launch.buffer, flag)
            times[name].append((time.perf_counter() - start) / 20 * 1e6)
    print(f"{args.n:,} float32 adds into one element, {os.cpu_count()} CPUs, {args.rounds} interleaved rounds")
    for name, t in times.items():
        print(f"{name:<24} {np.median(t):9.1f} us ({min(t):.1f}-{max(t):.1f})")


if __name__ == "__main__":
    main()
