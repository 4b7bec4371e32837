"""Per-step cost of a traced advance (a recomputation between checkpoints) against the kernel alone.

    python benchmarks/native_advance.py [--n 256] [--steps 2000] [--rounds 5] [--gradient 10000]

Three contenders, run interleaved (A B C A B C ...) so that a noisy machine hurts them alike:
- kernel: the step's launches called back to back by the native driver on the same buffers (no
  pointer patches, no ring): what the step costs with no bookkeeping at all;
- native: `NativeLoops.advance` over `--steps` steps (the path recomputations take now);
- python: `StepRunner.rerun` step by step (the path they took before), as the executor ran it.
Prints per-step medians and the spread (min-max) over the rounds. With ``--gradient N`` it also
times a Revolve-100 gradient of N steps with the native loops on and off, interleaved.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.peer_impls.ours import OursRunner, loss, make_model   # noqa: E402
from benchmarks.peer_impls.problem import initial   # noqa: E402
import stepper as sp                                 # noqa: E402
from stepper.execute.fast import native_loop         # noqa: E402
from stepper.execute.executor import Sweep           # noqa: E402
from stepper.step.state import State                 # noqa: E402
from stepper.step.step_context import StepRunner     # noqa: E402
from stepper.step.versions import BufferPool         # noqa: E402


def setup(n: int):
    model = make_model(n)
    pool = BufferPool(model.device, model.zero_buffers)
    runner = StepRunner(model, pool, deterministic=True, traced=True)
    u0 = initial(n)
    start = State({name: pool.acquire((n, n), sp.float32, zero=False) for name in ("up", "u")})
    for a in start.values():
        np.copyto(a.numpy(), u0)
    nxt, scratch, _, _ = runner.run(0, start)        # the first run traces the step
    pool.release_all((*nxt.values(), *scratch.values()))
    assert runner.trace, "the wave step should be traced"
    return model, pool, runner, start


def python_path(pool, runner, start, steps: int) -> float:
    t0 = time.perf_counter()
    work = start
    pool.retain_all(work.values())
    for k in range(steps):
        nxt, scratch, _, _ = runner.rerun(k, work)
        pool.release_all(work.values())
        if scratch:
            pool.release_all(scratch.values())
        work = nxt
    pool.release_all(work.values())
    return (time.perf_counter() - t0) / steps


def native_path(loops, runner, start, steps: int) -> float:
    t0 = time.perf_counter()
    loops.pool.retain_all(start.values())           # advance takes over a hold; `start` keeps its own
    out = loops.advance(runner.trace, start, steps)
    loops.pool.release_all(out.values())
    return (time.perf_counter() - t0) / steps


def kernel_only(loops, steps: int) -> float:
    """The packed launches of the plan, called `steps` times on the buffers they were packed with
    (the whole kernel every step: no renamed copies)."""
    plan = loops._plan[1]
    fn = native_loop._driver_functions()[0]
    slots = (ctypes.c_void_p * max(plan.n_slots, 1))()
    t0 = time.perf_counter()
    fn(steps, plan.launches, plan.step_launches, None, 0, slots, None, 0, None, 0, None, None)
    return (time.perf_counter() - t0) / steps


def spread(xs, scale=1e6):
    return f"{statistics.median(xs) * scale:8.1f} (min {min(xs) * scale:.1f}, max {max(xs) * scale:.1f})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--gradient", type=int, default=0, help="steps of a Revolve-100 gradient to time (0: skip)")
    args = ap.parse_args(argv)
    model, pool, runner, start = setup(args.n)
    loops = native_loop.NativeLoops(pool, model.states)
    native_path(loops, runner, start, 10)            # builds the driver and the plan
    python_path(pool, runner, start, 10)
    times = {"kernel": [], "native": [], "python": []}
    for _ in range(args.rounds):
        times["kernel"].append(kernel_only(loops, args.steps))
        times["native"].append(native_path(loops, runner, start, args.steps))
        times["python"].append(python_path(pool, runner, start, args.steps))
    print(f"{args.n}x{args.n} wave step, {args.steps} steps a round, {args.rounds} rounds interleaved, "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '(unset)')}, {os.cpu_count()} cores")
    print("per step, us: median (min, max)")
    for name, xs in times.items():
        print(f"  {name:7s}{spread(xs)}")
    k, nat, py = (statistics.median(times[x]) for x in ("kernel", "native", "python"))
    print(f"  overhead over the kernel: native {(nat - k) * 1e6:+.1f} us, python {(py - k) * 1e6:+.1f} us")
    if args.gradient:
        grad = {True: [], False: []}
        ours = OursRunner(args.n, args.gradient, "revolve", snapshots=100)
        ours.warmup()
        for _ in range(args.rounds):
            for on in (True, False):
                Sweep.native_loops = on
                t0 = time.perf_counter()
                result = ours.model.gradient(ours._initial(), steps=args.gradient, loss=loss,
                                             schedule=sp.Revolve(args.gradient, 100))
                grad[on].append(time.perf_counter() - t0)
                if on:
                    native_steps = result.stats.native_steps
                    forward_steps = result.stats.forward_steps
        Sweep.native_loops = True
        print(f"Revolve-100 gradient, {args.gradient} steps ({forward_steps} step evaluations, "
              f"{native_steps} native), s: median (min, max)")
        print(f"  native on  {spread(grad[True], 1)}")
        print(f"  native off {spread(grad[False], 1)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
