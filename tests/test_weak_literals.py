"""Number literals are weakly typed, as in JAX, and so is everything made only of literals: builtins
of literals (`cos(0.5)`, `sqrt(2.0)`, `min(1.0, 2.0)`) fold in double precision, and choices
between literals (`select`, `where`, `1.0 if c else 2.0`) stay weak, adopting their context's type."""
import math

import numpy as np
import pytest

import compiler as sp


@sp.kernel
def scale_by_cos(x: sp.array(dtype=sp.float64), y: sp.array(dtype=sp.float64)):
    i = sp.tid()
    y[i] = x[i] * sp.cos(0.5)


def test_builtin_of_a_literal_adopts_a_float64_context(device):
    x = sp.array(np.array([1.0, 2.0]), requires_grad=True, device=device)
    y = sp.zeros(2, dtype=sp.float64, requires_grad=True, device=device)
    sp.launch(scale_by_cos, 2, inputs=[x], outputs=[y])
    np.testing.assert_array_equal(y.numpy(), [math.cos(0.5), 2.0 * math.cos(0.5)])


@sp.kernel
def literal_builtins(out: sp.array(dtype=sp.float64)):
    out[0] = sp.float64(sp.sqrt(2.0))
    out[1] = sp.exp(1.0) * 2.0
    out[2] = sp.min(0.1, 0.2) + sp.max(1, 2)
    out[3] = sp.clamp(3.7, 0.0, 1.1)
    out[4] = sp.pow(2.0, 0.5)
    out[5] = sp.floor(-2.5) + sp.round(2.5) + sp.abs(-0.3)
    out[6] = sp.select(True, 0.1, 0.7)


def test_builtins_of_literals_fold_in_double_precision(device):
    out = sp.zeros(7, dtype=sp.float64, device=device)
    sp.launch(literal_builtins, 1, inputs=[], outputs=[out])
    np.testing.assert_array_equal(out.numpy(), [math.sqrt(2.0), math.e * 2.0, 0.1 + 2, 1.1,
                                                math.sqrt(2.0), -3.0 + 3.0 + 0.3, 0.7])


@sp.kernel
def weak_choices(c: sp.array(dtype=int), x32: sp.array(dtype=float),
                 out64: sp.array(dtype=sp.float64, ndim=2), out32: sp.array(dtype=float, ndim=2)):
    i = sp.tid()
    out64[i, 0] = sp.where(c[i] > 0, 0.1, 0.2)
    out64[i, 1] = -(0.1 if c[i] > 0 else 0.3) * 3.0
    out64[i, 2] = sp.sqrt(sp.select(c[i] > 0, 2.0, 3.0))
    out32[i, 0] = x32[i] * sp.where(c[i] > 0, 0.1, 0.2)
    out32[i, 1] = x32[i] + (1 if c[i] > 0 else 2)
    y = sp.select(c[i] > 0, 0.25, 0.5)          # on its own a weak value is float32, like a literal
    out32[i, 2] = y


def test_choices_between_literals_stay_weak_in_either_precision(device):
    out64 = sp.zeros((2, 3), dtype=sp.float64, device=device)
    out32 = sp.zeros((2, 3), dtype=sp.float32, device=device)
    x32 = sp.array(np.array([1.5, 2.5], np.float32), device=device)
    c = sp.array(np.array([1, 0], np.int32), device=device)
    sp.launch(weak_choices, 2, inputs=[c, x32], outputs=[out64, out32])
    np.testing.assert_array_equal(out64.numpy(), [[0.1, -0.1 * 3.0, math.sqrt(3.0)],
                                                  [0.2, -0.3 * 3.0, math.sqrt(2.0)]])
    f = np.float32
    np.testing.assert_array_equal(out32.numpy(), [[f(1.5) * f(0.1), 2.5, 0.5], [f(2.5) * f(0.2), 4.5, 0.25]])


@sp.kernel
def typed_choice(c: sp.array(dtype=int), out: sp.array(dtype=sp.float64)):
    i = sp.tid()
    out[i] = sp.where(c[i] > 0, sp.float32(0.1), 0.2)


def test_a_typed_operand_still_decides_the_type(device):
    out = sp.zeros(1, dtype=sp.float64, device=device)
    with pytest.raises(sp.CompileError, match="float64"):
        sp.launch(typed_choice, 1, inputs=[sp.array(np.array([1], np.int32), device=device)], outputs=[out])


@sp.func
def half_or_quarter(c: int):
    return sp.select(c > 0, 0.25, 0.5)


@sp.kernel
def scale_by_choice(c: sp.array(dtype=int), x: sp.array(dtype=float), y: sp.array(dtype=float)):
    i = sp.tid()
    y[i] = x[i] * half_or_quarter(c[i])


def test_a_function_returning_a_choice_of_literals_returns_float32_like_a_literal(device):
    y = sp.zeros(2, dtype=float, device=device)
    sp.launch(scale_by_choice, 2, inputs=[sp.array(np.array([1, 0], np.int32), device=device),
                                          sp.array(np.array([4.0, 4.0], np.float32), device=device)], outputs=[y])
    np.testing.assert_array_equal(y.numpy(), [2.0, 1.0])
