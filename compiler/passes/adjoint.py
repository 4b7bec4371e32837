"""Reverse mode as an IR -> IR transform: forward Function -> adjoint Function.

The adjoint function replays the forward without side effects (no stores, atomics or prints), then
runs the reverse sweep. Loops are handled exactly, whatever their trip counts:
- during the replay each iteration of a loop pushes, at its end, the values its carried Vars had at
  its start (only those `loop_analysis.saved_vars` selects) and counts its iterations;
- the reverse sweep walks the iterations backwards: pop the carried values, recompute the body
  forward (nested loops run again, without pushing), then reverse the body (nested loops pop
  what they pushed during the replay, which sits on top of the tape at that moment).
The tape therefore holds exactly what the replay pushed, which a counting run of the same replay
measures before the launch, so it is sized per launch and never truncates.

Gradients accumulate into adjoint Vars; an adjoint is zeroed once consumed, so temps defined in a
loop body start each reverse iteration from zero while carried Vars keep accumulating.
"""
from __future__ import annotations

from .. import ir
from ..builtins import OPS, cast_op
from ..types import ScalarType, bool_, int64
from ..typing_rules import scalar_of
from .loop_analysis import saved_vars


class AdjointUnsupported(Exception):
    def __init__(self, message: str, loc: ir.Loc):
        super().__init__(message)
        self.loc = loc


def differentiable(t) -> bool:
    return scalar_of(t).is_float


def adjoint_function(fn: ir.Function) -> ir.Function:
    """The adjoint of `fn` (same parameters; adjoint arrays are `ArrayRef(param, adjoint=True)`).
    Raises AdjointUnsupported with the user's location when no exact adjoint can be generated."""
    used = {a.id for s in ir.walk(fn.body) for a in ir.used_operands(s) if isinstance(a, ir.Temp)}
    sweep = _Sweep(used)
    replay = sweep.replay(fn.body, push=True)
    reverse = sweep.reverse(fn.body)
    mark = ir.ReverseMark(ir.Loc("<adjoint>", 0))      # codegen stops there in counting mode
    # Every adjoint starts at -0.0, not at the +0.0 its C++ declaration holds: then the first add
    # into it (-0.0 + g == g for every g) folds away, and a chain of adjoints through a sum (a
    # stencil's terms) costs nothing, in each copy that a gather form makes of it too.
    zeros = [ir.Assign(v, ir.Const(-0.0 if differentiable(v.type) else 0, v.type), fn.loc) for v in sweep.adj.values()]
    return ir.Function(fn.name + "_adjoint", fn.params, tuple(replay) + (mark,) + tuple(zeros) + tuple(reverse),
                       fn.loc, fn.tid_ndim)


def is_reverse_mark(s) -> bool:
    return isinstance(s, ir.ReverseMark)


class RuleBuilder:
    """What the per-op rules (builtins.py, vector_ops.py) build with, adjoint and tangent rules
    alike: typed ops appended through the subclass's `emit`, at its current `loc`."""

    def op(self, name, *args) -> ir.Temp:
        types, result = OPS[name].typing([a.type for a in args], [isinstance(a, ir.Const) and a.weak for a in args])
        args = tuple(self._as(a, t) for a, t in zip(args, types))
        out = ir.Temp(result)
        self.emit(ir.Op(out, name, args, self.loc))
        return out

    def _as(self, a, t):
        if a.type == t:
            return a
        if isinstance(a, ir.Const):
            return ir.Const(a.value, t)
        return self.op(cast_op(t), a)

    def const(self, value, t) -> ir.Const:
        return ir.Const(value, t)


class _Sweep(RuleBuilder):
    def __init__(self, used_temps: set[int]):
        self.used = used_temps
        self.adj: dict[int, ir.Var] = {}
        self.touched: set[int] = set()
        self.trips: dict[int, ir.Var] = {}      # id(loop) -> its iteration count
        self.saved: dict[int, tuple] = {}
        self.out: list = []
        self.loc = None
        self.current_op = None

    # ---- replay ---------------------------------------------------------------------------------
    def replay(self, body, push: bool) -> list:
        out = []
        for s in body:
            if isinstance(s, (ir.Store, ir.Print)):
                continue
            if isinstance(s, ir.Atomic):
                if s.out is not None and s.out.id in self.used:
                    raise AdjointUnsupported(
                        f"the value returned by atomic_{s.kind}() is used, and the adjoint's replay of the "
                        "forward cannot reproduce it (other threads may have moved it on)", s.loc)
                continue
            if isinstance(s, ir.If):
                out.append(ir.If(s.cond, tuple(self.replay(s.then, push)), tuple(self.replay(s.orelse, push)), s.loc))
            elif isinstance(s, ir.CustomAdjoint):
                out.extend(self.replay(s.body, push=False))    # its reverse is the user's: pops nothing
            elif isinstance(s, ir.CustomReplay):
                out.extend(self.replay(s.replay, push))
            elif isinstance(s, ir.Loop):
                out.extend(self._replay_loop(s, push))
            else:
                out.append(s)
        return out

    def _replay_loop(self, loop: ir.Loop, push: bool) -> list:
        trips = self.trips.setdefault(id(loop), ir.Var("trips", int64))
        saved = self.saved.setdefault(id(loop), saved_vars(loop))
        loc = loop.loc
        count = ir.Temp(int64)
        head = [ir.ReadVar(count, trips, loc)]
        bumped = ir.Temp(int64)
        head += [ir.Op(bumped, "add", (count, ir.Const(1, int64)), loc), ir.Assign(trips, bumped, loc)]
        start_values = [ir.Temp(v.type) for v in saved]
        tail = []
        if push and saved:
            head += [ir.ReadVar(t, v, loc) for t, v in zip(start_values, saved)]
            tail = [ir.Push(tuple(start_values), loc)]
        body = tuple(head) + tuple(self.replay(loop.body, push)) + tuple(tail)
        return [ir.Assign(trips, ir.Const(0, int64), loc),
                ir.Loop(body, loc, loop.counter, loop.start, loop.stop, loop.step, loop.exit_flags)]

    # ---- reverse --------------------------------------------------------------------------------
    def reverse(self, body) -> list:
        saved_out = self.out
        self.out = []
        for s in reversed(body):
            self.loc = s.loc
            handler = getattr(self, "rev_" + type(s).__name__, None)
            if handler is not None:
                handler(s)
        result, self.out = self.out, saved_out
        return result

    def emit(self, stmt):
        self.out.append(stmt)

    def adjoint_of(self, x) -> ir.Var:
        key = x.id
        if key not in self.adj:
            self.adj[key] = ir.Var("adj_" + (x.hint if isinstance(x, ir.Var) else x.name), x.type)
        return self.adj[key]

    def take(self, x) -> ir.Temp:
        """Read and clear the adjoint of temp or var `x`."""
        adj = self.adjoint_of(x)
        g = ir.Temp(x.type)
        self.emit(ir.ReadVar(g, adj, self.loc))
        # Reset to -0.0, not +0.0: -0.0 + g == g for every g, so the C++ compiler may drop the add
        # that starts the next accumulation; with +0.0 it may not (+0.0 + -0.0 is +0.0).
        self.emit(ir.Assign(adj, ir.Const(-0.0 if differentiable(x.type) else 0, x.type), self.loc))
        return g

    def accum(self, x, value):
        if not isinstance(x, ir.Temp) or not differentiable(x.type):
            return
        adj = self.adjoint_of(x)
        cur = ir.Temp(x.type)
        total = ir.Temp(x.type)
        self.emit(ir.ReadVar(cur, adj, self.loc))
        self.emit(ir.Op(total, "add", (cur, self._as(value, x.type)), self.loc))
        self.emit(ir.Assign(adj, total, self.loc))
        self.touched.add(x.id)

    def unsupported(self, what):
        raise AdjointUnsupported(f"{what} has no adjoint", self.loc)

    def _accum_var(self, var: ir.Var, value):
        adj = self.adjoint_of(var)
        cur, total = ir.Temp(var.type), ir.Temp(var.type)
        self.emit(ir.ReadVar(cur, adj, self.loc))
        self.emit(ir.Op(total, "add", (cur, value), self.loc))
        self.emit(ir.Assign(adj, total, self.loc))

    # ---- per statement ----------------------------------------------------------------------------
    def rev_Op(self, s: ir.Op):
        if s.out.id not in self.touched:
            return
        rule = OPS[s.op].adjoint
        g = self.take(s.out)
        if rule is not None and differentiable(s.out.type):
            rule(self, g, s.out, *s.args)

    def rev_ReadVar(self, s: ir.ReadVar):
        if s.out.id in self.touched and differentiable(s.var.type):
            self._accum_var(s.var, self.take(s.out))

    def rev_Assign(self, s: ir.Assign):
        if differentiable(s.var.type):
            self.accum(s.value, self.take(s.var))

    def rev_Load(self, s: ir.Load):
        if s.out.id in self.touched and differentiable(s.out.type):
            self.emit(ir.AccumGrad(s.array, s.indices, self.take(s.out), s.loc))

    def _grad_at(self, s) -> ir.Temp:
        g = ir.Temp(s.array.type.dtype)
        self.emit(ir.ReadGrad(g, s.array, s.indices, s.loc))
        return g

    def rev_Store(self, s: ir.Store):
        if differentiable(s.array.type.dtype):
            self.accum(s.value, self._grad_at(s))

    def rev_Atomic(self, s: ir.Atomic):
        if not differentiable(s.array.type.dtype):
            return
        g = self._grad_at(s)
        if s.kind == "add":
            self.accum(s.value, g)
        elif s.kind == "sub":
            self.accum(s.value, self.op("neg", g))
        else:
            # The value that won the min/max gets the gradient (ties: all winners), as in Warp.
            final = ir.Temp(s.array.type.dtype)
            self.emit(ir.Load(final, s.array, s.indices, s.loc))
            self.accum(s.value, self.op("where", self.op("eq", final, s.value), g, ir.Const(0, g.type)))

    def rev_If(self, s: ir.If):
        self.emit(ir.If(s.cond, tuple(self.reverse(s.then)), tuple(self.reverse(s.orelse)), s.loc))

    def rev_Loop(self, loop: ir.Loop):
        loc = loop.loc
        trips, saved = self.trips[id(loop)], self.saved[id(loop)]
        for v in ir.assigned_vars(loop.body):
            self.touched.add(v.id)
        count = ir.Temp(int64)
        self.emit(ir.ReadVar(count, trips, loc))
        index = ir.Var("iteration", int64)
        body: list = []
        if saved:
            body.append(ir.Pop(saved, loc))
        if loop.counter is not None:
            k, offset, value = ir.Temp(int64), ir.Temp(loop.counter.type), ir.Temp(loop.counter.type)
            body.append(ir.ReadVar(k, index, loc))
            kk = k
            if loop.counter.type != int64:
                kk = ir.Temp(loop.counter.type)
                body.append(ir.Op(kk, cast_op(loop.counter.type), (k,), loc))
            body += [ir.Op(offset, "mul", (kk, loop.step), loc), ir.Op(value, "add", (loop.start, offset), loc),
                     ir.Assign(loop.counter, value, loc)]
        body += self.replay(loop.body, push=False)
        body += self.reverse(loop.body)
        self.emit(ir.ReverseLoop(index, count, tuple(body), loc))

    def rev_CustomReplay(self, s: ir.CustomReplay):
        self.out.extend(self.reverse(s.replay))

    def rev_CustomAdjoint(self, s: ir.CustomAdjoint):
        for out, var in zip(s.outputs, s.adj_outputs):
            self.emit(ir.Assign(var, self.take(out) if out.id in self.touched else ir.Const(0, var.type), s.loc))
        for var in s.adj_inputs:
            if var is not None:
                self.emit(ir.Assign(var, ir.Const(0, var.type), s.loc))
        self.out.extend(s.reverse)
        for x, var in zip(s.inputs, s.adj_inputs):
            if var is not None:
                total = ir.Temp(var.type)
                self.emit(ir.ReadVar(total, var, s.loc))
                self.accum(x, total)


__all__ = ["adjoint_function", "AdjointUnsupported", "RuleBuilder", "is_reverse_mark", "differentiable", "bool_", "ScalarType"]
