"""Vector and matrix builtins forward against NumPy (their adjoints: test_builtin_adjoints.py)."""
import numpy as np
import pytest

import compiler as sp
from test_builtins import (mat22d, mat33d, mat44d, vec3d)


# ---- vectors and matrices ---------------------------------------------------------------------------
@sp.kernel
def vector_ops(a_: sp.array(dtype=vec3d), b_: sp.array(dtype=vec3d), s_: sp.array(dtype=sp.float64),
               m_: sp.array(dtype=mat33d), n_: sp.array(dtype=mat33d),
               os: sp.array(dtype=sp.float64, ndim=2), ov: sp.array(dtype=vec3d, ndim=2),
               om: sp.array(dtype=mat33d, ndim=2)):
    i = sp.tid()
    a = a_[i]
    b = b_[i]
    s = s_[i]
    m = m_[i]
    n = n_[i]
    os[i, 0] = sp.dot(a, b)
    os[i, 1] = sp.length(a)
    os[i, 2] = sp.length_sq(a)
    os[i, 3] = a.x + 10.0 * a.y + 100.0 * a.z
    os[i, 4] = a[1]
    os[i, 5] = sp.determinant(m)
    os[i, 6] = m[1, 2]
    os[i, 7] = m[2][0]
    ov[i, 0] = sp.cross(a, b)
    ov[i, 1] = sp.normalize(a)
    ov[i, 2] = a + b
    ov[i, 3] = a - b
    ov[i, 4] = s * a
    ov[i, 5] = a * s
    ov[i, 6] = a / s
    ov[i, 7] = sp.cw_mul(a, b)
    ov[i, 8] = sp.cw_div(a, b)
    ov[i, 9] = -a
    ov[i, 10] = m @ a
    ov[i, 11] = m * a
    ov[i, 12] = a @ m
    w = a
    w[1] = s                       # element writes stay differentiable
    w.z = w.x * s
    ov[i, 13] = w
    ov[i, 14] = vec3d(a.z, s, 2.0)
    ov[i, 15] = vec3d(s) + vec3d(0.0) + vec3d()
    ov[i, 16] = 2.0 * a + a * 0.5
    ov[i, 17] = m[1]
    ov[i, 18] = sp.abs(a)
    om[i, 0] = sp.outer(a, b)
    om[i, 1] = sp.transpose(m)
    om[i, 2] = m @ n
    om[i, 3] = m * n
    om[i, 4] = sp.inverse(m)
    om[i, 5] = s * m + n * 2.0
    om[i, 6] = m - n
    r = m
    r[0, 2] = s
    r[2] = a
    om[i, 7] = r
    om[i, 8] = mat33d(a, b, a)
    om[i, 9] = mat33d(1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, s)
    om[i, 10] = mat33d(s)
    om[i, 11] = m / s


def _vec_refs():
    mv = lambda m, v: np.einsum("nij,nj->ni", m, v)
    col = lambda v: v[:, None]

    def write_elements(a, s):
        w = a.copy()
        w[:, 1] = s
        w[:, 2] = w[:, 0] * s
        return w

    def write_matrix(m, s, a):
        r = m.copy()
        r[:, 0, 2] = s
        r[:, 2] = a
        return r

    def fixed(s):
        out = np.tile(np.arange(1.0, 10.0).reshape(3, 3), (len(s), 1, 1))
        out[:, 2, 2] = s
        return out

    scalars = {
        0: lambda a, b, s, m, n: np.sum(a * b, axis=1),
        1: lambda a, b, s, m, n: np.linalg.norm(a, axis=1),
        2: lambda a, b, s, m, n: np.sum(a * a, axis=1),
        3: lambda a, b, s, m, n: a[:, 0] + 10 * a[:, 1] + 100 * a[:, 2],
        4: lambda a, b, s, m, n: a[:, 1],
        5: lambda a, b, s, m, n: np.linalg.det(m),
        6: lambda a, b, s, m, n: m[:, 1, 2],
        7: lambda a, b, s, m, n: m[:, 2, 0],
    }
    vectors = {
        0: lambda a, b, s, m, n: np.cross(a, b),
        1: lambda a, b, s, m, n: a / np.linalg.norm(a, axis=1)[:, None],
        2: lambda a, b, s, m, n: a + b,
        3: lambda a, b, s, m, n: a - b,
        4: lambda a, b, s, m, n: col(s) * a,
        5: lambda a, b, s, m, n: a * col(s),
        6: lambda a, b, s, m, n: a / col(s),
        7: lambda a, b, s, m, n: a * b,
        8: lambda a, b, s, m, n: a / b,
        9: lambda a, b, s, m, n: -a,
        10: lambda a, b, s, m, n: mv(m, a),
        11: lambda a, b, s, m, n: mv(m, a),
        12: lambda a, b, s, m, n: np.einsum("ni,nij->nj", a, m),
        13: lambda a, b, s, m, n: write_elements(a, s),
        14: lambda a, b, s, m, n: np.stack([a[:, 2], s, np.full_like(s, 2.0)], axis=1),
        15: lambda a, b, s, m, n: np.repeat(col(s), 3, axis=1),
        16: lambda a, b, s, m, n: 2 * a + a * 0.5,
        17: lambda a, b, s, m, n: m[:, 1],
        18: lambda a, b, s, m, n: np.abs(a),
    }
    matrices = {
        0: lambda a, b, s, m, n: np.einsum("ni,nj->nij", a, b),
        1: lambda a, b, s, m, n: np.transpose(m, (0, 2, 1)),
        2: lambda a, b, s, m, n: m @ n,
        3: lambda a, b, s, m, n: m @ n,
        4: lambda a, b, s, m, n: np.linalg.inv(m),
        5: lambda a, b, s, m, n: s[:, None, None] * m + n * 2,
        6: lambda a, b, s, m, n: m - n,
        7: lambda a, b, s, m, n: write_matrix(m, s, a),
        8: lambda a, b, s, m, n: np.stack([a, b, a], axis=1),
        9: lambda a, b, s, m, n: fixed(s),
        10: lambda a, b, s, m, n: np.broadcast_to(s[:, None, None], m.shape),
        11: lambda a, b, s, m, n: m / s[:, None, None],
    }
    return scalars, vectors, matrices


VEC_SCALARS, VEC_VECTORS, VEC_MATRICES = _vec_refs()
VEC_CASES = ([("os", c) for c in VEC_SCALARS] + [("ov", c) for c in VEC_VECTORS] + [("om", c) for c in VEC_MATRICES])
EXACT_VEC = {("os", 3), ("os", 4), ("os", 6), ("os", 7), ("ov", 2), ("ov", 3), ("ov", 4), ("ov", 5), ("ov", 7),
             ("ov", 9), ("ov", 13), ("ov", 14), ("ov", 15), ("ov", 17), ("ov", 18), ("om", 0), ("om", 1),
             ("om", 6), ("om", 7), ("om", 8), ("om", 9), ("om", 10)}


def vector_inputs(n, seed):
    rng = np.random.default_rng(seed)
    a = rng.uniform(-1, 1, (n, 3))
    b = rng.uniform(0.5, 1.5, (n, 3)) * rng.choice([-1, 1], (n, 3))
    s = rng.uniform(0.5, 2.0, n) * rng.choice([-1, 1], n)
    m = np.eye(3) * 2 + rng.uniform(-0.5, 0.5, (n, 3, 3))
    nn = rng.uniform(-1, 1, (n, 3, 3))
    return a, b, s, m, nn


def vector_outputs(n, requires_grad=False, device="cpu"):
    return [sp.zeros((n, len(VEC_SCALARS)), dtype=sp.float64, requires_grad=requires_grad, device=device),
            sp.zeros((n, len(VEC_VECTORS)), dtype=vec3d, requires_grad=requires_grad, device=device),
            sp.zeros((n, len(VEC_MATRICES)), dtype=mat33d, requires_grad=requires_grad, device=device)]


def vector_arrays(values, requires_grad=False, device="cpu"):
    a, b, s, m, n = values
    dtypes = (vec3d, vec3d, sp.float64, mat33d, mat33d)
    return [sp.array(v, dtype=t, requires_grad=requires_grad, device=device) for v, t in zip((a, b, s, m, n), dtypes)]


@pytest.fixture(scope="module")
def vector_results(device):
    values = vector_inputs(6, seed=1)
    outs = vector_outputs(6, device=device)
    sp.launch(vector_ops, 6, inputs=vector_arrays(values, device=device), outputs=outs)
    return values, {"os": outs[0].numpy(), "ov": outs[1].numpy(), "om": outs[2].numpy()}


@pytest.mark.parametrize("group, col", VEC_CASES, ids=[f"{g}{c}" for g, c in VEC_CASES])
def test_vector_matrix_forward(vector_results, group, col):
    values, outs = vector_results
    ref = {"os": VEC_SCALARS, "ov": VEC_VECTORS, "om": VEC_MATRICES}[group][col]
    got, expected = outs[group][:, col], ref(*values)
    if (group, col) in EXACT_VEC:
        np.testing.assert_array_equal(got, expected)
    else:
        np.testing.assert_allclose(got, expected, rtol=1e-13, atol=1e-14)


@sp.kernel
def small_matrices(m2: sp.array(dtype=mat22d), m4: sp.array(dtype=mat44d), det: sp.array(dtype=sp.float64, ndim=2),
                   o2: sp.array(dtype=mat22d, ndim=2), o4: sp.array(dtype=mat44d, ndim=2)):
    i = sp.tid()
    a = m2[i]
    b = m4[i]
    det[i, 0] = sp.determinant(a)
    det[i, 1] = sp.determinant(b)
    o2[i, 0] = sp.inverse(a)
    o2[i, 1] = sp.transpose(a) @ a
    o4[i, 0] = b @ b
    o4[i, 1] = sp.transpose(b)


def test_determinant_and_inverse_2x2_4x4(device):
    rng = np.random.default_rng(2)
    a = np.eye(2) + rng.uniform(-0.5, 0.5, (5, 2, 2))
    b = np.eye(4) * 2 + rng.uniform(-0.5, 0.5, (5, 4, 4))
    det = sp.zeros((5, 2), dtype=sp.float64, device=device)
    o2 = sp.zeros((5, 2), dtype=mat22d, device=device)
    o4 = sp.zeros((5, 2), dtype=mat44d, device=device)
    sp.launch(small_matrices, 5, inputs=[sp.array(a, dtype=mat22d, device=device), sp.array(b, dtype=mat44d, device=device)],
              outputs=[det, o2, o4])
    np.testing.assert_allclose(det.numpy()[:, 0], np.linalg.det(a), rtol=1e-14)
    np.testing.assert_allclose(det.numpy()[:, 1], np.linalg.det(b), rtol=1e-13)
    np.testing.assert_allclose(o2.numpy()[:, 0], np.linalg.inv(a), rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(o2.numpy()[:, 1], np.transpose(a, (0, 2, 1)) @ a, rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(o4.numpy()[:, 0], b @ b, rtol=1e-14, atol=1e-15)
    np.testing.assert_array_equal(o4.numpy()[:, 1], np.transpose(b, (0, 2, 1)))


@sp.kernel
def vec3_float32(x: sp.array(dtype=float), out: sp.array(dtype=sp.vec3, ndim=2), m: sp.array(dtype=sp.mat33)):
    i = sp.tid()
    s = x[i]
    out[i, 0] = sp.vec3(0.0)
    out[i, 1] = sp.vec3()
    out[i, 2] = sp.vec3(s, 2.0, -s)
    out[i, 3] = sp.normalize(sp.vec3(s, 2.0, -s)) * 0.5
    out[i, 4] = sp.cross(sp.vec3(1.0, 0.0, 0.0), sp.vec3(0.0, s, 0.0))
    m[i] = sp.mat33(s) + sp.mat33()


def test_vec3_float32_constructors(device):
    x = np.array([0.5, -1.0, 3.0], np.float32)
    out = sp.zeros((3, 5), dtype=sp.vec3, device=device)
    m = sp.zeros(3, dtype=sp.mat33, device=device)
    sp.launch(vec3_float32, 3, inputs=[sp.array(x, device=device)], outputs=[out, m])
    o = out.numpy()
    np.testing.assert_array_equal(o[:, 0], 0)
    np.testing.assert_array_equal(o[:, 1], 0)
    np.testing.assert_array_equal(o[:, 2], np.stack([x, np.full(3, 2, np.float32), -x], 1))
    v = np.stack([x, np.full(3, 2), -x], 1).astype(np.float64)
    np.testing.assert_allclose(o[:, 3], 0.5 * v / np.linalg.norm(v, axis=1)[:, None], rtol=1e-6)
    np.testing.assert_array_equal(o[:, 4], np.stack([0 * x, 0 * x, x], 1))
    np.testing.assert_array_equal(m.numpy(), np.broadcast_to(x[:, None, None], (3, 3, 3)))
    assert out.numpy().dtype == np.float32


@sp.kernel
def inline_types(x: sp.array(dtype=sp.float64), v: sp.array(dtype=sp.vector(3, sp.float64)),
                 m: sp.array(dtype=sp.matrix((2, 2), sp.float64))):
    i = sp.tid()
    s = x[i]
    v[i] = sp.vector(3, sp.float64)(s, 2.0, -s) + sp.vector(3, sp.float64)()
    m[i] = sp.matrix((2, 2), sp.float64)(s) + mat22d(1.0, 2.0, 3.0, 4.0)


def test_vector_and_matrix_type_constructors_inside_kernels(device):
    x = np.array([0.5, -2.0])
    v = sp.zeros(2, dtype=vec3d, device=device)
    m = sp.zeros(2, dtype=mat22d, device=device)
    sp.launch(inline_types, 2, inputs=[sp.array(x, device=device)], outputs=[v, m])
    np.testing.assert_array_equal(v.numpy(), [[0.5, 2.0, -0.5], [-2.0, 2.0, 2.0]])
    np.testing.assert_array_equal(m.numpy(), x[:, None, None] + np.array([[1.0, 2.0], [3.0, 4.0]]))


@sp.kernel
def literal_expressions(c: sp.array(dtype=int), out: sp.array(dtype=sp.float64, ndim=2)):
    i = sp.tid()
    out[i, 0] = 2.0 * 0.1
    out[i, 1] = 1.0 if c[i] > 0 else 2.0
    out[i, 2] = sp.select(c[i] > 0, -1.0, 1.0)


def test_expressions_of_literals_stay_weakly_typed(device):
    out = sp.zeros((2, 3), dtype=sp.float64, device=device)
    sp.launch(literal_expressions, 2, inputs=[sp.array(np.array([1, 0], np.int32), device=device)], outputs=[out])
    np.testing.assert_array_equal(out.numpy(), [[2.0 * 0.1, 1.0, 1.0], [2.0 * 0.1, 2.0, -1.0]])
