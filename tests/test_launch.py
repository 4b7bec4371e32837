"""Launching kernels: 1-4D grids and arrays, atomics under many threads, argument errors, debug bounds
checks, and gradients through the Tape (copies, repeated backward, batched Jacobians)."""
import numpy as np
import pytest

import compiler as sp
from compiler.runtime.launch import LaunchError
from compiler.runtime.device import is_cuda_available

f64 = sp.float64
vec3d = sp.vector(3, sp.float64)
vec2d = sp.vector(2, sp.float64)


# ---- multi-dimensional launches -------------------------------------------------------------------
@sp.kernel
def index_1d(out: sp.array(dtype=int)):
    i = sp.tid()
    out[i] = i


@sp.kernel
def index_2d(out: sp.array(dtype=int, ndim=2)):
    i, j = sp.tid()
    out[i, j] = i * 10 + j


@sp.kernel
def index_3d(out: sp.array(dtype=int, ndim=3)):
    i, j, k = sp.tid()
    out[i, j, k] = i * 100 + j * 10 + k


@sp.kernel
def index_4d(out: sp.array(dtype=int, ndim=4)):
    i, j, k, l = sp.tid()
    out[i, j, k, l] = i * 1000 + j * 100 + k * 10 + l


@sp.kernel
def transpose_2d(a: sp.array(dtype=sp.float64, ndim=2), out: sp.array(dtype=sp.float64, ndim=2)):
    i, j = sp.tid()
    out[j, i] = a[i, j] * 2.0 + sp.float64(a.shape[1])


@sp.kernel
def reduce_4d(a: sp.array(dtype=sp.float64, ndim=4), out: sp.array(dtype=sp.float64, ndim=3)):
    i, j, k = sp.tid()
    s = sp.float64(0.0)
    for l in range(a.shape[3]):
        s = s + a[i, j, k, l]
    out[i, j, k] = s


def expected_indices(shape):
    weights = [10 ** (len(shape) - 1 - d) for d in range(len(shape))]
    return sum(w * np.arange(n).reshape([-1 if d == k else 1 for d in range(len(shape))])
               for k, (w, n) in enumerate(zip(weights, shape)))


@pytest.mark.parametrize("kernel, shape", [(index_1d, (7,)), (index_2d, (3, 5)), (index_3d, (2, 3, 4)),
                                           (index_4d, (2, 3, 4, 5))], ids=["1d", "2d", "3d", "4d"])
def test_tid_gives_one_index_per_dimension(kernel, shape, device):
    out = sp.zeros(shape, dtype=int, device=device)
    sp.launch(kernel, shape if len(shape) > 1 else shape[0], outputs=[out])
    np.testing.assert_array_equal(out.numpy(), expected_indices(shape))


def test_2d_and_4d_arrays_with_array_shape(device):
    a = np.arange(12.0).reshape(3, 4)
    out = sp.zeros((4, 3), dtype=sp.float64, device=device)
    sp.launch(transpose_2d, (3, 4), inputs=[sp.array(a, device=device)], outputs=[out])
    np.testing.assert_array_equal(out.numpy(), a.T * 2 + 4)

    b = np.random.default_rng(0).standard_normal((2, 3, 4, 5))
    out = sp.zeros((2, 3, 4), dtype=sp.float64, device=device)
    sp.launch(reduce_4d, (2, 3, 4), inputs=[sp.array(b, device=device)], outputs=[out])
    np.testing.assert_allclose(out.numpy(), b.sum(axis=3), rtol=1e-15)


def test_launch_with_fewer_dims_than_tid_unpacks_is_an_error(device):
    with pytest.raises(LaunchError, match="index_2d"):
        sp.launch(index_2d, 6, outputs=[sp.zeros((2, 3), dtype=int, device=device)])


@sp.kernel
def laplacian_2d(u: sp.array(dtype=f64, ndim=2), out: sp.array(dtype=f64, ndim=2)):
    i, j = sp.tid()
    v = f64(0.0)
    if i > 0 and j > 0 and i < u.shape[0] - 1 and j < u.shape[1] - 1:
        v = u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1] - 4.0 * u[i, j] * u[i, j]
    out[i, j] = v


def test_a_launch_with_more_dims_than_tid_unpacks_folds_the_leading_ones_into_the_first(device):
    """A 2-D kernel launched over (2, 3, 4): tid()'s first index spans the leading axes (6), its second
    the last one (4), in the threads, the extent checks and the gather form of the adjoint alike (the
    threads once ran (8, 3) where the check took (2, 3): a (6, 4) output was written past its end)."""
    out = sp.zeros((6, 4), dtype=int, device=device)
    sp.launch(index_2d, (2, 3, 4), outputs=[out])
    np.testing.assert_array_equal(out.numpy(), expected_indices((6, 4)))
    with pytest.raises(LaunchError, match=r"argument 'out' has shape \(8, 3\)"):
        sp.launch(index_2d, (2, 3, 4), outputs=[sp.zeros((8, 3), dtype=int, device=device)])
    assert laplacian_2d.compiled().gather is not None
    seed = np.random.default_rng(3).standard_normal((6, 4))
    grads = []
    for dim in [(2, 3, 4), (6, 4)]:
        u = sp.array(np.random.default_rng(2).standard_normal((6, 4)), requires_grad=True, device=device)
        out = sp.zeros((6, 4), dtype=sp.float64, requires_grad=True, device=device)
        tape = sp.Tape()
        with tape:
            sp.launch(laplacian_2d, dim, inputs=[u], outputs=[out])
        tape.backward(grads={out: seed})
        grads.append(u.grad.numpy())
    np.testing.assert_array_equal(grads[0], grads[1])
    expected = np.zeros((6, 4))
    u0 = np.random.default_rng(2).standard_normal((6, 4))
    for i in range(1, 5):
        for j in range(1, 3):
            for di, dj in ((-1, 0), (1, 0), (0, -1), (0, 1)):
                expected[i + di, j + dj] += seed[i, j]
            expected[i, j] -= 8.0 * u0[i, j] * seed[i, j]
    np.testing.assert_allclose(grads[0], expected, rtol=1e-14, atol=1e-14)


def test_empty_launch_runs_nothing(device):
    out = sp.full(3, 5, dtype=int, device=device)
    sp.launch(index_1d, 0, outputs=[out])
    np.testing.assert_array_equal(out.numpy(), [5, 5, 5])


# ---- atomics under many threads -------------------------------------------------------------------
@sp.kernel
def count_everything(f: sp.array(dtype=sp.float64), n: sp.array(dtype=int), m: sp.array(dtype=sp.int64),
                     lo: sp.array(dtype=int), hi: sp.array(dtype=sp.float64)):
    i = sp.tid()
    sp.atomic_add(f, 0, 1.0)
    f[1] += 0.5
    sp.atomic_add(n, 0, 1)
    n[1] -= 2
    sp.atomic_add(m, 0, sp.int64(i))
    sp.atomic_min(lo, 0, (i * 7919) % 100003 - 50000)
    sp.atomic_max(hi, 0, sp.float64((i * 7919) % 100003))


def test_atomics_under_threads_are_exact(device):
    threads = 100_000
    f = sp.zeros(2, dtype=sp.float64, device=device)
    n = sp.zeros(2, dtype=int, device=device)
    m = sp.zeros(1, dtype=sp.int64, device=device)
    lo = sp.full(1, 10 ** 6, dtype=int, device=device)
    hi = sp.full(1, -1.0, dtype=sp.float64, device=device)
    sp.launch(count_everything, threads, outputs=[f, n, m, lo, hi])
    assert f.numpy().tolist() == [100000.0, 50000.0]      # every partial sum is an exact float64
    assert n.numpy().tolist() == [100000, -200000]
    assert m.numpy().tolist() == [threads * (threads - 1) // 2]
    values = (np.arange(threads, dtype=np.int64) * 7919) % 100003
    assert lo.numpy().tolist() == [int(values.min()) - 50000]
    assert hi.numpy().tolist() == [float(values.max())]


# ---- argument errors ----------------------------------------------------------------------------
@sp.kernel
def saxpy(a: float, x: sp.array(dtype=float), y: sp.array(dtype=float)):
    i = sp.tid()
    y[i] = a * x[i] + y[i]


def test_wrong_argument_count_names_the_kernel_and_parameters(device):
    with pytest.raises(LaunchError) as e:
        sp.launch(saxpy, 4, inputs=[2.0, sp.zeros(4, device=device)])
    msg = str(e.value)
    assert "saxpy" in msg and "3" in msg and "a, x, y" in msg


@pytest.mark.parametrize("make_bad, what", [
    (lambda device: sp.zeros(4, dtype=sp.float64, device=device), "float64"),
    (lambda device: sp.zeros(4, dtype=int, device=device), "int32"),
    (lambda device: sp.zeros((2, 2), device=device), "2 dimension"),
    (lambda device: np.zeros(4, np.float32), "ndarray"),
], ids=["dtype float64", "dtype int32", "ndim", "numpy array"])
def test_wrong_array_argument_names_kernel_and_argument(make_bad, what, device):
    with pytest.raises(LaunchError) as e:
        sp.launch(saxpy, 4, inputs=[2.0, make_bad(device)], outputs=[sp.zeros(4, device=device)])
    msg = str(e.value)
    assert "kernel 'saxpy'" in msg and "argument 'x'" in msg and what in msg


def test_wrong_scalar_argument_names_kernel_and_argument(device):
    with pytest.raises(LaunchError) as e:
        sp.launch(saxpy, 4, inputs=["2.0", sp.zeros(4, device=device)], outputs=[sp.zeros(4, device=device)])
    msg = str(e.value)
    assert "kernel 'saxpy'" in msg and "argument 'a'" in msg and "float32" in msg


@pytest.mark.cuda
def test_arrays_on_another_device_name_kernel_and_argument():
    with pytest.raises(LaunchError) as e:
        sp.launch(saxpy, 4, inputs=[2.0, sp.zeros(4)], outputs=[sp.zeros(4)], device="cuda:0")
    msg = str(e.value)
    assert "kernel 'saxpy'" in msg and "argument 'x'" in msg and "cpu" in msg


@pytest.mark.skipif(is_cuda_available(), reason="needs a machine without a GPU")
def test_launch_on_a_missing_gpu_says_so():
    with pytest.raises((LaunchError, RuntimeError)) as e:
        sp.launch(saxpy, 4, inputs=[2.0, sp.zeros(4)], outputs=[sp.zeros(4)], device="cuda:0")
    assert "cuda:0" in str(e.value) and "cpu" in str(e.value)


# ---- debug bounds checks --------------------------------------------------------------------------
@sp.kernel
def shifted_read(a: sp.array(dtype=sp.float64), out: sp.array(dtype=sp.float64)):
    i = sp.tid()
    out[i] = a[i + 1]


READ_LINE = shifted_read.fn.__code__.co_firstlineno + 3          # its `out[i] = a[i + 1]`


@sp.kernel
def bad_2d_write(grid: sp.array(dtype=int, ndim=2)):
    i, j = sp.tid()
    grid[i, j * 2] = 1


def test_debug_out_of_range_names_kernel_array_and_index():
    backing = np.arange(6.0)                     # a sits inside a larger buffer, so the
    a = sp.array(backing[:4], copy=False)        # unchecked read below stays in memory we own
    out = sp.zeros(4, dtype=sp.float64)
    with pytest.raises(IndexError) as e:
        sp.launch(shifted_read, 4, inputs=[a], outputs=[out], debug=True)
    msg = str(e.value)
    assert "shifted_read" in msg and "'a'" in msg and "[4" in msg and "test_launch.py" in msg

    # without debug, an index that is tid() + constant on every thread is still checked, at launch
    before = out.numpy().copy()
    with pytest.raises(sp.LaunchError) as e:
        sp.launch(shifted_read, 4, inputs=[a], outputs=[out])
    assert str(e.value) == (
        f"launch of kernel 'shifted_read': argument 'a' has shape (4,), but the kernel indexes its axis 0 with "
        f"tid() + 1 on every thread ({__file__}:{READ_LINE}) and dim=4 needs at least 5 there; launch over the array's "
        "extent or pass a larger array")
    np.testing.assert_array_equal(out.numpy(), before)          # nothing ran


@sp.kernel
def scale_2d(a: sp.array(dtype=float, ndim=2), out: sp.array(dtype=float, ndim=2)):
    i, j = sp.tid()
    out[i, j] = 2.0 * a[j, i]


@sp.kernel
def guarded_copy(a: sp.array(dtype=float), n: int, out: sp.array(dtype=float)):
    i = sp.tid()
    if i < n:
        out[i] = a[i]


def test_launch_wider_than_a_tid_indexed_array_is_a_launch_error():
    a, out = sp.zeros((3, 2)), sp.zeros((2, 4))
    with pytest.raises(sp.LaunchError) as e:
        sp.launch(scale_2d, (2, 4), inputs=[a], outputs=[out])
    assert str(e.value).startswith(
        "launch of kernel 'scale_2d': argument 'a' has shape (3, 2), but the kernel indexes its axis 0 with "
        "tid()[1] on every thread")
    assert str(e.value).endswith("and dim=(2, 4) needs at least 4 there; launch over the array's extent or pass "
                                 "a larger array")
    with pytest.raises(sp.LaunchError, match=r"argument 'out' has shape \(2, 4\).*dim=\(3, 4\) needs at least 3"):
        sp.launch(scale_2d, (3, 4), inputs=[sp.zeros((4, 3))], outputs=[out])
    sp.launch(scale_2d, (2, 3), inputs=[sp.ones((3, 2))], outputs=[out])      # a smaller launch is fine
    np.testing.assert_array_equal(out.numpy(), [[2, 2, 2, 0], [2, 2, 2, 0]])
    # a guarded index is left to debug=True: rounding a launch up past the data is a legitimate pattern
    small, big = sp.ones(3), sp.zeros(8)
    sp.launch(guarded_copy, 8, inputs=[small, 3], outputs=[big])
    np.testing.assert_array_equal(big.numpy(), [1, 1, 1, 0, 0, 0, 0, 0])


def test_debug_out_of_range_in_2d_store(device):
    grid = sp.zeros((2, 3), dtype=int, device=device)
    with pytest.raises(IndexError) as e:
        sp.launch(bad_2d_write, (2, 3), outputs=[grid], debug=True)
    msg = str(e.value)
    assert "bad_2d_write" in msg and "'grid'" in msg
    assert "[0, 4" in msg or "[1, 4" in msg
    sp.launch(bad_2d_write, (2, 2), outputs=[grid], debug=True)   # in range: no error
    np.testing.assert_array_equal(grid.numpy(), [[1, 0, 1], [1, 0, 1]])


# ---- gradients through copies, repeated backward, batched Jacobians -------------------------------
@sp.kernel
def sum_of_squares(y: sp.array(dtype=sp.float64), loss: sp.array(dtype=sp.float64)):
    i = sp.tid()
    sp.atomic_add(loss, 0, y[i] * y[i])


@pytest.mark.parametrize("how", ["copy", "clone", "assign"])
def test_differentiable_copies(how, device):
    x = sp.array(np.ones(3), requires_grad=True, device=device)
    loss = sp.zeros(1, dtype=sp.float64, requires_grad=True, device=device)
    tape = sp.Tape()
    with tape:
        if how == "clone":
            y = sp.clone(x)
        else:
            y = sp.zeros(3, dtype=sp.float64, requires_grad=True, device=device)
            if how == "copy":
                sp.copy(y, x)
            else:
                y.assign(x)
        sp.launch(sum_of_squares, 3, inputs=[y], outputs=[loss])
    tape.backward(loss)
    assert loss.numpy().tolist() == [3.0]
    assert x.grad.numpy().tolist() == [2.0, 2.0, 2.0]


@sp.kernel
def spring_energy(x: sp.array(dtype=vec3d), k: sp.array(dtype=sp.float64), e: sp.array(dtype=sp.float64)):
    i = sp.tid()
    d = x[i] - x[(i + 1) % x.shape[0]]
    e[i] = 0.5 * k[i] * sp.length_sq(d) + sp.sin(k[i]) * d.x


def test_repeated_backward_with_zero_gives_identical_gradients(device):
    rng = np.random.default_rng(1)
    x = sp.array(rng.standard_normal((5, 3)), dtype=vec3d, requires_grad=True, device=device)
    k = sp.array(rng.uniform(1, 2, 5), requires_grad=True, device=device)
    e = sp.zeros(5, dtype=sp.float64, requires_grad=True, device=device)
    seed = rng.standard_normal(5)
    tape = sp.Tape()
    with tape:
        sp.launch(spring_energy, 5, inputs=[x, k], outputs=[e])
    results = []
    for _ in range(3):
        tape.backward(grads={e: seed})
        results.append((x.grad.numpy().copy(), k.grad.numpy().copy()))
        tape.zero()
    for gx, gk in results[1:]:
        np.testing.assert_array_equal(gx, results[0][0])
        np.testing.assert_array_equal(gk, results[0][1])
    assert np.abs(results[0][0]).sum() > 0 and np.abs(results[0][1]).sum() > 0
    np.testing.assert_array_equal(x.grad.numpy(), 0)       # zero() cleared the gradients
    np.testing.assert_array_equal(e.grad.numpy(), 0)
    tape.backward(grads={e: 2 * seed})                       # and linear in the seed
    np.testing.assert_allclose(x.grad.numpy(), 2 * results[0][0], rtol=1e-15)


@sp.kernel
def environment_step(x: sp.array(dtype=vec3d), p: sp.array(dtype=sp.float64), y: sp.array(dtype=vec2d)):
    i = sp.tid()
    s = x[i]
    y[i] = vec2d(s.x * s.y + p[i] * s.z, sp.sin(s.z) + s.x * s.x * p[i])


def test_jacobian_rows_of_many_environments_through_the_tape(device):
    envs = 1000
    rng = np.random.default_rng(2)
    xv = rng.standard_normal((envs, 3))
    pv = rng.standard_normal(envs)
    x = sp.array(xv, dtype=vec3d, requires_grad=True, device=device)
    p = sp.array(pv, requires_grad=True, device=device)
    y = sp.zeros(envs, dtype=vec2d, requires_grad=True, device=device)
    tape = sp.Tape()
    with tape:
        sp.launch(environment_step, envs, inputs=[x, p], outputs=[y])
    jac_x = np.zeros((envs, 2, 3))
    jac_p = np.zeros((envs, 2))
    for row in range(2):
        seed = np.zeros((envs, 2))
        seed[:, row] = 1.0                        # one output component of every environment at once
        tape.backward(grads={y: seed})
        jac_x[:, row] = x.grad.numpy()
        jac_p[:, row] = p.grad.numpy()
        tape.zero()
    a, b, c = xv[:, 0], xv[:, 1], xv[:, 2]
    expected_x = np.stack([np.stack([b, a, pv], 1), np.stack([2 * a * pv, 0 * a, np.cos(c)], 1)], 1)
    np.testing.assert_allclose(jac_x, expected_x, rtol=1e-15, atol=1e-15)
    np.testing.assert_allclose(jac_p, np.stack([c, a * a], 1), rtol=1e-15, atol=1e-15)


def test_a_float_dim_names_the_launch_and_what_dim_takes():
    with pytest.raises(sp.LaunchError, match=r"launch of kernel 'guarded_copy': dim must be a non-negative int or a "
                                             r"tuple of 1 to 4 of them, got 10.0"):
        sp.launch(guarded_copy, 10.0, inputs=[sp.zeros(3), 3], outputs=[sp.zeros(10)])


def scaled_copy_kernel(dtype):
    """A kernel made per element type by a factory: its annotations name the factory's argument,
    which the body does not use, so only the evaluated annotations know it."""
    @sp.kernel
    def scale(x: sp.array(dtype=dtype), y: sp.array(dtype=dtype)):
        i = sp.tid()
        y[i] = 2.0 * x[i]
    return scale


@pytest.mark.parametrize("dtype", [sp.float32, sp.float64])
def test_a_kernel_made_in_a_factory_is_typed_by_its_evaluated_annotations(dtype, device):
    kernel = scaled_copy_kernel(dtype)
    assert kernel.params[0].type.dtype == dtype
    x = sp.array([1.0, 2.5], dtype=dtype, device=device)
    y = sp.zeros(2, dtype=dtype, device=device)
    sp.launch(kernel, 2, inputs=[x], outputs=[y])
    np.testing.assert_array_equal(y.numpy(), [2.0, 5.0])


def test_a_factory_kernel_under_postponed_annotations_says_why_its_type_is_unknown(tmp_path, monkeypatch):
    """Under ``from __future__ import annotations`` a factory's local type is only text; the error
    names the annotation, the import and the two ways out instead of a bare 'unknown name'."""
    (tmp_path / "postponed_factory.py").write_text(
        "from __future__ import annotations\n"
        "import stepper as sp\n\n\n"
        "def make(dtype):\n"
        "    A = sp.array(dtype=dtype)\n\n"
        "    @sp.kernel\n"
        "    def scale(x: A, y: A):\n"
        "        i = sp.tid()\n"
        "        y[i] = 2.0 * x[i]\n"
        "    return scale\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import postponed_factory
    kernel = postponed_factory.make(sp.float64)
    with pytest.raises(sp.CompileError, match=r"postponed_factory.py:9:.*the annotation names 'A', which this kernel "
                                              r"cannot see: its module postpones annotations") as info:
        sp.launch(kernel, 2, inputs=[sp.zeros(2, dtype=sp.float64)], outputs=[sp.zeros(2, dtype=sp.float64)])
    assert "remove that import from this module" in str(info.value)
