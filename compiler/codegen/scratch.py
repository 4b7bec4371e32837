"""A two-pass gather form's scratch memory on the CPU (compiler/passes/transpose.py): the roots the
pointwise pass stores and the transposed pass gathers.

- `whole`: arrays over every row of the launch, the passes run in turn;
- `windowed`: the passes run by blocks of rows of the first axis, the transposed pass a stencil
  radius behind the pointwise one, and the arrays hold only a window of rows that slides along.

A root then lives a block's time: stored, gathered a few rows later, overwritten by the next
blocks. Its cache lines stay in the cache (a window of about 256 KiB of roots a thread), where
arrays over the whole launch send every root to memory and back: two array passes of the adjoint's
fifteen (the FWI update's, counting a store's read for ownership), and the inputs both passes read
are still in cache for the second. The emitted entry addresses element i of scratch array k at
`base + window_n * offset_k + (i - window_at) * size_k` (sp::scratch in prelude.h): window_n
elements an array, from element window_at of the launch's own numbering on; `whole` has window_at 0.
"""
from __future__ import annotations

# The passes run by windows where the launch's roots take at least WINDOW_FROM_BYTES per OpenMP
# thread, in blocks of rows holding about BLOCK_BYTES of roots a thread (a core's L2 holds a block
# and the rows both passes read beside it); the window holds a block and the rows the transposed
# pass still reads, which move to its front before each block. Float64 FWI update as launched,
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
    return f"sp::tape_t tp = {{scratch, 1, 0, 0, 0, 0, {serial}, fresh, window_n_, window_at_}};"


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
    """C++ declaring `scratch`, `window_n_` and `window_at_` for arrays over the whole launch (a
    halo form's grown by its halo, zeros there)."""
    pads = form.halo or (0,) * ndim
    count = " * ".join(f"(int64_t)(e{k} + {2 * pad})" for k, pad in enumerate(pads))
    return (f"    const int64_t window_n_ = {count}, window_at_ = 0;\n"
            f"    uint64_t* const scratch = sp::scratch_memory(window_n_ * {form.scratch_bytes});\n"
            + _zero_halo(form, ndim, "(int64_t)e0"))


def windowed(first: str, second: str, form, ndim: int, apart: str, in_order: str) -> str:
    """The passes (`first`, `second`: their loop nests over rows r0 to r1 of the first axis) by
    blocks of rows: the first pass over a block, then the second over the rows whose roots the first
    has all stored, `form.reach` rows behind it, the scratch arrays a window of rows (see the
    module's docstring). One block, the arrays whole, where the roots are few for the threads or
    `apart` (a C++ test that the passes share no memory) fails. `in_order`: a C++ test that the launch runs on one
    thread (its blocks are then one thread's)."""
    pad0 = form.halo[0] if form.halo else 0
    reach, sizes = form.reach, form.scratch_arrays
    rows_ahead = 2 * reach + 2 * pad0       # beyond a window's block: rows the transposed pass still reads, halos
    moves = "".join(f"                memmove((char*)scratch + window_n_ * {offset}, (char*)scratch + window_n_ * "
                    f"{offset} + (keep_ - window_at_) * {size}, (size_t)(((int64_t)p_ + {pad0}) * plane_ - keep_) "
                    f"* {size});\n" for offset, size in sizes)
    # a halo form's rows beyond the launch's last: the window's rows there held other rows' roots
    last_halo = "".join(f"            memset((char*)scratch + window_n_ * {offset} + (((int64_t)e0 + {pad0}) * plane_ "
                        f"- window_at_) * {size}, 0, (size_t)({pad0} * plane_ * {size}));\n" for offset, size in sizes)
    last_halo = (f"        if (ahead_ == e0 && window_rows_ < (int64_t)e0 + {2 * pad0}) {{\n{last_halo}        }}\n"
                 if pad0 else "")
    roots = f"(int64_t)L.n * {form.scratch_bytes}"
    return f"""    {{
    const int64_t plane_ = {_plane(ndim, form.halo)};
    const int32_t R0_ = r0, R1_ = r1;
    const int64_t threads_ = {in_order} ? 1 : sp::max_threads();
    const int64_t block_rows_ = {BLOCK_BYTES} * threads_ / (plane_ * {form.scratch_bytes});
    const int32_t block_ = {roots} < {WINDOW_FROM_BYTES} * threads_ || !({apart}) || block_rows_ >= R1_ - R0_ ? R1_ - R0_
        : (int32_t)(block_rows_ > 1 ? block_rows_ : 1);
    int64_t window_rows_ = (int64_t)block_ + {rows_ahead};
    if (window_rows_ > (int64_t)e0 + {2 * pad0}) window_rows_ = (int64_t)e0 + {2 * pad0};
    const int64_t window_n_ = window_rows_ * plane_;
    int64_t window_at_ = 0;
    uint64_t* const scratch = sp::scratch_memory(window_n_ * {form.scratch_bytes});
{_zero_halo(form, ndim, f"window_rows_ - {2 * pad0}")}    int32_t done_ = R0_;
    for (int32_t p_ = R0_; done_ < R1_; p_ += block_) {{
    const int32_t ahead_ = p_ + block_ < R1_ ? p_ + block_ : R1_;
    if (p_ < R1_) {{
        if (((int64_t)ahead_ + {2 * pad0}) * plane_ - window_at_ > window_n_) {{
            // the rows the transposed pass still reads to the window's front
            int64_t keep_ = ((int64_t)done_ - {reach} + {pad0}) * plane_;
            if (keep_ < window_at_) keep_ = window_at_;
{moves}            window_at_ = keep_;
        }}
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
