"""`Model.keep_trajectory`: a rollout kept at one point for many reverse sweeps there (issue 30).

Every reverse sweep of the kept records must give `Model.gradient`'s bits (store-all's, and so
every schedule's), however often it runs; the Gauss-Newton product from it must be the one that
recomputes its trajectory, bit for bit; and a kept trajectory must refuse to be used at another
point (other parameters, another initial state, another length) rather than give a wrong product.
"""
import numpy as np
import pytest

import stepper as sp
from stepper_models import chain_initial, chain_model
from test_gauss_newton import N, STEPS, _dense_gauss_newton, _split, fitting_problem, loss, misfit
from test_native_loop import damped_by_product


def _same(a: dict, b: dict):
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name].numpy(), b[name].numpy())


def test_every_reverse_sweep_of_a_kept_trajectory_has_the_gradients_bits(device):
    model, initial = chain_model(device=device), chain_initial(device=device)
    stored = model.gradient(initial, STEPS, loss=loss, schedule=sp.StoreAll(STEPS))
    revolve = model.gradient(initial, STEPS, loss=loss, schedule=sp.Revolve(STEPS, 3))
    _same(stored.grads, revolve.grads)
    with model.keep_trajectory(initial, STEPS) as kept:
        np.testing.assert_array_equal(kept.final["x"], stored.final.x.numpy())
        for _ in range(3):                          # the records stay: every sweep the same
            value, grads = kept.gradient(loss)
            assert value == stored.loss
            _same(grads, stored.grads)
        other = misfit(np.zeros(N), np.ones(N))     # any loss of the same final state
        _, grads = kept.gradient(other)
        _same(grads, model.gradient(initial, STEPS, loss=other, schedule=sp.StoreAll(STEPS)).grads)
    if device == "cpu":
        assert kept._sweep is None                  # closed on leaving the block


def test_gauss_newton_products_from_a_kept_trajectory_are_the_recomputing_ones(device):
    model, initial = chain_model(device=device), chain_initial(device=device)
    dense = _dense_gauss_newton(model, initial, device)
    rng = np.random.default_rng(3)
    with model.keep_trajectory(initial, STEPS) as kept:
        for _ in range(3):
            v = _split(rng.standard_normal(dense.shape[0]), device)
            got = model.hvp(initial, STEPS, v, loss=loss, gauss_newton=True, trajectory=kept, gradient=False)
            ref = model.hvp(initial, STEPS, v, loss=loss, gauss_newton=True, gradient=False)
            _same(got.hvp, ref.hvp)
            flat = np.concatenate([got.hvp[name].numpy().ravel() for name in ("x", "v", "k", "c")])
            want = dense @ np.concatenate([v[name].numpy() for name in ("x", "v", "k", "c")])
            np.testing.assert_allclose(flat, want, rtol=0, atol=1e-12 * np.abs(want).max())
            with_gradient = model.hvp(initial, STEPS, v, loss=loss, gauss_newton=True, trajectory=kept)
            _same(with_gradient.hvp, ref.hvp)
            plain = model.gradient(initial, STEPS, loss=loss)
            assert with_gradient.loss == plain.loss and with_gradient.gradient_stats is None
            _same(with_gradient.grads, plain.grads)


def test_value_and_grad_keeping_its_trajectory_gives_the_same_bits_and_drives_newton_cg():
    scipy_optimize = pytest.importorskip("scipy.optimize")
    model, initial, fit = fitting_problem()
    plain = sp.value_and_grad(model, initial, STEPS, loss=fit, params=["k", "c"])
    kept = sp.value_and_grad(model, initial, STEPS, loss=fit, params=["k", "c"], keep_trajectory=True)
    p = np.array([0.3, -1.0, 0.5])
    for theta in (kept.x0, kept.x0 + 0.01, kept.x0):    # a new point keeps a new trajectory
        a, b = plain(theta), kept(theta)
        assert a[0] == b[0]
        np.testing.assert_array_equal(a[1], b[1])
        np.testing.assert_array_equal(plain.gauss_newton(theta, p), kept.gauss_newton(theta, p))
        np.testing.assert_array_equal(plain.gauss_newton(theta, -p), kept.gauss_newton(theta, -p))
    start = kept(kept.x0)[0]
    res = scipy_optimize.minimize(kept, kept.x0, jac=True, hessp=kept.gauss_newton, method="Newton-CG",
                                  options={"maxiter": 10})
    assert res.fun < 1e-6 * start and res.nhev > 0
    np.testing.assert_allclose(res.x, [4.4, 0.4, 0.1], rtol=1e-2)


def test_a_kept_trajectory_refuses_another_point():
    model, initial = chain_model(), chain_initial()
    kept = model.keep_trajectory(initial, STEPS)
    d = _split(np.ones(2 * N + 3), "cpu")
    with pytest.raises(sp.ModelError, match="initial state 'x' differs from the one this trajectory was kept from"):
        model.hvp(chain_initial(seed=1), STEPS, d, loss=loss, gauss_newton=True, trajectory=kept)
    with pytest.raises(sp.ModelError, match="was kept for 24 steps of this model; this product is 12 steps"):
        model.hvp(initial, 12, d, loss=loss, gauss_newton=True, trajectory=kept)
    with pytest.raises(sp.ModelError, match="was kept for 24 steps of another model"):
        chain_model().hvp(initial, STEPS, d, loss=loss, gauss_newton=True, trajectory=kept)
    with pytest.raises(sp.ModelError, match="serves the Gauss-Newton product"):
        model.hvp(initial, STEPS, d, loss=loss, trajectory=kept)
    with pytest.raises(sp.ModelError, match="takes no schedule= or storage="):
        model.hvp(initial, STEPS, d, loss=loss, gauss_newton=True, trajectory=kept, schedule=sp.StoreAll(STEPS))
    k = model.params["k"].numpy().copy()
    model.params["k"].assign(k + 0.5)
    with pytest.raises(sp.ModelError, match="parameter 'k' changed since this trajectory was kept"):
        kept.gradient(loss)
    model.params["k"].assign(k)
    kept.gradient(loss)                             # the same values again: the records are right
    kept.close()
    kept.close()
    with pytest.raises(sp.ModelError, match="this KeptTrajectory is closed"):
        kept.gradient(loss)
    with pytest.raises(sp.ModelError, match="keep_trajectory=True. reverses one kept trajectory from a terminal loss"):
        sp.value_and_grad(model, initial, STEPS, loss=loss, keep_trajectory=True, schedule=lambda n: sp.StoreAll(n))
    with pytest.raises(sp.ModelError, match="steps must be an int >= 1, got 0"):
        model.keep_trajectory(initial, 0)


def test_a_step_reversed_on_its_tape_cannot_be_kept():
    """A tape is reversed once; such a step (its adjoint keeps a loop tape) is refused by name."""
    model = sp.Model()
    model.state("x", 6, sp.float64)
    model.step(lambda s: sp.launch(damped_by_product, 6, inputs=[s.prev.x, 6], outputs=[s.next.x]))
    initial = {"x": sp.array(np.linspace(0.5, 1.5, 6), dtype=sp.float64)}
    with pytest.raises(sp.ModelError, match="step 0 was recorded on a tape, which is reversed once"):
        model.keep_trajectory(initial, 8)


def test_a_reverse_sweep_that_raises_leaves_the_trajectory_as_it_was():
    model, initial = chain_model(), chain_initial()
    stored = model.gradient(initial, STEPS, loss=loss, schedule=sp.StoreAll(STEPS))

    def broken(state):
        raise RuntimeError("a loss that fails")
    with model.keep_trajectory(initial, STEPS) as kept:
        kept.gradient(loss)
        held = kept._sweep.pool.live_bytes         # the records (and nothing of the sweep before)
        for _ in range(2):
            with pytest.raises(RuntimeError, match="a loss that fails"):
                kept.gradient(broken)
            value, grads = kept.gradient(loss)
            assert value == stored.loss
            _same(grads, stored.grads)
            assert kept._sweep.pool.live_bytes == held       # nothing leaks from sweep to sweep
