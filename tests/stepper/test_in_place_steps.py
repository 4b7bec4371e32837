"""Leapfrog states written in place by the native step loops (driver.h `sp_run`, native_loop.py
`in_place_renames`): where a step renames ``s.next.up = s.prev.u`` and its first write of s.next.u
reads s.prev.up only at each thread's own point (compiler/passes/in_place.py), a run of steps writes
u over the up it reads, two buffers for u instead of three. Same bits as the Python path and as
store-all, forward and gradient, for every run length (the driver's first steps differ)."""
import numpy as np
import pytest

import stepper as sp
import stepper.execute.fast.native_loop as native_loop
from stepper.execute.executor import Sweep
from stepper_models import same_bits

F2 = sp.array(dtype=sp.float64, ndim=2)
N = (12, 10)


@sp.kernel
def leapfrog(up: F2, u: F2, c: sp.float64, u_next: F2):
    i, j = sp.tid()
    v = sp.float64(0.0)
    if i >= 1 and j >= 1 and i < u.shape[0] - 1 and j < u.shape[1] - 1:
        x = u[i, j]
        lap = u[i + 1, j] + u[i - 1, j] + u[i, j + 1] + u[i, j - 1] - 4.0 * x
        v = 2.0 * x - up[i, j] + c * lap - 0.2 * x * x * x
    u_next[i, j] = v


@sp.kernel
def damp_by(up: F2, u_next: F2):
    i, j = sp.tid()
    u_next[i, j] += -0.01 * up[i, j]


@sp.kernel
def sum_squares(u: F2, out: sp.array(dtype=sp.float64)):
    i, j = sp.tid()
    sp.atomic_add(out, 0, u[i, j] * u[i, j])


def leapfrog_model(up_read_after: bool = False, device: str = "cpu"):
    """The leapfrog, its up copied from u; `up_read_after`: a second launch reads s.prev.up after
    the first has written s.next.u (so u may not be written over up)."""
    model = sp.Model(device)
    model.state("up", N, sp.float64)
    model.state("u", N, sp.float64)

    @model.step
    def step(s):
        sp.launch(leapfrog, N, inputs=[s.prev.up, s.prev.u, 0.2], outputs=[s.next.u])
        if up_read_after:
            sp.launch(damp_by, N, inputs=[s.prev.up], outputs=[s.next.u])
        sp.copy(s.next.up, s.prev.u)
    return model


def initial(device: str = "cpu"):
    rng = np.random.default_rng(2)
    u = rng.standard_normal(N) * 0.3
    return {"up": sp.array(0.9 * u, device=device), "u": sp.array(u, device=device)}


def energy_of(group: str):
    """A running loss: the energy of s.prev.u or s.next.u."""
    def energy(s):
        out = s.scratch("energy", 1, sp.float64)
        sp.launch(sum_squares, N, inputs=[getattr(s, group).u], outputs=[out])
        return out
    return energy


running_loss = energy_of("prev")


def spy_on_in_place(monkeypatch) -> list:
    found = []
    real = native_loop.in_place_renames

    def spy(*args):
        found.append(real(*args))
        return found[-1]
    monkeypatch.setattr(native_loop, "in_place_renames", spy)
    return found


@pytest.mark.parametrize("up_read_after", [False, True])
@pytest.mark.parametrize("steps", [1, 2, 3, 4, 7])
def test_a_run_written_in_place_gives_the_python_paths_bits(steps, up_read_after, monkeypatch):
    model = leapfrog_model(up_read_after)
    found = spy_on_in_place(monkeypatch)
    monkeypatch.setattr(Sweep, "native_loops", False)
    python = model.evaluate(initial(), steps, running_loss=running_loss)
    stored = model.gradient(initial(), steps, running_loss=running_loss, schedule=sp.StoreAll(steps))
    monkeypatch.setattr(Sweep, "native_loops", True)
    assert model.evaluate(initial(), steps, running_loss=running_loss) == python
    for schedule in (sp.Revolve(steps, 2), sp.Revolve(steps, 1), sp.StoreAll(steps)):
        same_bits(stored, model.gradient(initial(), steps, running_loss=running_loss, schedule=schedule))
    if steps > 2:                         # (runs of two steps or more: Revolve's recomputations)
        assert found and all(f == (set() if up_read_after else {("up", "u")}) for f in found)
