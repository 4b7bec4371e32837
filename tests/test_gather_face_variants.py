"""The variants a gather form's threads run near a launch's faces (compiler/passes/gather.py): a row's
ends, the threads settled where they lie, the settled middle and its bands, the corners, the
pointwise pass's rows. Each gives, bit for bit, the gradients of the form it stands in for."""
import dataclasses

import numpy as np
import pytest

from compiler import ir
from gather_forms import corpus, gradients, inputs, one_pass_copy, with_faces, without


def assert_bits_without(kernel, shape, **fields):
    """`kernel`'s gradients equal, bit for bit, those of its form with `fields` replaced (see
    `without`), serial and not."""
    values, w = inputs(kernel, shape, seed=sum(shape))
    for deterministic in (False, True):
        _, grads = gradients(kernel, shape, values, w, deterministic=deterministic)
        _, expected = gradients(without(kernel, **fields), shape, values, w, deterministic=deterministic)
        for a, b in zip(grads, expected):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kernel, shape", [(corpus(8, 3)["fwi"], (13, 12, 14)), (corpus(8, 2)["table"], (23, 19)),
                                           (corpus(4, 3)["table"], (11, 9, 10)), (corpus(2, 2)["fwi"], (2, 7))])
def test_the_rows_ends_variant_gives_the_fully_clamped_functions_bits(kernel, shape):
    """A row's first and last threads (within the stencil's radius of the innermost faces) whose
    outer indices are inside run `GatherAdjoint.row_end`: clamped along the innermost axis alone,
    branch-free; the same bits as the fully clamped function, serial or not."""
    kernel = with_faces(kernel)
    assert kernel.compiled().gather.row_end is not None
    assert_bits_without(kernel, shape, row_end=None)


@pytest.mark.parametrize("order, ndim, name, shape", [(8, 3, "unrolled", (13, 12, 14)), (8, 3, "fwi", (11, 13, 6)),
                                                       (4, 2, "table", (17, 16)), (2, 3, "neighbours", (7, 9, 8)),
                                                       (8, 2, "fwi", (12, 5)), (8, 3, "helper", (6, 15, 12))])
def test_the_threads_near_a_face_run_variants_settled_there_with_the_same_bits(order, ndim, name, shape):
    """A row's first threads (below the interior box's margin along the innermost axis) and its
    last ones run `row_end` and `corner` settled there (GatherAdjoint.row_end_sides, corner_sides),
    and the rows near a face of an outer axis `row` settled along that axis (row_sides): the
    guards of the neighbours on the thread's side of the face are false (those of the clamped
    neighbours too), so of a radius-R stencil's passes the R that contribute stay; the same bits
    as the functions they come from, serial or not, also where an extent is below the stencil's
    width (the boxes overlap)."""
    kernel = with_faces(corpus(order, ndim)[name])
    gather = kernel.compiled().gather
    radius = order // 2

    def passes(fn):
        return sum(1 for s in ir.walk(fn.body) if isinstance(s, (ir.ReadGrad, ir.ScratchLoad)))

    pairs = [(gather.row_end.function, gather.row_end_sides), (gather.corner, gather.corner_sides)][:ndim - 1]
    assert (gather.corner is None) == (ndim == 2) and len(gather.row_sides) == ndim - 1
    pairs += [(gather.row.function, sides) for sides in gather.row_sides]
    for base, sides in pairs:
        assert passes(base) >= 4 * radius + 1
        assert [passes(side.function) for side in sides] == [radius] * 2
    assert_bits_without(kernel, shape, row_end_sides=None, corner_sides=None, row_sides=())


@pytest.mark.parametrize("order, ndim, name, shape", [(8, 3, "unrolled", (21, 19, 22)), (8, 2, "helper", (31, 29)),
                                                       (4, 3, "neighbours", (13, 12, 17)), (2, 2, "table", (9, 11))])
def test_the_settled_rows_run_bands_between_the_interiors_box_and_the_settled_one_with_the_same_bits(order, ndim, name,
                                                                                                     shape):
    """In the rows of `GatherAdjoint.settled`'s box, the threads between its box and the interior's
    (a stencil radius at each end) run `bands`: the interior settled there, so that of its selects
    only those of the R - 1 neighbours whose guard switches inside the band stay; the same bits.
    (The one-pass form: the two-pass form runs these guards unconditionally.)"""
    kernel = one_pass_copy(corpus(order, ndim)[name])
    gather = kernel.compiled().gather

    def selects(fn):
        return sum(1 for s in ir.walk(fn.body) if isinstance(s, ir.Op) and s.op == "where")

    arrays = 2                                  # gathered in the pass: up and u
    assert selects(gather.interior.function) > arrays * (order // 2 - 1)
    assert [selects(band.function) for band in gather.bands] == [arrays * (order // 2 - 1)] * 2
    assert_bits_without(kernel, shape, bands=None)


@pytest.mark.parametrize("kernel, shape", [(corpus(8, 2)["helper"], (31, 29)), (corpus(8, 3)["table"], (21, 19, 22)),
                                           (corpus(4, 2)["neighbours"], (17, 16)), (corpus(2, 3)["unrolled"], (9, 8, 10))])
def test_the_settled_variant_drops_the_interiors_selects_and_keeps_its_bits(kernel, shape):
    """Threads a stencil radius inside the interior's box run `GatherAdjoint.settled`: every
    neighbour's guard decided, no selects left; the same bits as the interior with its selects.
    (The one-pass form: the two-pass form runs these guards unconditionally.)"""
    kernel = one_pass_copy(kernel)
    gather = kernel.compiled().gather
    assert any(isinstance(s, ir.Op) and s.op == "where" for s in ir.walk(gather.interior.function.body))
    body = list(ir.walk(gather.settled.function.body))
    assert not any(isinstance(s, ir.If) or isinstance(s, ir.Op) and s.op == "where" for s in body)
    assert not any(isinstance(s, ir.Load) and s.or_zero for s in body)
    for axis in range(len(shape)):       # inside the interior's box
        assert max(b.const for b in gather.settled.lower[axis]) > max(b.const for b in gather.interior.lower[axis])
    assert_bits_without(kernel, shape, settled=None)


@pytest.mark.parametrize("kernel, shape", [(corpus(8, 3)["table"], (13, 12, 14)), (corpus(4, 3)["fwi"], (11, 9, 10)),
                                           (corpus(2, 3)["neighbours"], (7, 9, 8))])
def test_the_corner_variant_is_the_fully_clamped_function_without_branches_and_keeps_its_bits(kernel, shape):
    """The ends of the rows near an outer face run `GatherAdjoint.corner`: the fully clamped
    function with its branches turned into selects, in vector loops; the same bits as the function
    a thread at a time, serial or not."""
    kernel = with_faces(kernel)
    gather = kernel.compiled().gather
    assert gather.corner is not None and corpus(8, 2)["table"].compiled().gather.corner is None    # 3-D only
    assert not any(isinstance(s, ir.If) for s in ir.walk(gather.corner.body))
    assert_bits_without(kernel, shape, corner=None)


@pytest.mark.parametrize("kernel, shape", [(corpus(8, 3)["fwi"], (13, 12, 14)), (corpus(2, 3)["fwi"], (6, 9, 7))])
def test_the_pointwise_pass_runs_the_rows_outside_its_box_through_a_row_variant_with_the_same_bits(kernel, shape):
    """In 3-D the pointwise pass's rows outside its interior box run `Interior.row` (settled along
    the innermost axis, a row at a call: interior.with_row); the same bits as the pass's body a
    thread at a time there, serial or not. In 2-D (a few rows) the pass has none."""
    pointwise = kernel.compiled().gather.pointwise_interior
    assert pointwise.row is not None and corpus(8, 2)["fwi"].compiled().gather.pointwise_interior.row is None
    assert_bits_without(kernel, shape, pointwise_interior=dataclasses.replace(pointwise, row=None))


@pytest.mark.parametrize("order, ndim, name, shape", [(8, 3, "fwi", (13, 12, 14)), (4, 3, "fwi", (11, 9, 10)),
                                                       (8, 2, "fwi", (12, 21)), (2, 3, "fwi", (6, 9, 7))])
def test_the_pointwise_pass_runs_its_threads_near_a_face_settled_there_with_the_same_bits(order, ndim, name, shape):
    """The pointwise pass's threads within the stencil's radius of a face (a row's first and last
    threads: GatherAdjoint.pointwise_sides; in 3-D the first and last rows along each outer axis:
    pointwise_row_sides) run the pass settled there. The FWI step writes 0 outside its box, so the
    pass has nothing to do there but store zero roots: no load of `u` and no other scratch store
    stay. The same bits as the pass's body a thread at a time, serial or not, also where the boxes
    overlap."""
    gather = corpus(order, ndim)[name].compiled().gather
    settled = [side for side in gather.pointwise_sides if side is not None]
    settled += [side for pair in gather.pointwise_row_sides for side in pair if side is not None]
    assert len(settled) == 2 + (2 * (ndim - 1) if ndim > 2 else 0)

    def work(fn):
        return [s for s in ir.walk(fn.body) if isinstance(s, ir.ScratchStore) and not isinstance(s.value, ir.Const)
                or isinstance(s, ir.Load) and s.array.param.name == "u"]
    assert work(gather.pointwise) and not any(work(side.function) for side in settled)
    assert_bits_without(corpus(order, ndim)[name], shape, pointwise_sides=None, pointwise_row_sides=())
