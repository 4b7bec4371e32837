"""Every builtin, forward against NumPy and backward against float64 central finite differences.

Kernels of one Python module build together, so this file defines a few kernels that each compute
many builtins, one output column per builtin; the tests are parametrized over the columns. The
same `@func` bodies run in float64 (tight comparisons) and float32 (float32 tolerances).
"""
import math

import numpy as np
import pytest

import compiler as sp

f64 = sp.float64
vec3d = sp.vector(3, sp.float64)
mat22d = sp.matrix((2, 2), sp.float64)
mat33d = sp.matrix((3, 3), sp.float64)
mat44d = sp.matrix((4, 4), sp.float64)

SCALE = 2.5            # module-level constants kernels capture
OFFSET = 3
TENTH = np.float64(0.1)
BIG = 2 ** 40          # an int64 constant


# ---- scalar builtins: one column per builtin --------------------------------------------------------
@sp.func
def scalar_unary(x, p, out, i):
    v = x[i]        # any real
    q = p[i]        # in (0, 1]
    out[i, 0] = sp.sin(v)
    out[i, 1] = sp.cos(v)
    out[i, 2] = sp.tan(v)
    out[i, 3] = sp.asin(q)
    out[i, 4] = sp.acos(q)
    out[i, 5] = sp.atan(v)
    out[i, 6] = sp.sinh(v)
    out[i, 7] = sp.cosh(v)
    out[i, 8] = sp.tanh(v)
    out[i, 9] = sp.exp(v)
    out[i, 10] = sp.log(q)
    out[i, 11] = sp.log2(q)
    out[i, 12] = sp.log10(q)
    out[i, 13] = sp.sqrt(q)
    out[i, 14] = sp.abs(v)
    out[i, 15] = sp.sign(v)
    out[i, 16] = sp.floor(v)
    out[i, 17] = sp.ceil(v)
    out[i, 18] = sp.round(v)
    out[i, 19] = -v
    out[i, 20] = abs(v)
    out[i, 21] = round(v)
    out[i, 22] = v * SCALE + OFFSET
    out[i, 23] = v * math.pi


UNARY = {   # column -> (name, NumPy reference of (x, p))
    0: ("sin", lambda x, p: np.sin(x)),
    1: ("cos", lambda x, p: np.cos(x)),
    2: ("tan", lambda x, p: np.tan(x)),
    3: ("asin", lambda x, p: np.arcsin(p)),
    4: ("acos", lambda x, p: np.arccos(p)),
    5: ("atan", lambda x, p: np.arctan(x)),
    6: ("sinh", lambda x, p: np.sinh(x)),
    7: ("cosh", lambda x, p: np.cosh(x)),
    8: ("tanh", lambda x, p: np.tanh(x)),
    9: ("exp", lambda x, p: np.exp(x)),
    10: ("log", lambda x, p: np.log(p)),
    11: ("log2", lambda x, p: np.log2(p)),
    12: ("log10", lambda x, p: np.log10(p)),
    13: ("sqrt", lambda x, p: np.sqrt(p)),
    14: ("abs", lambda x, p: np.abs(x)),
    15: ("sign", lambda x, p: np.sign(x)),
    16: ("floor", lambda x, p: np.floor(x)),
    17: ("ceil", lambda x, p: np.ceil(x)),
    18: ("round", lambda x, p: np.round(x)),          # half to even
    19: ("neg", lambda x, p: -x),
    20: ("python abs", lambda x, p: np.abs(x)),
    21: ("python round", lambda x, p: np.round(x)),
    22: ("module constants", lambda x, p: x * 2.5 + 3),
    23: ("math.pi", lambda x, p: x * math.pi),
}
EXACT_UNARY = {"abs", "sign", "floor", "ceil", "round", "neg", "python abs", "python round"}


@sp.kernel
def unary64(x: sp.array(dtype=sp.float64), p: sp.array(dtype=sp.float64), out: sp.array(dtype=sp.float64, ndim=2)):
    scalar_unary(x, p, out, sp.tid())


@sp.kernel
def unary32(x: sp.array(dtype=float), p: sp.array(dtype=float), out: sp.array(dtype=float, ndim=2)):
    scalar_unary(x, p, out, sp.tid())


@sp.func
def scalar_binary(x, y, p, out, i):
    a = x[i]        # any real
    b = y[i]        # nonzero
    q = p[i]        # positive
    out[i, 0] = sp.atan2(a, b)
    out[i, 1] = sp.pow(q, b)
    out[i, 2] = q ** b
    out[i, 3] = a ** 2.0
    out[i, 4] = sp.min(a, b)
    out[i, 5] = sp.max(a, b)
    out[i, 6] = sp.clamp(a, -1.0, 1.0)
    out[i, 7] = sp.clamp(a, -q, q)
    out[i, 8] = a + b
    out[i, 9] = a - b
    out[i, 10] = a * b
    out[i, 11] = a / b
    out[i, 12] = a // b
    out[i, 13] = a % b
    out[i, 14] = sp.where(a < b, a, b)
    out[i, 15] = sp.select(a < b, a, b)       # Warp's order: select(cond, value_if_false, value_if_true)
    out[i, 16] = a if a < b else b * 2.0
    out[i, 17] = min(a, b, q)
    out[i, 18] = max(a, b)
    out[i, 19] = 0.5 * a - 2.0 / b + 1.0
    out[i, 20] = pow(q, 2.0)


BINARY = {
    0: ("atan2", lambda a, b, q: np.arctan2(a, b)),
    1: ("pow", lambda a, b, q: q ** b),
    2: ("**", lambda a, b, q: q ** b),
    3: ("** 2", lambda a, b, q: a ** 2),
    4: ("min", lambda a, b, q: np.minimum(a, b)),
    5: ("max", lambda a, b, q: np.maximum(a, b)),
    6: ("clamp", lambda a, b, q: np.clip(a, -1, 1)),
    7: ("clamp arrays", lambda a, b, q: np.clip(a, -q, q)),
    8: ("+", lambda a, b, q: a + b),
    9: ("-", lambda a, b, q: a - b),
    10: ("*", lambda a, b, q: a * b),
    11: ("/", lambda a, b, q: a / b),
    12: ("//", lambda a, b, q: np.floor_divide(a, b)),
    13: ("%", lambda a, b, q: np.mod(a, b)),
    14: ("where", lambda a, b, q: np.where(a < b, a, b)),
    15: ("select", lambda a, b, q: np.where(a < b, b, a)),
    16: ("conditional expression", lambda a, b, q: np.where(a < b, a, b * 2)),
    17: ("python min of 3", lambda a, b, q: np.minimum(np.minimum(a, b), q)),
    18: ("python max", lambda a, b, q: np.maximum(a, b)),
    19: ("literals", lambda a, b, q: 0.5 * a - 2.0 / b + 1.0),
    20: ("python pow", lambda a, b, q: q ** 2),
}
EXACT_BINARY = {"min", "max", "clamp", "clamp arrays", "+", "-", "*", "/", "//", "%", "where", "select",
                "conditional expression", "python min of 3", "python max", "** 2", "python pow"}


@sp.kernel
def binary64(x: sp.array(dtype=sp.float64), y: sp.array(dtype=sp.float64), p: sp.array(dtype=sp.float64),
             out: sp.array(dtype=sp.float64, ndim=2)):
    scalar_binary(x, y, p, out, sp.tid())


@sp.kernel
def binary32(x: sp.array(dtype=float), y: sp.array(dtype=float), p: sp.array(dtype=float),
             out: sp.array(dtype=float, ndim=2)):
    scalar_binary(x, y, p, out, sp.tid())


# Inputs chosen to hit the interesting cases exactly: half-integers (round to even), negative
# operands of // and %, zero (sign, abs), and 1.0 // 0.1 (Python gives 9.0, floor(1.0 / 0.1) is 10).
X = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.0, -0.3, 0.7, 1.2, -7.0, 1.0, 7.0, -1.0])
Y = np.array([0.75, -0.75, 2.0, -2.0, 0.4, -1.5, 3.0, 0.25, -0.35, 1.1, 2.0, 0.1, -2.0, 0.3])
P = np.linspace(0.05, 1.0, len(X))


def run(kernel, dim, inputs, out_shape, dtype):
    out = sp.zeros(out_shape, dtype=dtype)
    sp.launch(kernel, dim, inputs=[sp.array(a) if isinstance(a, np.ndarray) else a for a in inputs], outputs=[out])
    return out.numpy()


@pytest.fixture(scope="module")
def unary_results():
    return (run(unary64, len(X), [X, P], (len(X), len(UNARY)), sp.float64),
            run(unary32, len(X), [X.astype(np.float32), P.astype(np.float32)], (len(X), len(UNARY)), float))


@pytest.fixture(scope="module")
def binary_results():
    return (run(binary64, len(X), [X, Y, P], (len(X), len(BINARY)), sp.float64),
            run(binary32, len(X), [X.astype(np.float32), Y.astype(np.float32), P.astype(np.float32)],
                (len(X), len(BINARY)), float))


@pytest.mark.parametrize("col", sorted(UNARY), ids=[UNARY[c][0] for c in sorted(UNARY)])
def test_unary_forward(unary_results, col):
    name, ref = UNARY[col]
    out64, out32 = unary_results
    expected = ref(X, P)
    if name in EXACT_UNARY:
        np.testing.assert_array_equal(out64[:, col], expected)
    else:
        np.testing.assert_allclose(out64[:, col], expected, rtol=1e-14, atol=1e-15)
    x32, p32 = X.astype(np.float32).astype(np.float64), P.astype(np.float32).astype(np.float64)
    np.testing.assert_allclose(out32[:, col], ref(x32, p32), rtol=2e-6, atol=1e-6)


def test_round_is_half_to_even():
    out64 = run(unary64, len(X), [X, P], (len(X), len(UNARY)), sp.float64)
    assert list(out64[:6, 18]) == [-2.0, -2.0, -0.0, 0.0, 2.0, 2.0]


@pytest.mark.parametrize("col", sorted(BINARY), ids=[BINARY[c][0] for c in sorted(BINARY)])
def test_binary_forward(binary_results, col):
    name, ref = BINARY[col]
    out64, out32 = binary_results
    expected = ref(X, Y, P)
    if name in EXACT_BINARY:
        np.testing.assert_array_equal(out64[:, col], expected)
    else:
        np.testing.assert_allclose(out64[:, col], expected, rtol=1e-14, atol=1e-15)
    x, y, p = (v.astype(np.float32) for v in (X, Y, P))
    with np.errstate(all="ignore"):
        expected32 = ref(x, y, p)
    if name in ("//", "%", "select", "where", "min", "max", "conditional expression"):
        np.testing.assert_array_equal(out32[:, col], expected32)      # NumPy float32 has the same rules
    else:
        np.testing.assert_allclose(out32[:, col], expected32.astype(np.float64), rtol=2e-6, atol=1e-6)


def test_python_floor_division_and_modulo_on_floats():
    out = run(binary64, len(X), [X, Y, P], (len(X), len(BINARY)), sp.float64)
    row = {(a, b): (q, r) for a, b, q, r in zip(X, Y, out[:, 12], out[:, 13])}
    for a, b in [(-2.5, 0.75), (-1.5, -0.75), (-7.0, 2.0), (7.0, -2.0), (1.0, 0.1), (-0.3, 0.25)]:
        assert row[(a, b)] == (a // b, a % b), (a, b)


# ---- integers ------------------------------------------------------------------------------------
@sp.func
def integer_ops(x, y, out, quotient, i):
    a = x[i]
    b = y[i]
    out[i, 0] = a + b
    out[i, 1] = a - b
    out[i, 2] = a * b
    out[i, 3] = a // b
    out[i, 4] = a % b
    out[i, 5] = abs(a)
    out[i, 6] = sp.sign(a)
    out[i, 7] = sp.min(a, b)
    out[i, 8] = sp.max(a, b)
    out[i, 9] = sp.clamp(a, -3, 3)
    out[i, 10] = -a
    out[i, 11] = sp.where(a < b, a, b)
    out[i, 12] = a * 3 - 7 // 2
    out[i, 13] = a ** 3                 # integer powers stay integers, as in Python
    out[i, 14] = pow(b, 2) + 3 ** 2
    quotient[i] = a / b


INTEGER = {
    0: lambda a, b: a + b, 1: lambda a, b: a - b, 2: lambda a, b: a * b,
    3: lambda a, b: np.floor_divide(a, b), 4: lambda a, b: np.mod(a, b), 5: lambda a, b: np.abs(a),
    6: lambda a, b: np.sign(a), 7: np.minimum, 8: np.maximum, 9: lambda a, b: np.clip(a, -3, 3),
    10: lambda a, b: -a, 11: lambda a, b: np.where(a < b, a, b), 12: lambda a, b: a * 3 - 3,
    13: lambda a, b: a ** 3, 14: lambda a, b: b ** 2 + 9,
}


@sp.kernel
def int32_ops(x: sp.array(dtype=int), y: sp.array(dtype=int), out: sp.array(dtype=int, ndim=2),
              quotient: sp.array(dtype=float)):
    integer_ops(x, y, out, quotient, sp.tid())


@sp.kernel
def int64_ops(x: sp.array(dtype=sp.int64), y: sp.array(dtype=sp.int64), out: sp.array(dtype=sp.int64, ndim=2),
              quotient: sp.array(dtype=sp.float64)):
    integer_ops(x, y, out, quotient, sp.tid())


IA = np.array([7, -7, 7, -7, 0, 5, -1, 12, -12, 3])
IB = np.array([2, 2, -2, -2, 3, 5, 3, -5, 5, 7])


@pytest.mark.parametrize("kernel, itype, ftype", [(int32_ops, np.int32, np.float32), (int64_ops, np.int64, np.float64)],
                         ids=["int32", "int64"])
def test_integer_ops_follow_python(kernel, itype, ftype):
    n = len(IA)
    out = sp.zeros((n, len(INTEGER)), dtype=itype)
    quotient = sp.zeros(n, dtype=ftype)
    sp.launch(kernel, n, inputs=[sp.array(IA.astype(itype)), sp.array(IB.astype(itype))], outputs=[out, quotient])
    for col, ref in INTEGER.items():
        np.testing.assert_array_equal(out.numpy()[:, col], ref(IA, IB).astype(itype), err_msg=f"column {col}")
    assert [int(v) for v in out.numpy()[:4, 3]] == [7 // 2, -7 // 2, 7 // -2, -7 // -2] == [3, -4, -4, 3]
    assert [int(v) for v in out.numpy()[:4, 4]] == [7 % 2, -7 % 2, 7 % -2, -7 % -2] == [1, 1, -1, -1]
    np.testing.assert_array_equal(quotient.numpy(), (IA / IB).astype(ftype))   # int / int is a float


# ---- comparisons, logic, conditional expressions, casts, captured values ----------------------------
@sp.kernel
def logic_ops(x: sp.array(dtype=sp.float64), y: sp.array(dtype=sp.float64), out: sp.array(dtype=int, ndim=2)):
    i = sp.tid()
    a = x[i]
    b = y[i]
    out[i, 0] = int(a == b)
    out[i, 1] = int(a != b)
    out[i, 2] = int(a < b)
    out[i, 3] = int(a <= b)
    out[i, 4] = int(a > b)
    out[i, 5] = int(a >= b)
    out[i, 6] = int(a < b and b > 0.0)
    out[i, 7] = int(a < b or b > 0.0)
    out[i, 8] = int(not a < b)
    out[i, 9] = 1 if a < b else 0
    out[i, 10] = int(-1.0 < a < b)              # chained comparison
    out[i, 11] = 10 if a > 1.0 else (20 if a > 0.0 else 30)
    c = 0
    if a < b:
        c = 1
    elif a == b:
        c = 2
    out[i, 12] = c


LOGIC = {
    0: lambda a, b: a == b, 1: lambda a, b: a != b, 2: lambda a, b: a < b, 3: lambda a, b: a <= b,
    4: lambda a, b: a > b, 5: lambda a, b: a >= b, 6: lambda a, b: (a < b) & (b > 0),
    7: lambda a, b: (a < b) | (b > 0), 8: lambda a, b: ~(a < b), 9: lambda a, b: a < b,
    10: lambda a, b: (-1 < a) & (a < b), 11: lambda a, b: np.where(a > 1, 10, np.where(a > 0, 20, 30)),
    12: lambda a, b: np.where(a < b, 1, np.where(a == b, 2, 0)),
}


def test_comparisons_logic_and_conditional_expressions():
    a = np.array([1.0, 2.0, -3.0, 0.5, -0.5, 2.0, 1.5])
    b = np.array([1.0, 1.0, -2.0, 0.7, -0.9, -1.0, 3.0])
    out = sp.zeros((len(a), len(LOGIC)), dtype=int)
    sp.launch(logic_ops, len(a), inputs=[sp.array(a), sp.array(b)], outputs=[out])
    for col, ref in LOGIC.items():
        np.testing.assert_array_equal(out.numpy()[:, col], ref(a, b).astype(np.int32), err_msg=f"column {col}")


@sp.kernel
def casts(x: sp.array(dtype=sp.float64), x32: sp.array(dtype=float), n: sp.array(dtype=sp.int64),
          f: sp.array(dtype=sp.float64, ndim=2), k: sp.array(dtype=int, ndim=2), f32: sp.array(dtype=float)):
    i = sp.tid()
    f[i, 0] = sp.float64(x32[i])
    f[i, 1] = sp.float64(int(x[i]))
    f[i, 2] = sp.float64(n[i])
    f[i, 3] = f64(x32[i]) * TENTH                  # a captured NumPy float64 is a float64 constant
    f[i, 4] = x[i] + sp.float64(i)
    k[i, 0] = int(x[i])                             # truncates toward zero, as Python's int()
    k[i, 1] = sp.int32(x[i])
    k[i, 2] = int(n[i])
    k[i, 3] = int(x[i] < 0.0)
    f32[i] = float(x[i])


def test_casts():
    x = np.array([-2.7, -0.5, 0.0, 0.5, 2.7, 1e3 + 0.25])
    x32 = np.array([0.1, -0.2, 3.0, 1e-3, 7.5, 2.0], np.float32)
    n = np.array([-(2 ** 40), -1, 0, 1, 2 ** 40, 3], np.int64)
    f = sp.zeros((6, 5), dtype=sp.float64)
    k = sp.zeros((6, 4), dtype=int)
    f32 = sp.zeros(6)
    sp.launch(casts, 6, inputs=[sp.array(x), sp.array(x32), sp.array(n)], outputs=[f, k, f32])
    f, k = f.numpy(), k.numpy()
    np.testing.assert_array_equal(f[:, 0], x32.astype(np.float64))
    np.testing.assert_array_equal(f[:, 1], np.trunc(x))
    np.testing.assert_array_equal(f[:, 2], n.astype(np.float64))
    np.testing.assert_array_equal(f[:, 3], x32.astype(np.float64) * 0.1)
    np.testing.assert_array_equal(f[:, 4], x + np.arange(6))
    np.testing.assert_array_equal(k[:, 0], [-2, 0, 0, 0, 2, 1000])
    np.testing.assert_array_equal(k[:, 1], [-2, 0, 0, 0, 2, 1000])
    np.testing.assert_array_equal(k[:, 2], n.astype(np.int32))     # wraps like a C cast
    np.testing.assert_array_equal(k[:, 3], [1, 1, 0, 0, 0, 0])
    np.testing.assert_array_equal(f32.numpy(), x.astype(np.float32))


def scaled_by(factor, shift):
    @sp.kernel
    def scaled(x: sp.array(dtype=sp.float64), out: sp.array(dtype=sp.float64)):
        i = sp.tid()
        out[i] = x[i] * factor + shift
    return scaled


triple_plus_one = scaled_by(3.0, 1)
half_minus_two = scaled_by(0.5, -2)


def test_closure_captured_values():
    x = sp.array(np.array([1.0, -2.0, 0.25]))
    out = sp.zeros(3, dtype=sp.float64)
    sp.launch(triple_plus_one, 3, inputs=[x], outputs=[out])
    np.testing.assert_array_equal(out.numpy(), [4.0, -5.0, 1.75])
    sp.launch(half_minus_two, 3, inputs=[x], outputs=[out])
    np.testing.assert_array_equal(out.numpy(), [-1.5, -3.0, -1.875])


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


def vector_outputs(n, requires_grad=False):
    return [sp.zeros((n, len(VEC_SCALARS)), dtype=sp.float64, requires_grad=requires_grad),
            sp.zeros((n, len(VEC_VECTORS)), dtype=vec3d, requires_grad=requires_grad),
            sp.zeros((n, len(VEC_MATRICES)), dtype=mat33d, requires_grad=requires_grad)]


def vector_arrays(values, requires_grad=False):
    a, b, s, m, n = values
    return [sp.array(a, dtype=vec3d, requires_grad=requires_grad), sp.array(b, dtype=vec3d, requires_grad=requires_grad),
            sp.array(s, requires_grad=requires_grad), sp.array(m, dtype=mat33d, requires_grad=requires_grad),
            sp.array(n, dtype=mat33d, requires_grad=requires_grad)]


@pytest.fixture(scope="module")
def vector_results():
    values = vector_inputs(6, seed=1)
    outs = vector_outputs(6)
    sp.launch(vector_ops, 6, inputs=vector_arrays(values), outputs=outs)
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


def test_determinant_and_inverse_2x2_4x4():
    rng = np.random.default_rng(2)
    a = np.eye(2) + rng.uniform(-0.5, 0.5, (5, 2, 2))
    b = np.eye(4) * 2 + rng.uniform(-0.5, 0.5, (5, 4, 4))
    det = sp.zeros((5, 2), dtype=sp.float64)
    o2 = sp.zeros((5, 2), dtype=mat22d)
    o4 = sp.zeros((5, 2), dtype=mat44d)
    sp.launch(small_matrices, 5, inputs=[sp.array(a, dtype=mat22d), sp.array(b, dtype=mat44d)], outputs=[det, o2, o4])
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


def test_vec3_float32_constructors():
    x = np.array([0.5, -1.0, 3.0], np.float32)
    out = sp.zeros((3, 5), dtype=sp.vec3)
    m = sp.zeros(3, dtype=sp.mat33)
    sp.launch(vec3_float32, 3, inputs=[sp.array(x)], outputs=[out, m])
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


def test_vector_and_matrix_type_constructors_inside_kernels():
    x = np.array([0.5, -2.0])
    v = sp.zeros(2, dtype=vec3d)
    m = sp.zeros(2, dtype=mat22d)
    sp.launch(inline_types, 2, inputs=[sp.array(x)], outputs=[v, m])
    np.testing.assert_array_equal(v.numpy(), [[0.5, 2.0, -0.5], [-2.0, 2.0, 2.0]])
    np.testing.assert_array_equal(m.numpy(), x[:, None, None] + np.array([[1.0, 2.0], [3.0, 4.0]]))


@sp.kernel
def literal_expressions(c: sp.array(dtype=int), out: sp.array(dtype=sp.float64, ndim=2)):
    i = sp.tid()
    out[i, 0] = 2.0 * 0.1
    out[i, 1] = 1.0 if c[i] > 0 else 2.0
    out[i, 2] = sp.select(c[i] > 0, -1.0, 1.0)


@pytest.mark.xfail(strict=True, reason="design: arithmetic on literals folds into a weak literal (2.0 * 0.1), "
                                       "but a choice between literals (1.0 if c else 2.0, select) becomes "
                                       "float32, so storing it into a float64 array is a CompileError (JAX "
                                       "keeps such results weak)")
def test_expressions_of_literals_stay_weakly_typed():
    out = sp.zeros((2, 3), dtype=sp.float64)
    sp.launch(literal_expressions, 2, inputs=[sp.array(np.array([1, 0], np.int32))], outputs=[out])
    np.testing.assert_array_equal(out.numpy(), [[2.0 * 0.1, 1.0, 1.0], [2.0 * 0.1, 2.0, -1.0]])


# ---- gradients against float64 central finite differences ------------------------------------------
def tape_and_fd_gradients(kernel, dim, inputs, outputs, seeds, eps=1e-6):
    """d(sum(seed * output)) / d(input) for every float64 input array with requires_grad, twice: from
    the Tape and from central differences of relaunched forwards (inputs perturbed in place)."""
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
            o.numpy()[...] = v
        sp.launch(kernel, dim, inputs=inputs, outputs=outputs)
        return sum(float(np.sum(o.numpy() * s)) for o, s in zip(outputs, seeds))

    numeric = []
    for a in wrt:
        flat = a.numpy().reshape(-1)
        assert np.shares_memory(flat, a.numpy())
        g = np.zeros_like(flat)
        for k in range(flat.size):
            x0 = flat[k]
            flat[k] = x0 + eps
            up = loss()
            flat[k] = x0 - eps
            down = loss()
            flat[k] = x0
            g[k] = (up - down) / (2 * eps)
        numeric.append(g.reshape(a.numpy().shape))
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
def test_unary_adjoint(col):
    x, _, p = grad_scalar_inputs(3)
    xs, ps = sp.array(x, requires_grad=True), sp.array(p, requires_grad=True)
    out = sp.zeros((GRAD_N, len(UNARY)), dtype=sp.float64, requires_grad=True)
    seed = column_seed(out.numpy().shape, col, np.random.default_rng(col))
    assert_gradients_match(*tape_and_fd_gradients(unary64, GRAD_N, [xs, ps], [out], [seed]))


@pytest.mark.parametrize("col", sorted(BINARY), ids=[BINARY[c][0] for c in sorted(BINARY)])
def test_binary_adjoint(col):
    x, y, p = grad_scalar_inputs(4)
    ins = [sp.array(v, requires_grad=True) for v in (x, y, p)]
    out = sp.zeros((GRAD_N, len(BINARY)), dtype=sp.float64, requires_grad=True)
    seed = column_seed(out.numpy().shape, col, np.random.default_rng(col))
    assert_gradients_match(*tape_and_fd_gradients(binary64, GRAD_N, ins, [out], [seed]))


def test_known_adjoints_exactly():
    """A few gradients with closed forms, to pin the rules themselves (not only their agreement with FD)."""
    x, y, p = grad_scalar_inputs(5)
    ins = [sp.array(v, requires_grad=True) for v in (x, y, p)]
    out = sp.zeros((GRAD_N, len(BINARY)), dtype=sp.float64, requires_grad=True)
    seed = np.zeros(out.numpy().shape)
    seed[:, 13] = 1.0                                # a % b: d/da = 1, d/db = -(a // b)
    (ga, gb, gp), _ = tape_and_fd_gradients(binary64, GRAD_N, ins, [out], [seed])
    np.testing.assert_array_equal(ga, np.ones(GRAD_N))
    np.testing.assert_array_equal(gb, -np.floor_divide(x, y))
    np.testing.assert_array_equal(gp, np.zeros(GRAD_N))


VEC_GRAD_N = 3


@pytest.mark.parametrize("group, col", VEC_CASES, ids=[f"{g}{c}" for g, c in VEC_CASES])
def test_vector_matrix_adjoint(group, col):
    ins = vector_arrays(vector_inputs(VEC_GRAD_N, seed=7), requires_grad=True)
    outs = vector_outputs(VEC_GRAD_N, requires_grad=True)
    rng = np.random.default_rng(col)
    seeds = [column_seed(o.numpy().shape, col, rng) if name == group else np.zeros(o.numpy().shape)
             for name, o in zip(("os", "ov", "om"), outs)]
    assert_gradients_match(*tape_and_fd_gradients(vector_ops, VEC_GRAD_N, ins, outs, seeds))


def test_small_matrix_adjoint():
    rng = np.random.default_rng(8)
    a = sp.array(np.eye(2) + rng.uniform(-0.5, 0.5, (3, 2, 2)), dtype=mat22d, requires_grad=True)
    b = sp.array(np.eye(4) * 2 + rng.uniform(-0.5, 0.5, (3, 4, 4)), dtype=mat44d, requires_grad=True)
    outs = [sp.zeros((3, 2), dtype=sp.float64, requires_grad=True), sp.zeros((3, 2), dtype=mat22d, requires_grad=True),
            sp.zeros((3, 2), dtype=mat44d, requires_grad=True)]
    seeds = [rng.standard_normal(o.numpy().shape) for o in outs]
    assert_gradients_match(*tape_and_fd_gradients(small_matrices, 3, [a, b], outs, seeds))


@sp.kernel
def vector_min_max_clamp(a: sp.array(dtype=vec3d), b: sp.array(dtype=vec3d), c: sp.array(dtype=vec3d),
                         out: sp.array(dtype=vec3d, ndim=2)):
    i = sp.tid()
    out[i, 0] = sp.min(a[i], b[i])
    out[i, 1] = sp.max(a[i], b[i])
    out[i, 2] = sp.clamp(a[i], b[i], c[i])


def test_vector_min_max_clamp_forward_and_adjoint():
    rng = np.random.default_rng(11)
    lo = rng.uniform(-1, 0, (4, 3))
    a, b, c = rng.uniform(-1.5, 1.5, (4, 3)), lo, lo + rng.uniform(0.5, 1.5, (4, 3))
    ins = [sp.array(v, dtype=vec3d, requires_grad=True) for v in (a, b, c)]
    out = sp.zeros((4, 3), dtype=vec3d, requires_grad=True)
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


def test_atomic_adjoints():
    rng = np.random.default_rng(9)
    x = sp.array(rng.uniform(-1, 1, 8), requires_grad=True)
    acc = sp.array(np.array([0.5, 0.25, 10.0, -10.0]), requires_grad=True)
    seed = rng.standard_normal(4)
    (g,), (fd,) = tape_and_fd_gradients(atomic_grads, 8, [x], [acc], [seed])
    assert_gradients_match([g], [fd])
    xv = x.numpy()
    expected = seed[0] * 2 * xv - seed[1] * np.cos(xv)
    expected[np.argmin(xv)] += seed[2]
    expected[np.argmax(xv)] += 2 * seed[3]
    np.testing.assert_allclose(g, expected, rtol=1e-15)
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


def test_atomics_return_the_old_value():
    acc = sp.array(np.array([1.0, 5.0, -5.0]))
    iacc = sp.array(np.array([1, 0, 3], np.int32))
    lacc = sp.array(np.array([1, 5], np.int64))
    old, iold, lold = sp.zeros(7, dtype=sp.float64), sp.zeros(5, dtype=int), sp.zeros(3, dtype=sp.int64)
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


def test_store_and_plus_equals_adjoints():
    rng = np.random.default_rng(10)
    x = sp.array(rng.uniform(-1, 1, 7), requires_grad=True)
    y = sp.zeros(7, dtype=sp.float64, requires_grad=True)
    shared = sp.array(np.array([1.0, 2.0, 3.0]), requires_grad=True)
    vs = sp.zeros(3, dtype=vec3d, requires_grad=True)
    seeds = [rng.standard_normal(7), rng.standard_normal(3), rng.standard_normal((3, 3))]
    (g,), (fd,) = tape_and_fd_gradients(stores_and_accumulation, 7, [x], [y, shared, vs], seeds)
    assert_gradients_match([g], [fd])
    xv = x.numpy()
    expected = (seeds[0] * 3 * xv ** 2 + 2 * seeds[1][np.arange(7) % 2] - 2 * seeds[1][2] * xv
                + seeds[2][np.arange(7) % 3, 0] + seeds[2][np.arange(7) % 3, 1] * np.exp(xv))
    np.testing.assert_allclose(g, expected, rtol=1e-14)
    np.testing.assert_allclose(shared.numpy(), [1.0, 2.0, 3.0] + np.array(
        [2 * xv[0::2].sum(), 2 * xv[1::2].sum(), -(xv ** 2).sum()]), rtol=1e-14)
