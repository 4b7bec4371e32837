"""The order of a step's adjoints (stepper/step/trace.py `loss_reversed_last`, native_reverse.py
`_renamed_adjoint`): a running loss that reads only the step's start is reversed after the step, so
the step's adjoints write the previous state's gradient whole (no zero fill) and a copy's adjoint
that would store it whole takes the carried gradient's array instead of running. The tape path
reverses in the same order: every gradient keeps the Python path's and store-all's bits, and
finite differences agree."""
import numpy as np
import pytest

import stepper as sp
from stepper.execute.executor import Sweep
from stepper.execute.fast import native_reverse
from stepper_models import same_bits
from test_in_place_steps import N, energy_of, initial, leapfrog_model

STEPS = 9


@sp.kernel
def probe_misfit(u: sp.array(dtype=sp.float64, ndim=2), at: sp.array(dtype=sp.int32), out: sp.array(dtype=sp.float64)):
    r = sp.tid()                          # a receiver: the field at one point, squared
    d = u[at[2 * r], at[2 * r + 1]] - 0.1
    sp.atomic_add(out, 0, 0.5 * d * d)


AT = np.array([3, 4, 7, 2, 3, 4], np.int32)          # three receivers, the first point twice


def receivers_of(group: str, device: str = "cpu"):
    at = sp.array(AT, dtype=sp.int32, device=device)

    def running_loss(s):
        out = s.scratch("misfit", 1, sp.float64)
        sp.launch(probe_misfit, 3, inputs=[getattr(s, group).u, at], outputs=[out])
        return out
    return running_loss


energy_of_next = energy_of("next")


def plans(monkeypatch) -> list:
    """The native reversals' plans, as they are made."""
    made = []
    real = native_reverse._Plan.plan_adjoints

    def spy(plan, *args):
        real(plan, *args)
        made.append(plan)
    monkeypatch.setattr(native_reverse._Plan, "plan_adjoints", spy)
    return made


def gradient(running_loss, schedule, native: bool, monkeypatch, device="cpu", **kw):
    monkeypatch.setattr(Sweep, "native_loops", native)
    return leapfrog_model(device=device).gradient(initial(device), STEPS, running_loss=running_loss,
                                                  schedule=schedule, **kw)


def test_a_running_loss_of_the_steps_start_is_reversed_after_the_step(monkeypatch):
    made = plans(monkeypatch)
    gradient(receivers_of("prev"), sp.Revolve(STEPS, 3), True, monkeypatch)
    plan = made[0]
    assert plan.trace.loss_last
    # the copy's adjoint (launch 1) renamed, the leapfrog's and then the receivers' run; nothing filled
    assert plan.trace.reversal_order == (1, 0, 2)
    assert plan.renames == [("u", "up")]
    assert len(plan.adjoints) == 2 and not any(zero for zero, *_ in plan.adjoints) and not plan.zero_after


@pytest.mark.parametrize("running_loss", [receivers_of("next"), energy_of_next])
def test_a_running_loss_of_the_steps_result_is_reversed_first(running_loss, monkeypatch):
    made = plans(monkeypatch)
    gradient(running_loss, sp.Revolve(STEPS, 3), True, monkeypatch)
    plan = made[0]
    assert not plan.trace.loss_last and plan.trace.reversal_order == (2, 1, 0)


@pytest.mark.filterwarnings("error::stepper.step.trace_notes.UntraceableStepWarning")
@pytest.mark.parametrize("running_loss", [receivers_of("prev"), receivers_of("next"), energy_of_next])
@pytest.mark.parametrize("schedule", [lambda: sp.Revolve(STEPS, 2), lambda: sp.Revolve(STEPS, 4),
                                      lambda: sp.MultiLevel(STEPS, 2, 3, write_cost=0, read_cost=0)])
def test_every_path_reverses_in_one_order_with_store_alls_bits(running_loss, schedule, monkeypatch, tmp_path):
    stored = gradient(running_loss, sp.StoreAll(STEPS), False, monkeypatch)
    python = gradient(running_loss, schedule(), False, monkeypatch, storage=str(tmp_path / "python.h5"))
    native = gradient(running_loss, schedule(), True, monkeypatch, storage=str(tmp_path / "native.h5"))
    assert native.stats.native_reversals > 0
    same_bits(stored, python)
    same_bits(stored, native)
    same_bits(stored, gradient(running_loss, sp.StoreAll(STEPS), True, monkeypatch))


def test_on_the_device_too(device, monkeypatch):
    """The GPU's native reversal queues the same plan (the simulator proves the bits)."""
    made = plans(monkeypatch)
    loss = receivers_of("prev", device)
    stored = gradient(loss, sp.StoreAll(STEPS), False, monkeypatch, device)
    for schedule in (sp.Revolve(STEPS, 3), sp.StoreAll(STEPS)):
        native = gradient(loss, schedule, True, monkeypatch, device)
        assert native.stats.native_reversals > 0
        same_bits(stored, native)
    assert made[-1].renames == [("u", "up")]


def test_the_gradient_reversed_in_that_order_matches_finite_differences(monkeypatch):
    loss = receivers_of("prev")
    result = gradient(loss, sp.Revolve(STEPS, 3), True, monkeypatch)
    model = leapfrog_model()
    rng = np.random.default_rng(5)
    for name in ("u", "up"):
        direction = rng.standard_normal(N)
        eps = 1e-6
        values = []
        for sign in (1.0, -1.0):
            start = {k: a.numpy().copy() for k, a in initial().items()}
            start[name] = start[name] + sign * eps * direction
            values.append(model.evaluate({k: sp.array(v) for k, v in start.items()}, STEPS, running_loss=loss))
        fd = (values[0] - values[1]) / (2 * eps)
        analytic = float(np.sum(result.grads[name].numpy() * direction))
        assert abs(fd - analytic) <= 1e-7 * max(1.0, abs(analytic)), (name, fd, analytic)
