"""How `__launch_bounds__` changes stencil kernel time on a GPU: each kernel rebuilt under several
bounds and timed interleaved in one process (benchmarks/kernel_spellings.py's buffers and timing).

    python benchmarks/gpu_launch_bounds.py [--dtype float32] [--forward 2 4 8] [--gather 8]
                                           [--cases 2:2 2:8 3:4 3:8 wave] [--rounds 3]

`--forward` are the blocks per SM asked of forward entries (targets.CUDA_MIN_BLOCKS_PER_SM), `--gather`
those of the gather form's passes for float32 values (targets.CUDA_GATHER_MIN_BLOCKS_PER_SM; float64
values get half). Every combination is built; cases are ndim:order at 4096^2 and 256^3 (the corpus's
`unrolled` and `fwi`), or `wave`: benchmarks/gpu.py's nonlinear wave (peer_impls/ours.py, float32,
4096^2), whose one-pass gather entry takes 52 registers at 2 blocks an SM and 32 at 8. Prints one line
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
from peer_impls.ours import wave_step  # noqa: E402
from peer_impls.problem import B, C  # noqa: E402


def _built(case: str, dtype, forward: int, gather: int) -> dict:
    """The kernels of one case (see the module's docstring), in a module of their own (rendered for
    CUDA at their first launch, which must come before the bounds change again)."""
    targets.CUDA_MIN_BLOCKS_PER_SM, targets.CUDA_GATHER_MIN_BLOCKS_PER_SM = forward, gather
    if case == "wave":
        group = {"wave": wave_step}
    else:
        ndim, order = map(int, case.split(":"))
        group = {name: k for name, k in stencil_spellings.kernels(order, ndim, dtype).items()
                 if name in ("unrolled", "fwi")}
    kernels = kernel_spellings._copies(group, f"bounds_{case.replace(':', '_')}_{dtype.name}_f{forward}_g{gather}",
                                       False)
    for k in kernels.values():
        k.compiled()
    return kernels


def _arguments(name: str, shared: dict) -> list:
    """Kernel `name`'s arguments from kernel_spellings' shared arrays; the wave's (up, u, c, b,
    up_next, u_next) with its outputs' gradients seeded."""
    if name != "wave":
        return kernel_spellings._arguments(name, shared)
    up_next = sp.zeros(shared["u"].shape, dtype=sp.float32, requires_grad=True, device="cuda")
    up_next.grad.assign(shared["u_next"].grad.numpy())
    return [shared["up"], shared["u"], C, B, up_next, shared["u_next"]]


def calls_under_bounds(case: str, dtype, shape: tuple, shared: dict, bounds, as_launched: bool = False) -> dict:
    """{(kernel name, forward blocks, gather blocks): (forward call, adjoint call, its arguments)}
    for each (forward, gather) pair of `bounds`: the case's kernels built and first launched under
    those bounds (their CUDA source is rendered then), the defaults restored after. The arguments
    stay beside the calls: they hold the launches' pointers. `as_launched`: `fwi` alone, as the FWI
    gradient launches it (kernel_spellings.launched_calls)."""
    defaults = targets.CUDA_MIN_BLOCKS_PER_SM, targets.CUDA_GATHER_MIN_BLOCKS_PER_SM
    calls = {}
    try:
        for forward, gather in bounds:
            for name, k in _built(case, dtype, forward, gather).items():
                if as_launched and name != "fwi":
                    continue
                if as_launched:
                    *call, kernel_args = kernel_spellings.launched_calls(k, shape, shared, "cuda")
                else:
                    kernel_args = _arguments(name, shared)
                    call = kernel_spellings._calls(k, shape, kernel_args, "cuda")
                call[0](), call[1]()
                calls[(name, forward, gather)] = (*call, kernel_args)
    finally:
        targets.CUDA_MIN_BLOCKS_PER_SM, targets.CUDA_GATHER_MIN_BLOCKS_PER_SM = defaults
    return calls


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
    for case in args.cases:
        ndim, order = (2, 2) if case == "wave" else map(int, case.split(":"))
        case_dtype = sp.float32 if case == "wave" else dtype
        shape = (args.n2,) * 2 if ndim == 2 else (args.n3,) * 3
        shared = kernel_spellings._shared_arguments(shape, case_dtype, rng, order, "cuda")
        calls = calls_under_bounds(case, case_dtype, shape, shared, itertools.product(args.forward, args.gather))
        times = {key: ([], []) for key in calls}
        for _ in range(args.rounds):
            for key, (forward_call, adjoint_call, _) in calls.items():
                times[key][0].append(kernel_spellings._seconds(forward_call, device="cuda"))
                times[key][1].append(kernel_spellings._seconds(adjoint_call, device="cuda"))
        array_bytes = int(np.prod(shape)) * case_dtype.size
        for (name, forward, gather), (f, a) in times.items():
            f_us, a_us = np.median(f) * 1e6, np.median(a) * 1e6
            print(f"{ndim}-D {shape[0]} order {order} {case_dtype.name} {name:8s} forward {forward} gather {gather}: "
                  f"forward {f_us:7.1f} us ({3 * array_bytes / f_us / 1e3:5.0f} GB/s), adjoint {a_us:7.1f} us, "
                  f"ratio {a_us / f_us:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
