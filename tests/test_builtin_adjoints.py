"""Every differentiable builtin's adjoint against float64 central finite differences (the
forward kernels and their NumPy references live in test_builtins.py)."""
import numpy as np
import pytest

import compiler as sp
from test_builtins import (BIG, BINARY, UNARY, binary64, mat22d, mat44d, unary64, vec3d)
from test_builtin_vectors import (VEC_CASES, small_matrices, vector_arrays, vector_inputs, vector_ops, vector_outputs)


# ---- gradients against float64 central finite differences ------------------------------------------
def tape_and_fd_gradients(kernel, dim, inputs, outputs, seeds, eps=1e-6):
    """d(sum(seed * output)) / d(input) for every float64 input array with requires_grad, twice: from
    the Tape and from central differences of relaunched forwards (inputs perturbed in place, through
    `assign` of a perturbed host copy, so that this works on every device)."""
    initial = [o.numpy().copy() for o in outputs]
    wrt = [a for a in inputs if isinstance(a, sp.array) and a.requires_grad]
    for a in wrt + list(outputs):
        if a.requires_grad:
            a.grad.zero_()
    tape = sp.Tape()
    with tape:
        sp.launch(kernel, dim, inputs=inputs, outputs=outputs)
    tape.backward(grads={o: s for o, s in zip(outputs, seeds)})
    analytic = [a.grad.numpy().copy() for a in wrt]

    def loss():
        for o, v in zip(outputs, initial):
            o.assign(v)
        sp.launch(kernel, dim, inputs=inputs, outputs=outputs)
        return sum(float(np.sum(o.numpy() * s)) for o, s in zip(outputs, seeds))

    numeric = []
    for a in wrt:
        values = a.numpy()
        flat = values.reshape(-1)
        g = np.zeros_like(flat)
        for k in range(flat.size):
            x0 = flat[k]
            flat[k] = x0 + eps
            a.assign(values)
            up = loss()
            flat[k] = x0 - eps
            a.assign(values)
            down = loss()
            flat[k] = x0
            a.assign(values)
            g[k] = (up - down) / (2 * eps)
        numeric.append(g.reshape(values.shape))
    loss()
    return analytic, numeric


def assert_gradients_match(analytic, numeric, rtol=1e-6, atol=1e-8):
    for k, (a, n) in enumerate(zip(analytic, numeric)):
        np.testing.assert_allclose(a, n, rtol=rtol, atol=atol, err_msg=f"input {k}")


def column_seed(shape, col, rng):
    seed = np.zeros(shape)
    seed[:, col] = rng.standard_normal(seed[:, col].shape)
    return seed


GRAD_N = 6


def grad_scalar_inputs(seed):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1.2, 1.2, GRAD_N)
    x[np.abs(x - np.round(x)) < 0.1] += 0.2          # away from the kinks of round/floor/ceil/abs/sign
    y = rng.uniform(0.3, 1.5, GRAD_N) * rng.choice([-1, 1], GRAD_N)
    p = rng.uniform(0.1, 0.9, GRAD_N)
    return x, y, p


@pytest.mark.parametrize("col", sorted(UNARY), ids=[UNARY[c][0] for c in sorted(UNARY)])
def test_unary_adjoint(col, device):
    x, _, p = grad_scalar_inputs(3)
    xs, ps = sp.array(x, requires_grad=True, device=device), sp.array(p, requires_grad=True, device=device)
    out = sp.zeros((GRAD_N, len(UNARY)), dtype=sp.float64, requires_grad=True, device=device)
    seed = column_seed(out.numpy().shape, col, np.random.default_rng(col))
    assert_gradients_match(*tape_and_fd_gradients(unary64, GRAD_N, [xs, ps], [out], [seed]))


@pytest.mark.parametrize("col", sorted(BINARY), ids=[BINARY[c][0] for c in sorted(BINARY)])
def test_binary_adjoint(col, device):
    x, y, p = grad_scalar_inputs(4)
    ins = [sp.array(v, requires_grad=True, device=device) for v in (x, y, p)]
    out = sp.zeros((GRAD_N, len(BINARY)), dtype=sp.float64, requires_grad=True, device=device)
    seed = column_seed(out.numpy().shape, col, np.random.default_rng(col))
    assert_gradients_match(*tape_and_fd_gradients(binary64, GRAD_N, ins, [out], [seed]))


def test_known_adjoints_exactly(device):
    """A few gradients with closed forms, to pin the rules themselves (not only their agreement with FD)."""
    x, y, p = grad_scalar_inputs(5)
    ins = [sp.array(v, requires_grad=True, device=device) for v in (x, y, p)]
    out = sp.zeros((GRAD_N, len(BINARY)), dtype=sp.float64, requires_grad=True, device=device)
    seed = np.zeros(out.numpy().shape)
    seed[:, 13] = 1.0                                # a % b: d/da = 1, d/db = -(a // b)
    (ga, gb, gp), _ = tape_and_fd_gradients(binary64, GRAD_N, ins, [out], [seed])
    np.testing.assert_array_equal(ga, np.ones(GRAD_N))
    np.testing.assert_array_equal(gb, -np.floor_divide(x, y))
    np.testing.assert_array_equal(gp, np.zeros(GRAD_N))


VEC_GRAD_N = 3


@pytest.mark.parametrize("group, col", VEC_CASES, ids=[f"{g}{c}" for g, c in VEC_CASES])
def test_vector_matrix_adjoint(group, col, device):
    ins = vector_arrays(vector_inputs(VEC_GRAD_N, seed=7), requires_grad=True, device=device)
    outs = vector_outputs(VEC_GRAD_N, requires_grad=True, device=device)
    rng = np.random.default_rng(col)
    seeds = [column_seed(o.numpy().shape, col, rng) if name == group else np.zeros(o.numpy().shape)
             for name, o in zip(("os", "ov", "om"), outs)]
    assert_gradients_match(*tape_and_fd_gradients(vector_ops, VEC_GRAD_N, ins, outs, seeds))


def test_small_matrix_adjoint(device):
    rng = np.random.default_rng(8)
    a = sp.array(np.eye(2) + rng.uniform(-0.5, 0.5, (3, 2, 2)), dtype=mat22d, requires_grad=True, device=device)
    b = sp.array(np.eye(4) * 2 + rng.uniform(-0.5, 0.5, (3, 4, 4)), dtype=mat44d, requires_grad=True, device=device)
    outs = [sp.zeros((3, 2), dtype=t, requires_grad=True, device=device) for t in (sp.float64, mat22d, mat44d)]
    seeds = [rng.standard_normal(o.numpy().shape) for o in outs]
    assert_gradients_match(*tape_and_fd_gradients(small_matrices, 3, [a, b], outs, seeds))


@sp.kernel
def vector_min_max_clamp(a: sp.array(dtype=vec3d), b: sp.array(dtype=vec3d), c: sp.array(dtype=vec3d),
                         out: sp.array(dtype=vec3d, ndim=2)):
    i = sp.tid()
    out[i, 0] = sp.min(a[i], b[i])
    out[i, 1] = sp.max(a[i], b[i])
    out[i, 2] = sp.clamp(a[i], b[i], c[i])


def test_vector_min_max_clamp_forward_and_adjoint(device):
    rng = np.random.default_rng(11)
    lo = rng.uniform(-1, 0, (4, 3))
    a, b, c = rng.uniform(-1.5, 1.5, (4, 3)), lo, lo + rng.uniform(0.5, 1.5, (4, 3))
    ins = [sp.array(v, dtype=vec3d, requires_grad=True, device=device) for v in (a, b, c)]
    out = sp.zeros((4, 3), dtype=vec3d, requires_grad=True, device=device)
    sp.launch(vector_min_max_clamp, 4, inputs=ins, outputs=[out])
    np.testing.assert_array_equal(out.numpy()[:, 0], np.minimum(a, b))
    np.testing.assert_array_equal(out.numpy()[:, 1], np.maximum(a, b))
    np.testing.assert_array_equal(out.numpy()[:, 2], np.clip(a, b, c))
    seed = rng.standard_normal((4, 3, 3))
    assert_gradients_match(*tape_and_fd_gradients(vector_min_max_clamp, 4, ins, [out], [seed]))


# ---- atomics, stores and accumulation ---------------------------------------------------------------
@sp.kernel
def atomic_grads(x: sp.array(dtype=sp.float64), acc: sp.array(dtype=sp.float64)):
    i = sp.tid()
    v = x[i]
    sp.atomic_add(acc, 0, v * v)
    sp.atomic_sub(acc, 1, sp.sin(v))
    sp.atomic_min(acc, 2, v)
    sp.atomic_max(acc, 3, 2.0 * v)


def test_atomic_adjoints(device):
    rng = np.random.default_rng(9)
    x = sp.array(rng.uniform(-1, 1, 8), requires_grad=True, device=device)
    acc = sp.array(np.array([0.5, 0.25, 10.0, -10.0]), requires_grad=True, device=device)
    seed = rng.standard_normal(4)
    (g,), (fd,) = tape_and_fd_gradients(atomic_grads, 8, [x], [acc], [seed])
    assert_gradients_match([g], [fd])
    xv = x.numpy()
    expected = seed[0] * 2 * xv - seed[1] * np.cos(xv)
    expected[np.argmin(xv)] += seed[2]
    expected[np.argmax(xv)] += 2 * seed[3]
    # cos is not correctly rounded on every target (CUDA's double cos: 2 ulp), so the bound is a few
    # ulp of the terms added, not of their (sometimes cancelling) sum
    terms = np.abs(seed[0] * 2 * xv) + np.abs(seed[1]) + np.abs(seed[2]) + 2 * np.abs(seed[3])
    np.testing.assert_allclose(g, expected, rtol=0, atol=4 * np.finfo(np.float64).eps * terms.max())
    np.testing.assert_array_equal(acc.grad.numpy(), seed)      # accumulation passes the seed through


@sp.kernel
def atomic_old_values(acc: sp.array(dtype=sp.float64), iacc: sp.array(dtype=int), lacc: sp.array(dtype=sp.int64),
                      old: sp.array(dtype=sp.float64), iold: sp.array(dtype=int), lold: sp.array(dtype=sp.int64)):
    old[0] = sp.atomic_add(acc, 0, 1.5)
    old[1] = sp.atomic_add(acc, 0, 1.0)
    old[2] = sp.atomic_sub(acc, 0, 0.5)
    old[3] = sp.atomic_min(acc, 1, 3.0)
    old[4] = sp.atomic_min(acc, 1, 4.0)
    old[5] = sp.atomic_max(acc, 2, -3.0)
    old[6] = sp.atomic_max(acc, 2, -4.0)
    iold[0] = sp.atomic_add(iacc, 0, 5)
    iold[1] = sp.atomic_sub(iacc, 0, 7)
    iold[2] = sp.atomic_min(iacc, 1, -2)
    iold[3] = sp.atomic_max(iacc, 2, 9)
    iold[4] = sp.atomic_max(iacc, 2, 4)
    lold[0] = sp.atomic_add(lacc, 0, BIG)
    lold[1] = sp.atomic_min(lacc, 1, -BIG)
    lold[2] = sp.atomic_max(lacc, 1, 0)


def test_atomics_return_the_old_value(device):
    acc = sp.array(np.array([1.0, 5.0, -5.0]), device=device)
    iacc = sp.array(np.array([1, 0, 3], np.int32), device=device)
    lacc = sp.array(np.array([1, 5], np.int64), device=device)
    old = sp.zeros(7, dtype=sp.float64, device=device)
    iold = sp.zeros(5, dtype=int, device=device)
    lold = sp.zeros(3, dtype=sp.int64, device=device)
    sp.launch(atomic_old_values, 1, inputs=[acc, iacc, lacc], outputs=[old, iold, lold])
    assert old.numpy().tolist() == [1.0, 2.5, 3.5, 5.0, 3.0, -5.0, -3.0]
    assert acc.numpy().tolist() == [3.0, 3.0, -3.0]
    assert iold.numpy().tolist() == [1, 6, 0, 3, 9]
    assert iacc.numpy().tolist() == [-1, -2, 9]
    assert lold.numpy().tolist() == [1, 5, -(2 ** 40)]
    assert lacc.numpy().tolist() == [1 + 2 ** 40, 0]


@sp.kernel
def stores_and_accumulation(x: sp.array(dtype=sp.float64), y: sp.array(dtype=sp.float64),
                            shared: sp.array(dtype=sp.float64), vs: sp.array(dtype=vec3d)):
    i = sp.tid()
    v = x[i]
    y[i] = v * v * v
    shared[i % 2] += 2.0 * v
    shared[2] -= v * v
    vs[i % 3] += vec3d(v, sp.exp(v), 1.0)


def test_store_and_plus_equals_adjoints(device):
    rng = np.random.default_rng(10)
    x = sp.array(rng.uniform(-1, 1, 7), requires_grad=True, device=device)
    y = sp.zeros(7, dtype=sp.float64, requires_grad=True, device=device)
    shared = sp.array(np.array([1.0, 2.0, 3.0]), requires_grad=True, device=device)
    vs = sp.zeros(3, dtype=vec3d, requires_grad=True, device=device)
    seeds = [rng.standard_normal(7), rng.standard_normal(3), rng.standard_normal((3, 3))]
    (g,), (fd,) = tape_and_fd_gradients(stores_and_accumulation, 7, [x], [y, shared, vs], seeds)
    assert_gradients_match([g], [fd])
    xv = x.numpy()
    expected = (seeds[0] * 3 * xv ** 2 + 2 * seeds[1][np.arange(7) % 2] - 2 * seeds[1][2] * xv
                + seeds[2][np.arange(7) % 3, 0] + seeds[2][np.arange(7) % 3, 1] * np.exp(xv))
    np.testing.assert_allclose(g, expected, rtol=1e-14)
    np.testing.assert_allclose(shared.numpy(), [1.0, 2.0, 3.0] + np.array(
        [2 * xv[0::2].sum(), 2 * xv[1::2].sum(), -(xv ** 2).sum()]), rtol=1e-14)
