"""The halo form of a two-pass stencil adjoint (GatherAdjoint.halo in compiler/passes/gather.py).

Its scratch arrays reach a stencil radius beyond the launch, where they hold zeros: the roots of
threads that do not exist. The transposed pass then reads thread p - c's roots without a test and
runs the same code at every thread, faces and all. It must give the one-pass form's bits on any
grid (smaller than its halo too) and any thread count, and must not read what an earlier launch
left in scratch memory.
"""
import numpy as np
import pytest

import compiler as sp
from compiler import ir
from compiler.passes.interior import at_own_index, tid_offsets
from gather_forms import assert_one_pass_bits, corpus, exact_copy, gradients, inputs, one_pass_copy, stencil_spellings

F1 = sp.array(dtype=sp.float64)


@sp.kernel
def clamped_1d(u: F1, m: F1, out: F1):
    """A clamped index: the edge thread gathers what the clamped threads put there, so no halo."""
    i = sp.tid()
    n = u.shape[0]
    out[i] = (u[sp.max(i - 1, 0)] - 2.0 * u[i] + u[sp.min(i + 1, n - 1)]) / m[i]


@pytest.mark.parametrize("order", [2, 4, 8])
def test_the_3d_spellings_and_the_fwi_stencils_take_the_halo_form(order):
    """Every 3-D spelling and the FWI stencils in 2-D and 3-D: a halo of the stencil's radius, and
    two variants that cover every thread, neither of which loads away from its own point (what it
    needs from thread p - c comes from scratch): the middle rows, whose own tests along the outer
    axes are settled (bounds there, whole along a row: its tests along the row stay selects), and
    the rows outside, whole rows too."""
    kernels = [*corpus(order, 3).values(), corpus(order, 2)["fwi"], corpus(order, 2)["fwi_array"]]
    for kernel in kernels:
        gather = kernel.compiled().gather
        ndim = gather.function.tid_ndim
        inner = ndim - 1
        assert gather.halo == (order // 2,) * ndim, kernel.__name__
        assert all(gather.interior.lower[:inner]) and gather.interior.lower[inner] == (), kernel.__name__
        assert gather.interior.upper[inner] == gather.row.upper[inner]          # (a table's bounds alone)
        assert gather.row.lower == ((),) * ndim and gather.row.upper[:inner] == ((),) * inner
        assert gather.row_end is gather.settled is gather.corner is None
        for fn in (gather.interior.function, gather.row.function):
            offsets = tid_offsets(fn.body, ndim)
            for s in ir.walk(fn.body):
                assert not isinstance(s, ir.If)
                if isinstance(s, (ir.Load, ir.ReadGrad)) and s.array.type.ndim == ndim:
                    assert at_own_index(s.indices, offsets, ndim), (kernel.__name__, s)
        tests = [sum(isinstance(s, ir.Op) and s.op in ("lt", "le", "gt", "ge") for s in ir.walk(fn.body))
                 for fn in (gather.interior.function, gather.row.function)]
        assert 0 < tests[0] < tests[1], kernel.__name__             # (a row's own tests, not the others)


def test_clamped_and_one_pass_forms_keep_their_scratch_the_launchs_size():
    assert clamped_1d.compiled().gather.halo == ()
    assert corpus(4, 2)["table"].compiled().gather.halo == ()       # (2-D waves: one pass)


@pytest.mark.parametrize("kernel, shape", [
    (corpus(8, 3)["table"], (3, 2, 5)), (corpus(8, 3)["fwi"], (9, 4, 11)), (corpus(4, 3)["neighbours"], (1, 6, 3)),
    (corpus(8, 2)["fwi"], (2, 3)), (corpus(8, 2)["fwi"], (17, 5)), (corpus(2, 3)["helper"], (12, 10, 9))])
def test_the_halo_form_gives_the_one_pass_bits_on_any_grid_and_thread_count(kernel, shape, device):
    """Without reassociation its bits; with it (the default), within rounding of them and the same
    bits on any thread count."""
    assert kernel.compiled().gather.halo
    values, w = inputs(kernel, shape, seed=sum(shape))
    assert_one_pass_bits(kernel, shape, values, w, device)


@pytest.mark.parametrize("earlier", ["fwi", "table"])
def test_the_halo_holds_zeros_whatever_an_earlier_launch_left_in_scratch(earlier, device):
    """A launch over other extents leaves nonzero roots in scratch memory where a later launch's
    halo lies (86 of the elements the later one reads there), which must read zeros there, launch
    after launch."""
    kernel, other = corpus(8, 3)["fwi"], corpus(8, 3)[earlier]
    assert other.compiled().gather.halo
    larger, small = (15, 15, 12), (12, 9, 10)
    values, w = inputs(kernel, small, seed=2)
    _, one = gradients(one_pass_copy(kernel), small, values, w, device)
    eps = np.finfo(np.float64).eps
    gradients(other, larger, *inputs(other, larger, seed=1), device)
    _, first = gradients(kernel, small, values, w, device)
    _, again = gradients(kernel, small, values, w, device)
    for a, b, c in zip(first, again, one):                        # (the one-pass form's within rounding)
        np.testing.assert_allclose(a, c, rtol=64 * eps, atol=64 * eps * np.abs(c).max())
        np.testing.assert_array_equal(b, a)


def test_a_table_shorter_than_the_halo_forms_reads_runs_its_fallback_function(device):
    """Weights passed as an array are read unguarded in the halo form's pass, in a box that is
    empty unless the table holds every index read. A short table is legal where no thread takes
    the guard that reads it (a grid narrower than the stencil): every thread then runs the form's
    fallback function, the same pass with its table reads zero beyond the table; the gradients are
    the tuple spelling's."""
    kernel, tuple_kernel = corpus(8, 2)["fwi_array"], corpus(8, 2)["fwi"]
    gather = kernel.compiled().gather
    assert gather.halo
    assert all(any(("dim", "w", 0) in [t for _, t in b.terms] for b in bounds) for bounds in gather.interior.upper)
    shape = (6, 7)
    values, w = inputs(tuple_kernel, shape, seed=4)
    short = sp.array(np.array(stencil_spellings.WEIGHTS[8][:2]), device=device)
    _, grads = gradients(kernel, shape, values, w, device, extra=[short])
    _, expected = gradients(tuple_kernel, shape, values, w, device)
    for a, b in zip(grads, expected):
        np.testing.assert_array_equal(a, b)


def _float_multiplies(fn: ir.Function) -> int:
    return sum(isinstance(s, ir.Op) and s.op == "mul" and np.dtype(getattr(s.out.type, "np_dtype", "i4")).kind == "f"
               for s in ir.walk(fn.body))


@pytest.mark.parametrize("order", [2, 4, 8])
@pytest.mark.parametrize("ndim", [2, 3])
def test_the_transposed_pass_multiplies_by_each_weight_once(order, ndim):
    """The FWI stencil's neighbours at distance k share the weight w[k]: the transposed pass sums
    their roots first and multiplies once (compiler/passes/reassociate.py), where the exact form
    multiplies each of the 2 * ndim roots; what is not a neighbour's term (the thread's own) stays."""
    kernel = corpus(order, ndim)["fwi"]
    exact = exact_copy(kernel).compiled().gather
    gather = kernel.compiled().gather
    for variant, exact_variant in ((gather.interior, exact.interior), (gather.row, exact.row)):
        saved = _float_multiplies(exact_variant.function) - _float_multiplies(variant.function)
        assert saved == (2 * ndim - 1) * (order // 2), variant.function.name


@pytest.mark.parametrize("kernel, shape", [(corpus(8, 3)["fwi"], (20, 18, 22)), (corpus(8, 2)["fwi"], (30, 21))])
def test_the_halo_form_gives_the_cpus_bits_on_cuda(kernel, shape, device):
    """The GPU runs the rows outside the middle through the form's fallback function, the same
    pass as the CPU's row variant (table reads zero beyond the table), not a clamped copy per offset,
    whose sums would round otherwise (it multiplies each root by its weight): the same bits."""
    if device == "cpu":
        pytest.skip("compares the CPU with --device cuda")
    values, w = inputs(kernel, shape, seed=3)
    _, cpu = gradients(kernel, shape, values, w, "cpu")
    _, gpu = gradients(kernel, shape, values, w, device)
    for a, b in zip(cpu, gpu):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("extents, pad, arrays", [((7,), (2,), ((0, 8),)), ((5, 6), (1, 1), ((0, 4),)),
                                                 ((1, 3), (4, 4), ((0, 8), (8, 4))),
                                                 ((2, 1, 4), (4, 4, 4), ((0, 12),)), ((3, 4, 5), (1, 1, 1), ((0, 2),))])
def test_the_gpu_zeroes_the_halo_and_nothing_else(extents, pad, arrays, device):
    """On a GPU a halo form's launch zeroes its scratch arrays beyond the launch with a kernel of a
    block per row (sp_zero_halo; a memset of the whole scratch was one more array pass): every
    element beyond the launch comes out zero and every one of the launch as it was (the pointwise
    pass stores those), on grids narrower than the halo, for several arrays of any element size."""
    if device == "cpu":
        pytest.skip("the GPU's halo kernel (the CPU zeroes the halo in its entry: sp::zero_halo)")
    from types import SimpleNamespace
    from compiler.backends import cuda_launch
    from compiler.runtime.device import get_device
    count = int(np.prod([e + 2 * p for e, p in zip(extents, pad)]))
    per_element = (sum(size for _, size in arrays) + 7) // 8 * 8
    scratch = sp.array(np.full(count * per_element, 0xAB, dtype=np.uint8).view(np.float64), device=device)
    kernel = corpus(8, 2)["fwi"]
    dev = get_device(device)
    loaded = cuda_launch.cuda_module(kernel.module, False, dev)
    form = SimpleNamespace(halo=pad, scratch_arrays=arrays)
    cuda_launch._zero_halo(kernel, loaded, form, extents, count, scratch._data.ptr, dev.ordinal)
    out = scratch.numpy().view(np.uint8)
    inside = np.zeros([e + 2 * p for e, p in zip(extents, pad)], dtype=bool)
    inside[tuple(slice(p, p + e) for e, p in zip(extents, pad))] = True
    for offset, size in arrays:
        values = out[count * offset:count * (offset + size)].reshape(inside.shape + (size,))
        assert (values[inside] == 0xAB).all() and (values[~inside] == 0).all(), (offset, size)
    assert (out[count * sum(size for _, size in arrays):] == 0xAB).all()
