"""The op table: each op's typing rule, C++ name, adjoint rule and tangent rule, side by side.

An adjoint rule receives a builder `b`, the adjoint `g` of the op's result, the result `out` and the
op's arguments, and adds to the arguments' adjoints with `b.accum(arg, value)`, building values from
other builtins with `b.op(name, ...)`. Rules are written once for both targets; the reverse sweep is
plain IR like the forward. A tangent rule (forward mode, passes/tangent.py) receives `b`, `out`, the
arguments and their tangents (None where structurally zero) and returns the result's tangent, or
None; `b.lin(d, f)` is f(d) or None, `b.plus`/`b.minus` add tangents, `b.dense(d, t)` fills a zero.

The ops themselves are defined in builtins.py (scalars: arithmetic, comparisons, math, casts) and
vector_ops.py (vectors and matrices: constructors, products, element access); builtins.py is the
module the rest of the compiler reads the complete table from.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from typing import Callable

from . import typing_rules as tr

__all__ = ["OPS", "OpDef", "adjoint", "bilinear", "defop", "scalar_is_float", "tangent"]


@dataclass(frozen=True)
class OpDef:
    name: str
    typing: Callable
    c_name: str
    adjoint: Callable | None = None
    definition: str | None = None     # C++ source the op needs in its module (native functions)
    tangent: Callable | None = None   # forward mode; ops with scalar results may derive it from adjoint


OPS: dict[str, OpDef] = {}


def defop(name, typing, c_name=None):
    OPS[name] = OpDef(name, partial(typing, name), c_name or name)


def adjoint(*names):
    def register(rule):
        for n in names:
            OPS[n] = replace(OPS[n], adjoint=rule)
        return rule
    return register


def tangent(*names):
    def register(rule):
        for n in names:
            OPS[n] = replace(OPS[n], tangent=rule)
        return rule
    return register


def bilinear(name):
    """Products (mul, dot, cross, outer, ...): d(x op y) = dx op y + x op dy."""
    @tangent(name)
    def _(b, out, args, d):
        (x, y), (dx, dy) = args, d
        return b.plus(b.lin(dx, lambda t: b.op(name, t, y)), b.lin(dy, lambda t: b.op(name, x, t)))


def scalar_is_float(x) -> bool:
    return tr.scalar_of(x.type).is_float
