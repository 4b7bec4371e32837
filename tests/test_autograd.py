"""autograd: Jacobians by tape and by finite differences, gradcheck and gradcheck_tape.

Each test is a kernel (or a Python function launching kernels), an input, and the exact Jacobian or
a float64 reference. gradcheck must pass on correct adjoints and fail on a deliberately wrong one.
"""
import numpy as np
import pytest

import compiler as sp
from compiler import adjoint, autograd
from compiler.runtime.tape import active_tape


@sp.kernel
def square(x: sp.array(dtype=float), y: sp.array(dtype=float)):
    i = sp.tid()
    y[i] = x[i] * x[i]


@sp.kernel
def sine_sum(y: sp.array(dtype=float), loss: sp.array(dtype=float)):
    i = sp.tid()
    sp.atomic_add(loss, 0, sp.sin(y[i]))


@sp.kernel
def mixed(a: sp.array(dtype=float), b: sp.array(dtype=sp.vec3), out1: sp.array(dtype=sp.vec2),
          out2: sp.array(dtype=float)):
    i = sp.tid()
    ai = a[i]
    bi = b[i]
    out1[i] = sp.vec2(ai * sp.length(bi), -ai * sp.dot(bi, sp.vec3(0.1, 1.0, -0.1)))
    out2[i] = sp.exp(0.1 * ai) * bi[2]


@sp.kernel
def cubic64(x: sp.array(dtype=sp.float64), y: sp.array(dtype=sp.float64)):
    i = sp.tid()
    y[i] = x[i] * x[i] * x[i] + sp.float64(2.0) * x[(i + 1) % 4]


@sp.kernel
def scale_into(x: sp.array(dtype=float), s: float, y: sp.array(dtype=float)):
    i = sp.tid()
    y[i] = s * x[i]


@sp.kernel
def prefix_accumulate(a: sp.array(dtype=float)):
    i = sp.tid()
    if i > 0:
        sp.atomic_add(a, i, a[0] * a[0])


# -- jacobian / jacobian_fd ------------------------------------------------------------------------
def test_jacobian_of_a_square_is_diag_2x(device):
    x = sp.array([1.0, 2.0, 3.0], requires_grad=True, device=device)
    y = sp.zeros(3, requires_grad=True, device=device)
    jacs = autograd.jacobian(square, 3, inputs=[x], outputs=[y])
    assert list(jacs) == [("x", "y")]
    np.testing.assert_array_equal(jacs["x", "y"], np.diag([2.0, 4.0, 6.0]))
    assert jacs["x", "y"].dtype == np.float64


def test_jacobian_fd_float64_matches_analytic_to_1e8(device):
    xs = np.array([0.5, -1.0, 2.0, 0.25])
    x = sp.array(xs, requires_grad=True, device=device)
    y = sp.zeros(4, dtype=sp.float64, requires_grad=True, device=device)
    expected = np.diag(3 * xs ** 2)
    for i in range(4):
        expected[i, (i + 1) % 4] += 2.0
    np.testing.assert_array_equal(autograd.jacobian(cubic64, 4, [x], [y])["x", "y"], expected)
    np.testing.assert_allclose(autograd.jacobian_fd(cubic64, 4, [x], [y], eps=1e-6)["x", "y"], expected,
                               rtol=0, atol=1e-8)


def test_jacobian_fd_float32_uses_a_step_that_float32_can_resolve(device):
    # eps=1e-7 would be below float32 resolution at x = 3; the float32 step floor keeps it accurate.
    x = sp.array([0.3, 1.0, 3.0], requires_grad=True, device=device)
    y = sp.zeros(3, requires_grad=True, device=device)
    fd = autograd.jacobian_fd(square, 3, [x], [y], eps=1e-7)["x", "y"]
    np.testing.assert_allclose(fd, np.diag(2 * x.numpy().astype(np.float64)), rtol=1e-3, atol=1e-4)


def test_vector_elements_count_component_by_component(device):
    a = sp.array([2.0, -1.0], requires_grad=True, device=device)
    b = sp.array([[3.0, 1.0, 2.0], [-4.0, -1.0, 0.5]], dtype=sp.vec3, requires_grad=True, device=device)
    out1 = sp.zeros(2, dtype=sp.vec2, requires_grad=True, device=device)
    out2 = sp.zeros(2, requires_grad=True, device=device)
    jacs = autograd.jacobian(mixed, 2, inputs=[a, b], outputs=[out1, out2])
    assert set(jacs) == {("a", "out1"), ("b", "out1"), ("a", "out2"), ("b", "out2")}
    assert jacs["b", "out1"].shape == (4, 6)
    assert jacs["a", "out2"].shape == (2, 2)
    bb = b.numpy().astype(np.float64)
    # d out1[0].x / d b[0] = a0 * b0 / |b0|
    np.testing.assert_allclose(jacs["b", "out1"][0, :3], 2.0 * bb[0] / np.linalg.norm(bb[0]), rtol=1e-6)
    np.testing.assert_array_equal(jacs["b", "out1"][0, 3:], 0.0)
    # d out1[1].y / d b[1] = -a1 * (0.1, 1, -0.1)
    np.testing.assert_allclose(jacs["b", "out1"][3, 3:], [0.1, 1.0, -0.1], rtol=1e-6)
    np.testing.assert_allclose(jacs["b", "out2"][1], [0, 0, 0, 0, 0, np.exp(-0.1)], rtol=1e-6)
    fd = autograd.jacobian_fd(mixed, 2, inputs=[a, b], outputs=[out1, out2])
    for key in jacs:
        np.testing.assert_allclose(jacs[key], fd[key], rtol=1e-2, atol=1e-3)


def test_mask_by_name_and_limits_leave_nan(device):
    a = sp.array([2.0, -1.0], requires_grad=True, device=device)
    b = sp.array([[3.0, 1.0, 2.0], [-4.0, -1.0, 0.5]], dtype=sp.vec3, requires_grad=True, device=device)
    out1 = sp.zeros(2, dtype=sp.vec2, requires_grad=True, device=device)
    out2 = sp.zeros(2, requires_grad=True, device=device)
    args = dict(dim=2, inputs=[a, b], outputs=[out1, out2], input_output_mask=[("a", "out1"), ("b", "out2")])
    jacs = autograd.jacobian(mixed, max_outputs_per_var=1, **args)
    assert set(jacs) == {("a", "out1"), ("b", "out2")}
    assert not np.isnan(jacs["a", "out1"][0]).any() and np.isnan(jacs["a", "out1"][1:]).all()
    fd = autograd.jacobian_fd(mixed, max_inputs_per_var=2, **args)
    assert not np.isnan(fd["b", "out2"][:, :2]).any() and np.isnan(fd["b", "out2"][:, 2:]).all()
    # integer entries index the kernel's parameters: 0 is a, 3 is out2
    assert set(autograd.jacobian(mixed, 2, [a, b], [out1, out2], input_output_mask=[(0, 3)])) == {("a", "out2")}
    with pytest.raises(ValueError, match="no differentiable output 'nope'.*'out1', 'out2'"):
        autograd.jacobian(mixed, 2, [a, b], [out1, out2], input_output_mask=[("a", "nope")])


def test_only_arrays_with_requires_grad_take_part(device):
    x = sp.array([1.0, 2.0], device=device)
    y = sp.zeros(2, requires_grad=True, device=device)
    with pytest.raises(ValueError, match="requires_grad=True"):
        autograd.jacobian(square, 2, [x], [y])


def test_kernel_runs_on_copies_and_leaves_arrays_and_tapes_alone(device):
    x = sp.array([1.0, 2.0, 3.0], requires_grad=True, device=device)
    y = sp.full(3, 7.0, requires_grad=True, device=device)
    x.grad.fill_(5.0)
    versions = (x.version, y.version)
    outer = sp.Tape()
    with outer:
        assert autograd.gradcheck(square, 3, [x], [y], show_summary=False)
        autograd.jacobian(square, 3, [x], [y])
        autograd.jacobian_fd(square, 3, [x], [y])
    assert outer.ops == ()
    np.testing.assert_array_equal(y.numpy(), [7.0, 7.0, 7.0])
    np.testing.assert_array_equal(x.grad.numpy(), [5.0, 5.0, 5.0])
    assert (x.version, y.version) == versions


def test_non_array_arguments_pass_through(device):
    x = sp.array([1.0, -2.0], requires_grad=True, device=device)
    y = sp.zeros(2, requires_grad=True, device=device)
    np.testing.assert_array_equal(autograd.jacobian(scale_into, 2, [x, 3.0], [y])["x", "y"], 3 * np.eye(2))


def test_an_array_read_and_accumulated_is_both_input_and_output(device):
    # a[i] += a[0]^2 for i > 0: d a_out / d a_in = I + (column 0 gets 2 a0 below the diagonal)
    a = sp.array([3.0, 1.0, 1.0], requires_grad=True, device=device)
    jac = autograd.jacobian(prefix_accumulate, 3, [a])["a", "a"]
    np.testing.assert_array_equal(jac, [[1, 0, 0], [6, 1, 0], [6, 0, 1]])
    assert autograd.gradcheck(prefix_accumulate, 3, [a], show_summary=False)


# -- gradcheck -------------------------------------------------------------------------------------
def test_gradcheck_passes_and_prints_a_table(capsys, device):
    a = sp.array([2.0, -1.0], requires_grad=True, device=device)
    b = sp.array([[3.0, 1.0, 2.0], [-4.0, -1.0, 0.5]], dtype=sp.vec3, requires_grad=True, device=device)
    out1 = sp.zeros(2, dtype=sp.vec2, requires_grad=True, device=device)
    out2 = sp.zeros(2, requires_grad=True, device=device)
    assert autograd.gradcheck(mixed, 2, [a, b], [out1, out2]) is True
    text = capsys.readouterr().out
    assert "Max Abs Error" in text and "Max Rel Error" in text
    assert text.count("PASS") == 4
    assert "Gradient check for kernel 'mixed' passed" in text


def test_gradcheck_with_accumulating_output(device):
    y = sp.array([0.1, 0.7, 2.0], requires_grad=True, device=device)
    loss = sp.full(1, 10.0, requires_grad=True, device=device)     # an initial value cancels in central differences
    assert autograd.gradcheck(sine_sum, 3, [y], [loss], show_summary=False)
    jac = autograd.jacobian_fd(sine_sum, 3, [y], [loss])["y", "loss"]
    np.testing.assert_allclose(jac[0], np.cos(y.numpy().astype(np.float64)), rtol=1e-3)


def _wrong_double(x):
    """y = 2 x with a recorded adjoint that claims dy/dx = 3 (a Python stand-in for a kernel: it writes
    memory as a kernel does, without bumping versions)."""
    y = sp.zeros_like(x, requires_grad=True)
    y._write_host(2.0 * x.numpy())

    def backward():
        x.grad._add_host(3.0 * y.grad.numpy())
    tape = active_tape()
    if tape is not None:
        tape.record_func(backward, [x, y], name="wrong_double")
    return y


def test_gradcheck_fails_on_a_wrong_gradient(capsys, device):
    x = sp.array([1.0, 2.0], requires_grad=True, device=device)
    assert autograd.gradcheck(_wrong_double, inputs=[x], raise_exception=False) is False
    text = capsys.readouterr().out
    assert "FAIL" in text and "function '_wrong_double' FAILED" in text
    with pytest.raises(ValueError, match=r"input 'x', output 'output_0'.*autodiff 3, finite differences 2"):
        autograd.gradcheck(_wrong_double, inputs=[x], show_summary=False)


def _square_then_sine(x):
    y = sp.zeros_like(x, requires_grad=True)
    loss = sp.zeros(1, requires_grad=True, device=x.device)
    sp.launch(square, len(x), inputs=[x], outputs=[y])
    sp.launch(sine_sum, len(x), inputs=[y], outputs=[loss])
    return loss


def test_python_function_of_several_launches(device):
    xs = np.array([0.2, 0.9, -1.3])
    x = sp.array(xs, dtype=sp.float32, requires_grad=True, device=device)
    x.grad.fill_(1.0)
    jac = autograd.jacobian(_square_then_sine, inputs=[x])["x", "output_0"]
    np.testing.assert_allclose(jac[0], 2 * xs * np.cos(xs ** 2), rtol=1e-5)
    np.testing.assert_array_equal(x.grad.numpy(), [1.0, 1.0, 1.0])     # restored
    assert autograd.gradcheck(_square_then_sine, inputs=[x], show_summary=False)


def test_python_function_writing_given_outputs_that_accumulate(device):
    x = sp.array([0.5, 1.5], requires_grad=True, device=device)
    y = sp.zeros(2, requires_grad=True, device=device)
    loss = sp.zeros(1, requires_grad=True, device=device)

    def f(x):
        sp.launch(square, 2, inputs=[x], outputs=[y])
        sp.launch(sine_sum, 2, inputs=[y], outputs=[loss])    # accumulates: reset before every run
    jacs = autograd.jacobian_fd(f, inputs=[x], outputs=[loss])
    np.testing.assert_allclose(jacs["x", "output_0"][0], 2 * np.array([0.5, 1.5]) * np.cos([0.25, 2.25]),
                               rtol=1e-3)
    np.testing.assert_allclose(loss.numpy(), [np.sin(0.25) + np.sin(2.25)], rtol=1e-6)   # as after one run
    loss.zero_()
    assert autograd.gradcheck(f, inputs=[x], outputs=[loss], show_summary=False)
    np.testing.assert_allclose(loss.numpy(), [np.sin(0.25) + np.sin(2.25)], rtol=1e-6)


# -- gradcheck_tape --------------------------------------------------------------------------------
def test_gradcheck_tape_checks_every_launch_and_leaves_the_tape_usable(capsys, device):
    x = sp.array([0.3, 1.1, 2.0], requires_grad=True, device=device)
    y = sp.zeros(3, requires_grad=True, device=device)
    loss = sp.zeros(1, requires_grad=True, device=device)
    tape = sp.Tape()
    with tape:
        sp.launch(square, 3, inputs=[x], outputs=[y])
        sp.launch(sine_sum, 3, inputs=[y], outputs=[loss])
        tape.record_func(lambda: None, [loss], name="a python op")
    before = loss.numpy().copy()
    assert autograd.gradcheck_tape(tape)
    text = capsys.readouterr().out
    assert "kernel 'square' passed" in text and "kernel 'sine_sum' passed" in text
    np.testing.assert_array_equal(loss.numpy(), before)
    tape.backward(loss)                          # versions untouched: backward still runs
    xs = x.numpy().astype(np.float64)
    np.testing.assert_allclose(x.grad.numpy(), 2 * xs * np.cos(xs ** 2), rtol=1e-5)


def test_gradcheck_tape_white_and_blacklists(capsys, device):
    x = sp.array([0.3, 1.1], requires_grad=True, device=device)
    y = sp.zeros(2, requires_grad=True, device=device)
    loss = sp.zeros(1, requires_grad=True, device=device)
    with sp.Tape() as tape:
        sp.launch(square, 2, inputs=[x], outputs=[y])
        sp.launch(sine_sum, 2, inputs=[y], outputs=[loss])
    assert autograd.gradcheck_tape(tape, whitelist_kernels=["square"])
    assert autograd.gradcheck_tape(tape, blacklist_kernels=["square"])
    text = capsys.readouterr().out
    assert text.count("kernel 'square' passed") == 1 and text.count("kernel 'sine_sum' passed") == 1


# -- custom adjoints -------------------------------------------------------------------------------
@sp.func
def doubled(x: float):
    return 2.0 * x


@sp.func_grad(doubled)
def adj_doubled_wrong(x: float, adj_ret: float):
    adjoint[x] += 3.0 * adj_ret            # deliberately wrong: the true derivative is 2


@sp.kernel
def apply_doubled(x: sp.array(dtype=float), y: sp.array(dtype=float)):
    i = sp.tid()
    y[i] = doubled(x[i])


def test_gradcheck_catches_a_wrong_func_grad(device):
    x = sp.array([1.0, -2.0], requires_grad=True, device=device)
    y = sp.zeros(2, requires_grad=True, device=device)
    np.testing.assert_array_equal(autograd.jacobian(apply_doubled, 2, [x], [y])["x", "y"], 3 * np.eye(2))
    assert autograd.gradcheck(apply_doubled, 2, [x], [y], raise_exception=False, show_summary=False) is False
    with pytest.raises(ValueError, match="kernel 'apply_doubled', input 'x', output 'y'"):
        autograd.gradcheck(apply_doubled, 2, [x], [y], show_summary=False)


# -- plots -----------------------------------------------------------------------------------------
def test_jacobian_plot(tmp_path, device):
    pytest.importorskip("matplotlib")
    x = sp.array([1.0, 2.0], requires_grad=True, device=device)
    y = sp.zeros(2, requires_grad=True, device=device)
    fig = autograd.jacobian_plot(autograd.jacobian(square, 2, [x], [y]), title="square",
                                 filename=tmp_path / "j.png")
    assert fig is not None and (tmp_path / "j.png").stat().st_size > 0


def test_jacobian_plot_without_matplotlib_warns_and_returns_none(monkeypatch, device):
    import sys
    monkeypatch.setitem(sys.modules, "matplotlib", None)          # makes `import matplotlib...` fail
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    monkeypatch.setitem(sys.modules, "matplotlib.colors", None)
    with pytest.warns(UserWarning, match="needs matplotlib"):
        assert autograd.jacobian_plot({("x", "y"): np.eye(2)}) is None


def test_python_function_inputs_are_named_by_its_parameters(device):
    a = sp.array([1.0], requires_grad=True, device=device)
    b = sp.array([2.0], requires_grad=True, device=device)

    def product(*factors):
        y = sp.zeros(1, requires_grad=True, device=device)
        sp.launch(square, 1, inputs=[factors[0]], outputs=[y])
        return y
    assert set(autograd.jacobian(product, inputs=[a, b])) == {("factors[0]", "output_0"), ("factors[1]", "output_0")}
    jac = autograd.jacobian(lambda x, y: product(x, y), inputs=[a, b])
    np.testing.assert_array_equal(jac["x", "output_0"], [[2.0]])
    np.testing.assert_array_equal(jac["y", "output_0"], [[0.0]])


@sp.kernel
def exp_of_three_x(x: sp.array(dtype=sp.float64), y: sp.array(dtype=sp.float64)):
    i = sp.tid()
    y[i] = sp.exp(3.0 * x[i])


def test_gradcheck_steps_by_dtype_so_float64_checks_are_tight():
    # d/dx exp(3x) = 3 exp(3x) exactly; a float64 central difference with a 1e-6 step is good to
    # ~1e-10 relative, with the old 1e-4 step only to ~1e-8 (truncation: h^2 f''' / 6).
    x = sp.array(np.array([0.1, 0.5, 1.0]), dtype=sp.float64, requires_grad=True)
    y = sp.zeros(3, dtype=sp.float64, requires_grad=True)
    assert sp.autograd.gradcheck(exp_of_three_x, 3, [x], [y], atol=0, rtol=1e-9, show_summary=False)
    assert not sp.autograd.gradcheck(exp_of_three_x, 3, [x], [y], eps=1e-4, atol=0, rtol=1e-9,
                                     raise_exception=False, show_summary=False)
    fd = sp.autograd.jacobian_fd(exp_of_three_x, 3, [x], [y])[("x", "y")]
    np.testing.assert_allclose(np.diag(fd), 3 * np.exp(3 * x.numpy()), rtol=1e-9)
