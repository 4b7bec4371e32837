"""Paired A/B of adjoint kernels: the current gather form against an earlier one, in one process.

On a noisy machine a kernel table's adjoint/forward column moves by 10-20% between runs; a change
worth 5% shows only when the two forms run side by side. Per round, each kernel's forward and
adjoint run in both forms, interleaved; the result per kernel is the median of the per-round
ratios (current / before) with its interquartile range.

    OMP_NUM_THREADS=1 taskset -c 1 python benchmarks/paired_adjoints.py --ndim 3 --n 64 --dtype float32 \\
        --orders 2 4 8 --kernels unrolled fwi_dc fwi --before not-reassociated --rounds 15

Kernels: the spellings of benchmarks/stencil_spellings.py, and `fwi_dc`: the FWI update as the FWI
gradient launches it (damping constant, `up` overwritten). `--before`: a form of
kernel_spellings.BEFORE (gather_adjoint's options).
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernel_spellings as ks  # noqa: E402
import stencil_spellings  # noqa: E402


def calls_of(kernels: dict, name: str, shared: dict, shape: tuple) -> tuple:
    """(forward call, adjoint call, the arguments they need alive) of kernel `name`."""
    if name == "fwi_dc":
        return ks.launched_calls(kernels["fwi"], shape, shared)
    args = ks._arguments(name, shared)
    return (*ks._calls(kernels[name], shape, args, "cpu"), args)


def paired(ndim: int, n: int, dname: str, order: int, names: list, before: str, rounds: int) -> list[str]:
    """One line per kernel: medians of its forward and adjoint in both forms, and of the per-round
    ratio of the adjoints (current / before)."""
    shape, dtype = (n,) * ndim, ks.DTYPES[dname]
    label = f"{ndim}d_{order}_{dname}"
    forms = {"now": ks._copies(stencil_spellings.kernels(order, ndim, dtype), label, None),
             "before": ks._copies(stencil_spellings.kernels(order, ndim, dtype), label, before)}
    shared = ks._shared_arguments(shape, dtype, np.random.default_rng(0), order, "cpu")
    calls = {(form, name): calls_of(kernels, name, shared, shape) for form, kernels in forms.items() for name in names}
    for forward, adjoint, _ in calls.values():          # compile, warm up
        forward(), adjoint()
    times = {key: ([], []) for key in calls}
    for _ in range(rounds):
        for key, (forward, adjoint, _) in calls.items():
            times[key][0].append(ks._seconds(forward))
            times[key][1].append(ks._seconds(adjoint))
    lines = []
    for name in names:
        (fn, an), (fb, ab) = (map(np.array, times[(form, name)]) for form in ("now", "before"))
        ratio = an / ab
        lines.append(f"| {ndim}-D {n}^{ndim} | {dname} | {order} | {name} | {np.median(fn) * 1e6:.0f} | "
                     f"{np.median(an) * 1e6:.0f} | {np.median(ab) * 1e6:.0f} | {np.median(ratio):.2f} "
                     f"({np.percentile(ratio, 25):.2f}-{np.percentile(ratio, 75):.2f}) | "
                     f"{np.median(an / fn):.2f} | {np.median(ab / fb):.2f} |")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ndim", type=int, default=3, choices=[2, 3])
    parser.add_argument("--n", type=int, default=64, help="grid side")
    parser.add_argument("--dtype", default="float32", choices=list(ks.DTYPES))
    parser.add_argument("--orders", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--kernels", nargs="+", default=["unrolled", "fwi_dc", "fwi"])
    parser.add_argument("--before", default="not-reassociated", choices=list(ks.BEFORE))
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    print(f"| grid | dtype | order | kernel | forward us | adjoint us | {args.before}: adjoint us | "
          f"adjoint now / {args.before} (IQR) | adjoint/forward | {args.before}: adjoint/forward |")
    print("|---|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for order in args.orders:
        print("\n".join(paired(args.ndim, args.n, args.dtype, order, args.kernels, args.before, args.rounds)),
              flush=True)


if __name__ == "__main__":
    main()
