"""What a halo form's adjoint costs against its parts: the form, the same without zeroing its halo, and the no-halo form.

    OMP_NUM_THREADS=1 taskset -c 1 python benchmarks/halo_zeroing.py ORDER DTYPE SPELLING

3-D 64^3, every gradient present, 9 interleaved rounds, medians (min-max) in us. The copy without zeroing
(built with compiler/codegen/scratch.py's zeroing of the halo left out; a window's last halo rows
are still zeroed) computes wrong gradients where scratch held anything: timing only.
"""
import contextlib
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.append(str(Path(__file__).resolve().parent.parent / "tests"))
import numpy as np  # noqa: E402
import gather_forms as gf  # noqa: E402
import kernel_spellings as ks  # noqa: E402
import stencil_spellings  # noqa: E402
from unittest import mock  # noqa: E402
from compiler.codegen import scratch  # noqa: E402


def main() -> None:
    order, dname, name = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    dtype = ks.DTYPES[dname]
    k = stencil_spellings.kernels(order, 3, dtype)[name]
    forms = {"halo": k, "halo, no zeroing": gf.without(k), "no halo": gf.no_halo_copy(k)}
    shape = (64,) * 3
    shared = ks._shared_arguments(shape, dtype, np.random.default_rng(0), order)
    calls = {}
    for label, kern in forms.items():       # (_calls builds each copy's module)
        unzeroed = label == "halo, no zeroing"
        with mock.patch.object(scratch, "_zero_halo", lambda *_: "") if unzeroed else contextlib.nullcontext():
            calls[label] = ks._calls(kern, shape, ks._arguments(name, shared))
    for forward, adjoint in calls.values():       # warm up (and compile)
        forward()
        adjoint()
    times = {label: [] for label in calls}
    for _ in range(9):
        for label, (f, a) in calls.items():
            times[label].append(ks._seconds(a) * 1e6)
    fwd = statistics.median(ks._seconds(calls["halo"][0]) * 1e6 for _ in range(5))
    print(order, dname, name, "forward", round(fwd))
    for label, t in times.items():
        print(f"  {label:20s} {statistics.median(t):7.0f} ({min(t):.0f}-{max(t):.0f})")


if __name__ == "__main__":
    main()
