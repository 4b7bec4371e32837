"""Lowering of calls inside kernels: builtins, casts and constructors, atomics, print, and @func
inlining. A mixin of `Frontend`, kept apart so each file holds one concern."""
from __future__ import annotations

import ast
import builtins as py_builtins
import inspect
import re

from .. import ir
from ..builtins import OPS, PYTHON_BUILTINS, Builtin, cast_op, construct_op
from ..func import Func
from ..native import native_op
from ..types import ArrayType, MatrixType, ScalarType, VectorType, bool_, float32, int32, matrix, vector
from ..typing_rules import scalar_of

PY_CASTS = {int: int32, float: float32, bool: bool_}


def namespace_of(fn) -> dict:
    """The names a function body can see: its module's globals, then its closure's values."""
    ns = dict(fn.__globals__)
    ns.update(inspect.getclosurevars(fn).nonlocals)
    return ns


class CallLowering:
    expected_values = 1     # how many names the enclosing assignment unpacks (for tid()); set by assign()

    def expr_Call(self, node):
        callee = self._resolve_attr(node.func, quiet=True) if self._is_python_path(node.func) else None
        if isinstance(node.func, ast.Call) and self._is_python_path(node.func.func) \
                and self._resolve_attr(node.func.func, quiet=True) in (vector, matrix):
            callee = self.python_value(node.func)          # vector(3, float64)(x, y, z) builds a type, then a value
        if callee is None:
            self.error(node, f"'{ast.unparse(node.func)}' is not something kernels can call",
                       "call builtins, types such as vec3(...), or @func functions")
        if node.keywords:
            self.error(node, "keyword arguments are not supported in kernel calls", "pass arguments by position")
        if type(callee).__name__ == "Kernel":    # compiler.kernel imports this module: compare by name
            self.error(node, f"{ast.unparse(node.func)} is a @kernel, and kernels cannot call kernels",
                       "make it a @func (called per thread, inlined) or launch it from Python")
        if callee is py_builtins.print:
            return self.call_print(node)
        if isinstance(callee, Builtin) and callee.name == "tid":
            return self.call_tid(node)
        if isinstance(callee, Builtin) and callee.name.startswith("atomic_"):
            return self.call_atomic(node, callee.name[len("atomic_"):])
        if callee is py_builtins.len:
            arr = self.expr(node.args[0]) if len(node.args) == 1 else None
            if not isinstance(arr, ir.ArrayRef):
                self.error(node, "len() takes one array")
            return self.emit_value(ir.ArrayDim, int32, array=arr, axis=0, loc=self.loc(node))
        args = [self.expr(a) for a in node.args]
        for a, a_node in zip(args, node.args):
            if isinstance(a, ir.ArrayRef) and not isinstance(callee, Func):
                self.error(a_node, f"an array cannot be passed to {ast.unparse(node.func)}()", "index it first")
        if isinstance(callee, Func):
            return self.call_func(callee, args, node)
        if isinstance(callee, Builtin):
            if callee.name == "select":      # Warp's order: select(cond, value_if_false, value_if_true)
                if len(args) != 3:
                    self.error(node, "select() takes (cond, value_if_false, value_if_true)")
                args = [self._as_bool(args[0], node.args[0]), args[2], args[1]]
            elif callee.op == "where" and len(args) == 3:
                args = [self._as_bool(args[0], node.args[0]), *args[1:]]
            return self._builtin(callee.op, args, node)
        name = PYTHON_BUILTINS.get(callee) if _hashable(callee) else None
        if name is not None:
            return self._builtin(name, args, node)
        if _hashable(callee) and callee in PY_CASTS:
            callee = PY_CASTS[callee]
        if isinstance(callee, ScalarType):
            if len(args) != 1:
                self.error(node, f"{callee}() takes one value")
            if args[0].type == callee and not self.is_weak(args[0]):
                return args[0]
            if isinstance(args[0], ir.Const) and isinstance(args[0].type, ScalarType):
                return ir.Const(callee.np_dtype and _py(callee, args[0].value), callee)
            if not isinstance(args[0].type, ScalarType):
                self.error(node, f"cannot convert a {args[0].type} to {callee}")
            if self.is_weak(args[0]):       # an explicit type ends weak typing (see is_weak)
                return self.emit_value(ir.Op, callee, op=cast_op(callee), args=tuple(args), loc=self.loc(node))
            return self.op(cast_op(callee), args, node)
        if isinstance(callee, (VectorType, MatrixType)):
            if not args:
                return ir.Const(0, callee)
            return self.op(construct_op(callee), args, node)
        if callable(callee) and getattr(callee, "__module__", "").split(".")[0] == "compiler":
            self.error(node, f"{ast.unparse(node.func)}() cannot be called inside a kernel")
        if inspect.isfunction(callee) or inspect.isbuiltin(callee):
            self.error(node, f"'{ast.unparse(node.func)}' is a plain Python function, which kernels cannot call",
                       "decorate it with @stepper.func to make it a device function")
        self.error(node, f"'{ast.unparse(node.func)}' is a {type(callee).__name__}, which kernels cannot call")

    def _as_bool(self, c, node):
        return c if c.type == bool_ else self.condition(node)

    def _builtin(self, name, args, node):
        if name not in OPS:
            self.error(node, f"{name}() is not available in kernels")
        arity = {"clamp": 3, "where": 3}.get(name)
        if arity and len(args) != arity:
            self.error(node, f"{name}() takes {arity} arguments, got {len(args)}")
        if name in ("min", "max") and len(args) > 2:
            out = args[0]
            for a in args[1:]:
                out = self.op(name, [out, a], node)
            return out
        try:
            return self.op(name, args, node)
        except ValueError as e:
            # The typing rules unpack their argument types, so a wrong count surfaces here.
            count = re.match(r"(?:too many|not enough) values to unpack \(expected (\d+)", str(e))
            if count is None:
                raise
            self.error(node, f"{name}() takes {count.group(1)} argument(s), got {len(args)}",
                       f"call {name}() with {count.group(1)} argument(s)")

    def call_tid(self, node):
        if node.args:
            self.error(node, "tid() takes no arguments")
        n = self.expected_values
        if not 1 <= n <= 4:
            self.error(node, f"tid() gives 1 to 4 indices, not {n}")
        self.tid_ndim = max(self.tid_ndim, n)
        ids = tuple(self.emit_value(ir.ThreadIndex, int32, axis=k, loc=self.loc(node)) for k in range(n))
        return ids if n > 1 else ids[0]

    def call_atomic(self, node, kind):
        if len(node.args) < 3:
            self.error(node, f"atomic_{kind}(array, index..., value) needs an array, indices and a value")
        arr = self.expr(node.args[0])
        if not isinstance(arr, ir.ArrayRef):
            self.error(node.args[0], f"atomic_{kind}() needs an array as its first argument")
        indices = [self.expr(a) for a in node.args[1:-1]]
        for a, i in zip(node.args[1:-1], indices):
            if not (isinstance(i.type, ScalarType) and i.type.is_int):
                self.error(a, "indices must be integers")
        self._check_index_count(arr, indices, node)
        value = self.convert(self.expr(node.args[-1]), arr.type.dtype, node)
        if kind in ("min", "max") and not isinstance(arr.type.dtype, ScalarType):
            self.error(node, f"atomic_{kind}() works on scalar arrays only")
        out = ir.Temp(arr.type.dtype)
        self.emit(ir.Atomic(kind, out, arr, tuple(indices), value, self.loc(node)))
        return out

    def call_print(self, node):
        parts, args = [], []
        for a in node.args:
            if isinstance(a, ast.Constant) and isinstance(a.value, str):
                parts.append(a.value.replace("{", "{{").replace("}", "}}"))
            else:
                args.append(self.expr(a))
                parts.append("{}")
        self.emit(ir.Print(" ".join(parts), tuple(args), self.loc(node)))
        return None

    def call_func(self, func: Func, args, node):
        if func.native is not None:
            return self.call_native(func, args, node)
        if func.grad is None and func.replay is None:
            return self._inline(func, args, node)
        loc = self.loc(node)
        body = self._block()
        with body:
            values = self._inline(func, args, node)
        outs = values if isinstance(values, tuple) else (values,) if values is not None else ()
        if func.replay is not None:
            # Both bodies set the same result Vars, so the code after the call reads one value.
            results = [ir.Var("replayed", v.type) for v in outs]
            with body:
                for var, v in zip(results, outs):
                    self.emit(ir.Assign(var, v, loc))
            replay = self._block()
            with replay:
                again = self._inline(func.replay, args, node)
                again = again if isinstance(again, tuple) else (again,) if again is not None else ()
                if [v.type for v in again] != [v.type for v in outs]:
                    self.error(node, f"@func_replay of {func.__name__} returns {[str(v.type) for v in again]}, "
                                     f"but {func.__name__} returns {[str(v.type) for v in outs]}")
                for var, v in zip(results, again):
                    self.emit(ir.Assign(var, v, loc))
            wrapped = self._block()
            with wrapped:
                self.emit(ir.CustomReplay(tuple(body.stmts), tuple(replay.stmts), loc))
                outs = tuple(self.read(v, loc) for v in results)
            if func.grad is None:
                for stmt in wrapped.stmts:
                    self.emit(stmt)
                return outs if len(outs) > 1 else (outs[0] if outs else None)
            body = wrapped
        return self._custom_adjoint(func, args, outs, tuple(body.stmts), node)

    def _custom_adjoint(self, func, args, outs, body, node):
        grad = func.grad
        src = grad.source
        params = src.tree.args.args
        if len(params) != len(args) + len(outs):
            self.error(node, f"@func_grad of {func.__name__} must take {len(args)} input(s) and {len(outs)} output "
                             f"adjoint(s), but takes {len(params)} arguments")
        loc = self.loc(node)
        caller = self.scope
        scope = type(caller)(src, namespace_of(grad.fn), grad.__name__)
        adj_inputs, adj_outputs = [], []
        reverse = self._block()
        with reverse:
            for p, a in zip(params, args):
                if isinstance(a, ir.ArrayRef):
                    scope.locals[p.arg] = a
                    adj_inputs.append(None)
                    continue
                var = ir.Var(p.arg, a.type)
                self.emit(ir.Assign(var, a, loc))
                scope.locals[p.arg] = var
                adj_inputs.append(ir.Var("adj_" + p.arg, a.type) if _differentiable(a.type) else None)
            for p, out in zip(params[len(args):], outs):
                var = ir.Var(p.arg, out.type)
                scope.locals[p.arg] = var
                adj_outputs.append(var)
            scope.adjoint_targets = {p.arg: v for p, v in zip(params, adj_inputs) if v is not None}
            self.scope = scope
            self.call_stack.append(grad)
            try:
                self._function_body(src.tree.body, is_kernel=False)
            finally:
                self.call_stack.pop()
                self.scope = caller
        self.emit(ir.CustomAdjoint(body, tuple(args), tuple(outs), tuple(adj_inputs), tuple(adj_outputs),
                                   tuple(reverse.stmts), loc))
        return outs if len(outs) > 1 else (outs[0] if outs else None)

    def call_native(self, func, args, node):
        try:
            name = native_op(func)
        except ValueError as e:
            self.error(node, str(e))
        return self.op(name, args, node)

    def _inline(self, func: Func, args, node):
        if func in self.call_stack:
            chain = " -> ".join(f.__name__ for f in self.call_stack + [func])
            self.error(node, f"recursive call of @func {func.__name__} ({chain})",
                       "kernels inline functions, so recursion is not supported; write a loop")
        src = func.source
        params = src.tree.args.args
        if len(args) != len(params):
            self.error(node, f"{func.__name__}() takes {len(params)} argument(s), got {len(args)}")
        caller = self.scope
        callee_scope = type(caller)(src, namespace_of(func.fn), func.__name__)
        self.scope = callee_scope
        try:
            types = [self.annotation(p.annotation) if p.annotation is not None else None for p in params]
        finally:
            self.scope = caller
        bindings, constants = {}, {}
        assigned = _assigned_in(src.tree.body)
        for p, t, a, a_node in zip(params, types, args, node.args):
            if isinstance(a, ir.ArrayRef):
                if t is not None and (not isinstance(t, ArrayType) or t != a.type):
                    self.error(a_node, f"argument '{p.arg}' of {func.__name__}() expects {t}, got {a.type}")
                bindings[p.arg] = a
                continue
            if isinstance(t, ArrayType):
                self.error(a_node, f"argument '{p.arg}' of {func.__name__}() expects an array")
            t = t or a.type
            value = self.convert(a, t, a_node, p.arg)
            if p.arg not in assigned and not self.is_weak(value):
                # read-only: the value itself, so an index computed from it (``u[i + 1, j]`` with i
                # an argument) is the thread index plus a constant, as written out in the kernel
                constants[p.arg] = value
                continue
            var = ir.Var(p.arg, t)
            self.emit(ir.Assign(var, value, self.loc(node)))
            bindings[p.arg] = var
        callee_scope.locals.update(bindings)
        callee_scope.frozen.append(constants)
        self.scope = callee_scope
        self.call_stack.append(func)
        try:
            self._function_body(src.tree.body, is_kernel=False)
        finally:
            self.call_stack.pop()
            self.scope = caller
        if not callee_scope.results:
            return None
        loc = self.loc(node)
        values = tuple(self.read(v, loc) for v in callee_scope.results)
        return values if len(values) > 1 else values[0]

    def accumulate_adjoint(self, target, value_node, st):
        """`adjoint[x] += value` in a @func_grad body."""
        targets = getattr(self.scope, "adjoint_targets", None)
        if targets is None:
            self.error(st, "adjoint[...] is only available inside a @func_grad function")
        key = target.slice
        if not (isinstance(key, ast.Name) and key.id in targets):
            names = ", ".join(sorted(targets)) or "none"
            self.error(target, f"adjoint[...] takes the name of a differentiable input (here: {names})")
        var = targets[key.id]
        current = self.read(var, self.loc(st))
        total = self.op("add", [current, self.expr(value_node)], st)
        self.emit(ir.Assign(var, total, self.loc(st)))


def _assigned_in(body) -> set[str]:
    return set().union(*(assigned_names(st) for st in body))


def assigned_names(node) -> set[str]:
    """Names a statement assigns, including `v[i] = ...` and `v.x = ...` on local vectors."""
    names = set()
    for n in ast.walk(node):
        targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(
            n, (ast.AugAssign, ast.AnnAssign, ast.For)) else []
        for t in targets:
            for leaf in ast.walk(t):
                if isinstance(leaf, ast.Name) and (isinstance(leaf.ctx, ast.Store) or t is not leaf):
                    root = t
                    while isinstance(root, (ast.Subscript, ast.Attribute)):
                        root = root.value
                    if isinstance(root, ast.Name):
                        names.add(root.id)
                    if isinstance(leaf.ctx, ast.Store):
                        names.add(leaf.id)
    return names


def _differentiable(t) -> bool:
    return scalar_of(t).is_float


def _hashable(x) -> bool:
    try:
        hash(x)
        return True
    except TypeError:
        return False


def _py(t: ScalarType, value):
    if t == bool_:
        return bool(value)
    return float(value) if t.is_float else int(value)
