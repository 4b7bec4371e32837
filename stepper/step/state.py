"""Declared state arrays, named collections of arrays (`State`), and checks of a user's initial state."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Iterator, Mapping

import numpy as np

from compiler import array
from compiler.types import as_dtype

from ..errors import ModelError

__all__ = ["StateSpec", "State", "check_initial", "write_values"]


@dataclass(frozen=True)
class StateSpec:
    """One declared state: its name, logical shape and element dtype."""
    name: str
    shape: tuple[int, ...]
    dtype: object

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape + self.dtype.inner_shape)) * np.dtype(self.dtype.np_dtype).itemsize

    def describe(self) -> str:
        return f"shape {self.shape} of {self.dtype}"


def make_spec(name, shape, dtype) -> StateSpec:
    if not isinstance(name, str) or not name.isidentifier():
        raise ModelError(f"state name {name!r} must be a Python identifier (it is read as s.prev.{name})")
    dims = (shape,) if isinstance(shape, (int, np.integer)) else shape
    try:
        dims = tuple(int(d) for d in dims)
    except TypeError:
        raise ModelError(f"state '{name}': shape must be an int or a tuple of ints, got {shape!r}") from None
    if not 1 <= len(dims) <= 4 or min(dims) < 0:
        raise ModelError(f"state '{name}': shape must have 1 to 4 non-negative dimensions, got {shape!r}")
    try:
        dt = as_dtype(dtype)
    except TypeError as exc:
        raise ModelError(f"state '{name}': {exc}") from None
    return StateSpec(name, dims, dt)


@functools.lru_cache(maxsize=None)
def _class_names(cls) -> frozenset:
    """Attribute names a state must not shadow: the class's, and the instance's own ``_arrays``."""
    return frozenset(dir(cls)) | {"_arrays"}


class State(Mapping):
    """Named arrays, read as ``state.x`` or ``state["x"]``; iterating gives the names in declaration
    order. Steps see two of them, ``s.prev`` and ``s.next``; `rollout` returns one."""

    def __init__(self, arrays: Mapping[str, array]):
        arrays = dict(arrays)
        object.__setattr__(self, "_arrays", arrays)
        # As plain attributes, ``s.prev.x`` is one dict lookup; the __getattr__ fallback costs ~1 us
        # and every step reads several. A name a method already has stays reachable as state["name"].
        taken = _class_names(type(self))
        if taken.isdisjoint(arrays):
            vars(self).update(arrays)
        else:
            vars(self).update({name: a for name, a in arrays.items() if name not in taken})

    def __getitem__(self, name: str) -> array:
        return self._arrays[name]

    def __getattr__(self, name: str) -> array:
        try:
            return self._arrays[name]
        except KeyError:
            names = ", ".join(self._arrays) or "none"
            raise AttributeError(f"no state named '{name}' (declared: {names})") from None

    def __setattr__(self, name, value):
        raise AttributeError(f"cannot assign to state '{name}': write into the array with a kernel, "
                             f"assign() or copy() instead")

    def __iter__(self) -> Iterator[str]:
        return iter(self._arrays)

    # Every step walks its states several times: the dict's own views are much faster than the
    # Mapping defaults, which go through __getitem__ for every item.
    def keys(self):
        return self._arrays.keys()

    def values(self):
        return self._arrays.values()

    def items(self):
        return self._arrays.items()

    def get(self, name, default=None):
        return self._arrays.get(name, default)

    def __contains__(self, name) -> bool:
        return name in self._arrays

    def __len__(self) -> int:
        return len(self._arrays)

    def __dir__(self):
        return list(self._arrays)

    def numpy(self) -> dict[str, np.ndarray]:
        """``{name: array.numpy()}`` (views, no copies)."""
        return {name: a.numpy() for name, a in self._arrays.items()}

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}: {a.dtype} {a.shape}" for n, a in self._arrays.items())
        return f"{type(self).__name__}({inner})"


def check_initial(specs: Mapping[str, StateSpec], initial, device: str, what: str = "initial state") -> dict:
    """The user's initial state as ``{name: ndarray}`` (views) after checking names, shapes, dtypes
    and device against the declarations; raises ModelError naming the first mismatch. A GPU
    array stays itself (reading it back to the host would wait for the GPU): `write_values`
    copies either kind into a version."""
    if not isinstance(initial, Mapping):
        raise ModelError(f"{what} must be a dict of name -> array, got {type(initial).__name__}")
    missing = [n for n in specs if n not in initial]
    extra = [n for n in initial if n not in specs]
    if missing or extra:
        parts = []
        if missing:
            parts.append("missing " + ", ".join(f"'{n}'" for n in missing))
        if extra:
            parts.append("undeclared " + ", ".join(f"'{n}'" for n in extra))
        raise ModelError(f"{what}: {'; '.join(parts)} (the model declares "
                         f"{', '.join(repr(n) for n in specs)})")
    out = {}
    for name, spec in specs.items():
        value = initial[name]
        want = spec.shape + spec.dtype.inner_shape
        if isinstance(value, array):
            if value.device != device:
                raise ModelError(f"{what} '{name}' is on device '{value.device}' but the model runs on "
                                 f"'{device}'; move it with .to('{device}')")
            if value.dtype != spec.dtype or value.shape != spec.shape:
                raise ModelError(f"{what} '{name}': expected {spec.describe()}, got shape {value.shape} "
                                 f"of {value.dtype}")
            out[name] = value if value.device != "cpu" else value.numpy()
        elif isinstance(value, np.ndarray):
            if value.dtype != np.dtype(spec.dtype.np_dtype) or value.shape != want:
                raise ModelError(f"{what} '{name}': expected a {np.dtype(spec.dtype.np_dtype)} NumPy array "
                                 f"of shape {want} ({spec.describe()}), got {value.dtype} of shape "
                                 f"{value.shape}")
            out[name] = value
        else:
            raise ModelError(f"{what} '{name}': expected a stepper.array or NumPy array, got "
                             f"{type(value).__name__}")
    return out


def write_values(arr: array, value) -> None:
    """Set version `arr` from one of `check_initial`'s values: NumPy values, or a GPU array of the
    same shape and dtype, copied on the device."""
    if isinstance(value, array):
        arr._data.copy_bytes_from(value._data, 0, 0, arr._data.nbytes)
    else:
        arr._write_host(value)
