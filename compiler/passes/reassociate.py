"""Reassociating a transposed pass: a stencil's weight multiplies once, not once per neighbour.

The halo form's transposed pass (compiler/passes/gather.py, transpose.py) adds, for each offset c,
thread p - c's root times the factors between that root and the accumulation: a Laplacian's weight
w[k], 1/h^2, a sign. An 8th-order 3-D Laplacian's adjoint so multiplies 25 times per point where
its forward multiplies 5 times (it sums the six neighbours at distance k, then multiplies by w[k]),
and the compiler may not undo it: that would change the rounding. This pass does: where roots
reach an accumulation through the same factors, it sums the roots first and applies the factors
once, ``sum_c root(p - c) * w[k]`` becoming ``(sum_c root(p - c)) * w[k]``, as the forward does.
On an AVX2 machine (3-D 64^3, 8th order, one core, paired A/B: benchmarks/paired_adjoints.py) the
wave's adjoint got 21% faster, the FWI update's 7% (its pointwise pass is most of it).

The rounding is then not the one-pass form's: the gradient is the same sum in another order, within
a few units in the last place of it. It is still one fixed computation per element, on every
thread count, device and run; and a checkpointed gradient equals the store-all one bit for bit,
both running this kernel. A factor is *uniform*: the same value at every thread (a constant, a
scalar argument, an extent, an entry of an array the kernel does not write, at uniform indices,
and what is computed from these alone); two factors are the same when they are computed the same
way from the same sources. Applies to straight-line functions (the halo form's passes have no
branches); what is not a root times factors (the zero-offset pass's own terms) is added first, in
the order the pass added it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .. import ir


@dataclass(frozen=True)
class _Term:
    """A root (the Temp of a scratch load) times `factors`, applied in order: ("mul", key, operand),
    ("div", key, operand) or ("neg",)."""
    root: ir.Temp
    factors: tuple

    @property
    def key(self) -> tuple:
        return tuple(f[:2] for f in self.factors)


@dataclass(frozen=True)
class _Sum:
    """A value as a sum: `others` ((operand, negated) pairs: whatever is not a root times
    factors) plus `terms`."""
    others: tuple = ()
    terms: tuple = ()


_ZERO = _Sum()


def reassociated(fn: ir.Function, written: set[str]) -> ir.Function | None:
    """`fn` with each gradient accumulation's roots summed per factors (see the module docstring),
    or None where nothing shares its factors or `fn` branches. `written`: the arrays the kernel
    stores into (their entries are not uniform)."""
    if any(isinstance(s, (ir.If, ir.Loop, ir.ReverseLoop, ir.CustomAdjoint, ir.CustomReplay)) for s in fn.body):
        return None
    values = _Values(written)
    body, changed = [], False
    for s in fn.body:
        if isinstance(s, ir.AccumGrad) and isinstance(s.value, ir.Temp):
            total = values.temps.get(s.value.id)
            if total is not None and _shares_factors(total):
                ops, value = _rebuilt(total, s.loc)
                body += ops + [replace(s, value=value)]
                changed = True
                continue
        values.stmt(s)
        body.append(s)
    return replace(fn, body=tuple(body)) if changed else None


def _shares_factors(total: _Sum) -> bool:
    keys = [t.key for t in total.terms if t.factors]
    return len(set(keys)) < len(keys)


def _rebuilt(total: _Sum, loc) -> tuple[list, ir.Temp]:
    """Statements computing `total` with the roots of equal factors summed first, and its Temp."""
    ops: list = []

    def emit(op, *args):
        out = ir.Temp(args[0].type)
        ops.append(ir.Op(out, op, args, loc))
        return out

    acc = None
    for operand, negated in total.others:
        value = emit("neg", operand) if negated else operand
        acc = value if acc is None else emit("add", acc, value)
    groups: dict[tuple, list[_Term]] = {}
    for term in total.terms:
        groups.setdefault(term.key, []).append(term)
    for terms in groups.values():
        value = terms[0].root
        for term in terms[1:]:
            value = emit("add", value, term.root)
        for factor in terms[0].factors:
            value = emit("neg", value) if factor[0] == "neg" else emit(factor[0], value, factor[2])
        acc = value if acc is None else emit("add", acc, value)
    return ops, acc


class _Values:
    """What each Temp and local holds so far, as a `_Sum`, and the uniform ones' keys."""

    def __init__(self, written: set[str]):
        self.written = written
        self.temps: dict[int, _Sum] = {}
        self.vars: dict[int, _Sum] = {}
        self.keys: dict[int, tuple] = {}          # uniform Temp or local id -> how it is computed

    def key(self, x):
        if isinstance(x, ir.Const):
            return ("const", repr(x.value), x.type)
        return self.keys.get(x.id)

    def sum(self, x) -> _Sum:
        if isinstance(x, ir.Const):
            return _ZERO if x.value == 0 else _Sum(((x, False),))
        return self.temps.get(x.id) or _Sum(((x, False),))

    def stmt(self, s) -> None:
        out = getattr(s, "out", None)
        if isinstance(s, ir.ScratchLoad):
            self.temps[s.out.id] = _Sum(terms=(_Term(s.out, ()),))
        elif isinstance(s, ir.Assign):
            self.vars[s.var.id] = self.sum(s.value)
            self._uniform(s.var, self.key(s.value))
        elif isinstance(s, ir.ReadVar):
            if s.var.id in self.vars:
                self.temps[s.out.id] = self.vars[s.var.id]
            self._uniform(s.out, self.keys.get(s.var.id))
        elif isinstance(s, ir.Op):
            keys = [self.key(a) for a in s.args]
            if all(k is not None for k in keys):
                self.keys[s.out.id] = (s.op, *keys)
            else:
                value = self._op(s, keys)
                if value is not None and value.terms:
                    self.temps[s.out.id] = value
        elif isinstance(s, (ir.ReadParam, ir.ArrayDim)):
            name = s.param.name if isinstance(s, ir.ReadParam) else s.array.param.name
            self.keys[s.out.id] = (type(s).__name__, name, getattr(s, "axis", None))
        elif isinstance(s, ir.Load) and s.array.param.name not in self.written and not s.array.adjoint:
            keys = [self.key(i) for i in s.indices]
            if all(k is not None for k in keys):
                self.keys[s.out.id] = ("load", s.array.param.name, *keys)
        elif isinstance(out, ir.Temp):
            self.temps.pop(out.id, None)

    def _uniform(self, x, key) -> None:
        if key is not None:
            self.keys[x.id] = key
        else:
            self.keys.pop(x.id, None)

    def _op(self, s: ir.Op, keys: list) -> _Sum | None:
        """The sum `s` computes, where it is one of sums, differences and negations of sums and
        of products (quotients) of a sum of terms alone by a uniform factor."""
        if s.op in ("add", "sub"):
            a, b = (self.sum(x) for x in s.args)
            if s.op == "sub":
                b = _negated(b)
            return _Sum(a.others + b.others, a.terms + b.terms)
        if s.op == "neg":
            return _negated(self.sum(s.args[0]))
        if s.op in ("mul", "div"):
            at = 1 if keys[1] is not None else 0 if s.op == "mul" and keys[0] is not None else None
            if at is None:
                return None
            value = self.sum(s.args[1 - at])
            if value.others:
                return None
            factor = (s.op, keys[at], s.args[at])
            return _Sum(terms=tuple(_Term(t.root, t.factors + (factor,)) for t in value.terms))
        return None


def _negated(value: _Sum) -> _Sum:
    return _Sum(tuple((x, not negated) for x, negated in value.others),
                tuple(_Term(t.root, t.factors + (("neg",),)) for t in value.terms))


__all__ = ["reassociated"]
