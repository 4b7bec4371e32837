"""How much work a thread of a kernel does, and from how many threads a CPU entry forks OpenMP
threads for it (`parallel_threshold`): the entries' loop nests (codegen/cpu_loops.py) share a
launch out among threads only where the work pays for the fork.
"""
from __future__ import annotations

import math

from .. import ir
from ..builtins import OPS

# A launch forks OpenMP threads when its work (thread_cost per thread, times its threads) reaches
# PARALLEL_WORK units; below, it runs on one thread, as fork/join would cost more than the work it
# splits. Measured with benchmarks/parallel_threshold.py on the 2-core VM (forward and adjoint of a
# 5-point and an 8th-order damped wave step at 32^2..256^2, 1 vs 2 threads, benchmarks/README.md):
# in quiet stretches a second thread paid from about 100k-250k units (5-point forward at 96^2,
# 267k units: 4.1 -> 3.2 us) and not below (32^2, 30k units: 1.5 us on one thread, hundreds on two
# whenever a thread was descheduled; 48^2 adjoint, 392k units: 4.3 -> 4.2 us). 400k keeps a margin.
# While other work holds both cores, a second thread loses at every size (medians 2-4x slower):
# set OMP_NUM_THREADS=1 there. The bar is never above the 32,768 threads of an earlier, fixed
# bar, so the cheapest kernels fork where they did.
PARALLEL_WORK = 400_000
MAX_PARALLEL_THRESHOLD = 32768
# A kernel whose threads loop (or run user adjoints) may do any amount of work per thread: its
# launches fork from this many threads on.
LOOP_PARALLEL_THRESHOLD = 4096

# Relative costs of one thread's statements, in units of an add (scaled by the scalars an op handles):
# a division or square root costs several, a transcendental function a few dozen (on a core that
# vectorises the adds but calls libm for these), an atomic a cache line's round trip.
_OP_COST = {**dict.fromkeys(("div", "cw_div", "mod", "floordiv", "sqrt", "normalize", "length", "inverse"), 4),
            **dict.fromkeys(("sin", "cos", "tan", "asin", "acos", "atan", "atan2", "sinh", "cosh", "tanh", "exp",
                             "log", "log2", "log10", "pow"), 24)}
_NATIVE_COST = 24
_STMT_COST = {ir.Load: 1, ir.Store: 1, ir.ReadGrad: 1, ir.AccumGrad: 1, ir.Atomic: 8}


def thread_cost(fn: ir.Function) -> int | None:
    """An estimate of one thread's work in `fn` (see _OP_COST; both branches of an `if` count), or
    None where it has no bound: loops, whose trip counts are not known, and user adjoints."""
    total = 0
    for s in ir.walk(fn.body):
        if isinstance(s, (ir.Loop, ir.ReverseLoop, ir.CustomAdjoint, ir.CustomReplay)):
            return None
        if isinstance(s, ir.Op):
            scalars = max(_scalars(a.type) for a in (s.out, *s.args))
            total += (_NATIVE_COST if OPS[s.op].definition else _OP_COST.get(s.op, 1)) * scalars
        else:
            total += _STMT_COST.get(type(s), 0)
    return max(total, 1)


def _scalars(t) -> int:
    shape = getattr(t, "inner_shape", ())
    return math.prod(shape) if shape else 1


def parallel_threshold(fn: ir.Function) -> int:
    """Threads from which `fn`'s CPU entry forks OpenMP threads (see PARALLEL_WORK); a launch with
    fewer runs on one thread. A deterministic launch that logs its adds does so from there on, on
    the CPU and a GPU alike (and serially below), so the bits never depend on the thread count."""
    cost = thread_cost(fn)
    if cost is None:
        return LOOP_PARALLEL_THRESHOLD
    return min(MAX_PARALLEL_THRESHOLD, max(1, -(-PARALLEL_WORK // cost)))


__all__ = ["LOOP_PARALLEL_THRESHOLD", "MAX_PARALLEL_THRESHOLD", "PARALLEL_WORK", "parallel_threshold", "thread_cost"]
