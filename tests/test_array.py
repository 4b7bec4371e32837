"""Arrays on the CPU: creation, dtype inference, NumPy/DLPack interop, versions and gradients."""
import numpy as np
import pytest

from compiler.errors import CompileError
from compiler.runtime import device as device_mod
from compiler.runtime.array import (array, clone, empty, empty_like, full, full_like, ones, ones_like, zeros,
                                    zeros_like)
from compiler.runtime.copy_kernels import copy
from compiler.runtime.device import Device, get_device
from compiler.types import float32, float64, int32, int64, mat33, vec2, vec3, vector


# -- creation and dtype inference -----------------------------------------------------------------
def test_python_floats_are_float32_and_ints_int32(device):
    assert array([1.0, 2.0, 3.0], device=device).dtype == float32
    assert array([1, 2, 3], device=device).dtype == int32
    assert array([[1, 2], [3, 4]], device=device).shape == (2, 2)


def test_numpy_data_keeps_its_dtype(device):
    assert array(np.arange(3, dtype=np.float64), device=device).dtype == float64
    assert array(np.arange(3, dtype=np.int64), device=device).dtype == int64
    assert array(np.zeros(2, np.float32), device=device).dtype == float32


def test_explicit_dtype_converts_and_python_types_are_accepted(device):
    a = array([1, 2, 3], dtype=float, device=device)
    assert a.dtype == float32
    np.testing.assert_array_equal(a.numpy(), [1.0, 2.0, 3.0])
    assert array([1.5], dtype=float64, device=device).numpy().dtype == np.float64
    assert zeros(2, dtype=int, device=device).dtype == int32


def test_vec3_from_n_by_3_numpy(device):
    data = np.arange(12, dtype=np.float32).reshape(4, 3)
    a = array(data, dtype=vec3, device=device)
    assert a.shape == (4,)
    assert a.ndim == 1 and a.size == 4 and len(a) == 4
    assert a.dtype == vec3
    assert a.numpy().shape == (4, 3)
    np.testing.assert_array_equal(a.numpy(), data)


def test_single_vector_becomes_one_element(device):
    assert array([1.0, 2.0, 3.0], dtype=vec3, device=device).shape == (1,)


def test_mat33_and_generic_vectors(device):
    assert array(np.zeros((5, 3, 3)), dtype=mat33, device=device).shape == (5,)
    v5 = array(np.zeros((2, 5)), dtype=vector(5, float64), device=device)
    assert v5.shape == (2,) and v5.numpy().dtype == np.float64


def test_mismatched_trailing_shape_names_what_was_expected(device):
    with pytest.raises(ValueError, match=r"dtype=vec3.*expected data of shape \(\.\.\., 3\).*\(4, 2\)"):
        array(np.zeros((4, 2)), dtype=vec3, device=device)


def test_bad_dtype_names_the_argument(device):
    with pytest.raises(TypeError, match=r"array\(dtype='complex64'\)"):
        array([1.0], dtype="complex64", device=device)
    with pytest.raises(TypeError, match=r"zeros\(dtype=.*str"):
        zeros(3, dtype=str, device=device)


def test_unsupported_numpy_dtype_names_data(device):
    with pytest.raises(TypeError, match=r"array\(data=\.\.\.\).*float16.*dtype="):
        array(np.zeros(3, np.float16), device=device)


def test_bad_shapes_name_the_argument(device):
    with pytest.raises(ValueError, match=r"zeros\(shape=\(1, 1, 1, 1, 1\)\).*1 to 4 dimensions"):
        zeros((1, 1, 1, 1, 1), device=device)
    with pytest.raises(ValueError, match=r"zeros\(shape=-1\)"):
        zeros(-1, device=device)
    with pytest.raises(ValueError, match=r"array\(data=\.\.\.\).*1 to 4 dimensions"):
        array(np.zeros((1, 1, 1, 1, 1)), device=device)
    with pytest.raises(ValueError, match=r"1 to 4 dimensions"):
        array(np.float32(1.0), device=device)


def test_shape_with_data_reshapes_and_checks_size(device):
    assert array(np.arange(6), shape=(2, 3), device=device).shape == (2, 3)
    with pytest.raises(ValueError, match=r"data has 5 values"):
        array(np.arange(5), shape=(2, 3), device=device)


def test_ragged_data_is_a_clear_error(device):
    with pytest.raises(ValueError, match=r"array\(data=\.\.\.\)"):
        array([[1.0, 2.0], [3.0]], device=device)


def test_creation_functions(device):
    np.testing.assert_array_equal(zeros(3, device=device).numpy(), [0, 0, 0])
    np.testing.assert_array_equal(ones((2, 2), dtype=vec2, device=device).numpy(), np.ones((2, 2, 2)))
    assert empty(4, dtype=float64, device=device).numpy().shape == (4,)
    np.testing.assert_array_equal(full(2, 7.5, device=device).numpy(), [7.5, 7.5])
    assert full(2, 7.5, device=device).dtype == float32
    assert full(2, 7, device=device).dtype == int32
    v = full(3, [1.0, 2.0, 3.0], device=device)
    assert v.dtype == vec3
    np.testing.assert_array_equal(v.numpy(), [[1, 2, 3]] * 3)
    assert full(2, np.float64(1.0), device=device).dtype == float64
    np.testing.assert_array_equal(full(2, 0.5, dtype=vec3, device=device).numpy(), np.full((2, 3), 0.5))
    assert zeros(3, device=device).device == str(get_device(device))


def test_like_functions_copy_shape_dtype_device_and_requires_grad(device):
    x = array(np.zeros((2, 3)), dtype=vec3, requires_grad=True, device=device)
    for like in (zeros_like(x), ones_like(x), empty_like(x), full_like(x, 2.0)):
        assert like.shape == (2,) and like.dtype == vec3 and like.requires_grad
        assert like.device == x.device
    assert not zeros_like(x, requires_grad=False).requires_grad
    np.testing.assert_array_equal(full_like(x, 2.0).numpy(), np.full((2, 3), 2.0))


def test_data_is_copied_by_default_and_adopted_with_copy_false():
    data = np.zeros(3, np.float32)
    copied = array(data)
    data[0] = 1.0
    assert copied.numpy()[0] == 0.0
    adopted = array(data, copy=False)
    data[1] = 2.0
    assert adopted.numpy()[1] == 2.0
    assert adopted.ptr == data.ctypes.data


def test_copy_false_refuses_what_it_cannot_adopt():
    with pytest.raises(ValueError, match="copy=False"):
        array(np.zeros(3, np.float64), dtype=float32, copy=False)
    with pytest.raises(ValueError, match="copy=False"):
        array(np.zeros((3, 2), np.float32)[:, 0], copy=False)
    with pytest.raises(ValueError, match="copy=False"):
        array([1.0, 2.0], copy=False)


def test_array_from_array_copies(device):
    a = array([1.0, 2.0], device=device)
    b = array(a, device=device)
    b.fill_(5.0)
    assert a.numpy().tolist() == [1.0, 2.0]
    assert array(a, dtype=float64, device=device).dtype == float64


# -- interop --------------------------------------------------------------------------------------
def test_numpy_is_a_zero_copy_view():
    a = zeros(3, dtype=vec3)
    view = a.numpy()
    view[1] = [1.0, 2.0, 3.0]
    np.testing.assert_array_equal(a.numpy()[1], [1.0, 2.0, 3.0])
    assert view.ctypes.data == a.ptr


def test_strides_are_logical_and_in_bytes(device):
    assert zeros((2, 5), dtype=vec3, device=device).strides == (5 * 12, 12)
    assert zeros(4, dtype=float64, device=device).strides == (8,)


def test_array_interface_is_zero_copy():
    a = array([1.0, 2.0, 3.0])
    iface = a.__array_interface__
    assert iface["shape"] == (3,)
    assert iface["typestr"] == "<f4"
    assert iface["data"][0] == a.ptr
    view = np.asarray(a)
    view[0] = 9.0
    assert a.numpy()[0] == 9.0


def test_dlpack_round_trip():
    a = array(np.arange(6, dtype=np.float32).reshape(2, 3), dtype=vec3)
    assert a.__dlpack_device__() == (1, 0)
    b = np.from_dlpack(a)
    assert b.shape == (2, 3) and b.ctypes.data == a.ptr
    c = array(np.arange(4.0))      # and back: DLPack-only objects are accepted as data
    class OnlyDLPack:
        def __dlpack__(self, *args, **kwargs):
            return c.__dlpack__(*args, **kwargs)

        def __dlpack_device__(self):
            return c.__dlpack_device__()
    np.testing.assert_array_equal(array(OnlyDLPack()).numpy(), [0.0, 1.0, 2.0, 3.0])


def test_repr_shows_values_dtype_and_grad(device):
    name = str(get_device(device))
    assert repr(array([1.0, 2.0], requires_grad=True, device=device)) == \
        f"array([1., 2.], dtype=float32, device='{name}', requires_grad=True)"


def test_reshape_and_flatten_are_views(device):
    a = zeros((2, 3), device=device)
    flat = a.flatten()
    assert flat.shape == (6,)
    flat.fill_(1.0)
    np.testing.assert_array_equal(a.numpy(), np.ones((2, 3)))
    assert a.version == flat.version == 1


# -- versions ---------------------------------------------------------------------------------------
def test_every_host_mutation_bumps_the_version(device):
    a = zeros(3, device=device)
    assert a.version == 0
    a.assign([1.0, 2.0, 3.0])
    assert a.version == 1
    a.fill_(2.0)
    assert a.version == 2
    a.zero_()
    assert a.version == 3
    copy(a, ones(3, device=device))
    assert a.version == 4
    a._mark_written()
    assert a.version == 5
    a.numpy()
    assert a.version == 5


def test_assign_and_fill_check_shapes(device):
    a = zeros(2, dtype=vec3, device=device)
    a.fill_([1.0, 2.0, 3.0])
    np.testing.assert_array_equal(a.numpy(), [[1, 2, 3], [1, 2, 3]])
    with pytest.raises(ValueError, match=r"fill_\(value\).*vec3"):
        a.fill_([1.0, 2.0])
    with pytest.raises(ValueError, match=r"assign\(src\).*\(2, 3\)"):
        a.assign(np.zeros((3, 3)))
    with pytest.raises(ValueError, match=r"assign\(src\)"):
        a.assign(zeros(3, dtype=vec3, device=device))


def test_copy_with_offsets_and_count(device):
    dest = zeros(5, device=device)
    copy(dest, array([1.0, 2.0, 3.0, 4.0], device=device), dest_offset=1, src_offset=2, count=2)
    np.testing.assert_array_equal(dest.numpy(), [0, 3, 4, 0, 0])
    with pytest.raises(ValueError, match=r"dest has only 5 elements"):
        copy(dest, zeros(6, device=device))
    with pytest.raises(TypeError, match=r"dtypes differ"):
        copy(dest, zeros(5, dtype=float64, device=device))
    with pytest.raises(TypeError, match=r"copy\(src=\.\.\.\)"):
        copy(dest, np.zeros(5))


# -- gradients ----------------------------------------------------------------------------------------
def test_requires_grad_allocates_a_zero_grad(device):
    a = array(np.ones((3, 3)), dtype=vec3, requires_grad=True, device=device)
    assert a.grad.shape == (3,) and a.grad.dtype == vec3 and a.grad.device == a.device
    np.testing.assert_array_equal(a.grad.numpy(), np.zeros((3, 3)))
    b = zeros(2, device=device)
    assert b.grad is None and not b.requires_grad
    b.requires_grad = True
    np.testing.assert_array_equal(b.grad.numpy(), [0, 0])
    b.requires_grad = False
    assert b.grad is None


def test_grad_is_assignable_and_checked(device):
    a = zeros(3, device=device)
    g = ones(3, device=device)
    a.grad = g
    assert a.grad is g and a.requires_grad
    with pytest.raises(ValueError, match=r"shape \(3,\)"):
        a.grad = ones(4, device=device)


def test_integer_arrays_cannot_require_grad(device):
    with pytest.raises(TypeError, match="floating-point"):
        zeros(3, dtype=int32, requires_grad=True, device=device)


def test_clone_copies_data_and_requires_grad(device):
    x = array([1.0, 2.0], requires_grad=True, device=device)
    y = clone(x)
    assert y.requires_grad and y.ptr != x.ptr and y.device == x.device
    np.testing.assert_array_equal(y.numpy(), x.numpy())
    assert not clone(x, requires_grad=False).requires_grad


# -- devices --------------------------------------------------------------------------------------------
def test_device_strings():
    assert get_device("cpu") == Device("cpu", 0)
    assert get_device(None) == Device("cpu", 0)
    assert get_device("cuda") == Device("cuda", 0)
    assert get_device("cuda:2") == Device("cuda", 2)
    assert str(get_device("cuda:1")) == "cuda:1"
    with pytest.raises(ValueError, match=r"'cpu', 'cuda' or 'cuda:N'.*'gpu'"):
        get_device("gpu")
    assert zeros(1).device == "cpu"


def test_cuda_without_a_driver_says_what_to_do(monkeypatch):
    monkeypatch.setattr(device_mod, "_probe_driver", lambda: (0, "cuInit returned CUDA_ERROR_NO_DEVICE"))
    device_mod._driver_state.cache_clear()
    try:
        with pytest.raises(RuntimeError, match=r"CUDA device 'cuda:0' requested but no NVIDIA driver/GPU "
                                               r"was found \(cuInit returned CUDA_ERROR_NO_DEVICE\); "
                                               r"use device='cpu'"):
            zeros(3, device="cuda")
    finally:
        device_mod._driver_state.cache_clear()


def test_a_gpu_the_machine_lacks_is_named(monkeypatch):
    monkeypatch.setattr(device_mod, "_probe_driver", lambda: (1, ""))
    device_mod._driver_state.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="has 1 CUDA device"):
            zeros(1, device="cuda:1")
    finally:
        device_mod._driver_state.cache_clear()


def test_real_cuda_probe_gives_a_clear_answer():
    if device_mod.is_cuda_available():
        pytest.skip("this machine has a CUDA device (or STEPPER_CUDA_SIM=1): the probe finds it")
    with pytest.raises(RuntimeError, match="no NVIDIA driver/GPU was found.*STEPPER_CUDA_SIM=1"):
        zeros(1, device="cuda")


# -- CompileError formatting (lives in compiler/errors.py) ------------------------------------------------
def test_compile_error_points_at_the_user_line():
    err = CompileError("cannot assign float64 to 'x', which is float32", "model.py", 12, 8,
                       "        x = y * 2.0\n", hint="write float32(...)")
    assert str(err) == ("model.py:12:9: cannot assign float64 to 'x', which is float32\n"
                        "    x = y * 2.0\n"
                        "    ^\n"
                        "hint: write float32(...)")
    ranged = CompileError("bad", "m.py", 1, 4, "x = foo(1)", end_col=10)
    assert str(ranged).splitlines()[2] == "        ^~~~~~"
    assert str(CompileError("just a message")) == "just a message"


def test_large_cpu_arrays_start_16_bytes_past_a_line_at_staggered_offsets_in_their_pages():
    """compiler/runtime/memory.py: NumPy put every large array 16 bytes into a page; ours start 16
    bytes past a 64-byte line, each a step further into its page than the one before, whichever way
    they are made (new memory, a copy of NumPy data with a dtype conversion, a gradient, a vector dtype): no
    two of them in the same sets of the cache at the same index."""
    from compiler.runtime import memory
    values = np.arange(300 * 300, dtype=np.float64).reshape(300, 300)
    made = [zeros((300, 300), dtype=float32), array(values, dtype=float32),
            empty((100, 300), dtype=vec3), array(values, requires_grad=True)]
    made.append(made[-1].grad)
    addresses = [a.numpy().ctypes.data for a in made]
    assert all(address % memory.LINE_BYTES == memory.PAST_LINE_BYTES for address in addresses)
    offsets = [address % memory.PAGE_BYTES for address in addresses]
    assert len(set(offsets)) == len(offsets)
    np.testing.assert_array_equal(made[1].numpy(), values.astype(np.float32))
    np.testing.assert_array_equal(made[3].numpy(), values)
    assert not made[0].numpy().any() and not made[4].numpy().any()
    assert all(a.numpy().flags.c_contiguous and a.numpy().flags.writeable for a in made)
    small = zeros(16)            # in cache whatever its placement: NumPy's own memory
    assert small.nbytes < memory.STAGGER_FROM_BYTES and small._data.base is None
