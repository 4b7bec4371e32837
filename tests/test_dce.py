"""Dead code elimination (compiler/passes/dce.py): what an effect reads stays, the rest goes."""
import compiler as sp
from compiler import ir
from compiler.passes.dce import eliminate_dead_code
from compiler.types import ArrayType, bool_, float32, int32
from compiler.passes.verify import verify

LOC = ir.Loc("test_dce.py", 1)
F2 = sp.array(dtype=float, ndim=2)


def test_only_what_reaches_an_effect_or_a_decision_survives():
    out_param = ir.Param("out", ArrayType(float32, 1), 0)
    out = ir.ArrayRef(out_param)
    i, x, y, dead, acc_now, acc_next, cond = (ir.Temp(t) for t in (int32, float32, float32, float32, float32,
                                                                     float32, bool_))
    acc = ir.Var("acc", float32)              # accumulates into itself, read by nothing else: dead
    kept = ir.Var("kept", float32)
    body = (
        ir.ThreadIndex(i, 0, LOC),
        ir.Load(x, out, (i,), LOC),
        ir.Op(y, "mul", (x, x), LOC),
        ir.Op(dead, "add", (x, x), LOC),
        ir.Assign(acc, ir.Const(0.0, float32), LOC),
        ir.ReadVar(acc_now, acc, LOC),
        ir.Op(acc_next, "add", (acc_now, y), LOC),
        ir.Assign(acc, acc_next, LOC),
        ir.Assign(kept, y, LOC),
        ir.Op(cond, "gt", (x, ir.Const(0.0, float32)), LOC),
        ir.If(cond, (ir.Store(out, (i,), y, LOC),), (), LOC),
    )
    fn = eliminate_dead_code(ir.Function("f", (out_param,), body, LOC, 1))
    verify(fn)
    kinds = [type(s).__name__ + (f":{s.op}" if isinstance(s, ir.Op) else "") for s in fn.body]
    assert kinds == ["ThreadIndex", "Load", "Op:mul", "Op:gt", "If"]


def test_a_branch_on_a_constant_condition_becomes_the_branch_it_takes_and_what_the_other_read_goes():
    out_param = ir.Param("out", ArrayType(float32, 1), 0)
    out = ir.ArrayRef(out_param)
    i, x, y = ir.Temp(int32), ir.Temp(float32), ir.Temp(float32)
    body = (
        ir.ThreadIndex(i, 0, LOC),
        ir.Load(x, out, (i,), LOC),               # read only by the store the branch never makes
        ir.Load(y, out, (i,), LOC),
        ir.If(ir.Const(False, bool_), (ir.Store(out, (i,), x, LOC),), (ir.Store(out, (i,), y, LOC),), LOC),
        ir.If(ir.Const(True, bool_), (ir.Store(out, (i,), y, LOC),), (ir.Store(out, (i,), x, LOC),), LOC),
    )
    fn = eliminate_dead_code(ir.Function("f", (out_param,), body, LOC, 1))
    verify(fn)
    assert [type(s).__name__ for s in fn.body] == ["ThreadIndex", "Load", "Store", "Store"]
    assert fn.body[1].out is y and fn.body[2].value is y and fn.body[3].value is y


def test_a_scratch_store_overwritten_before_any_read_goes():
    """The pointwise pass's zero root, stored first, then the root where the guard holds: with the
    guard settled true the zero is dead. A store that a read of its array separates from the next,
    or that only a branch stores over, stays."""
    out_param = ir.Param("out", ArrayType(float32, 1), 0)
    out = ir.ArrayRef(out_param)
    i, x, r, c = ir.Temp(int32), ir.Temp(float32), ir.Temp(float32), ir.Temp(bool_)
    zero = ir.Const(0.0, float32)
    settled = (
        ir.ThreadIndex(i, 0, LOC),
        ir.ScratchStore(0, i, zero, LOC),
        ir.Load(x, out, (i,), LOC),
        ir.If(ir.Const(True, bool_), (ir.ScratchStore(0, i, x, LOC),), (), LOC),
    )
    fn = eliminate_dead_code(ir.Function("f", (out_param,), settled, LOC, 1))
    verify(fn)
    assert [(type(s).__name__, getattr(s, "value", None)) for s in fn.body if isinstance(s, ir.ScratchStore)] == [
        ("ScratchStore", x)]
    kept = (
        ir.ThreadIndex(i, 0, LOC),
        ir.ScratchStore(0, i, zero, LOC),
        ir.ScratchLoad(r, 0, i, LOC),
        ir.Op(x, "add", (r, r), LOC),
        ir.ScratchStore(0, i, x, LOC),            # the first was read: both stay
        ir.ScratchStore(8, i, zero, LOC),
        ir.Op(c, "gt", (x, zero), LOC),
        ir.If(c, (ir.ScratchStore(8, i, x, LOC),), (), LOC),     # stored over only where c holds
        ir.Store(out, (i,), x, LOC),
    )
    fn = eliminate_dead_code(ir.Function("f", (out_param,), kept, LOC, 1))
    verify(fn)
    assert sum(isinstance(s, ir.ScratchStore) for s in ir.walk(fn.body)) == 4


@sp.kernel
def blur(u: F2, out: F2):
    i, j = sp.tid()
    m = u.shape[1]
    v = 2.0 * u[i, j] * u[i, j]
    if j + 1 < m:
        v += u[i, j + 1]
    out[i, j] = v


def test_gather_passes_keep_only_what_reaches_their_offset():
    compiled = blur.compiled()
    gather = compiled.gather.interior.function
    verify(gather, single_definition=False)
    # two passes, each a copy of the adjoint (the offsets 0 and +1 of u): without elimination about
    # twice the adjoint's statements (and the selects of the guard j + 1 < m, which the interior
    # leaves to the last column: compiler/passes/selects.py); with it, nothing left to remove
    size = len(list(ir.walk(gather.body)))
    assert size < 1.75 * len(list(ir.walk(compiled.adjoint.body)))
    assert len(list(ir.walk(eliminate_dead_code(gather).body))) == size


@sp.kernel
def leapfrog(up: F2, u: F2, c: float, up_next: F2, u_next: F2):
    i, j = sp.tid()
    x = u[i, j]
    up_next[i, j] = x
    u_next[i, j] = 2.0 * x - up[i, j] + c * x * x


@sp.kernel
def scaled(up: F2, u: F2, up_next: F2, u_next: F2):
    i, j = sp.tid()
    up_next[i, j] = u[i, j]
    u_next[i, j] = up[i, j] * u[i, j]


def test_adjoints_load_only_the_values_their_derivatives_use():
    """The scatter adjoint loses the replay's dead loads as the gather form does: `up` enters
    `leapfrog` linearly, so no form of its adjoint reads it (a recording kept for later need not
    keep it: stepper's StepTrace.reversal_reads); a product reads both factors."""
    compiled = leapfrog.compiled()
    loads = lambda fn: {s.array.param.name for s in ir.walk(fn.body) if isinstance(s, ir.Load)}  # noqa: E731
    assert loads(compiled.adjoint) == {"u"}
    assert compiled.adjoint_loads == {"u"}
    assert scaled.compiled().adjoint_loads == {"up", "u"}
