"""The adjoint kernel's time when a constant field is passed as an array without a gradient.

    python benchmarks/adjoint_subsets.py [--rounds 9] [--calls 50] [--threads 1] [--dtype float32]

A damped wave step (5-point Laplacian in 2-D, 7-point in 3-D) reads a damping profile `damp`. The
contenders launch the same kernel: with `damp` constant (requires_grad=False, as users pass it),
its adjoint through the entry specialised on the gradients present (compiler/backends/
grads_variants.py) and through the module's entry, which tests each gradient pointer (what every
such launch ran before the specialised entries); and with `damp` carrying a gradient that nobody
reads (the workaround issue 28 found faster). Each contender's forward and adjoint entry points are called back to back through ctypes
(what a native step loop calls), interleaved over the rounds; the table gives microseconds per call,
median (min-max), and the adjoint / forward ratio.
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
import stepper as sp                                                   # noqa: E402
from compiler.runtime.launch import packed_adjoint, packed_forward    # noqa: E402

_FORWARD = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_int)
_ADJOINT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int64,
                            ctypes.c_int, ctypes.c_void_p, ctypes.c_int)


def damped_kernels(dtype):
    A2, A3 = sp.array(dtype=dtype, ndim=2), sp.array(dtype=dtype, ndim=3)

    @sp.kernel
    def damped2(up: A2, u: A2, damp: A2, u_next: A2):
        i, j = sp.tid()
        n = u.shape[0]
        m = u.shape[1]
        value = dtype(0.0)
        if i > 0 and j > 0 and i < n - 1 and j < m - 1:
            x = u[i, j]
            lap = u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1] - 4.0 * x
            d = damp[i, j]
            value = (2.0 * x - (1.0 - d) * up[i, j] + 0.2 * lap - 0.001 * x * x * x) / (1.0 + d)
        u_next[i, j] = value

    @sp.kernel
    def damped3(up: A3, u: A3, damp: A3, u_next: A3):
        i, j, k = sp.tid()
        n = u.shape[0]
        m = u.shape[1]
        p = u.shape[2]
        value = dtype(0.0)
        if i > 0 and j > 0 and k > 0 and i < n - 1 and j < m - 1 and k < p - 1:
            x = u[i, j, k]
            lap = (u[i - 1, j, k] + u[i + 1, j, k] + u[i, j - 1, k] + u[i, j + 1, k] + u[i, j, k - 1]
                   + u[i, j, k + 1] - 6.0 * x)
            d = damp[i, j, k]
            value = (2.0 * x - (1.0 - d) * up[i, j, k] + 0.1 * lap - 0.001 * x * x * x) / (1.0 + d)
        u_next[i, j, k] = value

    return damped2, damped3


class Contender:
    """One kernel launch, forward and adjoint, packed once and called through ctypes."""

    def __init__(self, kernel, shape, dtype, damp_grad: bool, module_entry: bool = False):
        rng = np.random.default_rng(0)
        np_dtype = np.float32 if dtype is sp.float32 else np.float64
        up, u = (sp.array(rng.random(shape).astype(np_dtype), requires_grad=True) for _ in range(2))
        damp = sp.array((0.1 * rng.random(shape)).astype(np_dtype), requires_grad=damp_grad)
        out = sp.zeros(shape, dtype=dtype, requires_grad=True)
        out.grad = sp.array(rng.random(shape).astype(np_dtype))
        self.args = [up, u, damp, out]
        entry, self.buffer, self.serial, _ = packed_forward(kernel, shape, self.args, False)
        self.forward_entry = _FORWARD(entry)
        entry, self.adj_buffer, self.adj_serial = packed_adjoint(kernel, shape, self.args, False, {})
        if module_entry:
            gather = kernel.compiled().gather.function.name
            entry = ctypes.cast(kernel.entry(False).function(gather, adjoint=True), ctypes.c_void_p).value
        self.adjoint_entry = _ADJOINT(entry)

    def forward(self, calls: int) -> float:
        t0 = time.perf_counter()
        for _ in range(calls):
            self.forward_entry(self.buffer, self.serial)
        return (time.perf_counter() - t0) / calls

    def adjoint(self, calls: int) -> float:
        t0 = time.perf_counter()
        for _ in range(calls):
            self.adjoint_entry(self.buffer, self.adj_buffer, None, 0, 0, None, self.adj_serial)
        return (time.perf_counter() - t0) / calls


def cell(xs) -> str:
    xs = [x * 1e6 for x in xs]
    return f"{statistics.median(xs):9.1f} ({min(xs):.0f}-{max(xs):.0f})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--n2", type=int, default=256)
    ap.add_argument("--n3", type=int, default=64)
    args = ap.parse_args(argv)
    dtype = sp.float32 if args.dtype == "float32" else sp.float64
    k2, k3 = damped_kernels(dtype)
    contenders = {}
    for kernel, shape in ((k2, (args.n2, args.n2)), (k3, (args.n3,) * 3)):
        contenders[(kernel.__name__, "constant, specialised")] = Contender(kernel, shape, dtype, False)
        contenders[(kernel.__name__, "constant, tested")] = Contender(kernel, shape, dtype, False, True)
        contenders[(kernel.__name__, "damp has a gradient")] = Contender(kernel, shape, dtype, True)
    gomp = ctypes.CDLL(ctypes.util.find_library("gomp") or "libgomp.so.1")
    gomp.omp_set_num_threads(args.threads)
    times = {key: ([], []) for key in contenders}
    for _ in range(args.rounds):
        for key, c in contenders.items():
            times[key][0].append(c.forward(args.calls))
            times[key][1].append(c.adjoint(args.calls))
    print(f"{args.dtype}, {args.threads} thread(s), us per call: median (min-max) over {args.rounds} interleaved "
          f"rounds of {args.calls} calls; load average {os.getloadavg()[0]:.1f}")
    print(f"{'kernel':<9} {'damping':<22} {'forward':>20} {'adjoint':>20} {'adj/fwd':>8} {'adj/specialised':>16}")
    for (name, what), (fwd, adj) in times.items():
        ratio = statistics.median(a / f for a, f in zip(adj, fwd))
        special = times[(name, "constant, specialised")][1]
        versus = statistics.median(a / b for a, b in zip(adj, special))
        print(f"{name:<9} {what:<22} {cell(fwd):>20} {cell(adj):>20} {ratio:8.2f} {versus:16.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
