"""Where a gather adjoint's time goes: its entry rebuilt without one family of thread variants at a time.

    OMP_NUM_THREADS=1 taskset -c 1 python benchmarks/adjoint_parts.py [--order 8] [--ndim 3] [--n 64]
        [--dtype float32] [--spelling unrolled] [--rounds 9]

The spelling's gather adjoint with every gradient present (benchmarks/stencil_spellings.py, the
kernel-spellings table's launch) is rendered as a grads variant (compiler/codegen/targets.py), and
copies of it are built in which the entry's calls of one family of variants do nothing: the settled
middle, the unsettled interior and its bands, the rows' ends (row_end, corner and their sides),
the rows outside the interior box. Each copy's time, interleaved with the whole entry's, the
project's entry and the forward over the same buffers, says what that family costs. A copy computes
wrong gradients: it is for timing only. CPU, gather forms only (one pass or two: a two-pass form's
pointwise pass stays whole).
"""
import argparse
import ctypes
import re
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import kernel_spellings as ks                         # noqa: E402
import stencil_spellings                              # noqa: E402
import stepper as sp                                  # noqa: E402
from compiler.backends.cpu_build import build_cpu_library, load_cpu_library  # noqa: E402
from compiler.backends.grads_variants import _ADJOINT_ARGS, _CODEGEN  # noqa: E402
from compiler.codegen.targets import CPU, grad_params, grads_variant_name, render_grads_variant  # noqa: E402
from compiler.runtime import launch as launch_module  # noqa: E402

# the variants' names after the gather function's (GatherAdjoint's fields)
FAMILIES = {
    "settled middle": ["interior_settled"],
    "interior and bands": ["interior", "interior_band_first", "interior_band_last"],
    "row ends": ["row_end", "row_end_first{inner}", "row_end_last{inner}", "corner", "corner_first{inner}",
                 "corner_last{inner}"],
    "rows outside the box": ["row", *(f"row_{side}{axis}" for axis in range(3) for side in ("first", "last"))],
}


def without(source: str, entry: str, base: str, names: list[str]) -> str:
    """`source` with the calls of variants `names` (of gather function `base`) in `entry` emptied."""
    at = source.index(f'extern "C" int {entry}(')
    head, body = source[:at], source[at:]
    for name in names:
        body = re.sub(rf"\b{base}_{name}(_thread<[^>]*>|_run)\([^;]*\);", "(void)0;", body)
    return head + body


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--order", type=int, default=8)
    ap.add_argument("--ndim", type=int, default=3)
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--spelling", default="unrolled")
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args(argv)
    dtype = getattr(sp, args.dtype)
    kernel = stencil_spellings.kernels(args.order, args.ndim, dtype)[args.spelling]
    compiled = kernel.compiled()
    if compiled.gather is None:
        print(f"{args.spelling}: no gather form")
        return 1
    shape = (args.n,) * args.ndim
    arrays = ks._arguments(args.spelling, ks._shared_arguments(shape, dtype, np.random.default_rng(0), args.order))
    forward, adjoint = ks._calls(kernel, shape, arrays)
    passes = (compiled.gather.function, compiled.gather.pointwise)
    grads = sum(1 << k for k in grad_params(*(f for f in passes if f is not None)))     # every one
    source = render_grads_variant(compiled.functions(), grads, CPU).source
    base = compiled.gather.function.name
    entry = grads_variant_name(base, grads)
    _, buf, _, _ = launch_module.packed_forward(kernel, shape, arrays, False)
    _, adj, serial = launch_module.packed_adjoint(kernel, shape, arrays, False, {})
    inner = args.ndim - 1
    calls = {"forward": forward, "adjoint (the module's entry)": adjoint}
    for label, names in {"whole entry": [], **FAMILIES}.items():
        text = without(source, entry, base, [n.format(inner=inner) for n in names])
        tag = "whole" if not names else "without_" + re.sub(r"\W", "_", label)
        lib = load_cpu_library(build_cpu_library(text, f"adjoint_parts_{entry}_{tag}", include_dirs=[_CODEGEN]))
        fn = getattr(lib, entry)
        fn.argtypes, fn.restype = _ADJOINT_ARGS, ctypes.c_int
        calls[label if not names else f"without {label}"] = (lambda fn=fn: fn(buf, adj, None, 0, 0, None, serial))
    for call in calls.values():
        call()
    times = {label: [] for label in calls}
    for _ in range(args.rounds):
        for label, call in calls.items():
            times[label].append(ks._seconds(call, 0.05) * 1e6)
    whole = statistics.median(times["whole entry"])
    print(f"{args.ndim}-D {args.n}, order {args.order}, {args.dtype}, {args.spelling}: medians of {args.rounds} "
          f"interleaved rounds, us")
    for label, values in times.items():
        median = statistics.median(values)
        cost = f"  (the family: {whole - median:.0f})" if label.startswith("without") else ""
        print(f"  {label:36s} {median:8.1f} ({min(values):.1f}-{max(values):.1f}){cost}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
