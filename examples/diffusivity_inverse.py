"""Recover a diffusivity field kappa(x) from final temperatures with scipy's L-BFGS-B.

    u_next[i] = u[i] + dt / dx^2 (F[i+1/2] - F[i-1/2]),  F[i+1/2] = kappa_face (u[i+1] - u[i]),
    kappa_face = (kappa[i] + kappa[i+1]) / 2,  u = 0 at both ends

Four different initial temperature profiles diffuse through the same unknown medium; we observe
only their final temperatures. `stepper.value_and_grad` turns the model, the misfit and the
parameter `kappa` into f(theta) -> (misfit, gradient) over a float64 vector, which is exactly what
`scipy.optimize.minimize(jac=True)` wants; bounds keep kappa positive. Every call reverses the
rollout with binomial checkpointing.

Run: python examples/diffusivity_inverse.py [--cells 40] [--steps 400] [--iterations 60]
(needs scipy: pip install scipy)
"""
import argparse

import numpy as np

import stepper as sp

G = sp.array(dtype=sp.float64, ndim=2)


@sp.kernel
def diffuse(u: G, kappa: sp.array(dtype=sp.float64), r: sp.float64, u_next: G):
    k, i = sp.tid()
    n = u.shape[1]
    value = sp.float64(0.0)
    if i > 0 and i < n - 1:
        right = 0.5 * (kappa[i] + kappa[i + 1]) * (u[k, i + 1] - u[k, i])
        left = 0.5 * (kappa[i - 1] + kappa[i]) * (u[k, i] - u[k, i - 1])
        value = u[k, i] + r * (right - left)
    u_next[k, i] = value


@sp.kernel
def misfit(u: G, observed: G, out: sp.array(dtype=sp.float64)):
    k, i = sp.tid()
    d = u[k, i] - observed[k, i]
    sp.atomic_add(out, 0, 0.5 * d * d)


def build(cells, profiles, dt):
    model = sp.Model(dt=dt)
    model.state("u", (profiles, cells), sp.float64)
    model.param("kappa", sp.array(np.ones(cells), dtype=sp.float64))
    r = dt * (cells - 1) ** 2

    @model.step
    def step(s):
        sp.launch(diffuse, (profiles, cells), inputs=[s.prev.u, s.params.kappa, r], outputs=[s.next.u])
    return model


def true_kappa(x):
    return 0.4 + 0.8 * np.exp(-((x - 0.35) / 0.12) ** 2) + 0.3 * (x > 0.7)


def main(cells=40, steps=400, iterations=60):
    try:
        from scipy.optimize import minimize
    except ImportError:
        print("this example needs scipy: pip install scipy")
        return None
    x = np.linspace(0.0, 1.0, cells)
    profiles = np.stack([np.sin(np.pi * m * x) for m in (1, 2, 3, 5)])
    model = build(cells, len(profiles), dt=0.2 / (cells - 1) ** 2 / 1.6)   # stable for kappa <= 1.6
    initial = {"u": sp.array(profiles, dtype=sp.float64)}
    truth = true_kappa(x)
    np.copyto(model.params["kappa"].numpy(), truth)
    observed = sp.array(model.rollout(initial, steps).u.numpy(), dtype=sp.float64)
    np.copyto(model.params["kappa"].numpy(), np.ones(cells))     # the first guess: uniform

    def loss(state):
        out = sp.zeros(1, dtype=sp.float64)
        sp.launch(misfit, state.u.shape, inputs=[state.u, observed], outputs=[out])
        return out

    f = sp.value_and_grad(model, initial, steps, loss=loss, params=["kappa"],
                          schedule=lambda n: sp.Revolve(n, 20))
    first = f(f.x0)[0]
    result = minimize(f, f.x0, jac=True, method="L-BFGS-B", bounds=[(0.05, 1.6)] * cells,
                      options={"maxiter": iterations})
    # The end cells' diffusivity only enters through the faces next to the fixed ends: weakly seen.
    inner = slice(2, cells - 2)
    error0 = np.linalg.norm(f.x0[inner] - truth[inner]) / np.linalg.norm(truth[inner])
    error = np.linalg.norm(result.x[inner] - truth[inner]) / np.linalg.norm(truth[inner])
    print(f"{cells} cells, {len(profiles)} profiles, {steps} steps; L-BFGS-B: {result.nit} iterations, "
          f"{result.nfev} gradients; misfit {first:.3e} -> {result.fun:.3e}; "
          f"relative error of kappa {error0:.3f} -> {error:.3f}")
    return first, float(result.fun), error0, error


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=40)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--iterations", type=int, default=60)
    args = parser.parse_args()
    main(args.cells, args.steps, args.iterations)
