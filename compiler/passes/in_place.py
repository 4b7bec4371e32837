"""Which outputs of a kernel may be written over one of its inputs: `in_place_pairs`.

A leapfrog step computes u_next from u_prev and u, and reads u_prev only at each thread's own
point, before that thread writes u_next there. A stepper running many such steps may then write
u_next into u_prev's buffer (stepper/execute/fast/driver.h): two buffers for u instead of three, and
each store goes to a cache line the thread has just read, where a third buffer's store first
fetches its line from memory. The results are the same bits: each thread reads what it would have
read, and no thread reads an element another writes.

The forward's CPU entry runs its alias-test-free loops (`writes_own_elements`) when such a pair's
arguments are one array (prelude.h `sp::same`), as it does when they share no memory.
"""
from __future__ import annotations

from .. import ir
from ..types import ArrayType
from .interior import at_own_index, tid_offsets, writes_own_elements
from .selects import written_arrays

__all__ = ["in_place_pairs"]


def in_place_pairs(fn: ir.Function) -> frozenset[tuple[str, str]]:
    """(input, output) array arguments of `fn` that may be one array, every thread's results
    unchanged: arrays of one type, the output stored at the thread's own index and never read,
    the input read at the thread's own index only and never written, and every read of it before
    the output's first store in the forward's program order, with no store of the output in a loop
    (whose next iteration would read after it). Only kernels that `writes_own_elements` have any."""
    if not writes_own_elements(fn):
        return frozenset()
    offsets = tid_offsets(fn.body, fn.tid_ndim)
    stored = written_arrays(fn.body)
    loads: dict[str, list] = {}
    for s in ir.walk(fn.body):
        if isinstance(s, ir.Load) and not s.array.adjoint:
            loads.setdefault(s.array.param.name, []).append(s)
    arrays = {p.name: p.type for p in fn.params if isinstance(p.type, ArrayType)}
    outputs = [name for name in arrays if name in stored and name not in loads]
    inputs = [name for name in arrays if name not in stored and name in loads
              and all(at_own_index(s.indices, offsets, fn.tid_ndim) for s in loads[name])]
    return frozenset((i, o) for o in outputs for i in inputs
                     if arrays[i] == arrays[o] and _reads_before_writes(fn.body, i, o))


def _reads_before_writes(body, read: str, written: str) -> bool:
    stored = False
    for s, in_loop in ir.forward_walk(body):
        if isinstance(s, ir.Store) and s.array.param.name == written:
            if in_loop:
                return False
            stored = True
        elif isinstance(s, ir.Load) and s.array.param.name == read and stored:
            return False
    return True
