"""If-conversion: an IR -> IR pass that turns branches of arithmetic into selects.

A branch in a thread body keeps the C++ compiler from vectorising the thread loop unless the
compiler if-converts it itself, which GCC does not do for our bodies. A branch whose sides only
compute (pure operations, reads and writes of locals, reads of scratch memory, which are in bounds
wherever the thread is, and reads of an array the body never writes at constant indices, made as
`Load.or_zero`: the same for every thread, hoisted out of its loop, zero if out of bounds, where
the forward would not have read; a plain load where the caller vouches for its bounds, as a gather
form's variants do, whose boxes are empty otherwise: GCC does not vectorise around a guarded load
of a value that a store in the loop might change) can run both sides on every thread: each write of a local that is read
after the branch becomes a select between the new value and the old one on the branch's condition
(a local read only inside the branch needs none: what the side not taken writes there is never
read). Values computed on the side not
taken are never kept, and a computation cannot trap (integer division by zero gives 0 in our
prelude, floats give inf or nan). A branch is converted only where the values it defines are read
under branches on the same condition alone (a replay's branch and its reverse sweep's), so every
reader of the not-taken side's values is itself predicated away.
A branch on a condition that settled tests made constant (`interior.py`) is replaced by the branch
taken. Expects verified IR; keeps it verified.
"""
from __future__ import annotations

import dataclasses

from .. import ir
from ..builtins import OPS
from ..types import bool_

_SAFE = (ir.ReadVar, ir.Assign, ir.ReadParam, ir.ThreadIndex, ir.ArrayDim, ir.ScratchLoad, ir.If)


def has_branches(fn: ir.Function) -> bool:
    """Whether `fn` (the output of select_branches) still branches."""
    return any(isinstance(s, ir.If) for s in ir.walk(fn.body))


def select_branches(fn: ir.Function, safe=frozenset()) -> ir.Function:
    """`fn` with each convertible branch (see the module docstring) replaced by selects. `safe`:
    ids of loads that are in bounds on every thread (an array that spans the launch, read at the
    thread's own index), which a converted branch may make. A body with loops is returned as it is
    (a local read only inside a branch may carry a value from one iteration to the next)."""
    if any(isinstance(s, (ir.Loop, ir.ReverseLoop)) for s in ir.walk(fn.body)):
        return fn
    uses: dict[int, int] = {}
    reads: dict[int, int] = {}
    for s in ir.walk(fn.body):
        for a in ir.used_operands(s):
            if isinstance(a, ir.Temp):
                uses[a.id] = uses.get(a.id, 0) + 1
        if isinstance(s, ir.ReadVar):
            reads[s.var.id] = reads.get(s.var.id, 0) + 1
    # per condition: the uses of each value made under a branch on it (a replay's branch and its
    # reverse sweep's test the same condition)
    under: dict[int, dict[int, object]] = {}
    for s in ir.walk(fn.body):
        if isinstance(s, ir.If) and isinstance(s.cond, ir.Temp):
            under.setdefault(s.cond.id, {}).update((id(x), x) for x in ir.walk(s.then + s.orelse))
    guarded: dict[int, dict[int, int]] = {}
    for cond, statements in under.items():
        counts = guarded[cond] = {}
        for x in statements.values():
            for a in ir.used_operands(x):
                if isinstance(a, ir.Temp):
                    counts[a.id] = counts.get(a.id, 0) + 1
    constant = {id(s) for s in table_loads(fn.body)}
    return dataclasses.replace(fn, body=tuple(_Convert(uses, reads, safe, guarded, constant).block(fn.body)))


def written_arrays(body) -> set[str]:
    """Names of the arrays (not gradients) that `body` stores into or updates atomically."""
    return {s.array.param.name for s in ir.walk(body) if isinstance(s, (ir.Store, ir.Atomic)) and not s.array.adjoint}


def table_loads(body) -> list:
    """`body`'s loads at constant indices of arrays it never writes (a coefficient table's w[r]):
    the same value at every thread."""
    written = written_arrays(body)
    return [s for s in ir.walk(body) if isinstance(s, ir.Load) and not s.array.adjoint
            and s.array.param.name not in written and all(isinstance(i, ir.Const) for i in s.indices)]


_LOGIC = {"and": lambda a, b: a and b, "or": lambda a, b: a or b, "not": lambda a: not a}


class _Convert:
    def __init__(self, uses, reads, safe, guarded, constant):
        self.uses, self.reads, self.safe, self.guarded = uses, reads, safe, guarded
        self.constant = constant         # ids of loads at constant indices of arrays nothing writes
        self.kept: set[int] = set()          # the Vars of the branch being converted read after it
        self.known: dict[int, bool] = {}     # conditions that settled tests make constant

    def _value(self, x):
        if isinstance(x, ir.Const) and x.type == bool_:
            return bool(x.value)
        return self.known.get(x.id) if isinstance(x, ir.Temp) else None

    def block(self, body) -> list:
        out = []
        for s in body:
            if isinstance(s, ir.Op) and s.op in _LOGIC:
                values = [self._value(a) for a in s.args]
                if None not in values:
                    self.known[s.out.id] = _LOGIC[s.op](*values)
            if isinstance(s, ir.If) and self._value(s.cond) is not None:
                out += self.block(s.then if self._value(s.cond) else s.orelse)     # the branch taken
            elif isinstance(s, ir.If) and self._convertible(s):
                # a local the branch writes needs a select only where something outside it reads it
                inner = list(ir.walk(s.then + s.orelse))
                inside: dict[int, int] = {}
                for x in inner:
                    if isinstance(x, ir.ReadVar):
                        inside[x.var.id] = inside.get(x.var.id, 0) + 1
                self.kept = {x.var.id for x in inner if isinstance(x, ir.Assign)
                             and inside.get(x.var.id, 0) < self.reads.get(x.var.id, 0)}
                out += self._predicated(s.then, s.cond, s.loc) + self._predicated(s.orelse, self._not(out, s.cond, s.loc),
                                                                                  s.loc)
            elif isinstance(s, ir.If):
                out.append(dataclasses.replace(s, then=tuple(self.block(s.then)), orelse=tuple(self.block(s.orelse))))
            else:
                out.append(s)
        return out

    def _convertible(self, s: ir.If) -> bool:
        inner = list(ir.walk(s.then + s.orelse))
        if not all(isinstance(x, _SAFE) or isinstance(x, ir.Op) and not OPS[x.op].definition or id(x) in self.safe
                   or id(x) in self.constant for x in inner):
            return False
        # every value defined inside is read only under a branch on the same condition
        defined = {t.id for x in inner for t in ir.defined_temps(x)}
        inside = self.guarded.get(s.cond.id, {}) if isinstance(s.cond, ir.Temp) else {}
        return all(inside.get(t, 0) == self.uses.get(t, 0) for t in defined)

    def _not(self, out, cond, loc):
        if isinstance(cond, ir.Const):
            return ir.Const(not cond.value, bool_)
        t = ir.Temp(bool_)
        out.append(ir.Op(t, "not", (cond,), loc))
        return t

    def _predicated(self, body, cond, loc) -> list:
        out = []
        for s in body:
            if isinstance(s, ir.If):
                then, other = ir.Temp(bool_), ir.Temp(bool_)
                negated = self._not(out, s.cond, s.loc)
                out += [ir.Op(then, "and", (cond, s.cond), s.loc), ir.Op(other, "and", (cond, negated), s.loc)]
                out += self._predicated(s.then, then, s.loc) + self._predicated(s.orelse, other, s.loc)
            elif id(s) in self.constant and id(s) not in self.safe:
                out.append(dataclasses.replace(s, or_zero=True))
            elif isinstance(s, ir.Assign) and s.var.id in self.kept:
                old, new = ir.Temp(s.var.type), ir.Temp(s.var.type)
                out += [ir.ReadVar(old, s.var, s.loc), ir.Op(new, "where", (cond, s.value, old), s.loc),
                        ir.Assign(s.var, new, s.loc)]
            else:
                out.append(s)
        return out


__all__ = ["has_branches", "select_branches", "table_loads", "written_arrays"]
