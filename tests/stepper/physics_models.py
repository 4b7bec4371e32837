"""Float64 models for whole-model gradient checks (Taylor tests, evaluate, value_and_grad): a
nonlinear 2-D wave and an ensemble of damped pendulums, and a 1-D heat equation whose diffusivity
field is a parameter."""
import numpy as np

import stepper as sp

G = sp.array(dtype=sp.float64, ndim=2)
F64 = sp.array(dtype=sp.float64)


# -- the nonlinear wave u_next = 2u - u_prev + C lap(u) - b u^3, periodic n x n -------------------------
@sp.kernel
def wave_step(u: G, up: G, C: F64, b: sp.float64, n: int, u_next: G, up_next: G):
    i, j = sp.tid()
    c = u[i, j]
    lap = u[(i + 1) % n, j] + u[(i + n - 1) % n, j] + u[i, (j + 1) % n] + u[i, (j + n - 1) % n] - 4.0 * c
    u_next[i, j] = 2.0 * c - up[i, j] + C[0] * lap - b * c * c * c
    up_next[i, j] = c


@sp.kernel
def grid_sum_squares(u: G, out: F64):
    i, j = sp.tid()
    sp.atomic_add(out, 0, u[i, j] * u[i, j])


def wave_model(n=12):
    model = sp.Model(zero_buffers=False, name="wave64")
    model.state("u", (n, n), sp.float64)
    model.state("u_prev", (n, n), sp.float64)
    model.param("C", sp.array([0.2], dtype=sp.float64))

    @model.step
    def step(s):
        sp.launch(wave_step, (n, n), inputs=[s.prev.u, s.prev.u_prev, s.params.C, 0.5, n],
                  outputs=[s.next.u, s.next.u_prev])
    x = np.linspace(-1, 1, n)
    u0 = np.exp(-8 * (x[:, None] ** 2 + x[None, :] ** 2))
    initial = {"u": sp.array(u0, dtype=sp.float64), "u_prev": sp.array(u0, dtype=sp.float64)}
    return model, initial


def wave_energy(state):
    out = sp.zeros(1, dtype=sp.float64)
    sp.launch(grid_sum_squares, state.u.shape, inputs=[state.u], outputs=[out])
    return out


# -- damped pendulums: omega' = -g / L sin(theta) - c omega, symplectic Euler ---------------------------
@sp.kernel
def pendulum_step(theta: F64, omega: F64, length: F64, c: F64, dt: sp.float64, theta_next: F64, omega_next: F64):
    i = sp.tid()
    w = omega[i] - dt * (9.81 / length[i] * sp.sin(theta[i]) + c[0] * omega[i])
    omega_next[i] = w
    theta_next[i] = theta[i] + dt * w


@sp.kernel
def sum_squares(a: F64, out: F64):
    i = sp.tid()
    sp.atomic_add(out, 0, a[i] * a[i])


def pendulum_model(n=64, dt=0.01):
    model = sp.Model(dt=dt, name="pendulums")
    model.state("theta", n, sp.float64)
    model.state("omega", n, sp.float64)
    model.param("length", sp.array(np.linspace(0.5, 2.0, n), dtype=sp.float64))
    model.param("c", sp.array([0.05], dtype=sp.float64))

    @model.step
    def step(s):
        sp.launch(pendulum_step, n, inputs=[s.prev.theta, s.prev.omega, s.params.length, s.params.c, s.dt],
                  outputs=[s.next.theta, s.next.omega])
    rng = np.random.default_rng(3)
    initial = {"theta": sp.array(rng.uniform(-1.0, 1.0, n), dtype=sp.float64),
               "omega": sp.array(rng.uniform(-0.5, 0.5, n), dtype=sp.float64)}
    return model, initial


def final_theta_squared(state):
    out = sp.zeros(1, dtype=sp.float64)
    sp.launch(sum_squares, state.theta.shape[0], inputs=[state.theta], outputs=[out])
    return out


def omega_squared(s):
    out = s.scratch("omega_sq", 1, sp.float64)
    sp.launch(sum_squares, s.next.omega.shape[0], inputs=[s.next.omega], outputs=[out])
    return out
