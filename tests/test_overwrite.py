"""Overwrite safety: data the gradient still needs is never silently overwritten while a Tape records."""
import re

import numpy as np
import pytest

import compiler as sp


@sp.kernel
def square_then_reset(a: sp.array(dtype=float), b: sp.array(dtype=float)):
    i = sp.tid()
    b[i] = a[i] * a[i]
    a[i] = 1.0


@sp.kernel
def square(a: sp.array(dtype=float), b: sp.array(dtype=float)):
    i = sp.tid()
    b[i] = a[i] * a[i]


@sp.kernel
def double(a: sp.array(dtype=float), b: sp.array(dtype=float)):
    i = sp.tid()
    b[i] = 2.0 * a[i]


@sp.kernel
def accumulate(a: sp.array(dtype=float), b: sp.array(dtype=float)):
    i = sp.tid()
    b[i] += a[i]
    sp.atomic_add(b, 0, a[i])


def _arrays(n=4, device="cpu"):
    return (sp.array(np.arange(1, n + 1, dtype=np.float32), requires_grad=True, device=device),
            sp.zeros(n, requires_grad=True, device=device))


def test_a_kernel_that_reads_and_overwrites_an_array_is_refused_naming_kernel_argument_and_line(device):
    a, b = _arrays(device=device)
    with pytest.raises(sp.OverwriteError) as e, sp.Tape():
        sp.launch(square_then_reset, 4, inputs=[a], outputs=[b])
    message = str(e.value)
    assert "square_then_reset" in message and "'a'" in message
    assert re.search(r"test_overwrite.py:14\b", message)      # the line of `a[i] = 1.0`
    np.testing.assert_array_equal(a.numpy(), [1, 2, 3, 4])    # refused before running: nothing lost


def test_the_same_kernel_runs_normally_outside_a_tape(device):
    a, b = _arrays(device=device)
    sp.launch(square_then_reset, 4, inputs=[a], outputs=[b])
    np.testing.assert_array_equal(b.numpy(), [1, 4, 9, 16])
    np.testing.assert_array_equal(a.numpy(), [1, 1, 1, 1])


def test_overwriting_an_input_of_an_earlier_recorded_launch_names_both_launches(device):
    a, b = _arrays(device=device)
    c = sp.zeros(4, requires_grad=True, device=device)
    with pytest.raises(sp.OverwriteError) as e, sp.Tape():
        sp.launch(square, 4, inputs=[a], outputs=[b])
        sp.launch(double, 4, inputs=[c], outputs=[a])        # overwrites a, which square read
    message = str(e.value)
    assert "square" in message and "double" in message and "'a'" in message


def test_accumulation_and_write_before_read_are_not_overwrites(device):
    a, b = _arrays(device=device)
    c = sp.zeros(4, requires_grad=True, device=device)
    tape = sp.Tape()
    with tape:
        sp.launch(double, 4, inputs=[a], outputs=[c])        # writes c before anyone read it
        sp.launch(accumulate, 4, inputs=[c], outputs=[b])
        sp.launch(accumulate, 4, inputs=[a], outputs=[b])    # accumulates into b again
    tape.backward(grads={b: np.ones(4, np.float32)})
    # Each accumulate adds x[i] to b[i] and to b[0]: with all seeds 1, x.grad = 2 per element.
    # c = 2a contributes 2 * 2, the direct accumulate of a contributes 2.
    np.testing.assert_array_equal(a.grad.numpy(), [6, 6, 6, 6])


def test_changing_a_recorded_input_on_the_host_is_caught_at_backward(device):
    a, b = _arrays(device=device)
    tape = sp.Tape()
    with tape:
        sp.launch(square, 4, inputs=[a], outputs=[b])
    a.fill_(5.0)
    with pytest.raises(sp.OverwriteError, match="square"):
        tape.backward(grads={b: np.ones(4, np.float32)})


@sp.kernel
def bump(x: sp.array(dtype=float)):
    i = sp.tid()
    sp.atomic_add(x, i, 1.0)


def test_accumulating_into_an_array_an_earlier_launch_read_is_refused(device):
    # y = x * x needs the old x in its backward; adding to x afterwards would silently change the
    # gradient ([4, 6] instead of [2, 4]), so it is an error that names both launches.
    x = sp.array([1.0, 2.0], requires_grad=True, device=device)
    y = sp.zeros(2, requires_grad=True, device=device)
    with pytest.raises(sp.OverwriteError, match=r"bump.*accumulates into.*'x'.*square"), sp.Tape():
        sp.launch(square, 2, inputs=[x], outputs=[y])
        sp.launch(bump, 2, inputs=[], outputs=[x])


@sp.kernel
def store_then_read_back(a: sp.array(dtype=float), v: sp.array(dtype=float), x: sp.array(dtype=float)):
    i = sp.tid()
    v[i] = 2.0 * a[i]
    x[i] = v[i] * v[i]          # reads back this thread's own store: not an overwrite of read data


@sp.kernel
def store_in_a_loop_then_read(a: sp.array(dtype=float), v: sp.array(dtype=float), n: int):
    i = sp.tid()
    for k in range(n):
        v[i] = a[i] * v[i]


def test_reading_back_a_value_the_kernel_stored_is_allowed_and_differentiates(device):
    a = sp.array([1.0, 3.0], requires_grad=True, device=device)
    v, x = sp.zeros(2, requires_grad=True, device=device), sp.zeros(2, requires_grad=True, device=device)
    tape = sp.Tape()
    with tape:
        sp.launch(store_then_read_back, 2, inputs=[a], outputs=[v, x])
    tape.backward(grads={x: np.ones(2, np.float32)})
    np.testing.assert_array_equal(a.grad.numpy(), [8.0, 24.0])      # d(4 a^2)/da


def test_a_store_in_a_loop_that_is_read_again_is_refused(device):
    a = sp.array([1.0, 3.0], requires_grad=True, device=device)
    v = sp.ones(2, requires_grad=True, device=device)
    with pytest.raises(sp.OverwriteError, match=r"store_in_a_loop_then_read.*'v'"), sp.Tape():
        sp.launch(store_in_a_loop_then_read, 2, inputs=[a, v, 3])


def test_a_store_over_an_earlier_store_is_refused_not_a_wrong_gradient(device):
    """The adjoint of y = x * x would still send gradient to x for values a later store replaced
    (x.grad would be 2 x instead of 0), so the second store is an error naming both launches; a host
    overwrite too. Accumulating after a store is fine: x keeps its part of the sum."""
    x = sp.ones(3, requires_grad=True, device=device)
    z = sp.ones(3, requires_grad=True, device=device)
    y = sp.zeros(3, requires_grad=True, device=device)
    tape = sp.Tape()
    with tape:
        sp.launch(square, 3, inputs=[x], outputs=[y])
        with pytest.raises(sp.OverwriteError, match=r"kernel 'double' .* overwrites argument 'b' .* which the "
                                                    r"earlier recorded launch of kernel 'square' .* wrote as argument 'b'"):
            sp.launch(double, 3, inputs=[z], outputs=[y])
        with pytest.raises(sp.OverwriteError, match=r"array.fill_\(value\) .* overwrites .* kernel 'square'"):
            y.fill_(0.0)
        sp.launch(accumulate, 3, inputs=[z], outputs=[y])
    tape.backward(grads={y: np.ones(3, np.float32)})
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 2.0, 2.0])
