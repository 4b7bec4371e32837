"""Proves that a kernel writes an array once per element and reads each element it writes only
after writing it: the recursions users write as histories, such as Taichi #2425's moving average

    for t in range(T):
        if t == 0:
            ys[i, t] = x[i, t]
        else:
            ys[i, t] = alpha * x[i, t] + (1 - alpha) * ys[i, t - 1]

For such an array the adjoint is exact as it stands: its replay of the forward loads each element
after the forward stored it, so it sees the values the forward saw, and the reverse sweep reaches a
store (which reads the element's gradient) only after every later load of that element has added to
it. Everything this module cannot prove stays refused by the launcher (`OverwriteError`).

What it proves, for array `A` (indices are affine: a thread index, a loop counter or a constant,
plus a constant offset; a loop counter is a `range` loop's, or a while loop's induction variable:
set to an int constant before the loop, compared with a fixed bound, increased by a positive
constant once at the end of every iteration: loop_analysis.while_counter):
- every store of `A` is injective over its executions: its index holds every `tid()` axis and the
  counter of every loop around it, each in its own component (counters with a constant positive
  step);
- no two stores write one element: a component tells them apart (different constants, or a
  constant below a counter's constant start), or they sit in the two branches of one `if` within
  the same iterations;
- every load of `A` reads, if a store writes the element at all, an element written before the
  load in the kernel's order: the same thread (same `tid()` components), and an earlier iteration of
  the innermost common loop that tells them apart, or the same iteration and an earlier statement.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import ir
from .loop_analysis import Counter, range_counter, while_counter


@dataclass(frozen=True)
class _Access:
    stmt: object                 # ir.Load or ir.Store
    index: tuple                 # per component: (base, offset), base None for a constant; None if not affine
    path: tuple                  # ((block key, position), ...) from the function body down
    loops: tuple                 # the ir.Loop statements around it, outermost first


def refusals(fn: ir.Function, names) -> dict[str, str]:
    """For each array name in `names` (arrays the kernel both loads and stores), why the write-once
    proof fails; names it proves are absent."""
    walker = _Walker(fn)
    out = {}
    for name in names:
        reason = walker.refusal(name)
        if reason is not None:
            out[name] = reason
    return out


class _Walker:
    def __init__(self, fn: ir.Function):
        self.affine: dict[int, tuple] = {}        # Temp id -> (base, offset)
        self.tid_vars: dict[int, tuple] = {}      # Var id -> ("tid", axis)
        self.tid_ndim = fn.tid_ndim
        self.accesses: dict[str, list[_Access]] = {}
        self.unprovable: dict[str, str] = {}
        assigned: dict[int, list] = {}
        for s in ir.walk(fn.body):
            if isinstance(s, ir.Assign):
                assigned.setdefault(s.var.id, []).append(s)
        thread = {s.out.id: ("tid", s.axis) for s in ir.walk(fn.body) if isinstance(s, ir.ThreadIndex)}
        for vid, stmts in assigned.items():
            if len(stmts) == 1 and isinstance(stmts[0].value, ir.Temp) and stmts[0].value.id in thread:
                self.tid_vars[vid] = thread[stmts[0].value.id]
        self.assigned = assigned
        self.affine.update({tid: (base, 0) for tid, base in thread.items()})
        self.counters: dict[int, Counter] = {}      # id(loop) -> its counter
        self.while_refusals: dict[int, str] = {}    # id(loop) -> why a while loop has no counter
        self._find_counters(fn.body, fn.body)
        self._walk(fn.body, (), (), "body")

    def _find_counters(self, block, fn_body):
        for s in block:
            if isinstance(s, ir.Loop):
                counter = range_counter(s) or while_counter(s, block, fn_body)
                if isinstance(counter, Counter):
                    self.counters[id(s)] = counter
                else:
                    self.while_refusals[id(s)] = f"the while loop at line {s.loc.lineno} is not counted by an " \
                                                 f"induction variable: {counter}"
                self._find_counters(s.body, fn_body)
            elif isinstance(s, ir.If):
                self._find_counters(s.then, fn_body)
                self._find_counters(s.orelse, fn_body)

    def counter(self, loop) -> Counter | None:
        return self.counters.get(id(loop))

    # -- collecting accesses and affine index values, in program order ----------------------------
    def _walk(self, body, path, loops, key):
        for pos, s in enumerate(body):
            here = (*path, (key, pos))
            if isinstance(s, ir.ReadVar):
                self._read_var(s, loops)
            elif isinstance(s, ir.Op):
                self._op(s)
            elif isinstance(s, (ir.Load, ir.Store)):
                index = tuple(self._value(i) for i in s.indices)
                access = _Access(s, None if None in index else index, here, loops)
                self.accesses.setdefault(s.array.param.name, []).append(access)
            elif isinstance(s, ir.Atomic):
                self.unprovable.setdefault(s.array.param.name, "it is also updated atomically")
            elif isinstance(s, ir.If):
                self._walk(s.then, here, loops, (id(s), "then"))
                self._walk(s.orelse, here, loops, (id(s), "else"))
            elif isinstance(s, ir.Loop):
                self._walk(s.body, here, (*loops, s), (id(s), "body"))
            elif isinstance(s, (ir.CustomAdjoint, ir.CustomReplay)):
                for inner in ir.walk(s.body):
                    if isinstance(inner, (ir.Load, ir.Store, ir.Atomic)):
                        self.unprovable.setdefault(inner.array.param.name,
                                                   "a function with a custom adjoint uses it")

    def _read_var(self, s, loops):
        # A while loop's counter is read before its increment (while_counter), so as the iteration's value.
        base = self.tid_vars.get(s.var.id)
        if base is None and any((c := self.counter(loop)) is not None and c.var.id == s.var.id and
                                (loop.counter is None or s.var.id not in self.assigned) for loop in loops):
            base = ("loop", s.var.id)
        if base is not None:
            self.affine[s.out.id] = (base, 0)

    def _value(self, operand):
        if isinstance(operand, ir.Const) and isinstance(operand.value, int) and not isinstance(operand.value, bool):
            return (None, operand.value)
        if isinstance(operand, ir.Temp):
            return self.affine.get(operand.id)
        return None

    def _op(self, s):
        if s.op not in ("add", "sub") or len(s.args) != 2:
            return
        a, b = (self._value(x) for x in s.args)
        if a is None or b is None:
            return
        if s.op == "add" and (a[0] is None or b[0] is None):
            base = a[0] if a[0] is not None else b[0]
            self.affine[s.out.id] = (base, a[1] + b[1])
        elif s.op == "sub" and b[0] is None:
            self.affine[s.out.id] = (a[0], a[1] - b[1])

    # -- the proof ---------------------------------------------------------------------------------
    def refusal(self, name) -> str | None:
        if name in self.unprovable:
            return self.unprovable[name]
        accesses = self.accesses.get(name, [])
        stores = [a for a in accesses if isinstance(a.stmt, ir.Store)]
        loads = [a for a in accesses if isinstance(a.stmt, ir.Load)]
        for a in accesses:
            if a.index is None:
                why = next((self.while_refusals[id(x)] for x in a.loops if id(x) in self.while_refusals), None)
                return (f"an index of '{name}' at line {a.stmt.loc.lineno} is not a thread index or a loop "
                        f"counter plus a constant" + (f" ({why})" if why else ""))
        for s in stores:
            reason = self._injective(s)
            if reason:
                return f"the store at line {s.stmt.loc.lineno} {reason}"
        for k, s1 in enumerate(stores):
            for s2 in stores[k + 1:]:
                if not self._disjoint(s1, s2) and not self._exclusive_same_iteration(s1, s2):
                    return (f"the stores at lines {s1.stmt.loc.lineno} and {s2.stmt.loc.lineno} may write the "
                            f"same element")
        for load in loads:
            for s in stores:
                reason = self._written_before(s, load)
                if reason:
                    return f"the load at line {load.stmt.loc.lineno} {reason} (store at line {s.stmt.loc.lineno})"
        return None

    def _injective(self, s) -> str | None:
        bases = [b for b, _ in s.index if b is not None]
        if len(bases) != len(set(bases)):
            return "uses one index variable in two components"
        for axis in range(self.tid_ndim):
            if ("tid", axis) not in bases:
                return f"does not use thread index {axis}, so threads could write the same element"
        for loop in s.loops:
            c = self.counter(loop)
            if c is None:
                return "is inside a loop that is not a range() or a counted while loop" + (
                    f" ({self.while_refusals[id(loop)]})" if id(loop) in self.while_refusals else "")
            if not _positive_step(c):
                return "is inside a loop that is not a range() with a constant positive step"
            if ("loop", c.var.id) not in bases:
                return f"does not use the counter '{c.var.hint}' of a loop around it, so its iterations " \
                       f"write the same element"
        return None

    def _disjoint(self, a, b) -> bool:
        """Whether no element is in both index sets, told apart by one component."""
        for (ba, oa), (bb, ob) in zip(a.index, b.index):
            if ba is None and bb is None and oa != ob:
                return True
            for (cb, co), (lb, lo), acc in (((ba, oa), (bb, ob), b), ((bb, ob), (ba, oa), a)):
                if cb is None and lb is not None and lb[0] == "loop":
                    c = next((c for x in acc.loops if (c := self.counter(x)) is not None and c.var.id == lb[1]), None)
                    if c is not None and isinstance(c.start, ir.Const) and co < c.start.value + lo:
                        return True
        return False

    def _same_thread(self, a, b) -> bool:
        for axis in range(self.tid_ndim):
            where = [(k, o) for k, (base, o) in enumerate(a.index) if base == ("tid", axis)]
            if where != [(k, o) for k, (base, o) in enumerate(b.index) if base == ("tid", axis)]:
                return False
        return True

    def _iteration_order(self, s, load):
        """-1 if the store's write of the load's element is in an earlier iteration of the common
        loops, +1 if later, 0 if the same iteration; None if the indices do not tell."""
        common = [loop for loop in s.loops if any(loop is x for x in load.loops)]
        for loop in common:
            key = ("loop", self.counter(loop).var.id)
            ks = [(k, o) for k, (b, o) in enumerate(s.index) if b == key]
            kl = [(k, o) for k, (b, o) in enumerate(load.index) if b == key]
            if len(ks) != 1 or len(kl) != 1 or ks[0][0] != kl[0][0]:
                return None
            d = kl[0][1] - ks[0][1]        # the store's counter = the load's + d, for the same element
            if d:
                return -1 if d < 0 else 1
        return 0

    def _exclusive_same_iteration(self, a, b) -> bool:
        return self._same_thread(a, b) and self._iteration_order(a, b) == 0 and _order(a, b) == "exclusive"

    def _written_before(self, s, load) -> str | None:
        if self._disjoint(s, load):
            return None
        if not self._same_thread(s, load):
            return "reads an element that another thread writes"
        order = self._iteration_order(s, load)
        if order is None:
            return "cannot be matched with the iteration that writes its element"
        if order > 0:
            return "reads an element that a later iteration writes"
        if order == 0 and _order(s, load) == "after":
            return "reads an element before the kernel writes it"
        return None


def _positive_step(counter: Counter) -> bool:
    return isinstance(counter.step, ir.Const) and isinstance(counter.step.value, int) and counter.step.value > 0


def _order(a, b) -> str:
    """Where statement `a` runs relative to `b` within one iteration of their common loops:
    "before", "after", or "exclusive" (the two branches of one if)."""
    for (ka, pa), (kb, pb) in zip(a.path, b.path):
        if ka != kb:
            return "exclusive"        # same statement (an if), different branches
        if pa != pb:
            return "before" if pa < pb else "after"
    return "after"                    # the same statement: a load and a store are never one
