"""Kernels, models and helpers shared by the stepper tests (kernels must live in files)."""
import numpy as np

import stepper as sp

F64 = sp.array(dtype=sp.float64)
V3 = sp.array(dtype=sp.vec3)
F32 = sp.array(dtype=float)


# -- a 1-D chain of masses and nonlinear springs, in float64 (finite differences) -------------------
@sp.kernel
def chain_force(x: F64, k: F64, rest: sp.float64, n: int, f: F64):
    i = sp.tid()
    acc = sp.float64(0.0)
    if i > 0:
        d = x[i] - x[i - 1] - rest
        acc = acc - k[0] * (d + k[1] * d * d * d)
    if i < n - 1:
        d = x[i + 1] - x[i] - rest
        acc = acc + k[0] * (d + k[1] * d * d * d)
    f[i] = acc


@sp.kernel
def chain_integrate(x: F64, v: F64, f: F64, c: F64, dt: sp.float64, x_next: F64, v_next: F64):
    i = sp.tid()
    vn = v[i] + dt * (f[i] - c[0] * v[i])
    v_next[i] = vn
    x_next[i] = x[i] + dt * vn


@sp.kernel
def sum_squares64(a: F64, out: F64):
    i = sp.tid()
    sp.atomic_add(out, 0, a[i] * a[i])


@sp.kernel
def weighted_sum64(a: F64, w: F64, out: F64):
    i = sp.tid()
    sp.atomic_add(out, 0, w[i] * a[i])


def chain_model(n=16, dt=0.05, device="cpu"):
    model = sp.Model(device, dt=dt)
    model.state("x", n, sp.float64)
    model.state("v", n, sp.float64)
    model.param("k", sp.array(np.array([4.0, 0.5]), dtype=sp.float64, device=device))
    model.param("c", sp.array(np.array([0.1]), dtype=sp.float64, device=device))

    @model.step
    def step(s):
        f = s.scratch("force", n, sp.float64)
        sp.launch(chain_force, n, inputs=[s.prev.x, s.params.k, 1.0, n], outputs=[f])
        sp.launch(chain_integrate, n, inputs=[s.prev.x, s.prev.v, f, s.params.c, s.dt],
                  outputs=[s.next.x, s.next.v])
    return model


def chain_initial(n=16, seed=0, device="cpu"):
    rng = np.random.default_rng(seed)
    x = np.arange(n, dtype=np.float64) + 0.1 * rng.standard_normal(n)
    v = 0.1 * rng.standard_normal(n)
    return {"x": sp.array(x, dtype=sp.float64, device=device), "v": sp.array(v, dtype=sp.float64, device=device)}


# -- a 1-D nonlinear wave whose state is (previous, current): its adjoint never reads `up` ----------
@sp.kernel
def wave_1d(up: F64, u: F64, c: sp.float64, up_next: F64, u_next: F64):
    i = sp.tid()
    n = u.shape[0]
    x = u[i]
    lap = -2.0 * x
    if i > 0:
        lap += u[i - 1]
    if i < n - 1:
        lap += u[i + 1]
    up_next[i] = x
    u_next[i] = 2.0 * x - up[i] + c * lap - 0.1 * x * x * x


def wave_model(n=16, device="cpu"):
    model = sp.Model(device)
    model.state("up", n, sp.float64)
    model.state("u", n, sp.float64)

    @model.step
    def step(s):
        sp.launch(wave_1d, n, inputs=[s.prev.up, s.prev.u, 0.2], outputs=[s.next.up, s.next.u])
    return model


def wave_initial(n=16, device="cpu"):
    u = np.sin(np.linspace(0.0, 3.0, n))
    return {"up": sp.array(0.9 * u, dtype=sp.float64, device=device),
            "u": sp.array(u, dtype=sp.float64, device=device)}


# -- particles on springs, vec3 float32, forces scattered with atomics ---------------------------------
@sp.kernel
def spring_forces(x: V3, k: F32, f: V3):
    i = sp.tid()           # spring i joins particles i and i + 1
    d = x[i + 1] - x[i]
    length = sp.length(d)
    force = k[0] * (length - 1.0) * d / length
    sp.atomic_add(f, i, force)
    sp.atomic_sub(f, i + 1, force)


@sp.kernel
def integrate_particles(x: V3, v: V3, f: V3, g: F32, dt: float, x_next: V3, v_next: V3):
    i = sp.tid()
    vn = v[i] + dt * (f[i] + sp.vec3(0.0, -g[0], 0.0))
    v_next[i] = vn
    x_next[i] = x[i] + dt * vn


@sp.kernel
def kinetic(v: V3, out: F32):
    i = sp.tid()
    sp.atomic_add(out, 0, 0.5 * sp.dot(v[i], v[i]))


@sp.kernel
def height_loss(x: V3, out: F32):
    i = sp.tid()
    sp.atomic_add(out, 0, x[i][1] * x[i][1] + 0.1 * x[i][0])


def particle_model(n=64, dt=0.01, device="cpu"):
    model = sp.Model(device, dt=dt)
    model.state("x", n, sp.vec3)
    model.state("v", n, sp.vec3)
    model.param("k", sp.array([40.0], device=device))
    model.param("g", sp.array([9.8], device=device))

    @model.step
    def step(s):
        f = s.scratch("force", n, sp.vec3)
        sp.launch(spring_forces, n - 1, inputs=[s.prev.x, s.params.k], outputs=[f])
        sp.launch(integrate_particles, n, inputs=[s.prev.x, s.prev.v, f, s.params.g, s.dt],
                  outputs=[s.next.x, s.next.v])
    return model


def particle_initial(n=64, seed=1, device="cpu"):
    rng = np.random.default_rng(seed)
    x = np.zeros((n, 3), np.float32)
    x[:, 0] = np.arange(n) * 1.05
    x += 0.05 * rng.standard_normal((n, 3)).astype(np.float32)
    v = (0.1 * rng.standard_normal((n, 3))).astype(np.float32)
    return {"x": sp.array(x, dtype=sp.vec3, device=device), "v": sp.array(v, dtype=sp.vec3, device=device)}


def height(state):
    out = sp.zeros(1, requires_grad=True, device=state.x.device)
    sp.launch(height_loss, state.x.shape[0], inputs=[state.x], outputs=[out])
    return out


def energy_rate(s):
    out = s.scratch("kinetic", 1)
    sp.launch(kinetic, s.next.v.shape[0], inputs=[s.next.v], outputs=[out])
    return out


def chain_final_x_squared(state):
    """A terminal loss for the chain: sum of the final positions squared."""
    out = sp.zeros(1, dtype=sp.float64, device=state.x.device)
    sp.launch(sum_squares64, state.x.shape[0], inputs=[state.x], outputs=[out])
    return out


def instances_made(monkeypatch, cls) -> list:
    """Every instance of `cls` made from now on in this test (a Sweep's NativeLoops, GraphLoops)."""
    made, init = [], cls.__init__

    def remember(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)
    monkeypatch.setattr(cls, "__init__", remember)
    return made


def same_bits(a, b):
    """Two gradient results (`Model.gradient`) with the same bits: loss, gradients, final state."""
    assert a.loss == b.loss
    assert set(a.grads) == set(b.grads)
    for name in a.grads:
        np.testing.assert_array_equal(a.grads[name].numpy(), b.grads[name].numpy(), err_msg=name)
    for name in a.final:
        np.testing.assert_array_equal(a.final[name].numpy(), b.final[name].numpy(), err_msg=name)
