"""Steps that read time-indexed inputs (`Model.series`) and steps scored by a running loss run on the
native paths (stepper/execute/fast/native_loop.py, native_reverse.py, native_sweep.py): the driver moves each
series argument to the step's row and reads each step's running loss out, and every gradient has
the bits of the Python path and of store-all."""
import warnings

import numpy as np
import pytest

import stepper as sp
import stepper.runs.rollout as rollout_module
from stepper.execute.executor import Sweep
from stepper.step.trace_notes import UntraceableStepWarning
from test_native_loop import same_bits

F64 = sp.array(dtype=sp.float64)
F32 = sp.array(dtype=float)
STEPS, N = 30, 6


@sp.kernel
def smooth(x: F64, y: F64):
    i = sp.tid()
    y[i] = 0.9 * x[i] + 0.01 * x[i] * x[i]


@sp.kernel
def blend_row(x: F64, row: F64, y: F64):
    i = sp.tid()
    y[i] = 0.7 * x[i] + 0.3 * row[i] * x[i]


@sp.kernel
def misfit(x: F64, target: F64, out: F64):
    i = sp.tid()
    r = x[i] - target[i]
    sp.atomic_add(out, 0, r * r)


@sp.kernel
def misfit32(x: F64, target: F64, out: F32):
    i = sp.tid()
    r = float(x[i] - target[i])
    sp.atomic_add(out, 0, r * r)


def series_model(step_reads: bool, device="cpu", steps=STEPS, rows=None):
    """x' = 0.7 x + 0.3 row x (the row of series 'forcing') or a smoothing that reads no series;
    scored against series 'target' every step."""
    model = sp.Model(device=device)
    model.state("x", N, sp.float64)
    rng = np.random.default_rng(3)
    model.series("forcing", sp.array(rng.random((rows or steps, N)), dtype=sp.float64, device=device))
    model.series("target", sp.array(rng.random((rows or steps, N)), dtype=sp.float64, device=device))

    @model.step
    def step(s):
        if step_reads:
            sp.launch(blend_row, N, inputs=[s.prev.x, s.series.forcing], outputs=[s.next.x])
        else:
            sp.launch(smooth, N, inputs=[s.prev.x], outputs=[s.next.x])
    return model, {"x": sp.array(np.linspace(0.5, 1.5, N), dtype=sp.float64, device=device)}


def running_misfit(s):
    out = s.scratch("misfit", 1, sp.float64)
    sp.launch(misfit, N, inputs=[s.next.x, s.series.target], outputs=[out])
    return out


def running_misfit32(s):
    out = s.scratch("misfit", 1, float)
    sp.launch(misfit32, N, inputs=[s.next.x, s.series.target], outputs=[out])
    return out


def gradient(model, initial, schedule, native: bool, monkeypatch, **kw):
    monkeypatch.setattr(Sweep, "native_loops", native)
    return model.gradient(initial, STEPS, schedule=schedule, **{"running_loss": running_misfit, **kw})


SCHEDULES = [lambda: sp.Revolve(STEPS, 3), lambda: sp.Revolve(STEPS, 8), lambda: sp.StoreAll(STEPS),
             lambda: sp.MultiLevel(STEPS, 2, 3, write_cost=0, read_cost=0)]


@pytest.mark.filterwarnings("error::stepper.step.trace_notes.UntraceableStepWarning")
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_a_series_read_only_by_the_running_loss_is_reversed_natively(schedule, monkeypatch, tmp_path):
    """The step reads no series, its running loss does: Revolve used to fail with KeyError
    'series' in the native reversal. Store-all's and the Python path's bits."""
    model, initial = series_model(step_reads=False)
    storage = str(tmp_path / "snapshots.h5")
    stored = gradient(model, initial, sp.StoreAll(STEPS), False, monkeypatch)
    python = gradient(model, initial, schedule(), False, monkeypatch, storage=storage)
    native = gradient(model, initial, schedule(), True, monkeypatch, storage=storage)
    assert native.stats.native_reversals > 0 and native.stats.native_steps > 0
    same_bits(stored, python)
    same_bits(stored, native)


@pytest.mark.filterwarnings("error::stepper.step.trace_notes.UntraceableStepWarning")
@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("loss", [running_misfit, running_misfit32])
def test_a_step_reading_a_series_runs_natively_with_store_alls_bits(schedule, loss, monkeypatch, tmp_path):
    """Every step after the two that trust the step function runs natively, the first sweep's
    included (its running losses read out by the driver): the step function runs twice."""
    model, initial = series_model(step_reads=True)
    calls = []
    step = model.step_fn
    model.step(lambda s: calls.append(1) or step(s))
    storage = str(tmp_path / "snapshots.h5")
    stored = gradient(model, initial, sp.StoreAll(STEPS), False, monkeypatch, running_loss=loss)
    python = gradient(model, initial, schedule(), False, monkeypatch, storage=storage, running_loss=loss)
    calls.clear()
    native = gradient(model, initial, schedule(), True, monkeypatch, storage=storage, running_loss=loss)
    assert len(calls) == 2
    assert native.stats.native_steps >= STEPS - 3 and native.stats.native_reversals > 0
    assert native.stats.forward_steps == python.stats.forward_steps
    same_bits(stored, python)
    same_bits(stored, native)


def test_the_series_rows_follow_the_steps_in_a_closed_form():
    """x_{n+1} = (0.7 + 0.3 f_n) x_n, loss = sum_n sum_i (x_{n+1} - d_n)^2: against NumPy in float64."""
    model, initial = series_model(step_reads=True)
    result = model.gradient(initial, STEPS, running_loss=running_misfit, schedule=sp.Revolve(STEPS, 4))
    f, d = model._series["forcing"].numpy(), model._series["target"].numpy()
    x, loss, xs = np.linspace(0.5, 1.5, N), 0.0, []
    for n in range(STEPS):
        xs.append(x)
        x = (0.7 + 0.3 * f[n]) * x
        loss += np.sum((x - d[n]) ** 2)
    g = np.zeros(N)
    for n in range(STEPS - 1, -1, -1):       # adjoint: d loss / d x_n
        g = (0.7 + 0.3 * f[n]) * (g + 2 * ((0.7 + 0.3 * f[n]) * xs[n] - d[n]))
    assert result.loss == pytest.approx(loss, rel=1e-13)
    np.testing.assert_allclose(result.grads["x"].numpy(), g, rtol=1e-12)
    assert result.stats.native_steps > 0 and result.stats.native_reversals > 0


def test_evaluate_runs_the_running_loss_natively_with_the_gradients_bits(monkeypatch):
    model, initial = series_model(step_reads=True)
    monkeypatch.setattr(Sweep, "native_loops", True)
    value = model.evaluate(initial, STEPS, running_loss=running_misfit)
    assert value == model.gradient(initial, STEPS, running_loss=running_misfit, schedule=sp.Revolve(STEPS, 3)).loss
    monkeypatch.setattr(Sweep, "native_loops", False)
    assert value == model.evaluate(initial, STEPS, running_loss=running_misfit)


def test_a_rollout_reading_a_series_runs_natively_with_the_python_paths_bits(monkeypatch):
    model, initial = series_model(step_reads=True)
    monkeypatch.setattr(rollout_module, "native_loops", False)
    python = model.rollout(initial, STEPS, record_every=7)
    monkeypatch.setattr(rollout_module, "native_loops", True)
    calls = []
    step = model.step_fn
    model.step(lambda s: calls.append(1) or step(s))
    native = model.rollout(initial, STEPS, record_every=7)
    assert len(calls) < STEPS // 2          # the steps after each record's run natively
    np.testing.assert_array_equal(native.x.numpy(), python.x.numpy())
    for (n, a), (m, b) in zip(native.history, python.history):
        assert n == m
        np.testing.assert_array_equal(a["x"], b["x"])


def test_a_series_too_short_for_a_native_run_is_named_at_the_step_that_needs_the_row(monkeypatch):
    model, initial = series_model(step_reads=True, rows=STEPS - 5)
    with pytest.raises(sp.ModelError, match=f"series 'forcing' has {STEPS - 5} rows, but step {STEPS - 5} ran"):
        model.rollout(initial, STEPS)
    with pytest.raises(sp.ModelError, match=f"has {STEPS - 5} rows, but step {STEPS - 5} ran"):
        model.gradient(initial, STEPS, running_loss=running_misfit, schedule=sp.Revolve(STEPS, 3))


def test_a_running_loss_that_reads_the_step_index_keeps_every_first_step_on_the_python_path(monkeypatch):
    """A running loss that branches on s.n (scores the second half only) must be asked every
    step: the steps are not trusted to run from the trace, and the loss is the one asked for."""
    model, initial = series_model(step_reads=True)

    def second_half(s):
        out = s.scratch("misfit", 1, sp.float64)
        if s.n >= STEPS // 2:
            sp.launch(misfit, N, inputs=[s.next.x, s.series.target], outputs=[out])
        return out
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UntraceableStepWarning)
        native = gradient(model, initial, sp.Revolve(STEPS, 3), True, monkeypatch, running_loss=second_half)
        stored = gradient(model, initial, sp.StoreAll(STEPS), False, monkeypatch, running_loss=second_half)
    same_bits(stored, native)
    f, d = model._series["forcing"].numpy(), model._series["target"].numpy()
    x, loss = np.linspace(0.5, 1.5, N), 0.0
    for n in range(STEPS):
        x = (0.7 + 0.3 * f[n]) * x
        loss += np.sum((x - d[n]) ** 2) if n >= STEPS // 2 else 0.0
    assert native.loss == pytest.approx(loss, rel=1e-13)


def test_series_and_running_losses_on_the_device_give_store_alls_bits(device, monkeypatch):
    """On a GPU the recomputations run as graphs of two steps whose series rows are copied into
    row buffers of their own before each replay (stepper/execute/fast/graph_loop.py)."""
    model, initial = series_model(step_reads=True, device=device)
    stored = gradient(model, initial, sp.StoreAll(STEPS), False, monkeypatch)
    for schedule in (sp.Revolve(STEPS, 3), sp.StoreAll(STEPS)):
        native = gradient(model, initial, schedule, True, monkeypatch)
        assert native.stats.native_reversals > 0
        same_bits(stored, native)
    one = gradient(model, initial, sp.Revolve(STEPS, 1), True, monkeypatch)      # long recomputations: graphs
    assert one.stats.native_steps > 0
    same_bits(stored, one)


def test_a_rollout_reading_a_series_on_the_device_gives_the_python_paths_bits(device, monkeypatch):
    model, initial = series_model(step_reads=True, device=device)
    monkeypatch.setattr(rollout_module, "native_loops", False)
    python = model.rollout(initial, STEPS)
    monkeypatch.setattr(rollout_module, "native_loops", True)
    calls = []
    step = model.step_fn
    model.step(lambda s: calls.append(1) or step(s))
    native = model.rollout(initial, STEPS)
    assert len(calls) == 2
    np.testing.assert_array_equal(native.x.numpy(), python.x.numpy())
