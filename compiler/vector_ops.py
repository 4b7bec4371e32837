"""The vector and matrix ops of the op table (op_table.py): constructors (`vec3(a, b, c)`, `mat33(rows)`),
products and norms, and element access (local vectors and matrices are values; `v[i] = x` is an
insert), each with its typing, adjoint and tangent rules.
"""
from __future__ import annotations

from functools import partial

from . import typing_rules as tr
from .op_table import OPS, OpDef, adjoint, bilinear, defop, tangent
from .types import MatrixType, ScalarType, VectorType

__all__ = ["construct_op"]


# ---- constructors ------------------------------------------------------------------------------
def _construct_typing(target, name, types, weaks):
    n = target.length if isinstance(target, VectorType) else target.rows * target.cols
    s = target.scalar
    if len(types) == 1 and isinstance(types[0], ScalarType):
        return [s], target
    if isinstance(target, MatrixType) and len(types) == target.rows and all(
            isinstance(t, VectorType) for t in types):
        row = VectorType(target.cols, s)
        if any(t != row for t in types):
            raise tr.TypeRuleError(f"{target}() from rows: each row must be a {row}")
        return [row] * len(types), target
    if len(types) != n or not all(isinstance(t, ScalarType) for t in types):
        raise tr.TypeRuleError(f"{target}() takes no argument, one scalar, or {n} scalars"
                               + (f" or {target.rows} row vectors" if isinstance(target, MatrixType) else ""),
                               f"got {len(types)} argument(s)")
    for t, w in zip(types, weaks):
        if t.is_float and not w and t != s:
            raise tr.TypeRuleError(f"{target}() of a {t}", f"cast with {s.name}(x) first")
    return [s] * n, target


def construct_op(target) -> str:
    name = f"make_{target.name}"
    if name not in OPS:
        OPS[name] = OpDef(name, partial(_construct_typing, target, name), f"construct<{target.ctype}>",
                          _construct_adjoint, tangent=_construct_tangent)
    return name


def _construct_adjoint(b, g, out, *args):
    if len(args) == 1 and isinstance(args[0].type, ScalarType):
        b.accum(args[0], b.op("sum", g))
        return
    t = out.type
    for k, a in enumerate(args):
        if isinstance(a.type, VectorType):
            b.accum(a, b.op("extract", g, b.const(k, tr.int32)))
        elif isinstance(t, VectorType):
            b.accum(a, b.op("extract", g, b.const(k, tr.int32)))
        else:
            b.accum(a, b.op("extract", g, b.const(k // t.cols, tr.int32), b.const(k % t.cols, tr.int32)))


def _construct_tangent(b, out, args, d):
    return b.op(construct_op(out.type), *(b.dense(t, a.type) for t, a in zip(d, args)))


# ---- vectors and matrices ----------------------------------------------------------------------
def _scalar_result(t, *_):
    return t.scalar


defop("dot", partial(tr.vector_args, result=_scalar_result))
defop("cross", partial(tr.vector_args, result=lambda a, b: a, lengths=(3,)))
defop("length", partial(tr.vector_args, result=_scalar_result))
defop("length_sq", partial(tr.vector_args, result=_scalar_result))
defop("normalize", partial(tr.vector_args, result=lambda a: a))
defop("outer", partial(tr.vector_args, same=False, result=lambda a, b: MatrixType(a.length, b.length, a.scalar)))
defop("cw_mul", tr.same_shape_elementwise)
defop("cw_div", tr.same_shape_elementwise)
defop("inner", lambda n, t, w: (list(t), t[0].scalar))          # sum of element products, any shape
defop("sum", lambda n, t, w: (list(t), tr.scalar_of(t[0])))       # sum of elements
defop("transpose", lambda n, t, w: ([t[0]], MatrixType(t[0].cols, t[0].rows, t[0].scalar))
      if isinstance(t[0], MatrixType) else (_ for _ in ()).throw(tr.TypeRuleError(f"transpose() of {t[0]}")))
defop("determinant", partial(tr.square_matrix, result=_scalar_result))
defop("inverse", partial(tr.square_matrix, result=lambda m: m, sizes=(2, 3)))
defop("cofactor", partial(tr.square_matrix, result=lambda m: m, sizes=(2, 3, 4)))


for _n in ("dot", "inner", "cross", "outer", "cw_mul"):
    bilinear(_n)


@tangent("length")
def _(b, out, args, d):
    nonzero = b.op("gt", out, b.const(0, out.type))
    return b.op("where", nonzero, b.op("div", b.op("dot", args[0], d[0]), out), b.const(0, out.type))


@tangent("length_sq")
def _(b, out, args, d):
    return b.op("mul", b.const(2, out.type), b.op("dot", args[0], d[0]))


@tangent("normalize")
def _(b, out, args, d):
    length = b.op("length", args[0])
    nonzero = b.op("gt", length, b.const(0, length.type))
    inv = b.op("where", nonzero, b.op("div", b.const(1, length.type), length), b.const(0, length.type))
    return b.op("mul", b.op("sub", d[0], b.op("mul", out, b.op("dot", out, d[0]))), inv)


@tangent("cw_div")
def _(b, out, args, d):
    y, (dx, dy) = args[1], d
    return b.minus(b.lin(dx, lambda t: b.op("cw_div", t, y)),
                   b.lin(dy, lambda t: b.op("cw_div", b.op("cw_mul", out, t), y)))


@tangent("sum", "transpose")
def _(b, out, args, d):
    return b.op("sum" if isinstance(out.type, ScalarType) else "transpose", d[0])


@tangent("determinant")
def _(b, out, args, d):
    return b.op("inner", b.op("cofactor", args[0]), d[0])


@tangent("inverse")
def _(b, out, args, d):
    return b.op("neg", b.op("matmul", out, b.op("matmul", d[0], out)))


@adjoint("dot", "inner")
def _(b, g, out, x, y):
    b.accum(x, b.op("mul", y, g))
    b.accum(y, b.op("mul", x, g))


@adjoint("cross")
def _(b, g, out, x, y):
    b.accum(x, b.op("cross", y, g))
    b.accum(y, b.op("cross", g, x))


@adjoint("length")
def _(b, g, out, x):
    # At zero length the direction is undefined; the subgradient 0 is used, as Warp does.
    nonzero = b.op("gt", out, b.const(0, out.type))
    scale = b.op("where", nonzero, b.op("div", g, out), b.const(0, out.type))
    b.accum(x, b.op("mul", x, scale))


@adjoint("length_sq")
def _(b, g, out, x):
    b.accum(x, b.op("mul", x, b.op("mul", b.const(2, g.type), g)))


@adjoint("normalize")
def _(b, g, out, x):
    length = b.op("length", x)
    nonzero = b.op("gt", length, b.const(0, length.type))
    inv = b.op("where", nonzero, b.op("div", b.const(1, length.type), length), b.const(0, length.type))
    tangential = b.op("sub", g, b.op("mul", out, b.op("dot", out, g)))
    b.accum(x, b.op("mul", tangential, inv))


@adjoint("outer")
def _(b, g, out, x, y):
    b.accum(x, b.op("matmul", g, y))
    b.accum(y, b.op("matmul", b.op("transpose", g), x))


@adjoint("cw_mul")
def _(b, g, out, x, y):
    b.accum(x, b.op("cw_mul", g, y))
    b.accum(y, b.op("cw_mul", g, x))


@adjoint("cw_div")
def _(b, g, out, x, y):
    b.accum(x, b.op("cw_div", g, y))
    b.accum(y, b.op("neg", b.op("cw_div", b.op("cw_mul", g, out), y)))


@adjoint("sum")
def _(b, g, out, x):
    b.accum(x, b.op(construct_op(x.type), g) if not isinstance(x.type, ScalarType) else g)


@adjoint("transpose")
def _(b, g, out, x):
    b.accum(x, b.op("transpose", g))


@adjoint("determinant")
def _(b, g, out, x):
    b.accum(x, b.op("mul", b.op("cofactor", x), g))


@adjoint("inverse")
def _(b, g, out, x):
    inv_t = b.op("transpose", out)
    b.accum(x, b.op("neg", b.op("matmul", inv_t, b.op("matmul", g, inv_t))))


# ---- element access (local vectors and matrices are values; `v[i] = x` is an insert) ------------
def _extract_typing(name, types, weaks):
    t, *idx = types
    if not all(isinstance(i, ScalarType) and i.is_int for i in idx):
        raise tr.TypeRuleError("vector and matrix indices must be integers")
    if isinstance(t, VectorType) and len(idx) == 1:
        return list(types), t.scalar
    if isinstance(t, MatrixType) and len(idx) == 1:
        return list(types), VectorType(t.cols, t.scalar)
    if isinstance(t, MatrixType) and len(idx) == 2:
        return list(types), t.scalar
    raise tr.TypeRuleError(f"cannot index a {t} with {len(idx)} indices")


def _insert_typing(name, types, weaks):
    t, *idx, v = types
    _, elem = _extract_typing(name, [t, *idx], weaks)
    if isinstance(v, ScalarType) and isinstance(elem, ScalarType):
        if v.is_float and not weaks[-1] and v != elem:
            raise tr.TypeRuleError(f"storing a {v} into a {t}", f"cast with {elem.name}(x)")
        return [t, *idx, elem], t
    if v != elem:
        raise tr.TypeRuleError(f"storing a {v} into a row of {t}", f"the row is a {elem}")
    return [t, *idx, elem], t


defop("extract", _extract_typing)
defop("insert", _insert_typing)


@adjoint("extract")
def _(b, g, out, x, *idx):
    b.accum(x, b.op("insert", b.const(0, x.type), *idx, g))


@tangent("extract")
def _(b, out, args, d):
    return b.op("extract", d[0], *args[1:])


@tangent("insert")
def _(b, out, args, d):
    x, *idx, v = args
    return b.op("insert", b.dense(d[0], x.type), *idx, b.dense(d[-1], v.type))


@adjoint("insert")
def _(b, g, out, x, *rest):
    *idx, v = rest
    b.accum(x, b.op("insert", g, *idx, b.const(0, v.type)))
    b.accum(v, b.op("extract", g, *idx))
