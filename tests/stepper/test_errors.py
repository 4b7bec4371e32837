"""Bad input is reported before the run, naming what is wrong."""
import numpy as np
import pytest

import stepper as sp
from stepper_models import chain_initial, chain_model, sum_squares64


def final_x_squared(state):
    out = sp.zeros(1, dtype=sp.float64, device=state.x.device)
    sp.launch(sum_squares64, 16, inputs=[state.x], outputs=[out])
    return out


def counting_model(device="cpu"):
    model = chain_model(device=device)
    inner = model.step_fn
    model.calls = 0

    def step(s):
        model.calls += 1
        inner(s)
    model.step(step)
    return model


@pytest.mark.parametrize("change, message", [
    (lambda i: {"x": i["x"]}, r"missing 'v'"),
    (lambda i: {**i, "w": i["x"]}, r"undeclared 'w'"),
    (lambda i: {**i, "x": sp.zeros(15, dtype=sp.float64, device=i["x"].device)},
     r"'x': expected shape \(16,\) of float64, got shape \(15,\)"),
    (lambda i: {**i, "v": sp.zeros(16, device=i["v"].device)},
     r"'v': expected shape \(16,\) of float64, got shape \(16,\) of float32"),
    (lambda i: {**i, "v": np.zeros(16, np.float32)}, r"'v': expected a float64 NumPy array"),
    (lambda i: {**i, "v": [0.0] * 16}, r"'v': expected a stepper.array or NumPy array, got list"),
])
def test_wrong_initial_state(change, message, device):
    model = counting_model(device=device)
    for run in (lambda i: model.rollout(i, 5), lambda i: model.gradient(i, 5, loss=final_x_squared)):
        with pytest.raises(sp.ModelError, match=message):
            run(change(chain_initial(device=device)))
    assert model.calls == 0


def test_initial_state_on_another_device():
    model, initial = counting_model(), chain_initial()
    initial["x"]._device = "cuda:0"       # stands in for a GPU array on a CPU-only machine
    with pytest.raises(sp.ModelError, match=r"'x' is on device 'cuda:0' but the model runs on 'cpu'"):
        model.rollout(initial, 5)


def test_loss_that_is_not_a_scalar(device):
    model, initial = chain_model(device=device), chain_initial(device=device)
    with pytest.raises(sp.ModelError, match=r"loss\(state\) must return a one-element float array .* shape \(16,\)"):
        model.gradient(initial, 5, loss=lambda state: state.x)
    with pytest.raises(sp.ModelError, match=r"one-element stepper array .* got float"):
        model.gradient(initial, 5, loss=lambda state: 1.0)
    with pytest.raises(sp.ModelError, match=r"running_loss\(s\) must return"):
        model.gradient(initial, 5, running_loss=lambda s: s.next.v)


def test_schedule_for_another_number_of_steps(device):
    model = counting_model(device=device)
    with pytest.raises(sp.ModelError, match=r"made for max_n=50 steps, but the run has steps=40"):
        model.gradient(chain_initial(device=device), 40, loss=final_x_squared, schedule=sp.Revolve(50, 5))
    with pytest.raises(sp.ModelError, match=r"until= needs an online schedule"):
        model.gradient(chain_initial(device=device), 40, loss=final_x_squared, schedule=sp.Revolve(40, 5),
                       until=lambda s: True)
    assert model.calls == 0


def test_a_used_schedule_is_refused(device):
    model, schedule = chain_model(device=device), sp.Revolve(10, 3)
    model.gradient(chain_initial(device=device), 10, loss=final_x_squared, schedule=schedule)
    with pytest.raises(sp.ModelError, match="already been run"):
        model.gradient(chain_initial(device=device), 10, loss=final_x_squared, schedule=schedule)


def test_unwritable_storage_fails_before_the_first_step(tmp_path, device):
    model = counting_model(device=device)
    with pytest.raises(sp.StorageError, match="does not exist"):
        model.gradient(chain_initial(device=device), 100, loss=final_x_squared,
                       schedule=sp.MultiLevel(100, 2, 4), storage=tmp_path / "missing" / "snapshots.h5")
    with pytest.raises(sp.StorageError):
        model.rollout(chain_initial(device=device), 100, checkpoint=tmp_path / "missing" / "run.ckpt",
                      checkpoint_every=10)
    with pytest.raises(sp.ModelError, match="stores snapshots on DISK but no disk storage was given"):
        model.gradient(chain_initial(device=device), 100, loss=final_x_squared, schedule=sp.MultiLevel(100, 2, 4))
    assert model.calls == 0


def test_declarations(device):
    model = sp.Model(device=device)
    model.state("x", 3)
    with pytest.raises(sp.ModelError, match="already declared"):
        model.param("x", sp.zeros(1, device=device))
    with pytest.raises(sp.ModelError, match="float array"):
        model.param("n", sp.zeros(1, dtype=sp.int32, device=device))
    with pytest.raises(sp.ModelError, match="identifier"):
        model.state("not a name", 3)
    with pytest.raises(sp.ModelError, match="no step function"):
        model.rollout({"x": sp.zeros(3, device=device)}, 1)
    with pytest.raises(sp.ModelError, match="needs loss="):
        model.gradient({"x": sp.zeros(3, device=device)}, 1)


def test_a_schedule_named_by_a_string_says_what_schedule_takes():
    with pytest.raises(sp.ModelError, match=r"schedule must be a checkpointing schedule object \(e.g. "
                                            r"Revolve\(steps, 20\), Online\(16\)\) or a function steps -> "
                                            r"schedule, got str 'revolve'"):
        chain_model().gradient(chain_initial(), 10, loss=final_x_squared, schedule="revolve")
