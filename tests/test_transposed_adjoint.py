"""The two-pass gather form of stencil adjoints (compiler/passes/transpose.py), and the spellings
that reach it: helper functions, loops over neighbours and over coefficient tables.

A pointwise pass stores each thread's partials once; the transposed pass gathers them at p - c. It
must give the one-pass gather form's bits exactly (same operations, same order), agree with the
scatter adjoint to rounding and with float64 finite differences, give the same bits on any thread
count, and keep checkpointed gradients equal to store-all ones.
"""
import re

import numpy as np
import pytest

import compiler as sp
import stepper
from compiler import ir
from compiler.errors import CompileError
from compiler.passes.verify import verify
from gather_forms import (assert_one_pass_bits, corpus, exact_copy, gradients, inputs, no_halo_copy, one_pass_copy,
                          stencil_spellings, with_faces, without)

F1 = sp.array(dtype=sp.float64)
F2 = sp.array(dtype=sp.float64, ndim=2)
W4 = (-5.0 / 2.0, 4.0 / 3.0, -1.0 / 12.0)


@sp.kernel
def fwi_periodic(up: F2, u: F2, m: F2, damp: F2, u_next: F2):
    """4th order, wrapping around both axes."""
    i, j = sp.tid()
    n, k = u.shape[0], u.shape[1]
    x = u[i, j]
    lap = 2.0 * W4[0] * x
    for r in range(1, 3):
        lap += W4[r] * (u[(i + r) % n, j] + u[(i - r + n) % n, j] + u[i, (j + r) % k] + u[i, (j - r + k) % k])
    d = damp[i, j]
    u_next[i, j] = (2.0 * x - (1.0 - d) * up[i, j] + m[i, j] * lap) / (1.0 + d)


@sp.kernel
def fwi_clamped(up: F2, u: F2, m: F2, damp: F2, u_next: F2):
    """4th order, indices clamped to the edges (the edge threads gather what clamped threads put there)."""
    i, j = sp.tid()
    n, k = u.shape[0], u.shape[1]
    x = u[i, j]
    lap = 2.0 * W4[0] * x
    for r in range(1, 3):
        lap += W4[r] * (u[sp.min(i + r, n - 1), j] + u[sp.max(i - r, 0), j] + u[i, sp.min(j + r, k - 1)]
                        + u[i, sp.max(j - r, 0)])
    d = damp[i, j]
    u_next[i, j] = (2.0 * x - (1.0 - d) * up[i, j] + m[i, j] * lap * lap) / (1.0 + d)


def forward64(kernel, shape, values):
    out = sp.zeros(shape, dtype=sp.float64)
    sp.launch(kernel, shape, inputs=[sp.array(v) for v in values], outputs=[out])
    return out.numpy()


# ---- which kernels take the two-pass form ----------------------------------------------------------
@pytest.mark.parametrize("ndim", [2, 3])
@pytest.mark.parametrize("order", [2, 4, 8])
def test_every_spelling_has_a_gather_form_over_all_its_arrays_and_no_loop_tape(order, ndim):
    for name, kernel in corpus(order, ndim).items():
        compiled = kernel.compiled()
        assert not compiled.needs_tape, name
        gather = compiled.gather
        table = name == "fwi_array"      # its weights, read at constant indices: their gradient scatters
        assert gather is not None and bool(gather.scatters) == table, name
        assert set(gather.arrays) == {p.name for p in compiled.forward.params[:-1]} - ({"w"} if table else set()), name
        # the wave's partials reach its neighbours as the incoming gradient times constants under
        # the neighbour's guard: in 3-D stored with a zero where the guard fails (the interior runs
        # unguarded), in 2-D loaded again; Devito's update divides by a local denominator first
        assert (gather.pointwise is not None) == (name.startswith("fwi") or ndim == 3), name
        if gather.pointwise is not None:
            verify(gather.pointwise, single_definition=False)
            assert any(isinstance(s, ir.ScratchStore) for s in ir.walk(gather.pointwise.body))
            assert any(isinstance(s, ir.ScratchLoad) for s in ir.walk(gather.interior.function.body))


def test_the_interior_keeps_only_the_launch_margin_and_selects_the_neighbours_guards():
    """A neighbour's boundary guard, tested at p - c, would narrow the interior by the stencil's
    radius once more (8 of 64 points per side in 3-D at 8th order); it is a select there instead
    (in the one-pass form, whose copies read the incoming gradient at p - c)."""
    gather = one_pass_copy(corpus(8, 3)["table"]).compiled().gather
    for axis in range(3):
        assert max(b.const for b in gather.interior.lower[axis]) == 4
    body = list(ir.walk(gather.interior.function.body))
    assert not any(isinstance(s, ir.If) for s in body)
    assert any(isinstance(s, ir.Op) and s.op == "where" for s in body)


@sp.kernel
def divided_by_m(u: F1, m: F1, out: F1):
    """A root computed by dividing by a field that is zero where the guard fails."""
    i = sp.tid()
    n = u.shape[0]
    v = sp.float64(0.0)
    if i >= 1 and i < n - 1:
        v = (u[i - 1] - 2.0 * u[i] + u[i + 1]) / m[i]
    out[i] = v


@sp.kernel
def divided_and_shifted(u: F1, s: F1, m: F1, out: F1):
    """divided_by_m plus s[i - 1]: that neighbour's branch also adds the incoming gradient itself
    (read again at p - c, not zero where the guard fails: a 1-D launch's loaded values are not
    roots), so it keeps its guard."""
    i = sp.tid()
    n = u.shape[0]
    v = sp.float64(0.0)
    if i >= 1 and i < n - 1:
        v = (u[i - 1] - 2.0 * u[i] + u[i + 1]) / m[i] + s[i - 1]
    out[i] = v


@pytest.mark.parametrize("kernel", [corpus(8, 3)["fwi"], corpus(4, 2)["fwi_array"], divided_by_m,
                                    corpus(8, 3)["table"]])
def test_the_interior_runs_the_neighbours_guarded_branches_unconditionally(kernel):
    """What a neighbour's guarded branch adds in the transposed pass is a root times free factors
    (constant weights, a coefficient table's entries, scalar arguments); the pointwise pass stores a
    zero root first, so where the branch is not taken that is +-0 (transpose.unguarded). The
    interior runs it unconditionally: no selects left, so no settled variant or bands (a halo form's
    keeps the selects of the thread's own guard, at its own point: it runs at every thread)."""
    gather = kernel.compiled().gather
    body = list(ir.walk(gather.interior.function.body))
    assert any(isinstance(s, ir.ScratchLoad) for s in body)
    assert not any(isinstance(s, ir.If) for s in body)
    assert gather.halo or not any(isinstance(s, ir.Op) and s.op == "where" for s in body)
    assert gather.settled is None and gather.bands is None
    zeros = [s for s in gather.pointwise.body if isinstance(s, ir.ScratchStore)]
    assert zeros and isinstance(zeros[0].value, ir.Const) and zeros[0].value.value == 0


@pytest.mark.parametrize("kernel, guarded", [(divided_by_m, False), (divided_and_shifted, True)])
def test_a_zero_root_stands_where_the_guard_fails(kernel, guarded, device):
    """m is zero where the forward's guard fails, so a root computed there would be infinite (and
    what is left in scratch there anything): the pointwise pass stores zero roots there. A branch
    that also adds what is not a root keeps its guard. Finite gradients, the one-pass form's values."""
    n = 17
    rng = np.random.default_rng(3)
    m = 1.0 + rng.random(n)
    m[[0, -1]] = 0.0
    values = [rng.standard_normal(n), m] if kernel is divided_by_m else [rng.standard_normal(n), rng.random(n), m]
    gather = kernel.compiled().gather
    assert gather.pointwise is not None and gather.pointwise_interior is not None
    assert any(isinstance(s, ir.Op) and s.op == "where" for s in ir.walk(gather.interior.function.body)) == guarded
    w = rng.standard_normal(n)
    # a wider launch first leaves roots in the scratch memory (kept between launches) where this
    # launch's guard fails
    gradients(kernel, (2 * n,), [np.tile(v, 2) + 1.0 for v in values], np.tile(w, 2), device)
    _, grads = gradients(kernel, (n,), values, w, device)
    _, expected = gradients(one_pass_copy(kernel), (n,), values, w, device)
    for a, b in zip(grads, expected):
        assert np.isfinite(a).all()
        np.testing.assert_array_equal(a, b)


def test_what_only_the_pointwise_pass_reads_counts_as_read_by_the_adjoint():
    """A recording kept for later keeps the arrays its reversal reads (stepper/execute/fast/native_reverse.py)."""
    compiled = corpus(8, 2)["fwi"].compiled()
    pointwise_reads = {s.array.param.name for s in ir.walk(compiled.gather.pointwise.body) if isinstance(s, ir.Load)}
    assert pointwise_reads == {"up", "u", "m", "damp"}
    assert pointwise_reads <= compiled.adjoint_loads


def test_the_transposed_pass_reads_partials_instead_of_recomputing_them():
    """8th order in 2-D: 17 offsets. The one-pass form divides by the denominator once per offset;
    the transposed pass only in its zero-offset pass (at the thread itself)."""
    kernel = corpus(8, 2)["fwi"]
    gather = kernel.compiled().gather
    one_pass = one_pass_copy(kernel).compiled().gather

    def divisions(fn):
        return sum(isinstance(s, ir.Op) and s.op == "div" for s in ir.walk(fn.body))
    assert divisions(gather.interior.function) == 1
    assert divisions(one_pass.interior.function) >= 17
    assert 0 < divisions(gather.pointwise) <= 3


# ---- the same bits as the one-pass form, the scatter to rounding, finite differences -------------
@pytest.mark.parametrize("kernel, shape", [
    (corpus(8, 2)["fwi"], (23, 19)), (corpus(4, 3)["fwi"], (9, 11, 8)), (corpus(2, 3)["fwi"], (4, 5, 6)),
    (fwi_periodic, (13, 9)), (fwi_clamped, (11, 14)), (fwi_clamped, (2, 3)), (fwi_periodic, (1, 4)),
    (corpus(8, 3)["table"], (13, 11, 14)), (corpus(2, 3)["neighbours"], (7, 9, 8))])
def test_two_pass_gives_the_one_pass_bits(kernel, shape, device):
    """(The halo form's within rounding of them where it reassociates: gather_forms.assert_one_pass_bits.)"""
    assert kernel.compiled().gather.pointwise is not None
    values, w = inputs(kernel, shape, seed=sum(shape))
    assert_one_pass_bits(kernel, shape, values, w, device)


@pytest.mark.parametrize("kernel, shape", [(corpus(8, 2)["fwi"], (20, 21)), (fwi_clamped, (9, 7)),
                                           (fwi_periodic, (8, 10))])
def test_two_pass_agrees_with_the_scatter_adjoint(kernel, shape, monkeypatch, device):
    values, w = inputs(kernel, shape, seed=3)
    _, gathered = gradients(kernel, shape, values, w, device)
    monkeypatch.setattr(kernel.compiled(), "gather", None)
    _, scattered = gradients(kernel, shape, values, w, device, deterministic=True)
    for a, b in zip(gathered, scattered):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("kernel, shape", [(corpus(8, 2)["fwi"], (18, 17)), (corpus(4, 3)["fwi"], (9, 8, 10)),
                                           (fwi_clamped, (10, 9)), (fwi_periodic, (7, 12))])
def test_two_pass_gradients_match_float64_finite_differences(kernel, shape, device):
    values, w = inputs(kernel, shape, seed=7)
    _, grads = gradients(kernel, shape, values, w, device)
    rng = np.random.default_rng(11)
    for k, g in enumerate(grads):
        direction = rng.standard_normal(shape)
        eps = 1e-6
        plus = [v + eps * direction if j == k else v for j, v in enumerate(values)]
        minus = [v - eps * direction if j == k else v for j, v in enumerate(values)]
        fd = (np.sum(w * forward64(kernel, shape, plus)) - np.sum(w * forward64(kernel, shape, minus))) / (2 * eps)
        assert abs(np.sum(g * direction) - fd) <= 1e-7 * max(1.0, abs(fd)), k


def test_two_pass_float32_gives_the_one_pass_bits(device):
    kernel = corpus(4, 2, sp.float32)["fwi"]
    shape = (16, 13)
    values, w = inputs(kernel, shape, seed=5)
    assert_one_pass_bits(kernel, shape, values, w, device, dtype=sp.float32)


@pytest.mark.parametrize("kernel, shape", [(corpus(8, 2)["fwi"], (21, 26)), (corpus(4, 3)["table"], (9, 8, 13)),
                                           (fwi_clamped, (12, 15)), (fwi_periodic, (11, 14))])
def test_rows_near_a_face_give_the_clamped_copys_bits(kernel, shape, device):
    kernel = with_faces(kernel)
    assert kernel.compiled().gather.row is not None
    values, w = inputs(kernel, shape, seed=13)
    _, rows = gradients(kernel, shape, values, w, device)
    _, clamped = gradients(without(kernel, row=None), shape, values, w, device)
    for a, b in zip(rows, clamped):
        np.testing.assert_array_equal(a, b)


# ---- spellings: helper, neighbour loop, coefficient table --------------------------------------
@pytest.mark.parametrize("order, ndim, shape", [(4, 2, (14, 12)), (8, 2, (13, 17)), (2, 3, (6, 5, 7))])
def test_every_spelling_computes_the_unrolled_step_and_its_gradient(order, ndim, shape, device):
    spellings = corpus(order, ndim)
    values, w = inputs(spellings["unrolled"], shape, seed=order)
    reference_out, reference = gradients(spellings["unrolled"], shape, values, w, device)
    for name in ("helper", "table", "neighbours"):
        out, grads = gradients(spellings[name], shape, values, w, device)
        np.testing.assert_allclose(out, reference_out, rtol=1e-13, atol=1e-13, err_msg=name)
        for a, b in zip(grads, reference):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13, err_msg=name)


F1_TABLE = (0.5, 0.25, 0.125)


@sp.kernel
def table_by_dynamic_index(x: F1, n: int, out: F1):
    i = sp.tid()
    for k in range(n):
        out[i] += F1_TABLE[k] * x[i]


def test_a_table_indexed_by_a_runtime_value_is_refused_with_the_fix():
    with pytest.raises(CompileError) as e:
        table_by_dynamic_index.compiled()
    message = str(e.value)
    assert "F1_TABLE" in message and "constant" in message and "array argument" in message
    assert "out[i] += F1_TABLE[k] * x[i]" in message


@sp.kernel
def loop_with_break(x: F1, out: F1):
    i = sp.tid()
    total = sp.float64(0.0)
    for k in range(4):
        if x[i] * sp.float64(k) > 2.0:
            break
        total += x[i]
    out[i] = total


def test_a_constant_loop_that_breaks_stays_a_loop_and_stays_exact(device):
    assert any(isinstance(s, ir.Loop) for s in ir.walk(loop_with_break.compiled().forward.body))
    x = sp.array(np.array([0.5, 1.0, 3.0]), requires_grad=True, device=device)
    out = sp.zeros(3, dtype=sp.float64, requires_grad=True, device=device)
    tape = sp.Tape()
    with tape:
        sp.launch(loop_with_break, 3, inputs=[x], outputs=[out])
    tape.backward(grads={out: np.ones(3)})
    np.testing.assert_array_equal(out.numpy(), [2.0, 3.0, 3.0])       # 4, 3 and 1 trips
    np.testing.assert_array_equal(x.grad.numpy(), [4.0, 3.0, 1.0])


# ---- checkpointed == store-all -----------------------------------------------------------------
def test_checkpointed_gradient_of_a_two_pass_step_equals_store_all_bit_for_bit():
    kernel = corpus(4, 2)["fwi"]
    n, steps = 24, 12
    rng = np.random.default_rng(2)

    def model():
        mod = stepper.Model()
        mod.state("up", (n, n), stepper.float64)
        mod.state("u", (n, n), stepper.float64)
        mod.param("m", stepper.array(0.1 + 0.01 * rng.random((n, n))))
        mod.param("damp", stepper.array(0.02 * rng.random((n, n))))

        @mod.step
        def step(s):
            stepper.launch(kernel, (n, n), inputs=[s.prev.up, s.prev.u, s.params.m, s.params.damp],
                           outputs=[s.next.u])
            stepper.copy(s.next.up, s.prev.u)
        return mod

    x = np.linspace(-1, 1, n)
    u0 = np.exp(-10 * (x[:, None] ** 2 + x[None, :] ** 2))

    def loss(state):
        out = stepper.zeros(1, dtype=stepper.float64, requires_grad=True)
        stepper.launch(half_sum_sq, state.u.shape, inputs=[state.u], outputs=[out])
        return out

    results = []
    for schedule in (stepper.StoreAll(steps), stepper.Revolve(steps, 3)):
        rng = np.random.default_rng(2)
        mod = model()
        results.append(mod.gradient({"up": stepper.array(u0), "u": stepper.array(u0)}, steps, loss=loss,
                                    schedule=schedule))
    for name in ("u", "up", "m", "damp"):
        np.testing.assert_array_equal(results[0].grads[name].numpy(), results[1].grads[name].numpy())
    assert np.abs(results[0].grads["m"].numpy()).max() > 0


@sp.kernel
def half_sum_sq(u: F2, out: F1):
    i, j = sp.tid()
    sp.atomic_add(out, 0, 0.5 * u[i, j] * u[i, j])


@sp.kernel
def fwi_table(up: F2, u: F2, m: F2, damp: F2, coeffs: F1, u_next: F2):
    """4th order with its weights in an array (read at constant indices: its gradient scatters)."""
    i, j = sp.tid()
    n, k = u.shape[0], u.shape[1]
    value = sp.float64(0.0)
    if i >= 2 and j >= 2 and i < n - 2 and j < k - 2:
        x = u[i, j]
        lap = 2.0 * coeffs[0] * x
        for r in range(1, 3):
            lap += coeffs[r] * (u[i + r, j] + u[i - r, j] + u[i, j + r] + u[i, j - r])
        d = damp[i, j]
        value = (2.0 * x - (1.0 - d) * up[i, j] + m[i, j] * lap) / (1.0 + d)
    u_next[i, j] = value


@pytest.mark.parametrize("table_grad", [False, True], ids=["constant-table", "table-with-gradient"])
def test_a_coefficient_table_passed_as_an_array_keeps_the_two_pass_form(table_grad, device):
    """The table's gradient scatters; it runs in the pointwise pass, once per thread, in thread
    order: the one-pass form's bits for every gradient, the table's included, serial or not."""
    gather = fwi_table.compiled().gather
    assert gather.pointwise is not None and gather.scatters
    shape = (70, 61)        # over one chunk of logged adds (ADD_CHUNK in prelude.h): their order shows
    rng = np.random.default_rng(5)
    fields = [rng.standard_normal(shape), rng.standard_normal(shape), 0.1 * rng.standard_normal(shape),
              0.05 * rng.standard_normal(shape)]
    table, w = np.array(W4), rng.standard_normal(shape)

    def run(kernel, deterministic):
        arrays = [sp.array(v, requires_grad=True, device=device) for v in fields]
        coeffs = sp.array(table, requires_grad=table_grad, device=device)
        out = sp.zeros(shape, dtype=sp.float64, requires_grad=True, device=device)
        tape = sp.Tape(deterministic=deterministic)
        with tape:
            sp.launch(kernel, shape, inputs=[*arrays, coeffs], outputs=[out])
        tape.backward(grads={out: w})
        return [a.grad.numpy() for a in arrays] + ([coeffs.grad.numpy()] if table_grad else [])

    one = run(one_pass_copy(fwi_table), True)
    for a, b in zip(run(exact_copy(fwi_table), True), one):
        np.testing.assert_array_equal(a, b)
    serial = run(fwi_table, True)                 # (its roots of one weight summed first: within rounding)
    for deterministic in (True, False):
        two = run(fwi_table, deterministic)
        for a, b, c in zip(two, serial, one):
            np.testing.assert_allclose(a, c, rtol=1e-12, atol=1e-14)
            if deterministic or a.size > len(W4):       # atomics into the table: order-dependent
                np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("order, ndim, shape", [(8, 2, (23, 19)), (4, 3, (9, 11, 8)), (2, 2, (3, 4))])
def test_weights_passed_as_an_array_reach_the_branch_free_form_and_the_tuple_spellings_gradients(
        order, ndim, shape, device):
    """Devito's spelling: the weights in an array, read at constant indices under the guard. The
    variants read them unguarded (no branch is left in the interior or the row variant: both
    vectorise), in boxes that are empty unless the table holds every index read; a product with
    w[r] keeps its other operand's root, so the radii share one root as the tuple's constants do,
    and the gradients are the tuple spelling's (the same operations on the same values)."""
    kernel, tuple_kernel = corpus(order, ndim)["fwi_array"], corpus(order, ndim)["fwi"]
    gather = kernel.compiled().gather
    assert gather.row is not None or gather.halo        # (a halo form's interior is every thread)
    variants = [v for v in (gather.interior, gather.row) if v is not None]
    for fn in (v.function for v in variants):
        assert not any(isinstance(s, ir.If) for s in ir.walk(fn.body)), fn.name
        assert not any(isinstance(s, ir.Load) and s.or_zero for s in ir.walk(fn.body)), fn.name
    for variant in variants:
        assert any(("dim", "w", 0) in [t for _, t in b.terms] for bounds in variant.upper for b in bounds)
    assert len({s.offset for s in ir.walk(gather.pointwise.body) if isinstance(s, ir.ScratchStore)}) == 1
    values, w = inputs(tuple_kernel, shape, seed=order)
    weights = sp.array(np.array(stencil_spellings.WEIGHTS[order]), device=device)
    out, grads = gradients(kernel, shape, values, w, device, extra=[weights])
    expected_out, expected = gradients(tuple_kernel, shape, values, w, device)
    np.testing.assert_allclose(out, expected_out, rtol=1e-13, atol=1e-14)
    for a, b in zip(grads, expected):
        np.testing.assert_array_equal(a, b)


def test_only_loops_whose_threads_write_their_own_elements_vectorise_without_alias_tests():
    """SP_INDEPENDENT (prelude.h) tells the C++ compiler that no iteration writes what another
    touches. A gather form's passes qualify; a pass that adds into a coefficient table's gradient,
    which every thread shares, must not carry it (a vectorised sum would lose adds), unless the
    launch has no such gradient (a grads variant without it)."""
    from compiler.codegen.targets import CPU, render_cpu, render_grads_variant
    functions = fwi_table.compiled().functions()
    generic = render_cpu([functions], False).source
    pointwise_loop, transposed_loop = "fwi_table_pointwise_interior_thread<", "fwi_table_gather_interior_thread<"
    hinted = [line for line in generic.splitlines() if "SP_INDEPENDENT for" in line]
    assert any(transposed_loop in line for line in hinted)
    assert not any(pointwise_loop in line for line in hinted)       # every gradient present: the table's too
    params = [p.name for p in fwi_table.compiled().forward.params]
    without_table = sum(1 << k for k, name in enumerate(params) if name != "coeffs")
    variant = render_grads_variant(functions, without_table, CPU).source
    assert any(pointwise_loop in line for line in variant.splitlines() if "SP_INDEPENDENT for" in line)


def test_a_rows_ends_and_bands_run_in_vectors_of_eight_from_a_stencil_radius_of_four():
    """SP_SHORT_RUN (prelude.h) vectorises a loop eight lanes wide, so that the four threads at an
    8th-order stencil's row ends run in one vector; it asserts what SP_INDEPENDENT does, so it
    stands only where that would. Shorter runs (4th order: two threads) keep SP_INDEPENDENT."""
    from compiler.codegen.targets import render_cpu

    def short_runs(kernel):
        source = render_cpu([kernel.compiled().functions()], False).source
        return re.findall(r"SP_SHORT_RUN for \([^)]*\) (\w+)<", source), source

    eighth, _ = short_runs(with_faces(corpus(8, 3)["fwi"]))
    assert {name.split("_", 1)[1] for name in eighth} >= {"fwi_gather_row_end_first2_thread", "fwi_pointwise_first2_thread"}
    bands, _ = short_runs(one_pass_copy(corpus(8, 3)["unrolled"]))   # (unguarded interiors have no bands)
    assert "unrolled_gather_interior_band_first_thread" in {name.split("_", 1)[1] for name in bands}
    assert not any(name.endswith(("_interior_thread", "_settled_thread")) for name in eighth)   # middles: widest
    fourth, source = short_runs(corpus(4, 3)["fwi"])
    assert not fourth and "SP_INDEPENDENT for" in source


def test_a_constant_coefficient_table_leaves_a_deterministic_adjoint_parallel():
    """The table's adds are compiled out when it has no gradient: nothing is left to log, so a
    deterministic launch runs the vectorised passes (before: the logged path, per element, in
    chunks: 68% of Devito's FWI store-all gradient at 8th order)."""
    from compiler.runtime import launch as launch_module
    shape = (20, 17)
    values, _ = inputs(fwi_periodic, shape, seed=1)

    def serial_flag(table_grad):
        args = [sp.array(v, requires_grad=True) for v in values]
        args += [sp.array(np.array(W4), requires_grad=table_grad), sp.zeros(shape, dtype=sp.float64, requires_grad=True)]
        return launch_module.packed_adjoint(fwi_table, shape, args, True, {})[2]

    assert serial_flag(False) == 0
    assert serial_flag(True) == 2       # the table's gradient: logged adds, in fixed chunks


G2 = sp.array(dtype=sp.float32, ndim=2)


@sp.kernel
def two_roots(u: F2, v: G2, m: F2, damp: F2, out: F2):
    """Two scratch arrays of different element sizes (the roots of u's float64 stencil and of v's
    float32 one), without a halo."""
    i, j = sp.tid()
    n, k = u.shape[0], u.shape[1]
    value = sp.float64(0.0)
    if i >= 2 and j >= 1 and i < n - 2 and j < k - 1:
        d = damp[i, j]
        lap = u[i + 2, j] + u[i - 2, j] + u[i, j + 1] + u[i, j - 1] - 4.0 * u[i, j]
        dv = v[i + 1, j] - v[i - 1, j]
        value = (m[i, j] * lap + sp.float64(dv * dv * dv)) / (1.0 + d)
    out[i, j] = value


@sp.kernel
def two_laplacians(u: F2, v: G2, m: F2, damp: F2, out: F2):
    """Two scratch arrays in the halo form, its halo two rows deep along the first axis."""
    i, j = sp.tid()
    n, k = u.shape[0], u.shape[1]
    value = sp.float64(0.0)
    if i >= 2 and j >= 1 and i < n - 2 and j < k - 1:
        d = damp[i, j]
        lap = u[i + 2, j] + u[i - 2, j] + u[i, j + 1] + u[i, j - 1] - 4.0 * u[i, j]
        lv = v[i + 1, j] + v[i - 1, j] - sp.float32(2.0) * v[i, j]
        value = (m[i, j] * lap + sp.float64(lv) * d) / (1.0 + d)
    out[i, j] = value


@pytest.mark.parametrize("kernel, shape, reach, arrays", [
    (corpus(8, 2)["fwi"], (60, 70), 4, 1), (corpus(4, 3)["fwi"], (20, 17, 16), 2, 1),
    (corpus(8, 3)["table"], (19, 11, 14), 4, 1), (corpus(8, 3, sp.float32)["fwi"], (21, 12, 13), 4, 1),
    (corpus(2, 3)["neighbours"], (9, 7, 8), 1, 1), (no_halo_copy(corpus(4, 2)["fwi"]), (23, 30), 2, 1),
    (two_roots, (31, 17), 2, 2), (two_laplacians, (29, 19), 2, 2)])
def test_passes_by_windows_of_rows_give_the_bits_of_the_passes_in_turn(kernel, shape, reach, arrays, monkeypatch):
    """A two-pass form's passes run by blocks of rows of the first axis, the transposed pass a
    stencil radius behind the pointwise one, the scratch arrays a ring of rows (codegen/scratch.py;
    here a row a block, so the ring turns every few blocks): the bits of the passes in turn over
    whole arrays, on one thread and on several; halo and no-halo forms, several scratch arrays of
    different element sizes."""
    from compiler.codegen import scratch
    from compiler.codegen.targets import render_cpu
    monkeypatch.setattr(scratch, "BLOCK_BYTES", 1)
    monkeypatch.setattr(scratch, "WINDOW_FROM_BYTES", 0)
    windowed, in_turn = without(kernel), without(kernel, reach=None)
    gather = windowed.compiled().gather
    assert gather.pointwise is not None and gather.reach == reach and len(gather.scratch_arrays) == arrays
    assert "done_" in render_cpu([windowed.compiled().functions()], False).source
    assert "done_" not in render_cpu([in_turn.compiled().functions()], False).source
    values, w = inputs(kernel, shape, seed=6)
    _, expected = gradients(in_turn, shape, values, w)
    for deterministic in (False, True):
        _, got = gradients(windowed, shape, values, w, deterministic=deterministic)
        for a, b in zip(got, expected):
            np.testing.assert_array_equal(a, b)


def test_a_periodic_first_axis_keeps_the_passes_in_turn():
    """Thread 0's transposed pass gathers the last row's roots: no block may run before them."""
    assert fwi_periodic.compiled().gather.reach is None
