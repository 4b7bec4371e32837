"""Which loop-carried Vars the reverse sweep must save per iteration, and which loops count their
iterations with a counter the write-once proof can use (`range_counter`, `while_counter`).

The reverse sweep replays iteration k from the Vars' values at the start of that iteration, so a Var
must be saved when the body reads its incoming value. Three kinds need no tape:
- the range counter, recomputed from the iteration index;
- Vars the body assigns before reading (dead on entry);
- linear accumulators (`s = s + e` / `s += e` and nothing else reads `s` in the body): their
  adjoint does not depend on their value.
"""
from __future__ import annotations

from collections import Counter as _Tally
from dataclasses import dataclass

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
    uses = _Tally()
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


@dataclass(frozen=True)
class Counter:
    """A loop's counter as the write-once proof sees it: `var` takes start, start + step, ... in the
    loop's successive iterations (a `range` loop's counter, or a while loop's induction variable)."""
    var: ir.Var
    start: object            # an operand; a Const where the proof compares against it
    step: object


def range_counter(loop: ir.Loop) -> Counter | None:
    return Counter(loop.counter, loop.start, loop.step) if loop.counter is not None else None


def while_counter(loop: ir.Loop, block, fn_body) -> Counter | str:
    """The induction variable of a while loop (`loop`, a statement of `block`), or why it has none.

    `t = <int constant>` in `block` before the loop, then ``while t < bound:`` (or ``<=``, ``>``,
    ``>=``, ``!=`` against a bound the loop does not change) whose body ends by ``t += <positive
    int constant>`` at its top level (every iteration that runs, once), with every other read of `t`
    in the body before that increment; no other assignment of `t` anywhere. Then iteration k runs
    with t = start + k * step, as a `range` loop's counter."""
    guard = _while_guard(loop)
    if guard is None:
        return "it is not a while loop"
    cond_op, then = guard
    produced = {s.out.id: s for s in ir.walk(fn_body) if getattr(s, "out", None) is not None}
    changed = {a.var.id for a in ir.walk(loop.body) if isinstance(a, ir.Assign)}
    reads = [a for a in cond_op.args if isinstance(a, ir.Temp) and isinstance(produced.get(a.id), ir.ReadVar)
             and _is_int(produced[a.id].var.type)]
    counter_read = next((a for a in reads if produced[a.id].var.id in changed), reads[0] if reads else None)
    if cond_op.op not in ("lt", "le", "gt", "ge", "ne") or counter_read is None:
        return "its condition is not a comparison of an int variable with a bound"
    var = produced[counter_read.id].var
    bound = next(a for a in cond_op.args if a is not counter_read)
    inside = {id(s) for s in ir.walk(loop.body)}
    if not _invariant(bound, produced, inside, loop):
        return f"its bound changes in the loop (the counter '{var.hint}' must be compared with a fixed bound)"
    assigns = [s for s in ir.walk(fn_body) if isinstance(s, ir.Assign) and s.var.id == var.id]
    starts = [s for s in assigns if id(s) not in inside]
    steps = [s for s in assigns if id(s) in inside]
    here = next(k for k, s in enumerate(block) if s is loop)
    if len(starts) != 1 or not any(s is starts[0] for s in block[:here]) or not _int_const(starts[0].value):
        return f"its counter '{var.hint}' is not set to an int constant just before the loop and nowhere else"
    if len(steps) != 1 or not any(s is steps[0] for s in then):
        return f"its counter '{var.hint}' is not changed exactly once in every iteration (only 't += constant' " \
               f"at the loop body's top level)"
    inc = steps[0]
    op = produced.get(getattr(inc.value, "id", None))
    reads = [a for a in getattr(op, "args", ()) if isinstance(a, ir.Temp) and isinstance(produced.get(a.id), ir.ReadVar)
             and produced[a.id].var.id == var.id]
    step = next((a for a in getattr(op, "args", ()) if _int_const(a)), None)
    if not isinstance(op, ir.Op) or op.op != "add" or len(reads) != 1 or step is None or step.value <= 0:
        return f"its counter '{var.hint}' is not increased by a positive constant ('{var.hint} += 1')"
    own = produced[reads[0].id]
    order = list(ir.walk(then))
    last = order.index(inc)
    if any(isinstance(s, ir.ReadVar) and s.var.id == var.id and s is not own for s in order[last + 1:]):
        return f"its counter '{var.hint}' is read after it is increased"
    return Counter(var, starts[0].value, step)


def _while_guard(loop):
    """(the condition's Op, the guarded body) of a lowered while loop: ``if cond: body else: broke = True``
    at the top level of the loop's body (compiler/frontend's `_loop`)."""
    if loop.counter is not None or not loop.exit_flags:
        return None
    broke = loop.exit_flags[0]
    for k, s in enumerate(loop.body):
        if isinstance(s, ir.If) and len(s.orelse) == 1 and isinstance(s.orelse[0], ir.Assign) \
                and s.orelse[0].var.id == broke.id:
            cond = next((c for c in loop.body[:k] if isinstance(c, ir.Op) and c.out is s.cond), None)
            return (cond, s.then) if cond is not None else None
    return None


def _invariant(operand, produced, inside, loop) -> bool:
    if isinstance(operand, ir.Const):
        return True
    s = produced.get(getattr(operand, "id", None))
    if s is None or id(s) not in inside:
        return True                           # computed before the loop
    if isinstance(s, (ir.ReadParam, ir.ArrayDim)):
        return True
    if isinstance(s, ir.ReadVar):
        return not any(isinstance(a, ir.Assign) and a.var.id == s.var.id for a in ir.walk(loop.body))
    if isinstance(s, ir.Op):
        return all(_invariant(a, produced, inside, loop) for a in s.args)
    return False


def _is_int(t) -> bool:
    return getattr(t, "name", "") in ("int32", "int64")


def _int_const(operand) -> bool:
    return isinstance(operand, ir.Const) and isinstance(operand.value, int) and not isinstance(operand.value, bool)
