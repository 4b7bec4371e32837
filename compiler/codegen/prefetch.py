"""Software prefetch of what a CPU loop nest's next row streams from memory.

A stencil's middle loop runs along the innermost axis; its rows of the outer axes come one after
another. Most of what a row reads was read by the rows before it (an 8th-order stencil reads nine
rows of `u`, eight of them seen already); what is new comes from memory: the leading row of each
array it reads at a stencil's offsets, the own row of each array read or written pointwise. Where a
launch's arrays outgrow the cache, the hardware prefetcher did not keep ahead of those streams once
there were a dozen of them (a 2-D 1072^2 8th-order FWI update read 13 rows a row, five from
memory: 1.45 ns a point against 0.9 at 816^2 and below, on an AMD Zen 4). So the middle loop runs
in blocks of a few cache lines, each block first prefetching the same columns of the next row's
new rows, a row's time ahead of their use.
"""
from __future__ import annotations

from .. import ir
from ..passes.dce import without_absent_gradients
from ..passes.interior import tid_offsets
from .emit import arg_name

# Prefetch where the streamed arrays hold at least this much: below it they stay in cache and the
# blocks only cost (1.14-1.17x at 304^2 and 560^2, float32, 8th order).
PREFETCH_FROM_BYTES = 16 << 20
BLOCK_BYTES = 256         # a block's share of each stream: four 64-byte lines (blocks of 512 ran slower)
LINE_BYTES = 64


def streams(fn: ir.Function, grads: int | None = None) -> list[tuple[str, tuple[int, ...], bool, int]]:
    """The rows a row of `fn`'s threads (an interior variant: its indices tid + constant) needs
    next and its own rows do not hold: (the array, "A.a_u" or "G.a_u", its offsets along the outer
    axes from the next row's indices, whether it is written, its element's bytes). Per array: the
    offsets that the step to the next row (along the last outer axis) leaves uncovered, of which
    the greatest (the row furthest ahead: the others came from memory as some earlier row's).
    Gradients outside mask `grads` (None: all present) are absent: neither they nor what only
    their accumulations read are streamed."""
    ndim = fn.tid_ndim
    if ndim < 2:
        return []
    if grads is not None:
        fn = without_absent_gradients(fn, grads)
    offsets = tid_offsets(fn.body, ndim)
    rows: dict[str, set] = {}
    written: set[str] = set()
    size: dict[str, int] = {}
    for s in ir.walk(fn.body):
        if not isinstance(s, (ir.Load, ir.Store, ir.ReadGrad, ir.AccumGrad)) or len(s.indices) != ndim:
            continue
        at = [offsets.get(x.id) if isinstance(x, ir.Temp) else None for x in s.indices]
        if not all(isinstance(a, tuple) and a[0] == k and a[1].near_start for k, a in enumerate(at)):
            continue            # not tid + constant along every axis in order
        kind = "G" if isinstance(s, (ir.ReadGrad, ir.AccumGrad)) or s.array.adjoint else "A"
        if kind == "G" and grads is not None and not grads >> s.array.param.index & 1:
            continue
        name = f"{kind}.{arg_name(s.array.param.name)}"
        rows.setdefault(name, set()).add(tuple(a[1].const for a in at[:-1]))
        size[name] = s.array.type.dtype.size
        if isinstance(s, (ir.Store, ir.AccumGrad)):
            written.add(name)
    out = []
    for name, seen in sorted(rows.items()):
        ahead = {o[:-1] + (o[-1] + 1,) for o in seen} - seen
        if ahead:
            out.append((name, max(ahead), name in written, size[name]))
    return out


def plan(fn: ir.Function, grads: int | None = None) -> tuple[str, str, str, int] | None:
    """(a C++ test, made once a launch, that prefetching pays; the row's setup, made once a row of
    i0, i1, ...: each stream's row ahead; the prefetches of a block of columns c0 <= c < c1; the
    block's threads), or None where `fn` streams nothing from rows ahead (`grads` as streams')."""
    found = streams(fn, grads)
    if not found:
        return None
    k = fn.tid_ndim - 1
    widest = max(size for *_, size in found)
    setup, lines = [], []
    for n, (name, offsets, written, size) in enumerate(found):
        at = [f"i{a}" if o == 0 else f"i{a} + {o}" if o > 0 else f"i{a} - {-o}" for a, o in enumerate(offsets)]
        # An interior thread reads its array at every offset but the last axis's, one row on from
        # one it reads: a row past the array's last (or before its first) is not prefetched; its
        # blocks prefetch the array's first row instead (a real address, in cache after a few
        # blocks), so that the blocks test nothing: tested at each prefetch, rows of 96 columns
        # (a 3-D 96^3 FWI pass) spent a tenth of their time in the prefetch loops.
        inside = f"(uint64_t)({at[-1]}) < (uint64_t){name}.shape[{k - 1}]"
        setup.append(f"const char* const pf{n}_ = {inside} ? (const char*)sp::address({name}, {', '.join(at)}, 0) "
                     f": (const char*){name}.data;")
        lines.append(f"__builtin_prefetch(pf{n}_ + (int64_t)c * {size}, {int(written)});")
    stride = max(1, LINE_BYTES // widest)
    body = f"for (int32_t c = c0; c < c1; c += {stride}) {{ {' '.join(lines)} }}"
    bytes_per_thread = sum(size for *_, size in found)
    return (f"(int64_t)L.n * {bytes_per_thread} >= {PREFETCH_FROM_BYTES}", " ".join(setup), body,
            max(stride, BLOCK_BYTES // widest))


def blocked(k: int, hint: str, call: str, block: int, setup: str, prefetches: str) -> str:
    """The middle loop over i{k} from a to b in blocks of `block` threads, each block's prefetches
    first, after the row's `setup` (cpu_loops.interior_nest runs it where the launch's test holds,
    the plain loop where not: one loop of blocks whose block was the whole run ran 4-5% slower
    where the arrays stay in cache, 2-D 304^2 and 560^2 8th-order forwards)."""
    return (f"{setup} for (int32_t c0 = a; c0 < b; c0 += {block}) {{ "
            f"const int32_t c1 = b - c0 > {block} ? c0 + {block} : b; {prefetches} "
            f"{hint}for (int32_t i{k} = c0; i{k} < c1; ++i{k}) {call} }}")
