"""Forward mode as an IR -> IR transform: forward Function -> tangent Function.

The tangent function takes the forward's parameters followed by one tangent parameter for each
float parameter (array or value), named by `tangent_name`, in the same order. It runs the forward
unchanged and, beside each statement, the statement's tangent: every float Temp gets a tangent
Temp (or none, where the tangent is structurally zero), every float Var a tangent Var, every load,
store and atomic add of a float array the same access of the tangent array. Control flow is the
forward's own (the tangent is taken along the path the forward takes), so dynamic loops, `while`,
`break`/`return` flags and branches need nothing more: no tape, no second pass.

Per-op rules live next to the ops in builtins.py and vector_ops.py (`OpDef.tangent`). An op with a
scalar result and an adjoint rule but no tangent rule (a @func_native with an adj_snippet) gets its
tangent from the adjoint rule seeded with 1: the sum over the arguments of (partial derivative) *
(tangent). A call of a @func with a @func_grad takes its tangent from the user's adjoint the same
way, one reverse run per output component, so forward and reverse mode agree on what the user said
the derivative is.

The result is ordinary forward IR: `adjoint.adjoint_function` differentiates it again, which is how
reverse-over-forward (Hessian-vector products) reuses every adjoint rule.
"""
from __future__ import annotations

from .. import ir
from ..builtins import OPS, construct_op
from ..types import ArrayType, MatrixType, ScalarType, VectorType, int32
from ..typing_rules import scalar_of
from .adjoint import AdjointUnsupported, RuleBuilder


class TangentUnsupported(AdjointUnsupported):
    """No exact tangent can be generated; `loc` is the user's line."""


def floating(t) -> bool:
    return scalar_of(t.dtype if isinstance(t, ArrayType) else t).is_float


def tangent_name(name: str, taken) -> str:
    """The tangent parameter's name for parameter `name`, distinct from every name in `taken`."""
    out = f"{name}_dot"
    while out in taken:
        out += "_"
    return out


def tangent_function(fn: ir.Function, name: str | None = None) -> ir.Function:
    """The tangent of `fn`: parameters ``fn.params + (tangent of each float parameter, in order)``.
    Raises TangentUnsupported at the user's line where no exact tangent exists (the float result
    of an atomic used by the kernel, atomic_min/max of values with tangents)."""
    taken = {p.name for p in fn.params}
    dparams: dict[str, ir.Param] = {}
    for p in fn.params:
        if floating(p.type):
            q = ir.Param(tangent_name(p.name, taken), p.type, len(fn.params) + len(dparams))
            taken.add(q.name)
            dparams[p.name] = q
    used = {a.id for s in ir.walk(fn.body) for a in ir.used_operands(s) if isinstance(a, ir.Temp)}
    body = _Tangent(dparams, used).block(fn.body)
    return ir.Function(name or fn.name + "_tangent", fn.params + tuple(dparams.values()), tuple(body),
                       fn.loc, fn.tid_ndim)


class _Tangent(RuleBuilder):
    def __init__(self, dparams: dict, used: set[int]):
        self.dparams = dparams
        self.used = used
        self.dtemp: dict[int, ir.Temp | None] = {}
        self.dvar: dict[int, ir.Var] = {}
        self.out: list = []
        self.loc = None

    # ---- the builder the per-op rules use --------------------------------------------------------
    def emit(self, s):
        self.out.append(s)

    def dense(self, d, t):
        """Tangent `d`, or the zero of type `t` where it is structurally zero."""
        return d if d is not None else ir.Const(0, t)

    def lin(self, d, f):
        """f(d) for a tangent d, None (zero) where d is."""
        return None if d is None else f(d)

    def plus(self, *terms):
        terms = [t for t in terms if t is not None]
        if not terms:
            return None
        total = terms[0]
        for t in terms[1:]:
            total = self.op("add", total, t)
        return total

    def minus(self, p, q):
        if q is None:
            return p
        return self.op("neg", q) if p is None else self.op("sub", p, q)

    def unsupported(self, what):
        raise TangentUnsupported(f"{what} has no tangent", self.loc)

    # ---- tangents of values ----------------------------------------------------------------------
    def d(self, x):
        """The tangent of operand `x` (a Temp or None for zero)."""
        return self.dtemp.get(x.id) if isinstance(x, ir.Temp) else None

    def dvar_of(self, v: ir.Var) -> ir.Var:
        if v.id not in self.dvar:
            self.dvar[v.id] = ir.Var(v.hint + "_dot", v.type)
        return self.dvar[v.id]

    def dref(self, r: ir.ArrayRef) -> ir.ArrayRef:
        return ir.ArrayRef(self.dparams[r.param.name])

    # ---- statements ------------------------------------------------------------------------------
    def block(self, body) -> list:
        saved, self.out = self.out, []
        for s in body:
            self.loc = s.loc
            getattr(self, "t_" + type(s).__name__)(s)
        result, self.out = self.out, saved
        return result

    def t_Op(self, s: ir.Op):
        self.emit(s)
        if not floating(s.out.type):
            return
        dargs = [self.d(a) for a in s.args]
        if all(d is None for d in dargs):
            return
        opdef = OPS[s.op]
        if opdef.tangent is not None:
            result = opdef.tangent(self, s.out, s.args, dargs)
        elif opdef.adjoint is None:
            result = None              # piecewise constant (floor, sign, ...): no adjoint, no tangent
        elif isinstance(s.out.type, ScalarType):
            result = self._from_adjoint(s, dargs)
        else:
            raise TangentUnsupported(f"{s.op}() has no tangent rule", s.loc)
        if result is not None and result.type != s.out.type:
            result = self._as(result, s.out.type)
        self.dtemp[s.out.id] = result

    def _from_adjoint(self, s: ir.Op, dargs):
        """Sum over args of d out/d arg * tangent, the partials from the adjoint rule seeded with 1."""
        partials: dict[int, list] = {}
        collector = _Collector(self, partials)
        OPS[s.op].adjoint(collector, ir.Const(1, s.out.type), s.out, *s.args)
        terms = []
        for a, da in zip(s.args, dargs):
            if da is not None and a.id in partials:
                g = self.plus(*partials.pop(a.id))
                terms.append(self.op("mul" if isinstance(a.type, ScalarType) else "inner", g, da))
        return self.plus(*terms)

    def t_ReadVar(self, s: ir.ReadVar):
        self.emit(s)
        if floating(s.var.type):
            dt = ir.Temp(s.var.type)
            self.emit(ir.ReadVar(dt, self.dvar_of(s.var), s.loc))
            self.dtemp[s.out.id] = dt

    def t_Assign(self, s: ir.Assign):
        self.emit(s)
        if floating(s.var.type):
            self.emit(ir.Assign(self.dvar_of(s.var), self.dense(self.d(s.value), s.var.type), s.loc))

    def t_ReadParam(self, s: ir.ReadParam):
        self.emit(s)
        if floating(s.param.type):
            dt = ir.Temp(s.param.type)
            self.emit(ir.ReadParam(dt, self.dparams[s.param.name], s.loc))
            self.dtemp[s.out.id] = dt

    def t_Load(self, s: ir.Load):
        self.emit(s)
        if floating(s.out.type):
            dt = ir.Temp(s.out.type)
            self.emit(ir.Load(dt, self.dref(s.array), s.indices, s.loc))
            self.dtemp[s.out.id] = dt

    def t_Store(self, s: ir.Store):
        self.emit(s)
        if floating(s.array.type):
            self.emit(ir.Store(self.dref(s.array), s.indices, self.dense(self.d(s.value), s.value.type), s.loc))

    def t_Atomic(self, s: ir.Atomic):
        self.emit(s)
        if not floating(s.array.type):
            return
        if s.out is not None and s.out.id in self.used:
            raise TangentUnsupported(f"the value returned by atomic_{s.kind}() is used; its tangent would need "
                                     "the value and its tangent updated as one atomic operation", s.loc)
        dv = self.d(s.value)
        if dv is None:
            return
        if s.kind in ("add", "sub"):
            self.emit(ir.Atomic(s.kind, None, self.dref(s.array), s.indices, dv, s.loc))
        else:
            raise TangentUnsupported(f"atomic_{s.kind}() of a value with a tangent: which thread's tangent "
                                     "lands depends on the race the value won", s.loc)

    def t_If(self, s: ir.If):
        self.emit(ir.If(s.cond, tuple(self.block(s.then)), tuple(self.block(s.orelse)), s.loc))

    def t_Loop(self, s: ir.Loop):
        self.emit(ir.Loop(tuple(self.block(s.body)), s.loc, s.counter, s.start, s.stop, s.step, s.exit_flags))

    def t_CustomReplay(self, s: ir.CustomReplay):
        # The forward runs `body` (the replay exists for the adjoint); so does its tangent.
        self.out.extend(self.block(s.body))

    def t_CustomAdjoint(self, s: ir.CustomAdjoint):
        self.out.extend(self.block(s.body))
        dins = [self.d(x) for x in s.inputs]
        for k, out in enumerate(s.outputs):
            self.dtemp[out.id] = None
            if not floating(out.type) or all(d is None for d in dins):
                continue
            if isinstance(out.type, MatrixType):
                raise TangentUnsupported("a @func_grad function returning a matrix has no tangent", s.loc)
            n = out.type.length if isinstance(out.type, VectorType) else 1
            rows = [self._custom_row(s, k, c if n > 1 else None, dins) for c in range(n)]
            if n == 1:
                self.dtemp[out.id] = rows[0]
            else:
                zero = ir.Const(0, out.type.scalar)
                self.dtemp[out.id] = self.op(construct_op(out.type), *(r if r is not None else zero for r in rows))

    def _custom_row(self, s: ir.CustomAdjoint, k: int, component, dins):
        """Row (k, component) of the user's Jacobian times the inputs' tangents: the user's adjoint
        run with that output component's adjoint 1 and every other 0 (a fresh copy of its IR)."""
        for j, var in enumerate(s.adj_outputs):
            seed = ir.Const(0, var.type)
            if j == k:
                seed = ir.Const(1, var.type) if component is None else \
                    self.op("insert", ir.Const(0, var.type), ir.Const(component, int32), ir.Const(1, var.type.scalar))
            self.emit(ir.Assign(var, seed, s.loc))
        for var in s.adj_inputs:
            if var is not None:
                self.emit(ir.Assign(var, ir.Const(0, var.type), s.loc))
        self.out.extend(_Fresh(s.reverse).block(s.reverse))
        terms = []
        for x, var, dx in zip(s.inputs, s.adj_inputs, dins):
            if var is not None and dx is not None:
                g = ir.Temp(var.type)
                self.emit(ir.ReadVar(g, var, s.loc))
                terms.append(self.op("mul" if isinstance(var.type, ScalarType) else "inner", g, dx))
        return self.plus(*terms)

    def _keep(self, s):
        self.emit(s)

    t_Print = t_ThreadIndex = t_ArrayDim = _keep


class _Collector:
    """The builder an adjoint rule gets in `_from_adjoint`: it builds through the tangent pass and
    collects `accum(arg, partial)` per argument instead of adding to adjoints."""

    def __init__(self, pass_: _Tangent, partials: dict):
        self.p, self.partials = pass_, partials

    def op(self, name, *args):
        return self.p.op(name, *args)

    def const(self, value, t):
        return ir.Const(value, t)

    def accum(self, x, value):
        if isinstance(x, ir.Temp) and scalar_of(x.type).is_float:
            self.partials.setdefault(x.id, []).append(self.p._as(value, x.type))

    def unsupported(self, what):
        self.p.unsupported(what)


class _Fresh(ir.Rewriter):
    """A copy of a block with fresh Temps (the same code may run several times in one function)."""

    def __init__(self, body):
        self.renamed = {t.id: ir.Temp(t.type) for s in ir.walk(body) for t in ir.defined_temps(s)}

    def operand(self, x):
        return self.renamed.get(x.id, x) if isinstance(x, ir.Temp) else x


__all__ = ["tangent_function", "tangent_name", "TangentUnsupported"]
