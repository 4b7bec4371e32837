"""Tangent (forward-mode) kernels, generated from the same IR as the adjoints (issue 30).

Every kernel is checked two ways, in float64: the tangent J v against central differences of the
forward, and against the adjoint by the dot-product test <w, J v> == <J^T w, v> (to 1e-12).
"""
import numpy as np
import pytest

import compiler as sp
from compiler.passes.tangent import tangent_function
from compiler.passes.verify import verify

F64 = sp.array(dtype=sp.float64)
I32 = sp.array(dtype=sp.int32)
V3 = sp.array(dtype=sp.vector(3, sp.float64))
M33D = sp.matrix((3, 3), sp.float64)


def _fresh(spec, device):
    """An argument from its spec: ("in", ndarray) a float input, ("out", shape, dtype) a zeroed output,
    anything else a value passed as is (ints, int arrays as ("int", ndarray))."""
    if isinstance(spec, tuple) and spec[0] == "in":
        return sp.array(spec[1], dtype=spec[2] if len(spec) > 2 else None, device=device)
    if isinstance(spec, tuple) and spec[0] == "out":
        return sp.zeros(spec[1], dtype=spec[2], device=device)
    if isinstance(spec, tuple) and spec[0] == "int":
        return sp.array(spec[1], device=device)
    return spec


def _run(kernel, dim, specs, device, shift=None):
    args = [_fresh(s, device) for s in specs]
    for k, delta in (shift or {}).items():
        args[k].assign(args[k].numpy() + delta)
    sp.launch(kernel, dim, inputs=args, deterministic=True)
    return args


def check_kernel(kernel, dim, specs, device, rng=None, fd_rtol=1e-7):
    rng = rng or np.random.default_rng(0)
    ins = [k for k, s in enumerate(specs) if isinstance(s, tuple) and s[0] == "in"]
    outs = [k for k, s in enumerate(specs) if isinstance(s, tuple) and s[0] == "out"]
    v = {k: rng.standard_normal(np.shape(specs[k][1]) if len(specs[k]) == 2 else
                                np.asarray(specs[k][1]).shape) for k in ins}
    # forward mode
    args = [_fresh(s, device) for s in specs]
    seeds = {args[k]: sp.array(v[k], dtype=args[k].dtype, device=device) for k in ins}
    with sp.Tangents(seeds) as tan:
        sp.launch(kernel, dim, inputs=args, deterministic=True)
    jv = {k: tan[args[k]].numpy().astype(np.float64) for k in outs}
    plain = _run(kernel, dim, specs, device)
    for k in outs:
        np.testing.assert_array_equal(args[k].numpy(), plain[k].numpy())   # the forward is unchanged
    # central differences of the forward
    h = 1e-6
    up = _run(kernel, dim, specs, device, {k: h * v[k] for k in ins})
    down = _run(kernel, dim, specs, device, {k: -h * v[k] for k in ins})
    for k in outs:
        fd = (up[k].numpy() - down[k].numpy()) / (2 * h)
        np.testing.assert_allclose(jv[k], fd, rtol=fd_rtol, atol=fd_rtol * max(1.0, np.abs(fd).max()))
    # dot-product test against the adjoint
    w = {k: rng.standard_normal(jv[k].shape) for k in outs}
    args = [_fresh(s, device) for s in specs]
    for k in ins:
        args[k].requires_grad = True
    for k in outs:
        args[k].requires_grad = True
    tape = sp.Tape()
    with tape:
        sp.launch(kernel, dim, inputs=args, deterministic=True)
    tape.backward(grads={args[k]: w[k] for k in outs})
    lhs = sum(float(np.sum(w[k] * jv[k])) for k in outs)
    rhs = sum(float(np.sum(args[k].grad.numpy() * v[k])) for k in ins)
    assert abs(lhs - rhs) <= 1e-12 * max(1.0, abs(lhs)), (lhs, rhs)
    return jv


# ---- kernels ------------------------------------------------------------------------------------
@sp.kernel
def elementwise(x: F64, y: F64, a: sp.float64, out: F64):
    i = sp.tid()
    u = x[i]
    w = y[i]
    r = sp.sin(u) * sp.exp(0.3 * w) + u / (1.5 + w * w) + sp.pow(1.2 + u * u, w) + sp.atan2(u, 2.0 + w)
    r += sp.max(u, w) * sp.min(u, 0.2) + sp.clamp(u, -0.5, 0.5) + sp.where(u > w, u * w, a * u)
    r += sp.sqrt(2.0 + sp.cos(u)) + sp.tanh(w) + sp.log(3.0 + u) + sp.abs(w) + sp.floor(u * 3.0)
    out[i] = r * a


@sp.kernel
def vectors(p: V3, q: V3, out: V3, s: F64):
    i = sp.tid()
    a = p[i]
    b = q[i]
    m = M33D(a[0] + 3.0, a[1], b[2], b[0], b[1] + 3.0, a[2], a[0] * b[1], a[2], 3.0 + b[2])
    c = sp.cross(a, b) + sp.normalize(a) * sp.length(b) + m @ b + sp.inverse(m) @ a
    c[1] = c[1] * sp.dot(a, b)
    out[i] = c
    s[i] = sp.determinant(m) + sp.length_sq(c) + sp.dot(sp.transpose(m) @ a, b)


@sp.kernel
def runtime_loop(x: F64, n: sp.array(dtype=sp.int32), out: F64):
    i = sp.tid()
    acc = x[i]
    for k in range(n[i]):
        acc = sp.sin(acc) * x[k] + 0.5 * acc
    out[i] = acc


@sp.kernel
def while_break_return(x: F64, out: F64):
    i = sp.tid()
    v = x[i]
    k = int(0)
    while k < 20:
        v = v * 0.9 + sp.cos(v) * 0.1
        if v > 2.0:
            break
        k += 1
    if x[i] < -1.0:
        out[i] = v * v
        return
    out[i] = v + sp.float64(k)


@sp.func
def spring(a: sp.float64, b: sp.float64, k: sp.float64) -> sp.float64:
    d = b - a
    return k * d * d * d


@sp.kernel
def with_func_and_atomics(x: F64, k: F64, total: F64, forces: F64):
    i = sp.tid()
    f = spring(x[i], x[(i + 1) % 5], k[0])
    forces[i] = f
    sp.atomic_add(total, 0, f * x[i])
    sp.atomic_sub(total, 1, f)


@sp.func
def softplus(x: sp.float64) -> sp.float64:
    return sp.log(1.0 + sp.exp(x))


@sp.func_grad(softplus)
def softplus_grad(x: sp.float64, adj_ret: sp.float64):
    sp.adjoint[x] += adj_ret / (1.0 + sp.exp(-x))


@sp.kernel
def with_func_grad(x: F64, out: F64):
    i = sp.tid()
    out[i] = softplus(x[i]) * x[i]


@sp.func_native("return a * b * b + 1.0;", "adj_a += adj_ret * b * b; adj_b += 2.0 * adj_ret * a * b;")
def fused(a: sp.float64, b: sp.float64) -> sp.float64:
    ...


@sp.kernel
def with_native(x: F64, y: F64, out: F64):
    i = sp.tid()
    out[i] = fused(x[i], sp.sin(y[i]))


@sp.kernel
def ewma_history(data: sp.array(dtype=sp.float64, ndim=2), alpha: F64, ys: sp.array(dtype=sp.float64, ndim=2)):
    i = sp.tid()
    ys[i, 0] = data[i, 0]
    for t in range(1, data.shape[1]):
        ys[i, t] = alpha[0] * data[i, t] + (1.0 - alpha[0]) * ys[i, t - 1]


def test_native_functions_take_their_tangent_from_the_adjoint_snippet(device):
    rng = np.random.default_rng(6)
    specs = [("in", rng.uniform(-1, 1, 7)), ("in", rng.uniform(-1, 1, 7)), ("out", 7, sp.float64)]
    check_kernel(with_native, 7, specs, device)


def test_recursions_that_read_back_what_they_wrote(device):
    """ys[i, t] from ys[i, t - 1] (write_once proves the adjoint exact); the tangent reads back its own."""
    rng = np.random.default_rng(7)
    specs = [("in", rng.uniform(-1, 1, (3, 9))), ("in", np.array([0.3])), ("out", (3, 9), sp.float64)]
    check_kernel(ewma_history, 3, specs, device)


def test_elementwise_math(device):
    rng = np.random.default_rng(1)
    specs = [("in", rng.uniform(-1, 1, 16)), ("in", rng.uniform(-1, 1, 16)), 1.25, ("out", 16, sp.float64)]
    check_kernel(elementwise, 16, specs, device)


def test_vectors_and_matrices(device):
    rng = np.random.default_rng(2)
    specs = [("in", rng.uniform(0.5, 1, (8, 3)), sp.vector(3, sp.float64)),
             ("in", rng.uniform(0.5, 1, (8, 3)), sp.vector(3, sp.float64)),
             ("out", 8, sp.vector(3, sp.float64)), ("out", 8, sp.float64)]
    check_kernel(vectors, 8, specs, device, fd_rtol=1e-6)


def test_runtime_trip_counts(device):
    rng = np.random.default_rng(3)
    specs = [("in", rng.uniform(-1, 1, 6)), ("int", np.array([0, 1, 2, 3, 5, 6], np.int32)), ("out", 6, sp.float64)]
    check_kernel(runtime_loop, 6, specs, device)


def test_while_break_and_early_return(device):
    specs = [("in", np.array([-1.5, -0.3, 0.4, 1.9, 2.5])), ("out", 5, sp.float64)]
    check_kernel(while_break_return, 5, specs, device)


def test_funcs_and_atomics(device):
    rng = np.random.default_rng(4)
    specs = [("in", rng.uniform(-1, 1, 5)), ("in", np.array([1.7])), ("out", 2, sp.float64), ("out", 5, sp.float64)]
    check_kernel(with_func_and_atomics, 5, specs, device)


def test_func_grad_gives_the_tangent(device):
    """The tangent of a @func_grad call comes from the user's adjoint (here the exact derivative)."""
    x = np.array([-2.0, -0.1, 0.0, 0.7, 3.0])
    jv = check_kernel(with_func_grad, 5, [("in", x), ("out", 5, sp.float64)], device, rng=np.random.default_rng(5))
    assert jv[1].shape == (5,)


def test_tangent_ir_verifies():
    for k in (elementwise, vectors, runtime_loop, while_break_return, with_func_and_atomics, with_func_grad):
        fn = tangent_function(k.compiled().forward)
        verify(fn)
        assert [p.name for p in fn.params[len(k.params):]] == [p.name + "_dot" for p in k.params
                                                                if p.name not in ("n",)]


def test_dual_scalar_and_untouched_outputs(device):
    x = sp.array(np.linspace(-1, 1, 16), dtype=sp.float64, device=device)
    y = sp.array(np.linspace(0, 1, 16), dtype=sp.float64, device=device)
    out = sp.zeros(16, dtype=sp.float64, device=device)
    with sp.Tangents() as tan:
        sp.launch(elementwise, 16, inputs=[x, y, sp.Dual(1.25, 1.0), out])
    # d out / d a with a = 1.25: out = r * a, and r reads a in the where() branch
    xs, ys = x.numpy(), y.numpy()
    h = 1e-6
    outs = []
    for a in (1.25 + h, 1.25 - h):
        o = sp.zeros(16, dtype=sp.float64, device=device)
        sp.launch(elementwise, 16, inputs=[x, y, a, o])
        outs.append(o.numpy())
    np.testing.assert_allclose(tan[out].numpy(), (outs[0] - outs[1]) / (2 * h), rtol=1e-7, atol=1e-8)
    assert np.all(tan[x].numpy() == 0) and xs.shape == ys.shape


def test_bad_tangents_are_refused(device):
    x = sp.zeros(4, dtype=sp.float64, device=device)
    with pytest.raises(ValueError, match=r"shape \(3,\) of float64, but it must match its array: shape \(4,\)"):
        sp.Tangents({x: sp.zeros(3, dtype=sp.float64, device=device)})
    with pytest.raises(ValueError, match="float32"):
        sp.Tangents({x: sp.zeros(4, device=device)})
    with pytest.raises(TypeError, match="int32 values have no tangent"):
        i = sp.zeros(4, dtype=sp.int32, device=device)
        sp.Tangents({i: sp.zeros(4, dtype=sp.int32, device=device)})


@sp.kernel
def returns_atomic_value(x: F64, total: F64, out: F64):
    i = sp.tid()
    out[i] = sp.atomic_add(total, 0, x[i])


def test_no_tangent_is_a_compile_error_at_the_user_line():
    x = sp.zeros(4, dtype=sp.float64)
    with pytest.raises(sp.CompileError, match="returned by atomic_add.. is used") as e:
        with sp.Tangents():
            sp.launch(returns_atomic_value, 4, inputs=[x, sp.zeros(1, dtype=sp.float64), sp.zeros(4, dtype=sp.float64)])
    assert "test_tangent.py" in str(e.value)


@sp.kernel
def sines(x: F64, y: F64):
    i = sp.tid()
    y[i] = sp.sin(x[i]) * x[i]


def test_tangent_launches_on_a_tape_give_hessian_vector_products(device):
    """Reverse over forward at kernel level: y = x sin x, seeded with ydot's adjoint w, gives
    x.grad = w f''(x) v and v.grad = w f'(x)."""
    xs = np.linspace(-2, 2, 9)
    x = sp.array(xs, dtype=sp.float64, requires_grad=True, device=device)
    v = sp.array(np.full(9, 0.5), dtype=sp.float64, requires_grad=True, device=device)
    y = sp.zeros(9, dtype=sp.float64, requires_grad=True, device=device)
    tape = sp.Tape()
    with tape, sp.Tangents({x: v}) as tan:
        sp.launch(sines, 9, inputs=[x], outputs=[y])
    w = np.linspace(1, 2, 9)
    tape.backward(grads={tan[y]: w})
    np.testing.assert_allclose(x.grad.numpy(), w * (2 * np.cos(xs) - xs * np.sin(xs)) * 0.5, rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(v.grad.numpy(), w * (np.sin(xs) + xs * np.cos(xs)), rtol=1e-14, atol=1e-15)


def test_launch_in_parts_runs_the_tangent_kernel_whole(device):
    from compiler.runtime.launch import launch_in_parts
    x = sp.array(np.linspace(-1, 1, 9), dtype=sp.float64, device=device)
    y = sp.zeros(9, dtype=sp.float64, device=device)
    called = []
    with sp.Tangents({x: sp.ones(9, dtype=sp.float64, device=device)}) as tan:
        ran = launch_in_parts(sines, 9, inputs=[x], outputs=[y], first_rows=(2, 5), between=lambda: called.append(1))
    xs = x.numpy()
    assert ran is False and called == [1]
    np.testing.assert_allclose(tan[y].numpy(), np.sin(xs) + xs * np.cos(xs), rtol=1e-15)
