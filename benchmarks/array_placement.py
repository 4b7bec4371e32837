"""How much a stencil kernel's time depends on where its arrays lie in memory.

The same compiled kernel, on the same values, with its arrays placed at chosen offsets within their
4 KiB pages: as our allocator places them (compiler/runtime/memory.py: 17 lines further into its
page than the array before, 16 bytes past a line), as NumPy places them (large arrays are mapped pages
plus a 16-byte header, so every one starts 16 bytes into a page), all at a page start, or
staggered by a fixed step per array. Each
placement runs in the same process, interleaved over rounds; medians in microseconds, forward and
adjoint kernel (the compiled entries, as benchmarks/kernel_spellings.py calls them).

Why it matters here: the spelling tables compare kernels run on different arrays, and placement alone
moved one forward kernel by up to 40%, as much as the spread between spellings that the tables were
meant to show (benchmarks/results/kernel-spellings.md now runs every spelling on the same arrays);
the allocator staggers its arrays since the twenty-seventh session (benchmarks/README.md).

Run: OMP_NUM_THREADS=1 taskset -c 1 python benchmarks/array_placement.py [--order 8] [--ndim 2]
[--n 512] [--dtype float32] [--spellings unrolled table fwi] [--rounds 3] [--placements allocator numpy]
"""
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import stepper as sp  # noqa: E402
from compiler.runtime.array import array  # noqa: E402

import kernel_spellings  # noqa: E402
import stencil_spellings  # noqa: E402

PAGE = 4096
PLACEMENTS = {                     # array k (inputs, then gradients) -> offset within its page, bytes
    "allocator": None,
    "numpy": lambda k: 16,
    "page start": lambda k: 0,
    "step 64": lambda k: 64 * k % PAGE,
    "step 576": lambda k: 576 * k % PAGE,
    "step 1024": lambda k: 1024 * k % PAGE,
    "step 1088": lambda k: 1088 * k % PAGE,
    "step 1088 + 16": lambda k: (16 + 1088 * k) % PAGE,      # (the allocator's, from its first array)
}


def _placed(values: np.ndarray, offset: int) -> np.ndarray:
    """A copy of `values` starting `offset` bytes into a page."""
    item = values.dtype.itemsize
    memory = np.empty(values.size + 2 * PAGE // item, values.dtype)
    start = ((-memory.ctypes.data) % PAGE + offset) // item
    out = memory[start:start + values.size].reshape(values.shape)
    out[...] = values
    return out


def _arguments(name, shape, dtype, order, placement):
    shared = kernel_spellings._shared_arguments(shape, dtype, np.random.default_rng(0), order)
    args = kernel_spellings._arguments(name, shared)
    where = PLACEMENTS[placement]
    if where is None:
        return args
    placed = []
    for k, a in enumerate(args):
        if a.ndim != len(shape):
            placed.append(a)                  # the weights
            continue
        b = array._wrap(_placed(a.numpy(), where(k)), dtype, requires_grad=a.requires_grad)
        if a.requires_grad:
            b._grad = array._wrap(_placed(a.grad.numpy(), where(k + len(args))), dtype)
        placed.append(b)
    return placed


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--order", type=int, default=8)
    ap.add_argument("--ndim", type=int, default=2, choices=[2, 3])
    ap.add_argument("--n", type=int, default=512)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--spellings", nargs="+", default=["unrolled", "table", "fwi"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--placements", nargs="+", default=list(PLACEMENTS), choices=list(PLACEMENTS))
    args = ap.parse_args()
    dtype = getattr(sp, args.dtype)
    shape = (args.n,) * args.ndim
    kernels = stencil_spellings.kernels(args.order, args.ndim, dtype)
    calls = {}
    for name in args.spellings:
        for placement in args.placements:
            arrays = _arguments(name, shape, dtype, args.order, placement)
            forward, adjoint = kernel_spellings._calls(kernels[name], shape, arrays)
            forward(), adjoint()
            calls[(name, placement)] = (forward, adjoint, arrays)
    times = {key: ([], []) for key in calls}
    for _ in range(args.rounds):
        for key, (forward, adjoint, _) in calls.items():
            times[key][0].append(kernel_spellings._seconds(forward, 0.05))
            times[key][1].append(kernel_spellings._seconds(adjoint, 0.05))
    print(f"{args.ndim}-D {args.n}^{args.ndim}, order {args.order}, {args.dtype}, {args.rounds} interleaved rounds; "
          "medians (min-max), us")
    print("| spelling | placement | forward | adjoint |\n|---|---|---:|---:|")
    for (name, placement), (f, a) in times.items():
        f, a = np.array(f) * 1e6, np.array(a) * 1e6
        print(f"| {name} | {placement} | {np.median(f):.0f} ({f.min():.0f}-{f.max():.0f}) | "
              f"{np.median(a):.0f} ({a.min():.0f}-{a.max():.0f}) |")


if __name__ == "__main__":
    main()
