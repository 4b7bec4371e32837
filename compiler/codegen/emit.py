"""IR -> C++/CUDA source. One C-family emitter; the targets differ only in `targets.py`.

The emitter renders one thread's work as a function over hoisted locals (every Temp and Var is
declared once, zero-initialised, at the top, so values survive across blocks for the reverse sweep),
then the target wraps it in entry points. `#line` directives map each statement to the user's file.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import re

import numpy as np

from .. import ir
from ..builtins import OPS
from ..types import ArrayType, MatrixType, ScalarType, VectorType

ARRAY_SLOT = 72          # bytes of one array argument: data pointer, shape[4], strides[4]


def slot_size(t) -> int:
    """Bytes an argument of type `t` takes in the packed argument buffer (8-byte aligned)."""
    if isinstance(t, ArrayType):
        return ARRAY_SLOT
    return (t.size + 7) // 8 * 8


def arg_offsets(params) -> list[int]:
    offsets, at = [], 0
    for p in params:
        offsets.append(at)
        at += slot_size(p.type)
    return offsets


def literal(value, t) -> str:
    if isinstance(t, (VectorType, MatrixType)):
        plain_zero = value == 0 and not math.copysign(1.0, value) < 0
        return f"{t.ctype}()" if plain_zero else f"{t.ctype}({literal(value, t.scalar)})"
    if t.name == "bool":
        return "true" if value else "false"
    if t.is_float:
        v = float(np.float32(value)) if t.name == "float32" else float(value)
        suffix = "f" if t.name == "float32" else ""
        if math.isinf(v):
            return f"{'-' if v < 0 else ''}sp::inf_{'f32' if suffix else 'f64'}()"
        if math.isnan(v):
            return f"(sp::inf_{'f32' if suffix else 'f64'}() * 0{'.0f' if suffix else '.0'})"
        return f"{v.hex()}{suffix}"
    return f"int64_t({int(value)})" if t.name == "int64" else str(int(value))


def arg_name(name: str) -> str:
    """A kernel argument's identifier in the generated C++: the user's name, prefixed, so that no
    Python name collides with ours (`A`, `G`, `L`, `tp`, `t0`, `tid_0`) or is a C++ keyword (`new`,
    `default`). Its gradient is `grad_name`."""
    return "a_" + name


def grad_name(name: str) -> str:
    return "g_" + name


class FunctionEmitter:
    """Renders the thread body of one IR function as C++ statements."""

    def __init__(self, fn: ir.Function, *, debug: bool, sites: list, tables: frozenset = frozenset()):
        self.fn = fn
        self.debug = debug
        self.tables = tables          # tables whose values the caller passes in T (codegen/memory.py `table_reads`)
        self.sites = sites            # (kernel, array, loc) per bounds-checked access, shared per module
        self.lines: list[str] = []
        self.indent = 1
        self.last_loc = None
        self.loops = 0

    @functools.cached_property
    def _body(self) -> tuple:
        """The body with its temps and vars numbered from 0 (`_Numbered`); only the body's
        renderings need it, not the argument struct's."""
        return tuple(_Numbered().block(self.fn.body))

    # ---- declarations ---------------------------------------------------------------------------
    def declarations(self) -> list[str]:
        temps, vars_ = {}, {}
        for s in ir.walk(self._body):
            for t in ir.defined_temps(s):
                temps[t.id] = t
            for a in ir.used_operands(s):
                if isinstance(a, ir.Temp):
                    temps[a.id] = a
            for v in _vars_of(s):
                vars_[v.id] = v
        out = [f"    {t.type.ctype} {t.name} = {literal(0, t.type)};" for t in temps.values()]
        out += [f"    {v.type.ctype} {v.name} = {literal(0, v.type)};" for v in vars_.values()]
        return out

    def args_struct(self, name: str) -> str:
        """The packed argument buffer as a struct: every slot starts on 8 bytes (emit.arg_offsets)."""
        fields = "".join(f"    alignas(8) {_param_ctype(p)} {arg_name(p.name)};\n" for p in self.fn.params)
        fields = fields or "    char unused;\n"
        return f"struct alignas(8) {name} {{\n{fields}}};"

    def params(self, adjoint: bool) -> list[str]:
        out = []
        for p in self.fn.params:
            out.append(f"    const {_param_ctype(p)}& {arg_name(p.name)} = A.{arg_name(p.name)};")
            if adjoint and isinstance(p.type, ArrayType):
                out.append(f"    const {_param_ctype(p)}& {grad_name(p.name)} = G.{arg_name(p.name)};")
        return out

    # ---- statements -----------------------------------------------------------------------------
    def body(self) -> list[str]:
        self.block(self._body)
        return self.lines

    def line(self, text):
        self.lines.append("    " * self.indent + text)

    def at(self, loc):
        if loc and loc.lineno > 0 and loc != self.last_loc:
            self.lines.append(f'#line {loc.lineno} "{loc.filename}"')
            self.last_loc = loc

    def block(self, stmts):
        for s in stmts:
            self.at(s.loc)
            getattr(self, "s_" + type(s).__name__)(s)

    def x(self, a) -> str:
        if isinstance(a, ir.Const):
            return literal(a.value, a.type)
        return a.name

    def ref(self, r: ir.ArrayRef) -> str:
        return (grad_name if r.adjoint else arg_name)(r.param.name)

    def checked(self, r: ir.ArrayRef, indices, loc, text):
        idx = ", ".join(self.x(i) for i in indices)
        if not self.debug:
            self.line(text)
            return
        site = len(self.sites)
        self.sites.append((self.fn.name, r.param.name, loc))
        self.line(f"if (sp::in_bounds({self.ref(r)}, {idx})) {{ {text} }} "
                  f"else {{ report_out_of_bounds({site}, {_index_list(indices, self.x)}); }}")

    def s_Op(self, s):
        opdef = OPS[s.op]
        qualified = opdef.c_name if opdef.definition is not None else "sp::" + opdef.c_name
        self.line(f"{s.out.name} = {qualified}({', '.join(self.x(a) for a in s.args)});")

    def s_CustomAdjoint(self, s):
        self.block(s.body)

    def s_CustomReplay(self, s):
        self.block(s.body)

    def s_ReadVar(self, s):
        self.line(f"{s.out.name} = {s.var.name};")

    def s_Assign(self, s):
        self.line(f"{s.var.name} = {self.x(s.value)};")

    def s_ReadParam(self, s):
        self.line(f"{s.out.name} = {arg_name(s.param.name)};")

    def s_ThreadIndex(self, s):
        self.line(f"{s.out.name} = (int32_t)tid_{s.axis};")

    def s_ArrayDim(self, s):
        self.line(f"{s.out.name} = (int32_t){self.ref(s.array)}.shape[{s.axis}];")

    def s_Load(self, s):
        idx = ", ".join(self.x(i) for i in s.indices)
        if s.array.param.name in self.tables and not s.array.adjoint:
            self.line(f"{s.out.name} = T.{arg_name(s.array.param.name)}[{idx}];")
            return
        if s.or_zero:       # in bounds by construction: nothing to check
            self.line(f"{s.out.name} = sp::load_or_zero({self.ref(s.array)}, {idx});")
            return
        self.checked(s.array, s.indices, s.loc, f"{s.out.name} = sp::load({self.ref(s.array)}, {idx});")

    def s_Store(self, s):
        idx = ", ".join(self.x(i) for i in s.indices)
        self.checked(s.array, s.indices, s.loc, f"*sp::address({self.ref(s.array)}, {idx}) = {self.x(s.value)};")

    def s_Atomic(self, s):
        idx = ", ".join(self.x(i) for i in s.indices)
        launch = ", L" if s.kind in ("add", "sub") else ""         # adds a launch may log (prelude.h)
        call = f"sp::atomic_{s.kind}_at(sp::address({self.ref(s.array)}, {idx}), {self.x(s.value)}{launch});"
        self.checked(s.array, s.indices, s.loc, (f"{s.out.name} = " if s.out is not None else "") + call)

    def s_AccumGrad(self, s):
        idx = ", ".join(self.x(i) for i in s.indices)
        grad = grad_name(s.array.param.name)
        has = f"sp::has_grad<KNOWN, HAS, {s.array.param.index}>({grad})" if s.array.param.index < 64 else f"{grad}.data"
        if s.fresh_bit is not None:
            self.line(f"if ({has}) sp::gather_grad(sp::address({grad}, {idx}), {self.x(s.value)}, "
                      f"(tp.fresh >> {s.fresh_bit}) & 1);")
            return
        serial = "1" if s.exclusive else "tp.serial"
        self.line(f"if ({has}) sp::accum_grad(sp::address({grad}, {idx}), {self.x(s.value)}, {serial}, L);")

    def s_ReadGrad(self, s):
        idx = ", ".join(self.x(i) for i in s.indices)
        k = s.array.param.index
        known = "KNOWN, HAS" if k < 64 else "0, 0"
        self.line(f"{s.out.name} = sp::read_grad<{known}, {min(k, 63)}>({grad_name(s.array.param.name)}, {idx});")

    def s_ScratchStore(self, s):
        self.line(f"{self._scratch(s, s.value.type.ctype)} = {self.x(s.value)};")

    def s_ScratchLoad(self, s):
        self.line(f"{s.out.name} = {self._scratch(s, s.out.type.ctype)};")

    def _scratch(self, s, ctype: str) -> str:
        """The scratch element a ScratchStore or ScratchLoad names (prelude.h's sp::scratch); its
        array's elements are the launch's threads, or a halo form's own count."""
        count = "L.n" if s.count is None else self.x(s.count)
        row = "" if s.row is None else f", {self.x(s.row)}"
        return f"sp::scratch<{ctype}>(tp, {count}, {s.offset}, {self.x(s.index)}{row})"

    def s_Print(self, s):
        values = [v for a in s.args for v in _printf(self.x(a), a.type)[1]]
        self.line(f'printf("{_escape_format(s.fmt, s.args, self.x)}\\n"{"".join(", " + v for v in values)});')

    def s_If(self, s):
        self.line(f"if ({self.x(s.cond)}) {{")
        self.nested(s.then)
        if s.orelse:
            self.line("} else {")
            self.nested(s.orelse)
        self.line("}")

    def nested(self, stmts):
        self.indent += 1
        self.block(stmts)
        self.indent -= 1

    def s_Loop(self, s):
        k = f"k{self.loops}_"
        self.loops += 1
        self.line(f"for (int64_t {k} = 0;; ++{k}) {{")
        self.indent += 1
        if s.exit_flags:
            self.line(f"if ({' || '.join(f.name for f in s.exit_flags)}) break;")
        if s.counter is not None:
            c, t = s.counter.name, s.counter.type.ctype
            start, stop, step = self.x(s.start), self.x(s.stop), self.x(s.step)
            self.line(f"{c} = ({t})({start} + ({t}){k} * {step});")
            self.line(f"if (!({step} > 0 ? {c} < {stop} : ({step} < 0 && {c} > {stop}))) break;")
        self.block(s.body)
        self.indent -= 1
        self.line("}")

    def s_ReverseLoop(self, s):
        i = s.index.name
        self.line(f"for ({i} = {self.x(s.count)} - 1; {i} >= 0; --{i}) {{")
        self.nested(s.body)
        self.line("}")

    def s_ReverseMark(self, s):
        self.line("if (tp.count_only) return;")

    def s_Push(self, s):
        for v in s.values:
            self.line(f"sp::push(tp, {self.x(v)});")

    def s_Pop(self, s):
        for v in reversed(s.vars):
            self.line(f"sp::pop(tp, {v.name});")


class _Numbered(ir.Rewriter):
    """A body's temps and vars numbered from 0 in the order they first appear. Their ids come from
    one counter per process, so without this the C++ of a kernel (and the kernel cache's key for its
    module) changed with whatever the process had compiled before it: two scripts that first used
    one module's kernels in a different order each built it."""

    def __init__(self):
        self.numbered: dict[int, object] = {}

    def operand(self, x):
        out = self.numbered.get(x.id)
        if out is None:
            fields = {"id": len(self.numbered)}
            if isinstance(x, ir.Var):          # an adjoint's local is named after its temp's id
                fields["hint"] = re.sub(r"(^|_)t\d+", r"\1t", x.hint)
            out = self.numbered[x.id] = dataclasses.replace(x, **fields)
        return out


def _param_ctype(p) -> str:
    return f"array_t<{p.type.dtype.ctype}>" if isinstance(p.type, ArrayType) else p.type.ctype


def _vars_of(s):
    if isinstance(s, (ir.ReadVar, ir.Assign)):
        yield s.var
    elif isinstance(s, ir.Loop):
        if s.counter is not None:
            yield s.counter
        yield from s.exit_flags
    elif isinstance(s, ir.ReverseLoop):
        yield s.index
    elif isinstance(s, ir.Pop):
        yield from s.vars


def _index_list(indices, x) -> str:
    vals = [f"(int64_t){x(i)}" for i in indices] + ["0"] * (4 - len(indices))
    return ", ".join(vals)


def _printf(name, t):
    if isinstance(t, ScalarType):
        if t.is_float:
            return "%g", [f"(double){name}"]
        if t.name == "bool":
            return "%s", [f'({name} ? "True" : "False")']
        return "%lld", [f"(long long){name}"]
    if isinstance(t, VectorType):
        f = "[" + ", ".join(["%g"] * t.length) + "]"
        return f, [f"(double){name}[{i}]" for i in range(t.length)]
    rows = []
    vals = []
    for i in range(t.rows):
        rows.append("[" + ", ".join(["%g"] * t.cols) + "]")
        vals += [f"(double){name}[{i}][{j}]" for j in range(t.cols)]
    return "[" + ", ".join(rows) + "]", vals


def _escape_format(fmt, args, x) -> str:
    pieces = fmt.split("{}")
    out = _c_escape(pieces[0].replace("{{", "{").replace("}}", "}"))
    for a, tail in zip(args, pieces[1:]):
        out += _printf(x(a), a.type)[0] + _c_escape(tail.replace("{{", "{").replace("}}", "}"))
    return out


def _c_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("\n", "\\n")
