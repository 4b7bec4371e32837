"""A 1-D diffusion whose forcing term a small network computes from the state, inside the step (with
JAX or PyTorch), and the kernels around it (kernels must live in files)."""
import numpy as np

import stepper as sp

F64 = sp.array(dtype=sp.float64)


@sp.kernel
def forced_diffusion(u: F64, f: F64, r: sp.float64, dt: sp.float64, u_next: F64):
    i = sp.tid()
    n = u.shape[0]
    left = sp.float64(0.0)
    right = sp.float64(0.0)
    if i > 0:
        left = u[i - 1]
    if i < n - 1:
        right = u[i + 1]
    u_next[i] = u[i] + r * (left - 2.0 * u[i] + right) + dt * f[i]


@sp.kernel
def misfit64(u: F64, target: F64, out: F64):
    i = sp.tid()
    d = u[i] - target[i]
    sp.atomic_add(out, 0, 0.5 * d * d)


@sp.kernel
def squares64(u: F64, out: F64):
    i = sp.tid()
    sp.atomic_add(out, 0, u[i] * u[i])


WEIGHTS = ("w1", "b1", "w2", "b2")


def weights(hidden=8, seed=0):
    """Float64 weights of a one-hidden-layer network applied to each cell's value."""
    rng = np.random.default_rng(seed)
    return {"w1": rng.standard_normal(hidden), "b1": 0.1 * rng.standard_normal(hidden),
            "w2": rng.standard_normal(hidden) / np.sqrt(hidden), "b2": np.array([0.05])}


def learned_model(call, net, n=12, hidden=8, dt=0.01, device="cpu"):
    """u_next = u + r lap(u) + dt net(u): `call` is stepper.jax.call or stepper.torch.call and `net`
    a function (u, w1, b1, w2, b2) -> forcing in that framework."""
    model = sp.Model(device, dt=dt)
    model.state("u", n, sp.float64)
    for name, value in weights(hidden).items():
        model.param(name, sp.array(value, dtype=sp.float64, device=device))
    r = 0.2

    @model.step
    def step(s):
        f = s.scratch("forcing", n, sp.float64)
        call(net, inputs=[s.prev.u, *(s.params[w] for w in WEIGHTS)], outputs=[f])
        sp.launch(forced_diffusion, n, inputs=[s.prev.u, f, r, s.dt], outputs=[s.next.u])
    return model


def u0(n=12, device="cpu"):
    x = np.linspace(0.0, 1.0, n)
    return sp.array(np.sin(np.pi * x) + 0.3 * np.sin(3 * np.pi * x), dtype=sp.float64, device=device)


def squared_norm(state):
    out = sp.zeros(1, dtype=sp.float64, device=state.u.device)
    sp.launch(squares64, state.u.shape[0], inputs=[state.u], outputs=[out])
    return out
