"""Stores that copy an input to an output element for element at the thread's own index.

A leapfrog step keeps its previous state by writing ``up_next[i, j] = x`` where ``x = u[i, j]``:
every thread stores the element it loaded, so the whole of `up_next` ends up equal to `u`. A run of
such steps need not store it at all: the next step can read `u`'s buffer itself as its `up`
(stepper/execute/fast/native_loop.py renames the buffers, as it does for ``sp.copy(s.next.up, s.prev.u)``). For
that it runs a variant of the forward without those stores; the last step of a run runs the kernel
itself, so the state a run returns owns its buffers.

A store qualifies when it is a statement of the kernel's body itself (every thread runs it, once),
its indices are the thread indices in order, one per axis of the launch and of the array, and the
value is a load of another array at those same indices (through locals assigned once, at the top
level). The output must be stored nowhere else and never read; the input never written. Whether
the launch covers the whole array is for the caller to check (its dims against the shape).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .. import ir
from .dce import eliminate_dead_code
from .interior import Interior, interior_variant, with_row
from .near_faces import with_sides

__all__ = ["IdentityStores", "identity_stores"]


@dataclass(frozen=True)
class IdentityStores:
    copies: dict            # output parameter name -> the input parameter name it copies
    function: ir.Function   # the forward without those stores
    interior: Interior | None


def identity_stores(fn: ir.Function, uses: dict) -> IdentityStores | None:
    """The identity stores of forward `fn` (`uses`: its `argument_uses`) and the forward without
    them, or None where it has none."""
    top = {id(s) for s in fn.body}
    temps, assigned = {}, {}
    for s in ir.walk(fn.body):
        if isinstance(s, ir.Assign):
            assigned.setdefault(s.var.id, []).append(s)
        for t in ir.defined_temps(s):
            temps[t.id] = s

    def source(op):
        """The statement that computes `op`, through locals assigned once at the top level."""
        while isinstance(op, ir.Temp):
            s = temps.get(op.id)
            if not isinstance(s, ir.ReadVar):
                return s
            assigns = assigned.get(s.var.id, ())
            if len(assigns) != 1 or id(assigns[0]) not in top:
                return None
            op = assigns[0].value
        return None

    def at_thread(indices) -> bool:
        axes = [s.axis if isinstance(s, ir.ThreadIndex) else None for s in map(source, indices)]
        return axes == list(range(fn.tid_ndim))

    stored = {}
    for s in ir.walk(fn.body):
        if isinstance(s, (ir.Store, ir.Atomic)) and not s.array.adjoint:
            stored[s.array.param.name] = stored.get(s.array.param.name, 0) + 1
    copies = {}
    for s in fn.body:
        if not isinstance(s, ir.Store) or s.array.adjoint or not at_thread(s.indices):
            continue
        load = source(s.value)
        if not isinstance(load, ir.Load) or load.array.adjoint or not at_thread(load.indices):
            continue
        out, src = s.array.param.name, load.array.param.name
        if out != src and stored[out] == 1 and not uses[out].reads and not uses[out].adjoint_reads \
                and src not in stored and s.array.param.type == load.array.param.type:
            copies[out] = src
    if not copies:
        return None
    body = tuple(s for s in fn.body if not (isinstance(s, ir.Store) and s.array.param.name in copies))
    function = eliminate_dead_code(dataclasses.replace(fn, name=fn.name + "_renamed", body=body))
    interior = with_row(interior_variant(function, function.name + "_interior"), function)
    return IdentityStores(copies, function, with_sides(interior, function))
