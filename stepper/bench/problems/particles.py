"""A chain of n particles joined by springs under gravity (vec3 float32, forces scattered with
atomics); loss: final heights squared plus a horizontal drift term."""
import numpy as np

import stepper as sp

from . import Problem

V3 = sp.array(dtype=sp.vec3)
F32 = sp.array(dtype=float)


@sp.kernel
def spring_forces(x: V3, k: F32, f: V3):
    i = sp.tid()           # spring i joins particles i and i + 1
    d = x[i + 1] - x[i]
    length = sp.length(d)
    force = k[0] * (length - 1.0) * d / length
    sp.atomic_add(f, i, force)
    sp.atomic_sub(f, i + 1, force)


@sp.kernel
def integrate(x: V3, v: V3, f: V3, g: F32, dt: float, x_next: V3, v_next: V3):
    i = sp.tid()
    vn = v[i] + dt * (f[i] + sp.vec3(0.0, -g[0], 0.0))
    v_next[i] = vn
    x_next[i] = x[i] + dt * vn


@sp.kernel
def height_loss(x: V3, out: F32):
    i = sp.tid()
    sp.atomic_add(out, 0, x[i][1] * x[i][1] + 0.1 * x[i][0])


def make(n: int, dt: float = 0.01) -> Problem:
    model = sp.Model(dt=dt, name="particles")
    model.state("x", n, sp.vec3)
    model.state("v", n, sp.vec3)
    model.param("k", sp.array([40.0]))
    model.param("g", sp.array([9.8]))

    @model.step
    def step(s):
        f = s.scratch("force", n, sp.vec3)
        sp.launch(spring_forces, n - 1, inputs=[s.prev.x, s.params.k], outputs=[f])
        sp.launch(integrate, n, inputs=[s.prev.x, s.prev.v, f, s.params.g, s.dt], outputs=[s.next.x, s.next.v])

    def loss(state):
        out = sp.zeros(1, requires_grad=True)
        sp.launch(height_loss, n, inputs=[state.x], outputs=[out])
        return out

    rng = np.random.default_rng(1)
    x = np.zeros((n, 3), np.float32)
    x[:, 0] = np.arange(n) * 1.05
    x += 0.05 * rng.standard_normal((n, 3)).astype(np.float32)
    v = (0.1 * rng.standard_normal((n, 3))).astype(np.float32)
    initial = {"x": sp.array(x, dtype=sp.vec3), "v": sp.array(v, dtype=sp.vec3)}
    return Problem("particles", f"spring chain, {n} particles vec3 float32", model, initial, loss)
