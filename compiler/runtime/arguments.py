"""The arguments of array construction, checked with messages that name the function and the
argument: devices, dtypes, shapes, and element values."""
from __future__ import annotations

import numpy as np

from ..types import ValueType, as_dtype, float32, int32, matrix, vector
from .device import get_device, require_cuda

MAX_DIMS = 4


def check_device(device, fn: str) -> str:
    try:
        dev = get_device(device)
        require_cuda(dev)
    except (ValueError, RuntimeError) as e:
        raise type(e)(f"{fn}(device={device!r}): {e}") from None
    return str(dev)


def dtype_arg(dtype, fn: str) -> ValueType:
    try:
        return as_dtype(dtype)
    except TypeError as exc:
        raise TypeError(f"{fn}(dtype={dtype!r}): {exc}") from None


def shape_arg(shape, fn: str) -> tuple[int, ...]:
    dims = (shape,) if isinstance(shape, (int, np.integer)) else shape
    try:
        dims = tuple(dims)
    except TypeError:
        raise TypeError(f"{fn}(shape={shape!r}): shape must be an int or a tuple of ints") from None
    if not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0 for d in dims):
        raise ValueError(f"{fn}(shape={shape!r}): shape must be non-negative ints")
    if not 1 <= len(dims) <= MAX_DIMS:
        raise ValueError(f"{fn}(shape={shape!r}): arrays have 1 to {MAX_DIMS} dimensions, got {len(dims)}")
    return tuple(int(d) for d in dims)


def check_grad_dtype(dtype: ValueType, fn: str) -> None:
    if not dtype.is_float:
        raise TypeError(f"{fn}: requires_grad=True needs a floating-point dtype, got {dtype}")


def infer_dtype(values: np.ndarray, from_python: bool, fn: str, inner_ndim: int = 0) -> ValueType:
    """Our type for `values`: NumPy's dtype is kept; Python numbers are float32/int32 (or bool).
    With `inner_ndim` 1 or 2 the trailing dimensions make a vector or matrix type."""
    kind = values.dtype.kind
    if kind not in "biuf":
        raise TypeError(f"{fn}: data must be numbers, got {values.dtype} values")
    if from_python and kind == "f":
        scalar = float32
    elif from_python and kind in "iu":
        info = np.iinfo(np.int32)
        if values.size and (values.min() < info.min or values.max() > info.max):
            raise ValueError(f"{fn}: integer data does not fit in int32; pass dtype=int64")
        scalar = int32
    else:
        try:
            scalar = as_dtype(values.dtype)
        except TypeError as exc:
            raise TypeError(f"{fn}: {exc}; pass dtype= to convert") from None
    if inner_ndim == 1:
        return vector(values.shape[-1], scalar)
    if inner_ndim == 2:
        return matrix(values.shape[-2:], scalar)
    return scalar
