"""Typing and promotion: what each builtin accepts and returns.

Kept apart from the AST visitor (which only builds IR) and from codegen. A rule takes the argument
types (and which arguments are weakly typed Python literals) and returns the types the arguments must
be cast to plus the result type, or raises `TypeRuleError` with a message and a hint for the user.

Promotion follows JAX's weak typing: an untyped literal adopts its partner's type (`0.5 * v` with a
float64 `v` is float64); a literal on its own is float32 or int32; int mixed with float becomes the
float; float32 mixed with float64 is an error with a hint, since silent promotion would hide a cost.
"""
from __future__ import annotations

from .types import (MatrixType, ScalarType, VectorType, bool_, float32, float64, int32, int64)


class TypeRuleError(Exception):
    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        self.hint = hint


def scalar_of(t):
    return t if isinstance(t, ScalarType) else t.scalar


def _join_scalars(a: ScalarType, wa: bool, b: ScalarType, wb: bool) -> ScalarType:
    if a == b:
        return a
    if wa and not wb:
        return float32 if (a.is_float and not b.is_float) else b
    if wb and not wa:
        return float32 if (b.is_float and not a.is_float) else a
    if a.is_float and b.is_float:
        if wa and wb:
            return float32
        raise TypeRuleError(f"cannot mix {a} and {b}",
                            "cast one side explicitly, e.g. float64(x) or float32(x)")
    if a.is_float or b.is_float:
        return a if a.is_float else b
    if a == bool_ or b == bool_:
        return b if a == bool_ else a
    return int64 if int64 in (a, b) else int32


def join(types, weaks) -> ScalarType:
    """The common scalar type of several scalar operands."""
    out, w = types[0], weaks[0]
    for t, tw in zip(types[1:], weaks[1:]):
        out = _join_scalars(out, w, t, tw)
        w = w and tw
    return out


def with_scalar(t, s: ScalarType):
    if isinstance(t, ScalarType):
        return s
    if isinstance(t, VectorType):
        return VectorType(t.length, s)
    return MatrixType(t.rows, t.cols, s)


def same_shape_elementwise(name, types, weaks):
    """add/sub/min/max/...: equal shapes; scalars promote."""
    shaped = [t for t in types if not isinstance(t, ScalarType)]
    if not shaped:
        s = join(types, weaks)
        return [s] * len(types), s
    first = shaped[0]
    for t in shaped[1:]:
        if t != first:
            raise TypeRuleError(f"{name}() of {first} and {t}: operands must have the same type",
                                "cast with the type as a function, e.g. vec3(x)")
    for t, w in zip(types, weaks):
        if isinstance(t, ScalarType) and not w:
            raise TypeRuleError(f"{name}() of {first} and scalar {t}",
                                f"make the scalar a {first} with {first.name}(x)")
        if isinstance(t, ScalarType) and w:
            raise TypeRuleError(f"{name}() of {first} and a number literal",
                                f"write {first.name}(value) for a constant {first}")
    return [first] * len(types), first


def float_unary(name, types, weaks):
    (t,) = types
    if isinstance(t, ScalarType):
        s = t if t.is_float else float32
        return [s], s
    raise TypeRuleError(f"{name}() takes a scalar, got {t}", "apply it to each component")


def float_scalars(name, types, weaks):
    s = join(types, weaks)
    if not all(isinstance(t, ScalarType) for t in types):
        raise TypeRuleError(f"{name}() takes scalars, got {', '.join(map(str, types))}")
    s = s if s.is_float else float32
    return [s] * len(types), s


def power(name, types, weaks):
    """`x ** y` and pow(): floats as float_scalars; two integers stay integers, as in Python (a negative
    exponent truncates toward zero like integer division: 2 ** -1 is 0, (-1) ** -3 is -1)."""
    if all(isinstance(t, ScalarType) and t.is_int for t in types):
        s = join(types, weaks)
        return [s, s], s
    return float_scalars(name, types, weaks)


def numeric_unary(name, types, weaks):
    (t,) = types
    if t == bool_:
        raise TypeRuleError(f"{name}() of a bool")
    if isinstance(t, ScalarType) and weaks[0]:
        t = float32 if t.is_float else int32
    return [t], t


def compare(name, types, weaks):
    if not all(isinstance(t, ScalarType) for t in types):
        raise TypeRuleError(f"comparison of {types[0]} and {types[1]}: only scalars compare",
                            "compare components or lengths instead")
    s = join(types, weaks)
    return [s, s], bool_


def logical(name, types, weaks):
    return [bool_] * len(types), bool_


def mul(name, types, weaks):
    a, b = types
    if isinstance(a, ScalarType) and isinstance(b, ScalarType):
        s = join(types, weaks)
        if name == "div" and not s.is_float:
            s = float32 if (weaks[0] and weaks[1]) or s == int32 else float64
        return [s, s], s
    if isinstance(a, ScalarType) or isinstance(b, ScalarType):
        shaped = b if isinstance(a, ScalarType) else a
        scalar_w = weaks[0] if isinstance(a, ScalarType) else weaks[1]
        scalar_t = a if isinstance(a, ScalarType) else b
        if name == "div" and isinstance(a, ScalarType):
            raise TypeRuleError(f"dividing a scalar by a {b}", "multiply by the inverse instead")
        if not scalar_w and scalar_t.is_float and scalar_t != shaped.scalar:
            raise TypeRuleError(f"{name} of {shaped} and {scalar_t}",
                                f"cast the scalar: {shaped.scalar.name}(x)")
        s = shaped.scalar
        return ([s, shaped] if isinstance(a, ScalarType) else [shaped, s]), shaped
    if name == "div":
        raise TypeRuleError(f"dividing {a} by {b}", "use cw_div for component-wise division")
    return matmul(name, types, weaks)


def matmul(name, types, weaks):
    a, b = types
    if isinstance(a, MatrixType) and isinstance(b, VectorType) and a.cols == b.length and a.scalar == b.scalar:
        return [a, b], VectorType(a.rows, a.scalar)
    if isinstance(a, VectorType) and isinstance(b, MatrixType) and b.rows == a.length and a.scalar == b.scalar:
        return [a, b], VectorType(b.cols, a.scalar)
    if isinstance(a, MatrixType) and isinstance(b, MatrixType) and a.cols == b.rows and a.scalar == b.scalar:
        return [a, b], MatrixType(a.rows, b.cols, a.scalar)
    hint = "use cw_mul(a, b) for a component-wise product" if a == b and isinstance(a, VectorType) else ""
    raise TypeRuleError(f"cannot multiply {a} by {b}", hint)


def vector_args(name, types, weaks, *, result, same=True, lengths=None):
    for t in types:
        if not isinstance(t, VectorType):
            raise TypeRuleError(f"{name}() takes vectors, got {t}")
        if lengths and t.length not in lengths:
            raise TypeRuleError(f"{name}() takes vectors of length {' or '.join(map(str, lengths))}, got {t}")
    if same and len(set(types)) > 1:
        raise TypeRuleError(f"{name}() of {types[0]} and {types[1]}: vectors must have the same type")
    return list(types), result(*types)


def square_matrix(name, types, weaks, *, result, sizes=(2, 3, 4)):
    (m,) = types
    if not (isinstance(m, MatrixType) and m.rows == m.cols and m.rows in sizes):
        raise TypeRuleError(f"{name}() takes a square matrix of size {'/'.join(map(str, sizes))}, got {m}")
    return [m], result(m)


def index_type(t, weak) -> bool:
    return isinstance(t, ScalarType) and t.is_int or (weak and t == int32)


__all__ = ["TypeRuleError", "join", "scalar_of", "with_scalar", "float64", "int64"]
