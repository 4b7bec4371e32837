"""Which loop-carried Vars the reverse sweep must save per iteration.

The reverse sweep replays iteration k from the Vars' values at the start of that iteration, so a Var
must be saved when the body reads its incoming value. Three kinds need no tape:
- the range counter, recomputed from the iteration index;
- Vars the body assigns before reading (dead on entry);
- linear accumulators (`s = s + e` / `s += e` and nothing else reads `s` in the body): their
  adjoint does not depend on their value.
"""
from __future__ import annotations

from collections import Counter

from .. import ir


def saved_vars(loop: ir.Loop) -> tuple[ir.Var, ...]:
    """The Vars whose value at the start of each iteration of `loop` must go on the tape."""
    assigned = {v.id: v for v in ir.assigned_vars(loop.body)}
    assigned.pop(getattr(loop.counter, "id", None), None)
    live = _live_in(loop.body)
    accumulators = _linear_accumulators(loop.body)
    return tuple(v for vid, v in assigned.items() if vid in live and vid not in accumulators)


def _live_in(body) -> set[int]:
    """Ids of Vars read in `body` before any definite assignment at the top level of `body`."""
    defined, live = set(), set()
    for s in body:
        for inner in ir.walk((s,)):
            if isinstance(inner, ir.ReadVar) and inner.var.id not in defined:
                live.add(inner.var.id)
        if isinstance(s, ir.Assign):
            defined.add(s.var.id)
    return live


def _linear_accumulators(body) -> set[int]:
    stmts = list(ir.walk(body))
    uses = Counter()
    user = {}
    for s in stmts:
        for a in ir.used_operands(s):
            if isinstance(a, ir.Temp):
                uses[a.id] += 1
                user[a.id] = s
    reads: dict[int, list[ir.ReadVar]] = {}
    for s in stmts:
        if isinstance(s, ir.ReadVar):
            reads.setdefault(s.var.id, []).append(s)
    result = set()
    for vid, rs in reads.items():
        if all(_accumulates(r, uses, user) for r in rs):
            result.add(vid)
    return result


def _accumulates(read: ir.ReadVar, uses, user) -> bool:
    t = read.out
    if uses[t.id] != 1:
        return False
    op = user[t.id]
    if not (isinstance(op, ir.Op) and (op.op == "add" or op.op == "sub" and op.args[0] is t)):
        return False
    if uses[op.out.id] != 1:
        return False
    back = user[op.out.id]
    return isinstance(back, ir.Assign) and back.var.id == read.var.id
