"""Gradients of whole rollouts against float64 finite differences and the dot-product test."""
import numpy as np
import pytest

import stepper as sp
from stepper_models import (chain_initial, chain_model, energy_rate, height, particle_initial,
                            particle_model, sum_squares64, weighted_sum64)

N_CHAIN = 16


def final_x_squared(state):
    out = sp.zeros(1, dtype=sp.float64, device=state.x.device)
    sp.launch(sum_squares64, N_CHAIN, inputs=[state.x], outputs=[out])
    return out


def rollout_loss(model, x, v, k, c, steps):
    model.params.k.assign(k)
    model.params.c.assign(c)
    final = model.rollout({"x": x, "v": v}, steps)
    return float(np.sum(final.x.numpy() ** 2))


@pytest.mark.parametrize("schedule", [lambda n: sp.StoreAll(n), lambda n: sp.Revolve(n, 4)])
def test_chain_gradient_matches_float64_finite_differences(schedule, device):
    steps = 40
    model, initial = chain_model(N_CHAIN, device=device), chain_initial(N_CHAIN, device=device)
    result = model.gradient(initial, steps, loss=final_x_squared, schedule=schedule(steps))
    x0, v0 = initial["x"].numpy().copy(), initial["v"].numpy().copy()
    k0, c0 = model.params.k.numpy().copy(), model.params.c.numpy().copy()
    assert result.loss == rollout_loss(model, x0, v0, k0, c0, steps)
    rng = np.random.default_rng(7)
    for _ in range(3):
        dx, dv = rng.standard_normal(N_CHAIN), rng.standard_normal(N_CHAIN)
        dk, dc = rng.standard_normal(2), rng.standard_normal(1)
        eps = 1e-6
        plus = rollout_loss(model, x0 + eps * dx, v0 + eps * dv, k0 + eps * dk, c0 + eps * dc, steps)
        minus = rollout_loss(model, x0 - eps * dx, v0 - eps * dv, k0 - eps * dk, c0 - eps * dc, steps)
        fd = (plus - minus) / (2 * eps)
        ad = sum(result.grads[name].numpy() @ d for name, d in (("x", dx), ("v", dv), ("k", dk), ("c", dc)))
        assert abs(fd - ad) <= 1e-7 * abs(ad)
    model.params.k.assign(k0)
    model.params.c.assign(c0)


def test_dot_product_test_on_a_linear_rollout(device):
    """With linear springs the rollout is affine, so J dx = R(x0 + dx) - R(x0) up to rounding and
    <J dx, w> = <dx, J^T w> holds to float64 precision."""
    steps = 60
    model, initial = chain_model(N_CHAIN, device=device), chain_initial(N_CHAIN, device=device)
    model.params.k.assign([3.0, 0.0])      # no cubic term: linear springs
    rng = np.random.default_rng(11)
    w = sp.array(rng.standard_normal(N_CHAIN), dtype=sp.float64, device=device)

    def weighted(state):
        out = sp.zeros(1, dtype=sp.float64, device=device)
        sp.launch(weighted_sum64, N_CHAIN, inputs=[state.x, w], outputs=[out])
        return out
    adjoint = model.gradient(initial, steps, loss=weighted, schedule=sp.Revolve(steps, 5)).grads
    dx, dv = rng.standard_normal(N_CHAIN), rng.standard_normal(N_CHAIN)
    base = model.rollout(initial, steps).x.numpy()
    moved = model.rollout({"x": initial["x"].numpy() + dx, "v": initial["v"].numpy() + dv}, steps).x.numpy()
    lhs = (moved - base) @ w.numpy()
    rhs = adjoint["x"].numpy() @ dx + adjoint["v"].numpy() @ dv
    assert abs(lhs - rhs) <= 1e-10 * abs(rhs)


def test_running_loss_gradient_matches_finite_differences(device):
    steps = 30
    model, initial = chain_model(N_CHAIN, device=device), chain_initial(N_CHAIN, device=device)

    def running(s):
        out = s.scratch("kinetic", 1, sp.float64)
        sp.launch(sum_squares64, N_CHAIN, inputs=[s.next.v], outputs=[out])
        return out
    result = model.gradient(initial, steps, running_loss=running, schedule=sp.Revolve(steps, 3))

    def total(x, v):
        history = model.rollout({"x": x, "v": v}, steps, record_every=1).history
        return sum(float(np.sum(state["v"] ** 2)) for _, state in history)
    x0, v0 = initial["x"].numpy(), initial["v"].numpy()
    assert result.loss == pytest.approx(total(x0, v0), rel=1e-14)
    dv = np.random.default_rng(5).standard_normal(N_CHAIN)
    fd = (total(x0, v0 + 1e-6 * dv) - total(x0, v0 - 1e-6 * dv)) / 2e-6
    assert abs(fd - result.grads["v"].numpy() @ dv) <= 1e-7 * abs(fd)


def test_particle_gradient_has_parameter_and_state_gradients(device):
    model, initial = particle_model(device=device), particle_initial(device=device)
    result = model.gradient(initial, 50, loss=height, running_loss=energy_rate, schedule=sp.Revolve(50, 6))
    assert set(result.grads) == {"x", "v", "k", "g"}
    assert result.grads["x"].shape == (64,) and result.grads["x"].dtype == sp.vec3
    assert result.grads["k"].shape == (1,)
    assert np.all(np.isfinite(result.grads["x"].numpy())) and result.grads["g"].numpy()[0] != 0
    assert result.final.x.shape == (64,)
    np.testing.assert_array_equal(result.final.x.numpy(), model.rollout(initial, 50, deterministic=True).x.numpy())


def test_an_online_run_that_until_stops_early_is_as_long_as_until_says(device):
    """steps= is a maximum when until= is given: stopping at step 7 of at most 24 is no error, and
    the gradient is store-all's over those 7 steps, bit for bit."""
    model, initial = chain_model(N_CHAIN, device=device), chain_initial(N_CHAIN, device=device)
    seen = []
    result = model.gradient(initial, 24, loss=final_x_squared, schedule=sp.Online(3),
                            until=lambda state: len(seen.append(1) or seen) >= 7)
    reference = model.gradient(initial, 7, loss=final_x_squared, schedule=sp.StoreAll(7))
    assert result.loss == reference.loss
    for name in ("x", "v", "k", "c"):
        np.testing.assert_array_equal(result.grads[name].numpy(), reference.grads[name].numpy())


F32 = sp.array(dtype=sp.float32)
MEMBERS = 40_000                  # above the CPU's parallel threshold: deterministic adds are chunked


@sp.kernel
def damped_members(x: F32, v: F32, k: F32, x_next: F32, v_next: F32):
    i = sp.tid()
    a = -k[0] * x[i] - 0.1 * v[i]             # k: one parameter every member reads
    v_next[i] = v[i] + 0.01 * a
    x_next[i] = x[i] + 0.01 * v_next[i]


@sp.kernel
def half_sum_squares32(x: F32, out: F32):
    i = sp.tid()
    sp.atomic_add(out, 0, 0.5 * x[i] * x[i])


def test_a_many_member_gradient_gets_the_cpus_bits_on_every_device(device):
    """A running loss over 40,000 members and a parameter all of them read: the deterministic adds
    into the loss and into k's gradient run chunked, and a GPU gets the CPU's bits (float32, where
    any other order of the sums would show)."""
    def run(where):
        model = sp.Model(device=where)
        model.state("x", MEMBERS, sp.float32)
        model.state("v", MEMBERS, sp.float32)
        model.param("k", sp.array([2.0], dtype=sp.float32, device=where))
        model.step(lambda s: sp.launch(damped_members, MEMBERS, inputs=[s.prev.x, s.prev.v, s.params.k],
                                       outputs=[s.next.x, s.next.v]))

        def running(s):
            out = s.scratch("energy", 1, sp.float32)
            sp.launch(half_sum_squares32, MEMBERS, inputs=[s.next.x], outputs=[out])
            return out
        rng = np.random.default_rng(12)
        initial = {name: sp.array(rng.standard_normal(MEMBERS).astype(np.float32), device=where) for name in "xv"}
        return model.gradient(initial, 6, running_loss=running, schedule=sp.Revolve(6, 2))
    here, cpu = run(device), run("cpu")
    assert here.loss == cpu.loss
    for name in ("x", "v", "k"):
        np.testing.assert_array_equal(here.grads[name].numpy(), cpu.grads[name].numpy())
