"""Forward mode over launches: `Tangents`, the forward-mode counterpart of a Tape.

Inside ``with Tangents(seeds) as tan:`` every `launch` runs the kernel's tangent kernel instead
(kernel.tangent(), passes/tangent.py): the same forward, plus the tangent of everything it writes,
pushed forward from the tangents of what it reads. Tangents are arrays beside the arrays they
belong to; an array nobody seeded and no launch wrote has tangent zero. Like a Tape, the context
sees launches made by code that knows nothing about it (a model's step function, a loss), which is
how the stepper carries tangents through a rollout; and launches of tangent kernels are ordinary
launches, so a recording Tape differentiates them again (reverse over forward).
"""
from __future__ import annotations

import contextvars
import math
from typing import NamedTuple

from ..passes.tangent import floating
from ..types import ArrayType, ScalarType
from .array import array, zeros

__all__ = ["Tangents", "Dual", "active_tangents"]

_ACTIVE: contextvars.ContextVar = contextvars.ContextVar("tangents", default=None)


def active_tangents() -> "Tangents | None":
    return _ACTIVE.get()


class Dual(NamedTuple):
    """A scalar kernel argument with its tangent, for launches inside `Tangents`:
    ``launch(k, n, inputs=[x, Dual(0.5, 1.0)], outputs=[y])`` differentiates along that scalar."""
    value: object
    tangent: object


class Tangents:
    """Forward-mode differentiation of the launches made inside ``with``.

    Example::

        with stepper.Tangents({x: dx}) as tan:
            stepper.launch(spring, n, inputs=[x, k], outputs=[f])
            stepper.launch(integrate, n, inputs=[x, f], outputs=[y])
        dy = tan[y]              # J dx, the tangent of y (zeros where nothing reached it)

    `seeds` maps arrays to their tangents (same shape, dtype and device). A launch that writes an
    array without a tangent gives it a new one (zero-filled, from `new(array)` if given, else
    `zeros_like`). Scalar arguments have tangent zero unless passed as `Dual(value, tangent)`."""

    def __init__(self, seeds: dict | None = None, *, new=None, shared_zeros: dict | None = None):
        self._map: dict[int, tuple] = {}          # id(array) -> (array, tangent): keeps both alive
        # read-only zero tangents, one per (shape, dtype, device); the stepper shares them across steps
        self._zeros: dict[tuple, array] = {} if shared_zeros is None else shared_zeros
        self._new = new
        self._token = None
        for arr, tangent in (seeds or {}).items():
            self.seed(arr, tangent)

    def seed(self, arr: array, tangent: array, what: str | None = None, check: bool = True) -> None:
        """Give `arr` the tangent `tangent` (used as is, not copied: launches write into it).
        ``check=False`` skips the checks, for pairs made to match (the stepper's, every step)."""
        if check:
            check_tangent(arr, tangent, what or f"the tangent of {arr!r}")
        self._map[id(arr)] = (arr, tangent)

    def get(self, arr: array) -> array | None:
        hit = self._map.get(id(arr))
        return hit[1] if hit is not None else None

    def __getitem__(self, arr: array) -> array:
        """The tangent of `arr`: zeros (a new array) where nothing seeded or wrote it."""
        t = self.get(arr)
        return t if t is not None else zeros(arr.shape, arr.dtype, arr.device)

    def __contains__(self, arr) -> bool:
        return id(arr) in self._map

    def __enter__(self) -> "Tangents":
        if self._token is not None:
            raise RuntimeError("this Tangents context is already active")
        self._token = _ACTIVE.set(self)
        return self

    def __exit__(self, *exc) -> bool:
        _ACTIVE.reset(self._token)
        self._token = None
        return False

    def zero_for(self, arr: array) -> array:
        """A zero tangent for reading `arr` (shared between arrays of its kind; never written)."""
        key = (arr.shape, arr.dtype, arr.device)
        z = self._zeros.get(key)
        if z is None:
            z = self._zeros[key] = zeros(arr.shape, arr.dtype, arr.device)
        return z

    def _written(self, arr: array) -> array:
        t = self.get(arr)
        if t is None:
            t = self._new(arr) if self._new is not None else zeros(arr.shape, arr.dtype, arr.device,
                                                                     requires_grad=arr.requires_grad)
            self._map[id(arr)] = (arr, t)
        return t

    def tangent_launch(self, kernel, inputs, outputs) -> tuple:
        """What `launch` inside this context runs instead, as (kernel, inputs, outputs): the tangent
        kernel, with a tangent for every float argument."""
        args = [a.value if isinstance(a, Dual) else a for a in (*inputs, *outputs)]
        params = kernel.params
        if len(args) != len(params):
            return kernel, args, ()           # the base launch raises its message
        uses = kernel.compiled().uses
        extra = []
        for p, a, given in zip(params, args, (*inputs, *outputs)):
            t = p.type
            if not floating(t):
                continue
            if isinstance(t, ArrayType):
                if not isinstance(a, array):
                    continue          # the base launch's checks name it
                u = uses.get(p.name)
                if u is not None and (u.stores or u.accumulates):
                    extra.append(self._written(a))
                else:
                    extra.append(self.get(a) or self.zero_for(a))
            else:
                extra.append(given.tangent if isinstance(given, Dual) else
                             0.0 if isinstance(t, ScalarType) else [0.0] * math.prod(t.inner_shape))
        return kernel.tangent(), args + extra, ()


def check_tangent(arr, tangent, what: str) -> None:
    """Refuse a tangent that cannot stand beside `arr`, naming `what` and the fix."""
    if not isinstance(tangent, array):
        raise TypeError(f"{what} must be a stepper.array, got {type(tangent).__name__}")
    if tangent.shape != arr.shape or tangent.dtype != arr.dtype:
        raise ValueError(f"{what} has shape {tangent.shape} of {tangent.dtype}, but it must match its array: shape "
                         f"{arr.shape} of {arr.dtype}")
    if tangent.device != arr.device:
        raise ValueError(f"{what} is on '{tangent.device}' but its array is on '{arr.device}'; move it with "
                         f".to('{arr.device}')")
    if not arr.dtype.is_float:
        raise TypeError(f"{what}: {arr.dtype} values have no tangent (only float arrays are differentiable)")
