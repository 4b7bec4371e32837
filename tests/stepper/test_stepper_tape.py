"""A rollout recorded inside a Tape is one operation whose backward is the checkpointed sweep, so it
composes with kernels before and after it."""
import numpy as np
import pytest

import stepper as sp
from stepper_models import chain_initial, chain_model, sum_squares64
from tape_kernels import affine

STEPS = 30


def final_x_squared(state):
    out = sp.zeros(1, dtype=sp.float64, device=state.x.device)
    sp.launch(sum_squares64, 16, inputs=[state.x], outputs=[out])
    return out


def test_rollout_on_a_tape_composes_with_kernels_before_and_after(device):
    model, initial = chain_model(device=device), chain_initial(device=device)
    # x0 = 2 a + 0 (exact), so d loss / d a = 2 d loss / d x0 exactly
    a = sp.array(initial["x"].numpy() / 2, dtype=sp.float64, requires_grad=True, device=device)
    v0 = sp.array(initial["v"].numpy(), dtype=sp.float64, requires_grad=True, device=device)
    x0 = sp.zeros(16, dtype=sp.float64, requires_grad=True, device=device)
    tape = sp.Tape(deterministic=True)
    with tape:
        sp.launch(affine, 16, inputs=[a, 2.0, 0.0], outputs=[x0])
        final = model.rollout({"x": x0, "v": v0}, STEPS, schedule=lambda n: sp.Revolve(n, 4))
        loss = final_x_squared(final)
    assert len(tape.ops) == 3 and tape.ops[1].name == "rollout of 30 steps"
    loss.requires_grad = True
    for p in model.params.values():
        p.grad.zero_()
    tape.backward(loss)
    expected = model.gradient(initial, STEPS, loss=final_x_squared, schedule=sp.StoreAll(STEPS))
    assert loss.numpy()[0] == expected.loss
    np.testing.assert_array_equal(final.x.numpy(), expected.final.x.numpy())
    np.testing.assert_array_equal(a.grad.numpy(), 2 * expected.grads["x"].numpy())
    np.testing.assert_array_equal(v0.grad.numpy(), expected.grads["v"].numpy())
    np.testing.assert_array_equal(model.params.k.grad.numpy(), expected.grads["k"].numpy())

    # repeatable: zero, backward again (the schedule function makes a fresh schedule)
    tape.zero()
    tape.backward(loss)
    np.testing.assert_array_equal(v0.grad.numpy(), expected.grads["v"].numpy())
    np.testing.assert_array_equal(model.params.c.grad.numpy(), expected.grads["c"].numpy())


def test_changing_the_initial_state_after_recording_is_caught_at_backward(device):
    model, initial = chain_model(device=device), chain_initial(device=device)
    x0 = sp.array(initial["x"].numpy(), dtype=sp.float64, requires_grad=True, device=device)
    tape = sp.Tape()
    with tape:
        final = model.rollout({"x": x0, "v": initial["v"]}, 5)
        loss = final_x_squared(final)
    x0.zero_()
    loss.requires_grad = True
    with pytest.raises(sp.OverwriteError, match="rollout of 5 steps"):
        tape.backward(loss)
