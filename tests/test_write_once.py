"""Write-once recursions: a kernel may store a history into an array and read earlier elements of
it (Taichi #2425's `ewma[row, col] = 0.5 * data[row, col] + 0.5 * ewma[row, col - 1]`) when the
compiler proves each element is written once and read only after it is written; the adjoint is then
exact. What it cannot prove stays an OverwriteError that suggests carrying the value in a local."""
import numpy as np
import pytest

import compiler as sp
from compiler import autograd
from test_dynamic_loops import ewma_reference


# Taichi #2425, the array form from the issue, translated: one thread per row, a loop over columns.
@sp.kernel
def calc_ewma(data: sp.array(dtype=float, ndim=2), ewma: sp.array(dtype=float, ndim=2)):
    row = sp.tid()
    for col in range(data.shape[1]):
        if col == 0:
            ewma[row, col] = data[row, col]
        else:
            ewma[row, col] = 0.5 * data[row, col] + 0.5 * ewma[row, col - 1]


@sp.kernel
def calc_loss(ewma: sp.array(dtype=float, ndim=2), loss: sp.array(dtype=float)):
    row = sp.tid()
    last = ewma.shape[1] - 1
    sp.atomic_add(loss, 0, ewma[row, last] ** 2.0)


def test_the_taichi_ewma_runs_as_written_and_matches_the_closed_form(device):
    rng = np.random.RandomState(1)
    values = rng.rand(1, 2).astype(np.float32)           # data is [[0.417022 0.72032449]]
    data = sp.array(values, requires_grad=True, device=device)
    ewma = sp.zeros((1, 2), dtype=float, requires_grad=True, device=device)
    loss = sp.zeros(1, dtype=float, requires_grad=True, device=device)
    tape = sp.Tape()
    with tape:
        sp.launch(calc_ewma, 1, inputs=[data], outputs=[ewma])
        sp.launch(calc_loss, 1, inputs=[ewma], outputs=[loss])
    tape.backward(loss)
    # e1 = 0.5 d0 + 0.5 d1, loss = e1^2: d loss / d d0 = d loss / d d1 = e1 (Taichi printed 1.706, 0.569)
    e1 = np.float32(0.5) * values[0, 0] + np.float32(0.5) * values[0, 1]
    np.testing.assert_array_equal(ewma.numpy(), [[values[0, 0], e1]])
    np.testing.assert_array_equal(data.grad.numpy(), [[e1, e1]])


@sp.kernel
def ewma_history(data: sp.array(dtype=sp.float64, ndim=2), alpha: sp.array(dtype=sp.float64),
                 ys: sp.array(dtype=sp.float64, ndim=2)):
    i = sp.tid()
    ys[i, 0] = data[i, 0]
    for t in range(1, data.shape[1]):
        ys[i, t] = alpha[0] * data[i, t] + (1.0 - alpha[0]) * ys[i, t - 1]


@sp.kernel
def last_squared(ys: sp.array(dtype=sp.float64, ndim=2), out: sp.array(dtype=sp.float64)):
    i = sp.tid()
    out[i] = ys[i, ys.shape[1] - 1] ** 2.0


def ewma_array_form(values, a, device="cpu"):
    data = sp.array(values, dtype=sp.float64, requires_grad=True, device=device)
    alpha = sp.array([a], dtype=sp.float64, requires_grad=True, device=device)
    ys = sp.zeros(values.shape, dtype=sp.float64, requires_grad=True, device=device)
    out = sp.zeros(values.shape[0], dtype=sp.float64, requires_grad=True, device=device)
    tape = sp.Tape()
    with tape:
        sp.launch(ewma_history, values.shape[0], inputs=[data, alpha], outputs=[ys])
        sp.launch(last_squared, values.shape[0], inputs=[ys], outputs=[out])
    tape.backward(grads={out: np.ones(values.shape[0])})
    return out.numpy(), data.grad.numpy(), alpha.grad.numpy()[0]


def test_ewma_history_array_matches_the_closed_form_in_float64(device):
    values = np.random.default_rng(1).random((4, 50))
    out, grad_data, grad_alpha = ewma_array_form(values, 0.3, device)
    e, expected_data, expected_alpha = ewma_reference(values, 0.3)
    np.testing.assert_allclose(out, e * e, rtol=1e-14, atol=0)
    np.testing.assert_allclose(grad_data, expected_data, rtol=1e-13, atol=1e-300)
    np.testing.assert_allclose(grad_alpha, expected_alpha, rtol=1e-13)


def test_ewma_history_passes_gradcheck(device):
    values = np.random.default_rng(2).random((3, 6))
    data = sp.array(values, dtype=sp.float64, requires_grad=True, device=device)
    alpha = sp.array([0.4], dtype=sp.float64, requires_grad=True, device=device)
    ys = sp.zeros(values.shape, dtype=sp.float64, requires_grad=True, device=device)
    assert autograd.gradcheck(ewma_history, 3, [data, alpha], [ys], eps=1e-7, atol=1e-8, rtol=1e-6,
                              show_summary=False)


# -- accepted by the proof, checked against finite differences (an independent review's cases) -----
F2 = sp.array(dtype=sp.float64, ndim=2)
F3 = sp.array(dtype=sp.float64, ndim=3)


@sp.kernel
def two_level_history(x: F3, ys: F3):
    i = sp.tid()
    for s in range(x.shape[1]):
        for t in range(x.shape[2]):
            v = x[i, s, t]
            if t > 0:
                v = v + 0.7 * ys[i, s, t - 1]
            if s > 0 and t < x.shape[2] - 1:
                v = v + 0.5 * ys[i, s - 1, t + 1]        # an earlier outer iteration, a later inner one
            ys[i, s, t] = 0.3 * v * v


@sp.kernel
def maybe_written(x: F2, ys: F2, out: F2):
    i = sp.tid()
    for t in range(x.shape[1]):
        if x[i, t] > 0.5:
            ys[i, t] = x[i, t] * x[i, t]
        if t > 0:
            out[i, t] = ys[i, t - 1] * x[i, t]          # this kernel's value, or ys's own input value


@sp.kernel
def read_right_after(x: F2, ys: F2, out: F2):
    i = sp.tid()
    for t in range(x.shape[1]):
        ys[i, t] = 3.0 * x[i, t]
        out[i, t] = ys[i, t] * ys[i, t]                  # the element just written, same iteration


@sp.kernel
def head_then_loop(x: F2, ys: F2):
    i = sp.tid()
    ys[i, 0] = x[i, 0]
    for t in range(1, x.shape[1]):
        ys[i, t] = ys[i, 0] * x[i, t] + ys[i, t - 1]     # the head was written before the loop


@sp.kernel
def per_cell_history(x: F3, ys: F3):
    i, j = sp.tid()
    for t in range(x.shape[2]):
        if t == 0:
            ys[i, j, t] = x[i, j, t]
        else:
            ys[i, j, t] = sp.sin(ys[i, j, t - 1]) + x[i, j, t]


X2 = np.array([[0.9, 0.2, 0.8, 0.1, 0.7, 0.3], [0.1, 0.95, 0.3, 0.85, 0.2, 0.6]])    # away from 0.5


@pytest.mark.parametrize("kernel, dims, x0, starts", [
    (two_level_history, 2, np.random.default_rng(0).random((2, 3, 4)) * 0.8, [np.full((2, 3, 4), 0.25)]),
    (maybe_written, 2, X2, [np.full((2, 6), 0.4), np.zeros((2, 6))]),
    (read_right_after, 2, X2, [np.zeros((2, 6)), np.zeros((2, 6))]),
    (head_then_loop, 2, X2, [np.zeros((2, 6))]),
    (per_cell_history, (2, 3), np.random.default_rng(1).random((2, 3, 5)), [np.zeros((2, 3, 5))]),
], ids=lambda v: getattr(v, "__name__", ""))
def test_proven_recursions_match_finite_differences(kernel, dims, x0, starts, device):
    weights = [np.random.default_rng(2).random(a.shape) for a in starts]

    def loss(values):
        outs = [sp.array(a, dtype=sp.float64, device=device) for a in starts]
        sp.launch(kernel, dims, inputs=[sp.array(values, dtype=sp.float64, device=device)], outputs=outs)
        return sum(float((w * o.numpy()).sum()) for w, o in zip(weights, outs))
    x = sp.array(x0, dtype=sp.float64, requires_grad=True, device=device)
    outs = [sp.array(a, dtype=sp.float64, requires_grad=True, device=device) for a in starts]
    tape = sp.Tape()
    with tape:
        sp.launch(kernel, dims, inputs=[x], outputs=outs)
    tape.backward(grads=dict(zip(outs, weights)))
    fd = np.zeros_like(x0)
    for k in np.ndindex(x0.shape):
        up, down = x0.copy(), x0.copy()
        up[k] += 1e-6
        down[k] -= 1e-6
        fd[k] = (loss(up) - loss(down)) / 2e-6
    np.testing.assert_allclose(x.grad.numpy(), fd, rtol=1e-7, atol=1e-9)


# -- what stays refused ----------------------------------------------------------------------------
@sp.kernel
def running_value_in_place(data: sp.array(dtype=sp.float64, ndim=2), e: sp.array(dtype=sp.float64)):
    row = sp.tid()
    for col in range(data.shape[1]):
        e[row] = 0.5 * data[row, col] + 0.5 * e[row]          # Taichi's #2: one element, rewritten


@sp.kernel
def reads_a_later_element(data: sp.array(dtype=sp.float64, ndim=2), ys: sp.array(dtype=sp.float64, ndim=2)):
    i = sp.tid()
    for t in range(data.shape[1] - 1):
        ys[i, t] = data[i, t] + ys[i, t + 1]


@sp.kernel
def reads_another_threads_element(data: sp.array(dtype=sp.float64, ndim=2),
                                  ys: sp.array(dtype=sp.float64, ndim=2)):
    i = sp.tid()
    for t in range(1, data.shape[1]):
        ys[i, t] = data[i, t] + ys[i - 1, t - 1]


@sp.kernel
def reads_before_writing(data: sp.array(dtype=sp.float64, ndim=2), ys: sp.array(dtype=sp.float64, ndim=2)):
    i = sp.tid()
    for t in range(data.shape[1]):
        ys[i, t] = data[i, t] * ys[i, t]


@sp.kernel
def rewritten_in_one_iteration(data: sp.array(dtype=sp.float64, ndim=2), ys: sp.array(dtype=sp.float64, ndim=2)):
    i = sp.tid()
    for t in range(0, data.shape[1], 2):
        ys[i, t] = data[i, t]
        if t >= 2:
            ys[i, t] = data[i, t] * ys[i, t - 2]        # a second store of the element just written


@pytest.mark.parametrize("kernel, reason", [
    (running_value_in_place, "does not use the counter 'col'"),
    (rewritten_in_one_iteration, "may write the same element"),
    (reads_a_later_element, "reads an element that a later iteration writes"),
    (reads_another_threads_element, "reads an element that another thread writes"),
    (reads_before_writing, "reads an element before the kernel writes it"),
])
def test_unprovable_recursions_are_refused_with_the_reason_and_a_local_as_the_fix(kernel, reason, device):
    data = sp.array(np.ones((2, 3)), dtype=sp.float64, requires_grad=True, device=device)
    shape = 2 if kernel is running_value_in_place else (2, 3)
    out = sp.zeros(shape, dtype=sp.float64, requires_grad=True, device=device)
    with pytest.raises(sp.OverwriteError) as info:
        with sp.Tape():
            sp.launch(kernel, 2, inputs=[data], outputs=[out])
    message = str(info.value)
    assert reason in message and "carry a running value in a local" in message
    assert "test_write_once.py" in message


# -- while loops counted by an induction variable are range loops to the proof -----------------------
@sp.kernel
def ewma_while(x: F2, alpha: sp.float64, cols: int, ys: F2):
    row = sp.tid()
    ys[row, 0] = x[row, 0]
    t = int(1)
    while t < cols:
        ys[row, t] = alpha * x[row, t] + (1.0 - alpha) * ys[row, t - 1]
        t += 1


@sp.kernel
def ewma_for(x: F2, alpha: sp.float64, cols: int, ys: F2):
    row = sp.tid()
    ys[row, 0] = x[row, 0]
    for t in range(1, cols):
        ys[row, t] = alpha * x[row, t] + (1.0 - alpha) * ys[row, t - 1]


@sp.kernel
def every_other_while(x: F2, cols: int, ys: F2):
    row = sp.tid()
    ys[row, 0] = x[row, 0]
    ys[row, 1] = x[row, 1]
    t = int(2)
    while cols > t:                                   # the bound on the left, a step of 2
        ys[row, t] = sp.sin(ys[row, t - 2]) + x[row, t]
        t += 2


def _run(kernel, values, scalars, seed, device):
    x = sp.array(values, dtype=sp.float64, requires_grad=True, device=device)
    ys = sp.zeros(values.shape, dtype=sp.float64, requires_grad=True, device=device)
    tape = sp.Tape()
    with tape:
        sp.launch(kernel, values.shape[0], inputs=[x, *scalars], outputs=[ys])
    tape.backward(grads={ys: seed})
    return ys.numpy(), x.grad.numpy()


def test_a_while_loop_counted_by_an_induction_variable_is_differentiated_like_the_for_loop(device, capfd):
    values = np.random.default_rng(4).random((3, 9))
    seed = np.random.default_rng(5).random((3, 9))
    for_form = _run(ewma_for, values, [0.3, 9], seed, device)
    while_form = _run(ewma_while, values, [0.3, 9], seed, device)
    assert "__reverse__" not in capfd.readouterr().out      # the adjoint's internal mark is never printed
    np.testing.assert_array_equal(while_form[0], for_form[0])
    np.testing.assert_array_equal(while_form[1], for_form[1])
    e, expected_data, _ = ewma_reference(values, 0.3)                  # and the closed form
    np.testing.assert_allclose(while_form[0][:, -1], e, rtol=1e-14)


def test_a_counted_while_loop_with_a_step_of_2_matches_finite_differences(device):
    values = np.random.default_rng(6).random((2, 7))
    seed = np.random.default_rng(7).random((2, 7))
    _, grad = _run(every_other_while, values, [7], seed, device)
    fd = np.zeros_like(values)
    for k in np.ndindex(values.shape):
        up, down = values.copy(), values.copy()
        up[k] += 1e-6
        down[k] -= 1e-6
        fd[k] = ((_run(every_other_while, up, [7], seed, device)[0] * seed).sum()
                 - (_run(every_other_while, down, [7], seed, device)[0] * seed).sum()) / 2e-6
    np.testing.assert_allclose(grad, fd, rtol=1e-7, atol=1e-9)


@sp.kernel
def while_counter_in_a_branch(x: F2, cols: int, ys: F2):
    row = sp.tid()
    t = int(1)
    while t < cols:
        ys[row, t] = x[row, t] + ys[row, t - 1]
        if x[row, t] > 0.5:
            t += 1
        else:
            t += 2


@sp.kernel
def while_counting_down(x: F2, cols: int, ys: F2):
    row = sp.tid()
    t = cols - 2
    while t >= 0:
        ys[row, t] = x[row, t] + ys[row, t + 1]
        t -= 1


@sp.kernel
def while_counter_decremented(x: F2, cols: int, ys: F2):
    row = sp.tid()
    t = int(1)
    while t < cols:
        ys[row, t] = x[row, t] + ys[row, t - 1]
        t -= 1
        t += 2


@sp.kernel
def while_counter_reassigned(x: F2, cols: int, ys: F2):
    row = sp.tid()
    t = int(1)
    while t < cols:
        ys[row, t] = x[row, t] + ys[row, t - 1]
        t = t * 2


@sp.kernel
def while_bound_moves(x: F2, cols: int, ys: F2):
    row = sp.tid()
    t = int(1)
    stop = cols
    while t < stop:
        ys[row, t] = x[row, t] + ys[row, t - 1]
        stop = stop - 1
        t += 1


@pytest.mark.parametrize("kernel, reason", [
    (while_counter_in_a_branch, "is not changed exactly once in every iteration"),
    (while_counting_down, "is not set to an int constant just before the loop"),
    (while_counter_decremented, "is not changed exactly once in every iteration"),
    (while_counter_reassigned, "is not increased by a positive constant"),
    (while_bound_moves, "its bound changes in the loop"),
])
def test_while_loops_that_are_not_induction_loops_are_refused_with_the_reason(kernel, reason, device):
    x = sp.array(np.ones((2, 4)), dtype=sp.float64, requires_grad=True, device=device)
    ys = sp.zeros((2, 4), dtype=sp.float64, requires_grad=True, device=device)
    with pytest.raises(sp.OverwriteError) as info:
        with sp.Tape():
            sp.launch(kernel, 2, inputs=[x, 4], outputs=[ys])
    message = str(info.value)
    assert "is not counted by an induction variable" in message and reason in message, message
    assert "test_write_once.py" in message
