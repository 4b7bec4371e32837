"""Dead code elimination: an IR -> IR pass that drops computations nothing reads.

Generated bodies carry a lot of it: each pass of a gather form (compiler/passes/gather.py) is a full copy
of the adjoint, forward replay included, and keeps only the few values that reach one offset. The
C++ compiler would drop the rest too, but parsing and optimising it is most of a module's compile
time. Live is what an effect (stores, atomics, gradient accumulations, prints, tapes, native
functions) or a control decision (conditions, loop bounds) reads, and what those values are
computed from, through locals; removed are pure statements (arithmetic, loads, reads of locals and
parameters, thread indices, extents) whose result is not live, and assignments to locals that are
not. Control flow stays, but a branch on a constant condition is replaced by the branch it takes
first (the settled variants of compiler/passes/interior.py decide conditions), so nothing the other
reads stays live. And a store into a scratch array that a later store of the same block overwrites
before anything reads that array is dropped: the pointwise pass of a two-pass form stores a zero
root first and the root where its guard holds, which in a variant whose guard is settled true
leaves the zero dead (the C++ compiler cannot tell the scratch memory from the arrays read between
the two stores, and kept both). Expects verified IR; keeps it verified.
"""
from __future__ import annotations

import dataclasses
import itertools

from .. import ir
from ..builtins import OPS

_PURE = (ir.ReadVar, ir.ReadParam, ir.ThreadIndex, ir.ArrayDim, ir.Load, ir.ReadGrad, ir.ScratchLoad)


def eliminate_dead_code(fn: ir.Function) -> ir.Function:
    """`fn` without the statements whose results nothing uses (see the module docstring)."""
    body = fn.body
    if any(isinstance(s, ir.If) and isinstance(s.cond, ir.Const) for s in ir.walk(body)):
        body = tuple(_TakenBranches().block(body))      # (a rebuild of the whole body: only where one is)
    if sum(isinstance(s, ir.ScratchStore) for s in ir.walk(body)) > 1:
        body = tuple(_OverwrittenScratch().block(body))
    return dataclasses.replace(fn, body=tuple(_Prune(_live(body)).block(body)))


def without_absent_gradients(fn: ir.Function, grads: int) -> ir.Function:
    """Adjoint `fn` as a launch with gradient mask `grads` runs it (bit k set where array parameter
    k carries a gradient; one past the mask's 64 bits counts as carried): its accumulations into the
    absent gradients gone, and what only they computed. The C++ compiler drops the same code from
    the body instantiated for that mask; what plans around the body (the rows a loop prefetches)
    must see it gone too, or it streams arrays that nothing reads (a 2-D FWI adjoint whose damping
    profile has no gradient prefetched the whole of `up`, which only that gradient reads)."""
    body = tuple(_AbsentGradients(grads).block(fn.body))
    return eliminate_dead_code(dataclasses.replace(fn, body=body))


def _live(body) -> set[int]:
    """Ids of the Temps and Vars that an effect or a control decision depends on (mark and sweep:
    an accumulation ``adj = adj + x`` that nothing else reads is dead, although it reads itself)."""
    defined: dict[int, object] = {}              # Temp id -> the pure statement defining it
    assigned: dict[int, list] = {}               # Var id -> its assignments
    pending: list[int] = []
    for s in ir.walk(body):
        if isinstance(s, ir.Assign):
            assigned.setdefault(s.var.id, []).append(s)
        elif _pure(s):
            defined[s.out.id] = s
        else:                                    # an effect or control flow: what it reads is live
            pending += _reads(s)
    live: set[int] = set()
    while pending:
        i = pending.pop()
        if i in live:
            continue
        live.add(i)
        if i in defined:
            pending += _reads(defined[i])
        for a in assigned.get(i, ()):
            pending += _reads(a)
    return live


def _pure(s) -> bool:
    if isinstance(s, ir.Op):
        return not OPS[s.op].definition          # native ops may have effects
    return isinstance(s, _PURE)


def _reads(s) -> list[int]:
    """Ids of the Temps and Vars statement `s` reads: every field but what it defines (so an
    unfamiliar statement keeps all it mentions), nested blocks apart."""
    seen: list[int] = []
    for f in dataclasses.fields(s):
        if f.name == "loc" or f.name == "out" or (f.name == "var" and isinstance(s, ir.Assign)):
            continue
        _collect(getattr(s, f.name), seen)
    return seen


def _collect(x, seen: list[int]) -> None:
    if isinstance(x, (ir.Temp, ir.Var)):
        seen.append(x.id)
    elif isinstance(x, tuple):
        for v in x:
            if not (dataclasses.is_dataclass(v) and hasattr(v, "loc")):    # nested blocks: walked apart
                _collect(v, seen)


class _TakenBranches(ir.Rewriter):
    def stmt(self, s) -> list:
        s = self.value(s)
        if isinstance(s, ir.If) and isinstance(s.cond, ir.Const):
            return list(s.then if s.cond.value else s.orelse)
        return [s]


class _OverwrittenScratch(ir.Rewriter):
    def block(self, body) -> list:
        body = tuple(body)
        return [t for k, s in enumerate(body) if not _overwritten(body, k) for t in self.stmt(s)]


def _overwritten(body: tuple, k: int) -> bool:
    """Whether statement k of block `body` is a scratch store that a statement after it in the block
    stores over before any of them reads that scratch array."""
    s = body[k]
    if not isinstance(s, ir.ScratchStore):
        return False
    for t in itertools.islice(body, k + 1, None):
        if isinstance(t, ir.ScratchStore) and (t.offset, t.index, t.count) == (s.offset, s.index, s.count):
            return True
        if any(isinstance(u, ir.ScratchLoad) and u.offset == s.offset for u in ir.walk((t,))):
            return False
    return False


class _AbsentGradients(ir.Rewriter):
    def __init__(self, grads: int):
        self.grads = grads

    def stmt(self, s) -> list:
        k = s.array.param.index if isinstance(s, ir.AccumGrad) else None
        if k is not None and k < 64 and not self.grads >> k & 1:
            return []
        return [self.value(s)]


class _Prune(ir.Rewriter):
    def __init__(self, live: set[int]):
        self.live = live

    def stmt(self, s) -> list:
        if isinstance(s, ir.Assign) and s.var.id not in self.live or _pure(s) and s.out.id not in self.live:
            return []
        return [self.value(s)]


__all__ = ["eliminate_dead_code", "without_absent_gradients"]
