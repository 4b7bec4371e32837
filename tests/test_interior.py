"""Interior variants: boundary tests settled in advance for the middle of a launch, same results.

A kernel's comparisons of a thread index with a bound (constants, array extents, integer scalars)
are decided for the threads inside a box the entry point computes per launch
(compiler/passes/interior.py); the threads outside it run the original body. Each kernel here writes one
bit per comparison, so the expected output is exact integers from numpy, on launches where the box
is empty, a single element or most of the launch, and where the arrays are larger than the launch.
"""
import numpy as np
import pytest

import compiler as sp
from compiler import ir
from compiler.passes.interior import Bound, interior_variant
from compiler.passes.verify import verify

I2 = sp.array(dtype=int, ndim=2)
I1 = sp.array(dtype=int)
I3 = sp.array(dtype=int, ndim=3)


@sp.kernel
def flags2(ref: I2, count: int, out: I2):
    i, j = sp.tid()
    n = ref.shape[0]
    m = ref.shape[1]
    f = 0
    if j > 0:
        f += 1
    if j >= 2:
        f += 2
    if j < m - 1:
        f += 4
    if j <= m - 3:
        f += 8
    if j == 0:
        f += 16
    if j != m - 1:
        f += 32
    if 0 < j - 1:
        f += 64
    if j < count:
        f += 128
    if i > 0:
        f += 256
    if i + 1 < n:
        f += 512
    if j >= m - 2:
        f += 1024
    if j < 3:
        f += 2048
    if j > 0 and i < n - 2:
        f += 4096
    out[i, j] = f


def flags2_reference(launch, ref_shape, count):
    i, j = np.indices(launch)
    n, m = ref_shape
    bits = [j > 0, j >= 2, j < m - 1, j <= m - 3, j == 0, j != m - 1, 0 < j - 1, j < count, i > 0,
            i + 1 < n, j >= m - 2, j < 3, (j > 0) & (i < n - 2)]
    return sum(b.astype(np.int32) << k for k, b in enumerate(bits))


@pytest.mark.parametrize("launch, ref_shape, count", [
    ((1, 1), (1, 1), 1), ((2, 3), (2, 3), 2), ((3, 5), (3, 5), 0), ((37, 64), (37, 64), 40),
    ((64, 129), (64, 129), 500),
    ((5, 30), (8, 40), 7),        # arrays larger than the launch: the bounds are theirs
    ((6, 9), (2, 4), 9),          # smaller: the box ends where their bounds say
])
@pytest.mark.parametrize("deterministic", [False, True])
def test_boundary_tests_in_two_dimensions(launch, ref_shape, count, deterministic, device):
    ref = sp.zeros(ref_shape, dtype=int, device=device)
    out = sp.zeros(launch, dtype=int, device=device)
    sp.launch(flags2, launch, inputs=[ref, count], outputs=[out], deterministic=deterministic)
    np.testing.assert_array_equal(out.numpy(), flags2_reference(launch, ref_shape, count))


@sp.kernel
def flags1(ref: I1, out: I1):
    i = sp.tid()
    f = 0
    if i >= 1:
        f += 1
    if i < ref.shape[0] - 2:
        f += 2
    if i + 2 <= ref.shape[0]:
        f += 4
    out[i] = f


@pytest.mark.parametrize("n", [1, 2, 4, 5000])
def test_boundary_tests_in_one_dimension(n, device):
    ref, out = sp.zeros(n, dtype=int, device=device), sp.zeros(n, dtype=int, device=device)
    sp.launch(flags1, n, inputs=[ref], outputs=[out])
    i = np.arange(n)
    np.testing.assert_array_equal(out.numpy(), (i >= 1) * 1 + (i < n - 2) * 2 + (i + 2 <= n) * 4)


@sp.kernel
def flags3(ref: I3, out: I3):
    i, j, k = sp.tid()
    f = 0
    if i > 0:
        f += 1
    if j < ref.shape[1] - 1:
        f += 2
    if k > 1:
        f += 4
    if k < ref.shape[2] - 1:
        f += 8
    out[i, j, k] = f


@pytest.mark.parametrize("shape", [(1, 1, 1), (3, 4, 5), (9, 17, 33)])
def test_boundary_tests_in_three_dimensions(shape, device):
    ref, out = sp.zeros(shape, dtype=int, device=device), sp.zeros(shape, dtype=int, device=device)
    sp.launch(flags3, shape, inputs=[ref], outputs=[out])
    i, j, k = np.indices(shape)
    expected = (i > 0) * 1 + (j < shape[1] - 1) * 2 + (k > 1) * 4 + (k < shape[2] - 1) * 8
    np.testing.assert_array_equal(out.numpy(), expected)


def test_rows_outside_the_box_run_a_variant_settled_along_the_row():
    """A CPU entry runs the rows whose outer indices lie outside the box through `Interior.row`
    (with_row): flags3 with its tests on k decided, those on i and j kept (the same for a whole
    row), a row at a call. The test above checks what it computes on launches with such rows."""
    from compiler.codegen.targets import render_cpu
    compiled = flags3.compiled()
    row = compiled.interior.row
    verify(row.function)
    compares = [s for s in ir.walk(row.function.body) if isinstance(s, ir.Op) and s.op in ("gt", "lt")]
    assert len(compares) == 2                     # i > 0 and j < n1 - 1; k > 1 and k < n2 - 1 decided
    assert row.lower[:2] == row.upper[:2] == ((), ()) and row.lower[2] and row.upper[2]
    source = render_cpu([compiled.functions()], False).source
    assert f"{row.function.name}_run(i0, i1, a, b, L, A);" in source


def test_each_comparison_is_decided_with_its_bound():
    interior = interior_variant(flags1.compiled().forward, "flags1_interior")
    verify(interior.function)
    assert not any(isinstance(s, ir.Op) and s.op in ("ge", "lt", "le") for s in ir.walk(interior.function.body))
    dim = (1, ("dim", "ref", 0))
    assert interior.lower == ((Bound(1),),)
    assert interior.upper == ((Bound(-2, (dim,)), Bound(-1, (dim,))),)


@sp.kernel
def untouched(a: I1, b: I1, out: I1):
    i = sp.tid()
    if a[i] > 0:              # a loaded value, not a bound the launch fixes
        out[i] = b[i]
    if i < b[0]:
        out[i] = 1


def test_comparisons_with_loaded_values_are_left_alone(device):
    assert interior_variant(untouched.compiled().forward, "x") is None
    a = sp.array(np.array([1, 0, 1, 0], dtype=np.int32), device=device)
    b = sp.array(np.array([0, 5, 6, 7], dtype=np.int32), device=device)
    out = sp.zeros(4, dtype=int, device=device)
    sp.launch(untouched, 4, inputs=[a, b], outputs=[out])
    np.testing.assert_array_equal(out.numpy(), [0, 0, 6, 0])


@sp.kernel
def periodic_sum(a: I2, n: int, out: I2):
    i, j = sp.tid()
    out[i, j] = a[(i + 1) % n, j] + a[i, (j + n - 1) % n] + a[(i + n + 2) % n, (j + 2 * n) % n]


@pytest.mark.parametrize("n", [1, 2, 5, 70])
def test_periodic_indices_lose_their_modulo_in_the_middle(n, device):
    interior = interior_variant(periodic_sum.compiled().forward, "periodic_interior")
    verify(interior.function)
    assert not any(isinstance(s, ir.Op) and s.op == "mod" for s in ir.walk(interior.function.body))
    a = np.arange(n * n, dtype=np.int32).reshape(n, n)
    out = sp.zeros((n, n), dtype=int, device=device)
    sp.launch(periodic_sum, (n, n), inputs=[sp.array(a, device=device), n], outputs=[out])
    expected = np.roll(a, -1, axis=0) + np.roll(a, 1, axis=1) + np.roll(a, -2, axis=0)
    np.testing.assert_array_equal(out.numpy(), expected)


@sp.kernel
def clamped_sum(a: I2, out: I2):
    i, j = sp.tid()
    n = a.shape[0]
    m = a.shape[1]
    out[i, j] = (a[sp.max(i - 1, 0), j] + a[i, sp.min(j + 2, m - 1)] + a[sp.min(n - 1, i + 1), sp.max(0, j - 2)]
                 + a[i, sp.min(j, 1)])        # a bound near the start caps the index there: left alone


@pytest.mark.parametrize("shape", [(1, 1), (2, 3), (5, 4), (40, 70)])
def test_clamped_indices_lose_their_clamp_in_the_middle(shape, device):
    interior = interior_variant(clamped_sum.compiled().forward, "clamped_interior")
    verify(interior.function)
    ops = [s.op for s in ir.walk(interior.function.body) if isinstance(s, ir.Op)]
    assert ops.count("max") == 0 and ops.count("min") == 1
    assert interior.lower == ((Bound(1),), (Bound(2),))
    assert interior.upper == ((Bound(-1, ((1, ("dim", "a", 0)),)),), (Bound(-2, ((1, ("dim", "a", 1)),)),))
    n, m = shape
    a = np.arange(n * m, dtype=np.int32).reshape(n, m) * 7 % 11
    out = sp.zeros(shape, dtype=int, device=device)
    sp.launch(clamped_sum, shape, inputs=[sp.array(a, device=device)], outputs=[out])
    i, j = np.indices(shape)
    expected = (a[np.maximum(i - 1, 0), j] + a[i, np.minimum(j + 2, m - 1)] + a[np.minimum(n - 1, i + 1), np.maximum(0, j - 2)]
                + a[i, np.minimum(j, 1)])
    np.testing.assert_array_equal(out.numpy(), expected)


@sp.kernel
def global_rows(offset: int, n: int, out: I1):
    i = sp.tid()
    gi = i + offset                # a block of a decomposed axis: its rows' global index
    f = 0
    if gi > 0:
        f += 1
    if gi < n - 1:
        f += 2
    if gi >= 1 and gi <= n - 2:
        f += 4
    out[i] = f


@pytest.mark.parametrize("block, offset, n", [(50, 0, 100), (50, 50, 100), (30, 20, 100), (4, 0, 4)])
def test_a_global_index_guard_leaves_the_middle_of_every_block(block, offset, n, device):
    """`i + offset > 0` bounds the middle from below (a guard holds there), `i + offset < n - 1`
    from above: the box covers every block's rows but the grid's own first and last, on every rank."""
    interior = interior_variant(global_rows.compiled().forward, "global_rows_interior")
    scalar = lambda c, *names: Bound(c, tuple((k, ("scalar", name)) for k, name in names))   # noqa: E731
    assert scalar(1, (-1, "offset")) in interior.lower[0] and scalar(-1, (1, "n"), (-1, "offset")) in interior.upper[0]
    out = sp.zeros(block, dtype=int, device=device)
    sp.launch(global_rows, block, inputs=[offset, n], outputs=[out])
    gi = np.arange(block) + offset
    np.testing.assert_array_equal(out.numpy(), (gi > 0) * 1 + (gi < n - 1) * 2 + ((gi >= 1) & (gi <= n - 2)) * 4)


F3 = sp.array(dtype=float, ndim=3)
F2 = sp.array(dtype=float, ndim=2)


@sp.kernel
def guarded_stencil(u: F3, out: F3):
    i, j, k = sp.tid()
    v = 0.0
    if i >= 2 and j >= 2 and k >= 2 and i < u.shape[0] - 2 and j < u.shape[1] - 2 and k < u.shape[2] - 2:
        v = u[i, j, k - 2] + u[i, j, k + 2] + 2.0 * u[i - 1, j, k] + u[i, j + 1, k]
    out[i, j, k] = v


@pytest.mark.parametrize("array_shape, launch", [((9, 8, 13), (9, 8, 13)), ((9, 8, 13), (7, 6, 10)),
                                                 ((6, 5, 3), (6, 5, 3)), ((5, 7, 4), (5, 7, 4))])
def test_a_forwards_row_ends_run_settled_there(array_shape, launch, device):
    """A forward's threads before its box along a row and after it run the body settled there
    (Interior.row_ends): a stencil that writes 0 outside its guard loads nothing there. The values
    are numpy's, bit for bit, also where the arrays are larger than the launch and where a row is
    shorter than the stencil's margins."""
    interior = guarded_stencil.compiled().interior
    ends = interior.row_ends
    assert ends is not None and all(v is not None for v in ends)
    assert not any(isinstance(s, ir.Load) for v in ends for s in ir.walk(v.function.body))
    # the rows along the outer faces too (Interior.face_rows), each valid for a whole row
    assert len(interior.face_rows) == 2 and all(v is not None for pair in interior.face_rows for v in pair)
    assert not any(isinstance(s, ir.Load) for pair in interior.face_rows for v in pair
                   for s in ir.walk(v.function.body))
    u = np.random.default_rng(3).standard_normal(array_shape).astype(np.float32)
    out = sp.zeros(array_shape, dtype=float, device=device)
    sp.launch(guarded_stencil, launch, inputs=[sp.array(u, device=device)], outputs=[out])
    expected = np.zeros(array_shape, np.float32)
    n0, n1, n2 = array_shape
    c = (slice(2, min(n0 - 2, launch[0])), slice(2, min(n1 - 2, launch[1])), slice(2, min(n2 - 2, launch[2])))
    i, j, k = np.meshgrid(*(np.arange(s.start, max(s.start, s.stop)) for s in c), indexing="ij")
    expected[i, j, k] = u[i, j, k - 2] + u[i, j, k + 2] + np.float32(2.0) * u[i - 1, j, k] + u[i, j + 1, k]
    np.testing.assert_array_equal(out.numpy(), expected)


@sp.kernel
def guarded_stencil_2d(u: F2, out: F2):
    i, j = sp.tid()
    v = -1.0
    if i >= 2 and j >= 1 and i < u.shape[0] - 2 and j < u.shape[1] - 1:
        v = u[i - 2, j] + u[i + 2, j] - u[i, j - 1] * u[i, j + 1]
    out[i, j] = v


@pytest.mark.parametrize("array_shape, launch", [((11, 9), (11, 9)), ((11, 9), (8, 7)), ((3, 5), (3, 5)),
                                                 ((5, 2), (5, 2)), ((1, 4), (1, 4))])
def test_a_forwards_first_and_last_rows_run_settled_in_loops_of_their_own(array_shape, launch, device):
    """A forward's rows before its box along the first axis and after it run the body settled there
    (Interior.face_rows), whole, outside the nest over the other rows: the values are numpy's, bit
    for bit, where the launch is smaller than the arrays and where the first rows' box and the last
    rows' overlap (3 rows, a margin of 2 at each end)."""
    first, last = guarded_stencil_2d.compiled().interior.face_rows[0]
    assert not any(isinstance(s, ir.Load) for v in (first, last) for s in ir.walk(v.function.body))
    u = np.random.default_rng(4).standard_normal(array_shape).astype(np.float32)
    out = sp.zeros(array_shape, dtype=float, device=device)
    sp.launch(guarded_stencil_2d, launch, inputs=[sp.array(u, device=device)], outputs=[out])
    expected = np.zeros(array_shape, np.float32)
    expected[:launch[0], :launch[1]] = -1.0
    n0, n1 = array_shape
    for i in range(2, min(n0 - 2, launch[0])):
        for j in range(1, min(n1 - 1, launch[1])):
            expected[i, j] = u[i - 2, j] + u[i + 2, j] - u[i, j - 1] * u[i, j + 1]
    np.testing.assert_array_equal(out.numpy(), expected)


@sp.kernel
def shift_along_rows(u: F2, out: F2):
    i, j = sp.tid()
    v = u[i, j]
    if j >= 1:
        v = u[i, j - 1]
    out[i, j] = v


def test_a_forward_whose_output_shares_memory_with_an_input_keeps_the_alias_tests():
    """A forward whose threads each write their own elements runs its rows without alias tests
    (writes_own_elements), but only where the arrays it writes share no memory with its other
    arguments: run in place (`out` is `u`), in thread order (a launch below the parallel
    threshold), each thread reads what the one before it wrote, as the plain loop does, not what a
    vector loop read before anything was written."""
    from compiler.passes.interior import writes_own_elements
    assert writes_own_elements(shift_along_rows.compiled().forward)
    values = np.random.default_rng(5).standard_normal((3, 40)).astype(np.float32)
    u = sp.array(values)
    sp.launch(shift_along_rows, (3, 40), inputs=[u], outputs=[u])
    np.testing.assert_array_equal(u.numpy(), np.repeat(values[:, :1], 40, axis=1))
    apart = sp.zeros((3, 40), dtype=float)
    sp.launch(shift_along_rows, (3, 40), inputs=[sp.array(values)], outputs=[apart])
    np.testing.assert_array_equal(apart.numpy()[:, 1:], values[:, :-1])


F2 = sp.array(dtype=sp.float64, ndim=2)
F1 = sp.array(dtype=sp.float64)


@sp.kernel
def weighted_cross(u: F2, w: F1, out: F2):
    i, j = sp.tid()
    v = sp.float64(0.0)
    if i >= 2 and j >= 2 and i < u.shape[0] - 2 and j < u.shape[1] - 2:
        v = w[0] * u[i, j]
        for k in range(1, 3):
            v += w[k] * (u[i - k, j] + u[i + k, j] + u[i, j - k] + u[i, j + k])
    out[i, j] = v


@sp.kernel
def scaled_by_row(u: F2, w: F1, out: F2):
    i, j = sp.tid()
    v = w[0] * u[i, j]
    if j >= 1:
        v += w[i] * u[i, j - 1]                 # w read at the thread's row too: not a table
    out[i, j] = v


def test_a_forwards_coefficient_table_is_read_once_a_row_with_the_same_bits():
    """A 1-D array the forward never writes and whose interior reads it only at constant indices
    (a coefficient table) reaches the interior's loop as values in a local struct, filled once a
    row (codegen/memory.py table_reads): the same bits as the debug build, which reads it through
    its pointer at every thread, and as numpy's sums in the same order."""
    from compiler.codegen.memory import table_reads
    compiled = weighted_cross.compiled()
    assert table_reads((compiled.forward,), (compiled.interior.function,)) == {"w": 3}
    assert table_reads((scaled_by_row.compiled().forward,), (scaled_by_row.compiled().interior.function,)) == {}
    rng = np.random.default_rng(7)
    u = rng.standard_normal((40, 70))
    w = np.array([-2.5, 4.0 / 3.0, -1.0 / 12.0])
    fast, checked = sp.zeros((40, 70), dtype=sp.float64), sp.zeros((40, 70), dtype=sp.float64)
    sp.launch(weighted_cross, (40, 70), inputs=[sp.array(u), sp.array(w)], outputs=[fast])
    sp.launch(weighted_cross, (40, 70), inputs=[sp.array(u), sp.array(w)], outputs=[checked], debug=True)
    np.testing.assert_array_equal(fast.numpy(), checked.numpy())
    expect = np.zeros_like(u)
    expect[2:38, 2:68] = w[0] * u[2:38, 2:68]
    for k in (1, 2):
        expect[2:38, 2:68] += w[k] * (u[2 - k:38 - k, 2:68] + u[2 + k:38 + k, 2:68] + u[2:38, 2 - k:68 - k]
                                      + u[2:38, 2 + k:68 + k])
    np.testing.assert_array_equal(fast.numpy(), expect)


@sp.kernel
def weighted_over(u: F2, m: F2, w: F1, out: F2):
    i, j = sp.tid()
    v = sp.float64(0.0)
    if i >= 2 and j >= 2 and i < u.shape[0] - 2 and j < u.shape[1] - 2:
        lap = w[0] * u[i, j]
        for k in range(1, 3):
            lap += w[k] * (u[i - k, j] + u[i + k, j] + u[i, j - k] + u[i, j + k])
        v = lap / m[i, j]
    out[i, j] = v


@pytest.mark.parametrize("table_grad", [False, True])
def test_a_gather_adjoints_passes_read_the_coefficient_table_once_a_row_with_the_same_bits(table_grad):
    """The adjoint of a stencil over a coefficient table divided by a field (the FWI update's shape:
    a pointwise pass for the field's partials, a transposed pass for the stencil's) reads the table
    in both passes' middles from the row's local struct (codegen/memory.py table_reads), behind a
    test that no gradient buffer shares the table's memory: the same bits as the debug build, which
    reads it through its pointer, with and without the table's own gradient, and float64 analytic
    values."""
    from compiler.codegen.targets import render_cpu
    gather = weighted_over.compiled().gather
    assert gather.pointwise is not None
    source = render_cpu([weighted_over.compiled().functions()], False).source
    for variant in (gather.interior.function.name, gather.pointwise_interior.function.name):
        signature = next(line for line in source.splitlines() if f" {variant}_thread(" in line)
        assert signature.endswith("_tables_t& T) {"), signature
    assert "sp::overlap(A.a_w, 1, G.a_u, 2)" in source
    rng = np.random.default_rng(8)
    shape = (40, 70)
    u, m, g = rng.standard_normal(shape), rng.uniform(1.0, 2.0, shape), rng.standard_normal(shape)
    w = np.array([-2.5, 4.0 / 3.0, -1.0 / 12.0])
    grads = {}
    for debug in (False, True):
        args = [sp.array(u, requires_grad=True), sp.array(m, requires_grad=True), sp.array(w, requires_grad=table_grad)]
        out = sp.zeros(shape, dtype=sp.float64, requires_grad=True)
        tape = sp.Tape()
        with tape:
            sp.launch(weighted_over, shape, inputs=args, outputs=[out], debug=debug)
        tape.backward(grads={out: g})
        grads[debug] = [a.grad.numpy() for a in args if a.requires_grad]
    for fast, checked in zip(grads[False], grads[True]):
        np.testing.assert_array_equal(fast, checked)
    inner = (slice(2, 38), slice(2, 68))
    q = np.zeros(shape)
    q[inner] = g[inner] / m[inner]                 # d out / d lap, at the threads that compute one
    expect_u = w[0] * q
    for k in (1, 2):
        expect_u[k:, :] += w[k] * q[:-k, :]
        expect_u[:-k, :] += w[k] * q[k:, :]
        expect_u[:, k:] += w[k] * q[:, :-k]
        expect_u[:, :-k] += w[k] * q[:, k:]
    lap = np.zeros(shape)
    lap[inner] = w[0] * u[inner]
    for k in (1, 2):
        lap[inner] += w[k] * (u[2 - k:38 - k, 2:68] + u[2 + k:38 + k, 2:68] + u[2:38, 2 - k:68 - k]
                              + u[2:38, 2 + k:68 + k])
    expect_m = np.zeros(shape)
    expect_m[inner] = -g[inner] * lap[inner] / m[inner] ** 2
    np.testing.assert_allclose(grads[False][0], expect_u, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(grads[False][1], expect_m, rtol=1e-12, atol=1e-12)
