"""Time-indexed inputs (`Model.series`) and the warning a step gives when it cannot be traced.

The EWMA of Taichi #2425 as a model: the state is the running average, the samples arrive one
column per step. Read through ``s.series.x`` the step stays traceable; read by passing ``s.n`` to a
kernel it still runs correctly but through Python every step, and says why, once."""
import warnings

import numpy as np
import pytest

import stepper as sp
from stepper.step.trace_notes import UntraceableStepWarning

F64 = sp.array(dtype=sp.float64)


@sp.kernel
def ewma_row(e: F64, x: F64, alpha: F64, e_next: F64):
    i = sp.tid()
    e_next[i] = alpha[0] * x[i] + (1.0 - alpha[0]) * e[i]


@sp.kernel
def ewma_column(e: F64, xs: sp.array(dtype=sp.float64, ndim=2), n: int, alpha: F64, e_next: F64):
    i = sp.tid()
    e_next[i] = alpha[0] * xs[n, i] + (1.0 - alpha[0]) * e[i]


@sp.kernel
def sum_squares(a: F64, out: F64):
    i = sp.tid()
    sp.atomic_add(out, 0, a[i] * a[i])


def loss(state):
    out = sp.zeros(1, dtype=sp.float64)
    sp.launch(sum_squares, state.e.shape[0], inputs=[state.e], outputs=[out])
    return out


def ewma_model(samples, by_series):
    steps, rows = samples.shape
    model = sp.Model(name="ewma")
    model.state("e", rows, sp.float64)
    model.param("alpha", sp.array([0.3], dtype=sp.float64))
    xs = sp.array(samples, dtype=sp.float64)
    if by_series:
        model.series("x", xs)

    @model.step
    def step(s):
        if by_series:
            sp.launch(ewma_row, rows, inputs=[s.prev.e, s.series.x, s.params.alpha], outputs=[s.next.e])
        else:
            sp.launch(ewma_column, rows, inputs=[s.prev.e, xs, s.n, s.params.alpha], outputs=[s.next.e])
    return model


def closed_form(samples, e0, a):
    """e_T = (1-a)^T e0 + sum_n a (1-a)^(T-1-n) x_n; loss = sum e_T^2, and its gradients."""
    T = samples.shape[0]
    k = T - 1 - np.arange(T)
    e = (1 - a) ** T * e0 + (a * (1 - a) ** k) @ samples
    de_da = -T * (1 - a) ** (T - 1) * e0 + (((1 - a) ** k - a * k * (1 - a) ** np.maximum(k - 1, 0)) @ samples)
    return float(np.sum(e * e)), 2 * e * (1 - a) ** T, float(np.sum(2 * e * de_da))


def test_a_series_keeps_the_step_traceable_and_matches_the_closed_form():
    samples = np.random.default_rng(0).random((40, 5))
    e0 = np.random.default_rng(1).random(5)
    model = ewma_model(samples, by_series=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UntraceableStepWarning)
        result = model.gradient({"e": sp.array(e0, dtype=sp.float64)}, 40, loss=loss,
                                schedule=sp.Revolve(40, 4))
    value, grad_e0, grad_alpha = closed_form(samples, e0, 0.3)
    assert result.loss == pytest.approx(value, rel=1e-13)
    np.testing.assert_allclose(result.grads["e"].numpy(), grad_e0, rtol=1e-12)
    np.testing.assert_allclose(result.grads["alpha"].numpy(), [grad_alpha], rtol=1e-12)
    assert result.stats.forward_steps > 40            # recomputations happened, from the trace


def test_passing_s_n_warns_once_naming_the_argument_and_gives_the_same_bits():
    samples = np.random.default_rng(0).random((30, 4))
    initial = {"e": sp.array(np.zeros(4), dtype=sp.float64)}
    traced = ewma_model(samples, by_series=True).gradient(initial, 30, loss=loss, schedule=sp.Revolve(30, 3))
    model = ewma_model(samples, by_series=False)
    with pytest.warns(UntraceableStepWarning, match="argument 'n' of kernel 'ewma_column'.*model.series") as seen:
        slow = model.gradient(initial, 30, loss=loss, schedule=sp.Revolve(30, 3))
    assert len(seen) == 1 and "test_series.py" in str(seen[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UntraceableStepWarning)      # once per model
        model.gradient(initial, 30, loss=loss, schedule=sp.Revolve(30, 3))
    assert slow.loss == traced.loss
    np.testing.assert_array_equal(slow.grads["alpha"].numpy(), traced.grads["alpha"].numpy())
    np.testing.assert_array_equal(slow.grads["e"].numpy(), traced.grads["e"].numpy())


def test_a_series_needs_a_row_per_step():
    model = ewma_model(np.zeros((5, 2)), by_series=True)
    with pytest.raises(sp.ModelError, match="series 'x' has 5 rows, but step 5 ran"):
        model.rollout({"e": sp.array(np.zeros(2), dtype=sp.float64)}, 6)
