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


def run(kernel, dim, inputs, out_shape, dtype, device="cpu"):
    out = sp.zeros(out_shape, dtype=dtype, device=device)
    sp.launch(kernel, dim, inputs=[sp.array(a, device=device) if isinstance(a, np.ndarray) else a for a in inputs],
              outputs=[out])
    return out.numpy()


@pytest.fixture(scope="module")
def unary_results(device):
    return (run(unary64, len(X), [X, P], (len(X), len(UNARY)), sp.float64, device),
            run(unary32, len(X), [X.astype(np.float32), P.astype(np.float32)], (len(X), len(UNARY)), float, device))


@pytest.fixture(scope="module")
def binary_results(device):
    return (run(binary64, len(X), [X, Y, P], (len(X), len(BINARY)), sp.float64, device),
            run(binary32, len(X), [X.astype(np.float32), Y.astype(np.float32), P.astype(np.float32)],
                (len(X), len(BINARY)), float, device))


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


def test_round_is_half_to_even(device):
    out64 = run(unary64, len(X), [X, P], (len(X), len(UNARY)), sp.float64, device)
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


def test_python_floor_division_and_modulo_on_floats(device):
    out = run(binary64, len(X), [X, Y, P], (len(X), len(BINARY)), sp.float64, device)
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
def test_integer_ops_follow_python(kernel, itype, ftype, device):
    n = len(IA)
    out = sp.zeros((n, len(INTEGER)), dtype=itype, device=device)
    quotient = sp.zeros(n, dtype=ftype, device=device)
    sp.launch(kernel, n, inputs=[sp.array(IA.astype(itype), device=device), sp.array(IB.astype(itype), device=device)],
              outputs=[out, quotient])
    for col, ref in INTEGER.items():
        np.testing.assert_array_equal(out.numpy()[:, col], ref(IA, IB).astype(itype), err_msg=f"column {col}")
    assert [int(v) for v in out.numpy()[:4, 3]] == [7 // 2, -7 // 2, 7 // -2, -7 // -2] == [3, -4, -4, 3]
    assert [int(v) for v in out.numpy()[:4, 4]] == [7 % 2, -7 % 2, 7 % -2, -7 % -2] == [1, 1, -1, -1]
    np.testing.assert_array_equal(quotient.numpy(), (IA / IB).astype(ftype))   # int / int is a float


@sp.kernel
def int32_divmod(x: sp.array(dtype=int), y: sp.array(dtype=int), quotient: sp.array(dtype=int),
                 remainder: sp.array(dtype=int)):
    i = sp.tid()
    quotient[i] = x[i] // y[i]
    remainder[i] = x[i] % y[i]


@sp.kernel
def int64_divmod(x: sp.array(dtype=sp.int64), y: sp.array(dtype=sp.int64), quotient: sp.array(dtype=sp.int64),
                 remainder: sp.array(dtype=sp.int64)):
    i = sp.tid()
    quotient[i] = x[i] // y[i]
    remainder[i] = x[i] % y[i]


@pytest.mark.parametrize("kernel, itype", [(int32_divmod, np.int32), (int64_divmod, np.int64)], ids=["int32", "int64"])
def test_integer_division_follows_python_around_one_period_and_at_the_extremes(kernel, itype, device):
    """`%` skips the division for a value at most one period off [0, b) (a periodic index): every
    case on both sides of each boundary of that shortcut, and the type's extremes, give Python's
    `//` and `%`, except the one quotient that does not fit: MIN // -1 wraps to MIN, as in NumPy
    (it used to be a hardware trap that killed the process)."""
    big = int(np.iinfo(itype).max)
    pairs = []
    for b in (1, 3, 7, 2 ** 30, big, -1, -3, -(2 ** 30)):
        for a in (-2 * abs(b) - 1, -2 * abs(b), -abs(b) - 1, -abs(b), -1, 0, 1, abs(b) - 1, abs(b), abs(b) + 1,
                  2 * abs(b) - 1, 2 * abs(b), 2 * abs(b) + 1, big, -big - 1):
            if -big - 1 <= a <= big:
                pairs.append((a, b))
    a, b = (np.array(column, dtype=itype) for column in zip(*pairs))
    quotient, remainder = (sp.zeros(len(pairs), dtype=itype, device=device) for _ in range(2))
    sp.launch(kernel, len(pairs), inputs=[sp.array(a, device=device), sp.array(b, device=device)],
              outputs=[quotient, remainder])
    assert [int(v) for v in remainder.numpy()] == [x % y for x, y in pairs]
    wrapped = [-big - 1 if (x, y) == (-big - 1, -1) else x // y for x, y in pairs]
    assert [int(v) for v in quotient.numpy()] == wrapped


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


def test_comparisons_logic_and_conditional_expressions(device):
    a = np.array([1.0, 2.0, -3.0, 0.5, -0.5, 2.0, 1.5])
    b = np.array([1.0, 1.0, -2.0, 0.7, -0.9, -1.0, 3.0])
    out = sp.zeros((len(a), len(LOGIC)), dtype=int, device=device)
    sp.launch(logic_ops, len(a), inputs=[sp.array(a, device=device), sp.array(b, device=device)], outputs=[out])
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


def test_casts(device):
    x = np.array([-2.7, -0.5, 0.0, 0.5, 2.7, 1e3 + 0.25])
    x32 = np.array([0.1, -0.2, 3.0, 1e-3, 7.5, 2.0], np.float32)
    n = np.array([-(2 ** 40), -1, 0, 1, 2 ** 40, 3], np.int64)
    f = sp.zeros((6, 5), dtype=sp.float64, device=device)
    k = sp.zeros((6, 4), dtype=int, device=device)
    f32 = sp.zeros(6, device=device)
    sp.launch(casts, 6, inputs=[sp.array(x, device=device), sp.array(x32, device=device), sp.array(n, device=device)],
              outputs=[f, k, f32])
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


def test_closure_captured_values(device):
    x = sp.array(np.array([1.0, -2.0, 0.25]), device=device)
    out = sp.zeros(3, dtype=sp.float64, device=device)
    sp.launch(triple_plus_one, 3, inputs=[x], outputs=[out])
    np.testing.assert_array_equal(out.numpy(), [4.0, -5.0, 1.75])
    sp.launch(half_minus_two, 3, inputs=[x], outputs=[out])
    np.testing.assert_array_equal(out.numpy(), [-1.5, -3.0, -1.875])


@sp.kernel
def squares(x: sp.array(dtype=sp.float64), y: sp.array(dtype=sp.float64)):
    i = sp.tid()
    y[i] = x[i] ** 2 + pow(x[i], 2)


def test_a_square_is_a_product_on_every_target():
    # CUDA's pow is not correctly rounded (pow(0.3, 2.0) gave 0.08999999999999998 on an H100), so
    # x ** 2 compiles to x * x, one correctly rounded product: the CPU's bits on the GPU.
    from compiler.codegen.targets import render_cpu, render_cuda
    for render in (render_cpu, render_cuda):
        source = render([squares.compiled().functions()], False).source
        assert "pow(" not in source.split("squares", 1)[1]
