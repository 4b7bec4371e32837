"""Lowering of expressions inside kernels: names, literals, operators, comparisons, conditional
expressions and subscripts. A mixin of `Frontend` (syntax only; typing rules live in typing_rules.py
and the op table)."""
from __future__ import annotations

import ast
import math
import builtins as py_builtins

from .. import ir
from ..builtins import OPS
from ..types import ScalarType, as_dtype, bool_, float32, float64, int32, int64
from ..typing_rules import TypeRuleError

BINOPS = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div", ast.FloorDiv: "floordiv",
          ast.Mod: "mod", ast.Pow: "pow", ast.MatMult: "matmul"}
CMPOPS = {ast.Eq: "eq", ast.NotEq: "ne", ast.Lt: "lt", ast.LtE: "le", ast.Gt: "gt", ast.GtE: "ge"}
COMPONENTS = {"x": 0, "y": 1, "z": 2, "w": 3}
UNSUPPORTED = {
    ast.List: ("lists are not supported in kernels", "use a vector type such as vec3(a, b, c)"),
    ast.Dict: ("dicts are not supported in kernels", "pass arrays as kernel arguments"),
    ast.Set: ("sets are not supported in kernels", "use a vector type such as vec3(a, b, c)"),
    ast.Lambda: ("lambdas are not supported in kernels", "define a @func instead"),
    ast.ListComp: ("comprehensions are not supported in kernels", "write a for loop"),
    ast.DictComp: ("comprehensions are not supported in kernels", "write a for loop"),
    ast.SetComp: ("comprehensions are not supported in kernels", "write a for loop"),
    ast.GeneratorExp: ("generator expressions are not supported in kernels", "write a for loop"),
    ast.Try: ("try/except is not supported in kernels", "check conditions with if instead"),
    ast.With: ("with blocks are not supported in kernels",
               "enter context managers around the launch, in Python, not inside the kernel"),
    ast.FunctionDef: ("nested functions are not supported in kernels", "define a @func at module level"),
    ast.ClassDef: ("classes are not supported in kernels", "define classes at module level; pass data as arrays"),
    ast.Global: ("global statements are not supported in kernels", "pass values as arguments"),
    ast.Nonlocal: ("nonlocal statements are not supported in kernels", "pass values as arguments"),
    ast.Delete: ("del is not supported in kernels", "remove the del; locals end with the kernel"),
    ast.Raise: ("raise is not supported in kernels", "check inputs in Python before the launch, or use debug=True"),
    ast.Assert: ("assert is not supported in kernels", "use debug=True launches for bounds checks"),
    ast.Import: ("imports are not supported in kernels", "import at module level"),
    ast.ImportFrom: ("imports are not supported in kernels", "import at module level"),
    ast.JoinedStr: ("f-strings are not supported in kernels", "use print(\"x =\", x)"),
    ast.Starred: ("star-arguments are not supported in kernels", "pass each argument by position"),
    ast.Slice: ("slices are not supported in kernels", "index elements one at a time"),
}


class ExpressionLowering:
    def read(self, var: ir.Var, loc) -> ir.Temp:
        return self.emit_value(ir.ReadVar, var.type, var=var, loc=loc)

    # Weak values that are not constants: a choice between literals (`1.0 if c else 2.0`,
    # `select(c, -1.0, 1.0)`) and arithmetic on such choices. As in JAX they stay weakly typed: they
    # are computed in float64 (or int32) and adopt their context's type like a literal would.
    def is_weak(self, value) -> bool:
        if isinstance(value, ir.Const):
            return value.weak
        return isinstance(value, ir.Temp) and value.id in self.__dict__.get("_weak_temps", ())

    def mark_weak(self, value):
        self.__dict__.setdefault("_weak_temps", set()).add(value.id)
        return value

    def op(self, name, args, node) -> ir.Temp:
        folded = _fold_literals(name, args)
        if folded is not None:
            return folded
        values = args[1:] if name == "where" else args
        weak_result = name in _WEAK_OPS and all(map(self.is_weak, values)) \
            and all(isinstance(a.type, ScalarType) for a in values)
        if weak_result:
            # Compute at the widest precision; the context narrows the result once, correctly rounded.
            args = [_widen_weak(a) for a in args]
        opdef = OPS[name]
        try:
            # Operands all weak and widened: type them as what they now are (float64 or int32).
            weaks = [not weak_result and self.is_weak(a) for a in args]
            param_types, result = opdef.typing([a.type for a in args], weaks)
        except TypeRuleError as e:
            self.error(node, str(e), e.hint)
        args = [self.convert(a, t, node) if a.type != t else a for a, t in zip(args, param_types)]
        if name == "pow" and isinstance(args[1], ir.Const) and args[1].value == 2 and isinstance(result, ScalarType):
            # x ** 2 is x * x: one correctly rounded product on every target (CUDA's pow is not
            # correctly rounded: pow(0.3, 2.0) was 0.08999999999999998 on an H100), and cheaper.
            name, args = "mul", [args[0], args[0]]
        out = self.emit_value(ir.Op, result, op=name, args=tuple(args), loc=self.loc(node))
        if weak_result and result != bool_:
            self.mark_weak(out)
        return out

    def condition(self, node) -> ir.Operand:
        c = self.expr(node)
        if isinstance(c, ir.ArrayRef) or c.type != bool_ and not (isinstance(c.type, ScalarType)):
            self.error(node, f"a condition must be a bool or a number, got {getattr(c, 'type', 'an array')}")
        if c.type != bool_:
            c = self.op("ne", [c, ir.Const(0, c.type, True)], node)
        return c

    def expr(self, node, tuple_ok=False, allow_none=False):
        handler = getattr(self, "expr_" + type(node).__name__, None)
        if handler is None:
            message, hint = UNSUPPORTED.get(type(node), (f"'{type(node).__name__}' expressions are not supported in kernels", ""))
            self.error(node, message, hint)
        value = handler(node)
        if isinstance(value, tuple) and not tuple_ok:
            self.error(node, "this gives several values; unpack them: a, b = ...")
        if value is None and not allow_none:
            self.error(node, "this expression gives no value")
        return value

    def expr_Constant(self, node):
        v = node.value
        if isinstance(v, bool):
            return ir.Const(v, bool_)
        if isinstance(v, int):
            return ir.Const(v, int64 if abs(v) >= 2**31 else int32, True)
        if isinstance(v, float):
            return ir.Const(v, float32, True)
        self.error(node, f"{type(v).__name__} constants are not supported in kernels")

    def expr_Name(self, node):
        name = node.id
        for frozen in reversed(self.scope.frozen):
            if name in frozen:
                return frozen[name]
        binding = self.scope.locals.get(name)
        if isinstance(binding, ir.Var):
            return self.read(binding, self.loc(node))
        if binding is not None:
            return binding
        return self.constant(self._lookup(node, name), node)

    def _lookup(self, node, name):
        ns = self.scope.namespace
        if name in ns:
            return ns[name]
        if hasattr(py_builtins, name):
            return getattr(py_builtins, name)
        self.error(node, f"unknown name '{name}'", "define it before use, or pass it as a kernel argument")

    def constant(self, value, node):
        if isinstance(value, bool):
            return ir.Const(value, bool_)
        if isinstance(value, int):
            return ir.Const(value, int64 if abs(value) >= 2**31 else int32, True)
        if isinstance(value, float):
            return ir.Const(value, float32, True)
        if hasattr(value, "dtype") and getattr(value, "shape", None) == ():
            return ir.Const(value.item(), as_dtype(value.dtype))
        self.error(node, f"'{ast.unparse(node)}' is a {type(value).__name__}, which kernels cannot use as a value",
                   "kernels can capture numbers; pass arrays as arguments")

    def expr_Attribute(self, node):
        if node.attr in COMPONENTS and not self._is_python_path(node.value):
            base = self.expr(node.value)
            return self.op("extract", [base, ir.Const(COMPONENTS[node.attr], int32)], node)
        if node.attr == "shape" and not self._is_python_path(node.value):
            self.error(node, "use a.shape[k] with a constant k")
        return self.constant(self._resolve_attr(node), node)

    def _is_python_path(self, node) -> bool:
        while isinstance(node, ast.Attribute):
            node = node.value
        return isinstance(node, ast.Name) and node.id not in self.scope.locals and not any(
            node.id in f for f in self.scope.frozen)

    def _resolve_attr(self, node, quiet=False):
        """Evaluate a dotted name (`stepper.sin`, `math.pi`) in the kernel's namespace."""
        if isinstance(node, ast.Name):
            if quiet and node.id not in self.scope.namespace and not hasattr(py_builtins, node.id):
                return None
            return self._lookup(node, node.id)
        if isinstance(node, ast.Attribute):
            base = self._resolve_attr(node.value, quiet)
            if base is None and quiet:
                return None
            if not hasattr(base, node.attr):
                if quiet:
                    return None
                self.error(node, f"'{ast.unparse(node.value)}' has no attribute '{node.attr}'")
            return getattr(base, node.attr)
        if quiet:
            return None
        self.error(node, "expected a name")

    def python_value(self, node):
        """Evaluate an annotation-like expression (types, dtype keywords) at compile time."""
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Tuple):                     # matrix((3, 3), float64)
            return tuple(self.python_value(e) for e in node.elts)
        if isinstance(node, (ast.Name, ast.Attribute)):
            return self._resolve_attr(node)
        if isinstance(node, ast.Call):
            fn = self._resolve_attr(node.func)
            args = [self.python_value(a) for a in node.args]
            kwargs = {k.arg: self.python_value(k.value) for k in node.keywords}
            try:
                return fn(*args, **kwargs)
            except Exception as e:
                self.error(node, f"cannot evaluate '{ast.unparse(node)}': {e}")
        self.error(node, f"expected a type, got '{ast.unparse(node)}'")

    def expr_BinOp(self, node):
        name = BINOPS.get(type(node.op))
        if name is None:
            self.error(node, f"operator {type(node.op).__name__} is not supported in kernels")
        return self.op(name, [self.expr(node.left), self.expr(node.right)], node)

    def expr_UnaryOp(self, node):
        v = self.expr(node.operand)
        if isinstance(node.op, ast.USub):
            if isinstance(v, ir.Const) and isinstance(v.type, ScalarType) and v.type != bool_:
                return ir.Const(-v.value, v.type, v.weak)
            return self.op("neg", [v], node)
        if isinstance(node.op, ast.UAdd):
            return v
        if isinstance(node.op, ast.Not):
            return self.op("not", [self.condition(node.operand)], node)
        self.error(node, "bitwise ~ is not supported in kernels")

    def expr_BoolOp(self, node):
        name = "and" if isinstance(node.op, ast.And) else "or"
        result = self.condition(node.values[0])
        for v in node.values[1:]:
            result = self.op(name, [result, self.condition(v)], node)
        return result

    def expr_Compare(self, node):
        left, result = self.expr(node.left), None
        for op, right_node in zip(node.ops, node.comparators):
            name = CMPOPS.get(type(op))
            if name is None:
                self.error(node, f"comparison {type(op).__name__} is not supported in kernels")
            right = self.expr(right_node)
            c = self.op(name, [left, right], node)
            result = c if result is None else self.op("and", [result, c], node)
            left = right
        return result

    def expr_IfExp(self, node):
        cond = self.condition(node.test)
        then, orelse = self._block(), self._block()
        with then:
            a = self.expr(node.body)
        with orelse:
            b = self.expr(node.orelse)
        weak = self.is_weak(a) and self.is_weak(b) and isinstance(a.type, ScalarType) \
            and isinstance(b.type, ScalarType)
        if weak:       # a choice between literals stays weak (see is_weak)
            a, b = _widen_weak(a), _widen_weak(b)
        try:
            (_, ta, tb), t = OPS["where"].typing([bool_, a.type, b.type], [False, self.is_weak(a), self.is_weak(b)])
        except TypeRuleError as e:
            self.error(node, f"the two sides of the conditional expression differ: {e}", e.hint)
        result = ir.Var("ifexp", t)
        with then:
            self.emit(ir.Assign(result, self.convert(a, t, node), self.loc(node)))
        with orelse:
            self.emit(ir.Assign(result, self.convert(b, t, node), self.loc(node)))
        self.emit(ir.If(cond, tuple(then.stmts), tuple(orelse.stmts), self.loc(node)))
        out = self.read(result, self.loc(node))
        return self.mark_weak(out) if weak else out

    def expr_Tuple(self, node):
        return tuple(self.expr(e) for e in node.elts)

    def indices(self, node) -> list:
        parts = node.elts if isinstance(node, ast.Tuple) else [node]
        out = []
        for p in parts:
            v = self.expr(p)
            if isinstance(v, ir.ArrayRef) or not (isinstance(v.type, ScalarType) and v.type.is_int):
                self.error(p, f"indices must be integers, got {getattr(v, 'type', 'an array')}",
                           "convert with int(x)")
            out.append(v)
        return out

    def _check_index_count(self, arr, indices, node):
        if len(indices) != arr.type.ndim:
            self.error(node, f"array '{arr.param.name}' has {arr.type.ndim} dimension(s) but is indexed with "
                             f"{len(indices)}", f"write {arr.param.name}[{', '.join('ijkl'[:arr.type.ndim])}]")

    def expr_Subscript(self, node):
        if isinstance(node.value, ast.Attribute) and node.value.attr == "shape":
            arr = self.expr(node.value.value)
            if isinstance(arr, ir.ArrayRef):
                axis = node.slice
                if not (isinstance(axis, ast.Constant) and isinstance(axis.value, int)
                        and 0 <= axis.value < arr.type.ndim):
                    self.error(node, f"shape index must be a constant in 0..{arr.type.ndim - 1}")
                return self.emit_value(ir.ArrayDim, int32, array=arr, axis=axis.value, loc=self.loc(node))
        table = self._python_table(node.value)
        if table is not None:
            return self.constant(self._table_element(table, node), node)
        base = self.expr(node.value)
        indices = self.indices(node.slice)
        if isinstance(base, ir.ArrayRef):
            self._check_index_count(base, indices, node)
            return self.emit_value(ir.Load, base.type.dtype, array=base, indices=tuple(indices), loc=self.loc(node))
        if isinstance(base.type, ScalarType):
            self.error(node, f"cannot index a {base.type}")
        return self.op("extract", [base, *indices], node)


    def _python_table(self, node):
        """The tuple or list of numbers a captured Python name (or an element of one) holds, else
        None: a coefficient table (`W = (-2.5, 4 / 3, -1 / 12)`) or an offset table."""
        if isinstance(node, ast.Subscript):
            outer = self._python_table(node.value)
            return None if outer is None else _as_table(self._table_element(outer, node))
        if isinstance(node, (ast.Name, ast.Attribute)) and self._is_python_path(node):
            return _as_table(self._resolve_attr(node, quiet=True))
        return None

    def _table_element(self, table, node):
        """`table[index]` for the constant index of subscript `node` (a loop counter of an unrolled
        loop counts: compiler/frontend/__init__.py unrolls short constant loops)."""
        index = self.expr(node.slice)
        if not (isinstance(index, ir.Const) and isinstance(index.type, ScalarType) and index.type.is_int):
            self.error(node, f"'{ast.unparse(node.value)}' is a Python {type(table).__name__}: kernels index it with "
                             "constants only",
                       f"use a constant index, a loop over range() with constant bounds (at most {UNROLL_TRIPS} trips, "
                       "unrolled), or pass the table as an array argument")
        if not -len(table) <= index.value < len(table):
            self.error(node, f"index {index.value} is out of range for '{ast.unparse(node.value)}' "
                             f"({len(table)} elements)")
        return table[index.value]


# A loop over range() with constant bounds and at most this many trips is unrolled (frontend/__init__.py).
UNROLL_TRIPS = 16


def _as_table(value):
    return value if isinstance(value, (tuple, list)) else None


def _round_half_away(x):     # C's round(), which kernels use (Python's round() goes to even)
    return math.floor(x + 0.5) if x >= 0 else -math.floor(-x + 0.5)


_FOLDABLE = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
             "div": lambda a, b: a / b, "neg": lambda a: -a}
# Builtins of literals fold too (`cos(0.5)`, `sqrt(2.0)`): float results, except where noted below.
_FOLDABLE_FLOAT = {n: getattr(math, n) for n in ("sin", "cos", "tan", "asin", "acos", "atan", "sinh",
                                                  "cosh", "tanh", "exp", "log", "log2", "log10", "sqrt")}
_FOLDABLE_FLOAT.update(atan2=math.atan2, pow=math.pow, floor=lambda x: float(math.floor(x)),
                       ceil=lambda x: float(math.ceil(x)), round=lambda x: float(_round_half_away(x)))
# These keep integers integral, as the ops do.
_FOLDABLE_KEEP = {"abs": abs, "sign": lambda x: type(x)((x > 0) - (x < 0)), "min": min, "max": max,
                  "clamp": lambda x, lo, hi: min(max(x, lo), hi)}


def _fold_literals(name, args):
    """An expression of untyped number literals (`2.0 * 0.1`, `cos(0.5)`, `min(1.0, 2.0)`) is itself
    an untyped literal, as in JAX: it is computed here, in double precision, and adopts its
    context's type like a literal."""
    if name == "where" and isinstance(args[0], ir.Const) and not isinstance(args[0].value, (list, tuple)) \
            and all(isinstance(a, ir.Const) and a.weak for a in args[1:]):
        return args[1] if args[0].value else args[2]
    if not all(isinstance(a, ir.Const) and a.weak and isinstance(a.type, ScalarType) for a in args):
        return None
    values = [a.value for a in args]
    floats = any(isinstance(v, float) for v in values)
    try:
        if name in _FOLDABLE:
            if name == "div" and values[1] == 0:
                return None
            result = _FOLDABLE[name](*values)
            floats = floats or name == "div"
        elif name in _FOLDABLE_FLOAT and (floats or name != "pow"):   # pow of two ints stays an int op
            result, floats = _FOLDABLE_FLOAT[name](*map(float, values)), True
        elif name in _FOLDABLE_KEEP:
            result = _FOLDABLE_KEEP[name](*(map(float, values) if floats else values))
        else:
            return None
    except (ValueError, OverflowError, ZeroDivisionError):
        return None            # the kernel computes it (nan, inf) as it would at run time
    if floats:
        return ir.Const(float(result), float32, True)
    return ir.Const(result, int64 if abs(result) >= 2**31 else int32, True)


# Scalar operations whose result is weak when every operand is (constructors and casts are not).
_WEAK_OPS = {*_FOLDABLE, *_FOLDABLE_FLOAT, *_FOLDABLE_KEEP, "where", "floordiv", "mod"}


def _widen_weak(value):
    """A weak float literal as a float64 operand (an operation on weak values is computed in float64)."""
    if isinstance(value, ir.Const) and value.weak and isinstance(value.type, ScalarType) and value.type.is_float:
        return ir.Const(value.value, float64, True)
    return value
