"""Paired A/B of a change to how CPU kernels are built, on the spelling corpus, against today's build.

A variant is one of:
- `--flags="-fira-loop-pressure ..."`: extra GCC options (after compiler/backends/cpu_build.py's GCC_FLAGS;
  with `=`: argparse takes a lone value that starts with a dash for an option of its own);
- `--block-kib 128`: a two-pass adjoint's scratch blocks of that many KiB of roots a thread
  (compiler/codegen/scratch.py's BLOCK_BYTES, today 256).

Both builds of each stencil group (benchmarks/stencil_spellings.py, plus `fwi` as the FWI gradient
launches it: "fwi, damping constant") run in one process on the same arrays; each round times
every kernel's two builds back to back, alternating which goes first (a kernel's place in a
round moves these A/Bs by 1-3%). Printed: today's median microseconds and the median
(interquartile range) of the per-round ratios variant / today, forward and adjoint.

Run on one core and compile or run nothing else on the machine meanwhile, not even on the other
core (on a 2-core VM that moved single runs by 0.6-1.6x):

    OMP_NUM_THREADS=1 taskset -c 1 python benchmarks/build_variants.py --flags=-fira-loop-pressure \
        [--ndim 2] [--n 512] [--dtype float64] [--orders 2 4 8] [--rounds 9] [--spellings table helper]
"""
import argparse
import contextlib
import os
import sys
from unittest import mock

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from compiler.backends import cpu_build  # noqa: E402
from compiler.codegen import scratch  # noqa: E402

import kernel_spellings  # noqa: E402
import stencil_spellings  # noqa: E402


def variant(flags: str | None, block_kib: int | None):
    """(label, a function that makes the context in which kernels build as the variant says)."""
    if flags:
        label = "".join(ch for ch in flags if ch.isalnum())[:48]
        return label, lambda: mock.patch.object(cpu_build, "GCC_FLAGS", cpu_build.GCC_FLAGS + tuple(flags.split()))
    if block_kib:
        return f"block{block_kib}", lambda: mock.patch.object(scratch, "BLOCK_BYTES", block_kib << 10)
    raise SystemExit("name a variant: --flags or --block-kib")


def group_calls(ndim, n, dname, order, spellings, label, build_as):
    """{(build, spelling): (forward, adjoint, arguments kept alive)}, build "today" or "variant"."""
    shape, dtype = (n,) * ndim, kernel_spellings.DTYPES[dname]
    shared = kernel_spellings._shared_arguments(shape, dtype, np.random.default_rng(0), order)
    group = stencil_spellings.kernels(order, ndim, dtype)
    calls = {}
    for build, context in (("today", contextlib.nullcontext()), ("variant", build_as())):
        kernels = kernel_spellings._copies(group, f"{build}_{label}_{ndim}d_{order}_{dname}", None)
        with context:                                      # the calls build their kernels here
            for name, k in kernels.items():
                if not spellings or name in spellings:
                    args = kernel_spellings._arguments(name, shared)
                    calls[(build, name)] = (*kernel_spellings._calls(k, shape, args), args)
            if not spellings or kernel_spellings.CONSTANT_DAMPING in spellings:
                calls[(build, kernel_spellings.CONSTANT_DAMPING)] = kernel_spellings.launched_calls(
                    kernels["fwi"], shape, shared)
            for key, (forward, adjoint, _) in calls.items():
                if key[0] == build:
                    forward(), adjoint()
    return calls


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--flags")
    p.add_argument("--block-kib", type=int)
    p.add_argument("--ndim", type=int, default=2)
    p.add_argument("--n", type=int, default=None, help="grid side (default 512 in 2-D, 64 in 3-D)")
    p.add_argument("--dtype", default="float64", choices=kernel_spellings.DTYPES)
    p.add_argument("--orders", type=int, nargs="+", default=[2, 4, 8])
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--spellings", nargs="+", help="spellings to time (default: all, and the FWI update as launched)")
    a = p.parse_args()
    n = a.n or (512 if a.ndim == 2 else 64)
    label, build_as = variant(a.flags, a.block_kib)
    for order in a.orders:
        calls = group_calls(a.ndim, n, a.dtype, order, a.spellings, label, build_as)
        names = list(dict.fromkeys(name for _, name in calls))
        times = {(build, name, part): [] for build in ("today", "variant") for name in names for part in (0, 1)}
        for r in range(a.rounds):
            builds = ("today", "variant") if r % 2 == 0 else ("variant", "today")
            for name in names:
                for part in (0, 1):
                    for build in builds:
                        times[(build, name, part)].append(kernel_spellings._seconds(calls[(build, name)][part], 0.03))
        print(f"\n{a.ndim}-D {n}^{a.ndim} {a.dtype}, order {order}, {label} / today, {a.rounds} rounds")
        print("| spelling | forward us today | forward ratio | adjoint us today | adjoint ratio |\n|---|---:|---:|---:|---:|")
        for name in names:
            cells = []
            for part in (0, 1):
                ratio = np.array(times[("variant", name, part)]) / np.array(times[("today", name, part)])
                q1, med, q3 = np.percentile(ratio, [25, 50, 75])
                cells += [f"{np.median(times[('today', name, part)]) * 1e6:.0f}", f"{med:.3f} ({q1:.3f}-{q3:.3f})"]
            print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
