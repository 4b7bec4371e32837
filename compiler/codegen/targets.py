"""Target tables: what differs between the CPU and CUDA renderings of the same emitted body.

A module is the forward and adjoint of every kernel of one Python module. Both targets render each
kernel's thread body with the same `FunctionEmitter`; a `Target` only says how that body is
qualified and how the entry points around it iterate over the launch (an OpenMP loop on the CPU,
a grid-stride loop on the GPU) and report errors.

Entry points take one packed argument buffer (launch_t header + argument slots, see
emit.arg_offsets):
- CPU: a pointer to it, so a launch is a single foreign call.
- CUDA: the buffer itself, by value, as a `__grid_constant__` kernel parameter of a struct type of
  exactly the buffer's size. The driver copies the parameter bytes into the launch (no device
  allocation and no host-to-device copy per launch; parameters are limited to 4 KiB, or 32 KiB
  from CUDA 12.1 on Volta and newer), and `__grid_constant__` lets the thread body read slots
  through a pointer without copying the struct to local memory.

Errors on CUDA live in `extern "C" __device__` globals that the host reads with cuModuleGetGlobal:
`sp_error_site`/`sp_error_index` (first out-of-bounds access in debug mode, as on the CPU),
`sp_tape_overflow` (the adjoint tape was too small) and `sp_tape_words` (the counting pass's
maximum words per thread).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .. import ir
from ..builtins import OPS
from ..passes.interior import writes_own_elements
from . import cpu_loops as loops, memory, prefetch, scratch
from .emit import FunctionEmitter, arg_name, arg_offsets, slot_size
from .threads import parallel_threshold

LAUNCH_HEADER_SIZE = 72      # sizeof(launch_t): n, dim[4], first, end, adds, add_slots
ADD_CHUNK = 4096             # threads per chunk of a launch that logs its adds (prelude.h's ADD_CHUNK)
ADD_SLOT_SIZE = 24           # sizeof(sp::add_slot): one element's partial on a GPU

CPU_HEADER = """#include "prelude.h"
extern "C" { int sp_error_site = -1; long long sp_error_index[4] = {0, 0, 0, 0}; }
static void report_out_of_bounds(int site, int64_t i, int64_t j, int64_t k, int64_t l) {
    int expected = -1;
    if (__atomic_compare_exchange_n(&sp_error_site, &expected, site, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
        sp_error_index[0] = i; sp_error_index[1] = j; sp_error_index[2] = k; sp_error_index[3] = l;
    }
}
"""

CUDA_HEADER = """#include "prelude.h"
extern "C" {
__device__ int sp_error_site = -1;
__device__ long long sp_error_index[4] = {0, 0, 0, 0};
__device__ int sp_tape_overflow = 0;
__device__ unsigned long long sp_tape_words = 0;
}
static __device__ void report_out_of_bounds(int site, int64_t i, int64_t j, int64_t k, int64_t l) {
    if (atomicCAS(&sp_error_site, -1, site) == -1) {
        sp_error_index[0] = i; sp_error_index[1] = j; sp_error_index[2] = k; sp_error_index[3] = l;
    }
}
// After a launch that logged its adds (sp::add_slot): its chunks' partials added to their elements
// in chunk order, by one thread.
extern "C" __global__ void sp_apply_adds(const int64_t* counts, int64_t chunks, int64_t slots) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    const sp::add_slot* all = (const sp::add_slot*)(counts + chunks);
    for (int64_t c = 0; c < chunks; ++c)
        for (int64_t k = 0; k < counts[c]; ++k) {
            const sp::add_slot& e = all[c * slots + k];
            if (e.is_double) *(double*)e.p = *(double*)e.p + e.d;
            else *(float*)e.p = (float)((double)*(float*)e.p + e.d);
        }
}
// Before a halo form's pointwise pass (which stores the launch's elements), zeros in its scratch
// arrays beyond the launch (GatherAdjoint.halo; backends/cuda_launch.py): block r takes row r of the
// innermost axis of the launch grown by the halo, zeroing it whole where its outer indices lie
// outside the launch, else its two ends. A memset of the whole scratch was one more array pass.
struct __align__(8) sp_halo_t { int64_t extent[4], pad[4], offset[8], size[8], ndim, arrays, n; };
extern "C" __global__ void sp_zero_halo(const __grid_constant__ sp_halo_t h, char* scratch) {
    const int last = (int)h.ndim - 1;
    int64_t r = blockIdx.x;
    bool outside = false;
    for (int k = last - 1; k >= 0; --k) {
        const int64_t grown = h.extent[k] + 2 * h.pad[k], at = r % grown;
        r /= grown;
        outside = outside || at < h.pad[k] || at >= h.pad[k] + h.extent[k];
    }
    const int64_t end = h.pad[last], width = h.extent[last] + 2 * end, row = (int64_t)blockIdx.x * width;
    const int64_t count = outside ? width : 2 * end;
    for (int a = 0; a < (int)h.arrays; ++a)
        for (int64_t j = threadIdx.x; j < count; j += blockDim.x) {
            char* p = scratch + h.n * h.offset[a] + (row + (outside || j < end ? j : width - 2 * end + j)) * h.size[a];
            if (h.size[a] % 4 == 0) for (int b = 0; b < (int)h.size[a]; b += 4) *(uint32_t*)(p + b) = 0u;
            else for (int b = 0; b < (int)h.size[a]; ++b) p[b] = 0;
        }
}
"""

# Threads per CUDA block; the launcher must use the same number (`__launch_bounds__`).
CUDA_BLOCK_SIZE = 256
# Blocks each SM must fit (`__launch_bounds__`' second number): 2 x 256 threads caps a thread at 128
# registers, so heavy adjoints (builtin-vector ones took 166-250) keep at least 25% occupancy.
CUDA_MIN_BLOCKS_PER_SM = 2
# The gather form's passes (pointwise and gather) stream arrays in and out: occupancy hides their
# memory latency better than registers do. 8 x 256 threads (32 registers, full occupancy) made the
# float32 stencils' adjoints 1.2-2x faster on an H200 than 2 blocks did, and faster than 4 blocks
# (2-D 4096^2 and 3-D 256^3, 2nd-8th order; 2026-11-28, eighth session); ptxas fits them in 32
# registers without spilling. Wider values need more: see _min_blocks.
CUDA_GATHER_MIN_BLOCKS_PER_SM = 8


@dataclass
class RenderedModule:
    source: str
    sites: list          # (kernel name, array name, Loc) for each bounds-checked access


@dataclass(frozen=True)
class Target:
    """How one target wraps the shared thread bodies. Templates see {name} (the IR function's name),
    {size} (the packed buffer's bytes) and the module constants."""
    header: str
    thread_qualifier: str
    forward_entry: str
    adjoint_entry: str
    gather_entry: str
    interiors: bool = False    # whether entries run interior variants (compiler/passes/interior.py) in the middle


# The adjoint and gather entries of a target take the same arguments: the forward's packed buffer,
# the gradients' (same layout) and the loop tape.
_CPU_ADJOINT_HEAD = """extern "C" int {name}(const char* buf, const char* adj_args, uint64_t* tape, int64_t capacity, int count_only,
                      int64_t* counts, int serial) {{
    const launch_t L = sp::widened(*(const launch_t*)buf, *(const launch_t*)adj_args);
    const {name}_args_t A = *(const {name}_args_t*)(buf + sizeof(launch_t));
    const {name}_args_t G = *(const {name}_args_t*)(adj_args + sizeof(launch_t));
    const int64_t fresh = *(const int64_t*)adj_args;    // the adjoint buffer's header: the fresh mask
"""
_CUDA_ADJOINT_HEAD = """struct __align__(8) {name}_buf_t {{ char bytes[{size}]; }};
extern "C" __global__ void __launch_bounds__({block}, {min_blocks}) {name}(const __grid_constant__ {name}_buf_t buf,
        const __grid_constant__ {name}_buf_t adj_buf, uint64_t* tape, int64_t capacity, int count_only,
        int64_t* counts) {{
    const launch_t L = sp::widened(*(const launch_t*)buf.bytes, *(const launch_t*)adj_buf.bytes);
    const {name}_args_t& A = *(const {name}_args_t*)(buf.bytes + sizeof(launch_t));
    const {name}_args_t& G = *(const {name}_args_t*)(adj_buf.bytes + sizeof(launch_t));
    const int64_t fresh = *(const int64_t*)adj_buf.bytes;    // the adjoint buffer's header: the fresh mask
"""

CPU = Target(
    header=CPU_HEADER,
    thread_qualifier="static",
    forward_entry="""extern "C" void {name}_forward(const char* buf, int serial) {{
    const launch_t L = *(const launch_t*)buf;
    // A local copy of the arguments: stores through array pointers cannot alias it, so the
    // compiler keeps scalars and array descriptors in registers across the loop.
    const {name}_args_t A = *(const {name}_args_t*)(buf + sizeof(launch_t));
{extents}
{logged}{nest}}}
""",
    adjoint_entry=_CPU_ADJOINT_HEAD + """    const int in_order = serial || L.n < {threshold};   // no other thread runs: plain adds suffice
    int overflow = 0;
{extents}
{logged}    #pragma omp parallel for {collapse}schedule(static) firstprivate(A, G) reduction(|:overflow) if (L.n >= {threshold} && !serial)
{loops}        const int64_t t = {flat};
        // Thread-major on the CPU: a thread's words are contiguous, as its core walks them in order.
        sp::tape_t tp = {{tape + t * capacity, 1, 0, capacity, count_only, 0, in_order, fresh}};
        {name}_thread<{checked}>({tids}, L, A, G, tp);
        if (count_only) counts[t] = tp.pos;
        overflow |= tp.overflow;
{closing}    return overflow;
}}
""",
    # The gather form keeps no tape and each thread writes only its own elements; the loop nest is
    # written out twice so that the common case (every gradient present) runs the instantiation
    # without null checks, which vectorises.
    gather_entry=_CPU_ADJOINT_HEAD + """    const int in_order = serial || L.n < {threshold};
{extents}
{logged}    if ({all_grads}) {{
{nest}    }} else {{
{plain_nest}    }}
    return 0;
}}
""",
    interiors=True,
)

# Deterministic (serial) launches on the GPU use one block of one thread: the grid-stride loop then
# visits the threads in index order, like the CPU's serial flag. A launch that logs its adds (serial
# flag 2) runs a GPU thread per chunk instead (sp::thread_range in prelude.h).
_GRID_STRIDE = "const sp::thread_range R_(L);\n    for (int64_t t = R_.first; t < R_.end; t += R_.step)"

CUDA = Target(
    header=CUDA_HEADER,
    thread_qualifier="static __device__",
    forward_entry="""struct __align__(8) {name}_buf_t {{ char bytes[{size}]; }};
extern "C" __global__ void __launch_bounds__({block}, {min_blocks}) {name}_forward(const __grid_constant__ {name}_buf_t buf) {{
    const launch_t& L = *(const launch_t*)buf.bytes;
    const {name}_args_t& A = *(const {name}_args_t*)(buf.bytes + sizeof(launch_t));
{box}    """ + _GRID_STRIDE + """ {{
{decompose}
        {pick}{name}_thread({tids}, L, A);
    }}
}}
""",
    # counts (optional, device memory) gets each thread's words in the counting pass; the maximum
    # also lands in sp_tape_words so the host need not reduce n counts.
    adjoint_entry=_CUDA_ADJOINT_HEAD + """    """ + _GRID_STRIDE + """ {{
{decompose}
        sp::tape_t tp = {{tape + t, L.n, 0, capacity, count_only, 0, 0, fresh}};
        {name}_thread<{checked}>({tids}, L, A, G, tp);
        if (count_only) {{
            if (counts) counts[t] = tp.pos;
            atomicMax(&sp_tape_words, (unsigned long long)tp.pos);
        }}
        if (tp.overflow) sp_tape_overflow = 1;
    }}
}}
""",
    gather_entry=_CUDA_ADJOINT_HEAD + """    const bool all_grads = {all_grads};
{box}    """ + _GRID_STRIDE + """ {{
{decompose}
        sp::tape_t tp = {{tape, L.n, 0, 0, 0, 0, 0, fresh}};     // a two-pass form's scratch memory
        if (all_grads) {pick}{name}_thread<{fast}>({tids}, L, A, G, tp);
        else {name}_thread<{checked}>({tids}, L, A, G, tp);
    }}
}}
""",
    interiors=True,
)


def native_definitions(functions) -> str:
    """C++ definitions of the @func_native ops the functions use, each once."""
    seen = {}
    for fn in functions:
        for s in ir.walk(fn.body):
            if isinstance(s, ir.Op) and OPS[s.op].definition:
                seen.setdefault(s.op, OPS[s.op].definition)
    return "\n".join(seen.values())


def render(kernels: list[tuple], debug: bool, target: Target) -> RenderedModule:
    """The source of one module for `target`: per kernel (forward, its `Interior`, adjoint,
    `GatherAdjoint`, `IdentityStores`; all but the forward may be None) an entry point for the
    forward, the adjoint and the gather form, and on the CPU one for the forward without its
    identity stores (native step loops rename buffers instead). Interior variants and that one only
    leave out or rearrange their body's ops, so the forward's and the adjoint's native definitions
    cover them."""
    sites: list = []
    parts = [target.header, native_definitions([f for forward, _, adjoint, *_ in kernels for f in (forward, adjoint)
                                                if f is not None])]
    for forward, interior, adjoint, gather, identity in kernels:
        parts.append(_kernel(forward, debug, sites, target, target.forward_entry, interior))
        if adjoint is not None:
            parts.append(_kernel(adjoint, debug, sites, target, target.adjoint_entry))
        if gather is not None and gather.pointwise is not None and target is not CPU:
            # the GPU runs a two-pass form's passes as two launches (backends/cuda_launch.py)
            parts.append(_kernel(gather.pointwise, debug, sites, target, target.gather_entry, gather.pointwise_interior))
        if gather is not None:
            parts.append(_kernel(gather.function, debug, sites, target, target.gather_entry, gather=gather))
        if identity is not None and target is CPU:
            parts.append(_kernel(identity.function, debug, sites, target, target.forward_entry, identity.interior))
    return RenderedModule("\n".join(parts), sites)


def render_cpu(kernels: list[tuple], debug: bool) -> RenderedModule:
    return render(kernels, debug, CPU)


def render_cuda(kernels: list[tuple], debug: bool) -> RenderedModule:
    """CUDA C++ for NVRTC (with prelude.h as a header). Compile with `--fmad=false` so float results
    match the CPU build's -ffp-contract=off; launch blocks of CUDA_BLOCK_SIZE threads."""
    return render(kernels, debug, CUDA)


def buffer_size(params) -> int:
    """Bytes of the packed buffer of a kernel with these parameters: launch_t, then the slots."""
    offsets = arg_offsets(params)
    return LAUNCH_HEADER_SIZE + (offsets[-1] + slot_size(params[-1].type) if params else 0)


def grad_params(*functions: ir.Function) -> tuple[int, ...]:
    """Indices of the array parameters whose gradients the adjoint `functions` (a gather form, its
    interior variant and a two-pass form's pointwise pass) read or accumulate into: the bits of a
    gradient mask that matter (see has_grad in prelude.h)."""
    return tuple(sorted({s.array.param.index for fn in functions for s in ir.walk(fn.body)
                         if isinstance(s, (ir.AccumGrad, ir.ReadGrad))}))


def gather_grad_params(gather) -> tuple[int, ...]:
    """`grad_params` of every pass of a `GatherAdjoint` (its function, its interior variant and a
    two-pass form's pointwise pass)."""
    return grad_params(gather.function, gather.interior.function,
                       *((gather.pointwise,) if gather.pointwise is not None else ()))


def grads_variant_name(name: str, grads: int) -> str:
    """The entry point of adjoint function `name` specialised on gradient mask `grads`."""
    return f"{name}_grads{grads:x}"


def render_grads_variant(functions: tuple, grads: int, target: Target) -> RenderedModule:
    """The source of one entry point: the gather form of a kernel (`functions` as `render` takes
    them) specialised on which gradients the launch carries: bit k of `grads` set where array
    parameter k has one (of `grad_params`; the others do not matter). The body has no null tests
    and no accumulations into absent gradients, and so vectorises whatever subset of arguments
    carries gradients. Named `grads_variant_name(gather name, grads)`; no debug checks. On the GPU,
    which launches a two-pass form's passes one after the other, the pointwise pass's entry comes
    specialised beside it (`grads_variant_name(pointwise name, grads)`): the module's would replay,
    for a gradient that is absent, the forward values and loads that only that gradient needs."""
    gather = functions[3]
    fn = dataclasses.replace(gather.function, name=grads_variant_name(gather.function.name, grads))
    first = (dataclasses.replace(gather.pointwise, name=grads_variant_name(gather.pointwise.name, grads))
             if gather.pointwise is not None and target is not CPU else None)
    parts = [target.header, native_definitions([fn, *((first,) if first is not None else ())]),
             _kernel(fn, False, [], target, target.gather_entry, grads=grads, gather=gather)]
    if first is not None:
        parts.append(_kernel(first, False, [], target, target.gather_entry, gather.pointwise_interior, grads=grads))
    return RenderedModule("\n".join(parts), [])


def _kernel(fn: ir.Function, debug, sites, target: Target, entry_template: str, interior=None,
            grads: int | None = None, gather=None) -> str:
    """One entry point: `fn`'s thread body (and its interior variant, which shares `fn`'s argument
    struct, where the target runs one) and the target's entry around it. An adjoint entry picks an
    instantiation of the body (see has_grad in prelude.h): with `grads` the one for that gradient
    mask throughout; without, the gather entry runs the branch-free one where every gradient the
    body touches is present and the one that tests each gradient otherwise. `gather`: the
    `GatherAdjoint` whose function `fn` is (renamed, for a grads variant); its interior and, on the
    CPU, its variants near the faces run in the entry, and a two-pass form's pointwise pass runs
    first, over every thread, into scratch memory that `fn` reads (the GPU launches the module's
    pointwise entry first instead: backends/cuda_launch.py)."""
    if gather is not None:
        interior, row, row_end, settled, corner = (gather.interior, gather.row, gather.row_end, gather.settled,
                                                   gather.corner)
        sides, row_sides, bands = (gather.row_end_sides, gather.corner_sides), gather.row_sides, gather.bands
    else:
        row = row_end = settled = corner = bands = None
        sides, row_sides = (None, None), ()
    adjoint = entry_template is not target.forward_entry
    interior = interior if target.interiors else None
    threshold = parallel_threshold(fn)
    lines = [FunctionEmitter(fn, debug=debug, sites=sites).args_struct(f"{fn.name}_args_t")]
    lines += _thread_function(fn, debug, sites, target, adjoint, fn.name)
    # a forward whose threads each write only their own elements: its loops run without alias tests
    # where its written arrays share no memory with its other arguments (checked at each launch;
    # a 3-D 64^3 8th-order wave's forward 19% faster, the 2-D 296^2 8th-order FWI step's 10%)
    writes_own = not adjoint and target is CPU and interior is not None and writes_own_elements(fn)
    # ... and there its interior reads its tables' values from a local struct (see table_reads), as a
    # gather form's middles of both passes do (`tables_apart` below)
    two_pass = gather if gather is not None and gather.pointwise is not None and target is CPU else None
    takers = memory.table_takers(gather, two_pass) if gather is not None and target is CPU and not debug else ()
    tables = {}
    if (writes_own or takers) and interior is not None and fn.tid_ndim > 1 and not debug:
        tables = memory.table_reads((fn, *((two_pass.pointwise,) if two_pass is not None else ())),
                                    (interior.function, *takers))
    reads_tables = {f.name for f in (interior.function, *takers)} if tables else set()
    if tables:
        lines.append(memory.tables_struct(fn, tables, f"{fn.name}_tables_t"))
    if interior is not None:
        # (a halo form's runs at every thread: its own guard's selects as blends, as the row variant's)
        halo = gather is not None and bool(gather.halo) and target is CPU
        lines += _thread_function(interior.function, debug, sites, target, adjoint, fn.name, hot=True, blend=halo,
                                  tables=tables)
    touched = grad_params(fn, *((interior.function,) if interior is not None else ()),
                          *((two_pass.pointwise,) if two_pass is not None else ()))
    if grads is None:
        fast, checked = "sp::ALL_GRADS, sp::ALL_GRADS", "0, 0"
        all_grads = " && ".join(f"G.{arg_name(fn.params[k].name)}.data" for k in touched) or "true"
    else:
        fast = checked = f"sp::ALL_GRADS, {grads:#x}ull"
        all_grads = "true"
    # when the entry runs its common case's nest (else the one with null checks, which reads tables as it goes)
    runs_fast = f"{all_grads} && {memory.tables_apart(fn, tables, touched)}" if adjoint and tables else all_grads
    space = loops.index_space(fn.tid_ndim)
    tids = space["tids"]
    if adjoint:     # the gather entry's common case: every gradient present, no tape
        head, private = f"_thread<{fast}>({tids}, L, A, G, tp", ("A", "G")
        prelude = scratch.tape("in_order") if two_pass else "sp::tape_t tp = {nullptr, 1, 0, 0, 0, 0, in_order, fresh};"
    else:
        head, private, prelude = f"_thread({tids}, L, A", ("A",), ""
    call = head + ");"
    # the variants that read their tables from T (see table_reads): their calls pass it, and the
    # nests running them fill it at each row
    row_prelude = f"{prelude} {memory.tables_fill(tables, f'{fn.name}_tables_t')}".strip() if tables else prelude

    def called(variant):        # (as _called)
        takes = variant is not None and variant.function.name in reads_tables
        return _called(variant, head + (", T);" if takes else ");"))

    def hot_variant(function, **options):
        return _thread_function(function, debug, sites, target, adjoint, fn.name, hot=True,
                                tables=tables if function.name in reads_tables else None, **options)
    # The GPU's grid-stride loop: a thread inside the interior box runs the variant (`pick`).
    box, pick = "", ""
    row = row if target is CPU and interior is not None else None     # a gather form's (GatherAdjoint.row)
    row_part = called(row)                                             # (what interior_nest takes)
    if row is not None:
        lines += hot_variant(row.function, blend=True)
    if row is None and target is CPU and interior is not None and interior.row is not None:    # a forward's
        row_lines, row_part = _by_rows(interior.row, fn, debug, sites, target, adjoint, independent=writes_own)
        lines += row_lines
    row_end = row_end if target is CPU and interior is not None else None
    if row_end is not None:
        # inlined, so that a row's ends run as loops the compiler can vectorise (see interior_nest)
        lines += _thread_function(row_end.function, debug, sites, target, adjoint, fn.name, hot=True)
    settled = settled if target is CPU and interior is not None else None    # (GatherAdjoint.settled)
    if settled is not None:
        lines += hot_variant(settled.function)
    corner = corner if row_end is not None else None                       # (GatherAdjoint.corner)
    if corner is not None:
        lines += _thread_function(corner, debug, sites, target, adjoint, fn.name, hot=True)
    # (GatherAdjoint.row_end_sides and corner_sides: each (first, last) or None)
    sides = [pair if base is not None and pair is not None else (None, None)
             for base, pair in zip((row_end, corner), sides)]
    bands = (bands or (None, None)) if settled is not None else (None, None)       # (GatherAdjoint.bands)
    # (a forward's Interior.row_ends: a row's ends run settled there, as the pointwise pass's do)
    row_ends = (interior.row_ends or (None, None)) if target is CPU and interior is not None else (None, None)
    side_variants = [v for pair in (*sides, bands, row_ends) for v in pair if v is not None]
    for variant in side_variants:
        lines += hot_variant(variant.function)
    gather_entry = adjoint and entry_template is target.gather_entry
    # (GatherAdjoint.row_sides) a row at a call: inlined, they slowed the nest's settled loop 2x
    row_side_runs = _row_side_runs(row_sides if row is not None else (), fn, debug, sites, target, adjoint, fast,
                                   grads, gather_entry, lines, side_variants)
    # (a forward's Interior.face_rows, a row at a call: along axis 0 in loops of their own, else as rows)
    face_rows = _row_side_runs(interior.face_rows if target is CPU and interior is not None else (), fn, debug, sites,
                               target, adjoint, None, grads, writes_own, lines, side_variants)
    if face_rows and row is None and row_part is not None:
        row_side_runs = [(None, None), *face_rows[1:]]
    if interior is not None:
        independent = writes_own or gather_entry and memory.independent(
            grads, fn, interior.function, *((row.function,) if row else ()), *((row_end.function,) if row_end else ()),
            *((settled.function,) if settled else ()), *((corner,) if corner else ()),
            *(v.function for v in side_variants))
        nest = loops.interior_nest(fn.tid_ndim, fn.name + call, called(interior)[0], interior, private,
                                   row_prelude, threshold, row_part, independent=independent,
                                   row_end=_called(row_end, call), settled=called(settled),
                                   corner=corner.name + call if corner is not None else None,
                                   row_run=row is None and row_part is not None,
                                   row_end_sides=tuple(_called(v, call) for v in sides[0]),
                                   corner_sides=tuple(_called(v, call) for v in sides[1]),
                                   row_sides=row_side_runs, bands=tuple(called(v) for v in bands),
                                   edge_sides=tuple(_called(v, call) for v in row_ends),
                                   face_rows=face_rows[0] if face_rows else None, short_edges=writes_own,
                                   prefetch=prefetch.plan(interior.function, grads))
        box = space["extents"] + "\n" + "\n".join(loops.interior_box(fn.tid_ndim, interior)) + "\n"
        inside = " && ".join(f"lo{k} <= i{k} && i{k} < hi{k}" for k in range(fn.tid_ndim))
        pick = f"if ({inside}) {interior.function.name}{call} else "
    else:
        nest = loops.plain_nest(fn.tid_ndim, fn.name + call, private, prelude, threshold)
    if writes_own:
        nest = (f"    if (!({loops.overlap_test(fn)})) {{\n{nest}    }} else {{\n"
                + loops.plain_nest(fn.tid_ndim, fn.name + call, private, prelude, threshold) + "    }\n")
    # the gather entry without every gradient: the instantiation with null checks, everywhere
    plain_nest = loops.plain_nest(fn.tid_ndim, f"{fn.name}_thread<{checked}>({tids}, L, A, G, tp);", private, prelude,
                                  threshold)
    if two_pass is not None:
        # the pointwise pass first, over every thread (an OpenMP loop ends with a barrier)
        first, first_interior = two_pass.pointwise, two_pass.pointwise_interior
        lines += _thread_function(first, debug, sites, target, adjoint, fn.name)
        if first_interior is not None:
            lines += hot_variant(first_interior.function)
            first_row, first_row_part = first_interior.row, None
            if first_row is not None:
                row_lines, first_row_part = _by_rows(first_row, fn, debug, sites, target, adjoint, fast)
                lines += row_lines
            # (GatherAdjoint.pointwise_sides and pointwise_row_sides: as the transposed pass's above)
            edge_sides, first_sides = two_pass.pointwise_sides or (None, None), []
            for variant in edge_sides:
                if variant is not None:
                    lines += _thread_function(variant.function, debug, sites, target, adjoint, fn.name, hot=True)
                    first_sides.append(variant)
            first_side_runs = _row_side_runs(two_pass.pointwise_row_sides, fn, debug, sites, target, adjoint, fast,
                                             grads, True, lines, first_sides)
            variants = [v.function for v in (first_interior, first_row, *first_sides) if v is not None]
            first_nest = loops.interior_nest(fn.tid_ndim, first.name + call, called(first_interior)[0],
                                             first_interior, private, row_prelude, threshold, first_row_part,
                                             independent=memory.independent(grads, first, *variants), row_run=True,
                                             row_sides=first_side_runs,
                                             edge_sides=tuple(_called(v, call) for v in edge_sides),
                                             prefetch=prefetch.plan(first_interior.function, grads))
        else:
            first_nest = loops.plain_nest(fn.tid_ndim, first.name + call, private, prelude, threshold)
        first_plain = loops.plain_nest(fn.tid_ndim, f"{first.name}_thread<{checked}>({tids}, L, A, G, tp);", private,
                                       prelude, threshold)
        logs_adds = memory.adds_into_memory(first, grads)
        if logs_adds:
            # what still scatters (a coefficient table's gradient) runs in the pointwise pass: a
            # deterministic launch logs its adds there, in the chunks the one-pass form and the GPU use
            logged_args = (fn.tid_ndim, threshold, fast, checked, tids, all_grads)
            first_nest = loops.either_logged(first_nest, first, *logged_args, tape=scratch.tape("0"))
            first_plain = loops.either_logged(first_plain, first, *logged_args, tape=scratch.tape("0"))
        apart = memory.passes_apart(first, fn) if fn.tid_ndim > 1 and not logs_adds else None
        if two_pass.reach is not None and apart is not None:
            nest = scratch.windowed(first_nest, nest, two_pass, fn.tid_ndim, apart, "in_order")
        else:       # (scopes: each pass its own box)
            nest = scratch.whole(two_pass, fn.tid_ndim) + "    {\n" + first_nest + "    }\n    {\n" + nest + "    }\n"
        plain_nest = scratch.whole(two_pass, fn.tid_ndim) + first_plain + plain_nest
    logged = ""
    if target is CPU and memory.adds_into_memory(fn):
        if not adjoint:
            logged = loops.logged_loop(fn.tid_ndim, threshold, f"{fn.name}_thread({tids}, L, A);", ("A",), "")
        elif entry_template is target.gather_entry:
            call_logged = loops.gather_call(fn, fast, checked, tids, all_grads,
                                            "sp::tape_t tp = {nullptr, 1, 0, 0, 0, 0, 0, fresh};")
            logged = loops.logged_loop(fn.tid_ndim, threshold, call_logged, ("A", "G"), "0")
        else:
            logged = loops.logged_loop(fn.tid_ndim, threshold,
                                       "sp::tape_t tp = {tape + t * capacity, 1, 0, capacity, count_only, 0, 0, "
                                       "fresh};\n"
                                       f"{fn.name}_thread<{checked}>({tids}, L, A, G, tp);\n"
                                       "if (count_only) counts[t] = tp.pos;\noverflow |= tp.overflow;",
                                       ("A", "G"), "overflow", reduction=True)
    entry = entry_template.format(
        name=fn.name, size=buffer_size(fn.params), threshold=threshold, block=CUDA_BLOCK_SIZE,
        min_blocks=_min_blocks(fn, entry_template is target.gather_entry), logged=logged, fast=fast, checked=checked,
        all_grads=runs_fast, nest=nest, plain_nest=plain_nest, box=box, pick=pick, **space)
    return "\n".join(lines) + "\n" + entry


def _min_blocks(fn: ir.Function, gather_entry: bool) -> int:
    """`__launch_bounds__`' second number for an entry running `fn`: more blocks for the gather
    form's passes, as many as their widest floating-point values leave registers for (at 32
    registers, float64 stencils spilled up to 1 KB a thread and builtin-vector adjoints 13 KB)."""
    if not gather_entry:
        return CUDA_MIN_BLOCKS_PER_SM
    widest = max((t.type.size for s in ir.walk(fn.body) for t in ir.defined_temps(s) if t.type.scalar.is_float),
                 default=4)
    return CUDA_GATHER_MIN_BLOCKS_PER_SM * 4 // widest if widest <= 8 else CUDA_MIN_BLOCKS_PER_SM


def _by_rows(row, fn: ir.Function, debug, sites, target: Target, adjoint: bool, template: str | None = None,
             independent: bool = False):
    """(the lines defining `row`'s thread function and its runner, the (call, variant) that
    interior_nest takes with `row_run`) for a variant of `interior.with_row`: a row part at a call of
    its own (cpu_loops.row_runner). `template`: an adjoint body's template arguments."""
    definition, run = loops.row_runner(row.function.name, fn.tid_ndim, fn.name, template, independent)
    return _thread_function(row.function, debug, sites, target, adjoint, fn.name, hot=True) + [definition], (run, row)


def _row_side_runs(row_sides, fn: ir.Function, debug, sites, target: Target, adjoint: bool, template, grads,
                   gather_entry: bool, lines: list, variants: list) -> list:
    """Per outer axis, (first, last) runs (interior_nest's `row_sides`) of `row_sides`' variants, a row
    at a call each (cpu_loops.row_runner); their definitions go to `lines` and the variants to
    `variants`. Only a gather entry's runners loop without alias tests (where `memory.independent`)."""
    side_runs = []
    for pair in row_sides:
        runs = []
        for variant in pair or (None, None):
            run = None
            if variant is not None:
                run_lines, run = _by_rows(variant, fn, debug, sites, target, adjoint, template,
                                          gather_entry and memory.independent(grads, variant.function))
                lines += run_lines
                variants.append(variant)
            runs.append(run)
        side_runs.append(tuple(runs))
    return side_runs


def _called(variant, call: str):
    """(the call of `variant`'s thread function, `variant`) as interior_nest takes a variant, or None."""
    return (variant.function.name + call, variant) if variant is not None else None


def _thread_function(fn: ir.Function, debug, sites, target: Target, adjoint: bool, args: str,
                     hot: bool = False, blend: bool = False, tables: dict | None = None) -> list[str]:
    # Adjoint bodies are templates on their gradient masks (see has_grad in prelude.h); the entry picks one.
    # An interior variant (`hot`) runs the middle of the launch, called from one place: inlined
    # into its loop always, which vectorises it. GCC's unit-growth limit otherwise stops inlining
    # in a module of large adjoints (a 2-D 8th-order forward ran 7x slower beside its adjoints).
    qualifier = target.thread_qualifier + (" inline __attribute__((always_inline))" if hot and target is CPU else "")
    signature = (("template <uint64_t KNOWN, uint64_t HAS> " if adjoint else "") +
                 f"{qualifier} void {fn.name}_thread(int32_t tid_0, int32_t tid_1, int32_t tid_2, "
                 f"int32_t tid_3, const launch_t& L, "
                 f"const {args}_args_t& A{f', const {args}_args_t& G, sp::tape_t& tp' if adjoint else ''}"
                 f"{f', const {args}_tables_t& T' if tables else ''})")
    em = FunctionEmitter(fn, debug=debug, sites=sites, tables=frozenset(tables or ()))
    body = em.body()
    if blend:          # selects as bit blends (sp::blend in prelude.h: the row variant's, on the CPU)
        body = [line.replace("sp::where(", "sp::blend(") for line in body]
    return [signature + " {", *em.params(adjoint), *em.declarations(), *body, "}"]
