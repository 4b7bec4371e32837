"""A recorded step whose adjoint runs next computes outputs nothing reads: its launches are held
(Tape.defer_launches) and the last one is dropped unrun. Anything that needs a held launch's result
(a later launch, host access) runs it first, so no one ever sees a launch that did not happen."""
import numpy as np
import pytest

import stepper as sp
from step_kernels import double, total

STEPS = 12


def chain_model(step, device="cpu"):
    model = sp.Model(device=device)
    model.state("x", 4)
    model.step(step)
    return model, {"x": sp.array([1.0, -2.0, 3.0, 0.5], device=device)}


def energy(state):
    out = sp.zeros(1, requires_grad=True, device=state.x.device)
    sp.launch(total, 4, inputs=[state.x], outputs=[out])
    return out


def one_launch(s):
    sp.launch(double, 4, inputs=[s.prev.x], outputs=[s.next.x])


def test_the_last_launch_of_each_reversed_step_is_skipped_and_the_gradient_keeps_its_bits(device):
    model, initial = chain_model(one_launch, device=device)
    stored = model.gradient(initial, STEPS, loss=energy, schedule=sp.StoreAll(STEPS))
    revolve = model.gradient(initial, STEPS, loss=energy, schedule=sp.Revolve(STEPS, 3))
    assert stored.stats.launches_skipped == 0                  # store-all steps feed the next step
    # every recorded step but the last of the first sweep (whose result the loss reads) is reversed
    # right after it runs, and its only launch never runs
    assert revolve.stats.launches_skipped == STEPS - 1
    assert revolve.loss == stored.loss == 2.0 ** STEPS * 2.5
    np.testing.assert_array_equal(revolve.grads["x"].numpy(), stored.grads["x"].numpy())
    np.testing.assert_array_equal(revolve.grads["x"].numpy(), np.full(4, 2.0 ** STEPS))


def test_a_later_launch_runs_the_held_one_first(device):
    def two_launches(s):
        half = s.scratch("half", 4)
        sp.launch(double, 4, inputs=[s.prev.x], outputs=[half])
        sp.launch(double, 4, inputs=[half], outputs=[s.next.x])   # reads what the first wrote
    model, initial = chain_model(two_launches, device=device)
    result = model.gradient(initial, STEPS // 2, loss=energy, schedule=sp.Revolve(STEPS // 2, 2))
    assert result.stats.launches_skipped == STEPS // 2 - 1        # only the last launch of each
    np.testing.assert_array_equal(result.grads["x"].numpy(), np.full(4, 4.0 ** (STEPS // 2)))


@pytest.mark.filterwarnings("ignore::stepper.step.trace_notes.UntraceableStepWarning")   # a host write, on purpose
def test_host_access_runs_the_held_launch_first(device):
    """The step fills a buffer on the host, so it has no trace (stepper/step/trace.py) and its function
    runs on every evaluation, recorded ones included: each looks at its output."""
    seen = []

    def looks_at_its_output(s):
        s.scratch("unused", 4).fill_(1.0)
        sp.launch(double, 4, inputs=[s.prev.x], outputs=[s.next.x])
        seen.append(np.array_equal(s.next.x.numpy(), 2.0 * s.prev.x.numpy()))
    model, initial = chain_model(looks_at_its_output, device=device)
    result = model.gradient(initial, STEPS, loss=energy, schedule=sp.Revolve(STEPS, 3))
    assert all(seen) and len(seen) == result.stats.forward_steps
    assert result.stats.launches_skipped == 0


def test_a_tape_holds_launches_until_their_results_are_needed():
    # CPU only: Tape.defer_launches holds CPU launches (a GPU launch is queued on its stream anyway)
    x = sp.array([1.0, 2.0, 3.0, 4.0])
    y, z, w = sp.zeros(4), sp.zeros(4), sp.zeros(4)
    tape = sp.Tape()
    tape.defer_launches()
    with tape:
        sp.launch(double, 4, inputs=[x], outputs=[y])
        assert tape._deferred                                    # held, not run
        sp.launch(double, 4, inputs=[y], outputs=[z])             # runs the held one first
        np.testing.assert_array_equal(z.numpy(), [4.0, 8.0, 12.0, 16.0])   # host access: runs it
        sp.launch(double, 4, inputs=[z], outputs=[w])
    assert tape.drop_deferred() == 1                              # w = 2 z never ran
    np.testing.assert_array_equal(w.numpy(), [0.0, 0.0, 0.0, 0.0])
    sp.launch(double, 4, inputs=[x], outputs=[w])                 # the tape no longer holds anything
    np.testing.assert_array_equal(w.numpy(), [2.0, 4.0, 6.0, 8.0])
