"""Rollouts of a trusted step (stepper/runs/rollout.py): once the first two steps made the same launches
and the step function read neither s.n, s.t nor array data on the host, the steps between two
events run from the trace in one call (native loop on the CPU, graph loop on a GPU), with the bits
of calling the step function every step; a function that reads any of those runs every step."""
import numpy as np
import pytest

import stepper as sp
import stepper.runs.rollout as rollout_module
from stepper_models import chain_initial, chain_model

F64 = sp.array(dtype=sp.float64)
STEPS = 41


@sp.kernel
def relax(x: F64, rate: sp.float64, y: F64):
    i = sp.tid()
    y[i] = x[i] - rate * x[i] * x[i]


def counted_model(device, reads=None):
    """One state, one kernel; the step function counts its calls and reads what `reads` says."""
    model = sp.Model(device, dt=0.5)
    model.state("x", 8, sp.float64)
    calls = []

    @model.step
    def step(s):
        calls.append(1)
        rate = 0.01
        if reads == "n" and s.n > 10**6:
            rate = 0.02
        if reads == "t":
            rate = 0.01 + 0.0 * s.t
        if reads == "host" and s.prev.x.numpy()[0] > 10.0:
            rate = 0.02
        sp.launch(relax, 8, inputs=[s.prev.x, rate], outputs=[s.next.x])
    return model, calls, {"x": sp.array(np.linspace(0.1, 0.8, 8), dtype=sp.float64, device=device)}


def both_ways(monkeypatch, model, initial, **options):
    monkeypatch.setattr(rollout_module, "native_loops", False)
    stepwise = model.rollout(initial, STEPS, **options)
    monkeypatch.setattr(rollout_module, "native_loops", True)
    return stepwise, model.rollout(initial, STEPS, **options)


def same_bits(a, b):
    assert a.steps == b.steps
    for name in a:
        np.testing.assert_array_equal(a[name].numpy(), b[name].numpy(), err_msg=name)


@pytest.mark.parametrize("options", [{}, {"callback": None, "every": 5}, {"record_every": 7}],
                         ids=["plain", "callback", "history"])
def test_trusted_steps_run_from_the_trace_with_the_step_functions_bits(device, monkeypatch, options):
    model, initial = chain_model(device=device), chain_initial(device=device)
    seen = []
    if "callback" in options:
        options = dict(options, callback=lambda n, s: seen.append((n, s.x.numpy().copy())))
    stepwise, looped = both_ways(monkeypatch, model, initial, **options)
    same_bits(stepwise, looped)
    if "callback" in options:     # each callback saw the same state both ways, at the same steps
        assert [n for n, _ in seen] == 2 * list(range(5, STEPS + 1, 5))
        half = len(seen) // 2
        for (n, a), (m, b) in zip(seen[:half], seen[half:]):
            np.testing.assert_array_equal(a, b)
    if "record_every" in options:
        assert [n for n, _ in looped.history] == [n for n, _ in stepwise.history] == list(range(7, STEPS + 1, 7))
        for (_, a), (_, b) in zip(stepwise.history, looped.history):
            np.testing.assert_array_equal(a["x"], b["x"])


def test_the_step_function_runs_for_the_first_steps_and_at_events_only(device, monkeypatch):
    model, calls, initial = counted_model(device)
    monkeypatch.setattr(rollout_module, "native_loops", True)
    model.rollout(initial, STEPS, callback=lambda n, s: None, every=10)
    # steps 0 and 1 establish the trace; after that only the step right after each event (10, 20,
    # 30, 40) runs the function; on a GPU a run shorter than GraphLoops.MIN_STEPS is stepwise
    if device == "cpu":
        assert len(calls) == 2 + 4
    else:
        assert len(calls) < STEPS


@pytest.mark.parametrize("reads", ["n", "t", "host"])
def test_a_step_function_that_reads_the_step_or_data_runs_every_step(device, monkeypatch, reads):
    model, calls, initial = counted_model(device, reads)
    stepwise, looped = both_ways(monkeypatch, model, initial)
    assert len(calls) == 2 * STEPS
    same_bits(stepwise, looped)


@pytest.mark.filterwarnings("ignore:the step function of the model cannot be replayed")   # step 10 differs
def test_a_callback_that_changes_what_the_step_launches_is_seen(device, monkeypatch):
    """The step after an event runs the step function: a callback that changes a Python value the
    function passes to its kernel makes that step's trace differ, so the rest of the run calls the
    function, with the bits of calling it every step."""
    model = sp.Model(device)
    model.state("x", 8, sp.float64)
    setting = {"rate": 0.01}

    @model.step
    def step(s):
        sp.launch(relax, 8, inputs=[s.prev.x, setting["rate"]], outputs=[s.next.x])

    def slow_down(n, state):
        setting["rate"] = 0.01 + 0.001 * n
    initial = {"x": sp.array(np.linspace(0.1, 0.8, 8), dtype=sp.float64, device=device)}
    results = []
    for loops in (False, True):
        setting["rate"] = 0.01
        monkeypatch.setattr(rollout_module, "native_loops", loops)
        results.append(model.rollout(initial, STEPS, callback=slow_down, every=10))
    same_bits(*results)


def test_until_and_check_finite_keep_every_step_on_the_function(monkeypatch):
    model, calls, initial = counted_model("cpu")
    monkeypatch.setattr(rollout_module, "native_loops", True)
    model.rollout(initial, STEPS, until=lambda s: False)
    model.rollout(initial, STEPS, check_finite=True)
    assert len(calls) == 2 * STEPS
