"""Arrays: typed n-dimensional buffers (1 to 4 dimensions) of scalars, vectors or matrices.

On the CPU an `array` owns a C-contiguous NumPy ndarray whose shape is the logical shape followed by
the element's inner shape: ``zeros(n, dtype=vec3)`` is backed by a float32 ``(n, 3)`` ndarray, which
``numpy()`` returns without copying. On a GPU (``device="cuda"``) it owns a `DeviceMemory` of the
same shape instead; ``numpy()`` then returns a host copy, and ``__cuda_array_interface__`` shares
the memory with CuPy, PyTorch or Numba without copying. Every host-side mutation (``assign``, ``fill_``, ``zero_``,
``copy`` into it) and every kernel launch that writes it bumps ``version``; the `Tape` uses this to
refuse gradients computed from overwritten data. Writes through ``numpy()`` views are not seen.

``copy``, ``clone`` and ``assign`` from an array are differentiable: on a recording `Tape` the
gradient flows from the destination's ``.grad`` back into the source's ``.grad``.
"""
from __future__ import annotations

import math

import numpy as np

from ..types import ArrayAnnotation, ArrayType, ValueType, float32
from .arguments import check_device as _check_device, check_grad_dtype as _check_grad_dtype, dtype_arg as _dtype_arg
from .arguments import MAX_DIMS, infer_dtype as _infer_dtype, shape_arg as _shape_arg
from .dlpack import adopt, to_dlpack
from .memory import adopt_cuda, allocate, copied, gpu_device_of, on_gpu
from .tape import RecordedOp, _describe_array, active_tape, caller_location, settle, settle_for_host

__all__ = ["array", "zeros", "ones", "full", "empty", "zeros_like", "ones_like", "full_like",
           "empty_like", "clone", "from_dlpack"]



class _Storage:
    """The buffer identity that views share: one version counter per piece of memory."""
    __slots__ = ("version",)

    def __init__(self):
        self.version = 0


def _noop() -> None:
    pass


def _from_data(data, dtype, shape, copy: bool, device: str):
    """(ndarray or DeviceMemory on `device`, dtype, shared storage or None) for ``array(data, ...)``."""
    fn = "array(data=...)"
    dt = None if dtype is None else _dtype_arg(dtype, "array")
    storage = None
    if isinstance(data, array) and not copy:
        if data.device != device:
            raise ValueError(f"{fn}: copy=False views an array on its own device ({data.device}), not on "
                             f"{device}; use copy=True or .to('{device}')")
        if dt is not None and dt != data.dtype:
            raise ValueError(f"{fn}: copy=False keeps the dtype ({data.dtype}); got dtype={dt}")
        values = data._data if shape is None else data._data.reshape(_shape_arg(shape, "array") + data.dtype.inner_shape)
        return values, data.dtype, data._storage
    if isinstance(data, array):
        settle()
        src, dt = data.numpy(), dt or data.dtype
    elif on_gpu(data):
        memory, where = adopt_cuda(data, fn)
        if not copy:
            if device != where:
                raise ValueError(f"{fn}: copy=False adopts the device memory of the data, which is on {where}; "
                                 f"pass device='{where}'")
            dt = dt or _infer_dtype(np.empty(0, memory.dtype), False, fn)
            if np.dtype(dt.np_dtype) != memory.dtype:
                raise ValueError(f"{fn}: copy=False keeps the data's dtype ({memory.dtype}); got dtype={dt}")
            values = memory.reshape(_shape_arg(shape, "array") + dt.inner_shape) if shape is not None else memory
            if shape is None and dt.inner_shape:
                values = memory.reshape((-1,) + dt.inner_shape)
            return values, dt, None
        src = memory.to_host()
        dt = dt or _infer_dtype(src, False, fn)
    elif isinstance(data, np.ndarray) or hasattr(data, "__array_interface__") or hasattr(data, "__dlpack__"):
        src = data if isinstance(data, np.ndarray) else (
            np.asarray(data) if hasattr(data, "__array_interface__") else np.from_dlpack(data))
        dt = dt or _infer_dtype(src, False, fn)
    else:
        if not copy:
            raise ValueError(f"{fn}: copy=False adopts an existing NumPy array; got {type(data).__name__}")
        try:
            src = np.asarray(data) if dt is None else np.asarray(data, dtype=dt.np_dtype)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{fn}: data cannot be converted to {dt or 'a numeric array'}: {exc}") from None
        dt = dt or _infer_dtype(src, True, fn)
    inner = dt.inner_shape
    if shape is not None:
        want = _shape_arg(shape, "array") + inner
        if src.size != math.prod(want):
            raise ValueError(f"array(data, shape={shape!r}, dtype={dt}): data has {src.size} values, "
                             f"but shape {want[:len(want) - len(inner)]} of {dt} needs {math.prod(want)}")
        src = src.reshape(want)
    elif inner:
        if src.shape == inner:   # a single vector/matrix
            src = src.reshape((1,) + inner)
        elif src.ndim <= len(inner) or src.shape[src.ndim - len(inner):] != inner:
            expected = "(..., " + ", ".join(map(str, inner)) + ")"
            raise ValueError(f"array(data, dtype={dt}): expected data of shape {expected} for {dt} "
                             f"elements, got shape {src.shape}")
    if copy:
        return copied(device, src, dt.np_dtype), dt, None
    if device != "cpu":
        raise ValueError(f"{fn}: copy=False adopts host memory as a CPU array; for {device} pass an array "
                         "with __cuda_array_interface__ (CuPy, PyTorch) or use copy=True")
    if src.dtype != np.dtype(dt.np_dtype) or not src.flags.c_contiguous or not src.flags.writeable:
        raise ValueError(f"array(data, copy=False): data must be a writeable C-contiguous "
                         f"{dt.np_dtype} array to be adopted without copying (got {src.dtype}, "
                         f"contiguous={src.flags.c_contiguous}, writeable={src.flags.writeable}); "
                         "use copy=True")
    return src, dt, storage


def _values_for(dt: ValueType, value, fn: str) -> np.ndarray:
    """`value` as NumPy values of `dt`'s scalar type, broadcastable to one element of `dt`."""
    values = value.numpy() if isinstance(value, array) else value
    try:
        values = np.asarray(values, dtype=dt.np_dtype)
        np.broadcast_to(values, dt.inner_shape)
    except (ValueError, TypeError):
        raise ValueError(f"{fn}: value {value!r} does not fit an element of type {dt} "
                         f"(shape {dt.inner_shape})") from None
    return values


# -- the array ---------------------------------------------------------------------------------------
class array(ArrayAnnotation):
    """A typed array on the CPU or a GPU; `data` may be a list, a NumPy array, another array, any
    DLPack object, or a GPU array with ``__cuda_array_interface__`` (CuPy, PyTorch, Numba).

    - device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``; by default the data's own GPU if it is on one,
      else the CPU.

    - dtype: inferred when omitted. NumPy data keeps its dtype; Python floats become float32 and
      ints int32 (as literals in kernels do). ``dtype=vec3`` with ``(n, 3)`` data gives n vectors.
      ``float``/``int`` mean float32/int32.
    - copy: by default the data are copied. ``copy=False`` adopts a writeable C-contiguous NumPy
      array of the right dtype without copying (or views another array), else raises ValueError.
    - shape: without data, a zero-filled array of that shape; with data, the data reshaped to it.

    >>> x = array([[0.0, 1.0, 2.0]], dtype=vec3, requires_grad=True)
    >>> x.shape, x.numpy().shape, x.grad.numpy()
    ((1,), (1, 3), array([[0., 0., 0.]], dtype=float32))
    """

    def __new__(cls, data=None, dtype=None, shape=None, *args, ndim=None, **kwargs):
        # `array(dtype=float, ndim=2)` without data or shape is a kernel annotation: the array's type.
        if data is None and shape is None:
            if ndim is None and dtype is None:
                raise ValueError("array(): give data or shape (or dtype=/ndim= for a kernel annotation)")
            return ArrayType(_dtype_arg(float32 if dtype is None else dtype, "array"), 1 if ndim is None else ndim)
        return super().__new__(cls)

    def __init__(self, data=None, dtype=None, shape=None, device=None, requires_grad: bool = False,
                 copy: bool = True, ndim=None):
        if device is None:      # the data's own device if it lives on a GPU, else the CPU
            device = data.device if isinstance(data, array) else gpu_device_of(data) if on_gpu(data) else "cpu"
        device = _check_device(device, "array")
        if ndim is not None and shape is None and data is None:
            raise ValueError("array(): ndim= is for kernel annotations; give data or shape to create an array")
        if data is None:
            if shape is None:
                raise ValueError("array(): give data or shape")
            dt = _dtype_arg(float32 if dtype is None else dtype, "array")
            values, storage = allocate(device, _shape_arg(shape, "array") + dt.inner_shape, dt.np_dtype, True), None
        else:
            values, dt, storage = _from_data(data, dtype, shape, copy, device)
        self._setup(values, dt, storage, device, requires_grad, "array(data=...)")

    def _setup(self, values: np.ndarray, dtype: ValueType, storage, device: str, requires_grad: bool,
               fn: str) -> None:
        ndim = values.ndim - len(dtype.inner_shape)
        if not 1 <= ndim <= MAX_DIMS:
            raise ValueError(f"{fn}: arrays have 1 to {MAX_DIMS} dimensions, got {ndim} "
                             f"(data of shape {values.shape} with {dtype} elements)")
        self._data = values
        self._dtype = dtype
        self._ndim = ndim
        self._storage = storage or _Storage()
        self._device = device
        self._grad = None
        if requires_grad:
            self.requires_grad = True

    @classmethod
    def _wrap(cls, values, dtype: ValueType, requires_grad: bool = False, storage=None,
              fn: str = "array", device: str = "cpu") -> "array":
        obj = object.__new__(cls)
        obj._setup(values, dtype, storage, device, requires_grad, fn)
        return obj

    # -- properties --------------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return self._data.shape[:self._ndim]

    @property
    def ndim(self) -> int:
        return self._ndim

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def dtype(self) -> ValueType:
        return self._dtype

    @property
    def device(self) -> str:
        return self._device

    @property
    def strides(self) -> tuple[int, ...]:
        """Bytes between consecutive elements along each logical dimension."""
        return self._data.strides[:self._ndim]

    @property
    def ptr(self) -> int:
        """Address of the first element (a device address for a GPU array)."""
        settle()
        return self._data.ctypes.data if self._device == "cpu" else self._data.ptr

    @property
    def nbytes(self) -> int:
        """Bytes of memory the elements take."""
        return self._data.nbytes

    @property
    def version(self) -> int:
        """Bumped by every write the runtime sees: ``assign``, ``fill_``, ``zero_``, copy and kernel launches."""
        return self._storage.version

    @property
    def requires_grad(self) -> bool:
        return self._grad is not None

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        if value and self._grad is None:
            _check_grad_dtype(self._dtype, "array")
            self._grad = array._wrap(allocate(self._device, self._data.shape, self._data.dtype, True), self._dtype,
                                     device=self._device)
        elif not value:
            self._grad = None

    @property
    def grad(self) -> "array | None":
        """The gradient: an array of the same shape and dtype, or None without requires_grad."""
        return self._grad

    @grad.setter
    def grad(self, value: "array | None") -> None:
        if value is not None:
            if not isinstance(value, array):
                raise TypeError(f"array.grad must be an array or None, got {type(value).__name__}")
            if value.shape != self.shape or value.dtype != self.dtype:
                raise ValueError(f"array.grad must have shape {self.shape} and dtype {self.dtype}, got "
                                 f"shape {value.shape} and dtype {value.dtype}")
            if value.device != self.device:
                raise ValueError(f"array.grad must be on the array's device ({self.device}), got one on "
                                 f"{value.device}")
            _check_grad_dtype(self._dtype, "array.grad")
        self._grad = value

    # -- interop -----------------------------------------------------------------------------------
    # Every way to the data on the host settles held launches first (see Tape.defer_launches).
    def numpy(self) -> np.ndarray:
        """The data as NumPy values, shape ``self.shape + dtype.inner_shape``: a view on the CPU (no
        copy), a host copy of a GPU array (writes to it do not reach the device: use `assign`)."""
        settle_for_host()
        return self._data.view() if self._device == "cpu" else self._data.to_host()

    @property
    def __array_interface__(self) -> dict:
        if self._device != "cpu":
            raise AttributeError(f"an array on {self._device} has no __array_interface__ (its memory is on the "
                                 "GPU); use .numpy() for a host copy")
        settle_for_host()
        return self._data.__array_interface__

    def __array__(self, dtype=None, copy=None):
        if self._device != "cpu":
            raise TypeError(f"an array on {self._device} does not convert to NumPy implicitly; use .numpy() for "
                            "a host copy")
        settle_for_host()
        return self._data if dtype is None else self._data.astype(dtype)

    @property
    def __cuda_array_interface__(self) -> dict:
        if self._device == "cpu":
            raise AttributeError("a CPU array has no __cuda_array_interface__; move it with .to('cuda')")
        settle_for_host()
        return self._data.cuda_array_interface()

    def __dlpack__(self, *args, **kwargs):
        settle_for_host()
        if self._device != "cpu":
            return to_dlpack(self._data, kwargs.get("stream"))
        return self._data.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        if self._device != "cpu":
            return (2, self._data.ordinal)           # kDLCUDA
        return self._data.__dlpack_device__()

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        body = np.array2string(self.numpy(), separator=", ", prefix="array(")
        grad = ", requires_grad=True" if self.requires_grad else ""
        return f"array({body}, dtype={self._dtype}, device='{self._device}'{grad})"

    def __str__(self) -> str:
        return str(self.numpy())

    def to(self, device) -> "array":
        """This array on `device`: itself if it is there already, else a copy there (differentiable on
        a Tape, like `clone`)."""
        device = _check_device(device, "array.to")
        return self if device == self._device else clone(self, device=device)

    def reshape(self, shape) -> "array":
        """A view with another logical shape and the same elements (shares memory, version and grad)."""
        dims = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        try:
            values = self._data.reshape(dims + self._dtype.inner_shape)
        except ValueError:
            raise ValueError(f"array.reshape({shape!r}): cannot view {self.size} elements as {dims}") from None
        view = array._wrap(values, self._dtype, storage=self._storage, fn=f"array.reshape({shape!r})",
                           device=self._device)
        if self._grad is not None:
            view._grad = self._grad.reshape(dims)
        return view

    def flatten(self) -> "array":
        """A 1-d view of all elements (shares memory, version and grad)."""
        return self.reshape(-1)

    # -- writes ------------------------------------------------------------------------------------
    def _mark_written(self) -> None:
        """Record that the data changed: bumps the version (kernel launches call this)."""
        self._storage.version += 1
        tape = active_tape()
        if tape is not None:
            tape._note_write(self)

    def _host_write(self, name: str) -> None:
        settle()
        tape = active_tape()
        if tape is not None:
            tape.check_writes(RecordedOp(name, {}, {"array": self}, {}, _noop, caller_location()))

    def assign(self, src) -> "array":
        """Overwrite all elements with `src` (an array of the same shape and dtype, or array-like).
        Differentiable when `src` is an array: on a tape, gradients flow back into ``src.grad``."""
        if isinstance(src, array):
            if src.shape != self.shape or src.dtype != self.dtype:
                raise ValueError(f"array.assign(src): src has shape {src.shape} and dtype {src.dtype}, "
                                 f"expected shape {self.shape} and dtype {self.dtype}")
            copy_elements("array.assign(src)", self, src, 0, 0, self.size)
            return self
        try:
            values = np.asarray(src, dtype=self._dtype.np_dtype)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"array.assign(src): src cannot be converted to {self._dtype}: {exc}") from None
        if values.shape != self._data.shape:
            raise ValueError(f"array.assign(src): src has shape {values.shape}, expected "
                             f"{self._data.shape} ({self.shape} of {self._dtype})")
        self._host_write("array.assign(src)")
        self._write_host(values)
        self._mark_written()
        return self

    def fill_(self, value) -> "array":
        """Set every element to `value` (a number, or one vector/matrix for such dtypes)."""
        values = _values_for(self._dtype, value, "array.fill_(value)")
        self._host_write("array.fill_(value)")
        self._write_host(values)
        self._mark_written()
        return self

    def zero_(self) -> "array":
        """Set every element to zero."""
        self._host_write("array.zero_()")
        self._zero_memory()
        self._mark_written()
        return self

    def _seed_values(self, seed, where: str) -> np.ndarray:
        """`seed` (an array or array-like) as NumPy values of this array's gradient, for
        Tape.backward(grads=...); the message names `where` and what did not fit."""
        if self.grad is None:
            raise ValueError(f"{where}: the {_describe_array(self)} has no gradient; create it with "
                             "requires_grad=True before recording")
        target = self.grad._data
        values = seed.numpy() if isinstance(seed, array) else seed
        try:
            return np.array(np.broadcast_to(np.asarray(values, target.dtype), target.shape))
        except ValueError:
            raise ValueError(f"{where}: seed of shape {np.shape(values)} does not match the "
                             f"{_describe_array(self)} (expected {target.shape})") from None

    # -- memory, whatever the device (no version bump: callers decide what counts as a write) --------
    def _write_host(self, values) -> None:
        """Set the elements from NumPy `values` broadcast to ``numpy().shape``."""
        if self._device == "cpu":
            self._data[...] = values
        else:
            self._data.write(values)

    def _zero_memory(self) -> None:
        if self._device == "cpu":
            self._data.fill(0)
        else:
            self._data.zero()

    def _add_host(self, values, offset: int = 0, count: int | None = None) -> None:
        """Add NumPy `values` (broadcast to ``numpy().shape``) to every element, or add `values` to
        `count` flat elements from `offset`."""
        host = self._data if self._device == "cpu" else self._data.to_host()
        if count is None:
            host += values
        else:
            host.reshape((-1,) + self._dtype.inner_shape)[offset:offset + count] += values
        if self._device != "cpu":
            self._data.write(host)


# -- copies ------------------------------------------------------------------------------------------
def _flat(a: array) -> np.ndarray:
    """The elements as a flat NumPy sequence: a view on the CPU, a host copy of a GPU array."""
    return (a._data if a._device == "cpu" else a._data.to_host()).reshape((-1,) + a._dtype.inner_shape)


def copy_elements(name: str, dest: array, src: array, dest_offset: int, src_offset: int, count: int):
    """Copy `count` flat elements from `src` into `dest` on the host's side (recorded on a Tape as
    one differentiable operation named `name`)."""
    settle()
    tape = active_tape()
    if tape is not None:
        def backward():
            if dest.grad is not None and src.grad is not None:
                src.grad._add_host(_flat(dest.grad)[dest_offset:dest_offset + count], src_offset, count)
        op = RecordedOp(name, {"src": src}, {"dest": dest}, {}, backward, caller_location())
        if dest.requires_grad and src.requires_grad:
            tape.record(op)
        else:
            tape.check_writes(op)
    _move_elements(dest, src, dest_offset, src_offset, count)
    dest._mark_written()


def _move_elements(dest: array, src: array, dest_offset: int, src_offset: int, count: int) -> None:
    """Copy `count` flat elements between arrays on any devices (device to device stays there)."""
    if dest.device == "cpu" and src.device == "cpu":
        _flat(dest)[dest_offset:dest_offset + count] = _flat(src)[src_offset:src_offset + count]
        return
    size = dest.dtype.size
    if dest.device != "cpu" and src.device != "cpu":
        dest._data.copy_bytes_from(src._data, dest_offset * size, src_offset * size, count * size)
    elif dest.device != "cpu":
        dest._data.buffer.copy_from_host(_flat(src)[src_offset:src_offset + count], dest._data.offset + dest_offset * size)
    else:
        _flat(dest)[dest_offset:dest_offset + count] = _flat(src)[src_offset:src_offset + count]


def clone(src: array, device=None, requires_grad: bool | None = None) -> array:
    """A new array with a copy of `src`'s data. `requires_grad` defaults to `src`'s; on a tape the
    clone is differentiable (``clone(x, requires_grad=False)`` detaches, like ``x.clone().detach()``)."""
    if not isinstance(src, array):
        raise TypeError(f"clone(src=...): expected an array, got {type(src).__name__}")
    device = src.device if device is None else _check_device(device, "clone")
    grad = src.requires_grad if requires_grad is None else requires_grad
    settle()
    out = array._wrap(allocate(device, src._data.shape, src._data.dtype, False), src.dtype, requires_grad=grad,
                      device=device)
    _move_elements(out, src, 0, 0, src.size)
    tape = active_tape()
    if tape is not None and grad and src.requires_grad:
        def backward():
            if out.grad is not None and src.grad is not None:
                src.grad._add_host(out.grad.numpy())
        tape.record(RecordedOp("clone(src)", {"src": src}, {"clone": out}, {}, backward, caller_location()))
    return out


# -- creation ----------------------------------------------------------------------------------------
def _new(fn: str, shape, dtype, device, requires_grad: bool, zero: bool) -> array:
    device = _check_device(device, fn)
    dt = _dtype_arg(dtype, fn)
    shape = _shape_arg(shape, fn)
    try:
        values = allocate(device, shape + dt.inner_shape, dt.np_dtype, zero)
    except MemoryError as e:
        raise MemoryError(f"{fn}(shape={shape}, dtype={dt}, device='{device}'): {e}") from None
    return array._wrap(values, dt, requires_grad=requires_grad, fn=fn, device=device)


def zeros(shape, dtype=float, device="cpu", requires_grad: bool = False) -> array:
    """An array of zeros, e.g. ``zeros(n, dtype=vec3, requires_grad=True)``."""
    return _new("zeros", shape, dtype, device, requires_grad, True)


def ones(shape, dtype=float, device="cpu", requires_grad: bool = False) -> array:
    """An array of ones (every component of vectors and matrices)."""
    out = _new("ones", shape, dtype, device, requires_grad, False)
    out._write_host(1)
    return out


def empty(shape, dtype=float, device="cpu", requires_grad: bool = False) -> array:
    """An array whose contents are undefined until written (its grad, if any, is zero)."""
    return _new("empty", shape, dtype, device, requires_grad, False)


def full(shape, value=0, dtype=None, device="cpu", requires_grad: bool = False) -> array:
    """An array with every element `value`. Without `dtype` it follows `value`: a float gives float32,
    an int int32, a 3-sequence a vec3, a 3x3 nested sequence a mat33, a NumPy value its own dtype."""
    if dtype is None:
        raw = np.asarray(value)
        if raw.ndim > 2:
            raise ValueError(f"full(value={value!r}): value must be a number, vector or matrix")
        dtype = _infer_dtype(raw, not isinstance(value, (np.ndarray, np.generic)), "full(value=...)",
                             raw.ndim)
    out = _new("full", shape, dtype, device, requires_grad, False)
    out._write_host(_values_for(out.dtype, value, "full(value=...)"))
    return out


def _like(fn: str, src: array, device, requires_grad) -> tuple:
    if not isinstance(src, array):
        raise TypeError(f"{fn}(src=...): expected an array, got {type(src).__name__}")
    grad = src.requires_grad if requires_grad is None else requires_grad
    return src.shape, src.dtype, device or src.device, grad


def zeros_like(src: array, device=None, requires_grad: bool | None = None) -> array:
    """Zeros with `src`'s shape and dtype (and its requires_grad unless given)."""
    return zeros(*_like("zeros_like", src, device, requires_grad))


def ones_like(src: array, device=None, requires_grad: bool | None = None) -> array:
    """Ones with `src`'s shape and dtype (and its requires_grad unless given)."""
    return ones(*_like("ones_like", src, device, requires_grad))


def empty_like(src: array, device=None, requires_grad: bool | None = None) -> array:
    """An uninitialised array with `src`'s shape and dtype (and its requires_grad unless given)."""
    return empty(*_like("empty_like", src, device, requires_grad))


def full_like(src: array, value, device=None, requires_grad: bool | None = None) -> array:
    """`value` everywhere, with `src`'s shape and dtype (and its requires_grad unless given)."""
    shape, dtype, device, grad = _like("full_like", src, device, requires_grad)
    return full(shape, value, dtype, device, grad)


def from_dlpack(data, dtype=None, requires_grad: bool = False) -> "array":
    """An array sharing the memory of any DLPack object (JAX, PyTorch, CuPy, NumPy), on its device,
    without copying; `dtype` may give a vector or matrix type whose trailing dimensions the data has
    (``from_dlpack(torch_xyz, dtype=vec3)`` for an ``(n, 3)`` tensor)."""
    if not hasattr(data, "__dlpack__"):
        raise TypeError(f"from_dlpack(data=...): {type(data).__name__} does not implement __dlpack__")
    memory, device = adopt(data)
    dt = _dtype_arg(dtype, "from_dlpack") if dtype is not None else _infer_dtype(np.empty(0, memory.dtype), False,
                                                                                 "from_dlpack")
    if np.dtype(dt.np_dtype) != memory.dtype:
        raise ValueError(f"from_dlpack(data, dtype={dt}): the data holds {memory.dtype} values; no copy converts them")
    if dt.inner_shape and tuple(memory.shape[-len(dt.inner_shape):]) != dt.inner_shape:
        raise ValueError(f"from_dlpack(data, dtype={dt}): data of shape {memory.shape} does not end in {dt.inner_shape}")
    out = array._wrap(memory, dt, fn="from_dlpack(data)", device=_check_device(device, "from_dlpack"))
    if requires_grad:
        out.requires_grad = True
    return out
