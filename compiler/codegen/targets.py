"""Target tables: what differs between the CPU and CUDA renderings of the same emitted body.

A module is the forward and adjoint of every kernel of one Python module. Entry points take one
packed argument buffer (launch_t header + argument slots, see emit.arg_offsets) so a launch is a
single foreign call.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import ir
from .emit import FunctionEmitter

CPU_HEADER = """#include "prelude.h"
extern "C" { int sp_error_site = -1; long long sp_error_index[4] = {0, 0, 0, 0}; }
static void report_out_of_bounds(int site, int64_t i, int64_t j, int64_t k, int64_t l) {
    int expected = -1;
    if (__atomic_compare_exchange_n(&sp_error_site, &expected, site, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
        sp_error_index[0] = i; sp_error_index[1] = j; sp_error_index[2] = k; sp_error_index[3] = l;
    }
}
"""

# Below this many threads OpenMP's fork/join costs more than the work.
PARALLEL_THRESHOLD = 4096


@dataclass
class RenderedModule:
    source: str
    sites: list          # (kernel name, array name, Loc) for each bounds-checked access


def render_cpu(kernels: list[tuple[ir.Function, ir.Function | None]], debug: bool) -> RenderedModule:
    sites: list = []
    parts = [CPU_HEADER]
    for forward, adjoint in kernels:
        parts.append(_cpu_forward(forward, debug, sites))
        if adjoint is not None:
            parts.append(_cpu_adjoint(adjoint, debug, sites))
    return RenderedModule("\n".join(parts), sites)


def _thread_function(fn: ir.Function, debug, sites, signature: str, adjoint: bool) -> str:
    em = FunctionEmitter(fn, debug=debug, sites=sites)
    lines = [signature + " {"]
    lines += em.params(adjoint)
    lines += em.thread_indices()
    lines += em.declarations()
    lines += em.body()
    lines.append("}")
    return "\n".join(lines)


def _cpu_forward(fn: ir.Function, debug, sites) -> str:
    name = fn.name
    body = _thread_function(fn, debug, sites,
                            f"static void {name}_thread(int64_t flat_, const launch_t& L, const char* args)", False)
    return f"""{body}
extern "C" void {name}_forward(const char* buf, int serial) {{
    const launch_t& L = *(const launch_t*)buf;
    const char* args = buf + sizeof(launch_t);
    #pragma omp parallel for schedule(static) if (L.n >= {PARALLEL_THRESHOLD} && !serial)
    for (int64_t t = 0; t < L.n; ++t) {name}_thread(t, L, args);
}}
"""


def _cpu_adjoint(fn: ir.Function, debug, sites) -> str:
    name = fn.name
    body = _thread_function(fn, debug, sites,
                            f"static void {name}_thread(int64_t flat_, const launch_t& L, const char* args, "
                            "const char* adj_args, sp::tape_t& tp)", True)
    return f"""{body}
extern "C" int {name}(const char* buf, const char* adj_args, uint64_t* tape, int64_t capacity, int count_only,
                      int64_t* counts, int serial) {{
    const launch_t& L = *(const launch_t*)buf;
    const char* args = buf + sizeof(launch_t);
    int overflow = 0;
    #pragma omp parallel for schedule(static) reduction(|:overflow) if (L.n >= {PARALLEL_THRESHOLD} && !serial)
    for (int64_t t = 0; t < L.n; ++t) {{
        sp::tape_t tp = {{tape + t, L.n, 0, capacity, count_only, 0}};
        {name}_thread(t, L, args, adj_args + sizeof(launch_t), tp);
        if (count_only) counts[t] = tp.pos;
        overflow |= tp.overflow;
    }}
    return overflow;
}}
"""
