"""Which accumulations of an adjoint a gather form can gather (compiler/passes/gather.py): those into
an array at the thread's own index plus a constant per axis, that modulo the axis's extent (a
periodic index), or that clamped to the axis's ends; and the gather passes each takes part in."""
from __future__ import annotations

import itertools

from .. import ir
from .interior import Bound, Clamped, Wrapped


def site_offset(s: ir.AccumGrad, offsets, ndim: int):
    """(per axis (offset, periodic), the (axis, bound) pairs that must equal the extent, per axis
    the clamp or None) where every index of the accumulation is its own axis's thread index plus a
    constant, that modulo a bound (`Wrapped`), or that clamped to the axis's ends (`Clamped`); else
    None."""
    if s.array.type.ndim != ndim:
        return None
    out, bounds, clamps = [], [], []
    for axis, index in enumerate(s.indices):
        known = offsets.get(index.id) if isinstance(index, ir.Temp) else None
        clamp = None
        if isinstance(known, Wrapped) and known.axis == axis:
            # (p + c) % d with d the extent (checked at launch); at c = 0 it is p itself
            out.append((known.c, known.c != 0))
            bounds.append((axis, known.divisor))
        elif isinstance(known, tuple) and known[0] == axis and known[1].near_start:
            out.append((known[1].const, False))
        elif isinstance(known, Clamped) and known.axis == axis and known.offset.near_start \
                and (known.op == "min" or known.bound == Bound(0)):
            # max(p + c, 0), or min(p + c, hi) with hi + 1 the extent (checked at launch)
            c = known.offset.const
            out.append((c, False))
            if known.op == "min":
                bounds.append((axis, known.bound.shifted(1)))
            clamp = known.op if (c < 0) == (known.op == "max") and c else None
        else:
            return None
        clamps.append(clamp)
    return tuple(out), bounds, tuple(clamps)


def site_passes(offset, clamps) -> list:
    """The passes an accumulation takes part in: its own offset, and along each clamped axis every
    offset from 0 to its own (the clamped threads' accumulations land on the edge)."""
    choices = [[(c, periodic)] if clamp is None else [(e, False) for e in range(min(c, 0), max(c, 0) + 1)]
               for (c, periodic), clamp in zip(offset, clamps)]
    return list(itertools.product(*choices))


__all__ = ["site_offset", "site_passes"]
