"""A mass-spring cloth, and the gradient of its sag with respect to stiffness and damping.

A square cloth hangs from its top corners under gravity. Each step computes spring forces
(scattered with atomics) and integrates with semi-implicit Euler. We differentiate the mean height
of the cloth after the rollout with respect to the spring stiffness and the damping coefficient,
reversing the rollout with binomial checkpointing, and check both against float64 central finite
differences of full rollouts.

Run: python examples/cloth.py [--size 16] [--steps 800]
"""
import argparse
import time

import numpy as np

import stepper as sp

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
    stretch = stiffness[0] * (length - rest[s])
    relative = sp.dot(v[b] - v[a], direction)
    force = (stretch + damping[0] * relative) * direction
    sp.atomic_add(f, a, force)
    sp.atomic_sub(f, b, force)


@sp.kernel
def integrate(x: V, v: V, f: V, pinned: sp.array(dtype=int), mass: sp.float64, dt: sp.float64,
              x_next: V, v_next: V):
    i = sp.tid()
    gravity = vec3d(0.0, -9.81, 0.0)
    vn = v[i] + dt * (f[i] / mass + gravity)
    if pinned[i] == 1:
        vn = vec3d()
    v_next[i] = vn
    x_next[i] = x[i] + dt * vn


@sp.kernel
def mean_height(x: V, n: int, out: F):
    i = sp.tid()
    sp.atomic_add(out, 0, x[i][1] / sp.float64(n))


def build(size: int, dt: float, device: str = "cpu"):
    """The cloth's model and initial state: `size` x `size` particles, structural and shear springs."""
    n = size * size
    index = np.arange(n).reshape(size, size)
    pairs = [(index[r, c], index[r, c + 1]) for r in range(size) for c in range(size - 1)]
    pairs += [(index[r, c], index[r + 1, c]) for r in range(size - 1) for c in range(size)]
    pairs += [(index[r, c], index[r + 1, c + 1]) for r in range(size - 1) for c in range(size - 1)]
    springs = np.array(pairs, np.int32)
    spacing = 1.0 / (size - 1)
    grid = np.stack(np.meshgrid(np.arange(size), np.arange(size)), -1).reshape(-1, 2) * spacing
    x0 = np.zeros((n, 3))
    x0[:, 0], x0[:, 2] = grid[:, 0], grid[:, 1]          # flat, horizontal
    rest = np.linalg.norm(x0[springs[:, 1]] - x0[springs[:, 0]], axis=1)
    pinned = np.zeros(n, np.int32)
    pinned[[index[0, 0], index[0, size - 1]]] = 1

    model = sp.Model(dt=dt, device=device)
    model.state("x", n, vec3d)
    model.state("v", n, vec3d)
    model.param("stiffness", sp.array(np.array([2000.0]), dtype=sp.float64, device=device))
    model.param("damping", sp.array(np.array([2.0]), dtype=sp.float64, device=device))
    springs_a = sp.array(springs, dtype=int, device=device)
    rest_a, pinned_a = sp.array(rest, dtype=sp.float64, device=device), sp.array(pinned, dtype=int, device=device)
    mass = 0.1

    @model.step
    def step(s):
        f = s.scratch("force", n, vec3d)
        sp.launch(spring_forces, len(springs), inputs=[s.prev.x, s.prev.v, springs_a, rest_a, s.params.stiffness,
                                                       s.params.damping], outputs=[f])
        sp.launch(integrate, n, inputs=[s.prev.x, s.prev.v, f, pinned_a, mass, s.dt], outputs=[s.next.x, s.next.v])

    initial = {"x": sp.array(x0, dtype=vec3d, device=device), "v": sp.zeros(n, dtype=vec3d, device=device)}
    return model, initial


def sag_loss(n, device="cpu"):
    def loss(state):
        out = sp.zeros(1, dtype=sp.float64, requires_grad=True, device=device)
        sp.launch(mean_height, n, inputs=[state.x, n], outputs=[out])
        return out
    return loss


def main(size=16, steps=800, dt=1e-3, snapshots=12, device="cpu"):
    model, initial = build(size, dt, device)
    n = size * size
    loss = sag_loss(n, device)
    start = time.perf_counter()
    result = model.gradient(initial, steps, loss=loss, schedule=sp.Revolve(steps, snapshots))
    elapsed = time.perf_counter() - start
    print(f"{size}x{size} cloth, {steps} steps: mean height {result.loss:+.6f} "
          f"({result.stats.forward_steps} forward steps with {snapshots} snapshots, {elapsed:.2f} s)")

    fd = {}
    for name, eps in (("stiffness", 1e-3), ("damping", 1e-5)):
        param = model.params[name]
        base = param.numpy()[0]
        values = []
        for sign in (+1, -1):
            param.fill_(base + sign * eps)
            values.append(model.gradient(initial, steps, loss=loss, schedule=sp.StoreAll(steps)).loss)
        param.fill_(base)
        fd[name] = (values[0] - values[1]) / (2 * eps)
        ours = result.grads[name].numpy()[0]
        print(f"d(mean height)/d({name}) = {ours:+.8e}   finite differences {fd[name]:+.8e}   "
              f"relative difference {abs(ours - fd[name]) / abs(fd[name]):.1e}")
    return {k: (result.grads[k].numpy()[0], fd[k]) for k in fd}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    args = parser.parse_args()
    main(args.size, args.steps, device=args.device)
