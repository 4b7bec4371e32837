"""Inputs an output may be written over (compiler/passes/in_place.py): a leapfrog step reads u_prev
only at each thread's own point before it writes u_next there, so a stepper may hand it one array
for both, and its forward then gives the bits it gives on two arrays."""
import numpy as np
import pytest

import compiler as sp
from compiler.codegen.targets import render_cpu
from compiler.passes.in_place import in_place_pairs

F2 = sp.array(dtype=float, ndim=2)
D2 = sp.array(dtype=sp.float64, ndim=2)


@sp.kernel
def leapfrog(up: F2, u: F2, c: float, u_next: F2):
    i, j = sp.tid()
    v = float(0.0)
    if i >= 2 and j >= 2 and i < u.shape[0] - 2 and j < u.shape[1] - 2:
        x = u[i, j]
        lap = -5.0 * x
        for r in range(1, 3):
            lap += (1.5 - r) * (u[i + r, j] + u[i - r, j] + u[i, j + r] + u[i, j - r])
        v = 2.0 * x - up[i, j] + c * lap - 0.1 * x * x * x
    u_next[i, j] = v


@sp.kernel
def reads_a_neighbour(up: F2, u: F2, u_next: F2):
    i, j = sp.tid()
    u_next[i, j] = u[i, j] - up[i, sp.max(j - 1, 0)]


@sp.kernel
def reads_after_writing(up: F2, u: F2, u_next: F2):
    i, j = sp.tid()
    u_next[i, j] = u[i, j]
    if i > 0:
        u_next[i, j] = up[i, j] + u[i, j]


@sp.kernel
def accumulates(up: F2, u_next: F2):
    i, j = sp.tid()
    u_next[i, j] += up[i, j]


@sp.kernel
def writes_in_a_loop(up: F2, u_next: F2):
    i, j = sp.tid()
    for r in range(2):
        u_next[i, j] = up[i, j] * float(r)


@sp.kernel
def other_type(up: D2, u: F2, u_next: F2):
    i, j = sp.tid()
    u_next[i, j] = u[i, j] - float(up[i, j])


@pytest.mark.parametrize("kernel, pairs", [
    (leapfrog, {("up", "u_next")}),
    (reads_a_neighbour, {("u", "u_next")}),   # up at another thread's point: maybe written before
    (reads_after_writing, set()),         # up read after u_next's first store
    (accumulates, set()),                 # u_next read (+=)
    (writes_in_a_loop, set()),            # the loop's next turn reads after the store
    (other_type, {("u", "u_next")}),      # float64 up, float32 u_next: never one array
])
def test_which_inputs_an_output_may_be_written_over(kernel, pairs):
    assert in_place_pairs(kernel.compiled().forward) == pairs
    assert kernel.compiled().in_place == pairs


@pytest.mark.parametrize("shape", [(5, 7), (300, 260)])   # (one thread, and past the parallel threshold)
def test_a_forward_written_over_its_input_gives_the_bits_of_two_arrays(shape):
    """`up` and `u_next` one array: the bits of a launch on two, and the CPU entry keeps its
    alias-test-free loops (the overlap test lets an in-place pair be one array)."""
    rng = np.random.default_rng(3)
    up0, u0 = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
    apart = sp.zeros(shape, dtype=float)
    sp.launch(leapfrog, shape, inputs=[sp.array(up0), sp.array(u0), 0.1], outputs=[apart])
    over = sp.array(up0)
    sp.launch(leapfrog, shape, inputs=[over, sp.array(u0), 0.1], outputs=[over])
    np.testing.assert_array_equal(over.numpy(), apart.numpy())
    source = render_cpu([leapfrog.compiled().functions()], False).source
    assert "!sp::same(A.a_u_next, A.a_up, 2)" in source
