"""Tape.backward(fresh=...): gradient arrays whose memory is new and stands for zeros.

A gather form writes each element of its gathered gradients exactly once, so into fresh memory it
stores ``0 + value`` instead of adding (no zero-fill first); every other use of a fresh gradient
zero-fills it first, and backward zero-fills what nothing used. The fresh arrays here start full
of NaN: any element read before it is written shows. Results must be the bits of the plain path
(zeroed gradients, accumulated into).
"""
import numpy as np

import compiler as sp
from compiler.runtime.launch import _fresh_mask
from compiler.runtime.packing import _signature
from test_gather_adjoint import B, C, wave, wave_adjoint_reference

F1 = sp.array(dtype=float)
I1 = sp.array(dtype=sp.int32)


@sp.kernel
def pick(x: F1, idx: I1, y: F1):
    i = sp.tid()
    y[i] = 2.0 * x[idx[i]]


def bits(a) -> np.ndarray:
    return a.numpy().view(np.uint32)


def garbage(a):
    """Make `a` look like new memory: NaN everywhere (what a stray read would show)."""
    a.fill_(np.nan)
    return a


def wave_inputs(shape=(37, 41), seed=0, device="cpu"):
    rng = np.random.default_rng(seed)
    up = sp.array(rng.standard_normal(shape).astype(np.float32), requires_grad=True, device=device)
    u = sp.array(rng.standard_normal(shape).astype(np.float32), requires_grad=True, device=device)
    w = rng.standard_normal(shape).astype(np.float32)
    w[:5] = 0.0                       # zero and negative-zero seeds: the sign of every zero must match
    w[5:9] = -0.0
    return up, u, w


def run_wave(up, u, w, fresh, same=False):
    out = sp.zeros(u.shape, requires_grad=True, device=u.device)
    tape = sp.Tape()
    with tape:
        sp.launch(wave, u.shape, inputs=[u if same else up, u, C, B], outputs=[out])
    tape.backward(grads={out: w}, fresh=fresh)
    return tape


def test_a_gather_form_overwrites_fresh_gradients_with_the_bits_of_adding_to_zeros(device):
    up, u, w = wave_inputs(device=device)
    run_wave(up, u, w, fresh=())
    expect_u, expect_up = bits(u.grad).copy(), bits(up.grad).copy()
    # d/dup is -w: its one contribution added to a zero (every zero comes out +0.0)
    np.testing.assert_array_equal(expect_up, (np.float32(0.0) + -w).view(np.uint32))
    np.testing.assert_allclose(u.grad.numpy(), wave_adjoint_reference(u.numpy(), w), rtol=1e-5, atol=1e-6)
    up2, u2, _ = wave_inputs(device=device)
    run_wave(up2, u2, w, fresh=(garbage(u2.grad), garbage(up2.grad)))
    np.testing.assert_array_equal(bits(u2.grad), expect_u)
    np.testing.assert_array_equal(bits(up2.grad), expect_up)


def test_fresh_gradients_still_accumulate_where_not_fresh(device):
    """Only the gradients named fresh are overwritten: up.grad here holds earlier sums."""
    up, u, w = wave_inputs(device=device)
    up.grad.fill_(1.5)
    run_wave(up, u, w, fresh=())
    expect = bits(up.grad).copy()
    np.testing.assert_array_equal(expect, (np.float32(1.5) + -w).view(np.uint32))
    up2, u2, _ = wave_inputs(device=device)
    up2.grad.fill_(1.5)
    run_wave(up2, u2, w, fresh=(garbage(u2.grad),))
    np.testing.assert_array_equal(bits(up2.grad), expect)


def test_an_array_passed_as_two_arguments_is_not_overwritten_twice(device):
    """up and u are the same array: its gradient gets both parameters' sums, so neither stores:
    the fresh mask is empty and the gradient is zero-filled before the adjoint runs."""
    _, u, w = wave_inputs(device=device)
    out = sp.zeros(u.shape, requires_grad=True, device=device)
    pending = {id(u.grad._storage): garbage(u.grad)}
    assert _fresh_mask(pending, _signature(wave), [u, u, C, B, out], gathered=("up", "u")) == 0
    assert not pending and not u.grad.numpy().any()
    run_wave(None, u, w, fresh=(), same=True)
    expect = bits(u.grad).copy()
    _, u2, _ = wave_inputs(device=device)
    run_wave(None, u2, w, fresh=(garbage(u2.grad),), same=True)
    np.testing.assert_array_equal(bits(u2.grad), expect)


def test_fresh_gradients_nothing_wrote_are_zero_filled(device):
    up, u, w = wave_inputs(device=device)
    unused = garbage(sp.zeros(7, device=device))
    run_wave(up, u, w, fresh=(garbage(u.grad), garbage(up.grad), unused))
    np.testing.assert_array_equal(unused.numpy(), np.zeros(7, np.float32))
    assert np.isfinite(u.grad.numpy()).all() and np.isfinite(up.grad.numpy()).all()


def test_scatters_seeds_and_copies_see_zeros_in_fresh_gradients(device):
    """A scattering adjoint (x[idx[i]]), a copy's adjoint and a seed add into fresh gradients:
    each is zero-filled first."""
    idx = sp.array(np.array([3, 0, 3, 1, 3], np.int32), device=device)

    def run(fresh_ones):
        x = sp.array(np.arange(4, dtype=np.float32), requires_grad=True, device=device)
        y = sp.zeros(5, requires_grad=True, device=device)
        z = sp.zeros(5, requires_grad=True, device=device)
        tape = sp.Tape()
        with tape:
            sp.launch(pick, 5, inputs=[x, idx], outputs=[y])
            sp.copy(z, y)
        fresh = [garbage(a.grad) for a in (x, y, z)] if fresh_ones else ()
        tape.backward(grads={z: np.ones(5, np.float32)}, fresh=fresh)
        return x.grad.numpy().copy(), y.grad.numpy().copy()

    gx, gy = run(fresh_ones=True)
    np.testing.assert_array_equal(gx, [2.0, 2.0, 0.0, 6.0])
    np.testing.assert_array_equal(gy, np.ones(5, np.float32))
    ref_x, ref_y = run(fresh_ones=False)
    np.testing.assert_array_equal(gx, ref_x)
    np.testing.assert_array_equal(gy, ref_y)
