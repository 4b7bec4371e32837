"""A run whose length is not known in advance: stop when the energy falls below a threshold.

A chain of damped, nonlinear springs starts stretched and rings down. We run until its total
energy drops below a threshold (`until=`), so the number of steps is learned during the forward
sweep, and differentiate the final position of the last mass with respect to the damping and
stiffness parameters with an `Online` schedule. The same gradient, recomputed offline once the
length is known (Revolve with the same number of snapshots), agrees to the last bit; the online
schedule's forward steps are compared with the offline optimum.

Run: python examples/online_energy.py [--masses 32] [--threshold 1e-3]
"""
import argparse

import numpy as np

import stepper as sp

F = sp.array(dtype=sp.float64)


@sp.kernel
def chain_step(x: F, v: F, k: F, c: F, dt: sp.float64, n: int, x_next: F, v_next: F):
    i = sp.tid()
    force = sp.float64(0.0)
    if i > 0:
        d = x[i] - x[i - 1] - 1.0
        force -= k[0] * (d + d * d * d)
    if i < n - 1:
        d = x[i + 1] - x[i] - 1.0
        force += k[0] * (d + d * d * d)
    if i == 0:
        force = sp.float64(0.0)            # the first mass is held fixed
    vn = v[i] + dt * (force - c[0] * v[i])
    if i == 0:
        vn = sp.float64(0.0)
    v_next[i] = vn
    x_next[i] = x[i] + dt * vn


@sp.kernel
def energy(x: F, v: F, k: F, n: int, out: F):
    i = sp.tid()
    e = 0.5 * v[i] * v[i]
    if i > 0:
        d = x[i] - x[i - 1] - 1.0
        e += 0.5 * k[0] * d * d + 0.25 * k[0] * d * d * d * d
    sp.atomic_add(out, 0, e)


@sp.kernel
def last_position(x: F, n: int, out: F):
    sp.atomic_add(out, 0, x[n - 1])


def build(n, dt):
    model = sp.Model(dt=dt)
    model.state("x", n, sp.float64)
    model.state("v", n, sp.float64)
    model.param("k", sp.array(np.array([30.0]), dtype=sp.float64))
    model.param("c", sp.array(np.array([0.8]), dtype=sp.float64))

    @model.step
    def step(s):
        sp.launch(chain_step, n, inputs=[s.prev.x, s.prev.v, s.params.k, s.params.c, s.dt, n],
                  outputs=[s.next.x, s.next.v])
    return model


def total_energy(model, state, n):
    out = sp.zeros(1, dtype=sp.float64)
    sp.launch(energy, n, inputs=[state.x, state.v, model.params.k, n], outputs=[out])
    return float(out.numpy()[0])


def main(n=32, threshold=1e-3, snapshots=12, dt=0.01):
    model = build(n, dt)
    x0 = np.arange(n, dtype=np.float64) * 1.3          # every spring stretched by 0.3
    initial = {"x": sp.array(x0, dtype=sp.float64), "v": sp.zeros(n, dtype=sp.float64)}

    def loss(state):
        out = sp.zeros(1, dtype=sp.float64, requires_grad=True)
        sp.launch(last_position, 1, inputs=[state.x, n], outputs=[out])
        return out

    print(f"{n} masses; energy at start {total_energy(model, sp.State({k: v for k, v in initial.items()}), n):.3f}; "
          f"running until it falls below {threshold}")
    online = model.gradient(initial, loss=loss, schedule=sp.Online(snapshots),
                            until=lambda state: total_energy(model, state, n) < threshold)
    steps = online.stats.steps
    offline = model.gradient(initial, steps, loss=loss, schedule=sp.Revolve(steps, snapshots))
    optimum = offline.stats.forward_steps
    same = all(np.array_equal(online.grads[k].numpy(), offline.grads[k].numpy()) for k in online.grads)
    print(f"stopped after {steps} steps; final position of the last mass {online.loss:.6f}")
    print(f"d/d(damping) = {online.grads['c'].numpy()[0]:+.6e}, d/d(stiffness) = {online.grads['k'].numpy()[0]:+.6e}")
    print(f"online schedule: {online.stats.forward_steps} forward steps; offline optimum with the same "
          f"{snapshots} snapshots: {optimum} ({100 * (online.stats.forward_steps / optimum - 1):+.1f}%)")
    print(f"online and offline gradients identical to the last bit: {same}")
    return steps, online.stats.forward_steps, optimum, same


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--masses", type=int, default=32)
    parser.add_argument("--threshold", type=float, default=1e-3)
    args = parser.parse_args()
    main(args.masses, args.threshold)
