"""Our FWI forward or Revolve gradient (peer_impls/fwi_ours.py, Devito's problem) against itself with
one change undone, paired in one process: rounds alternate A B, B A, ... and the ratio of each
round's pair is what the median is taken of, so a slow stretch of a noisy machine hits both alike.

    OMP_NUM_THREADS=1 taskset -c 1 python benchmarks/paired_fwi.py --n 1024 --order 8 --modes forward revolve

`--before 3-buffers`: the native runs of steps write u_next into a third buffer, never over the up
the step reads (before stepper/execute/fast/native_loop.py `in_place_renames`). Revolve runs at
`--snapshots` (pyrevolve's count at 1024^2 is 6). `--before loss-first`: the misfit's adjoint runs
before the step's (before stepper/step/trace.py `loss_reversed_last`), so the previous state's
gradient is zero-filled and the copy's adjoint adds into it. `--before adjoint-tables`: the adjoint's
passes read the coefficient table through its pointer at every thread (before compiler/codegen/
memory.py `table_takers`; each side runs a model of its own, built and compiled under its switch).
`--before passes-in-turn`: a two-pass adjoint's passes run one after the other over the whole grid,
their scratch arrays whole, not by blocks of rows in a window (before compiler/codegen/scratch.py). Builds
Devito's problem once (cached in /tmp). `--before no-prefetch`: the CPU loop nests do not prefetch the
next row's streams (before compiler/codegen/prefetch.py). `--before numpy-placement`: CPU arrays where
NumPy puts them, every large one 16 bytes into a page (before compiler/runtime/memory.py
`host_memory` staggered them); each side's model and arrays are made under its switch.

Each side's kernels live in a kernel module of their own (peer_impls/fwi_ours.py loaded once a
side), built the first time it runs, under its switch: the forward's module as well as the
adjoint's entries.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
from peer_impls.devito_peer import build_problem    # noqa: E402
from compiler.codegen import memory, prefetch        # noqa: E402
from compiler.runtime import memory as runtime_memory  # noqa: E402
from stepper.execute.fast import native_loop          # noqa: E402
from stepper.step import step_context, trace          # noqa: E402


def _switch(*modules, name: str, off):
    """(switch `name` in `modules` to `off`, switch it back)."""
    on = getattr(modules[0], name)
    return (lambda: [setattr(m, name, off) for m in modules], lambda: [setattr(m, name, on) for m in modules])


# what each `--before` undoes: (switch it off, switch it back on)
BEFORE = {"3-buffers": _switch(native_loop, name="in_place_renames", off=lambda *_: set()),
          "loss-first": _switch(trace, step_context, name="loss_reversed_last", off=lambda *_: False),
          "adjoint-tables": _switch(memory, name="table_takers", off=lambda *_: ()),
          "passes-in-turn": _switch(memory, name="passes_apart", off=lambda *_: None),
          "no-prefetch": _switch(prefetch, name="plan", off=lambda *_: None),
          "numpy-placement": _switch(runtime_memory, name="host_memory",
                                     off=lambda shape, np_dtype, zero: (np.zeros if zero else np.empty)(shape, np_dtype))}


def runner(side: str, problem: dict, mode: str, snapshots: int):
    """peer_impls/fwi_ours.runner from a copy of that module of its own, `fwi_ours_{side}`: its
    kernels a kernel module of their own, rendered and built apart from the other side's."""
    spec = importlib.util.spec_from_file_location(f"fwi_ours_{side}", os.path.join(HERE, "peer_impls", "fwi_ours.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.runner(problem, mode, snapshots)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--ndim", type=int, default=2, choices=[2, 3])
    ap.add_argument("--order", type=int, default=8, choices=[2, 4, 8])
    ap.add_argument("--modes", nargs="+", default=["forward"], choices=["forward", "revolve", "storeall"])
    ap.add_argument("--before", default="3-buffers", choices=list(BEFORE))
    ap.add_argument("--snapshots", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args(argv)
    path = f"/tmp/stepper-fwi-problem-{args.ndim}d-{args.n}-{args.order}.npz"
    if not os.path.exists(path):
        build_problem(args.n, args.order, np.float32, path, args.ndim)
    problem = dict(np.load(path))
    before, after = BEFORE[args.before]
    for mode in args.modes:
        runs = {}
        for side, switch in (("after", after), ("before", before)):
            switch()
            runs[side] = runner(side, problem, mode, args.snapshots)[0]
        times: dict = {"after": [], "before": []}
        for k in range(args.rounds + 1):                     # round 0 compiles and warms up
            pair = [("after", after), ("before", before)]
            for name, switch in (pair if k % 2 == 0 else pair[::-1]):
                switch()
                t0 = time.perf_counter()
                runs[name]()
                if k:
                    times[name].append(time.perf_counter() - t0)
        after()
        ratios = [a / b for a, b in zip(times["after"], times["before"])]
        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
        print(f"{args.ndim}-D {args.n} order {args.order} {mode}: after {statistics.median(times['after']):.3f} s, "
              f"before ({args.before}) {statistics.median(times['before']):.3f} s, paired after/before "
              f"{statistics.median(ratios):.3f} (IQR {q[0]:.3f}-{q[2]:.3f}), {args.rounds} rounds", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
