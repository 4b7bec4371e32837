"""Deterministic launches that add into a few elements run in parallel, with fixed-order sums.

A deterministic launch of a kernel that only adds into what it accumulates, a few elements
(a loss, a shared parameter's gradient), runs in chunks of ADD_CHUNK threads: each chunk sums its
adds per element in thread order into a float64 partial (the first add starts it), and the chunks'
partials are added to the elements in chunk order, one rounding each (add_log in
compiler/codegen/prelude.h). `chunked` below is that order, in numpy; it depends on the launch size
only, so every thread count gives the same bits, and a GPU the CPU's (a GPU thread per chunk, the
partials in device memory: the tests taking `device` run on the CUDA simulator in CI, its threads
shuffled). Below the parallel threshold one thread runs the chunks in order. Scatters over many elements,
and kernels where deferring an add could change what a thread sees, keep the serial run, whose
order is ``np.add.at``'s (index order).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import stepper as sp
from compiler.runtime.packing import _serial_flag, _signature

N = 100_003                  # above the parallel threshold (32,768 threads), and not a multiple of anything
CHUNK = 4096                 # ADD_CHUNK in prelude.h
F32 = sp.array(dtype=sp.float32)
I32 = sp.array(dtype=sp.int32)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@sp.kernel
def sum_squares(x: F32, out: F32):
    i = sp.tid()
    sp.atomic_add(out, 0, x[i] * x[i])


@sp.kernel
def histogram(x: F32, bins: I32, out: F32, counts: I32):
    i = sp.tid()
    sp.atomic_add(out, bins[i], x[i])
    sp.atomic_add(counts, bins[i], 1)


@sp.kernel
def scale(x: F32, c: F32, y: F32):
    i = sp.tid()
    y[i] = c[0] * x[i]                     # the adjoint adds into c.grad[0] from every thread


@sp.kernel
def pick(x: F32, index: I32, y: F32):
    i = sp.tid()
    y[i] = 2.0 * x[index[i]]               # the adjoint scatters into x.grad: no gather form


@sp.kernel
def pick_in_loops(x: F32, index: I32, y: F32):
    i = sp.tid()
    total = float(0.0)
    for k in range(3):
        total = total + x[index[i]] * float(k + 1)
    y[i] = total


@sp.kernel
def reads_back(x: F32, out: F32, seen: F32):
    i = sp.tid()
    sp.atomic_add(out, 0, x[i])
    seen[i] = out[0]                        # reads what it accumulates: must stay serial


@sp.kernel
def scale_in_loop(x: F32, c: F32, y: F32):
    i = sp.tid()
    total = float(0.0)
    for k in range(2):
        total = total + c[0] * x[i] * float(k + 1)      # the adjoint keeps a loop tape
    y[i] = total


def _data(seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(N).astype(np.float32), rng.integers(0, 7, N).astype(np.int32),
            rng.integers(0, N, N).astype(np.int32))


def chunked(targets, values, size, per_thread=1):
    """The sums a logged launch makes: per chunk (of CHUNK threads, each making `per_thread` of
    the adds, in order), each element's adds summed in order into a partial, in float64 whatever
    the element's type; the partials added to the elements in chunk order, each in one rounding."""
    out = np.zeros(size, values.dtype)
    step = CHUNK * per_thread
    for start in range(0, len(values), step):
        partials = {}
        for t, v in zip(targets[start:start + step], values[start:start + step]):
            partials[t] = partials[t] + np.float64(v) if t in partials else np.float64(v)
        for t, v in partials.items():
            out[t] = np.float64(out[t]) + v
    return out


def test_a_deterministic_loss_is_summed_in_parallel_in_fixed_chunks():
    x, _, _ = _data()
    xs = sp.array(x)
    out = sp.zeros(1, dtype=sp.float32)
    sp.launch(sum_squares, N, inputs=[xs], outputs=[out], deterministic=True)
    assert _serial_flag(True, _signature(sum_squares).forward_logs_adds, [out]) == 2     # the parallel path
    assert out.numpy()[0] == chunked(np.zeros(N, int), x * x, 1)[0]                    # bit for bit
    assert out.numpy()[0] != np.cumsum(x * x, dtype=np.float32)[-1]       # and not the serial order's bits


def test_adds_into_a_few_elements_follow_the_chunks_and_int_atomics_stay_exact():
    x, bins, _ = _data(1)
    out, counts = sp.zeros(7, dtype=sp.float32), sp.zeros(7, dtype=sp.int32)
    sp.launch(histogram, N, inputs=[sp.array(x), sp.array(bins)], outputs=[out, counts], deterministic=True)
    np.testing.assert_array_equal(out.numpy(), chunked(bins, x, 7))
    np.testing.assert_array_equal(counts.numpy(), np.bincount(bins, minlength=7))


def test_a_shared_parameters_gradient_is_summed_in_parallel_in_fixed_chunks():
    x, _, _ = _data(5)
    c = sp.array(np.array([1.5], np.float32), requires_grad=True)
    y = sp.zeros(N, dtype=sp.float32, requires_grad=True)
    seed = np.random.default_rng(6).standard_normal(N).astype(np.float32)
    tape = sp.Tape(deterministic=True)
    with tape:
        sp.launch(scale, N, inputs=[sp.array(x), c], outputs=[y])
    tape.backward(grads={y: seed})
    assert c.grad.numpy()[0] == chunked(np.zeros(N, int), seed * x, 1)[0]


@pytest.mark.parametrize("kernel", [pick, pick_in_loops], ids=["scatter", "scatter-with-loop-tape"])
def test_scatter_adjoints_into_many_elements_run_serially_in_index_order(kernel):
    x, _, index = _data(2)
    xs = sp.array(x, requires_grad=True)
    y = sp.zeros(N, dtype=sp.float32, requires_grad=True)
    seed = np.random.default_rng(3).standard_normal(N).astype(np.float32)
    tape = sp.Tape(deterministic=True)
    with tape:
        sp.launch(kernel, N, inputs=[xs, sp.array(index)], outputs=[y])
    tape.backward(grads={y: seed})
    assert _serial_flag(True, _signature(kernel).adjoint_logs_adds, [xs]) == 1      # N targets: serial
    expected = np.zeros(N, np.float32)
    if kernel is pick:
        np.add.at(expected, index, np.float32(2) * seed)
    else:                                   # thread i adds its loop iterations' parts, last iteration first
        parts = np.stack([seed * np.float32(k) for k in (3, 2, 1)], axis=1).reshape(-1)
        np.add.at(expected, np.repeat(index, 3), parts)
    np.testing.assert_array_equal(xs.grad.numpy(), expected)


def test_kernels_that_read_what_they_accumulate_stay_serial():
    x = np.ones(N, np.float32)
    out, seen = sp.zeros(1, dtype=sp.float32), sp.zeros(N, dtype=sp.float32)
    sp.launch(reads_back, N, inputs=[sp.array(x)], outputs=[out, seen], deterministic=True)
    assert not _signature(reads_back).forward_logs_adds
    np.testing.assert_array_equal(seen.numpy(), np.arange(1, N + 1, dtype=np.float32))    # thread i saw i + 1 adds


_CHILD = """
import json, sys, numpy as np
sys.path.insert(0, {root!r}); sys.path.insert(0, {tests!r})
import stepper as sp
import test_deterministic_adds as t
x, bins, index = t._data(4)
out = sp.zeros(7, dtype=sp.float32); counts = sp.zeros(7, dtype=sp.int32)
sp.launch(t.histogram, t.N, inputs=[sp.array(x), sp.array(bins)], outputs=[out, counts], deterministic=True)
xs = sp.array(x, requires_grad=True); y = sp.zeros(t.N, dtype=sp.float32, requires_grad=True)
tape = sp.Tape(deterministic=True)
c = sp.array(np.array([0.5], np.float32), requires_grad=True)
with tape:
    sp.launch(t.pick, t.N, inputs=[xs, sp.array(index)], outputs=[y])
    z = sp.zeros(t.N, dtype=sp.float32, requires_grad=True)
    sp.launch(t.scale, t.N, inputs=[xs, c], outputs=[z])
tape.backward(grads={{y: np.linspace(-1, 1, t.N, dtype=np.float32), z: np.cos(x)}})
print(json.dumps([out.numpy().tobytes().hex(), xs.grad.numpy().tobytes().hex(), c.grad.numpy().tobytes().hex()]))
"""


def test_the_same_bits_on_1_2_and_5_threads():
    code = _CHILD.format(root=ROOT, tests=os.path.dirname(os.path.abspath(__file__)))
    runs = {}
    for threads in (1, 2, 5):
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        runs[threads] = json.loads(done.stdout.strip().splitlines()[-1])
    assert runs[1] == runs[2] == runs[5]


@pytest.mark.parametrize("n", [N, 1_000], ids=["parallel", "below-threshold"])
def test_a_loss_and_a_histogram_get_the_same_bits_on_every_device(device, n):
    x, bins, _ = _data(7)
    x, bins = x[:n], bins[:n]
    out, hist, counts = (sp.zeros(1, dtype=sp.float32, device=device), sp.zeros(7, dtype=sp.float32, device=device),
                         sp.zeros(7, dtype=sp.int32, device=device))
    sp.launch(sum_squares, n, inputs=[sp.array(x, device=device)], outputs=[out], deterministic=True)
    sp.launch(histogram, n, inputs=[sp.array(x, device=device), sp.array(bins, device=device)], outputs=[hist, counts],
              deterministic=True)
    # below the parallel threshold one thread runs the chunks, in the same order
    expected_loss, expected_hist = chunked(np.zeros(n, int), x * x, 1), chunked(bins, x, 7)
    np.testing.assert_array_equal(out.numpy(), expected_loss)
    np.testing.assert_array_equal(hist.numpy(), expected_hist)
    np.testing.assert_array_equal(counts.numpy(), np.bincount(bins, minlength=7))


@pytest.mark.parametrize("kernel", [scale, scale_in_loop], ids=["gather-adjoint", "loop-tape-adjoint"])
def test_a_shared_parameters_gradient_gets_the_same_bits_on_every_device(device, kernel):
    x, _, _ = _data(8)
    c = sp.array(np.array([0.75], np.float32), requires_grad=True, device=device)
    y = sp.zeros(N, dtype=sp.float32, requires_grad=True, device=device)
    seed = np.random.default_rng(9).standard_normal(N).astype(np.float32)
    tape = sp.Tape(deterministic=True)
    with tape:
        sp.launch(kernel, N, inputs=[sp.array(x, device=device), c], outputs=[y])
    tape.backward(grads={y: sp.array(seed, device=device)})
    if kernel is scale:
        adds = seed * x
    else:                                   # thread i adds its iterations' parts, the last iteration first
        adds = np.stack([(seed * np.float32(k)) * x for k in (2, 1)], axis=1).reshape(-1)
    assert c.grad.numpy()[0] == chunked(np.zeros(len(adds), int), adds, 1, per_thread=len(adds) // N)[0]


def test_a_captured_deterministic_loss_replays_what_launches_add(device):
    """Inside capture() (a CUDA graph on a GPU) the chunked launch and the launch that adds its
    partials are both captured: the capture's run and two replays add what three launches add."""
    x, _, _ = _data(10)
    xs = sp.array(x, device=device)
    launched, captured = sp.zeros(1, dtype=sp.float32, device=device), sp.zeros(1, dtype=sp.float32, device=device)
    for k in range(3):
        sp.launch(sum_squares, N, inputs=[xs], outputs=[launched], deterministic=True)
        if k == 0:
            assert launched.numpy()[0] == chunked(np.zeros(N, int), x * x, 1)[0]
    with sp.capture() as graph:
        sp.launch(sum_squares, N, inputs=[xs], outputs=[captured], deterministic=True)
    graph.replay()
    graph.replay()
    np.testing.assert_array_equal(captured.numpy(), launched.numpy())
