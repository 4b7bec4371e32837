"""Quick start: two kernels, a Tape, and an exact gradient.

A particle falls under gravity for a few explicit Euler steps; we ask how the final height depends
on the initial velocity. Run: python examples/quickstart.py
"""
import numpy as np

import stepper as sp


@sp.kernel
def euler(x: sp.array(dtype=sp.vec3), v: sp.array(dtype=sp.vec3), dt: float,
          x_out: sp.array(dtype=sp.vec3), v_out: sp.array(dtype=sp.vec3)):
    i = sp.tid()
    g = sp.vec3(0.0, -9.81, 0.0)
    v_out[i] = v[i] + dt * g
    x_out[i] = x[i] + dt * v[i]


@sp.kernel
def height_loss(x: sp.array(dtype=sp.vec3), loss: sp.array(dtype=float)):
    i = sp.tid()
    sp.atomic_add(loss, 0, x[i].y * x[i].y)


def main(steps: int = 10, dt: float = 0.01):
    x = sp.array(np.zeros((1, 3), np.float32), dtype=sp.vec3, requires_grad=True)
    v = sp.array([[0.0, 2.0, 0.0]], dtype=sp.vec3, requires_grad=True)
    states = [(x, v)]
    loss = sp.zeros(1, requires_grad=True)
    tape = sp.Tape()
    with tape:
        for _ in range(steps):                      # a fresh buffer per step: nothing is overwritten
            x_next, v_next = sp.zeros_like(x, requires_grad=True), sp.zeros_like(v, requires_grad=True)
            sp.launch(euler, 1, inputs=[*states[-1], dt], outputs=[x_next, v_next])
            states.append((x_next, v_next))
        sp.launch(height_loss, 1, inputs=[states[-1][0]], outputs=[loss])
    tape.backward(loss)

    h = float(states[-1][0].numpy()[0, 1])
    # h = v0 T - g dt^2 (0 + 1 + ... + steps-1), so d(h^2)/dv0 = 2 h T exactly.
    expected = 2 * h * steps * dt
    print(f"final height after {steps} steps: {h:.6f}")
    print(f"d(height^2)/d(v0_y) = {v.grad.numpy()[0, 1]:.6f} (analytic {expected:.6f})")
    return v.grad.numpy()[0, 1], expected


if __name__ == "__main__":
    main()
