"""Full-waveform inversion (FWI) of Devito's 2-D acoustic example, written the README way.

Devito's FWI tutorial (examples/seismic/tutorials/03_fwi): a 2.5 km/s medium with a 3.0 km/s disc,
spacing 10 m, Ricker sources (10 Hz) down the left edge, receivers down the right edge, an
absorbing (damping) layer around the domain; recover the disc from the recorded data starting
from the background. The unknown is the squared slowness m = 1/v^2 (s^2/km^2); the wave equation
``m u_tt - lap(u) + damp u_t = q`` is stepped 2nd order in time and space, with the damping term
centred in time (Devito 4.8 takes it one-sided, r2 damp u; benchmarks/peer_impls/fwi_ours.py is
Devito's update term for term):

    u_next = (dt^2/h^2 lap(u) + m (2u - up) + dt/2 damp up) / (m + dt/2 damp)

All shots run at once: the state is (shots, x, z). Every step reads the source's value from a
series (`model.series`: a row per step), injects it at each shot's off-grid source position with
bilinear weights, and the running loss samples the new field at the off-grid receivers against the
observed data (another series): the sources-and-receivers pattern of the README, whose adjoints the
compiler generates (the injection's scatter and the sampling's gather and their reverses). The
gradient reverses the rollout with Revolve; scipy's L-BFGS-B updates m inside the physical domain
(`stepper.value_and_grad`). Writes fwi.png (true, starting and recovered velocity) if matplotlib
is installed.

Run: python examples/fwi.py [--size 61] [--shots 5] [--iterations 12]   (about 40 s on 2 cores)
"""
import argparse
import time

import numpy as np

import stepper as sp

G2 = sp.array(dtype=float, ndim=2)
G3 = sp.array(dtype=float, ndim=3)
I2 = sp.array(dtype=sp.int32, ndim=2)
I3 = sp.array(dtype=sp.int32, ndim=3)
F1 = sp.array(dtype=float)


@sp.kernel
def acoustic(up: G3, u: G3, m: G2, damp: G2, r: float, dt: float, up_next: G3, u_next: G3):
    s, i, j = sp.tid()
    nx = u.shape[1]
    nz = u.shape[2]
    x = u[s, i, j]
    lap = -4.0 * x
    if i > 0:
        lap += u[s, i - 1, j]
    if i < nx - 1:
        lap += u[s, i + 1, j]
    if j > 0:
        lap += u[s, i, j - 1]
    if j < nz - 1:
        lap += u[s, i, j + 1]
    a = 0.5 * dt * damp[i, j]
    u_next[s, i, j] = (r * lap + m[i, j] * (2.0 * x - up[s, i, j]) + a * up[s, i, j]) / (m[i, j] + a)
    up_next[s, i, j] = x


# -- the sources-and-receivers pattern --------------------------------------------------------------
def bilinear(points):
    """Off-grid positions (in grid units, ``[[x, z], ...]``) as the corner below-left of each
    (int32, (P, 2)) and the weights of its four corners (float32, (P, 4): (0,0), (0,1), (1,0), (1,1))."""
    points = np.asarray(points, np.float64)
    corner = np.floor(points).astype(np.int32)
    fx, fz = (points - corner).T
    weights = np.stack([(1 - fx) * (1 - fz), (1 - fx) * fz, fx * (1 - fz), fx * fz], axis=1)
    return sp.array(corner, dtype=sp.int32), sp.array(weights.astype(np.float32))


@sp.kernel
def inject(m: G2, corner: I2, weight: G2, value: F1, dt2: float, u_next: G3):
    """Adds value * dt^2 / m, spread over the four corners around shot s's source (launch (shots, 4))."""
    s, c = sp.tid()
    i = corner[s, 0] + c // 2
    j = corner[s, 1] + c % 2
    sp.atomic_add(u_next, s, i, j, weight[s, c] * dt2 / m[i, j] * value[0])


@sp.func
def receiver_value(u: G3, corner: I2, weight: G2, s: int, r: int) -> float:
    """The field of shot s interpolated at receiver r."""
    i = corner[r, 0]
    j = corner[r, 1]
    return weight[r, 0] * u[s, i, j] + weight[r, 1] * u[s, i, j + 1] + weight[r, 2] * u[s, i + 1, j] \
        + weight[r, 3] * u[s, i + 1, j + 1]


@sp.kernel
def receivers_misfit(u: G3, corner: I2, weight: G2, observed: G2, out: F1):
    """0.5 (field at the receiver - observed)^2, summed over shots and receivers (launch (shots, receivers))."""
    s, r = sp.tid()
    d = receiver_value(u, corner, weight, s, r) - observed[s, r]
    sp.atomic_add(out, 0, 0.5 * d * d)


@sp.kernel
def receivers_record(u: G3, corner: I2, weight: G2, out: G2):
    s, r = sp.tid()
    out[s, r] = receiver_value(u, corner, weight, s, r)


def ricker(steps: int, dt: float, f0: float = 0.010) -> np.ndarray:
    """Devito's Ricker wavelet (f0 in kHz, times in ms), peaking at 1/f0."""
    t = np.arange(steps) * dt - 1.0 / f0
    a = (np.pi * f0 * t) ** 2
    return ((1 - 2 * a) * np.exp(-a)).astype(np.float32)


class Problem:
    """The geometry of Devito's FWI tutorial at `size` points a side (spacing 10 m) with an
    absorbing layer of `nbl` points, `shots` sources and `size` receivers, recording `tn` ms."""

    def __init__(self, size=61, nbl=20, shots=5, tn=600.0, h=10.0):
        self.size, self.nbl, self.shots, self.h = size, nbl, shots, h
        n = size + 2 * nbl
        self.shape = (n, n)
        x, z = np.mgrid[0:n, 0:n]
        inside = (x - (n - 1) / 2) ** 2 + (z - (n - 1) / 2) ** 2 <= (size * 0.15) ** 2
        self.v_true = np.where(inside, 3.0, 2.5).astype(np.float32)          # km/s
        self.v_start = np.full(self.shape, 2.5, np.float32)
        self.dt = 0.42 * h / 3.0                                              # ms, Devito's CFL
        self.steps = int(tn / self.dt) + 1
        last = nbl + size - 1
        depth = np.maximum.reduce([nbl - x, x - last, nbl - z, z - last, np.zeros_like(x)])   # into the layer
        self.damp = (0.2 * (depth / nbl) ** 2).astype(np.float32)            # 1/ms, zero inside
        self.physical = depth == 0
        # sources at x = 20 m, receivers at x = size h - 20 m, at off-grid depths down the domain
        src_z = nbl + np.linspace(0.5, size - 1.5, shots)
        rec_z = nbl + np.linspace(0.25, size - 1.25, size)
        self.sources = bilinear(np.stack([np.full(shots, nbl + 2.0), src_z], axis=1))
        self.receivers = bilinear(np.stack([np.full(size, nbl + size - 3.0), rec_z], axis=1))
        self.wavelet = ricker(self.steps, self.dt)

    def model(self, v, observed=None):
        """The model with squared slowness 1/v^2 as its parameter 'm'; with `observed` (steps,
        shots, receivers) also the series the running loss reads."""
        dt, (corner, weight) = self.dt, self.sources
        r, shape = (dt / self.h) ** 2, (self.shots, *self.shape)
        model = sp.Model(zero_buffers=False)                  # the step writes every point of s.next
        model.state("up", shape, float)
        model.state("u", shape, float)
        model.param("m", sp.array((1.0 / v.astype(np.float64) ** 2).astype(np.float32)))
        model.series("wavelet", sp.array(self.wavelet))
        damp = sp.array(self.damp)
        if observed is not None:
            model.series("observed", sp.array(observed.astype(np.float32)))

        @model.step
        def step(s):
            sp.launch(acoustic, shape, inputs=[s.prev.up, s.prev.u, s.params.m, damp, r, dt],
                      outputs=[s.next.up, s.next.u])
            sp.launch(inject, (self.shots, 4), inputs=[s.params.m, corner, weight, s.series.wavelet, dt * dt],
                      outputs=[s.next.u])
        return model

    def initial(self):
        zero = np.zeros((self.shots, *self.shape), np.float32)
        return {"up": zero, "u": zero}

    def record(self, v) -> np.ndarray:
        """The receivers' data (steps, shots, receivers) in the medium of velocity v."""
        model = self.model(v)
        corner, weight = self.receivers
        row = sp.zeros((self.shots, self.size))
        data = np.empty((self.steps, self.shots, self.size), np.float32)

        def keep(n, state):
            sp.launch(receivers_record, (self.shots, self.size), inputs=[state.u, corner, weight], outputs=[row])
            data[n - 1] = row.numpy()
        model.rollout(self.initial(), self.steps, callback=keep, every=1, progress=False)
        return data

    def running_loss(self, s):
        corner, weight = self.receivers
        out = s.scratch("misfit", 1, float, zero=True)        # summed into: zero-filled every step
        sp.launch(receivers_misfit, (self.shots, self.size), inputs=[s.next.u, corner, weight, s.series.observed],
                  outputs=[out])
        return out


def main(size=61, shots=5, iterations=12, snapshots=20, png="fwi.png"):
    from scipy.optimize import minimize
    problem = Problem(size=size, shots=shots)
    steps = problem.steps
    observed = problem.record(problem.v_true)
    model = problem.model(problem.v_start, observed)
    f = sp.value_and_grad(model, problem.initial(), steps, running_loss=problem.running_loss, params=["m"],
                          schedule=lambda n: sp.Revolve(n, snapshots))
    m0 = f.x0.copy()
    # Only the physical domain is updated (the damping layer keeps the background); velocities
    # stay between 1.5 and 4.5 km/s.
    inside = problem.physical.reshape(-1)
    bounds = [(1 / 4.5 ** 2, 1 / 1.5 ** 2) if keep else (m, m) for keep, m in zip(inside, m0)]
    history, scale = [], []

    def objective(theta):                  # scaled to start at 1 (L-BFGS-B's tolerances are absolute)
        began = time.perf_counter()
        loss, grad = f(theta)
        history.append(loss)
        scale.append(scale[0] if scale else 1.0 / loss)
        print(f"evaluation {len(history)}: misfit {loss:.6g}  ({time.perf_counter() - began:.2f} s a gradient, "
              f"{steps} steps, {shots} shots at once)")
        return loss * scale[0], grad * scale[0]

    print(f"{size}x{size} + {problem.nbl}-point damping layer, {shots} shots, {steps} steps of {problem.dt:.2f} ms, "
          f"Revolve({steps}, {snapshots})")
    began = time.perf_counter()
    result = minimize(objective, m0, jac=True, method="L-BFGS-B", bounds=bounds,
                      options={"maxiter": iterations, "maxfun": 2 * iterations})
    recovered = (1.0 / np.sqrt(result.x)).reshape(problem.shape)
    error = lambda v: float(np.sqrt(np.mean((v - problem.v_true)[problem.physical] ** 2)))   # noqa: E731
    print(f"{time.perf_counter() - began:.1f} s; misfit {history[0]:.4g} -> {min(history):.4g}; velocity error "
          f"{error(problem.v_start):.4f} -> {error(recovered):.4f} km/s (root mean square over the physical domain)")
    if png:
        save_png(png, problem, recovered)
    return history, error(problem.v_start), error(recovered)


def save_png(path, problem, recovered):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: skipping the picture (pip install matplotlib)")
        return
    nbl, size = problem.nbl, problem.size
    inner = (slice(nbl, nbl + size), slice(nbl, nbl + size))
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.4))
    for ax, (title, v) in zip(axes, [("true", problem.v_true), ("start", problem.v_start), ("recovered", recovered)]):
        im = ax.imshow(v[inner].T, cmap="viridis", vmin=2.4, vmax=3.1)
        ax.set_title(f"{title} velocity (km/s)")
        ax.axis("off")
    fig.colorbar(im, ax=axes, shrink=0.8)
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=61)
    parser.add_argument("--shots", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=12)
    parser.add_argument("--snapshots", type=int, default=20)
    parser.add_argument("--png", default="fwi.png")
    args = parser.parse_args()
    main(args.size, args.shots, args.iterations, args.snapshots, args.png)
