"""How `__launch_bounds__` changes stencil kernel time on a GPU: each kernel rebuilt under several
bounds and timed interleaved in one process (benchmarks/kernel_spellings.py's buffers and timing).

    python benchmarks/gpu_launch_bounds.py [--dtype float32] [--forward 2 4 8] [--gather 8]
                                           [--cases 2:2 2:8 3:4 3:8] [--rounds 3]

`--forward` are the blocks per SM asked of forward entries (targets.CUDA_MIN_BLOCKS_PER_SM), `--gather`
those of the gather form's passes for float32 values (targets.CUDA_GATHER_MIN_BLOCKS_PER_SM; float64
values get half). Every combination is built; cases are ndim:order at 4096^2 and 256^3. Prints one line
per (case, kernel, bounds): forward and adjoint us, their ratio, and the forward's bandwidth counted on
its three arrays. Behind the bounds of 2026-11-28 (benchmarks/README.md, eighth session).
"""
from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import kernel_spellings  # noqa: E402
import stencil_spellings  # noqa: E402
import stepper as sp  # noqa: E402
from compiler.codegen import targets  # noqa: E402


def _built(ndim: int, order: int, dtype, forward: int, gather: int) -> dict:
    """The `unrolled` and `fwi` kernels of one case, in a module of their own (rendered for CUDA at
    their first launch, which must come before the bounds change again)."""
    targets.CUDA_MIN_BLOCKS_PER_SM, targets.CUDA_GATHER_MIN_BLOCKS_PER_SM = forward, gather
    group = {name: k for name, k in stencil_spellings.kernels(order, ndim, dtype).items() if name in ("unrolled", "fwi")}
    kernels = kernel_spellings._copies(group, f"bounds_{ndim}d_{order}_{dtype.name}_f{forward}_g{gather}", False)
    for k in kernels.values():
        k.compiled()
    return kernels


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    parser.add_argument("--forward", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--gather", type=int, nargs="+", default=[targets.CUDA_GATHER_MIN_BLOCKS_PER_SM])
    parser.add_argument("--cases", nargs="+", default=["2:2", "2:8", "3:4", "3:8"])
    parser.add_argument("--n2", type=int, default=4096)
    parser.add_argument("--n3", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    dtype, rng = getattr(sp, args.dtype), np.random.default_rng(0)
    defaults = targets.CUDA_MIN_BLOCKS_PER_SM, targets.CUDA_GATHER_MIN_BLOCKS_PER_SM
    for case in args.cases:
        ndim, order = map(int, case.split(":"))
        shape = (args.n2,) * 2 if ndim == 2 else (args.n3,) * 3
        shared = kernel_spellings._shared_arguments(shape, dtype, rng, order, "cuda")
        calls = {}
        try:
            for forward, gather in itertools.product(args.forward, args.gather):
                for name, k in _built(ndim, order, dtype, forward, gather).items():
                    call = kernel_spellings._calls(k, shape, kernel_spellings._arguments(name, shared), "cuda")
                    call[0](), call[1]()     # the CUDA source is rendered at the first launch: under these bounds
                    calls[(name, forward, gather)] = call
        finally:
            targets.CUDA_MIN_BLOCKS_PER_SM, targets.CUDA_GATHER_MIN_BLOCKS_PER_SM = defaults
        times = {key: ([], []) for key in calls}
        for _ in range(args.rounds):
            for key, (forward_call, adjoint_call) in calls.items():
                times[key][0].append(kernel_spellings._seconds(forward_call, device="cuda"))
                times[key][1].append(kernel_spellings._seconds(adjoint_call, device="cuda"))
        array_bytes = int(np.prod(shape)) * dtype.size
        for (name, forward, gather), (f, a) in times.items():
            f_us, a_us = np.median(f) * 1e6, np.median(a) * 1e6
            print(f"{ndim}-D {shape[0]} order {order} {args.dtype} {name:8s} forward {forward} gather {gather}: "
                  f"forward {f_us:7.1f} us ({3 * array_bytes / f_us / 1e3:5.0f} GB/s), adjoint {a_us:7.1f} us, "
                  f"ratio {a_us / f_us:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
