"""The builtins: the scalar ops of the op table (arithmetic, comparisons, elementwise math, casts) and
the names users write. The table's conventions are in op_table.py; the vector and matrix ops are in
vector_ops.py. Importing this module completes the table: the compiler reads `OPS` from here.

The Python-facing objects (`sin`, `dot`, `atomic_add`, ...) are `Builtin` markers: the frontend sees
them in a kernel's namespace and emits the op; calling them from plain Python is an error.
"""
from __future__ import annotations

import math
from functools import partial

from . import typing_rules as tr
from .op_table import OPS, OpDef, adjoint, bilinear, defop, scalar_is_float, tangent
from .types import MatrixType, ScalarType, VectorType, bool_, float32
from .vector_ops import construct_op


# ---- arithmetic -------------------------------------------------------------------------------
for _n in ("add", "sub"):
    defop(_n, tr.same_shape_elementwise)
defop("mul", tr.mul)
defop("div", tr.mul)
defop("matmul", tr.matmul, "mul")
defop("floordiv", lambda n, t, w: tr.same_shape_elementwise(n, t, w))
defop("mod", lambda n, t, w: tr.same_shape_elementwise(n, t, w))
defop("neg", tr.numeric_unary)
defop("pow", tr.power)


@adjoint("add")
def _(b, g, out, x, y):
    b.accum(x, g)
    b.accum(y, g)


@adjoint("sub")
def _(b, g, out, x, y):
    b.accum(x, g)
    b.accum(y, b.op("neg", g))


@adjoint("neg")
def _(b, g, out, x):
    b.accum(x, b.op("neg", g))


@adjoint("mul", "matmul")
def _(b, g, out, x, y):
    tx, ty = x.type, y.type
    if isinstance(tx, ScalarType) and isinstance(ty, ScalarType):
        b.accum(x, b.op("mul", g, y))
        b.accum(y, b.op("mul", g, x))
    elif isinstance(tx, ScalarType):                       # s * V
        b.accum(x, b.op("inner", g, y))
        b.accum(y, b.op("mul", g, x))
    elif isinstance(ty, ScalarType):                       # V * s
        b.accum(x, b.op("mul", g, y))
        b.accum(y, b.op("inner", g, x))
    elif isinstance(tx, MatrixType) and isinstance(ty, VectorType):
        b.accum(x, b.op("outer", g, y))
        b.accum(y, b.op("matmul", b.op("transpose", x), g))
    elif isinstance(tx, VectorType):                       # v @ M
        b.accum(x, b.op("matmul", y, g))
        b.accum(y, b.op("outer", x, g))
    else:                                                  # M @ M
        b.accum(x, b.op("matmul", g, b.op("transpose", y)))
        b.accum(y, b.op("matmul", b.op("transpose", x), g))


@adjoint("div")
def _(b, g, out, x, y):
    # d(x/y)/dy = -out/y: reuse g/y, so an adjoint divides once where the forward does (a division
    # costs as much as ten multiplies in a vectorised loop)
    g_over_y = b.op("div", g, y)
    b.accum(x, g_over_y)
    b.accum(y, b.op("neg", b.op("mul" if isinstance(x.type, ScalarType) else "inner", g_over_y, out)))


@adjoint("mod")
def _(b, g, out, x, y):
    if scalar_is_float(x):
        b.accum(x, g)
        b.accum(y, b.op("neg", b.op("mul", g, b.op("floordiv", x, y))))


@tangent("add")
def _(b, out, args, d):
    return b.plus(*d)


@tangent("sub")
def _(b, out, args, d):
    return b.minus(*d)


@tangent("neg")
def _(b, out, args, d):
    return b.lin(d[0], lambda t: b.op("neg", t))


for _n in ("mul", "matmul"):
    bilinear(_n)


@tangent("div")
def _(b, out, args, d):
    y, (dx, dy) = args[1], d
    return b.minus(b.lin(dx, lambda t: b.op("div", t, y)), b.lin(dy, lambda t: b.op("div", b.op("mul", out, t), y)))


@tangent("mod")
def _(b, out, args, d):
    (x, y), (dx, dy) = args, d
    return b.minus(dx, b.lin(dy, lambda t: b.op("mul", b.op("floordiv", x, y), t)))


@tangent("pow")
def _(b, out, args, d):
    (x, y), (dx, dy) = args, d
    one = b.const(1, y.type)
    by_x = b.lin(dx, lambda t: b.op("mul", t, b.op("mul", y, b.op("pow", x, b.op("sub", y, one)))))

    def by_y(t):
        positive = b.op("gt", x, b.const(0, x.type))
        safe_x = b.op("where", positive, x, b.const(1, x.type))
        return b.op("where", positive, b.op("mul", t, b.op("mul", out, b.op("log", safe_x))), b.const(0, y.type))
    return b.plus(by_x, b.lin(dy, by_y))


@adjoint("pow")
def _(b, g, out, x, y):
    one = b.const(1, y.type)
    b.accum(x, b.op("mul", g, b.op("mul", y, b.op("pow", x, b.op("sub", y, one)))))
    # d/dy x^y = x^y log x, defined for x > 0 only; elsewhere no gradient flows to the exponent.
    positive = b.op("gt", x, b.const(0, x.type))
    safe_x = b.op("where", positive, x, b.const(1, x.type))
    b.accum(y, b.op("where", positive, b.op("mul", g, b.op("mul", out, b.op("log", safe_x))),
                    b.const(0, y.type)))


# ---- comparisons and logic (no adjoints) -------------------------------------------------------
for _n in ("eq", "ne", "lt", "le", "gt", "ge"):
    defop(_n, tr.compare)
defop("and", tr.logical, "logical_and")
defop("or", tr.logical, "logical_or")
defop("not", tr.logical, "logical_not")

# ---- elementwise math ---------------------------------------------------------------------------
for _n in ("sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "exp", "log", "log2",
           "log10", "sqrt", "floor", "ceil", "round"):
    defop(_n, tr.float_unary)
defop("atan2", tr.float_scalars)
defop("abs", tr.numeric_unary)
defop("sign", tr.numeric_unary)
defop("min", tr.same_shape_elementwise)
defop("max", tr.same_shape_elementwise)
defop("clamp", tr.same_shape_elementwise)


def _unary(name, derivative):
    @adjoint(name)
    def _(b, g, out, x):
        b.accum(x, b.op("mul", g, derivative(b, out, x)))

    @tangent(name)
    def _(b, out, args, d):
        return b.lin(d[0], lambda t: b.op("mul", t, derivative(b, out, args[0])))


_unary("sin", lambda b, out, x: b.op("cos", x))
_unary("cos", lambda b, out, x: b.op("neg", b.op("sin", x)))
_unary("tan", lambda b, out, x: b.op("add", b.const(1, x.type), b.op("mul", out, out)))
_unary("sinh", lambda b, out, x: b.op("cosh", x))
_unary("cosh", lambda b, out, x: b.op("sinh", x))
_unary("tanh", lambda b, out, x: b.op("sub", b.const(1, x.type), b.op("mul", out, out)))
_unary("exp", lambda b, out, x: out)
_unary("log", lambda b, out, x: b.op("div", b.const(1, x.type), x))
_unary("log2", lambda b, out, x: b.op("div", b.const(1 / math.log(2), x.type), x))
_unary("log10", lambda b, out, x: b.op("div", b.const(1 / math.log(10), x.type), x))
_unary("sqrt", lambda b, out, x: b.op("div", b.const(0.5, x.type), out))
_unary("asin", lambda b, out, x: b.op("div", b.const(1, x.type), b.op("sqrt", b.op("sub", b.const(1, x.type), b.op("mul", x, x)))))
_unary("acos", lambda b, out, x: b.op("div", b.const(-1, x.type), b.op("sqrt", b.op("sub", b.const(1, x.type), b.op("mul", x, x)))))
_unary("atan", lambda b, out, x: b.op("div", b.const(1, x.type), b.op("add", b.const(1, x.type), b.op("mul", x, x))))


@adjoint("abs")
def _(b, g, out, x):
    if scalar_is_float(x):
        b.accum(x, b.op("cw_mul", g, b.op("sign", x)))        # cw_mul: abs() also takes vectors


@tangent("abs")
def _(b, out, args, d):
    return b.lin(d[0], lambda t: b.op("cw_mul", t, b.op("sign", args[0])))


@tangent("atan2")
def _(b, out, args, d):
    (y, x), (dy, dx) = args, d
    r2 = b.op("add", b.op("mul", x, x), b.op("mul", y, y))
    return b.minus(b.lin(dy, lambda t: b.op("div", b.op("mul", t, x), r2)),
                   b.lin(dx, lambda t: b.op("div", b.op("mul", t, y), r2)))


@adjoint("atan2")
def _(b, g, out, y, x):
    r2 = b.op("add", b.op("mul", x, x), b.op("mul", y, y))
    b.accum(y, b.op("div", b.op("mul", g, x), r2))
    b.accum(x, b.op("neg", b.op("div", b.op("mul", g, y), r2)))


def _pick(b, cond, g):
    return b.op("where", cond, g, b.const(0, g.type))


def _min_max(name, first_wins):
    @adjoint(name)
    def _(b, g, out, x, y):
        # Ties send the gradient to the first argument, as NumPy's and Warp's rules do.
        if not isinstance(x.type, ScalarType):             # per component
            gx = b.op("pick_" + first_wins, x, y, g)
            b.accum(x, gx)
            b.accum(y, b.op("sub", g, gx))
            return
        first = b.op(first_wins, x, y)
        b.accum(x, _pick(b, first, g))
        b.accum(y, _pick(b, b.op("not", first), g))

    @tangent(name)
    def _(b, out, args, d):
        (x, y), (dx, dy) = args, [b.dense(t, a.type) for t, a in zip(d, args)]
        if not isinstance(x.type, ScalarType):
            return b.op("add", b.op("pick_" + first_wins, x, y, dx), b.op("sub", dy, b.op("pick_" + first_wins, x, y, dy)))
        return b.op("where", b.op(first_wins, x, y), dx, dy)


defop("pick_le", tr.same_shape_elementwise)      # adjoint helpers: g where a <= b (a >= b), else 0
defop("pick_ge", tr.same_shape_elementwise)
_min_max("min", "le")
_min_max("max", "ge")


@adjoint("clamp")
def _(b, g, out, x, lo, hi):
    if not isinstance(x.type, ScalarType):                 # clamp = min(max(x, lo), hi), per component
        m = b.op("max", x, lo)
        gm = b.op("pick_le", m, hi, g)
        b.accum(hi, b.op("sub", g, gm))
        gx = b.op("pick_ge", x, lo, gm)
        b.accum(x, gx)
        b.accum(lo, b.op("sub", gm, gx))
        return
    inside = b.op("and", b.op("ge", x, lo), b.op("le", x, hi))
    below = b.op("lt", x, lo)
    b.accum(x, _pick(b, inside, g))
    b.accum(lo, _pick(b, below, g))
    b.accum(hi, _pick(b, b.op("gt", x, hi), g))


@tangent("clamp")
def _(b, out, args, d):
    (x, lo, hi), (dx, dlo, dhi) = args, [b.dense(t, a.type) for t, a in zip(d, args)]
    if not isinstance(x.type, ScalarType):
        m = b.op("max", x, lo)
        dm = b.op("add", b.op("pick_ge", x, lo, dx), b.op("sub", dlo, b.op("pick_ge", x, lo, dlo)))
        return b.op("add", b.op("pick_le", m, hi, dm), b.op("sub", dhi, b.op("pick_le", m, hi, dhi)))
    inside = b.op("and", b.op("ge", x, lo), b.op("le", x, hi))
    above = b.op("where", b.op("gt", x, hi), dhi, b.const(0, x.type))
    return b.op("where", inside, dx, b.op("where", b.op("lt", x, lo), dlo, above))


def _where_typing(name, types, weaks):
    c, x, y = types
    if c != bool_ and not (isinstance(c, ScalarType) and c.is_int):
        raise tr.TypeRuleError(f"{name}() condition must be a bool, got {c}")
    (tx, ty), t = tr.same_shape_elementwise(name, [x, y], weaks[1:])
    return [bool_, tx, ty], t


defop("where", _where_typing)


@adjoint("where")
def _(b, g, out, c, x, y):
    zero = b.const(0, g.type)
    b.accum(x, b.op("where", c, g, zero))
    b.accum(y, b.op("where", c, zero, g))


@tangent("where")
def _(b, out, args, d):
    return b.op("where", args[0], b.dense(d[1], args[1].type), b.dense(d[2], args[2].type))


# ---- casts and constructors ---------------------------------------------------------------------
def _cast_typing(target, name, types, weaks):
    return list(types), target


def cast_op(target) -> str:
    """The op name that casts to `target` (a scalar type)."""
    name = f"cast_{target.name}"
    if name not in OPS:
        OPS[name] = OpDef(name, partial(_cast_typing, target, name), f"cast<{target.ctype}>", _cast_adjoint,
                          tangent=_cast_tangent)
    return name


def _cast_adjoint(b, g, out, x):
    if scalar_is_float(x) and tr.scalar_of(out.type).is_float:
        b.accum(x, b.op(cast_op(x.type), g))


def _cast_tangent(b, out, args, d):
    if scalar_is_float(args[0]) and tr.scalar_of(out.type).is_float:
        return b.lin(d[0], lambda t: b.op(cast_op(out.type), t))
    return None


# ---- the names users write ---------------------------------------------------------------------
class Builtin:
    """A kernel-language builtin as seen from Python (`stepper.sin`, `stepper.atomic_add`, ...)."""

    def __init__(self, name: str, op: str | None = None):
        self.name = name
        self.op = op or name

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self.name}() can only be called inside a @kernel or @func")

    def __repr__(self) -> str:
        return f"<builtin {self.name}>"


MATH_NAMES = ["sin", "cos", "tan", "asin", "acos", "atan", "atan2", "sinh", "cosh", "tanh", "exp", "log",
              "log2", "log10", "sqrt", "pow", "abs", "sign", "min", "max", "clamp", "floor", "ceil", "round",
              "where", "dot", "cross", "length", "length_sq", "normalize", "outer", "transpose",
              "determinant", "inverse", "cw_mul", "cw_div"]
BUILTINS = {n: Builtin(n) for n in MATH_NAMES}
# Warp's select(cond, value_if_false, value_if_true): the frontend swaps the arguments.
BUILTINS["select"] = Builtin("select", "where")
for _n in ("tid", "atomic_add", "atomic_sub", "atomic_min", "atomic_max"):
    BUILTINS[_n] = Builtin(_n)

# Python's own builtins that mean the same inside kernels.
PYTHON_BUILTINS = {abs: "abs", min: "min", max: "max", round: "round", pow: "pow"}

__all__ = ["OPS", "OpDef", "Builtin", "BUILTINS", "cast_op", "construct_op", "float32"]
