"""Parameter gradients summed over the steps of a reverse sweep in float64.

Every step's adjoint adds its part of a parameter's gradient into the parameter's ``.grad``. For a
float32 parameter read by every step of a long rollout that is 10^4 or more adds into one float32
element, each rounded to the size of the total: a float32 ensemble of 10^4 damped pendulums over
10^4 steps lost 2.6% of dL/dc that way (issue 31; the per-launch sum over threads is the other
half, summed in float64 partials by the kernels: add_log in compiler/codegen/prelude.h).

So during a sweep each float32 parameter's gradient holds the parts of a few steps only: after
reversing a step whose index is a multiple of `FOLD_EVERY` (`due`) it is added into a float64
accumulator and zeroed, and at the end (`finish`) the accumulator, rounded once, is the gradient.
Eight steps' parts summed in float32 lose a few units in the last place, nothing like 10^4 adds; a
fold after every step cost as much memory traffic as a forward step of a 3-D stencil (read the
float32 part, read and write the float64 sum, zero the part). Every path that reverses steps (the
tape, the native reversal, the native sweep's C++ driver: ``fold_table``) folds after the same
steps, the same float64 adds in the same order, so checkpointed and store-all gradients keep the
same bits. Float64 parameters and parameters without a gradient are left alone.
"""
from __future__ import annotations

import numpy as np

from compiler import float32, float64, kernel, tid
from compiler.runtime.array import array
from compiler.runtime.launch import relaunch

__all__ = ["FOLD_EVERY", "ParamSums"]

FOLD_EVERY = 8


@kernel
def _fold(g: array(dtype=float32), acc: array(dtype=float64)):
    i = tid()
    acc[i] = acc[i] + float64(g[i])
    g[i] = float32(0.0)


@kernel
def _finish(acc: array(dtype=float64), g: array(dtype=float32)):
    i = tid()
    g[i] = float32(acc[i] + float64(g[i]))


def _scalars(a) -> array:
    """`a`'s memory as a flat float32 array (a vector or matrix parameter's components in order)."""
    return array._wrap(a._data.reshape((-1,)), float32, storage=a._storage, fn="ParamSums", device=a.device)


class ParamSums:
    """The float64 accumulators of a sweep's float32 parameter gradients (see the module's doc)."""

    def __init__(self, params: dict, device: str):
        self.device = device
        self.grads = [_scalars(p.grad) for p in params.values()
                      if p.grad is not None and getattr(p.dtype, "scalar", p.dtype) is float32]
        if device == "cpu":
            self.sums = [np.zeros(g.size, np.float64) for g in self.grads]
        else:
            self.sums = [array(np.zeros(g.size, np.float64), dtype=float64, device=device) for g in self.grads]

    @staticmethod
    def due(step: int) -> bool:
        """Whether the sweep folds after reversing `step` (the same steps on every path)."""
        return step % FOLD_EVERY == 0

    def fold(self) -> None:
        """Add the gradients' step parts into the float64 sums; zero the gradients."""
        if self.device == "cpu":
            for g, acc in zip(self.grads, self.sums):
                part = g._data
                acc += part
                part.fill(0)
        else:
            for g, acc in zip(self.grads, self.sums):
                relaunch(_fold, (g.size,), [g, acc], deterministic=False)

    def finish(self) -> None:
        """Each gradient becomes its sum (and whatever it holds since the last fold), rounded once."""
        if self.device == "cpu":
            for g, acc in zip(self.grads, self.sums):
                part = g._data
                part[...] = (acc + part).astype(np.float32)
        else:
            for g, acc in zip(self.grads, self.sums):
                relaunch(_finish, (g.size,), [acc, g], deterministic=False)

    def fold_table(self) -> list[tuple[int, int, int]]:
        """(float32 gradient pointer, float64 sum pointer, count) per parameter, for a native driver
        that folds as `fold` does (CPU only)."""
        return [(g.ptr, acc.ctypes.data, g.size) for g, acc in zip(self.grads, self.sums)]
