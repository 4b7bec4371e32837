"""A 2-D acoustic wave read the way real workloads read: the source's value from a series (one
row a step), receivers sampled every step against observed data from another series by a running
loss, the squared slowness `m` a parameter (benchmarks/step_costs.py's series measurement).

u_next = 2u - up + dt^2/m lap(u) (+ dt^2/m src at the source point), zero outside the grid;
loss = sum over steps and receivers of 0.5 (u_next[receiver] - observed)^2.
"""
from __future__ import annotations

import numpy as np

import stepper as sp

F2 = sp.array(dtype=float, ndim=2)
F1 = sp.array(dtype=float)
I1 = sp.array(dtype=sp.int32)


@sp.kernel
def acoustic(up: F2, u: F2, m: F2, src: F1, sx: int, sy: int, dt2: float, up_next: F2, u_next: F2):
    i, j = sp.tid()
    n = u.shape[0]
    k = u.shape[1]
    x = u[i, j]
    lap = -4.0 * x
    if i > 0:
        lap += u[i - 1, j]
    if i < n - 1:
        lap += u[i + 1, j]
    if j > 0:
        lap += u[i, j - 1]
    if j < k - 1:
        lap += u[i, j + 1]
    value = 2.0 * x - up[i, j] + dt2 / m[i, j] * lap
    if i == sx and j == sy:
        value += dt2 / m[i, j] * src[0]
    up_next[i, j] = x
    u_next[i, j] = value


@sp.kernel
def receivers(u: F2, rx: I1, ry: I1, observed: F1, out: F1):
    r = sp.tid()
    d = u[rx[r], ry[r]] - observed[r]
    sp.atomic_add(out, 0, 0.5 * d * d)


def ricker(steps: int, dt: float, f0: float) -> np.ndarray:
    t = np.arange(steps) * dt - 1.0 / f0
    a = (np.pi * f0 * t) ** 2
    return ((1 - 2 * a) * np.exp(-a)).astype(np.float32)


def acoustic_model(n: int, steps: int):
    """(model, initial, running_loss, fixed): `fixed` holds one step's and its loss's launches on
    buffers of their own, ``[(kernel, dims, inputs, outputs)]``, for timing the kernels alone."""
    dt2 = 0.2                                 # (dt c / h)^2 at m = 1: stable below 0.5
    model = sp.Model(zero_buffers=False)      # the kernel writes every element of s.next
    model.state("up", (n, n), sp.float32)
    model.state("u", (n, n), sp.float32)
    m = model.param("m", sp.array(np.full((n, n), 1.0, np.float32)))
    src = model.series("src", sp.array(ricker(steps, 1.0, 0.05)[:, None] * 10.0))
    observed = model.series("observed", sp.array(np.random.default_rng(0).random((steps, n), np.float32) * 0.01))
    rx = sp.array(np.full(n, n // 4, np.int32), dtype=sp.int32)
    ry = sp.array(np.arange(n, dtype=np.int32), dtype=sp.int32)
    sx = sy = n // 2

    @model.step
    def step(s):
        sp.launch(acoustic, (n, n), inputs=[s.prev.up, s.prev.u, s.params.m, s.series.src, sx, sy, dt2],
                  outputs=[s.next.up, s.next.u])

    def running_loss(s):
        out = s.scratch("misfit", 1, float, zero=True)      # summed into: zero-filled every step
        sp.launch(receivers, n, inputs=[s.next.u, rx, ry, s.series.observed], outputs=[out])
        return out

    zero = np.zeros((n, n), np.float32)
    initial = {"up": zero, "u": zero}
    grids = [sp.array(zero, requires_grad=True) for _ in range(4)]
    out = sp.zeros(1, requires_grad=True)
    row, obs = sp.array(src.numpy()[0]), sp.array(observed.numpy()[0])
    fixed = [(acoustic, (n, n), [grids[0], grids[1], m, row, sx, sy, dt2], [grids[2], grids[3]]),
             (receivers, (n,), [grids[3], rx, ry, obs], [out])]
    return model, initial, running_loss, fixed
