"""Dynamic loops differentiate exactly: runtime trip counts, while, break, continue (issue 3).

Every case is one Warp gets wrong or cannot express (its dynamic loops are not replayed in the
backward pass). Expected values are exact, analytic, or a float64 reference (NumPy forward-mode or
central finite differences of a float64 kernel).
"""
import numpy as np
import pytest

import compiler as sp
from compiler import autograd


def backward_ones(kernel, dim, inputs, out):
    """Launch on a Tape and backpropagate ones from `out`."""
    tape = sp.Tape()
    with tape:
        sp.launch(kernel, dim, inputs=inputs, outputs=[out])
    tape.backward(grads={out: np.ones(out.numpy().shape, out.numpy().dtype)})
    return tape


# -- Warp's documented failures ----------------------------------------------------------------------
@sp.kernel
def prod_loop(x: sp.array(dtype=float), n: int, out: sp.array(dtype=float)):
    i = sp.tid()
    prod = float(1.0)
    for k in range(n):
        prod *= x[k]
    out[i] = prod


def test_product_over_a_runtime_range(device):
    x = sp.array([2.0, 2.0, 2.0], requires_grad=True, device=device)
    out = sp.zeros(1, requires_grad=True, device=device)
    backward_ones(prod_loop, 1, [x, 3], out)
    np.testing.assert_array_equal(out.numpy(), [8.0])
    np.testing.assert_array_equal(x.grad.numpy(), [4.0, 4.0, 4.0])     # Warp: [32, 8, 2]


@sp.kernel
def weighted_mean(x: sp.array(dtype=float), weights: sp.array(dtype=float), iters: int,
                  loss: sp.array(dtype=float)):
    sum = float(0.0)
    norm = float(0.0)
    for i in range(iters):
        w = weights[i]
        norm += w
        sum += x[i] * w
    sp.atomic_add(loss, 0, sum / norm)


def test_sum_over_norm_needs_the_final_norm(device):
    x = sp.full(3, 1.0, requires_grad=True, device=device)
    weights = sp.full(3, 1.0, requires_grad=True, device=device)
    loss = sp.zeros(1, requires_grad=True, device=device)
    backward_ones(weighted_mean, 1, [x, weights, 3], loss)
    np.testing.assert_array_equal(loss.numpy(), [1.0])
    np.testing.assert_array_equal(x.grad.numpy(), np.full(3, np.float32(1.0) / np.float32(3.0)))  # Warp: inf
    np.testing.assert_allclose(weights.grad.numpy(), [0.0, 0.0, 0.0], atol=1e-7)   # x_i / 3 - sum / 9 = 0


# -- recurrences (the Taichi issue) --------------------------------------------------------------------
@sp.kernel
def ewma(data: sp.array(dtype=sp.float64, ndim=2), ncols: int, alpha: sp.array(dtype=sp.float64),
         out: sp.array(dtype=sp.float64)):
    row = sp.tid()
    a = alpha[0]
    e = data[row, 0]
    for c in range(1, ncols):
        e = a * data[row, c] + (1.0 - a) * e
    out[row] = e * e


def ewma_reference(data, a):
    """Gradients of sum_rows e^2: e = sum_c w_c d_c, w_0 = (1-a)^(n-1), w_c = a (1-a)^(n-1-c)."""
    n = data.shape[1]
    powers = (1.0 - a) ** (n - 1 - np.arange(n))
    weights = np.concatenate([[powers[0]], a * powers[1:]])
    e = data @ weights
    # de/da = sum_{c>=1} d_c (1-a)^(n-1-c) - sum_c w_c' ... differentiate the weights directly
    k = n - 1 - np.arange(n)
    dpow = np.where(k > 0, -k * (1.0 - a) ** np.maximum(k - 1, 0), 0.0)
    dweights = np.concatenate([[dpow[0]], powers[1:] + a * dpow[1:]])
    return e, 2 * e[:, None] * weights[None, :], float(np.sum(2 * e * (data @ dweights)))


def test_ewma_in_a_local_over_a_runtime_number_of_columns(device):
    rng = np.random.default_rng(1)
    values = rng.random((4, 9))
    data = sp.array(values, dtype=sp.float64, requires_grad=True, device=device)
    alpha = sp.array([0.3], dtype=sp.float64, requires_grad=True, device=device)
    out = sp.zeros(4, dtype=sp.float64, requires_grad=True, device=device)
    backward_ones(ewma, 4, [data, 9, alpha], out)
    e, grad_data, grad_alpha = ewma_reference(values, 0.3)
    np.testing.assert_allclose(out.numpy(), e * e, rtol=1e-14)
    np.testing.assert_allclose(data.grad.numpy(), grad_data, rtol=1e-12)
    np.testing.assert_allclose(alpha.grad.numpy(), [grad_alpha], rtol=1e-12)
    assert autograd.gradcheck(ewma, 4, [data, 9, alpha], [out], eps=1e-7, atol=1e-8, rtol=1e-6,
                              show_summary=False)


def test_ewma_of_the_taichi_issue(device):
    # two columns, alpha 0.5, loss e1^2: d loss / d d0 = d loss / d d1 = e1 = 0.5 d0 + 0.5 d1
    values = np.array([[0.417022004702574, 0.7203244934421581]])
    data = sp.array(values, dtype=sp.float64, requires_grad=True, device=device)
    alpha = sp.array([0.5], dtype=sp.float64, device=device)
    out = sp.zeros(1, dtype=sp.float64, requires_grad=True, device=device)
    backward_ones(ewma, 1, [data, 2, alpha], out)
    e1 = 0.5 * values[0, 0] + 0.5 * values[0, 1]
    np.testing.assert_array_equal(data.grad.numpy(), [[e1, e1]])


@sp.kernel
def alpha_blend(d: sp.array(dtype=sp.float64), n: int, out: sp.array(dtype=sp.float64)):
    t = sp.tid()
    e = sp.float64(0.0)
    for k in range(n):
        e = (1.0 - e) * d[t * n + k] + e
    out[t] = e


def test_alpha_blending_over_a_runtime_length(device):
    rng = np.random.default_rng(2)
    n, rays = 7, 3
    values = rng.uniform(0.05, 0.6, rays * n)
    d = sp.array(values, dtype=sp.float64, requires_grad=True, device=device)
    out = sp.zeros(rays, dtype=sp.float64, requires_grad=True, device=device)
    backward_ones(alpha_blend, rays, [d, n], out)
    # 1 - e = prod_k (1 - d_k), so d e / d d_k = prod_{j != k} (1 - d_j)
    transmit = (1.0 - values).reshape(rays, n)
    np.testing.assert_allclose(out.numpy(), 1.0 - transmit.prod(axis=1), rtol=1e-14)
    expected = transmit.prod(axis=1, keepdims=True) / transmit
    np.testing.assert_allclose(d.grad.numpy(), expected.ravel(), rtol=1e-13)
    fd = autograd.jacobian_fd(alpha_blend, rays, [d, n], [out], eps=1e-7)["d", "out"]
    np.testing.assert_allclose(fd.sum(axis=0), expected.ravel(), rtol=1e-7)


# -- while, break, continue --------------------------------------------------------------------------
@sp.kernel
def grow_until(v0: sp.array(dtype=sp.float64), limit: sp.float64, out: sp.array(dtype=sp.float64),
               steps: sp.array(dtype=int)):
    t = sp.tid()
    v = v0[t]
    k = int(0)
    while v < limit:
        v = 1.5 * v + 0.1
        k += 1
    out[t] = v
    steps[t] = k


def test_while_loop_gradient_is_1_5_to_the_k(device):
    starts = np.array([0.013, 0.2, 1.7, 5.1, 20.0, 99.0, 150.0])
    v0 = sp.array(starts, dtype=sp.float64, requires_grad=True, device=device)
    out = sp.zeros(len(starts), dtype=sp.float64, requires_grad=True, device=device)
    steps = sp.zeros(len(starts), dtype=int, device=device)
    tape = sp.Tape()
    with tape:
        sp.launch(grow_until, len(starts), inputs=[v0, 100.0], outputs=[out, steps])
    tape.backward(grads={out: np.ones(len(starts))})
    k = []
    for v in starts:                 # the float64 reference loop, far from the boundary for these starts
        count = 0
        while v < 100.0:
            v, count = 1.5 * v + 0.1, count + 1
        k.append(count)
    np.testing.assert_array_equal(steps.numpy(), k)
    assert k[0] > 15 and k[-1] == 0
    np.testing.assert_array_equal(v0.grad.numpy(), 1.5 ** np.array(k))


@sp.kernel
def nested_break_continue(x: sp.array(dtype=sp.float64), n: int, m: int, limit: sp.float64,
                          out: sp.array(dtype=sp.float64), stopped: sp.array(dtype=int)):
    t = sp.tid()
    s = sp.float64(0.0)
    last = int(-1)
    for i in range(n):
        last = i
        if x[i] < 0.0:
            continue
        for j in range(m):
            if j > i + t:
                break
            if (i + j) % 3 == 1:
                continue
            s = s * 0.9 + sp.sin(x[i] * x[j] + s)
        if s > limit:
            break
    out[t] = s
    stopped[t] = last


def nested_reference(x, n, m, limit, t):
    s, last = 0.0, -1
    for i in range(n):
        last = i
        if x[i] < 0.0:
            continue
        for j in range(m):
            if j > i + t:
                break
            if (i + j) % 3 == 1:
                continue
            s = s * 0.9 + np.sin(x[i] * x[j] + s)
        if s > limit:
            break
    return s, last


def test_nested_loops_with_break_and_continue(device):
    xs = np.array([0.7, -0.3, 0.9, 1.3, 0.2, -1.0, 0.5, 1.1])
    x = sp.array(xs, dtype=sp.float64, requires_grad=True, device=device)
    out = sp.zeros(4, dtype=sp.float64, requires_grad=True, device=device)
    stopped = sp.zeros(4, dtype=int, device=device)
    args = [x, 8, 6, 3.01]
    tape = sp.Tape()
    with tape:
        sp.launch(nested_break_continue, 4, inputs=args, outputs=[out, stopped])
    tape.backward(grads={out: np.ones(4)})
    refs = [nested_reference(xs, 8, 6, 3.01, t) for t in range(4)]
    np.testing.assert_allclose(out.numpy(), [r[0] for r in refs], rtol=1e-14)
    np.testing.assert_array_equal(stopped.numpy(), [7, 4, 4, 4])     # threads 1-3 take the outer break
    fd = autograd.jacobian_fd(nested_break_continue, 4, args, [out, stopped], eps=1e-7)["x", "out"]
    np.testing.assert_allclose(x.grad.numpy(), fd.sum(axis=0), rtol=1e-6, atol=1e-8)
    assert autograd.gradcheck(nested_break_continue, 4, args, [out, stopped], eps=1e-7, atol=1e-7, rtol=1e-6,
                              show_summary=False)


# -- locals of other kinds -----------------------------------------------------------------------------
@sp.kernel
def fill_vector(x: sp.array(dtype=float), n: int, out: sp.array(dtype=float)):
    i = sp.tid()
    v = sp.vec3(0.0)
    for j in range(n):
        v[j] = x[3 * i + j]
    out[i] = sp.dot(v, v)


def test_local_vector_filled_element_by_element(device):
    xs = np.arange(1.0, 7.0, dtype=np.float32) * 0.5
    x = sp.array(xs, requires_grad=True, device=device)
    out = sp.zeros(2, requires_grad=True, device=device)
    backward_ones(fill_vector, 2, [x, 3], out)
    np.testing.assert_array_equal(out.numpy(), (xs.reshape(2, 3) ** 2).sum(axis=1))
    np.testing.assert_array_equal(x.grad.numpy(), 2 * xs)


@sp.kernel
def pointer_walk(x: sp.array(dtype=sp.float64), nxt: sp.array(dtype=int), steps: int,
                 out: sp.array(dtype=sp.float64)):
    t = sp.tid()
    idx = t
    p = sp.float64(1.0)
    for k in range(steps):
        if idx % 2 == 0:
            p = p * x[idx]
        else:
            p = p + x[idx]
        idx = nxt[idx]
        if idx == t:
            idx = (idx + 1) % 6
    out[t] = p


def pointer_walk_reference(xs, nxt, steps, t):
    """Forward mode in float64: the value and its gradient with respect to x."""
    idx, p, dp = t, 1.0, np.zeros(len(xs))
    for _ in range(steps):
        if idx % 2 == 0:
            dp = dp * xs[idx]
            dp[idx] += p
            p = p * xs[idx]
        else:
            dp[idx] += 1.0
            p = p + xs[idx]
        idx = nxt[idx]
        if idx == t:
            idx = (idx + 1) % 6
    return p, dp


def test_loop_carried_index_used_for_loads_and_conditions(device):
    xs = np.array([1.1, 0.8, -0.6, 1.4, 0.9, 2.0])
    links = np.array([3, 0, 5, 2, 1, 4], dtype=np.int32)
    x = sp.array(xs, dtype=sp.float64, requires_grad=True, device=device)
    nxt = sp.array(links, device=device)
    out = sp.zeros(6, dtype=sp.float64, requires_grad=True, device=device)
    backward_ones(pointer_walk, 6, [x, nxt, 11], out)
    refs = [pointer_walk_reference(xs, links, 11, t) for t in range(6)]
    np.testing.assert_allclose(out.numpy(), [r[0] for r in refs], rtol=1e-14)
    np.testing.assert_allclose(x.grad.numpy(), np.sum([r[1] for r in refs], axis=0), rtol=1e-13)


vec3d = sp.vector(3, sp.float64)


@sp.kernel
def spin(v0: sp.array(dtype=vec3d), w: sp.array(dtype=vec3d), n: int, out: sp.array(dtype=sp.float64)):
    t = sp.tid()
    v = v0[t]
    for k in range(n - 1, -1, -1):                 # a runtime range walked backwards
        v = v + 0.1 * sp.cross(w[0], v) * sp.float64(k + 1)
        v = v / sp.length(v)
    out[t] = v[0] + 2.0 * v[1] * v[2]



def test_loop_carried_vector_with_a_backward_range(device):
    rng = np.random.default_rng(5)
    v0 = sp.array(rng.normal(size=(3, 3)), dtype=vec3d, requires_grad=True, device=device)
    w = sp.array([[0.3, -0.8, 0.5]], dtype=vec3d, requires_grad=True, device=device)
    out = sp.zeros(3, dtype=sp.float64, requires_grad=True, device=device)
    args = [v0, w, 6]
    assert autograd.gradcheck(spin, 3, args, [out], eps=1e-7, atol=1e-8, rtol=1e-6, show_summary=False)
    # only v's value at the start of each iteration is saved: three float64 words, six iterations
    assert set(autograd.loop_tape_words(spin, 3, args, [out])) == {6 * 3}


@sp.kernel
def first_crossing(x: sp.array(dtype=sp.float64), n: int, level: sp.float64, out: sp.array(dtype=sp.float64)):
    t = sp.tid()
    s = sp.float64(0.0)
    for k in range(n):
        s = s + x[t * n + k] * x[t * n + k]
        if s > level:
            out[t] = s * x[t * n + k]            # return from inside the loop
            return
    out[t] = -s


def test_return_from_inside_a_dynamic_loop(device):
    xs = np.array([0.5, 0.7, 0.9, 1.1, 0.1, 0.2, 0.3, 0.1])
    x = sp.array(xs, dtype=sp.float64, requires_grad=True, device=device)
    out = sp.zeros(2, dtype=sp.float64, requires_grad=True, device=device)
    backward_ones(first_crossing, 2, [x, 4, 1.0], out)
    # thread 0 crosses at k = 2: out = (x0^2 + x1^2 + x2^2) x2; thread 1 never does: out = -sum x^2
    s0 = xs[0] ** 2 + xs[1] ** 2 + xs[2] ** 2
    np.testing.assert_allclose(out.numpy(), [s0 * xs[2], -np.sum(xs[4:] ** 2)], rtol=1e-15)
    expected = np.concatenate([[2 * xs[0] * xs[2], 2 * xs[1] * xs[2], 2 * xs[2] ** 2 + s0, 0.0], -2 * xs[4:]])
    np.testing.assert_allclose(x.grad.numpy(), expected, rtol=1e-15)


@sp.kernel
def while_with_inner_loop(x: sp.array(dtype=sp.float64), limit: sp.float64, out: sp.array(dtype=sp.float64)):
    t = sp.tid()
    v = x[t]
    rounds = int(0)
    while v < limit:
        rounds += 1
        for k in range(rounds):                    # the inner trip count is carried by the outer loop
            v = v * 1.1 + 0.01 * sp.float64(k)
    out[t] = v


def test_while_loop_whose_inner_trip_count_is_carried(device):
    x = sp.array([0.05, 0.3, 1.2, 3.0], dtype=sp.float64, requires_grad=True, device=device)
    out = sp.zeros(4, dtype=sp.float64, requires_grad=True, device=device)
    backward_ones(while_with_inner_loop, 4, [x, 2.0], out)
    multiplications = []
    for v in x.numpy():                             # v_final = 1.1^m v0 + const: gradient 1.1^m
        rounds = m = 0
        while v < 2.0:
            rounds += 1
            for k in range(rounds):
                v, m = v * 1.1 + 0.01 * k, m + 1
        multiplications.append(m)
    assert multiplications[0] > 20 and multiplications[-1] == 0
    np.testing.assert_allclose(x.grad.numpy(), 1.1 ** np.array(multiplications), rtol=1e-14)


# -- scale ---------------------------------------------------------------------------------------------
@sp.kernel
def ragged(x: sp.array(dtype=sp.float64), c: sp.array(dtype=sp.float64), period: int,
           out: sp.array(dtype=sp.float64)):
    i = sp.tid()
    s = x[i]
    for k in range(i % period):
        s = sp.sin(s) * c[i] + x[i]
    out[i] = s


def test_trip_counts_that_differ_per_thread(device):
    n = 4096
    rng = np.random.default_rng(3)
    xs, cs = rng.uniform(-1, 1, n), rng.uniform(0.5, 1.5, n)
    x = sp.array(xs, dtype=sp.float64, requires_grad=True, device=device)
    c = sp.array(cs, dtype=sp.float64, requires_grad=True, device=device)
    out = sp.zeros(n, dtype=sp.float64, requires_grad=True, device=device)
    backward_ones(ragged, n, [x, c, 97], out)
    trips = np.arange(n) % 97
    s, ds_dx, ds_dc = xs.copy(), np.ones(n), np.zeros(n)       # float64 forward mode, all threads at once
    for k in range(97):
        live = k < trips
        s_new = np.sin(s) * cs + xs
        ds_dx_new = np.cos(s) * ds_dx * cs + 1.0
        ds_dc_new = np.cos(s) * ds_dc * cs + np.sin(s)
        s = np.where(live, s_new, s)
        ds_dx = np.where(live, ds_dx_new, ds_dx)
        ds_dc = np.where(live, ds_dc_new, ds_dc)
    np.testing.assert_allclose(out.numpy(), s, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(x.grad.numpy(), ds_dx, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(c.grad.numpy(), ds_dc, rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(autograd.loop_tape_words(ragged, n, [x, c, 97], [out]), trips)


@sp.kernel
def compound(rate: sp.array(dtype=sp.float64), n: int, out: sp.array(dtype=sp.float64)):
    p = sp.float64(1.0)
    for k in range(n):
        p = p * (1.0 + rate[0])
    out[0] = p


def test_one_thread_running_a_million_iterations(device):
    n, r = 1_000_000, 1e-7
    rate = sp.array([r], dtype=sp.float64, requires_grad=True, device=device)
    out = sp.zeros(1, dtype=sp.float64, requires_grad=True, device=device)
    backward_ones(compound, 1, [rate, n], out)
    np.testing.assert_allclose(out.numpy(), [(1 + r) ** n], rtol=1e-9)
    np.testing.assert_allclose(rate.grad.numpy(), [n * (1 + r) ** (n - 1)], rtol=1e-9)
    np.testing.assert_array_equal(autograd.loop_tape_words(compound, 1, [rate, n], [out]), [n])


@sp.kernel
def product_of_1000(x: sp.array(dtype=sp.float64), out: sp.array(dtype=sp.float64)):
    p = sp.float64(1.0)
    for k in range(1000):
        p = p * x[k]
    out[0] = p


def test_a_constant_range_too_long_to_unroll(device):
    xs = 1.0 + np.random.default_rng(4).uniform(-1e-3, 1e-3, 1000)
    x = sp.array(xs, dtype=sp.float64, requires_grad=True, device=device)
    out = sp.zeros(1, dtype=sp.float64, requires_grad=True, device=device)
    backward_ones(product_of_1000, 1, [x], out)
    np.testing.assert_allclose(out.numpy(), [np.prod(xs)], rtol=1e-13)
    np.testing.assert_allclose(x.grad.numpy(), np.prod(xs) / xs, rtol=1e-12)
    # a real loop, not 1000 unrolled copies: its carried product goes on the loop tape
    np.testing.assert_array_equal(autograd.loop_tape_words(product_of_1000, 1, [x], [out]), [1000])


# -- what the loop tape holds ----------------------------------------------------------------------------
@sp.kernel
def linear_sum(x: sp.array(dtype=float), n: int, out: sp.array(dtype=float)):
    s = float(0.0)
    for k in range(n):
        s += x[k]
    out[0] = s


@sp.kernel
def two_carried(x: sp.array(dtype=float), n: int, out: sp.array(dtype=float)):
    a = float(1.0)
    b = float(0.0)
    for k in range(n):
        b = b + a * x[k]
        a = a * 0.5
    out[0] = b


def test_linear_accumulation_needs_no_tape_and_nonlinear_values_do(device):
    assert not linear_sum.compiled().needs_tape
    assert prod_loop.compiled().needs_tape
    x = sp.array(np.arange(1.0, 6.0, dtype=np.float32), requires_grad=True, device=device)
    out = sp.zeros(1, requires_grad=True, device=device)
    np.testing.assert_array_equal(autograd.loop_tape_words(linear_sum, 1, [x, 5], [out]), [0])
    backward_ones(linear_sum, 1, [x, 5], out)
    np.testing.assert_array_equal(x.grad.numpy(), np.ones(5))
    # the product saves one word (its float32 value) per iteration and thread, sized per launch
    np.testing.assert_array_equal(autograd.loop_tape_words(prod_loop, 3, [x, 5], [out]), [5, 5, 5])
    np.testing.assert_array_equal(autograd.loop_tape_words(prod_loop, 2, [x, 2], [out]), [2, 2])
    # b is a linear accumulator but reads a, which the next iteration rescales: only a is saved
    assert two_carried.compiled().needs_tape
    np.testing.assert_array_equal(autograd.loop_tape_words(two_carried, 1, [x, 4], [out]), [4])
    x.grad.zero_()
    backward_ones(two_carried, 1, [x, 4], sp.zeros(1, requires_grad=True, device=device))
    np.testing.assert_array_equal(x.grad.numpy(), [1.0, 0.5, 0.25, 0.125, 0.0])


def test_a_loop_tape_that_cannot_be_allocated_is_an_error_naming_kernel_line_and_size(monkeypatch):
    import sys
    launch_module = sys.modules["compiler.runtime.launch"]
    x = sp.array(np.full(8, 1.01, np.float32), requires_grad=True)
    out = sp.zeros(1, requires_grad=True)
    tape = sp.Tape()
    with tape:
        sp.launch(prod_loop, 1, inputs=[x, 8], outputs=[out])

    def no_memory(*args, **kwargs):
        raise MemoryError
    monkeypatch.setattr(launch_module.np, "empty", no_memory)
    with pytest.raises(MemoryError, match=r"test_dynamic_loops.py:\d+.*prod_loop.*MiB"):
        tape.backward(grads={out: np.ones(1, np.float32)})
