"""The kernel language's value types: scalars, small vectors and matrices, and arrays of them.

Type objects are plain frozen dataclasses so they can be compared, hashed into cache keys and used as
`dtype=` arguments. They are also callable: inside a kernel `float64(x)` is a cast and `vec3(0.0)`
a constructor (the frontend sees the call); from Python they build the matching NumPy value.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ScalarType:
    name: str          # the name users write: "float32", "int64", "bool"
    ctype: str         # the C/C++ spelling
    np_dtype: str      # NumPy's spelling

    @property
    def is_float(self) -> bool:
        return self.name.startswith("float")

    @property
    def is_int(self) -> bool:
        return self.name.startswith("int")

    @property
    def scalar(self) -> "ScalarType":
        return self

    @property
    def size(self) -> int:
        return np.dtype(self.np_dtype).itemsize

    @property
    def inner_shape(self) -> tuple[int, ...]:
        return ()

    def __call__(self, *args):
        if len(args) != 1:
            raise TypeError(f"{self.name}() takes one value, got {len(args)}")
        return np.dtype(self.np_dtype).type(args[0])

    def __repr__(self) -> str:
        return self.name


float32 = ScalarType("float32", "float", "float32")
float64 = ScalarType("float64", "double", "float64")
int32 = ScalarType("int32", "int32_t", "int32")
int64 = ScalarType("int64", "int64_t", "int64")
bool_ = ScalarType("bool", "bool", "bool")


@dataclass(frozen=True)
class VectorType:
    length: int
    scalar: ScalarType

    @property
    def name(self) -> str:
        suffix = "" if self.scalar == float32 else self.scalar.name[0] + self.scalar.name[-2:]
        return f"vec{self.length}{suffix}"

    @property
    def ctype(self) -> str:
        return f"vec_t<{self.length}, {self.scalar.ctype}>"

    @property
    def np_dtype(self) -> str:
        return self.scalar.np_dtype

    @property
    def is_float(self) -> bool:
        return self.scalar.is_float

    is_int = False

    @property
    def size(self) -> int:
        return self.length * self.scalar.size

    @property
    def inner_shape(self) -> tuple[int, ...]:
        return (self.length,)

    def __call__(self, *args):
        return _construct(self, args)

    def __repr__(self) -> str:
        return self.name


@dataclass(frozen=True)
class MatrixType:
    rows: int
    cols: int
    scalar: ScalarType

    @property
    def name(self) -> str:
        suffix = "" if self.scalar == float32 else self.scalar.name[0] + self.scalar.name[-2:]
        return f"mat{self.rows}{self.cols}{suffix}"

    @property
    def ctype(self) -> str:
        return f"mat_t<{self.rows}, {self.cols}, {self.scalar.ctype}>"

    @property
    def np_dtype(self) -> str:
        return self.scalar.np_dtype

    @property
    def is_float(self) -> bool:
        return self.scalar.is_float

    is_int = False

    @property
    def size(self) -> int:
        return self.rows * self.cols * self.scalar.size

    @property
    def inner_shape(self) -> tuple[int, ...]:
        return (self.rows, self.cols)

    def __call__(self, *args):
        return _construct(self, args)

    def __repr__(self) -> str:
        return self.name


ValueType = ScalarType | VectorType | MatrixType


@dataclass(frozen=True)
class ArrayType:
    """The type of an array argument: `array(dtype=vec3, ndim=1)` in a kernel's annotations."""
    dtype: ValueType
    ndim: int = 1

    def __repr__(self) -> str:
        return f"array(dtype={self.dtype!r}, ndim={self.ndim})"


class ArrayAnnotation:
    """The base of the runtime's `array` class, whose call without data, ``array(dtype=vec3, ndim=2)``,
    spells an `ArrayType`: the frontend, which sits below the runtime and does not import it, reads
    such a call in an annotation by this base."""
    __slots__ = ()


def vector(length: int, dtype=float32) -> VectorType:
    """A vector type of `length` elements of `dtype`, e.g. `vector(3, float64)`."""
    if not (isinstance(length, int) and 1 <= length <= 16):
        raise ValueError(f"vector length must be an int in 1..16, got {length!r}")
    return VectorType(length, as_scalar(dtype))


def matrix(shape: tuple[int, int], dtype=float32) -> MatrixType:
    """A matrix type of `shape` = (rows, cols), e.g. `matrix((3, 3), float64)`."""
    rows, cols = shape
    if not all(isinstance(k, int) and 1 <= k <= 8 for k in (rows, cols)):
        raise ValueError(f"matrix shape must be two ints in 1..8, got {shape!r}")
    return MatrixType(rows, cols, as_scalar(dtype))


vec2, vec3, vec4 = (VectorType(n, float32) for n in (2, 3, 4))
mat22, mat33, mat44 = (MatrixType(n, n, float32) for n in (2, 3, 4))

SCALARS = {t.name: t for t in (float32, float64, int32, int64, bool_)}


def as_scalar(dtype) -> ScalarType:
    t = as_dtype(dtype)
    if not isinstance(t, ScalarType):
        raise TypeError(f"expected a scalar dtype, got {t!r}")
    return t


def as_dtype(dtype) -> ValueType:
    """Accept our type objects, Python `float`/`int`/`bool`, NumPy dtypes and their names."""
    if isinstance(dtype, (ScalarType, VectorType, MatrixType)):
        return dtype
    if dtype is float:
        return float32
    if dtype is int:
        return int32
    if dtype is bool:
        return bool_
    try:
        if isinstance(dtype, type) and not issubclass(dtype, np.generic):
            raise TypeError          # list, dict, str...: NumPy would call them "object"
        name = np.dtype(dtype).name
    except TypeError:
        raise TypeError(f"{dtype!r} is not a dtype; use float32, float64, int32, int64, bool, "
                        "vec2/vec3/vec4, mat22/mat33/mat44, vector(n, dtype) or matrix((r, c), dtype)") from None
    if name not in SCALARS:
        raise TypeError(f"NumPy dtype {name} is not supported; use float32, float64, int32, int64 or bool")
    return SCALARS[name]


def _construct(t: VectorType | MatrixType, args) -> np.ndarray:
    shape = t.inner_shape
    if not args:
        return np.zeros(shape, t.np_dtype)
    if len(args) == 1:
        return np.broadcast_to(np.asarray(args[0], t.np_dtype), shape).copy()
    return np.asarray(args, t.np_dtype).reshape(shape)
