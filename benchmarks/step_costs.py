"""Per-step costs against the kernel's own time, contenders interleaved, medians (min-max).

    python benchmarks/step_costs.py                 # both measurements, 5 rounds
    python benchmarks/step_costs.py --rounds 3 --only rollout

- rollout: the 256^2 nonlinear wave (benchmarks/peer_impls), a forward rollout per step with
  trusted steps run from their trace (stepper/rollout.py) and with the step function called every
  step, against the kernel alone replayed from a `capture()` graph on the same buffers.
- pendulums: issue 14's ensemble, 10,000 damped pendulums with a running loss (deterministic), a
  Revolve gradient per step evaluation (forward evaluations + reverse steps), against one launch of
  the forward kernel.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests" / "stepper"))


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def interleaved(contenders: dict, rounds: int) -> dict:
    """{name: [µs per step, one per round]}; each contender returns (seconds, steps)."""
    out = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            seconds, steps = fn()
            out[name].append(seconds / steps * 1e6)
    return out


def rollout_costs(rounds: int, steps: int = 3000) -> list[str]:
    import stepper as sp
    import stepper.rollout as rollout_module
    from peer_impls.ours import make_model, wave_step
    from peer_impls.problem import B, C, initial
    n = 256
    u0 = initial(n)
    model, start = make_model(n), {"up": u0, "u": u0}
    buffers = [sp.array(u0) for _ in range(4)]
    with sp.capture() as graph:
        sp.launch(wave_step, (n, n), inputs=[buffers[0], buffers[1], C, B], outputs=[buffers[2], buffers[3]])

    def kernel():
        began = time.perf_counter()
        for _ in range(steps):
            graph.replay()
        return time.perf_counter() - began, steps

    def roll(loops: bool):
        def run():
            rollout_module.native_loops = loops
            began = time.perf_counter()
            model.rollout(start, steps, progress=False)
            return time.perf_counter() - began, steps
        return run
    roll(True)()
    roll(False)()
    t = interleaved({"kernel": kernel, "trusted": roll(True), "stepwise": roll(False)}, rounds)
    rollout_module.native_loops = True
    return [f"| 256^2 wave rollout, trusted steps from the trace | µs / step | {summary(t['trusted'])} | "
            f"{summary(t['kernel'])} |",
            f"| 256^2 wave rollout, step function every step | µs / step | {summary(t['stepwise'])} | "
            f"{summary(t['kernel'])} |"]


def pendulum_costs(rounds: int, steps: int = 4000) -> list[str]:
    import stepper as sp
    from physics_models import final_theta_squared, omega_squared, pendulum_model, pendulum_step
    n = 10_000
    model, initial = pendulum_model(n=n)
    theta, omega, a, b = (sp.array(np.ones(n), dtype=sp.float64) for _ in range(4))
    length, c = model.params["length"], model.params["c"]

    def kernel():
        began = time.perf_counter()
        for _ in range(1000):
            sp.launch(pendulum_step, n, inputs=[theta, omega, length, c, 0.01], outputs=[a, b])
        return time.perf_counter() - began, 1000

    def gradient():
        began = time.perf_counter()
        r = model.gradient(initial, steps, loss=final_theta_squared, running_loss=omega_squared,
                           schedule=sp.Revolve(steps, 40), progress=False)
        return time.perf_counter() - began, r.stats.forward_steps + r.stats.reverse_steps
    gradient()
    t = interleaved({"kernel": kernel, "gradient": gradient}, rounds)
    return [f"| 10,000 pendulums, running loss, Revolve({steps}, 40) gradient | µs / step evaluation | "
            f"{summary(t['gradient'])} | {summary(t['kernel'])} |"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", choices=["rollout", "pendulums"])
    args = parser.parse_args(argv)
    rows = ["| measurement | unit | ours | kernel alone |", "|---|---|---:|---:|"]
    if args.only in (None, "rollout"):
        rows += rollout_costs(args.rounds)
    if args.only in (None, "pendulums"):
        rows += pendulum_costs(args.rounds)
    print(f"Medians (min-max) over {args.rounds} interleaved rounds.\n")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
