"""Software prefetch in the CPU loop nests (compiler/codegen/prefetch.py): which rows a stencil's
next row streams, and that the blocked, prefetching middle loops give the same bits as the plain
ones, forward and adjoint (both passes of a two-pass form), on one thread and on several."""
import numpy as np
import pytest

import compiler as sp
from compiler.codegen import prefetch
from compiler.codegen.targets import render_cpu
from compiler.kernel import Kernel, KernelModule
from gather_forms import corpus, gradients, inputs

F1 = sp.array(dtype=sp.float64)
F2 = sp.array(dtype=sp.float32, ndim=2)


@sp.kernel
def scale(x: F1, y: F1):
    i = sp.tid()
    y[i] = 2.0 * x[i]


@sp.kernel
def shifted(u: F2, v: F2, out: F2):
    """Reads u two rows behind and one ahead, v only behind: each array's row furthest ahead."""
    i, j = sp.tid()
    if i >= 2 and i < u.shape[0] - 1:
        out[i, j] = u[i - 2, j] + u[i + 1, j] + v[i - 1, j]


def interior(kernel):
    return kernel.compiled().interior.function


def test_the_rows_a_2d_stencil_streams():
    """An 8th-order update reads u four rows ahead: the next row needs u's row five ahead, and the
    own row of every array read or written pointwise."""
    found = prefetch.streams(interior(corpus(8, 2)["fwi"]))
    assert found == [("A.a_damp", (1,), False, 8), ("A.a_m", (1,), False, 8), ("A.a_u", (5,), False, 8),
                     ("A.a_u_next", (1,), True, 8), ("A.a_up", (1,), False, 8)]
    assert prefetch.streams(interior(shifted)) == [("A.a_out", (1,), True, 4), ("A.a_u", (2,), False, 4),
                                                   ("A.a_v", (0,), False, 4)]


def test_the_rows_a_3d_stencil_streams():
    """In 3-D the next row is one on along axis 1: u's comes from the plane furthest ahead."""
    found = dict((name, offsets) for name, offsets, *_ in prefetch.streams(interior(corpus(4, 3)["unrolled"])))
    assert found == {"A.a_u": (2, 1), "A.a_up": (0, 1), "A.a_u_next": (0, 1)}


def test_one_index_and_the_gradients_a_launch_lacks_stream_nothing():
    assert prefetch.plan(scale.compiled().forward) is None
    pointwise = corpus(8, 2)["fwi"].compiled().gather.pointwise_interior.function
    names = {name for name, *_ in prefetch.streams(pointwise)}
    assert {"G.a_m", "G.a_damp", "G.a_u_next"} <= names
    damp = [p.name for p in pointwise.params].index("damp")
    assert "G.a_damp" not in {name for name, *_ in prefetch.streams(pointwise, grads=~(1 << damp))}


def test_what_only_an_absent_gradient_reads_is_not_streamed():
    """`up` enters the FWI update as (1 - d) * up, whose partial derivative by up is (1 - d): only
    damp's gradient reads up's values (and those of the quotient, which up is part of). A launch
    whose damping profile has no gradient streams no row of up."""
    pointwise = corpus(8, 2)["fwi"].compiled().gather.pointwise_interior.function
    damp = [p.name for p in pointwise.params].index("damp")
    assert "A.a_up" in {name for name, *_ in prefetch.streams(pointwise)}
    names = {name for name, *_ in prefetch.streams(pointwise, grads=~(1 << damp))}
    assert "A.a_up" not in names and {"A.a_u", "A.a_m", "A.a_damp", "G.a_up", "G.a_m", "G.a_u_next"} <= names


def prefetching_copy(kernel, monkeypatch):
    """`kernel` in a module of its own, rendered to prefetch at any size, in blocks of one line."""
    monkeypatch.setattr(prefetch, "PREFETCH_FROM_BYTES", 0)
    monkeypatch.setattr(prefetch, "BLOCK_BYTES", 1)
    module = KernelModule(f"prefetching_{kernel.__name__}_{id(kernel)}")
    copy = Kernel(kernel.fn, module)
    module.add(copy)
    assert "__builtin_prefetch" in render_cpu([copy.compiled().functions()], False).source
    return copy


@pytest.mark.parametrize("kernel, shape", [
    (corpus(8, 2)["fwi"], (37, 45)), (corpus(2, 2)["neighbours"], (23, 50)),
    (corpus(4, 3)["table"], (13, 11, 21))])
def test_prefetching_loops_give_the_bits_of_the_plain_ones(kernel, shape, monkeypatch):
    values, w = inputs(kernel, shape, seed=3)
    expected_out, expected = gradients(kernel, shape, values, w)     # small: the plain loops
    copy = prefetching_copy(kernel, monkeypatch)
    for deterministic in (False, True):
        out, got = gradients(copy, shape, values, w, deterministic=deterministic)
        np.testing.assert_array_equal(out, expected_out)
        for a, b in zip(got, expected):
            np.testing.assert_array_equal(a, b)
