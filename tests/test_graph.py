"""capture(): launches recorded once and replayed without Python-side argument checks."""
import numpy as np
import pytest

import compiler as sp


@sp.kernel
def axpy(a: float, x: sp.array(dtype=float), y: sp.array(dtype=float)):
    i = sp.tid()
    y[i] = a * x[i] + y[i]


@sp.kernel
def scale(y: sp.array(dtype=float), z: sp.array(dtype=float)):
    i = sp.tid()
    z[i] = 0.5 * y[i]


def test_replay_runs_the_captured_launches_in_order_on_the_current_data(device):
    x, y, z = sp.ones(4, device=device), sp.zeros(4, device=device), sp.zeros(4, device=device)
    with sp.capture() as graph:
        sp.launch(axpy, 4, inputs=[2.0, x, y])
        sp.launch(scale, 4, inputs=[y], outputs=[z])
    assert len(graph) == 2
    np.testing.assert_array_equal(y.numpy(), [2, 2, 2, 2])          # captured launches ran once
    version = y.version
    x.assign([1, 2, 3, 4])                                           # new data, same memory
    graph.replay()
    graph.replay()
    np.testing.assert_array_equal(y.numpy(), [2 + 2 * 2, 2 + 2 * 4, 2 + 2 * 6, 2 + 2 * 8])
    np.testing.assert_array_equal(z.numpy(), 0.5 * y.numpy())
    assert y.version == version + 2                                  # replays count as writes


def test_launches_on_a_recording_tape_cannot_be_captured(device):
    x, y = sp.ones(4, requires_grad=True, device=device), sp.zeros(4, requires_grad=True, device=device)
    with pytest.raises(sp.LaunchError, match="axpy.*Tape"), sp.Tape(), sp.capture():
        sp.launch(axpy, 4, inputs=[2.0, x, y])
    np.testing.assert_array_equal(y.numpy(), [0, 0, 0, 0])         # refused before running


def test_captures_do_not_nest():
    with pytest.raises(RuntimeError, match="nested"), sp.capture(), sp.capture():
        pass
