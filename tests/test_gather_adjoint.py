"""The gather form of stencil adjoints: exact sums, gathered per element, deterministic in parallel.

Accumulations at tid() + a constant offset are gathered by the element that receives them instead of
scattered by the thread that made them (compiler/passes/gather.py). Expected values are float64 analytic
references; the gather form must also agree with the scatter adjoint it replaces to float rounding,
and give the same bits whether or not the launch is deterministic (it has no atomics to order).
"""
import numpy as np
import pytest

import compiler as sp
from compiler import ir
from compiler.runtime.launch import _gather_fits
from compiler.runtime.packing import _signature
from compiler.passes.verify import verify

F2 = sp.array(dtype=float, ndim=2)
F1 = sp.array(dtype=float)
C, B = 0.25, 0.1


@sp.kernel
def wave(up: F2, u: F2, c: float, b: float, u_next: F2):
    i, j = sp.tid()
    n = u.shape[0]
    m = u.shape[1]
    x = u[i, j]
    lap = -4.0 * x
    if i > 0:
        lap += u[i - 1, j]
    if i < n - 1:
        lap += u[i + 1, j]
    if j > 0:
        lap += u[i, j - 1]
    if j < m - 1:
        lap += u[i, j + 1]
    u_next[i, j] = 2.0 * x - up[i, j] + c * lap - b * x * x * x


def wave_adjoint_reference(u, w):
    """d(sum(w * u_next))/du in float64: the transposed 5-point stencil plus the local terms."""
    u, w = u.astype(np.float64), w.astype(np.float64)
    g = (2.0 - 4.0 * C - 3.0 * B * u * u) * w
    g[1:, :] += C * w[:-1, :]       # u[i, j] is the (i + 1, j) thread's u[i - 1, j]
    g[:-1, :] += C * w[1:, :]
    g[:, 1:] += C * w[:, :-1]
    g[:, :-1] += C * w[:, 1:]
    return g


def wave_gradients(shape, deterministic, seed=0, device="cpu"):
    rng = np.random.default_rng(seed)
    u = sp.array(rng.standard_normal(shape).astype(np.float32), requires_grad=True, device=device)
    up = sp.array(rng.standard_normal(shape).astype(np.float32), requires_grad=True, device=device)
    out = sp.zeros(shape, requires_grad=True, device=device)
    w = rng.standard_normal(shape).astype(np.float32)
    tape = sp.Tape(deterministic=deterministic)
    with tape:
        sp.launch(wave, shape, inputs=[up, u, C, B], outputs=[out])
    tape.backward(grads={out: w})
    return u.numpy(), w, u.grad.numpy(), up.grad.numpy()


def test_stencil_kernel_has_a_gather_form_over_both_inputs():
    gather = wave.compiled().gather
    assert gather is not None and set(gather.arrays) == {"u", "up"} and not gather.scatters
    verify(gather.function, single_definition=False)
    assert not any(isinstance(s, ir.AccumGrad) and not s.exclusive for s in ir.walk(gather.function.body))


@pytest.mark.parametrize("shape", [(1, 1), (2, 3), (37, 64), (256, 129)])
def test_gathered_stencil_adjoint_matches_the_float64_transpose(shape, device):
    u, w, gu, gup = wave_gradients(shape, deterministic=False, device=device)
    np.testing.assert_allclose(gu, wave_adjoint_reference(u, w), rtol=2e-6, atol=2e-6)
    np.testing.assert_array_equal(gup, -w)


def test_gather_form_gives_the_same_bits_with_and_without_deterministic(device):
    a = wave_gradients((64, 80), deterministic=False, seed=3, device=device)
    b = wave_gradients((64, 80), deterministic=True, seed=3, device=device)
    np.testing.assert_array_equal(a[2], b[2])
    np.testing.assert_array_equal(a[3], b[3])


def test_gather_and_scatter_adjoints_agree_to_rounding(monkeypatch, device):
    u, w, gathered, _ = wave_gradients((48, 48), deterministic=True, seed=5, device=device)
    monkeypatch.setattr(wave.compiled(), "gather", None)
    _, _, scattered, _ = wave_gradients((48, 48), deterministic=True, seed=5, device=device)
    np.testing.assert_allclose(gathered, scattered, rtol=1e-6, atol=1e-6)


# -- what does not qualify keeps the scatter ----------------------------------------------------------
@sp.kernel
def pair_and_shift(a: F1, b: F1, out: F1):
    i = sp.tid()
    out[i] = a[i // 2] * b[i + 1]          # a: index not tid + constant; b: offset +1


def test_unqualified_arrays_scatter_in_the_zero_offset_pass(device):
    gather = pair_and_shift.compiled().gather
    assert gather is not None and gather.arrays == ("b",) and gather.scatters
    a = sp.array(np.arange(1.0, 5.0, dtype=np.float32), requires_grad=True, device=device)
    b = sp.array(np.arange(10.0, 19.0, dtype=np.float32), requires_grad=True, device=device)
    out = sp.zeros(8, requires_grad=True, device=device)
    w = np.arange(1.0, 9.0, dtype=np.float32)
    tape = sp.Tape()
    with tape:
        sp.launch(pair_and_shift, 8, inputs=[a, b], outputs=[out])
    # b (9 elements) is larger than the launch (8 threads): the gather form does not fit, so the
    # scatter adjoint runs; both must give the reference.
    assert not _gather_fits(gather, _signature(pair_and_shift), [a, b, out], (8,))
    tape.backward(grads={out: w})
    an, bn = a.numpy().astype(np.float64), b.numpy().astype(np.float64)
    ga, gb = np.zeros(4), np.zeros(9)
    for i in range(8):
        ga[i // 2] += w[i] * bn[i + 1]
        gb[i + 1] += w[i] * an[i // 2]
    np.testing.assert_array_equal(a.grad.numpy(), ga.astype(np.float32))
    np.testing.assert_array_equal(b.grad.numpy(), gb.astype(np.float32))


@sp.kernel
def shift_left(a: F1, b: F1, out: F1):
    i = sp.tid()
    n = a.shape[0]
    v = a[i // 2] * 2.0
    if i + 1 < n:
        v += b[i + 1]
    out[i] = v


def test_gather_with_a_scattered_array_when_shapes_fit(device):
    a = sp.array(np.ones(8, np.float32), requires_grad=True, device=device)
    b = sp.array(np.ones(8, np.float32), requires_grad=True, device=device)
    out = sp.zeros(8, requires_grad=True, device=device)
    assert _gather_fits(shift_left.compiled().gather, _signature(shift_left), [a, b, out], (8,))
    w = np.arange(1.0, 9.0, dtype=np.float32)
    tape = sp.Tape(deterministic=True)
    with tape:
        sp.launch(shift_left, 8, inputs=[a, b], outputs=[out])
    tape.backward(grads={out: w})
    np.testing.assert_array_equal(a.grad.numpy(), [6, 14, 22, 30, 0, 0, 0, 0])
    np.testing.assert_array_equal(b.grad.numpy(), [0, 1, 2, 3, 4, 5, 6, 7])


@sp.kernel
def indirect(idx: sp.array(dtype=int), x: F1, out: F1):
    i = sp.tid()
    out[i] = x[idx[i]]


@sp.kernel
def reads_its_accumulator(x: F1, acc: F1):
    i = sp.tid()
    acc[i] += x[i] * acc[i]


def test_kernels_without_affine_gradients_have_no_gather_form():
    assert indirect.compiled().gather is None
    # acc's gradient is read (its own += ) and accumulated: gathering it would race with the reads.
    gather = reads_its_accumulator.compiled().gather
    assert gather is None or "acc" not in gather.arrays


@sp.kernel
def smooth3(x: sp.array(dtype=sp.vec3, ndim=2), out: sp.array(dtype=sp.vec3, ndim=2)):
    i, j = sp.tid()
    m = x.shape[1]
    v = x[i, j]
    if j + 2 < m:
        v = v + 0.5 * x[i, j + 2]
    out[i, j] = v


def test_vector_arrays_gather_too(device):
    assert smooth3.compiled().gather.arrays == ("x",)
    rng = np.random.default_rng(1)
    x = sp.array(rng.standard_normal((5, 7, 3)).astype(np.float32), dtype=sp.vec3, requires_grad=True, device=device)
    out = sp.zeros((5, 7), dtype=sp.vec3, requires_grad=True, device=device)
    w = rng.standard_normal((5, 7, 3)).astype(np.float32)
    tape = sp.Tape()
    with tape:
        sp.launch(smooth3, (5, 7), inputs=[x], outputs=[out])
    tape.backward(grads={out: w})
    expected = w.astype(np.float64).copy()
    expected[:, 2:] += 0.5 * w[:, :-2]
    np.testing.assert_allclose(x.grad.numpy(), expected, rtol=1e-6)


# -- periodic stencils ---------------------------------------------------------------------------------
@sp.kernel
def periodic_wave(u: F2, up: F2, c: float, b: float, n: int, u_next: F2):
    i, j = sp.tid()
    x = u[i, j]
    lap = u[(i + 1) % n, j] + u[(i + n - 1) % n, j] + u[i, (j + 1) % n] + u[i, (j + n - 1) % n] - 4.0 * x
    u_next[i, j] = 2.0 * x - up[i, j] + c * lap - b * x * x * x


def periodic_gradients(n, w, u, up, period, deterministic=True, device="cpu"):
    ua = sp.array(u, requires_grad=True, device=device)
    upa = sp.array(up, requires_grad=True, device=device)
    out = sp.zeros((n, n), requires_grad=True, device=device)
    tape = sp.Tape(deterministic=deterministic)
    with tape:
        sp.launch(periodic_wave, (n, n), inputs=[ua, upa, C, B, period], outputs=[out])
    tape.backward(grads={out: w})
    return out.numpy(), ua.grad.numpy(), upa.grad.numpy()


@pytest.mark.parametrize("n", [1, 2, 3, 33, 128])
def test_periodic_stencil_gathers_and_matches_the_float64_transpose(n, device):
    """(i + 1) % n and (i + n - 1) % n with n the extent: the gather wraps around each axis, and in
    the middle of the launch the interior variant indexes without the modulo."""
    gather = periodic_wave.compiled().gather
    assert set(gather.arrays) == {"u", "up"} and not gather.scatters
    rng = np.random.default_rng(n)
    u, up, w = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(3))
    args = [sp.array(u, device=device), sp.array(up, device=device), C, B, n, sp.zeros((n, n), device=device)]
    assert _gather_fits(gather, _signature(periodic_wave), args, (n, n))
    out, gu, gup = periodic_gradients(n, w, u, up, n, device=device)
    u64, w64 = u.astype(np.float64), w.astype(np.float64)
    lap = sum(np.roll(u64, s, axis=a) for s in (1, -1) for a in (0, 1)) - 4.0 * u64
    np.testing.assert_allclose(out, 2.0 * u64 - up + C * lap - B * u64 ** 3, rtol=1e-5, atol=1e-5)
    expected = (2.0 - 4.0 * C - 3.0 * B * u64 * u64) * w64 + C * sum(
        np.roll(w64, s, axis=a) for s in (1, -1) for a in (0, 1))
    np.testing.assert_allclose(gu, expected, rtol=2e-6, atol=2e-6)
    np.testing.assert_array_equal(gup, -w)
    same = periodic_gradients(n, w, u, up, n, deterministic=False, device=device)
    np.testing.assert_array_equal(same[1], gu)


def test_a_period_other_than_the_extent_keeps_the_scatter(device):
    # n = 5 on a 7 x 7 launch: thread 6 reads row (6 + 1) % 5 = 2, not a neighbour in the launch.
    gather = periodic_wave.compiled().gather
    rng = np.random.default_rng(9)
    u, up, w = (rng.standard_normal((7, 7)).astype(np.float32) for _ in range(3))
    args = [sp.array(u, device=device), sp.array(up, device=device), C, B, 5, sp.zeros((7, 7), device=device)]
    assert not _gather_fits(gather, _signature(periodic_wave), args, (7, 7))
    _, gu, _ = periodic_gradients(7, w, u, up, 5, device=device)
    u64, w64 = u.astype(np.float64), w.astype(np.float64)
    expected = (2.0 - 4.0 * C - 3.0 * B * u64 * u64) * w64
    for i in range(7):
        for j in range(7):
            for a, b in (((i + 1) % 5, j), ((i + 4) % 5, j), (i, (j + 1) % 5), (i, (j + 4) % 5)):
                expected[a, b] += C * w64[i, j]
    np.testing.assert_allclose(gu, expected, rtol=2e-6, atol=2e-6)


@sp.kernel
def clamped_wave(u: F2, up: F2, c: float, b: float, last: int, u_next: F2):
    i, j = sp.tid()
    m = u.shape[1]
    x = u[i, j]
    lap = (u[sp.max(i - 1, 0), j] + u[sp.min(i + 1, last), j] + u[i, sp.max(0, j - 2)]
           + u[i, sp.min(j + 1, m - 1)] - 4.0 * x)
    u_next[i, j] = 2.0 * x - up[i, j] + c * lap - b * x * x * x


def clamped_gradients(shape, w, u, up, last, deterministic=True, device="cpu"):
    ua = sp.array(u, requires_grad=True, device=device)
    upa = sp.array(up, requires_grad=True, device=device)
    out = sp.zeros(shape, requires_grad=True, device=device)
    tape = sp.Tape(deterministic=deterministic)
    with tape:
        sp.launch(clamped_wave, shape, inputs=[ua, upa, C, B, last], outputs=[out])
    tape.backward(grads={out: w})
    return ua.grad.numpy(), upa.grad.numpy()


def clamped_reference(u, w, last):
    """The scatter in float64: every thread adds C * w to the four elements it read."""
    n, m = u.shape
    u64, w64 = u.astype(np.float64), w.astype(np.float64)
    g = (2.0 - 4.0 * C - 3.0 * B * u64 * u64) * w64
    i, j = np.indices((n, m))
    for a, b in ((np.maximum(i - 1, 0), j), (np.minimum(i + 1, last), j), (i, np.maximum(0, j - 2)),
                 (i, np.minimum(j + 1, m - 1))):
        np.add.at(g, (a, b), C * w64)
    return g


@pytest.mark.parametrize("shape", [(1, 1), (2, 3), (3, 2), (5, 7), (40, 33)])
def test_clamped_stencil_gathers_edge_accumulations_and_matches_the_float64_scatter(shape, device):
    """max(i - 1, 0) and min(i + 1, n - 1) (and a clamp two away): the edge thread gathers what
    every clamped thread put on it; same values as the scatter, same bits on any thread count."""
    gather = clamped_wave.compiled().gather
    assert set(gather.arrays) == {"u", "up"} and not gather.scatters
    n, m = shape
    rng = np.random.default_rng(n * 100 + m)
    u, up, w = (rng.standard_normal(shape).astype(np.float32) for _ in range(3))
    args = [sp.array(u, device=device), sp.array(up, device=device), C, B, n - 1, sp.zeros(shape, device=device)]
    assert _gather_fits(gather, _signature(clamped_wave), args, shape)
    gu, gup = clamped_gradients(shape, w, u, up, n - 1, device=device)
    np.testing.assert_allclose(gu, clamped_reference(u, w, n - 1), rtol=2e-6, atol=2e-6)
    np.testing.assert_array_equal(gup, -w)
    np.testing.assert_array_equal(clamped_gradients(shape, w, u, up, n - 1, deterministic=False, device=device)[0], gu)


def test_a_clamp_short_of_the_edge_keeps_the_scatter(device):
    # min(i + 1, 3) on a 6 x 6 launch lands threads 3-5 on row 3, not on the edge row 5
    rng = np.random.default_rng(4)
    u, up, w = (rng.standard_normal((6, 6)).astype(np.float32) for _ in range(3))
    args = [sp.array(u, device=device), sp.array(up, device=device), C, B, 3, sp.zeros((6, 6), device=device)]
    assert not _gather_fits(clamped_wave.compiled().gather, _signature(clamped_wave), args, (6, 6))
    np.testing.assert_allclose(clamped_gradients((6, 6), w, u, up, 3, device=device)[0], clamped_reference(u, w, 3),
                               rtol=2e-6, atol=2e-6)


D2 = sp.array(dtype=sp.float64, ndim=2)


@sp.kernel
def halo_wave(u: D2, up: D2, u_next: D2):
    """A block of rows read from an array with one halo row above and below (as a rank of a
    decomposed grid reads it): row i of the block is row i + 1 of `u`."""
    i, j = sp.tid()
    m = u.shape[1]
    x = u[i + 1, j]
    value = 2.0 * x - up[i, j] - 0.1 * x * x * x
    if j > 0 and j < m - 1:
        value += 0.25 * (u[i, j] + u[i + 2, j] + u[i + 1, j - 1] + u[i + 1, j + 1] - 4.0 * x)
    u_next[i, j] = value


@pytest.mark.parametrize("shape", [(9, 7), (40, 33)])
def test_a_block_read_with_halo_rows_gathers_over_the_wider_array(shape, device):
    """u is two rows wider than the launch: the gather form runs over u's rows (threads beyond the
    launch gather what the edge threads scattered into the halo rows) and writes up's gradient
    only where up has rows. Against the float64 transpose; the same bits on one thread and many."""
    n, m = shape
    rng = np.random.default_rng(3)
    u0, up0, w = rng.standard_normal((n + 2, m)), rng.standard_normal((n, m)), rng.standard_normal((n, m))
    args = [sp.array(u0, dtype=sp.float64), sp.array(up0, dtype=sp.float64), sp.zeros((n, m), dtype=sp.float64)]
    assert _gather_fits(halo_wave.compiled().gather, _signature(halo_wave), args, shape) == (n + 2, m)
    # rows are read at offsets 0, 1, 2 (they may widen), columns at -1, 0, 1 (they may not), and a
    # centred stencil's form never widens: it is the plain form, with no clamps for threads beyond
    assert halo_wave.compiled().gather.widens == (True, False) and wave.compiled().gather.widens == (False, False)

    def gradients(deterministic):
        u = sp.array(u0, dtype=sp.float64, requires_grad=True, device=device)
        up = sp.array(up0, dtype=sp.float64, requires_grad=True, device=device)
        out = sp.zeros((n, m), dtype=sp.float64, requires_grad=True, device=device)
        tape = sp.Tape(deterministic=deterministic)
        with tape:
            sp.launch(halo_wave, shape, inputs=[u, up], outputs=[out])
        tape.backward(grads={out: sp.array(w, dtype=sp.float64, device=device)})
        return u.grad.numpy(), up.grad.numpy()
    gu, gup = gradients(True)
    x = u0[1:-1]
    expected = np.zeros((n + 2, m))
    expected[1:-1] += (2.0 - 0.3 * x * x) * w
    inner = np.zeros((n, m))
    inner[:, 1:-1] = 0.25 * w[:, 1:-1]
    expected[1:-1] -= 4.0 * inner
    expected[:-2] += inner                 # u[i, j]
    expected[2:] += inner                  # u[i + 2, j]
    expected[1:-1, :-2] += inner[:, 1:m - 1]     # u[i + 1, j - 1]
    expected[1:-1, 2:] += inner[:, 1:m - 1]      # u[i + 1, j + 1]
    np.testing.assert_allclose(gu, expected, rtol=1e-13, atol=1e-13)
    np.testing.assert_array_equal(gup, -w)
    ga, gb = gradients(False)
    np.testing.assert_array_equal(ga, gu)
    np.testing.assert_array_equal(gb, gup)
