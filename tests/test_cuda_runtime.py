"""The CUDA launch path on a GPU: device buffers, forward and adjoint entries, bounds checks.

Skipped without a GPU (conftest skips `@pytest.mark.cuda`). `array` has no CUDA storage yet, so
these tests pack the argument buffer by hand with device pointers, exactly as launch.py packs CPU
arrays, and compare with the CPU backend bit for bit (only + and * are used, and CUDA builds with
--fmad=false).
"""
from __future__ import annotations

import numpy as np
import pytest

import compiler as sp
from compiler.backends import cuda_launch
from compiler.runtime.packing import _header, _signature
from compiler.types import ArrayType

pytestmark = pytest.mark.cuda


@sp.kernel
def _affine(a: float, x: sp.array(dtype=float), y: sp.array(dtype=float)):
    i = sp.tid()
    y[i] = a * x[i] + 1.0


@sp.kernel
def _horner(x: sp.array(dtype=float), n: int, y: sp.array(dtype=float)):
    i = sp.tid()
    s = float(0.0)
    j = int(0)
    while j < n + i % 3:               # trip counts differ per thread: the adjoint needs its tape
        s = s * x[i] + 1.0
        j += 1
    y[i] = s


def _pack(kernel, n, args):
    """The packed buffer of a 1-d launch; arrays are DeviceBuffers of float32 (or None: no grad)."""
    from compiler.runtime.cuda_array import DeviceBuffer
    sig = _signature(kernel)
    values = _header((n,))
    for p, a in zip(sig.params, args):
        if isinstance(p.type, ArrayType):
            ptr = a.ptr if isinstance(a, DeviceBuffer) else 0
            values += [ptr, n, 0, 0, 0, 4, 0, 0, 0]
        else:
            values += [a]
    return sig.packer.pack(*values)


def test_device_buffer_round_trip_and_interface():
    from compiler.runtime.cuda_array import DeviceBuffer, cuda_array_interface
    values = np.arange(10, dtype=np.float32)
    buf = DeviceBuffer.from_host(values)
    np.testing.assert_array_equal(buf.to_host(10, np.float32), values)
    other = DeviceBuffer(40)
    other.copy_from(buf, 40)
    buf.zero_()
    np.testing.assert_array_equal(buf.to_host(10, np.float32), 0)
    np.testing.assert_array_equal(other.to_host(10, np.float32), values)
    iface = cuda_array_interface(other.ptr, (10,), np.float32)
    assert iface["data"] == (other.ptr, False) and iface["typestr"] == "<f4" and iface["version"] == 3


@pytest.mark.parametrize("n", [1, 1000, 300_000])
def test_forward_matches_the_cpu_bit_for_bit(n):
    from compiler.runtime.cuda_array import DeviceBuffer
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    xb, yb = DeviceBuffer.from_host(x), DeviceBuffer(4 * n)
    cuda_launch.forward(_affine, _affine.compiled(), _pack(_affine, n, [1.5, xb, yb]), n, False, False, "cuda:0")
    y_cpu = sp.zeros(n)
    sp.launch(_affine, n, inputs=[1.5, sp.array(x)], outputs=[y_cpu])
    np.testing.assert_array_equal(yb.to_host(n, np.float32), y_cpu.numpy())


def test_debug_launch_reports_the_out_of_bounds_line():
    from compiler.runtime.cuda_array import DeviceBuffer
    xb, yb = DeviceBuffer.from_host(np.ones(4, np.float32)), DeviceBuffer(16)
    sig = _signature(_affine)
    values = list(sig.packer.unpack(_pack(_affine, 4, [1.0, xb, yb])))
    values[:len(_header((8,)))] = _header((8,))        # 8 threads over 4-element arrays
    with pytest.raises(IndexError, match=r"test_cuda_runtime.py:\d+: kernel '_affine' indexed array '\w' out of bounds"):
        cuda_launch.forward(_affine, _affine.compiled(), sig.packer.pack(*values), 8, True, False, "cuda:0")


def test_adjoint_with_a_loop_tape_matches_the_cpu():
    from compiler.runtime.cuda_array import DeviceBuffer
    n, trips = 1000, 5
    x = np.linspace(0.1, 0.9, n, dtype=np.float32)
    xb, yb = DeviceBuffer.from_host(x), DeviceBuffer(4 * n)
    adj_x, adj_y = DeviceBuffer(4 * n), DeviceBuffer.from_host(np.ones(n, np.float32))
    adj_x.zero_()
    compiled = _horner.compiled()
    buf = _pack(_horner, n, [xb, trips, yb])
    cuda_launch.forward(_horner, compiled, buf, n, False, False, "cuda:0")
    cuda_launch.adjoint(_horner, compiled, compiled.adjoint, buf, _pack(_horner, n, [adj_x, 0, adj_y]), n, False, False, "cuda:0")

    xc, yc = sp.array(x, requires_grad=True), sp.zeros(n, requires_grad=True)
    tape = sp.Tape()
    with tape:
        sp.launch(_horner, n, inputs=[xc, trips], outputs=[yc])
    tape.backward(grads={yc: np.ones(n, np.float32)})
    np.testing.assert_array_equal(yb.to_host(n, np.float32), yc.numpy())
    np.testing.assert_array_equal(adj_x.to_host(n, np.float32), xc.grad.numpy())
