"""launch_in_parts: a launch run as rows (a, b) of its first axis, a callback, then the other rows.

The halo exchange of stepper/distributed/domain.py runs the rows that read only a block's own elements
while its messages travel. Here: the callback sees exactly the first part done; the results, and
the gradient of the one launch the Tape records, are those of a plain launch, bit for bit; kernels
whose result depends on the order of threads run whole after the callback; and `row_reach` tells
which rows a kernel's thread touches.
"""
import numpy as np
import pytest

import compiler as sp
from compiler.passes.bounds import row_reach
from compiler.runtime.launch import LaunchError, launch_in_parts

F2 = sp.array(dtype=sp.float64, ndim=2)
F1 = sp.array(dtype=sp.float64)


@sp.kernel
def stencil(u: F2, c: sp.float64, out: F2):
    """Rows i .. i + 2 of u (one halo row on each side) for row i of out; guards, so the interior
    variant runs in the middle of the launch too."""
    i, j = sp.tid()
    m = u.shape[1]
    v = u[i + 1, j] * c
    if j > 0:
        v += u[i + 1, j - 1]
    if j < m - 1:
        v += u[i + 1, j + 1]
    out[i, j] = v * u[i + 1, j] + u[i, j] - u[i + 2, j]


@sp.kernel
def stencil_1d(u: F1, out: F1):
    i = sp.tid()
    n = out.shape[0]
    v = u[i + 1] * 2.0
    if i > 0:
        v += u[i]
    if i < n - 1:
        v += u[i + 2]
    out[i] = v * v


@sp.kernel
def summed(u: F2, total: F1):
    i, j = sp.tid()
    sp.atomic_add(total, 0, u[i, j] * u[i, j])


@sp.kernel
def strided(u: F2, out: F2):
    i, j = sp.tid()
    out[i, j] = u[2 * i, j] + u[i, j]


def _inputs(device, rows=9, cols=37):
    rng = np.random.default_rng(3)
    u = sp.array(rng.standard_normal((rows + 2, cols)), dtype=sp.float64, device=device, requires_grad=True)
    return u, sp.zeros((rows, cols), dtype=sp.float64, device=device, requires_grad=True)


@pytest.mark.parametrize("first_rows", [(1, 8), (0, 9), (4, 4), (0, 1), (8, 9), (3, 6)])
def test_parts_give_the_launch_bits_and_the_callback_sees_the_first_part(device, first_rows):
    u, out = _inputs(device)
    whole = sp.zeros(out.shape, dtype=sp.float64, device=device)
    sp.launch(stencil, out.shape, inputs=[u, 0.5], outputs=[whole])
    seen = []
    ran = launch_in_parts(stencil, out.shape, inputs=[u, 0.5], outputs=[out], first_rows=first_rows,
                          between=lambda: seen.append(out.numpy().copy()))
    assert ran and len(seen) == 1
    a, b = first_rows
    expected_first = np.zeros(out.shape)
    expected_first[a:b] = whole.numpy()[a:b]
    np.testing.assert_array_equal(seen[0], expected_first)        # the rows of the first part, nothing else
    np.testing.assert_array_equal(out.numpy(), whole.numpy())


def test_one_axis_launch_in_parts(device):
    u = sp.array(np.linspace(0.5, 1.5, 4099), dtype=sp.float64, device=device)
    whole = sp.zeros(4097, dtype=sp.float64, device=device)
    out = sp.zeros(4097, dtype=sp.float64, device=device)
    sp.launch(stencil_1d, 4097, inputs=[u], outputs=[whole])
    seen = []
    assert launch_in_parts(stencil_1d, 4097, inputs=[u], outputs=[out], first_rows=(1, 4000),
                           between=lambda: seen.append(out.numpy().copy()))
    assert seen[0][0] == 0 and seen[0][4000:].max() == 0 and seen[0][1:4000].min() > 0
    np.testing.assert_array_equal(out.numpy(), whole.numpy())


def test_the_tape_records_one_launch_with_the_plain_launch_gradient(device):
    grads = []
    for parts in (False, True):
        u, out = _inputs(device)
        tape = sp.Tape(deterministic=True)       # the adjoint scatters into u (wider than the launch)
        with tape:
            if parts:
                launch_in_parts(stencil, out.shape, inputs=[u, 0.5], outputs=[out], first_rows=(1, 8),
                                between=lambda: None)
            else:
                sp.launch(stencil, out.shape, inputs=[u, 0.5], outputs=[out])
        assert len(tape.ops) == 1
        tape.backward(grads={out: np.cos(np.arange(out.numpy().size)).reshape(out.shape)})
        grads.append(u.grad.numpy().copy())
    assert np.abs(grads[0]).max() > 0.1
    np.testing.assert_array_equal(grads[1], grads[0])


def test_a_kernel_with_atomics_runs_whole_after_the_callback(device):
    u = sp.array(np.arange(12.0).reshape(3, 4), dtype=sp.float64, device=device)
    total = sp.zeros(1, dtype=sp.float64, device=device)
    seen = []
    ran = launch_in_parts(summed, (3, 4), inputs=[u], outputs=[total], first_rows=(1, 2),
                          between=lambda: seen.append(total.numpy()[0]))
    assert not ran and seen == [0.0]
    assert total.numpy()[0] == float(np.sum(np.arange(12.0) ** 2))


def test_a_launch_a_tape_holds_waits_whole_after_the_callback():
    """A recorded step whose outputs nothing reads holds its launches and drops them unrun (the
    stepper's Tape.defer_launches): in parts it would run regardless. It completes the callback
    (the exchange must finish either way) and is held whole, like any launch of that tape."""
    u, out = _inputs("cpu")
    tape = sp.Tape(deterministic=True)
    tape.defer_launches()
    seen = []
    with tape:
        ran = launch_in_parts(stencil, out.shape, inputs=[u, 0.5], outputs=[out], first_rows=(1, 8),
                              between=lambda: seen.append(True))
        assert not ran and seen == [True] and len(tape.ops) == 1
        assert tape.drop_deferred() == 1                  # held, and dropped unrun
    assert not out.numpy().any()


def test_rows_outside_the_launch_are_a_clear_error():
    u, out = _inputs("cpu")
    for bad in [(-1, 3), (2, 10), (5, 4), (1.0, 3)]:
        with pytest.raises(LaunchError, match=r"first_rows must be \(a, b\) with 0 <= a <= b <= 9"):
            launch_in_parts(stencil, out.shape, inputs=[u, 0.5], outputs=[out], first_rows=bad, between=lambda: None)


def test_row_reach_is_the_rows_a_thread_touches_or_none():
    assert row_reach(stencil.compiled().forward, "u") == (0, 2)
    assert row_reach(stencil.compiled().forward, "out") == (0, 0)
    assert row_reach(stencil_1d.compiled().forward, "u") == (0, 2)
    assert row_reach(strided.compiled().forward, "u") is None           # row 2 i: not i plus a constant
    assert row_reach(strided.compiled().forward, "out") == (0, 0)
    assert row_reach(summed.compiled().forward, "total") is None        # element 0 on every thread
