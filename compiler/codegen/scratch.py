"""A two-pass gather form's scratch memory on the CPU (compiler/passes/transpose.py): the roots the
pointwise pass stores and the transposed pass gathers.

- `whole`: arrays over every row of the launch, the passes run in turn;
- `windowed`: the passes run by blocks of rows of the first axis, the transposed pass a stencil
  radius behind the pointwise one, and the arrays hold a ring of rows: row q of the launch (grown
  by its halo) in place q mod ring_rows, overwritten once no pass reads it any more.

A root then lives a block's time: stored, gathered a few rows later, overwritten by the next
blocks. Its cache lines stay in the cache (a ring of about 256 KiB of roots a thread), where
arrays over the whole launch send every root to memory and back: two array passes of the adjoint's
fifteen (the FWI update's, counting a store's read for ownership), and the inputs both passes read
are still in cache for the second. The emitted entry addresses element i (of row q) of scratch
array k at `base + window_n * offset_k + (i + (place(q) - q) * plane) * size_k` (sp::scratch in
prelude.h): window_n elements an array, plane elements a row; place(q) = q - ring_at, less
ring_rows where that is ring_rows or more, ring_at being the first row of the ring's turn that
holds the block's first row (every row a block touches lies in that turn or the next). The place
is worked out once a row of threads: the threads along it read consecutive elements. `whole` is
one turn of a ring of every row.
"""
from __future__ import annotations

# The passes run by windows where the launch's roots take at least WINDOW_FROM_BYTES per OpenMP
# thread, in blocks of rows holding about BLOCK_BYTES of roots a thread (a core's L2 holds a block
# and the rows both passes read beside it); the ring holds a block and the rows the transposed
# pass still reads. (Until the thirty-second session the arrays were a window whose last rows moved
# to its front before each block: paired on an Intel Xeon, the window took 1.05-1.08x the ring's
# time in the 3-D 64^3 float32 8th-order wave adjoints, 1.08x in the float64 FWI update's,
# benchmarks/README.md.) Float64 FWI update as launched,
# windowed / in turn, one core of the Zen 4 VM (benchmarks/README.md): 0.78-0.94 at 2-D 512^2 and
# 1024^2, 3-D 64^3 and 96^3, 2nd and 8th order; blocks of 128 KiB to 512 KiB, a window of one or
# two blocks, all within 3% of each other. Each block runs each pass as an OpenMP loop of its own,
# whose fork and join a short launch on several threads does not amortise: 2-D 512^2 (2 MiB of
# roots) on two threads ran 1.04x slower windowed, 1.56x with both cores busy elsewhere; 1024^2
# and 96^3 on two threads 0.80 and 0.89 (1.01 and 0.98 with the cores busy).
WINDOW_FROM_BYTES = 2 << 20
BLOCK_BYTES = 256 << 10


def tape(serial: str) -> str:
    """C++ declaring a thread's tape `tp` over the entry's scratch arrays (as `whole` or `windowed`
    declare them), `serial` its deterministic flag."""
    return f"sp::tape_t tp = {{scratch, 1, 0, 0, 0, 0, {serial}, fresh, window_n_, ring_rows_, ring_at_, plane_}};"


def _plane(ndim: int, halo: tuple) -> str:
    """The elements of one row of the first axis in a scratch array (C++): the product of the other
    axes' extents, each grown by the halo."""
    pads = halo or (0,) * ndim
    return " * ".join(f"(int64_t)(e{k} + {2 * pads[k]})" for k in range(1, ndim)) or "(int64_t)1"


def _zero_halo(form, ndim: int, first_rows: str) -> str:
    """C++ that zeroes a halo form's arrays beyond the launch, the arrays spanning `first_rows` rows
    of the launch's first axis (each grown by the halo)."""
    if not form.halo:
        return ""
    extents = ", ".join([first_rows] + [f"(int64_t)e{k}" for k in range(1, ndim)])
    return (f"    {{ const int64_t e_[] = {{{extents}}}, pad_[] = {{{', '.join(map(str, form.halo))}}};\n"
            + "".join(f"      sp::zero_halo((char*)scratch + window_n_ * {offset}, {size}, {ndim}, e_, pad_);\n"
                      for offset, size in form.scratch_arrays) + "    }\n")


def whole(form, ndim: int) -> str:
    """C++ declaring `scratch`, `window_n_` and the ring's `ring_rows_`, `ring_at_`, `plane_` for
    arrays over the whole launch (a halo form's grown by its halo, zeros there): one turn of a
    ring that holds every row."""
    pads = form.halo or (0,) * ndim
    count = " * ".join(f"(int64_t)(e{k} + {2 * pad})" for k, pad in enumerate(pads))
    return (f"    const int64_t window_n_ = {count}, ring_rows_ = (int64_t)e0 + {2 * pads[0]}, ring_at_ = 0, "
            f"plane_ = {_plane(ndim, form.halo)};\n"
            f"    uint64_t* const scratch = sp::scratch_memory(window_n_ * {form.scratch_bytes});\n"
            + _zero_halo(form, ndim, "(int64_t)e0"))


def windowed(first: str, second: str, form, ndim: int, apart: str, in_order: str) -> str:
    """The passes (`first`, `second`: their loop nests over rows r0 to r1 of the first axis) by
    blocks of rows: the first pass over a block, then the second over the rows whose roots the first
    has all stored, `form.reach` rows behind it, the scratch arrays a ring of rows (see the module's
    docstring). One block, the arrays whole, where the roots are few for the threads or `apart` (a
    C++ test that the passes share no memory) fails. `in_order`: a C++ test that the launch runs on
    one thread (its blocks are then one thread's)."""
    pad0 = form.halo[0] if form.halo else 0
    reach, sizes = form.reach, form.scratch_arrays
    rows_ahead = 2 * reach + 2 * pad0       # beyond a ring's block: rows the transposed pass still reads, halos
    # a halo form's rows beyond the launch's last, zeros: their places in the ring held other rows' roots
    last_halo = "".join(f"                memset((char*)scratch + window_n_ * {offset} + place_ * {size}, 0, "
                        f"(size_t)(plane_ * {size}));\n" for offset, size in sizes)
    last_halo = (f"        if (ahead_ == e0 && ring_rows_ < (int64_t)e0 + {2 * pad0}) {{\n"
                 f"            for (int64_t q_ = (int64_t)e0 + {pad0}; q_ < (int64_t)e0 + {2 * pad0}; ++q_) {{\n"
                 f"                const int64_t place_ = (q_ - sp::ring_turn(q_, ring_at_, ring_rows_)) * plane_;\n"
                 f"{last_halo}            }}\n        }}\n"
                 if pad0 else "")
    roots = f"(int64_t)L.n * {form.scratch_bytes}"
    return f"""    {{
    const int64_t plane_ = {_plane(ndim, form.halo)};
    const int32_t R0_ = r0, R1_ = r1;
    const int64_t threads_ = {in_order} ? 1 : sp::max_threads();
    const int64_t block_rows_ = {BLOCK_BYTES} * threads_ / (plane_ * {form.scratch_bytes});
    const int32_t block_ = {roots} < {WINDOW_FROM_BYTES} * threads_ || !({apart}) || block_rows_ >= R1_ - R0_ ? R1_ - R0_
        : (int32_t)(block_rows_ > 1 ? block_rows_ : 1);
    int64_t ring_rows_ = (int64_t)block_ + {rows_ahead};
    if (ring_rows_ > (int64_t)e0 + {2 * pad0}) ring_rows_ = (int64_t)e0 + {2 * pad0};
    const int64_t window_n_ = ring_rows_ * plane_;
    int64_t ring_at_ = 0;
    uint64_t* const scratch = sp::scratch_memory(window_n_ * {form.scratch_bytes});
{_zero_halo(form, ndim, f"ring_rows_ - {2 * pad0}")}    int32_t done_ = R0_;
    for (int32_t p_ = R0_; done_ < R1_; p_ += block_) {{
    const int32_t ahead_ = p_ + block_ < R1_ ? p_ + block_ : R1_;
    // the ring's turn of the first row this block reads: every row it touches is in that turn or the next
    {{ const int64_t first_ = (int64_t)done_ - {reach} + {pad0};
      ring_at_ = first_ > 0 ? first_ / ring_rows_ * ring_rows_ : 0; }}
    if (p_ < R1_) {{
{last_halo}        const int32_t r0 = p_, r1 = ahead_;
{first}    }}
    const int32_t upto_ = ahead_ == R1_ ? R1_ : ahead_ - {reach} > done_ ? ahead_ - {reach} : done_;
    if (done_ < upto_) {{ const int32_t r0 = done_, r1 = upto_;
{second}    }}
    done_ = upto_;
    }}
    }}
"""


__all__ = ["BLOCK_BYTES", "WINDOW_FROM_BYTES", "tape", "whole", "windowed"]
