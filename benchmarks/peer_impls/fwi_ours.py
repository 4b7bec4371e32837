"""Ours: Devito's acoustic FWI problem (2-D or 3-D) written the README way (see benchmarks/fwi.py).

The discretisation is Devito's own (`op.ccode` of examples.seismic's forward operator), term for
term: with r1 = 1/dt^2, r2 = 1/dt, m = 1/vp^2 and the central 2nd-derivative weights w of order k,

    u_next = (m r1 (2u - u_prev) + r2 damp u + lap_k(u)) / (m r1 + r2 damp)

on the padded grid (physical + damping layer), zero outside it (the arrays carry a halo of k/2
zeros), then the source's bilinear injection, dt^2 / m src(t), into u_next; the receivers sample
u at every step. The loss is the data misfit 0.5 sum_t sum_r (u_t(rec_r) - d_obs(t, r))^2 as a
running loss, and the gradient is taken with respect to m (a parameter).

Subnormal floats are flushed to zero (`sp.set_flush_denormal(True)`, set by `make_model`), as
Devito's operators do by default (its `avoid_denormals` pass): the same arithmetic on both sides.
Without it the wave's leading edge runs through the CPU's slow path (forward 3.5x slower at 8th
order in float32).

The model is what a user writes from the README: a stencil kernel with a loop over a coefficient
table, an injection kernel, a receiver kernel in `running_loss`, the wavelet and the observed data
as `model.series`.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import stepper as sp                               # noqa: E402

# central second-derivative weights (w_0, w_1, ..., w_r) by order
WEIGHTS = {
    2: (-2.0, 1.0),
    4: (-5.0 / 2.0, 4.0 / 3.0, -1.0 / 12.0),
    8: (-205.0 / 72.0, 8.0 / 5.0, -1.0 / 5.0, 8.0 / 315.0, -1.0 / 560.0),
}


def kernels(order: int, dtype, ndim: int = 2):
    """The three kernels of the problem at `order` in `dtype` on an `ndim`-D grid (a factory, as a
    user writing one model for several orders does)."""
    R = order // 2
    V = sp.array(dtype=dtype)
    I = sp.array(dtype=sp.int32)                    # noqa: E741
    if ndim == 3:
        return _kernels3(R, dtype, V, I)
    A = sp.array(dtype=dtype, ndim=2)

    @sp.kernel
    def acoustic(up: A, u: A, m: A, damp: A, w: V, r1: dtype, r2: dtype, u_next: A):
        i, j = sp.tid()
        n0 = u.shape[0]
        n1 = u.shape[1]
        value = dtype(0.0)
        if i >= R and j >= R and i < n0 - R and j < n1 - R:
            x = u[i, j]
            lap = 2.0 * w[0] * x
            for k in range(1, R + 1):
                lap += w[k] * (u[i - k, j] + u[i + k, j] + u[i, j - k] + u[i, j + k])
            mm = m[i, j]
            d = damp[i, j]
            value = (mm * r1 * (2.0 * x - up[i, j]) + r2 * d * x + lap) / (mm * r1 + r2 * d)
        u_next[i, j] = value

    @sp.kernel
    def inject(m: A, at: I, weights: V, amplitude: V, dt2: dtype, u_next: A):
        a, b = sp.tid()
        i = at[0] + a
        j = at[1] + b
        u_next[i, j] += dt2 * weights[2 * a + b] * amplitude[0] / m[i, j]

    @sp.kernel
    def misfit(u: A, rec: I, observed: V, out: V):
        r = sp.tid()
        d = u[rec[2 * r], rec[2 * r + 1]] - observed[r]
        sp.atomic_add(out, 0, 0.5 * d * d)

    return acoustic, inject, misfit


def _kernels3(R: int, dtype, V, I):                 # noqa: E741
    A = sp.array(dtype=dtype, ndim=3)

    @sp.kernel
    def acoustic(up: A, u: A, m: A, damp: A, w: V, r1: dtype, r2: dtype, u_next: A):
        i, j, l = sp.tid()
        value = dtype(0.0)
        if i >= R and j >= R and l >= R and i < u.shape[0] - R and j < u.shape[1] - R and l < u.shape[2] - R:
            x = u[i, j, l]
            lap = 3.0 * w[0] * x
            for k in range(1, R + 1):
                lap += w[k] * (u[i - k, j, l] + u[i + k, j, l] + u[i, j - k, l] + u[i, j + k, l]
                               + u[i, j, l - k] + u[i, j, l + k])
            mm = m[i, j, l]
            d = damp[i, j, l]
            value = (mm * r1 * (2.0 * x - up[i, j, l]) + r2 * d * x + lap) / (mm * r1 + r2 * d)
        u_next[i, j, l] = value

    @sp.kernel
    def inject(m: A, at: I, weights: V, amplitude: V, dt2: dtype, u_next: A):
        a, b, c = sp.tid()
        i = at[0] + a
        j = at[1] + b
        l = at[2] + c
        u_next[i, j, l] += dt2 * weights[4 * a + 2 * b + c] * amplitude[0] / m[i, j, l]

    @sp.kernel
    def misfit(u: A, rec: I, observed: V, out: V):
        r = sp.tid()
        d = u[rec[3 * r], rec[3 * r + 1], rec[3 * r + 2]] - observed[r]
        sp.atomic_add(out, 0, 0.5 * d * d)

    return acoustic, inject, misfit


def make_model(problem: dict, order: int, dtype=sp.float32):
    """(model, initial state, misfit running loss) for the problem's arrays (benchmarks/fwi.py's
    `problem`), m0 the parameter."""
    R = order // 2
    sp.set_flush_denormal(True)                     # as Devito does (see the module docstring)
    np_dtype = np.float64 if dtype == sp.float64 else np.float32
    ndim = problem["m0"].ndim
    acoustic, inject, misfit = kernels(order, dtype, ndim)
    h, dt = float(problem["spacing"]), float(problem["dt"])
    shape = tuple(int(n) + 2 * R for n in problem["m0"].shape)     # the padded grid plus a zero halo

    def padded(field):
        return sp.array(np.pad(field, R).astype(np_dtype), dtype=dtype)

    w = sp.array(np.array(WEIGHTS[order], np_dtype) / h**2, dtype=dtype)
    damp = padded(problem["damp"])
    src_at = problem["src_index"] + R                               # the injection square's corner
    at = sp.array(src_at.astype(np.int32), dtype=sp.int32)
    weights = sp.array(problem["src_weights"].astype(np_dtype), dtype=dtype)
    rec = sp.array((problem["rec_index"] + R).astype(np.int32).ravel(), dtype=sp.int32)
    nrec = int(problem["rec_index"].shape[0])

    model = sp.Model(dt=dt)
    model.state("up", shape, dtype)
    model.state("u", shape, dtype)
    model.param("m", padded(problem["m0"]))
    model.series("wavelet", sp.array(problem["wavelet"].astype(np_dtype), dtype=dtype))
    model.series("observed", sp.array(problem["observed"].astype(np_dtype), dtype=dtype))
    r1, r2 = 1.0 / dt**2, 1.0 / dt

    @model.step
    def step(s):
        sp.launch(acoustic, shape, inputs=[s.prev.up, s.prev.u, s.params.m, damp, w, r1, r2], outputs=[s.next.u])
        sp.launch(inject, (2,) * ndim, inputs=[s.params.m, at, weights, s.series.wavelet, dt * dt], outputs=[s.next.u])
        sp.copy(s.next.up, s.prev.u)

    def running_loss(s):
        out = s.scratch("misfit", 1, dtype)
        sp.launch(misfit, nrec, inputs=[s.prev.u, rec, s.series.observed], outputs=[out])
        return out

    zeros = np.zeros(shape, np_dtype)
    initial = {"up": sp.array(zeros, dtype=dtype), "u": sp.array(zeros, dtype=dtype)}
    return model, initial, running_loss


def unpadded(grad: np.ndarray, order: int) -> np.ndarray:
    R = order // 2
    return grad[(slice(R, -R),) * grad.ndim]


def runner(problem: dict, mode: str, snapshots: int | None):
    """(a function running `mode` once, what it reports), as devito_peer.runner."""
    order = int(problem["order"])
    dtype = sp.float64 if problem["m0"].dtype == np.float64 else sp.float32
    model, initial, misfit = make_model(problem, order, dtype)
    steps = int(problem["nt"]) - 2
    info = {}

    def forward():
        return model.evaluate(initial, steps, running_loss=misfit)

    def gradient(schedule):
        result = model.gradient(initial, steps, running_loss=misfit, schedule=schedule)
        info["stats"] = {"forward_steps": result.stats.forward_steps,
                         "native_steps": getattr(result.stats, "native_steps", None),
                         "native_reversals": getattr(result.stats, "native_reversals", None)}
        return unpadded(result.grads["m"].numpy(), order)

    if mode == "forward":
        return forward, info
    if mode == "storeall":
        return (lambda: gradient(sp.StoreAll(steps))), info
    return (lambda: gradient(sp.Revolve(steps, snapshots))), info
