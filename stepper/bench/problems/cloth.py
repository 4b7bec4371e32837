"""A square mass-spring cloth hanging from two corners (vec3 float64, structural and shear springs,
forces scattered with atomics); loss: the mean height after the rollout. As examples/cloth.py."""
import numpy as np

import stepper as sp

from . import Problem

vec3d = sp.vector(3, sp.float64)
V = sp.array(dtype=vec3d)
F = sp.array(dtype=sp.float64)


@sp.kernel
def spring_forces(x: V, v: V, springs: sp.array(dtype=int, ndim=2), rest: F, stiffness: F, damping: F, f: V):
    s = sp.tid()
    a = springs[s, 0]
    b = springs[s, 1]
    d = x[b] - x[a]
    length = sp.length(d)
    direction = d / length
    force = (stiffness[0] * (length - rest[s]) + damping[0] * sp.dot(v[b] - v[a], direction)) * direction
    sp.atomic_add(f, a, force)
    sp.atomic_sub(f, b, force)


@sp.kernel
def integrate(x: V, v: V, f: V, pinned: sp.array(dtype=int), mass: sp.float64, dt: sp.float64,
              x_next: V, v_next: V):
    i = sp.tid()
    vn = v[i] + dt * (f[i] / mass + vec3d(0.0, -9.81, 0.0))
    if pinned[i] == 1:
        vn = vec3d()
    v_next[i] = vn
    x_next[i] = x[i] + dt * vn


@sp.kernel
def mean_height(x: V, n: int, out: F):
    i = sp.tid()
    sp.atomic_add(out, 0, x[i][1] / sp.float64(n))


def make(size: int, dt: float = 1e-3) -> Problem:
    n = size * size
    index = np.arange(n).reshape(size, size)
    pairs = [(index[r, c], index[r, c + 1]) for r in range(size) for c in range(size - 1)]
    pairs += [(index[r, c], index[r + 1, c]) for r in range(size - 1) for c in range(size)]
    pairs += [(index[r, c], index[r + 1, c + 1]) for r in range(size - 1) for c in range(size - 1)]
    springs = np.array(pairs, np.int32)
    grid = np.stack(np.meshgrid(np.arange(size), np.arange(size)), -1).reshape(-1, 2) / (size - 1)
    x0 = np.zeros((n, 3))
    x0[:, 0], x0[:, 2] = grid[:, 0], grid[:, 1]          # flat, horizontal
    rest = np.linalg.norm(x0[springs[:, 1]] - x0[springs[:, 0]], axis=1)
    pinned = np.zeros(n, np.int32)
    pinned[[index[0, 0], index[0, size - 1]]] = 1

    model = sp.Model(dt=dt, name="cloth")
    model.state("x", n, vec3d)
    model.state("v", n, vec3d)
    model.param("stiffness", sp.array(np.array([2000.0]), dtype=sp.float64))
    model.param("damping", sp.array(np.array([2.0]), dtype=sp.float64))
    springs_a, rest_a = sp.array(springs, dtype=int), sp.array(rest, dtype=sp.float64)
    pinned_a = sp.array(pinned, dtype=int)

    @model.step
    def step(s):
        f = s.scratch("force", n, vec3d)
        sp.launch(spring_forces, len(springs), inputs=[s.prev.x, s.prev.v, springs_a, rest_a, s.params.stiffness,
                                                       s.params.damping], outputs=[f])
        sp.launch(integrate, n, inputs=[s.prev.x, s.prev.v, f, pinned_a, 0.1, s.dt], outputs=[s.next.x, s.next.v])

    def loss(state):
        out = sp.zeros(1, dtype=sp.float64, requires_grad=True)
        sp.launch(mean_height, n, inputs=[state.x, n], outputs=[out])
        return out

    initial = {"x": sp.array(x0, dtype=vec3d), "v": sp.zeros(n, dtype=vec3d)}
    return Problem("cloth", f"mass-spring cloth, {size}x{size} particles vec3 float64", model, initial, loss)
