"""The diffusivity inverse problem (examples/diffusivity_inverse.py) solved with Newton-CG, whose
Hessian-vector products (`f.hessp`, `Model.hvp`) go through the same checkpointed rollout, beside
L-BFGS-B: iterations, gradient and Hessian-vector evaluations, gradient-equivalents and time.
"(GN)" rows use the Gauss-Newton product `f.gauss_newton` (J^T J v: positive semi-definite, one
jvp and one gradient) where the others use the Hessian, which is indefinite at kappa = 1.
"(GN, kept)" rows keep the rollout at each point (`value_and_grad(keep_trajectory=True)`:
store-all memory, here 400 x 4 x 40 doubles): the gradient reverses it, and each product there is a
jvp and a reverse sweep of the kept records, with nothing recomputed.

A gradient-equivalent counts L-BFGS-B's gradient (Revolve(steps, 20)) as 1 and every other
evaluation as its measured cost relative to it (timed here, interleaved, median of 5): a product,
and a gradient that keeps its trajectory. The second table gives the gradient-equivalents each
method needed to first reach a misfit (L-BFGS-B run 4x longer): what it costs to go deeper.

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
    kept = sp.value_and_grad(model, initial, steps, loss=loss, params=["kappa"], keep_trajectory=True)
    return f, kept, truth


def costs_of(f, kept, rounds=5) -> dict:
    """{"hessp" / "gauss_newton" / "kept gradient" / "kept gauss_newton": (median time of one / a
    gradient of `f`, spread)} over interleaved rounds, after one warm-up round (which compiles the
    tangent kernels and their adjoints). A kept gradient is timed at a new point (it keeps a new
    trajectory); a kept product at the point of the kept gradient before it."""
    p = np.random.default_rng(0).standard_normal(f.x0.size)
    points = [f.x0, f.x0 * 0.9 + 0.05]
    runs = {"hessp": lambda k: f.hessp(f.x0, p), "gauss_newton": lambda k: f.gauss_newton(f.x0, p),
            "kept gradient": lambda k: kept(points[k % 2]),
            "kept gauss_newton": lambda k: kept.gauss_newton(points[k % 2], p)}
    for run in runs.values():
        run(0)
    ratios = {name: [] for name in runs}
    for k in range(1, rounds + 1):
        t0 = time.perf_counter()
        f(f.x0)
        grad = time.perf_counter() - t0
        for name, run in runs.items():
            t0 = time.perf_counter()
            run(k)
            ratios[name].append((time.perf_counter() - t0) / grad)
    return {name: (statistics.median(r), max(r) - min(r)) for name, r in ratios.items()}


def counted(f, product, ratio, trace, gradient_cost=1.0):
    """`f` and `product` that append (gradient-equivalents so far, misfit) to `trace` at every
    evaluation of `f`."""
    spent = [0.0]

    def g(theta):
        value, grad = f(theta)
        spent[0] += gradient_cost
        trace.append((spent[0], value))
        return value, grad

    def p(theta, v):
        spent[0] += ratio
        return product(theta, v)
    return g, p


def first_reaching(trace, level):
    for spent, value in trace:
        if value <= level:
            return spent
    return None


def until(f, target):
    """`f` that reports a zero gradient once the misfit is at `target` or below, so that scipy's
    second-order methods stop there (their callbacks cannot stop them)."""
    def g(theta):
        value, grad = f(theta)
        return value, (np.zeros_like(grad) if value <= target else grad)
    return g


def main(cells=40, steps=400, iterations=60, methods=("Newton-CG", "trust-ncg", "trust-krylov", "Newton-CG (GN)",
                                                      "trust-ncg (GN)", "Newton-CG (GN, kept)", "trust-ncg (GN, kept)"),
         levels=()):
    try:
        from scipy.optimize import minimize
    except ImportError:
        print("this example needs scipy: pip install scipy")
        return None
    f, kept, truth = problem(cells, steps)
    costs = costs_of(f, kept)
    ratio, spread = costs["hessp"]
    first = f(f.x0)[0]
    inner = slice(2, cells - 2)

    def error(k):
        return np.linalg.norm(k[inner] - truth[inner]) / np.linalg.norm(truth[inner])

    t0 = time.perf_counter()
    lbfgs = minimize(f, f.x0, jac=True, method="L-BFGS-B", bounds=[(0.05, 1.6)] * cells,
                     options={"maxiter": iterations})
    rows = [("L-BFGS-B", lbfgs.nit, lbfgs.nfev, 0, float(lbfgs.nfev), lbfgs.fun, error(lbfgs.x),
             time.perf_counter() - t0)]
    runs = {}
    for method in methods:
        # Each stops at L-BFGS-B's final misfit; a small first trust radius keeps kappa where the
        # explicit scheme is stable (kappa <= 1.6) while the Hessian is still indefinite.
        name = method.split(" (")[0]
        fn, gradient_cost = (kept, costs["kept gradient"][0]) if method.endswith("kept)") else (f, 1.0)
        product, cost = ((fn.gauss_newton, costs["kept gauss_newton" if fn is kept else "gauss_newton"][0])
                         if "(GN" in method else (f.hessp, ratio))
        options = {"maxiter": iterations} if name == "Newton-CG" else {"maxiter": iterations, "initial_trust_radius": 0.1}
        t0 = time.perf_counter()
        r = minimize(until(fn, lbfgs.fun), f.x0, jac=True, hessp=product, method=name, options=options)
        rows.append((method, r.nit, r.nfev, r.nhev, gradient_cost * r.nfev + cost * r.nhev, r.fun, error(r.x),
                     time.perf_counter() - t0))
        runs[method] = (name, fn, product, cost, gradient_cost, options)
    print(f"{cells} cells, 4 profiles, {steps} steps, Revolve(steps, 20); misfit at kappa = 1: {first:.3e}; "
          f"in gradients (median of 5, spread): a Hessian-vector product {ratio:.2f} ({spread:.2f}), "
          f"a Gauss-Newton product {costs['gauss_newton'][0]:.2f} ({costs['gauss_newton'][1]:.2f}); kept: "
          f"a gradient {costs['kept gradient'][0]:.2f} ({costs['kept gradient'][1]:.2f}), "
          f"a Gauss-Newton product {costs['kept gauss_newton'][0]:.2f} ({costs['kept gauss_newton'][1]:.2f})")
    print(f"{'method':<21} {'iters':>5} {'grads':>5} {'prods':>5} {'grad-equiv':>10} {'misfit':>10} "
          f"{'kappa err':>9} {'time s':>7}")
    for name, it, nf, nh, equiv, fun, err, t in rows:
        print(f"{name:<21} {it:>5} {nf:>5} {nh:>5} {equiv:>10.1f} {fun:>10.3e} {err:>9.3f} {t:>7.2f}")
    if levels:
        deepest = min(levels)
        traces = {"L-BFGS-B": []}
        g, _ = counted(f, None, 0.0, traces["L-BFGS-B"])
        minimize(g, f.x0, jac=True, method="L-BFGS-B", bounds=[(0.05, 1.6)] * cells,
                 options={"maxiter": 4 * iterations, "ftol": 1e-16, "gtol": 1e-14})
        for method, (name, fn, product, cost, gradient_cost, options) in runs.items():
            traces[method] = []
            g, p = counted(fn, product, cost, traces[method], gradient_cost)
            minimize(until(g, deepest), f.x0, jac=True, hessp=p, method=name, options=options)
        print("gradient-equivalents to first reach a misfit of (- : not within the iterations)")
        print(f"{'method':<21} " + " ".join(f"{level:>9.1e}" for level in levels))
        for method, trace in traces.items():
            reached = (first_reaching(trace, level) for level in levels)
            print(f"{method:<21} " + " ".join(f"{r:>9.1f}" if r is not None else f"{'-':>9}" for r in reached))
    return rows, ratio


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=40)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--iterations", type=int, default=60)
    parser.add_argument("--levels", type=float, nargs="*", default=[1e-4, 1e-5, 1e-6, 1e-7, 1e-8, 1e-9],
                        help="misfits for the second table (none: no second table)")
    args = parser.parse_args()
    main(args.cells, args.steps, args.iterations, levels=tuple(args.levels))
