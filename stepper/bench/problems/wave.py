"""The nonlinear 2-D wave u_next = 2u - u_prev + C lap(u) - b u^3 on a periodic n x n grid
(float32); loss: the sum of the final u squared."""
import numpy as np

import stepper as sp

from . import Problem

G = sp.array(dtype=float, ndim=2)


@sp.kernel
def wave_step(u: G, up: G, C: float, b: float, n: int, u_next: G, up_next: G):
    i, j = sp.tid()
    c = u[i, j]
    lap = u[(i + 1) % n, j] + u[(i + n - 1) % n, j] + u[i, (j + 1) % n] + u[i, (j + n - 1) % n] - 4.0 * c
    u_next[i, j] = 2.0 * c - up[i, j] + C * lap - b * c * c * c
    up_next[i, j] = c


@sp.kernel
def sum_squares(u: G, out: sp.array(dtype=float)):
    i, j = sp.tid()
    sp.atomic_add(out, 0, u[i, j] * u[i, j])


def make(n: int, C: float = 0.25, b: float = 1e-3) -> Problem:
    model = sp.Model(zero_buffers=False, name="wave")     # the kernel writes every element
    model.state("u", (n, n))
    model.state("u_prev", (n, n))

    @model.step
    def step(s):
        sp.launch(wave_step, (n, n), inputs=[s.prev.u, s.prev.u_prev, C, b, n], outputs=[s.next.u, s.next.u_prev])

    def energy(state):
        out = sp.zeros(1)
        sp.launch(sum_squares, (n, n), inputs=[state.u], outputs=[out])
        return out

    x = np.linspace(-1, 1, n, dtype=np.float32)
    u0 = np.exp(-20 * (x[:, None] ** 2 + x[None, :] ** 2)).astype(np.float32)
    initial = {"u": sp.array(u0), "u_prev": sp.array(u0)}
    return Problem("wave", f"nonlinear 2-D wave, {n}x{n} float32", model, initial, energy)
