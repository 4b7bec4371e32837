"""The diffusivity inverse problem (examples/diffusivity_inverse.py) solved with Newton-CG, whose
Hessian-vector products (`f.hessp`, `Model.hvp`) go through the same checkpointed rollout, beside
L-BFGS-B: iterations, gradient and Hessian-vector evaluations, gradient-equivalents and time.

A gradient-equivalent counts a gradient as 1 and a Hessian-vector product as its measured cost
relative to a gradient (timed here, interleaved, median of 5).

Run: python examples/diffusivity_newton.py [--cells 40] [--steps 400] [--iterations 60]
(needs scipy: pip install scipy)
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np

import stepper as sp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from diffusivity_inverse import build, misfit, true_kappa  # noqa: E402


def problem(cells, steps):
    x = np.linspace(0.0, 1.0, cells)
    profiles = np.stack([np.sin(np.pi * m * x) for m in (1, 2, 3, 5)])
    model = build(cells, len(profiles), dt=0.2 / (cells - 1) ** 2 / 1.6)
    initial = {"u": sp.array(profiles, dtype=sp.float64)}
    truth = true_kappa(x)
    np.copyto(model.params["kappa"].numpy(), truth)
    observed = sp.array(model.rollout(initial, steps).u.numpy(), dtype=sp.float64)
    np.copyto(model.params["kappa"].numpy(), np.ones(cells))

    def loss(state):
        out = sp.zeros(1, dtype=sp.float64)
        sp.launch(misfit, state.u.shape, inputs=[state.u, observed], outputs=[out])
        return out
    f = sp.value_and_grad(model, initial, steps, loss=loss, params=["kappa"], schedule=lambda n: sp.Revolve(n, 20))
    return f, truth


def hessp_cost(f, rounds=5) -> tuple[float, float]:
    """(median time of a Hessian-vector product / a gradient, spread) over interleaved rounds,
    after one warm-up round (which compiles the tangent kernels and their adjoints)."""
    p = np.random.default_rng(0).standard_normal(f.x0.size)
    f.hessp(f.x0, p)
    ratios = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        f(f.x0)
        t1 = time.perf_counter()
        f.hessp(f.x0, p)
        t2 = time.perf_counter()
        ratios.append((t2 - t1) / (t1 - t0))
    return statistics.median(ratios), max(ratios) - min(ratios)


def until(f, target):
    """`f` that reports a zero gradient once the misfit is at `target` or below, so that scipy's
    second-order methods stop there (their callbacks cannot stop them)."""
    def g(theta):
        value, grad = f(theta)
        return value, (np.zeros_like(grad) if value <= target else grad)
    return g


def main(cells=40, steps=400, iterations=60, methods=("Newton-CG", "trust-ncg", "trust-krylov")):
    try:
        from scipy.optimize import minimize
    except ImportError:
        print("this example needs scipy: pip install scipy")
        return None
    f, truth = problem(cells, steps)
    ratio, spread = hessp_cost(f)
    first = f(f.x0)[0]
    inner = slice(2, cells - 2)

    def error(k):
        return np.linalg.norm(k[inner] - truth[inner]) / np.linalg.norm(truth[inner])

    t0 = time.perf_counter()
    lbfgs = minimize(f, f.x0, jac=True, method="L-BFGS-B", bounds=[(0.05, 1.6)] * cells,
                     options={"maxiter": iterations})
    rows = [("L-BFGS-B", lbfgs.nit, lbfgs.nfev, 0, float(lbfgs.nfev), lbfgs.fun, error(lbfgs.x),
             time.perf_counter() - t0)]
    for method in methods:
        # Each stops at L-BFGS-B's final misfit; a small first trust radius keeps kappa where the
        # explicit scheme is stable (kappa <= 1.6) while the Hessian is still indefinite.
        options = {"maxiter": iterations} if method == "Newton-CG" else {"maxiter": iterations, "initial_trust_radius": 0.1}
        t0 = time.perf_counter()
        r = minimize(until(f, lbfgs.fun), f.x0, jac=True, hessp=f.hessp, method=method, options=options)
        rows.append((method, r.nit, r.nfev, r.nhev, r.nfev + ratio * r.nhev, r.fun, error(r.x), time.perf_counter() - t0))
    print(f"{cells} cells, 4 profiles, {steps} steps, Revolve(steps, 20); misfit at kappa = 1: {first:.3e}; "
          f"a Hessian-vector product costs {ratio:.2f} gradients (median of 5, spread {spread:.2f})")
    print(f"{'method':<13} {'iters':>5} {'grads':>5} {'hessp':>5} {'grad-equiv':>10} {'misfit':>10} "
          f"{'kappa err':>9} {'time s':>7}")
    for name, it, nf, nh, equiv, fun, err, t in rows:
        print(f"{name:<13} {it:>5} {nf:>5} {nh:>5} {equiv:>10.1f} {fun:>10.3e} {err:>9.3f} {t:>7.2f}")
    return rows, ratio


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=40)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--iterations", type=int, default=60)
    args = parser.parse_args()
    main(args.cells, args.steps, args.iterations)
