"""Forward mode and Hessian-vector products on the nonlinear 2-D wave (CPU), against a rollout and
a gradient of the same model, interleaved rounds, medians with their spread:

- ``jvp / rollout``: `Model.jvp` (the tangent carried beside the state) over a plain rollout;
- ``hvp / gradient``: `Model.hvp(..., gradient=False)` (the second-order sweep alone, what
  `f.hessp` runs) and `Model.hvp` (with the gradient run that gives ``grads`` their bits) over
  `Model.gradient`, all with the same Revolve schedule;
- ``Gauss-Newton / gradient``: `Model.hvp(..., gauss_newton=True, gradient=False)` (one jvp and one
  gradient, what `f.gauss_newton` runs) over `Model.gradient`;
- optionally (``--jax``) JAX's ``jvp(grad(f))`` of the same wave as a ``lax.scan`` with nested
  remat (``jax.checkpoint`` of blocks of ``--block`` steps) over JAX's own ``grad``.

    python benchmarks/second_order.py                        # 256 x 256, 10,000 steps, Revolve-100
    python benchmarks/second_order.py --steps 1000 --rounds 3 --jax
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def ours(n: int, steps: int, snapshots: int, rounds: int) -> dict:
    import numpy as np

    import stepper as sp
    from stepper.bench.problems.wave import make
    problem = make(n)
    model, initial, loss = problem.model, problem.initial, problem.loss
    rng = np.random.default_rng(0)
    direction = {"u": sp.array(rng.standard_normal((n, n)).astype(np.float32))}
    revolve = lambda k: sp.Revolve(k, snapshots)      # noqa: E731
    runs = {
        "rollout": lambda: model.rollout(initial, steps, deterministic=True, progress=False),
        "jvp": lambda: model.jvp(initial, steps, tangents=direction, loss=loss, progress=False),
        "gradient": lambda: model.gradient(initial, steps, loss=loss, schedule=revolve, progress=False),
        "hvp_alone": lambda: model.hvp(initial, steps, direction, loss=loss, schedule=revolve, gradient=False,
                                       progress=False),
        "hvp": lambda: model.hvp(initial, steps, direction, loss=loss, schedule=revolve, progress=False),
        "gauss_newton": lambda: model.hvp(initial, steps, direction, loss=loss, schedule=revolve, gradient=False,
                                          gauss_newton=True, progress=False),
    }
    model.jvp(initial, 3, tangents=direction, loss=loss)
    model.hvp(initial, 3, direction, loss=loss)
    model.hvp(initial, 3, direction, loss=loss, gauss_newton=True)
    times = {k: [] for k in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            times[name].append(_timed(run))
    return times


def jax_times(n: int, steps: int, block: int, rounds: int) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    C, b = 0.25, 1e-3

    def step(carry, _):
        u, up = carry
        lap = jnp.roll(u, 1, 0) + jnp.roll(u, -1, 0) + jnp.roll(u, 1, 1) + jnp.roll(u, -1, 1) - 4.0 * u
        return (2.0 * u - up + C * lap - b * u * u * u, u), None

    @jax.checkpoint
    def blockwise(carry):
        return jax.lax.scan(step, carry, None, length=block)[0]

    def loss(u0):
        carry = jax.lax.scan(lambda c, _: (blockwise(c), None), (u0, u0), None, length=steps // block)[0]
        return jnp.sum(carry[0] ** 2)

    x = np.linspace(-1, 1, n, dtype=np.float32)
    u0 = jnp.asarray(np.exp(-20 * (x[:, None] ** 2 + x[None, :] ** 2)).astype(np.float32))
    v = jnp.asarray(np.random.default_rng(0).standard_normal((n, n)).astype(np.float32))
    fwd = jax.jit(loss)
    grad = jax.jit(jax.grad(loss))
    hvp = jax.jit(lambda u, d: jax.jvp(jax.grad(loss), (u,), (d,))[1])
    jvp = jax.jit(lambda u, d: jax.jvp(loss, (u,), (d,)))
    runs = {"rollout": lambda: fwd(u0).block_until_ready(), "jvp": lambda: jvp(u0, v)[1].block_until_ready(),
            "gradient": lambda: grad(u0).block_until_ready(), "hvp_alone": lambda: hvp(u0, v).block_until_ready()}
    for run in runs.values():
        run()
    times = {k: [] for k in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            times[name].append(_timed(run))
    return times


def _report(label: str, times: dict) -> None:
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{label}: " + ", ".join(f"{k} {med[k]:.3f} s (spread {max(v) - min(v):.3f})" for k, v in times.items()))
    ratios = [("jvp / rollout", "jvp", "rollout"), ("hvp alone / gradient", "hvp_alone", "gradient"),
              ("hvp with grads / gradient", "hvp", "gradient"), ("Gauss-Newton / gradient", "gauss_newton", "gradient")]
    for text, a, b in ratios:
        if a in times:
            per = [x / y for x, y in zip(times[a], times[b])]
            print(f"  {text}: median {statistics.median(per):.2f} (rounds {min(per):.2f}-{max(per):.2f})")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--snapshots", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jax", action="store_true")
    parser.add_argument("--block", type=int, default=100)
    args = parser.parse_args()
    print(f"nonlinear 2-D wave {args.n}x{args.n} float32, {args.steps} steps, Revolve-{args.snapshots}, "
          f"{args.rounds} interleaved rounds, {os.cpu_count()} CPUs")
    _report("stepper", ours(args.n, args.steps, args.snapshots, args.rounds))
    if args.jax:
        _report(f"JAX (scan, remat blocks of {args.block})", jax_times(args.n, args.steps, args.block, args.rounds))


if __name__ == "__main__":
    main()
