"""set_flush_denormal: CPU kernels flush subnormal floats to zero when asked, on every thread of a
parallel launch, and compute with them (IEEE 754) by default and after switching back."""
import platform

import numpy as np
import pytest

import stepper as sp

F32 = sp.array(dtype=sp.float32)
F64 = sp.array(dtype=sp.float64)
SUBNORMAL32 = np.float32(1e-39)          # below float32's smallest normal, 1.18e-38
SUBNORMAL64 = 1e-310                     # below float64's, 2.2e-308
N = 200_000                              # a parallel launch where OpenMP has threads

pytestmark = pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64", "aarch64", "arm64"),
                                reason="flushing subnormals is a mode of x86-64 and AArch64 CPUs")


@sp.kernel
def scale32(x: F32, out: F32):
    i = sp.tid()
    out[i] = x[i] * 1.5


@sp.kernel
def scale64(x: F64, out: F64):
    i = sp.tid()
    out[i] = x[i] * 1.5


@pytest.fixture
def flushing():
    assert sp.set_flush_denormal(True) is True
    try:
        yield
    finally:
        sp.set_flush_denormal(False)


def run(kernel, value, dtype):
    x = sp.array(np.full(N, value, dtype.np_dtype), dtype=dtype)
    out = sp.zeros(N, dtype=dtype)
    sp.launch(kernel, N, inputs=[x], outputs=[out])
    return out.numpy()


def test_subnormals_are_ieee_by_default():
    np.testing.assert_array_equal(run(scale32, SUBNORMAL32, sp.float32), np.float32(SUBNORMAL32 * np.float32(1.5)))
    np.testing.assert_array_equal(run(scale64, SUBNORMAL64, sp.float64), SUBNORMAL64 * 1.5)


def test_flushing_reads_and_writes_subnormals_as_zero_on_every_thread(flushing):
    assert not run(scale32, SUBNORMAL32, sp.float32).any()
    assert not run(scale64, SUBNORMAL64, sp.float64).any()
    # normal numbers are untouched
    np.testing.assert_array_equal(run(scale32, 2.0, sp.float32), 3.0)


def test_switching_back_restores_ieee_arithmetic():
    sp.set_flush_denormal(True)
    sp.set_flush_denormal(False)
    assert run(scale32, SUBNORMAL32, sp.float32).all()


def test_the_mode_must_be_a_bool():
    with pytest.raises(TypeError, match="mode must be True or False"):
        sp.set_flush_denormal(1)
