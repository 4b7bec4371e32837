"""What an entry's loops may assume about its arrays' memory, and the tests a launch makes for it.

The C++ compiler must assume that a store through one array's pointer may change what another's
holds. Where the generated code knows better (a gather form's threads write only their own
elements, a coefficient table is never written, two passes touch no common memory), it says so:
with loop hints, local copies, or a test at each launch that picks the loops that rely on it.
"""
from __future__ import annotations

from .. import ir
from ..types import ArrayType
from .emit import arg_name


def independent(grads: int | None, *functions: ir.Function) -> bool:
    """Whether each thread of these gather-form passes writes only its own elements: no atomics and
    no accumulation into a gradient another thread adds to, among the gradients of mask `grads`
    (None: all present). Their loops may then vectorise without alias tests (SP_INDEPENDENT)."""
    return not any(isinstance(s, ir.Atomic) or shared_accumulation(s, grads)
                   for fn in functions for s in ir.walk(fn.body))


def passes_apart(first: ir.Function, second: ir.Function) -> str | None:
    """A C++ test that no array one pass of a two-pass form writes shares memory with one the other
    reads or writes, where their rows may then interleave (scratch.windowed); None where one
    array is both (a pass reads what the other writes, which only the passes in turn keep right)."""
    def arrays(fn):
        reads, writes = set(), set()
        for s in ir.walk(fn.body):
            if isinstance(s, (ir.Load, ir.ReadGrad)):
                reads.add((s.array.param, "G" if isinstance(s, ir.ReadGrad) or s.array.adjoint else "A"))
            elif isinstance(s, (ir.Store, ir.Atomic, ir.AccumGrad)):
                writes.add((s.array.param, "G" if isinstance(s, ir.AccumGrad) or s.array.adjoint else "A"))
        return reads, writes
    (reads1, writes1), (reads2, writes2) = arrays(first), arrays(second)
    pairs = {frozenset((a, b)) for w, other in ((writes1, reads2 | writes2), (writes2, reads1 | writes1))
             for a in w for b in other}
    if any(len(pair) == 1 for pair in pairs):
        return None
    tests = []
    for pair in sorted(pairs, key=lambda p: sorted((q[0].index, q[1]) for q in p)):
        (pa, ka), (pb, kb) = sorted(pair, key=lambda q: (q[0].index, q[1]))
        tests.append(_apart(f"{ka}.{arg_name(pa.name)}", pa.type.ndim, f"{kb}.{arg_name(pb.name)}", pb.type.ndim))
    return " && ".join(tests) or "true"


def _apart(a: str, a_ndim: int, b: str, b_ndim: int) -> str:
    """A C++ test that arrays `a` and `b` (A.x or G.x) share no memory, or one is absent."""
    return f"!({a}.data && {b}.data && sp::overlap({a}, {a_ndim}, {b}, {b_ndim}))"


def adds_into_memory(fn: ir.Function, grads: int | None = None) -> bool:
    """Whether `fn` makes atomic adds (forward atomics, or an adjoint's shared accumulations into
    the gradients of mask `grads`, None: any), which a deterministic launch into a few elements logs
    (see add_log in prelude.h) instead of running serially."""
    return any(isinstance(s, ir.Atomic) and s.kind in ("add", "sub") or shared_accumulation(s, grads)
               for s in ir.walk(fn.body))


def shared_accumulation(s, grads: int | None = None) -> bool:
    """Whether `s` adds into a gradient other threads add to (one of mask `grads`; None: any)."""
    return (isinstance(s, ir.AccumGrad) and s.fresh_bit is None and not s.exclusive
            and (grads is None or bool(grads >> s.array.param.index & 1)))


def table_reads(passes, variants) -> dict[str, int]:
    """The 1-D arrays that no function of `passes` writes and each of their `variants` that reads
    them reads only at constant indices (a coefficient table's w[k]), each with the number of
    elements those reads span. The CPU hands their values to those variants' loops in a local
    struct (`T`, filled once a row): read through the table's pointer, every thread reloaded them,
    as a store through an output's pointer might have changed them (a hand-written 8th-order 2-D
    update ran 20% slower that way)."""
    written = {s.array.param.name for fn in passes for s in ir.walk(fn.body) if isinstance(s, (ir.Store, ir.Atomic))}
    loads: dict[str, list] = {}
    for variant in variants:
        for s in ir.walk(variant.body):
            if isinstance(s, ir.Load) and not s.array.adjoint:
                loads.setdefault(s.array.param.name, []).append(s)
    out = {}
    for name, found in loads.items():
        if name in written or any(s.or_zero or len(s.indices) != 1 or not isinstance(s.indices[0], ir.Const)
                                  for s in found):
            continue
        count = max(int(s.indices[0].value) for s in found) + 1
        if 0 < count <= TABLE_ELEMENTS and min(int(s.indices[0].value) for s in found) >= 0:
            out[name] = count
    return out


def table_takers(gather, two_pass) -> tuple:
    """The variants of a gather form that run a large launch's middle and read its tables from `T`
    (see table_reads) besides the transposed pass's interior: its row, settled and band variants,
    and a two-pass form's pointwise interior. The rest run a stencil radius of threads near a face."""
    middles = (gather.row, gather.settled, *(gather.bands or ()),
               two_pass.pointwise_interior if two_pass is not None else None)
    return tuple(v.function for v in middles if v is not None)


def tables_apart(fn: ir.Function, tables: dict, touched) -> str:
    """A C++ test that no gradient buffer a gather form writes (params `touched`) shares memory with
    its tables: the values copied once a row are then the ones every thread would have read."""
    params = fn.params
    tests = [_apart(f"A.{arg_name(t)}", 1, f"G.{arg_name(params[k].name)}", params[k].type.ndim)
             for t in tables for k in touched if isinstance(params[k].type, ArrayType)]
    return " && ".join(tests) or "true"


TABLE_ELEMENTS = 64       # the most values of one table a row copies (a 16th-order stencil's take 9)


def tables_struct(fn: ir.Function, tables: dict, name: str) -> str:
    params = {p.name: p for p in fn.params}
    fields = "".join(f"    {params[t].type.dtype.ctype} {arg_name(t)}[{n}];\n" for t, n in tables.items())
    return f"struct {name} {{\n{fields}}};"


def tables_fill(tables: dict, name: str) -> str:
    """The row's `T` (see table_reads): the tables' values, where every table holds them (else the
    interior's box is empty, so nothing reads T)."""
    holds = " && ".join(f"A.{arg_name(t)}.shape[0] >= {n}" for t, n in tables.items())
    fills = " ".join(f"T.{arg_name(t)}[{k}] = sp::load(A.{arg_name(t)}, {k});" for t, n in tables.items() for k in range(n))
    return f"{name} T{{}}; if ({holds}) {{ {fills} }}"
