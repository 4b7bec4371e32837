"""Recomputations between checkpoints run without a tape (StepRunner.rerun): the step ran, checked,
from the same state before. They must still give the state's bits exactly, so checkpointed
gradients stay store-all's, and must never record on a user's Tape."""
import numpy as np

import stepper as sp

F1 = sp.array(dtype=float)
N = 50_000          # above the parallel threshold: atomics from several threads race unless serial


@sp.kernel
def sum_into(x: F1, out: F1):
    i = sp.tid()
    sp.atomic_add(out, 0, x[i])


@sp.kernel
def rescale(x: F1, total: F1, y: F1):
    i = sp.tid()
    y[i] = x[i] * (1.0 - 1.0e-6 * total[0]) + 1.0e-3 * sp.sin(x[i])


def racing_model(device="cpu"):
    """A state whose next value depends on a float sum made with atomics: its bits depend on the
    order the threads add in."""
    model = sp.Model(device=device)
    model.state("x", N, sp.float32)

    @model.step
    def step(s):
        total = s.scratch("total", 1)
        sp.launch(sum_into, N, inputs=[s.prev.x], outputs=[total])
        sp.launch(rescale, N, inputs=[s.prev.x, total], outputs=[s.next.x])
    return model


def square_sum(state):
    out = sp.zeros(1, requires_grad=True, device=state.x.device)
    sp.launch(sum_into, N, inputs=[state.x], outputs=[out])
    return out


def initial():
    rng = np.random.default_rng(3)
    # magnitudes over six decades: float32 sums of these differ with the order of the additions
    return {"x": (rng.standard_normal(N) * 10.0 ** rng.uniform(-3, 3, N)).astype(np.float32)}


def test_recomputed_steps_keep_deterministic_atomics_serial(device):
    model, x0 = racing_model(device=device), initial()
    steps = 12
    stored = model.gradient(x0, steps, loss=square_sum, schedule=sp.StoreAll(steps))
    for snapshots in (1, 2, 3):
        result = model.gradient(x0, steps, loss=square_sum, schedule=sp.Revolve(steps, snapshots))
        assert result.stats.forward_steps > steps          # it recomputed
        assert result.loss == stored.loss
        np.testing.assert_array_equal(result.grads["x"].numpy(), stored.grads["x"].numpy())
        np.testing.assert_array_equal(result.final.x.numpy(), stored.final.x.numpy())


def test_recomputations_do_not_record_on_the_users_tape(device):
    model, x0 = racing_model(device=device), initial()
    user = sp.Tape()
    with user:
        result = model.gradient(x0, 6, loss=square_sum, schedule=sp.Revolve(6, 2))
    assert result.stats.forward_steps > 6
    assert len(user.ops) == 0
