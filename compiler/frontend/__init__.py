"""Python AST -> IR. Syntax only: typing rules live in typing_rules/builtins, codegen elsewhere.

Lowering choices that make the reverse sweep simple and exact:
- every user variable is a mutable `Var`; every expression result is a `Temp`;
- `break`, `continue` and `return` set flag Vars and the statements after them are guarded, so
  every started loop iteration runs to its end and control flow stays structured;
- inside a loop body, variables the body never assigns are read once before the loop into Temps
  (loop invariants), so replaying an iteration later sees the values the loop saw;
- `@func` calls are inlined; a conditional expression is an `if` statement, so only the taken side
  runs (no NaN from the other side leaks into gradients).
"""
from __future__ import annotations

import ast
import builtins as py_builtins

from .. import ir
from ..builtins import cast_op
from ..errors import CompileError
from ..func import Func, Source
from ..func import adjoint as adjoint_marker
from ..types import ArrayAnnotation, ArrayType, ScalarType, as_dtype, bool_, float32, int32, int64
from .calls import CallLowering, assigned_names
from .exprs import BINOPS, COMPONENTS, UNROLL_TRIPS, UNSUPPORTED, ExpressionLowering


class Scope:
    """The variables of one function body (a kernel or one inlined call of a func)."""

    def __init__(self, source: Source, namespace: dict, name: str):
        self.source, self.namespace, self.name = source, namespace, name
        self.locals: dict[str, object] = {}          # name -> Var | ArrayRef
        self.frozen: list[dict[str, ir.Temp]] = []   # loop-invariant reads, innermost last
        self.return_flag: ir.Var | None = None
        self.results: list[ir.Var] | None = None
        self.loops: list[tuple[ir.Var, ir.Var]] = []  # (break flag, continue flag) per loop


class Frontend(ExpressionLowering, CallLowering):
    def __init__(self, kernel_name: str):
        self.kernel_name = kernel_name
        self.blocks: list[list] = []
        self.scope: Scope | None = None
        self.call_stack: list[Func] = []
        self.tid_ndim = 0

    # ---- entry points ----------------------------------------------------------------------------
    def kernel(self, fn, namespace: dict) -> ir.Function:
        source = Source.of(fn)
        self.scope = Scope(source, namespace, fn.__name__)
        params = self._params(source, fn.__annotations__)
        body = self._block()
        with body:
            for p in params:
                loc = self.loc(source.tree)
                if isinstance(p.type, ArrayType):
                    self.scope.locals[p.name] = ir.ArrayRef(p)
                else:
                    t = self.emit_value(ir.ReadParam, p.type, param=p, loc=loc)
                    var = ir.Var(p.name, p.type)
                    self.emit(ir.Assign(var, t, loc))
                    self.scope.locals[p.name] = var
            self._function_body(source.tree.body, is_kernel=True)
        return ir.Function(fn.__name__, tuple(params), tuple(body.stmts), self.loc(source.tree),
                           max(self.tid_ndim, 1))

    def _params(self, source: Source, evaluated: dict) -> list[ir.Param]:
        """The kernel's parameters. An annotation Python already evaluated (a module without
        ``from __future__ import annotations``) is taken as it is, so a kernel made in a factory
        function can be typed by the factory's arguments, which its body does not see."""
        args = source.tree.args
        if args.vararg or args.kwarg or args.kwonlyargs or args.defaults:
            self.error(source.tree, "kernels take plain positional arguments only",
                       "remove *args, **kwargs, keyword-only arguments and defaults")
        params = []
        for k, a in enumerate(args.args):
            if a.annotation is None:
                self.error(a, f"argument '{a.arg}' needs a type annotation",
                           "e.g. x: stepper.array(dtype=float) or k: float")
            value = evaluated.get(a.arg)
            if isinstance(value, str):
                self._check_postponed(a.annotation)
            typed = value if isinstance(value, ArrayType) else None if value is None or isinstance(value, str) \
                else self._dtype(a.annotation, value)
            params.append(ir.Param(a.arg, typed or self.annotation(a.annotation), k))
        return params

    def _check_postponed(self, node) -> None:
        """An annotation Python left as a string (``from __future__ import annotations``) is read
        here in the kernel's namespace: its module's globals and what the body itself uses from
        enclosing functions. A factory's local type is neither; say so rather than 'unknown name'."""
        for name in ast.walk(node):
            if isinstance(name, ast.Name) and name.id not in self.scope.namespace and not hasattr(py_builtins, name.id):
                self.error(name, f"the annotation names '{name.id}', which this kernel cannot see: its module "
                                 "postpones annotations (from __future__ import annotations), so they are read "
                                 "as text in the module's globals, not in the function that made the kernel",
                           "remove that import from this module (annotations are then evaluated where the kernel "
                           "is defined), or define the type at module level")

    def annotation(self, node):
        if isinstance(node, ast.Call) and _spells_array_type(self._resolve_attr(node.func, quiet=True)):
            kw = {k.arg: self.python_value(k.value) for k in node.keywords}
            if node.args:
                kw.setdefault("dtype", self.python_value(node.args[0]))
            unknown = set(kw) - {"dtype", "ndim"}
            if unknown:
                self.error(node, f"unknown array annotation argument(s): {', '.join(sorted(unknown))}",
                           "write array(dtype=..., ndim=...)")
            ndim = kw.get("ndim", 1)
            if ndim not in (1, 2, 3, 4):
                self.error(node, f"arrays have 1 to 4 dimensions, got ndim={ndim!r}")
            return ArrayType(self._dtype(node, kw.get("dtype", float32)), ndim)
        value = self.python_value(node)
        if isinstance(value, ArrayType):
            return value
        return self._dtype(node, value)

    def _dtype(self, node, value):
        try:
            return as_dtype(value)
        except TypeError as e:
            self.error(node, str(e))

    # ---- blocks and emission ---------------------------------------------------------------------
    class _Collector:
        def __init__(self, fe):
            self.fe, self.stmts = fe, []

        def __enter__(self):
            self.fe.blocks.append(self.stmts)
            return self

        def __exit__(self, *exc):
            self.fe.blocks.pop()

    def _block(self):
        return Frontend._Collector(self)

    def emit(self, stmt):
        self.blocks[-1].append(stmt)

    def emit_value(self, kind, type_, **fields):
        out = ir.Temp(type_)
        self.emit(kind(out=out, **fields))
        return out

    def loc(self, node) -> ir.Loc:
        line, col = self.scope.source.position(node)
        return ir.Loc(self.scope.source.filename, line, col)

    def error(self, node, message, hint=""):
        src = self.scope.source
        line, col = src.position(node) if hasattr(node, "lineno") else (src.first_line, 0)
        raise CompileError(message, src.filename, line, col, src.line_text(line), hint)

    # ---- statements ------------------------------------------------------------------------------
    def _function_body(self, stmts, is_kernel):
        returns = [n for n in ast.walk(ast.Module(body=stmts, type_ignores=[])) if isinstance(n, ast.Return)]
        if any(r is not stmts[-1] for r in returns):
            flag = ir.Var("returned", bool_)
            self.emit(ir.Assign(flag, ir.Const(False, bool_), self.loc(stmts[0])))
            self.scope.return_flag = flag
        if is_kernel and any(r.value is not None for r in returns):
            self.error(next(r for r in returns if r.value is not None), "kernels cannot return a value",
                       "write results into an output array")
        self.statements(stmts)

    def statements(self, stmts):
        for k, st in enumerate(stmts):
            self.statement(st)
            if k + 1 < len(stmts) and self._may_jump(st):
                live = self._not_jumped(st)
                rest = self._block()
                with rest:
                    self.statements(stmts[k + 1:])
                self.emit(ir.If(live, tuple(rest.stmts), (), self.loc(stmts[k + 1])))
                return

    def _may_jump(self, st) -> bool:
        def visit(node, in_loop):
            if isinstance(node, ast.Return):
                return True
            if isinstance(node, (ast.Break, ast.Continue)):
                return not in_loop
            inner = in_loop or isinstance(node, (ast.For, ast.While))
            return any(visit(c, inner) for c in ast.iter_child_nodes(node))
        return visit(st, False)

    def _not_jumped(self, node) -> ir.Temp:
        flags = [f for f in ((self.scope.loops[-1] if self.scope.loops else ()) + (self.scope.return_flag,))
                 if f is not None]
        loc = self.loc(node)
        any_set = None
        for f in flags:
            v = self.read(f, loc)
            any_set = v if any_set is None else self.op("or", [any_set, v], node)
        return self.op("not", [any_set], node)

    def statement(self, st):
        handler = getattr(self, "stmt_" + type(st).__name__, None)
        if handler is None:
            message, hint = UNSUPPORTED.get(type(st), (f"'{type(st).__name__}' statements are not supported in kernels", ""))
            self.error(st, message, hint)
        handler(st)

    def stmt_Pass(self, st):
        pass

    def stmt_Expr(self, st):
        if isinstance(st.value, ast.Constant) and isinstance(st.value.value, str):
            return  # docstring
        self.expr(st.value, allow_none=True)

    def stmt_Assign(self, st):
        if len(st.targets) != 1:
            self.error(st, "chained assignment (a = b = ...) is not supported", "assign one target at a time")
        self.assign(st.targets[0], st.value, st)

    def stmt_AnnAssign(self, st):
        if st.value is None:
            self.error(st, "declare variables by assigning them a value")
        declared = self.annotation(st.annotation)
        if not isinstance(st.target, ast.Name):
            self.error(st, "annotated assignment needs a plain name")
        value = self.convert(self.expr(st.value), declared, st.value)
        self.store_name(st.target.id, value, st, declared)

    def assign(self, target, value_node, st):
        if isinstance(target, ast.Tuple):
            self.expected_values = len(target.elts)       # tid() gives as many indices as are unpacked
            try:
                values = self.expr(value_node, tuple_ok=True)
            finally:
                self.expected_values = 1
            if not isinstance(values, tuple) or len(values) != len(target.elts):
                n = len(values) if isinstance(values, tuple) else 1
                self.error(st, f"cannot unpack {n} value(s) into {len(target.elts)} names")
            for t, v in zip(target.elts, values):
                self.assign_value(t, v, st)
            return
        self.assign_value(target, self.expr(value_node), st)

    def assign_value(self, target, value, st):
        if isinstance(target, ast.Name):
            self.store_name(target.id, value, st)
        elif isinstance(target, ast.Subscript):
            self.store_subscript(target, value, st)
        elif isinstance(target, ast.Attribute) and target.attr in COMPONENTS:
            self.store_element(target.value, [ir.Const(COMPONENTS[target.attr], int32)], value, st)
        else:
            self.error(target, "cannot assign to this expression")

    def store_name(self, name, value, node, declared=None):
        if isinstance(value, ir.ArrayRef) or isinstance(value, tuple):
            self.error(node, f"cannot assign {'an array' if isinstance(value, ir.ArrayRef) else 'several values'} to '{name}'",
                       "arrays are passed as arguments; index them instead")
        for frozen in reversed(self.scope.frozen):
            if name in frozen:
                self.error(node, f"internal: '{name}' assigned inside a loop that treats it as invariant")
        current = self.scope.locals.get(name)
        if isinstance(current, ir.ArrayRef):
            self.error(node, f"cannot assign to array argument '{name}'", f"write {name}[i] = ... to store into it")
        if current is None:
            t = declared or value.type
            if declared is None and self.is_weak(value) and value.type.is_float:
                t = float32        # a weak value on its own is float32, as a literal is
            current = ir.Var(name, t)
            self.scope.locals[name] = current
        value = self.convert(value, current.type, node, name)
        self.emit(ir.Assign(current, value, self.loc(node)))

    def convert(self, value, target, node, name=None):
        """Make `value` a `target`: weak literals adopt it, ints widen to floats; else an error."""
        if value.type == target:
            return value
        if isinstance(value, ir.Const) and value.weak and isinstance(target, ScalarType):
            return ir.Const(value.value if target != bool_ else bool(value.value), target)
        if self.is_weak(value) and isinstance(target, ScalarType) and target != bool_ \
                and isinstance(value.type, ScalarType):
            return self.emit_value(ir.Op, target, op=cast_op(target), args=(value,), loc=self.loc(node))
        if isinstance(target, ScalarType) and isinstance(value.type, ScalarType) and not value.type.is_float \
                and (target.is_float or target == int64):
            return self.op(cast_op(target), [value], node)
        what = f"variable '{name}'" if name else "this value"
        self.error(node, f"{what} has type {target}, but the value assigned is a {value.type}",
                   f"a local keeps the type of its first assignment; write {target}(...) to convert")

    def store_subscript(self, target, value, st):
        base = self.expr(target.value)
        indices = self.indices(target.slice)
        if isinstance(base, ir.ArrayRef):
            self._check_index_count(base, indices, target)
            value = self.convert(value, base.type.dtype, st)
            self.emit(ir.Store(base, tuple(indices), value, self.loc(st)))
        else:
            self.store_element(target.value, indices, value, st)

    def store_element(self, base_node, indices, value, st):
        """`v[i] = x` on a local vector/matrix: v = insert(v, i, x), so it stays differentiable."""
        if not isinstance(base_node, ast.Name) or not isinstance(self.scope.locals.get(base_node.id), ir.Var):
            self.error(st, "element assignment needs a local vector or matrix variable")
        current = self.read(self.scope.locals[base_node.id], self.loc(st))
        updated = self.op("insert", [current, *indices, value], st)
        self.store_name(base_node.id, updated, st)

    def stmt_AugAssign(self, st):
        op = BINOPS.get(type(st.op))
        if op is None:
            self.error(st, f"operator {type(st.op).__name__} is not supported")
        t = st.target
        if isinstance(t, ast.Subscript) and isinstance(t.value, (ast.Name, ast.Attribute)) and op == "add" \
                and self._is_python_path(t.value) and self._resolve_attr(t.value, quiet=True) is adjoint_marker:
            self.accumulate_adjoint(t, st.value, st)
            return
        if isinstance(t, ast.Subscript):
            base = self.expr(t.value)
            if isinstance(base, ir.ArrayRef) and op in ("add", "sub"):
                # `a[i] += v` accumulates atomically, as in Warp, so threads can share targets.
                indices = self.indices(t.slice)
                self._check_index_count(base, indices, t)
                value = self.convert(self.expr(st.value), base.type.dtype, st)
                self.emit(ir.Atomic(op, None, base, tuple(indices), value, self.loc(st)))
                return
        current = self.expr(t)
        self.assign_value(t, self.op(op, [current, self.expr(st.value)], st), st)

    def stmt_Return(self, st):
        scope = self.scope
        if st.value is not None:
            values = self.expr(st.value, tuple_ok=True)
            values = values if isinstance(values, tuple) else (values,)
            if scope.results is None:
                # A weak value returned on its own is float32, as a literal is (see is_weak).
                scope.results = [ir.Var("result", float32 if self.is_weak(v) and v.type.is_float else v.type)
                                 for v in values]
            if len(values) != len(scope.results):
                self.error(st, f"this return gives {len(values)} value(s), an earlier one {len(scope.results)}")
            for var, v in zip(scope.results, values):
                self.emit(ir.Assign(var, self.convert(v, var.type, st, "return value"), self.loc(st)))
        if scope.return_flag is not None:
            self.emit(ir.Assign(scope.return_flag, ir.Const(True, bool_), self.loc(st)))

    def stmt_If(self, st):
        cond = self.condition(st.test)
        then, orelse = self._block(), self._block()
        with then:
            self.statements(st.body)
        with orelse:
            self.statements(st.orelse)
        self.emit(ir.If(cond, tuple(then.stmts), tuple(orelse.stmts), self.loc(st)))

    def stmt_Break(self, st):
        if not self.scope.loops:
            self.error(st, "'break' outside a loop")
        self.emit(ir.Assign(self.scope.loops[-1][0], ir.Const(True, bool_), self.loc(st)))

    def stmt_Continue(self, st):
        if not self.scope.loops:
            self.error(st, "'continue' outside a loop")
        self.emit(ir.Assign(self.scope.loops[-1][1], ir.Const(True, bool_), self.loc(st)))

    def stmt_For(self, st):
        it = st.iter
        if not (isinstance(it, ast.Call) and self._resolve_attr(it.func, quiet=True) is py_builtins.range):
            self.error(it, "for loops must iterate over range(...)", "write for i in range(n):")
        if st.orelse:
            self.error(st, "for ... else is not supported")
        if not isinstance(st.target, ast.Name):
            self.error(st.target, "the loop variable must be a plain name")
        if it.keywords or not 1 <= len(it.args) <= 3:
            self.error(it, "range() takes 1 to 3 positional arguments")
        bounds = [self.expr(a) for a in it.args]
        for a, b in zip(it.args, bounds):
            if not (isinstance(b.type, ScalarType) and b.type.is_int):
                self.error(a, f"range() bounds must be integers, got {b.type}", "convert with int(x)")
        if len(bounds) == 1:
            bounds = [ir.Const(0, int32, True)] + bounds
        if len(bounds) == 2:
            bounds.append(ir.Const(1, int32, True))
        if isinstance(bounds[2], ir.Const) and bounds[2].value == 0:
            self.error(it, "range() step must not be zero")
        index_type = int64 if any(b.type == int64 for b in bounds) else int32
        start, stop, step = (self.convert(b, index_type, st) for b in bounds)
        name = st.target.id
        counter = self.scope.locals.get(name)
        if not isinstance(counter, ir.Var):
            counter = ir.Var(name, index_type)
            self.scope.locals[name] = counter
        elif counter.type != index_type:
            self.error(st.target, f"variable '{name}' has type {counter.type}, the range gives {index_type}")
        trips = self._unrollable(st, start, stop, step)
        if trips is not None:
            self._unroll(st, counter, trips)
        else:
            self._loop(st, counter=counter, start=start, stop=stop, step=step)

    def _unrollable(self, st, start, stop, step):
        """The counter's values where a loop over range() is unrolled, else None: constant bounds,
        at most UNROLL_TRIPS trips, a body that neither jumps out of an iteration nor assigns the
        counter. Unrolled, a loop over neighbours or over a coefficient table is the same IR as the
        hand-written sum (constant offsets: the gather form of its adjoint; no loop tape)."""
        if not all(isinstance(b, ir.Const) for b in (start, stop, step)):
            return None
        values = range(start.value, stop.value, step.value)
        size = sum(1 for s in st.body for _ in ast.walk(s))
        if len(values) > UNROLL_TRIPS or len(values) * size > 4000 or st.target.id in assigned_names(
                ast.Module(body=st.body, type_ignores=[])):
            return None
        if any(self._may_jump(s) for s in st.body):      # break, continue, return
            return None
        return values

    def _unroll(self, st, counter: ir.Var, values) -> None:
        """The body once per value, the counter a constant in each copy (and the Var set too, for
        reads after the loop and inside nested loops, which read it through the Var)."""
        for v in values:
            value = ir.Const(v, counter.type)
            self.emit(ir.Assign(counter, value, self.loc(st)))
            self.scope.frozen.append({st.target.id: value})
            try:
                self.statements(st.body)
            finally:
                self.scope.frozen.pop()

    def stmt_While(self, st):
        if st.orelse:
            self.error(st, "while ... else is not supported")
        self._loop(st)

    def _loop(self, st, **range_fields):
        loc = self.loc(st)
        brk, cont = ir.Var("broke", bool_), ir.Var("continued", bool_)
        self.emit(ir.Assign(brk, ir.Const(False, bool_), loc))
        assigned = assigned_names(st)
        frozen = {}
        for name, binding in list(self.scope.locals.items()):
            if isinstance(binding, ir.Var) and name not in assigned:
                frozen[name] = self.read(binding, loc)
        self.scope.frozen.append(frozen)
        self.scope.loops.append((brk, cont))
        body = self._block()
        with body:
            self.emit(ir.Assign(cont, ir.Const(False, bool_), loc))
            if isinstance(st, ast.While):
                go = self.condition(st.test)
                inner = self._block()
                with inner:
                    self.statements(st.body)
                self.emit(ir.If(go, tuple(inner.stmts), (ir.Assign(brk, ir.Const(True, bool_), loc),), loc))
            else:
                self.statements(st.body)
        self.scope.loops.pop()
        self.scope.frozen.pop()
        exits = (brk,) + ((self.scope.return_flag,) if self.scope.return_flag is not None else ())
        self.emit(ir.Loop(tuple(body.stmts), loc, exit_flags=exits, **range_fields))

def _spells_array_type(fn) -> bool:
    """Whether calling `fn` in an annotation spells an array type: `array(...)` or `ArrayType(...)`."""
    return fn is ArrayType or (isinstance(fn, type) and issubclass(fn, ArrayAnnotation))


__all__ = ["Frontend"]
