"""Whole-model gradient checks and optimiser plumbing: `Model.evaluate`, `stepper.taylor_test` and
`stepper.value_and_grad`, on float64 models (a nonlinear wave and an ensemble of pendulums)."""
import numpy as np
import pytest

import stepper as sp
from physics_models import (final_theta_squared, omega_squared, pendulum_model, wave_energy,
                            wave_model)


def test_evaluate_is_the_gradient_runs_loss_bit_for_bit_and_records_nothing():
    model, initial = pendulum_model(n=16)
    tape = sp.Tape()
    with tape:
        value = model.evaluate(initial, 50, loss=final_theta_squared, running_loss=omega_squared)
    assert tape.ops == ()
    result = model.gradient(initial, 50, loss=final_theta_squared, running_loss=omega_squared)
    assert isinstance(value, float) and value == result.loss


def test_evaluate_needs_a_loss():
    model, initial = pendulum_model(n=4)
    with pytest.raises(sp.ModelError, match="loss="):
        model.evaluate(initial, 3)


def test_taylor_test_of_the_wave_model_converges_at_second_order():
    model, initial = wave_model(n=12)
    result = sp.taylor_test(model, initial, 60, loss=wave_energy, h=1e-3, halvings=4)
    print("\nwave, 60 steps, 12x12, all of u, u_prev and C:\n" + str(result))
    assert result.passed
    assert all(1.9 < r < 2.1 for r in result.rates1)
    assert all(0.9 < r < 1.1 for r in result.rates0)


def test_taylor_test_of_the_pendulum_model_converges_at_second_order():
    model, initial = pendulum_model(n=64)
    length = model.params["length"].numpy().copy()
    result = sp.taylor_test(model, initial, 300, loss=final_theta_squared, running_loss=omega_squared,
                            h=1e-3, halvings=4)
    print("\npendulums, 300 steps, 64 pendulums, theta, omega, length and c:\n" + str(result))
    assert result.passed and all(1.9 < r < 2.1 for r in result.rates1)
    np.testing.assert_array_equal(model.params["length"].numpy(), length)     # restored


def test_taylor_test_catches_a_wrong_gradient(monkeypatch):
    model, initial = pendulum_model(n=8)
    assert sp.taylor_test(model, initial, 50, loss=final_theta_squared, params=["omega"], h=1e-3).passed
    right = model.gradient

    def one_percent_off(*args, **kwargs):
        result = right(*args, **kwargs)
        for g in result.grads.values():
            g.numpy()[...] *= 1.01
        return result
    monkeypatch.setattr(model, "gradient", one_percent_off)
    wrong = sp.taylor_test(model, initial, 50, loss=final_theta_squared, params=["omega"], h=1e-3)
    assert not wrong.passed and abs(wrong.rates1[-1] - 1.0) < 0.1     # first order: the gradient is off


def test_value_and_grad_matches_central_differences_of_evaluate():
    model, initial = pendulum_model(n=6)
    f = sp.value_and_grad(model, initial, 40, loss=final_theta_squared, params=["length", "omega"])
    assert f.names == ("length", "omega") and f.x0.shape == (12,) and f.x0.dtype == np.float64
    value, grad = f(f.x0)
    assert value == model.evaluate(initial, 40, loss=final_theta_squared)
    eps = 1e-6
    for k in (0, 5, 6, 11):
        e = np.zeros(12)
        e[k] = eps
        fd = (f(f.x0 + e)[0] - f(f.x0 - e)[0]) / (2 * eps)
        assert grad[k] == pytest.approx(fd, rel=1e-7, abs=1e-10)
    f(f.x0)
    np.testing.assert_array_equal(model.params["length"].numpy(), f.x0[:6])


def test_value_and_grad_refuses_a_schedule_object_and_unknown_names():
    model, initial = pendulum_model(n=4)
    with pytest.raises(sp.ModelError, match="steps -> schedule"):
        sp.value_and_grad(model, initial, 10, loss=final_theta_squared, schedule=sp.Revolve(10, 2))
    with pytest.raises(sp.ModelError, match="'mass' is neither"):
        sp.value_and_grad(model, initial, 10, loss=final_theta_squared, params=["mass"])
