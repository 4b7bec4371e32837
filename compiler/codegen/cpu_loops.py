"""The CPU entries' loop nests: how an entry point walks a launch's index space around a thread
body (codegen/targets.py renders the bodies and the entries' fixed parts).

- `index_space`: template pieces for `ndim` indices (extents, loops, the flat index, the GPU's
  decomposition of a grid-stride index);
- `plain_nest` / `interior_nest`: OpenMP over the outer indices, the innermost loop whole in each
  thread; with an interior variant each row runs in three parts (edges, the box, edges);
- `logged_loop`: a deterministic launch's adds into a few elements, logged per fixed chunk.
"""
from __future__ import annotations

from .. import ir
from ..passes.in_place import in_place_pairs
from ..passes.near_faces import margin
from ..passes.selects import written_arrays
from ..types import ArrayType
from .emit import arg_name
from .prefetch import blocked
from .threads import parallel_threshold

def index_space(ndim: int) -> dict:
    """Template pieces that walk a launch as `ndim` indices (what the kernel's tid() unpacks): the
    extents (one launch dimension per index: packing._dims folds a launch's extra leading axes into
    the first), a CPU loop nest, the flat index for the tape, and the CUDA decomposition of a
    grid-stride index."""
    rest = " * ".join(f"L.dim[{k}]" for k in range(1, ndim)) or "1"
    extents = [f"    const int32_t e0 = (int32_t)(L.n / ({rest}));",
               # the rows of the first axis this call runs (all of them but in a launch run in parts)
               f"    const int32_t r0 = (int32_t)(L.first / ({rest})), r1 = (int32_t)(L.end / ({rest}));"]
    extents += [f"    const int32_t e{k} = (int32_t)L.dim[{k}];" for k in range(1, ndim)]
    loops = "".join(f"{'    ' * (k + 1)}for (int32_t i{k} = {_start(k)}; i{k} < {_stop(k)}; ++i{k}) {{\n"
                    for k in range(ndim))
    closing = "".join(f"{'    ' * (k + 1)}}}\n" for k in reversed(range(ndim)))
    flat = "(int64_t)i0"
    for k in range(1, ndim):
        flat = f"({flat} * e{k} + i{k})"
    decompose = ["        int64_t r_ = t;"]
    for k in reversed(range(1, ndim)):
        decompose.append(f"        const int32_t i{k} = (int32_t)(r_ % L.dim[{k}]); r_ /= L.dim[{k}];")
    decompose.append("        const int32_t i0 = (int32_t)r_;")
    return {"extents": "\n".join(extents), "loops": loops, "closing": closing, "flat": flat,
            # Threads share out the outer indices; the innermost loop stays whole in each thread, so it
            # is a plain counted loop the compiler can vectorise (collapsing it too made the loop
            # recover its indices per element: 3.7x slower on a 256 x 256 streaming kernel).
            "collapse": f"collapse({ndim - 1}) " if ndim > 2 else "", "decompose": "\n".join(decompose),
            "tids": ", ".join(f"i{k}" if k < ndim else "0" for k in range(4))}


def _start(axis: int) -> str:
    return "r0" if axis == 0 else "0"


def _stop(axis: int) -> str:
    return "r1" if axis == 0 else f"e{axis}"


def gather_call(fn: ir.Function, fast: str, checked: str, tids: str, all_grads: str, tape: str) -> str:
    """One thread of gather-form pass `fn`, with adds logged (`tape`: the C++ declaring its tape
    `tp`, over a two-pass form's scratch memory (scratch.tape) or none)."""
    return (f"{tape}\n"
            f"if ({all_grads}) {fn.name}_thread<{fast}>({tids}, L, A, G, tp);\n"
            f"else {fn.name}_thread<{checked}>({tids}, L, A, G, tp);")


def either_logged(nest: str, fn: ir.Function, ndim: int, threshold: int, fast: str, checked: str, tids: str,
                   all_grads: str, tape: str) -> str:
    """`nest`, or with serial flag 2 the same pass `fn` over logged chunks (see logged_loop)."""
    body = gather_call(fn, fast, checked, tids, all_grads, tape)
    return logged_loop(ndim, threshold, body, ("A", "G"), None) + "    else {\n" + nest + "    }\n"


def logged_loop(ndim: int, threshold: int, body: str, private, result: str | None,
                 reduction: bool = False) -> str:
    """The CPU entry's deterministic path for adds into a few elements (serial flag 2): fixed chunks
    of the index space, each logging its adds (add_log in prelude.h), applied in chunk order; shared
    out among threads from `threshold` threads on, and run by one below it in the same order (the
    same bits, and float32 elements still get double partials). The entry returns `result` after
    it, or with None goes on to its next pass."""
    space = index_space(ndim)
    inner = "\n".join("                " + line for line in body.split("\n"))
    ending = f"\n        return {result};" if result is not None else ""
    return f"""    if (serial == 2) {{
        const int64_t chunks = (L.end - L.first + sp::ADD_CHUNK - 1) / sp::ADD_CHUNK;
        std::vector<sp::add_log> logs(chunks);
        #pragma omp parallel for schedule(static) firstprivate({', '.join(private)}){' reduction(|:overflow)' if reduction else ''} if (L.n >= {threshold})
        for (int64_t c = 0; c < chunks; ++c) {{
            sp::adds_log = &logs[c];
            const int64_t first = L.first + c * sp::ADD_CHUNK, end = first + sp::ADD_CHUNK < L.end ? first + sp::ADD_CHUNK : L.end;
            for (int64_t t = first; t < end; ++t) {{
{space["decompose"].replace("        ", "                ")}
{inner}
            }}
            sp::adds_log = nullptr;
        }}
        for (const auto& log : logs) log.apply();{ending}
    }}
"""


def _share(private, threshold: int) -> str:
    return (f"#pragma omp parallel for {{collapse}}schedule(static) firstprivate({', '.join(private)}) "
            f"if (L.n >= {threshold} && !serial)\n")


def plain_nest(ndim: int, call: str, private, prelude: str, threshold: int) -> str:
    """The CPU loop nest: threads share out the outer indices (see index_space)."""
    space = index_space(ndim)
    pad = "    " * (ndim + 1)
    return ("    " + _share(private, threshold).format(collapse=space["collapse"]) + space["loops"]
            + (f"{pad}{prelude}\n" if prelude else "") + f"{pad}{call}\n" + space["closing"])


def interior_nest(ndim: int, edge: str, middle: str, interior, private, prelude: str, threshold: int,
                   row=None, independent: bool = False, row_end=None, settled=None, corner=None,
                   row_run: bool = False, row_end_sides=None, corner_sides=None, row_sides=(),
                   bands=(None, None), edge_sides=(None, None), face_rows=(), short_edges: bool = False,
                   prefetch=None) -> str:
    """The CPU loop nest of an entry with an interior variant: the box [lo_k, hi_k) per axis is
    evaluated once; each row of the innermost index runs in three parts, the edges through `edge`
    and the part inside the box through `middle` (a row outside the box runs `edge` throughout, or
    with `row` = (call, its Interior), a row variant, that in the row's box; with `row_run` the call
    runs the whole part itself, from index a to b: see row_runner).
    `row_end` = (call, its Interior): a gather form's variant for the edges of the rows whose outer
    indices lie in its box (settled along those axes, clamped along the innermost).
    `corner`: a call of a gather form's branch-free `edge` (GatherAdjoint.corner), which the rows
    outside `row_end`'s box run at their ends in vector loops.
    `row_end_sides`, `corner_sides`: (first, last), each (call, its Interior) or None: those two
    settled over a row's first threads and its last ones (GatherAdjoint.row_end_sides), run there
    instead. `row_sides`: per outer axis the same for `row` (GatherAdjoint.row_sides), run in the
    first and last rows along that axis, each a call that runs the row's part (see row_runner).
    `bands`: (first, last), each (call, its Interior) or None: `middle` settled over the threads of
    a `settled` row before and after its box (GatherAdjoint.bands), run there instead.
    `edge_sides`: (first, last) as `row_end_sides`, for `edge` itself where there is no `row_end`
    (a two-pass form's pointwise pass: GatherAdjoint.pointwise_sides).
    `short_edges`: `edge_sides` cover a row's ends but for a stencil radius (a forward's): their loops
    keep the alias tests' plain form, too short to gain from vectors (with `independent`'s hint a
    3-D 64^3 2nd-order forward ran 1.4x slower: each row set up vector loops for one thread).
    `face_rows`: (first, last), each (call, its Interior) or None: a forward's variants for the
    first and last rows along the first axis, valid along whole rows (Interior.face_rows), each
    call running a row from index a to b (see row_runner), run over every row their boxes hold.
    `settled` = (call, its Interior): a gather form's variant for a box inside the interior's (see
    GatherAdjoint.settled); a row inside it runs that in its part of the box, `middle` around it.
    `independent`: no thread writes memory another reads or writes (see SP_INDEPENDENT in
    prelude.h); the middle runs vectorise without alias tests, the runs at a row's ends and its
    bands eight lanes a vector where they are at least SHORT_RUN_THREADS long (SP_SHORT_RUN).
    `prefetch`: `middle`'s prefetch.plan, where it streams rows ahead: where the launch's test
    holds, the middle runs of rows without a settled box run in blocks that prefetch the next
    row's (prefetch.blocked)."""
    box = interior_box(ndim, interior)
    settled = settled if ndim > 1 else None
    if settled is not None:
        box += [line for a in range(ndim) for line in _axis_box(a, settled[1], f"slo{a}", f"shi{a}")]
    if row is not None and ndim > 1:
        box += _axis_box(ndim - 1, row[1], "rlo", "rhi")
    row_end = row_end if ndim > 1 else None
    if row_end is not None:
        box += [line for a in range(ndim - 1) for line in _axis_box(a, row_end[1], f"elo{a}", f"ehi{a}")]
    k = ndim - 1
    pad = "    " * (k + 1)
    hint = "SP_INDEPENDENT " if independent and k > 0 else ""    # (one index: the middle run is OpenMP's loop)
    # a row's ends and its bands run a stencil radius of threads: from four on, in vectors of eight
    radius = margin(interior, k)
    short = "SP_SHORT_RUN " if hint and radius is not None and radius.const >= SHORT_RUN_THREADS else hint
    first_edge = f"for (int32_t i{k} = {_start(k)}; i{k} < a; ++i{k}) "
    last_edge = f"for (int32_t i{k} = b; i{k} < {_stop(k)}; ++i{k}) "
    middle_loop = f"{hint}for (int32_t i{k} = a; i{k} < b; ++i{k}) {middle}"
    if prefetch is not None and k > 0:
        test, setup, prefetches, block = prefetch
        box.append(f"    const bool pf = {test};")
        middle_loop = f"if (pf) {{ {blocked(k, hint, middle, block, setup, prefetches)} }} else {{ {middle_loop} }}"
    runs = [f"{pad}{first_edge}{edge}", f"{pad}{middle_loop}", f"{pad}{last_edge}{edge}"]
    if row_end is None and any(edge_sides):
        for side, variant in zip("fl", edge_sides):
            if variant is not None:
                box += _axis_box(k, variant[1], f"p{side}lo", f"p{side}hi")
        edge_hint = "" if short_edges else short
        runs[0], runs[2] = (f"{pad}{{ {_sided_run(k, edge_hint, edge, edge_sides, 'p', bound, first)} }}"
                            for bound, first in (("a", True), ("b", False)))
    if row_end is not None:
        # the row-end variant is branch-free and inlined: with `independent` its few threads a row
        # run as one vector loop (2-D and 3-D 8th-order adjoints 7-15% faster than one call a thread)
        ends = (short, corner) if corner is not None else ("", edge)
        sides = [row_end_sides, corner_sides if corner is not None else None]
        for tag, pair in zip("rc", sides):
            for side, variant in zip("fl", pair or ()):
                if variant is not None:
                    box += _axis_box(k, variant[1], f"{tag}{side}lo", f"{tag}{side}hi")
        for at, (bound, first) in ((0, ("a", True)), (2, ("b", False))):
            inside, outside = (_sided_run(k, ends_hint, call, pair, tag, bound, first)
                               for ends_hint, call, pair, tag in ((short, row_end[0], sides[0], "r"),
                                                                  (*ends, sides[1], "c")))
            runs[at] = f"{pad}if (emid) {{ {inside} }} else {{ {outside} }}"
    if k == 0:
        # one index: the middle run alone is shared out among threads; the box is cut to the rows run
        lines = ["    {", f"    {prelude}" if prelude else "",
                 "    const int32_t a = (int32_t)(lo0 < r0 ? r0 : lo0 > r1 ? r1 : lo0), "
                 "b = (int32_t)(hi0 < a ? a : hi0 > r1 ? r1 : hi0);",
                 runs[0], "    " + _share(private + (("tp",) if prelude else ()), threshold).format(collapse=""),
                 runs[1], runs[2], "    }"]
        return "\n".join(box + [line for line in lines if line]) + "\n"
    mid = " && ".join(f"lo{a} <= i{a} && i{a} < hi{a}" for a in range(k))
    outer = "".join(f"{'    ' * (a + 1)}for (int32_t i{a} = {_start(a)}; i{a} < {_stop(a)}; ++i{a}) {{\n"
                    for a in range(k))
    closing = "".join(f"{'    ' * (a + 1)}}}\n" for a in reversed(range(k)))
    if settled is not None:
        inside = " && ".join(f"slo{a} <= i{a} && i{a} < shi{a}" for a in range(k))
        first_band, last_band = bands
        for side, band in (("f", first_band), ("l", last_band)):
            if band is not None:
                box += _axis_box(k, band[1], f"b{side}lo", f"b{side}hi")
        before = f"{hint}for (int32_t i{k} = a; i{k} < sa; ++i{k}) {middle} "
        if first_band is not None:
            before = (f"const int32_t bf = (int32_t)(bfhi < a ? a : bfhi > sa ? sa : bfhi); "
                      f"{short}for (int32_t i{k} = a; i{k} < bf; ++i{k}) {first_band[0]} "
                      f"{hint}for (int32_t i{k} = bf; i{k} < sa; ++i{k}) {middle} ")
        after = f"{hint}for (int32_t i{k} = sb; i{k} < b; ++i{k}) {middle}"
        if last_band is not None:
            after = (f"const int32_t bl = (int32_t)(bllo < sb ? sb : bllo > b ? b : bllo); "
                     f"{hint}for (int32_t i{k} = sb; i{k} < bl; ++i{k}) {middle} "
                     f"{short}for (int32_t i{k} = bl; i{k} < b; ++i{k}) {last_band[0]}")
        split = (f"const int32_t sa = (int32_t)(slo{k} < a ? a : slo{k} > b ? b : slo{k}), "
                 f"sb = (int32_t)(shi{k} < sa ? sa : shi{k} > b ? b : shi{k}); "
                 f"{before}{hint}for (int32_t i{k} = sa; i{k} < sb; ++i{k}) {settled[0]} {after}")
        # (the settled box lies inside the interior's: its rows are `mid` ones)
        middle_run = f"if ({inside}) {{ {split} }} else {{ {middle_loop} }}"
        runs[1] = f"{pad}{middle_run}"
    else:
        middle_run = middle_loop
    if row is not None:
        row_part = row[0] if row_run else f"{hint}for (int32_t i{k} = a; i{k} < b; ++i{k}) {row[0]}"
        for axis, pair in reversed(list(enumerate(row_sides))):     # the first axis's tested first
            for side, variant in reversed(list(zip("fl", pair))):
                if variant is None:
                    continue
                box += _axis_box(axis, variant[1], f"q{axis}{side}lo", f"q{axis}{side}hi")
                inside = f"i{axis} < q{axis}fhi" if side == "f" else f"i{axis} >= q{axis}llo"
                row_part = f"if ({inside}) {{ {variant[0]} }} else {{ {row_part} }}"
        runs[1] = f"{pad}if (mid) {{ {middle_run} }}\n{pad}else {{ {row_part} }}"
    emid = " && ".join(f"elo{a} <= i{a} && i{a} < ehi{a}" for a in range(k))
    rest = [f"{pad}const bool mid = {mid};", *([f"{pad}const bool emid = {emid};"] if row_end is not None else []),
            f"{pad}const int32_t a = mid ? (int32_t)lo{k} : {'(int32_t)rlo' if row else f'e{k}'}, "
            f"b = mid ? (int32_t)hi{k} : {'(int32_t)rhi' if row else f'e{k}'};", *runs]
    # (face rows run in loops of their own before and after the nest's, which runs the rows
    # between: calls in its loop made the 2-D 296^2 8th-order FWI forward 15% slower, the middle
    # reloading what they clobber)
    first_rows, last_rows = face_rows or (None, None)
    for side, variant in (("f", first_rows), ("l", last_rows)):
        if variant is not None:
            box += _axis_box(0, variant[1], f"w{side}lo", f"w{side}hi")
    inner = ([f"{pad}{prelude}"] if prelude else []) + rest
    collapse = f"collapse({k}) " if k > 1 else ""
    if first_rows is not None or last_rows is not None:
        box += ["    const int32_t m0 = " + ("(int32_t)(wfhi < r0 ? r0 : wfhi > r1 ? r1 : wfhi);" if first_rows
                                            else "r0;"),
                "    const int32_t m1 = " + ("(int32_t)(wllo < m0 ? m0 : wllo > r1 ? r1 : wllo);" if last_rows
                                            else "r1;")]
        if first_rows is not None:
            box.append(_face_loop(k, first_rows, "r0", "m0", private, prelude))
        if last_rows is not None:
            closing += _face_loop(k, last_rows, "m1", "r1", private, prelude)
        outer = outer.replace("i0 = r0; i0 < r1;", "i0 = m0; i0 < m1;", 1)
    return ("\n".join(box) + "\n    " + _share(private, threshold).format(collapse=collapse) + outer
            + "\n".join(inner) + "\n" + closing)


# The fewest threads at a row's end (see SP_SHORT_RUN in prelude.h) that its loops run in vectors of
# eight: an epilogue of four lanes runs four to seven of them. Shorter ones ran slower with the pragma
# (2-D 512^2 4th-order FWI adjoint 285 -> 331 us), the loop set up for lanes it never fills.
SHORT_RUN_THREADS = 4


def _face_loop(k: int, run, lo: str, hi: str, private, prelude: str) -> str:
    """The rows i0 in [lo, hi), whole, through face-row variant `run` (call, its Interior), each
    after `prelude`, shared out among threads where the variant's own work pays for it (a row of
    an FWI step's face stores zeros: a fork for a few rows of those cost more than it split)."""
    threshold = parallel_threshold(run[1].function)
    rows = " * ".join([f"(int64_t)({hi} - {lo})", *(f"e{a}" for a in range(1, k + 1))])
    loops = "".join(f"for (int32_t i{a} = {lo if a == 0 else 0}; i{a} < {hi if a == 0 else f'e{a}'}; ++i{a}) "
                    for a in range(k))
    collapse = f"collapse({k}) " if k > 1 else ""
    return (f"    #pragma omp parallel for {collapse}schedule(static) firstprivate({', '.join(private)}) "
            f"if ({rows} >= {threshold} && !serial)\n"
            f"    {loops}{{ {prelude + ' ' if prelude else ''}const int32_t a = 0, b = e{k}; {run[0]} }}\n")


def _sided_run(k: int, hint: str, call: str, sides, tag: str, bound: str, first: bool) -> str:
    """The loop over a row's first threads (i < `bound`) or its last ones (i >= `bound`) running
    `call`, or `sides` (first, last) where their boxes (see interior_nest) cover them."""
    side = sides[0 if first else 1] if sides else None
    if first:
        if side is None:
            return f"{hint}for (int32_t i{k} = {_start(k)}; i{k} < {bound}; ++i{k}) {call}"
        return (f"const int32_t f = (int32_t)({tag}fhi < {bound} ? {tag}fhi : {bound}); "
                f"{hint}for (int32_t i{k} = {_start(k)}; i{k} < f; ++i{k}) {side[0]} "
                f"{hint}for (int32_t i{k} = f; i{k} < {bound}; ++i{k}) {call}")
    if side is None:
        return f"{hint}for (int32_t i{k} = {bound}; i{k} < {_stop(k)}; ++i{k}) {call}"
    return (f"const int32_t l = (int32_t)({tag}llo > {bound} ? {tag}llo : {bound}); "
            f"{hint}for (int32_t i{k} = {bound}; i{k} < l; ++i{k}) {call} "
            f"{hint}for (int32_t i{k} = l; i{k} < {_stop(k)}; ++i{k}) {side[0]}")


def row_runner(name: str, ndim: int, args: str, template: str | None = None,
               independent: bool = False) -> tuple[str, str]:
    """(the definition, a call in interior_nest) of `{name}_run`: thread function `name` over one
    row's part from index a to b, as a function of its own that is never inlined, so that the loop
    nest's register allocation stays the middle's (inlined beside it, a forward's row variant
    made the 2-D 512^2 8th-order FWI forward 20% slower: the middle loop reloaded spilled row
    pointers). `template`: an adjoint body's template arguments (it takes G and tp too).
    `independent`: as interior_nest's (the row's loop vectorises without alias tests)."""
    k = ndim - 1
    outer = ", ".join(f"int32_t i{a}" for a in range(k))
    tids = ", ".join(f"i{a}" if a < ndim else "0" for a in range(4))
    grads = f", const {args}_args_t G, const sp::tape_t& row_tp" if template else ""
    call_args = "L, A, G, tp" if template else "L, A"
    # (its arguments by value: a copy the row's stores cannot alias, so their loads leave the loop;
    # the tape a copy too: through a reference, a 3-D gather's rows ran 1.7x slower)
    definition = (f"static __attribute__((noinline)) void {name}_run({outer}, int32_t a, int32_t b, const launch_t L, "
                  f"const {args}_args_t A{grads}) {{\n    {'sp::tape_t tp = row_tp; ' if template else ''}"
                  f"{'SP_INDEPENDENT ' if independent else ''}"
                  f"for (int32_t i{k} = a; i{k} < b; ++i{k}) "
                  f"{name}_thread{f'<{template}>' if template else ''}({tids}, {call_args});\n}}")
    call = f"{name}_run({', '.join(f'i{a}' for a in range(k))}, a, b, {call_args});"
    return definition, call


def overlap_test(fn: ir.Function) -> str:
    """A C++ test of whether an array `fn` stores to shares memory with another of its arrays (a
    forward that `writes_own_elements` runs its loops without alias tests where none does), except
    where the two are one array and may be (`in_place_pairs`)."""
    arrays = [p for p in fn.params if isinstance(p.type, ArrayType)]
    stored = written_arrays(fn.body)
    in_place = in_place_pairs(fn)

    def test(a, b) -> str:
        overlap = f"sp::overlap(A.{arg_name(a.name)}, {a.type.ndim}, A.{arg_name(b.name)}, {b.type.ndim})"
        if (b.name, a.name) in in_place:
            return f"({overlap} && !sp::same(A.{arg_name(a.name)}, A.{arg_name(b.name)}, {a.type.ndim}))"
        return overlap
    return " || ".join(test(a, b) for a in arrays if a.name in stored for b in arrays if b is not a) or "false"


def interior_box(ndim: int, interior) -> list[str]:
    """C++ lines that set the interior box [lo_k, hi_k) per axis from the variant's bounds,
    clamped to the launch's extents e_k (an empty box where the bounds cross)."""
    return [line for k in range(ndim) for line in _axis_box(k, interior, f"lo{k}", f"hi{k}")]


def _axis_box(k: int, interior, lo: str, hi: str) -> list[str]:
    box = [f"    int64_t {lo} = 0, {hi} = e{k};"]
    box += [f"    {{ const int64_t v = {_bound_cpp(b)}; if (v > {lo}) {lo} = v; }}" for b in interior.lower[k]]
    box += [f"    {{ const int64_t v = {_bound_cpp(b)}; if (v < {hi}) {hi} = v; }}" for b in interior.upper[k]]
    return box + [f"    if ({lo} > e{k}) {lo} = e{k};", f"    if ({hi} < {lo}) {hi} = {lo};"]


def _bound_cpp(bound) -> str:
    """A `compiler.interior.Bound` as a C++ int64 expression over the entry's A and extents."""
    def term(t) -> str:
        if t[0] == "dim":
            return f"A.{arg_name(t[1])}.shape[{t[2]}]"
        if t[0] == "scalar":
            return f"(int64_t)A.{arg_name(t[1])}"
        return f"(int64_t)e{t[1]}"
    return "(int64_t)" + str(bound.const) + "".join(
        (" + " if c > 0 else " - ") + (f"{abs(c)} * " if abs(c) != 1 else "") + term(t) for c, t in bound.terms)
