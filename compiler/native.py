"""@func_native: user C++/CUDA snippets as ops of the builtin table.

Each native function becomes one op whose C++ definition travels with the kernels that use it
(`OpDef.definition`), with a `#line` pointing at the decorator so compiler errors in the snippet
point at the user's file. Its adjoint, when `adj_snippet` is given, is one extra op per input that
runs the snippet and returns that input's adjoint, so the reverse sweep stays plain IR.
"""
from __future__ import annotations

import ast

from .builtins import OPS, OpDef
from .func import Func
from .types import ArrayType, as_dtype
from .typing_rules import TypeRuleError, scalar_of


def _signature(func: Func):
    tree = func.source.tree
    ns = func.fn.__globals__
    params = []
    for a in tree.args.args:
        if a.annotation is None:
            raise ValueError(f"@func_native {func.__name__}: argument '{a.arg}' needs a type annotation")
        t = _annotation_type(a.annotation, ns, func.__name__)
        params.append((a.arg, t))
    if tree.returns is None:
        raise ValueError(f"@func_native {func.__name__} needs a return annotation (-> float, ...)")
    return params, _annotation_type(tree.returns, ns, func.__name__)


def _annotation_type(node, ns, name):
    try:
        value = eval(compile(ast.Expression(node), "<annotation>", "eval"), dict(ns))
        t = value if isinstance(value, ArrayType) else as_dtype(value)
    except Exception as e:
        raise ValueError(f"@func_native {name}: cannot use annotation '{ast.unparse(node)}' ({e})") from None
    if isinstance(t, ArrayType):
        raise ValueError(f"@func_native {name}: array arguments are not supported; pass values")
    return t


def native_op(func: Func) -> str:
    """The op name of native function `func`, registering it (and its adjoint ops) on first use."""
    name = f"native_{func.__name__}_{id(func):x}"
    if name in OPS:
        return name
    params, ret = _signature(func)
    src = func.native
    args = ", ".join(f"{t.ctype} {n}" for n, t in params)

    def typing(types, weaks):
        want = [t for _, t in params]
        if len(types) != len(want):
            raise TypeRuleError(f"{func.__name__}() takes {len(want)} argument(s), got {len(types)}")
        return want, ret

    here = f'#line {src.lineno} "{src.filename}"\n'
    definition = f"SP_FUNC {ret.ctype} {name}({args}) {{\n{here}{src.snippet}\n}}\n"
    if src.adj_snippet is None:
        def rule(b, g, out, *xs):
            # A gradient would have to flow through code we cannot differentiate: say so.
            b.unsupported(f"@func_native {func.__name__} (it has no adj_snippet)")
        OPS[name] = OpDef(name, typing, name, rule, definition)
        return name
    locals_ = "".join(f"    {t.ctype} adj_{n} = {t.ctype}();\n" for n, t in params)
    for k, (pname, ptype) in enumerate(params):
        if not scalar_of(ptype).is_float:
            continue
        adj_name = f"{name}_adj{k}"
        definition += (f"SP_FUNC {ptype.ctype} {adj_name}({args}, {ret.ctype} adj_ret) {{\n{locals_}"
                       f"{{\n{here}{src.adj_snippet}\n}}\n    return adj_{pname};\n}}\n")
        OPS[adj_name] = OpDef(adj_name, lambda ts, ws, t=ptype: ([p for _, p in params] + [ret], t), adj_name,
                              definition="")   # defined with the main op

    def rule(b, g, out, *xs):
        for k, (pname, ptype) in enumerate(params):
            if scalar_of(ptype).is_float:
                b.accum(xs[k], b.op(f"{name}_adj{k}", *xs, g))
    OPS[name] = OpDef(name, typing, name, rule, definition)
    return name
