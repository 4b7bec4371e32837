"""What the gather pass (compiler/passes/gather.py) makes of an adjoint: `GatherAdjoint`, the
form's functions, its variants near the faces and the boxes each runs in, which the CPU entries
(compiler/codegen/cpu_loops.py) and the CUDA launch (compiler/backends/cuda_launch.py) read."""
from __future__ import annotations

import math
from dataclasses import dataclass

from .. import ir
from .interior import Bound, Interior


@dataclass(frozen=True)
class GatherAdjoint:
    """The gather form of a kernel's adjoint. Valid for a launch only when `extent_source` (one of
    `arrays`) has exactly the launch's extents, every other array in `arrays` at least those, and
    every bound in `extent_bounds` equals its axis's extent (`launch` checks; else the scatter
    adjoint runs). An array wider than the launch (a block with halo rows, read at ``i + 1``)
    widens the index space the gather form runs over: its threads beyond the launch gather what
    the launch's threads put there (their own pass, at offset 0, is never inside), and each
    gradient is written only where its array has the element.
    An axis widens only where some array is read there at offsets that are all >= 0 and not all 0
    (the block's rows shifted by a halo): elsewhere the form is the plain one, with no cost.
    `scatters`: some accumulations still scatter (atomics unless serial); such a form never widens.

    `function` serves every thread; `interior` the threads in the middle of the launch, where no
    pass's thread p - c leaves it (so no index is clamped and loads stay unit-stride) and boundary
    tests are settled (compiler/passes/interior.py).

    `pointwise` (two-pass forms, compiler/passes/transpose.py): the pass that runs first, over the
    launch's threads, storing `scratch_bytes` per thread into the launch's scratch memory, which
    `function` reads; None for a one-pass form."""
    function: ir.Function
    interior: Interior
    arrays: tuple[str, ...]
    scatters: bool
    extent_source: str
    widens: tuple[bool, ...]               # per axis: whether an array may be wider than the launch
    # (axis, bound) pairs that must equal the launch's extent on that axis: the divisor of each
    # periodic index, and a clamped index's upper bound plus one
    extent_bounds: tuple[tuple[int, Bound], ...] = ()
    pointwise: ir.Function | None = None
    pointwise_interior: Interior | None = None
    scratch_bytes: int = 0
    # the threads whose innermost index lies in `row`'s box (its other axes' bounds are empty) and
    # whose outer indices are outside `interior`'s: branch-free along the row (CPU entries)
    row: Interior | None = None
    # the threads outside the innermost axis's box whose outer indices lie in `row_end`'s box (its
    # innermost axis's bounds are empty): p - c clamped along the innermost axis alone, the outer
    # axes' tests settled, branch-free (CPU entries; a row's first and last few threads)
    row_end: Interior | None = None
    # the threads far enough inside that every neighbour's boundary guard holds (`interior`'s box
    # narrowed by the stencil's radius once more): `interior` without its selects (CPU entries)
    settled: Interior | None = None
    # `function` with its branches turned into selects, for the ends of the rows outside
    # `row_end`'s box (CPU entries): valid for every thread, run inlined in vector loops
    corner: ir.Function | None = None
    # (first, last) per function of the rows' ends, `row_end` then `corner`: it settled further
    # along the innermost axis for a row's first threads (below the interior box's margin) and its
    # last ones (from the extent less the margin on), where most neighbours' guards are false
    # (interior.settled_over); None where nothing settles (CPU entries)
    row_end_sides: tuple | None = None
    corner_sides: tuple | None = None
    # per outer axis, (first, last) or None: `row` settled along that axis at its first and last
    # rows (CPU entries: the rows outside the interior's box near that axis's faces)
    row_sides: tuple = ()
    # (first, last) or None: `interior` settled along the innermost axis over the threads of the
    # rows in `settled`'s box that lie between its box and the interior's (a stencil radius at
    # each end of the row), where the neighbours' guards along the row settle (CPU entries)
    bands: tuple | None = None
    # the pointwise pass's as `row_end_sides` and `row_sides` are the transposed one's: `pointwise`
    # settled at a row's first and last threads, `pointwise_interior.row` at each outer axis's first
    # and last rows (CPU entries; an FWI step's pass does nothing there)
    pointwise_sides: tuple | None = None
    pointwise_row_sides: tuple = ()
    # a halo form's (two-pass forms only): per axis, how far the scratch arrays reach beyond the
    # launch at each end, where they hold zeros (the roots of threads that do not exist), so that
    # its passes read thread p - c's roots without a test, the same code at every thread: no
    # variants near the faces but `interior` (the thread's own tests along the outer axes settled)
    # and `row` (the rows outside it, those tests as selects). () for the other forms, whose
    # arrays span the launch.
    halo: tuple = ()
    # (byte offset per element of the arrays, bytes per element) of each scratch array (two-pass
    # forms): what a launch of a halo form zeroes beyond the launch, what a CPU window moves
    scratch_arrays: tuple = ()
    # two-pass forms: the most rows of the first axis between a thread of the transposed pass and a
    # thread whose roots it gathers (the stencil's radius along that axis); None where a periodic
    # or clamped index along that axis may gather from its far end
    reach: int | None = None

    def scratch_elements(self, dims) -> int:
        """The elements of each scratch array for a launch over `dims`, one extent per tid() axis
        (packing._dims folds a launch's extra leading axes into the first)."""
        return math.prod(e + 2 * pad for e, pad in zip(dims, self.halo, strict=True))
