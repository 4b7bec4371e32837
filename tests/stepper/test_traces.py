"""Step traces (stepper/step/trace.py): a step that ran, checked, is recomputed and re-recorded from the
launches it made, without its Python function, while every step has made the same launches. Steps
whose launches differ, or that write other than through launches, run their function every time.
Either way, every schedule gives store-all's bits."""
import numpy as np
import pytest

import stepper as sp
from stepper_models import chain_initial, chain_model, same_bits

# Some steps here are untraceable on purpose; the warning they give is tests/stepper/test_series.py's.
pytestmark = pytest.mark.filterwarnings("ignore::stepper.step.trace_notes.UntraceableStepWarning")

F32 = sp.array(dtype=float)
F64 = sp.array(dtype=sp.float64)
STEPS = 24


@sp.kernel
def drift(x: F64, t: sp.float64, y: F64):
    i = sp.tid()
    y[i] = x[i] + 0.01 * sp.sin(t + x[i])


@sp.kernel
def halve(x: F64, y: F64):
    i = sp.tid()
    y[i] = 0.5 * x[i] + 0.1 * x[i] * x[i]


@sp.kernel
def nudge(x: F64, acc: F64, y: F64):
    i = sp.tid()
    y[i] = x[i] - 0.01 * acc[0] * x[i]


@sp.kernel
def square_sum(x: F64, out: F64):
    i = sp.tid()
    sp.atomic_add(out, 0, x[i] * x[i])


def loss(state):
    out = sp.zeros(1, dtype=sp.float64, requires_grad=True, device=state.x.device)
    sp.launch(square_sum, state.x.shape[0], inputs=[state.x], outputs=[out])
    return out


def counting_model(step, device="cpu"):
    """A one-state float64 model whose step function counts its calls."""
    calls = []
    model = sp.Model(dt=0.1, device=device)
    model.state("x", 8, sp.float64)

    @model.step
    def counted(s):
        calls.append(s.n)
        step(s)
    return model, calls, {"x": sp.array(np.linspace(-1.0, 1.0, 8), dtype=sp.float64, device=device)}


SCHEDULES = [lambda: sp.Revolve(STEPS, 3), lambda: sp.Revolve(STEPS, 6), lambda: sp.Online(4),
             lambda: sp.MultiLevel(STEPS, 2, 4, write_cost=1, read_cost=1)]   # told: no timing rollout


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_a_traced_step_function_runs_once_per_step_and_gives_store_alls_bits(schedule, tmp_path, device):
    """chain_model's step (a force into s.scratch, then an integrator reading it, parameters with
    gradients) makes the same launches every step: recomputations and recordings replay them."""
    model, initial = chain_model(device=device), chain_initial(device=device)
    stored = model.gradient(initial, STEPS, loss=loss, schedule=sp.StoreAll(STEPS))
    calls = []
    step = model.step_fn
    model.step_fn = lambda s: (calls.append(s.n), step(s))
    result = model.gradient(initial, STEPS, loss=loss, schedule=schedule(), storage=tmp_path / "s.h5",
                            **({"until": lambda state: False} if isinstance(schedule(), sp.Online) else {}))
    assert sorted(calls) == list(range(STEPS))                 # each step's function ran once
    assert result.stats.forward_steps > STEPS                  # and yet the schedule recomputed
    same_bits(stored, result)


def runs_at_every_evaluation(step, device="cpu"):
    """A Revolve gradient of `step`'s model calls the step function at every forward evaluation
    and gives store-all's bits; returns it and the initial state."""
    model, calls, initial = counting_model(step, device=device)
    stored = model.gradient(initial, STEPS, loss=loss, schedule=sp.StoreAll(STEPS))
    del calls[:]
    result = model.gradient(initial, STEPS, loss=loss, schedule=sp.Revolve(STEPS, 3))
    assert len(calls) == result.stats.forward_steps > STEPS
    same_bits(stored, result)
    return result, initial


def test_a_step_whose_launches_depend_on_the_step_is_not_replayed(device):
    """s.t reaches the kernel as a scalar: every step's launches differ, so each evaluation runs
    the step function, and the gradient still has store-all's bits and matches finite differences."""
    result, initial = runs_at_every_evaluation(
        lambda s: sp.launch(drift, 8, inputs=[s.prev.x, s.t], outputs=[s.next.x]), device=device)
    x0 = initial["x"].numpy().copy()

    def f(x):
        for n in range(STEPS):
            x = x + 0.01 * np.sin(0.1 * n + x)
        return float(np.sum(x * x))
    dx = np.random.default_rng(0).standard_normal(8)
    fd = (f(x0 + 1e-6 * dx) - f(x0 - 1e-6 * dx)) / 2e-6
    assert abs(result.grads["x"].numpy() @ dx - fd) <= 1e-7 * abs(fd)


def test_a_step_that_branches_on_its_index_is_not_replayed(device):
    def alternating(s):
        kernel = halve if s.n % 2 else drift
        args = [s.prev.x] if s.n % 2 else [s.prev.x, 0.0]
        sp.launch(kernel, 8, inputs=args, outputs=[s.next.x])
    runs_at_every_evaluation(alternating, device=device)


def test_a_step_that_writes_on_the_host_is_not_replayed(device):
    def fills_then_launches(s):
        s.scratch("unused", 8, sp.float64).fill_(1.0)
        sp.launch(halve, 8, inputs=[s.prev.x], outputs=[s.next.x])
    runs_at_every_evaluation(fills_then_launches, device=device)


def test_replayed_scratch_buffers_are_zero_filled_as_asked(device):
    """An accumulating scratch buffer must be zero again in every replay (zero_buffers=True), and
    one asked for with zero=False is left as the pool hands it over (the kernel stores all of it)."""
    def accumulate(s):
        acc = s.scratch("acc", 8, sp.float64)
        sp.launch(square_sum, 8, inputs=[s.prev.x], outputs=[acc])        # acc[0] += sum x^2
        tmp = s.scratch("tmp", 8, sp.float64, zero=False)
        sp.launch(halve, 8, inputs=[s.prev.x], outputs=[tmp])
        sp.launch(nudge, 8, inputs=[tmp, acc], outputs=[s.next.x])
    model, calls, initial = counting_model(accumulate, device=device)
    stored = model.gradient(initial, STEPS, loss=loss, schedule=sp.StoreAll(STEPS))
    del calls[:]
    result = model.gradient(initial, STEPS, loss=loss, schedule=sp.Revolve(STEPS, 3))
    assert sorted(calls) == list(range(STEPS))
    same_bits(stored, result)
    np.testing.assert_array_equal(result.final.x.numpy(), stored.final.x.numpy())


def test_recomputations_leave_out_the_running_loss(monkeypatch, device):
    """The running loss's launches are part of the trace (a recording's adjoint needs them), but
    a recomputation replays only the step function's: the loss kernel runs once per recording."""
    import stepper.step.trace as trace
    relaunched = []
    real = trace.relaunch
    monkeypatch.setattr(trace, "relaunch", lambda kernel, *a, **k: (relaunched.append(kernel), real(kernel, *a, **k)))

    def running(s):
        out = s.scratch("loss", 1, sp.float64)
        sp.launch(square_sum, 8, inputs=[s.next.x], outputs=[out])
        return out
    model, calls, initial = counting_model(lambda s: sp.launch(halve, 8, inputs=[s.prev.x], outputs=[s.next.x]),
                                           device=device)
    stored = model.gradient(initial, STEPS, loss=loss, running_loss=running, schedule=sp.StoreAll(STEPS))
    result = model.gradient(initial, STEPS, loss=loss, running_loss=running, schedule=sp.Revolve(STEPS, 3))
    same_bits(stored, result)
    replays = result.stats.forward_steps - STEPS                 # every evaluation but the first runs
    # recordings are reversed at once natively (stepper/execute/fast/native_reverse.py); on the CPU,
    # recomputations run in the native step loop (stepper/execute/fast/native_loop.py), and CUDA models' runs
    # here are too short for graphs (stepper/execute/fast/graph_loop.py): replayed from Python
    assert result.stats.native_reversals > 0
    assert (result.stats.native_steps > 0) == (device == "cpu")
    assert relaunched.count(halve) + result.stats.native_steps + result.stats.native_reversals == replays
    # recordings only (the last ran first)
    assert relaunched.count(square_sum) + result.stats.native_reversals == STEPS - 1
