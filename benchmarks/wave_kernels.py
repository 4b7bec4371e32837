"""The nonlinear 2-D wave equation u_next = 2u - u_prev + C lap(u) - b u^3 (periodic grid)."""
import stepper as sp

A2 = sp.array(dtype=float, ndim=2)
F32 = sp.array(dtype=float)


@sp.kernel
def wave_step(u: A2, up: A2, C: float, b: float, n: int, u_next: A2, up_next: A2):
    i, j = sp.tid()
    c = u[i, j]
    lap = u[(i + 1) % n, j] + u[(i + n - 1) % n, j] + u[i, (j + 1) % n] + u[i, (j + n - 1) % n] - 4.0 * c
    u_next[i, j] = 2.0 * c - up[i, j] + C * lap - b * c * c * c
    up_next[i, j] = c


@sp.kernel
def sum_squares(u: A2, out: F32):
    i, j = sp.tid()
    sp.atomic_add(out, 0, u[i, j] * u[i, j])


def wave_model(n: int, C: float = 0.25, b: float = 1e-3) -> sp.Model:
    model = sp.Model(zero_buffers=False, name="wave")     # the kernel writes every element
    model.state("u", (n, n))
    model.state("u_prev", (n, n))

    @model.step
    def step(s):
        sp.launch(wave_step, (n, n), inputs=[s.prev.u, s.prev.u_prev, C, b, n],
                  outputs=[s.next.u, s.next.u_prev])
    return model


def energy(state):
    out = sp.zeros(1)
    sp.launch(sum_squares, state.u.shape, inputs=[state.u], outputs=[out])
    return out
