"""Which zero fills the native loops and reversals skip (stepper/step/trace.py: `StepTrace.covered`,
`reversal_fills`): a buffer the step's first launch writes whole without reading, and s.next or
scratch that a reversal neither runs a launch on nor has an adjoint load. The bits stay the Python
path's, and a fill an adjoint reads stays."""
import numpy as np

import stepper as sp
import stepper.execute.fast.native_loop as native_loop
from test_native_loop import (F64, STEPS, accumulate_into, clamped_smooth, gradients, interior_smooth, renaming_model,
                              same_bits, x_and_z_loss)


@sp.kernel
def grow_by(x: F64, z: F64, y: F64):
    i = sp.tid()                          # its adjoint loads z (all zeros) to give x's gradient
    y[i] = 0.5 * x[i] * x[i] + x[i] * z[i] + x[i]


def zero_reading_model(n=12):
    """A zero-filled scratch buffer that no launch writes and one reads: the reversals run no launch
    forward, yet the adjoint loads it, so they must still fill it (the pool hands out versions that
    held states)."""
    model = sp.Model()
    model.state("x", n, sp.float64)

    @model.step
    def step(s):
        z = s.scratch("z", n, sp.float64)
        sp.launch(grow_by, n, inputs=[s.prev.x, z], outputs=[s.next.x])
    return model, {"x": sp.array(np.linspace(-0.05, 0.05, n), dtype=sp.float64)}


def test_a_zero_filled_buffer_an_adjoint_reads_is_filled_in_every_reversal(monkeypatch):
    model, initial = zero_reading_model()
    x = initial["x"].numpy().copy()
    xs = [x]
    for _ in range(STEPS):
        xs.append(0.5 * xs[-1] ** 2 + xs[-1])
    g = 2.0 * xs[-1]
    for x in reversed(xs[:-1]):
        g = g * (x + 1.0)
    for schedule in (lambda: sp.StoreAll(STEPS), lambda: sp.Revolve(STEPS, 3)):
        for native in (False, True):
            result = gradients(model, initial, schedule(), native, monkeypatch)
            np.testing.assert_allclose(result.grads["x"].numpy(), g, rtol=1e-13)


@sp.kernel
def scaled_copy(x: F64, y: F64):
    i = sp.tid()                          # reads y: a fill before it is seen
    y[i] = y[i] + 2.0 * x[i]


def test_which_kernels_write_an_output_whole():
    """Compiled.covers: a store at the thread's own index on the body's top level, of an array the
    kernel never reads. A guarded store (interior_smooth), a read of the output (scaled_copy) or an
    accumulation (accumulate_into) leaves the fill in place."""
    assert clamped_smooth.compiled().covers == {"y"}
    assert grow_by.compiled().covers == {"y"}
    assert interior_smooth.compiled().covers == frozenset()
    assert scaled_copy.compiled().covers == frozenset()
    assert accumulate_into.compiled().covers == frozenset()


def test_a_launch_that_writes_a_whole_state_skips_its_zero_fill(monkeypatch):
    """renaming_model(True)'s x and z are written whole by their launches: the native plans fill
    neither s.next (the Python path fills both), and the gradients keep the Python path's bits."""
    plans = []
    real = native_loop._Plan.__init__
    monkeypatch.setattr(native_loop._Plan, "__init__", lambda self, *a, **k: plans.append(self) or real(self, *a, **k))
    model, initial = renaming_model(True)
    python = gradients(model, initial, sp.Revolve(STEPS, 4), False, monkeypatch, loss=x_and_z_loss)
    native = gradients(model, initial, sp.Revolve(STEPS, 4), True, monkeypatch, loss=x_and_z_loss)
    assert plans and native.stats.native_steps > 0
    states = sorted(model.states)
    whole = {len(states) + states.index("x"), len(states) + states.index("z")}
    assert all(not whole & {z.slot for z in plan.zeros} for plan in plans)
    same_bits(python, native)
