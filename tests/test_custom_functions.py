"""@func_grad, @func_replay and @func_native: user code that replaces generated pieces."""
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import compiler as sp
from compiler import adjoint


def _grad(kernel, dim, inputs, out):
    tape = sp.Tape()
    with tape:
        sp.launch(kernel, dim, inputs=inputs, outputs=[out])
    tape.backward(grads={out: np.ones(out.shape, out.numpy().dtype)})
    return tape


# ---- @func_grad ----------------------------------------------------------------------------------
@sp.func
def safe_sqrt(x: float) -> float:
    return sp.sqrt(x)


@sp.func_grad(safe_sqrt)
def adj_safe_sqrt(x: float, adj_ret: float):
    adjoint[x] += adj_ret * 0.5 / sp.max(sp.sqrt(x), 1e-3)


@sp.kernel
def twice_safe_sqrt(x: sp.array(dtype=float), out: sp.array(dtype=float)):
    i = sp.tid()
    out[i] = safe_sqrt(x[i]) * 2.0


def test_func_grad_replaces_the_generated_adjoint(device):
    x = sp.array([0.0, 4.0], requires_grad=True, device=device)
    out = sp.zeros(2, requires_grad=True, device=device)
    _grad(twice_safe_sqrt, 2, [x], out)
    # The generated adjoint would give inf at 0; the user's clamps it.
    np.testing.assert_allclose(x.grad.numpy(), [2 * 0.5 / 1e-3, 2 * 0.5 / 2.0], rtol=1e-6)
    np.testing.assert_array_equal(out.numpy(), [0.0, 4.0])


@sp.func
def polar(r: sp.float64, theta: sp.float64):
    return r * sp.cos(theta), r * sp.sin(theta)


@sp.func_grad(polar)
def adj_polar(r: sp.float64, theta: sp.float64, adj_x: sp.float64, adj_y: sp.float64):
    adjoint[r] += adj_x * sp.cos(theta) + adj_y * sp.sin(theta)
    sp.adjoint[theta] += -adj_x * r * sp.sin(theta) + adj_y * r * sp.cos(theta)   # Warp's spelling works too


@sp.kernel
def polar_kernel(r: sp.array(dtype=sp.float64), theta: sp.array(dtype=sp.float64), out: sp.array(dtype=sp.float64)):
    i = sp.tid()
    x, y = polar(r[i], theta[i])
    out[i] = x * 3.0 + y


def test_func_grad_with_several_outputs_matches_the_analytic_gradient(device):
    r = sp.array(np.array([1.0, 2.0]), requires_grad=True, device=device)
    th = sp.array(np.array([0.3, 1.1]), requires_grad=True, device=device)
    out = sp.zeros(2, dtype=sp.float64, requires_grad=True, device=device)
    _grad(polar_kernel, 2, [r, th], out)
    rr, tt = np.array([1.0, 2.0]), np.array([0.3, 1.1])
    np.testing.assert_allclose(r.grad.numpy(), 3 * np.cos(tt) + np.sin(tt), rtol=1e-12)
    np.testing.assert_allclose(th.grad.numpy(), -3 * rr * np.sin(tt) + rr * np.cos(tt), rtol=1e-12)


# ---- @func_replay: the seed's reversible atomic increment ----------------------------------------
@sp.func
def reserve_slot(counter: sp.array(dtype=int), slots: sp.array(dtype=int), tid: int) -> int:
    idx = sp.atomic_add(counter, 0, 1)
    slots[tid] = idx
    return idx


@sp.func_replay(reserve_slot)
def replay_reserve_slot(counter: sp.array(dtype=int), slots: sp.array(dtype=int), tid: int) -> int:
    return slots[tid]


@sp.kernel
def compact_sqrt(counter: sp.array(dtype=int), slots: sp.array(dtype=int), inp: sp.array(dtype=float),
                 out: sp.array(dtype=float)):
    i = sp.tid()
    idx = reserve_slot(counter, slots, i)
    out[idx] = sp.sqrt(inp[idx])


@sp.kernel
def compact_sqrt_unreplayed(counter: sp.array(dtype=int), inp: sp.array(dtype=float), out: sp.array(dtype=float)):
    idx = sp.atomic_add(counter, 0, 1)
    out[idx] = sp.sqrt(inp[idx])


def test_func_replay_reads_back_each_threads_slot(device):
    n = 1024
    counter, slots = sp.zeros(1, dtype=int, device=device), sp.zeros(n, dtype=int, device=device)
    inp = sp.array(np.arange(1, n + 1, dtype=np.float32), requires_grad=True, device=device)
    out = sp.zeros(n, requires_grad=True, device=device)
    _grad(compact_sqrt, n, [counter, slots, inp], out)
    assert counter.numpy()[0] == n          # the replay did not increment again
    np.testing.assert_allclose(inp.grad.numpy(), 0.5 / np.sqrt(np.arange(1, n + 1)), rtol=1e-6)


def test_using_an_atomics_result_without_a_replay_is_refused_on_a_tape(device):
    counter = sp.zeros(1, dtype=int, device=device)
    inp = sp.array(np.ones(4, np.float32), requires_grad=True, device=device)
    out = sp.zeros(4, requires_grad=True, device=device)
    with pytest.raises(sp.CompileError, match=r"(?s)test_custom_functions.py:\d+.*atomic_add.*replay"):
        _grad(compact_sqrt_unreplayed, 4, [counter, inp], out)
    sp.launch(compact_sqrt_unreplayed, 4, inputs=[counter, inp], outputs=[out])   # fine outside a tape


# ---- @func_native ---------------------------------------------------------------------------------
@sp.func_native("return a * b + 1.0f;", "adj_a += adj_ret * b; adj_b += adj_ret * a;")
def fused(a: float, b: float) -> float:
    ...


@sp.kernel
def native_square(x: sp.array(dtype=float), out: sp.array(dtype=float)):
    i = sp.tid()
    out[i] = fused(x[i], x[i])


def test_func_native_forward_and_adjoint_snippets(device):
    x = sp.array([1.0, 3.0], requires_grad=True, device=device)
    out = sp.zeros(2, requires_grad=True, device=device)
    _grad(native_square, 2, [x], out)
    np.testing.assert_array_equal(out.numpy(), [2.0, 10.0])
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 6.0])


def test_a_native_snippet_that_does_not_compile_points_at_the_decorator(tmp_path):
    user = tmp_path / "user_native.py"
    user.write_text(textwrap.dedent("""
        import compiler as sp

        @sp.func_native("return a *** 2;")
        def broken(a: float) -> float:
            ...

        @sp.kernel
        def k(x: sp.array(dtype=float)):
            i = sp.tid()
            x[i] = broken(x[i])

        sp.launch(k, 1, inputs=[sp.zeros(1)])
    """))
    r = subprocess.run([sys.executable, str(user)], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode != 0
    assert f"{user}:4" in r.stderr       # the decorator's line


@sp.func_native("return a * a;")
def square_without_adjoint(a: float) -> float:
    ...


@sp.kernel
def native_no_adjoint(x: sp.array(dtype=float), out: sp.array(dtype=float)):
    i = sp.tid()
    out[i] = square_without_adjoint(x[i])


def test_differentiating_through_a_native_function_without_adjoint_is_an_error(device):
    x = sp.array([1.0, 3.0], requires_grad=True, device=device)
    out = sp.zeros(2, requires_grad=True, device=device)
    with pytest.raises(sp.CompileError, match="square_without_adjoint.*adj_snippet"):
        _grad(native_no_adjoint, 2, [x], out)
    sp.launch(native_no_adjoint, 2, inputs=[x], outputs=[out])      # the forward alone is fine
    np.testing.assert_array_equal(out.numpy(), [1.0, 9.0])
