"""The same nonlinear wave step spelled the ways users write it: forward and gradient time of each.

    python benchmarks/spellings.py [--n 256] [--steps 1000] [--snapshots 20] [--rounds 3]

Issue 14 asks that no common spelling be more than 1.3x slower than the fastest, forward and
Revolve gradient. Every spelling computes the same step (zero Dirichlet boundary: a boundary
element's next value is 0) except `periodic`, which wraps around; each runs as a stepper model of
two states, (up, u), in float32 unless its name says float64. Contenders run interleaved
(A B C ... A B C ...) for `--rounds` rounds; the table gives medians with (min-max) and the ratio
of each median to the fastest spelling's. Before timing, every Dirichlet spelling's final state and
gradient are checked against the first spelling's (to 1e-3 relative; float32 rounding over a run
reaches 1e-4), so a fast wrong spelling cannot win.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import stepper as sp  # noqa: E402

F2 = sp.array(dtype=sp.float32, ndim=2)
D2 = sp.array(dtype=sp.float64, ndim=2)
C, B = 0.2, 1e-3


@sp.kernel
def guard_per_neighbour(up: F2, u: F2, up_next: F2, u_next: F2):
    i, j = sp.tid()
    n = u.shape[0]
    m = u.shape[1]
    x = u[i, j]
    lap = -4.0 * x
    if i > 0:
        lap += u[i - 1, j]
    if i < n - 1:
        lap += u[i + 1, j]
    if j > 0:
        lap += u[i, j - 1]
    if j < m - 1:
        lap += u[i, j + 1]
    value = 2.0 * x - up[i, j] + 0.2 * lap - 0.001 * x * x * x
    if i == 0 or j == 0 or i == n - 1 or j == m - 1:
        value = 0.0
    up_next[i, j] = x
    u_next[i, j] = value


@sp.kernel
def combined_guard(up: F2, u: F2, up_next: F2, u_next: F2):
    i, j = sp.tid()
    n = u.shape[0]
    x = u[i, j]
    value = float(0.0)
    if i > 0 and j > 0 and i < n - 1 and j < n - 1:
        lap = u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1] - 4.0 * x
        value = 2.0 * x - up[i, j] + 0.2 * lap - 0.001 * x * x * x
    up_next[i, j] = x
    u_next[i, j] = value


@sp.kernel
def size_argument(up: F2, u: F2, n: int, up_next: F2, u_next: F2):
    i, j = sp.tid()
    x = u[i, j]
    value = float(0.0)
    if i > 0 and j > 0 and i < n - 1 and j < n - 1:
        lap = u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1] - 4.0 * x
        value = 2.0 * x - up[i, j] + 0.2 * lap - 0.001 * x * x * x
    up_next[i, j] = x
    u_next[i, j] = value


@sp.kernel
def clamped(up: F2, u: F2, up_next: F2, u_next: F2):
    i, j = sp.tid()
    n = u.shape[0]
    x = u[i, j]
    lap = (u[sp.max(i - 1, 0), j] + u[sp.min(i + 1, n - 1), j] + u[i, sp.max(j - 1, 0)]
           + u[i, sp.min(j + 1, n - 1)] - 4.0 * x)
    value = 2.0 * x - up[i, j] + 0.2 * lap - 0.001 * x * x * x
    if i == 0 or j == 0 or i == n - 1 or j == n - 1:
        value = 0.0
    up_next[i, j] = x
    u_next[i, j] = value


@sp.kernel
def periodic(up: F2, u: F2, up_next: F2, u_next: F2):
    i, j = sp.tid()
    n = u.shape[0]
    x = u[i, j]
    lap = u[(i + 1) % n, j] + u[(i + n - 1) % n, j] + u[i, (j + 1) % n] + u[i, (j + n - 1) % n] - 4.0 * x
    up_next[i, j] = x
    u_next[i, j] = 2.0 * x - up[i, j] + 0.2 * lap - 0.001 * x * x * x


@sp.kernel
def next_only(up: F2, u: F2, u_next: F2):
    i, j = sp.tid()
    n = u.shape[0]
    x = u[i, j]
    value = float(0.0)
    if i > 0 and j > 0 and i < n - 1 and j < n - 1:
        lap = u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1] - 4.0 * x
        value = 2.0 * x - up[i, j] + 0.2 * lap - 0.001 * x * x * x
    u_next[i, j] = value


@sp.kernel
def combined_guard64(up: D2, u: D2, up_next: D2, u_next: D2):
    i, j = sp.tid()
    n = u.shape[0]
    x = u[i, j]
    value = sp.float64(0.0)
    if i > 0 and j > 0 and i < n - 1 and j < n - 1:
        lap = u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1] - 4.0 * x
        value = 2.0 * x - up[i, j] + 0.2 * lap - 0.001 * x * x * x
    up_next[i, j] = x
    u_next[i, j] = value


@sp.kernel
def half_sum_sq(u: F2, out: sp.array(dtype=sp.float32)):
    i, j = sp.tid()
    sp.atomic_add(out, 0, 0.5 * u[i, j] * u[i, j])


@sp.kernel
def half_sum_sq64(u: D2, out: sp.array(dtype=sp.float64)):
    i, j = sp.tid()
    sp.atomic_add(out, 0, 0.5 * u[i, j] * u[i, j])


def spelling_models(n: int) -> dict:
    """name -> (model, dtype); every step function launches its spelling over (n, n)."""
    def model_of(step, dtype=sp.float32):
        model = sp.Model(zero_buffers=False)
        model.state("up", (n, n), dtype)
        model.state("u", (n, n), dtype)
        model.step(step)
        return model, dtype

    def two_outputs(kernel, *extra):
        return lambda s: sp.launch(kernel, (n, n), inputs=[s.prev.up, s.prev.u, *extra], outputs=[s.next.up, s.next.u])

    def with_copy(s):
        sp.launch(next_only, (n, n), inputs=[s.prev.up, s.prev.u], outputs=[s.next.u])
        sp.copy(s.next.up, s.prev.u)

    return {
        "guard per neighbour": model_of(two_outputs(guard_per_neighbour)),
        "one combined guard": model_of(two_outputs(combined_guard)),
        "size as int argument": model_of(two_outputs(size_argument, n)),
        "clamped indices": model_of(two_outputs(clamped)),
        "sp.copy for the 2nd state": model_of(with_copy),
        "float64": model_of(two_outputs(combined_guard64), sp.float64),
        "periodic (%)": model_of(two_outputs(periodic)),
    }


def initial(n: int, dtype) -> dict:
    x = np.linspace(-1, 1, n)
    u0 = np.exp(-20 * (x[:, None] ** 2 + x[None, :] ** 2))
    u0[[0, -1], :] = 0
    u0[:, [0, -1]] = 0
    return {"up": sp.array(u0, dtype=dtype), "u": sp.array(u0, dtype=dtype)}


def loss_of(dtype):
    kernel = half_sum_sq64 if dtype == sp.float64 else half_sum_sq

    def loss(state):
        out = sp.zeros(1, dtype=dtype, requires_grad=True)
        sp.launch(kernel, state.u.shape, inputs=[state.u], outputs=[out])
        return out
    return loss


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--snapshots", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    n, steps = args.n, args.steps
    models = spelling_models(n)
    schedule = lambda: sp.Revolve(steps, args.snapshots)

    reference = None
    for name, (model, dtype) in models.items():          # warm up (compile), and check the answers
        final = model.rollout(initial(n, dtype), steps)
        result = model.gradient(initial(n, dtype), steps, loss=loss_of(dtype), schedule=schedule())
        got = np.concatenate([final.u.numpy().ravel(), result.grads["u"].numpy().ravel()]).astype(np.float64)
        if name.startswith("periodic"):
            continue
        if reference is None:
            reference = got
        err = np.abs(got - reference).max() / np.abs(reference).max()
        if err > 1e-3:                                  # float32 rounding over the run: ~1e-4
            raise SystemExit(f"spelling '{name}' computes something else (relative difference {err:.2g})")

    times = {name: {"forward": [], "gradient": []} for name in models}
    for _ in range(args.rounds):
        for name, (model, dtype) in models.items():
            start = time.perf_counter()
            model.rollout(initial(n, dtype), steps)
            times[name]["forward"].append(time.perf_counter() - start)
            start = time.perf_counter()
            model.gradient(initial(n, dtype), steps, loss=loss_of(dtype), schedule=schedule())
            times[name]["gradient"].append(time.perf_counter() - start)

    fastest = {kind: min(np.median(t[kind]) for t in times.values()) for kind in ("forward", "gradient")}
    print(f"wave {n}x{n}, {steps} steps, Revolve({steps}, {args.snapshots}); {args.rounds} interleaved rounds, "
          f"{os.cpu_count()} CPUs; medians (min-max) in ms, ratio to the fastest spelling")
    print(f"| spelling | forward | ratio | gradient | ratio |\n|---|---:|---:|---:|---:|")
    for name, t in times.items():
        cells = []
        for kind in ("forward", "gradient"):
            v = np.array(t[kind]) * 1e3
            cells += [f"{np.median(v):.0f} ({v.min():.0f}-{v.max():.0f})", f"{np.median(v) / 1e3 / fastest[kind]:.2f}"]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
