"""`@kernel`: the pipeline from a Python function to loaded forward and adjoint entry points.

    Python source --frontend--> IR --verify--> adjoint IR --render--> C++ --build--> .so --load--> launch

Kernels of one Python module are rendered into one source and built together; the build is cached
on disk by content hash (backends.cpu_build), so a second process loads without compiling.
"""
from __future__ import annotations

import ctypes
import linecache
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from . import ir
from .backends import build_cpu_library, load_cpu_library
from .codegen.targets import render_cpu, render_cuda
from .errors import CompileError
from .frontend import Frontend
from .frontend.calls import namespace_of
from .passes import write_once
from .passes.adjoint import AdjointUnsupported, adjoint_function
from .passes.dce import eliminate_dead_code
from .passes.gather import GatherAdjoint, gather_adjoint
from .passes.identity_stores import IdentityStores, identity_stores
from .passes.in_place import in_place_pairs
from .passes.interior import Interior, at_own_index, interior_variant, tid_offsets, with_row
from .passes.near_faces import with_sides
from .passes.tangent import TangentUnsupported, tangent_function
from .passes.verify import verify
from .types import ArrayType

PRELUDE_DIR = Path(__file__).parent / "codegen"


@dataclass
class ArgumentUse:
    """How a kernel uses one array argument, computed at compile time (through inlined funcs)."""
    reads: bool = False
    stores: bool = False          # plain `a[i] = v`
    accumulates: bool = False     # `a[i] += v`, atomics
    adjoint_reads: bool = False   # read by @func_replay / @func_grad code only
    overwrites_read: ir.Loc | None = None   # a store that may overwrite a value the kernel read
    write_once_refusal: str | None = None   # why a store-and-load array is not provably write-once
    first_store: ir.Loc | None = None


def argument_uses(fn: ir.Function) -> dict[str, ArgumentUse]:
    """Reads, stores and accumulations of each array argument by the forward. Reads made only by
    the adjoint's replacement code (@func_replay, @func_grad) count as reads, not as conflicts."""
    uses = {p.name: ArgumentUse() for p in fn.params if isinstance(p.type, ArrayType)}
    used = {a.id for s in ir.walk(fn.body) for a in ir.used_operands(s) if isinstance(a, ir.Temp)}
    forward = {id(s) for s, _ in ir.forward_walk(fn.body)}
    for s in ir.walk(fn.body):
        if isinstance(s, ir.Load) and id(s) not in forward:
            uses[s.array.param.name].adjoint_reads = True
        elif isinstance(s, ir.Load):
            uses[s.array.param.name].reads = True
        elif isinstance(s, ir.Store):
            u = uses[s.array.param.name]
            u.stores = True
            u.first_store = u.first_store or s.loc
        elif isinstance(s, ir.Atomic):
            u = uses[s.array.param.name]
            u.accumulates = True
            if s.kind in ("min", "max") or (s.out is not None and s.out.id in used):
                u.reads = True
    conflicts = _overwrites_of_read_values(fn.body)
    # Recursions that write each element once and read it only after (ys[i, t] from ys[i, t - 1])
    # have an exact adjoint; write_once proves it or says why not.
    unproven = write_once.refusals(fn, conflicts)
    for name, loc in conflicts.items():
        if name in unproven:
            uses[name].overwrites_read = loc
            uses[name].write_once_refusal = unproven[name]
    return uses


def covered_outputs(fn: ir.Function, uses: dict[str, ArgumentUse]) -> frozenset:
    """The arrays every thread stores at its own index, unconditionally (a statement of the body's
    top level), and that the kernel never reads: a launch over such an array's shape writes each of
    its elements without looking at any, so a zero fill before it is never seen (the stepper skips
    s.next's, stepper/step/trace.py `StepTrace.covered`)."""
    offsets = tid_offsets(fn.body, fn.tid_ndim)
    stored = {s.array.param.name for s in fn.body
              if isinstance(s, ir.Store) and at_own_index(s.indices, offsets, fn.tid_ndim)}
    return frozenset(name for name in stored
                     if not (uses[name].reads or uses[name].accumulates or uses[name].adjoint_reads))


def _overwrites_of_read_values(body) -> dict[str, ir.Loc]:
    """Arrays whose stores may overwrite values the kernel read: a load before a store, or a store
    in a loop (a later iteration's load would see it). A load that only follows stores outside loops
    reads back what this thread wrote, which the adjoint's replay (it skips stores) sees as well."""
    loaded: set[str] = set()
    conflicts: dict[str, ir.Loc] = {}
    for s, in_loop in ir.forward_walk(body):
        if isinstance(s, ir.Load):
            loaded.add(s.array.param.name)
        elif isinstance(s, ir.Store) and (s.array.param.name in loaded or in_loop):
            conflicts.setdefault(s.array.param.name, s.loc)
    return {n: loc for n, loc in conflicts.items() if n in loaded}


def _and_rows(*interiors) -> list[Interior]:
    """`interiors` (None left out), their row variants (`interior.with_row`), row ends and face rows
    (`near_faces.with_sides`)."""
    return [v for i in interiors if i is not None
            for v in (i, i.row, *(i.row_ends or ()), *(v for pair in i.face_rows if pair for v in pair))
            if v is not None]


@dataclass
class Compiled:
    forward: ir.Function
    adjoint: ir.Function | None
    adjoint_error: AdjointUnsupported | None
    uses: dict[str, ArgumentUse]
    needs_tape: bool
    gather: GatherAdjoint | None = None     # the scatter-free adjoint, where the kernel has one
    interior: Interior | None = None        # the forward with its boundary tests settled
    identity: IdentityStores | None = None  # `out[tid] = in[tid]` stores, and the forward without them
    covers: frozenset = frozenset()         # see `covered_outputs`
    in_place: frozenset = frozenset()       # (input, output) arguments that may be one array: `in_place_pairs`

    @cached_property
    def adjoint_loads(self) -> frozenset:
        """The array arguments whose values an adjoint reads (any form of it that may run: the
        scatter one, the gather form, its interior variant and its pointwise pass; the pointwise
        pass's interior variant only leaves out what its pass reads). A recording kept for later keeps
        only the state its reversal reads (stepper/execute/fast/native_reverse.py). Cached: every
        traced step asks, per launch and argument, and walking the forms cost a small model's
        gradient a tenth of its time."""
        forms = (self.adjoint, *((self.gather.function, self.gather.interior.function, self.gather.pointwise)
                                 if self.gather else ()))
        return frozenset(s.array.param.name for fn in forms if fn is not None for s in ir.walk(fn.body)
                         if isinstance(s, (ir.Load, ir.Atomic)) and not s.array.adjoint)

    def functions(self) -> tuple:
        """What the module renders for this kernel: the forward, its interior variant, the adjoint,
        its gather form and the forward without its identity stores."""
        return self.forward, self.interior, self.adjoint, self.gather, self.identity


class Kernel:
    """A compiled-on-first-use kernel. Launch it with `launch(kernel, dim, inputs, outputs)`."""

    def __init__(self, fn, module: "KernelModule"):
        self.fn = fn
        self.key = fn.__name__
        self.module = module
        self.__name__ = fn.__name__
        self.__qualname__ = fn.__qualname__
        self.__doc__ = fn.__doc__
        self._compiled: Compiled | None = None

    def compiled(self) -> Compiled:
        if self._compiled is None:
            forward = self._forward_ir()
            forward = ir.Function(self.c_name, forward.params, forward.body, forward.loc, forward.tid_ndim)
            verify(forward)
            adjoint, error = None, None
            try:
                adjoint = adjoint_function(forward)
                verify(adjoint, single_definition=False)
            except AdjointUnsupported as e:
                error = e
            needs_tape = adjoint is not None and any(isinstance(s, ir.Push) for s in ir.walk(adjoint.body))
            gather = gather_adjoint(adjoint) if adjoint is not None else None
            if adjoint is not None and not needs_tape:
                # (after the gather form, which is built from the whole replay): what only the
                # skipped stores used goes, so `adjoint_loads` names what an adjoint needs. A loop
                # tape's adjoint stays whole: its count pass sizes the tape from the replay.
                adjoint = eliminate_dead_code(adjoint)
            if gather is not None:
                verify(gather.function, single_definition=False)
                verify(gather.interior.function, single_definition=False)
                if gather.pointwise is not None:
                    verify(gather.pointwise, single_definition=False)
            interior = with_row(interior_variant(forward, forward.name + "_interior"), forward)
            interior = with_sides(interior, forward)
            uses = argument_uses(forward)
            identity = identity_stores(forward, uses)
            if identity is not None:
                verify(identity.function)
            for variant in _and_rows(interior, identity.interior if identity is not None else None):
                verify(variant.function)
            self._compiled = Compiled(forward, adjoint, error, uses, needs_tape, gather, interior, identity,
                                      covered_outputs(forward, uses), in_place_pairs(forward))
        return self._compiled

    def _forward_ir(self) -> ir.Function:
        return Frontend(self.fn.__name__).kernel(self.fn, namespace_of(self.fn))

    def tangent(self) -> "Kernel":
        """The forward-mode kernel of this one (`TangentKernel`), made on first use."""
        if self.__dict__.get("_tangent") is None:
            name = self.module.name + ":tangent"
            self._tangent = TangentKernel(self, _MODULES.setdefault(name, KernelModule(name)))
            self._tangent.module.add(self._tangent)
        return self._tangent

    @property
    def c_name(self) -> str:
        return f"k{self.module.index_of(self)}_{self.fn.__name__}"

    @property
    def params(self) -> tuple[ir.Param, ...]:
        return self.compiled().forward.params

    def entry(self, debug: bool = False):
        return self.module.library(debug)

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"kernel {self.__name__} is launched with launch({self.__name__}, dim, inputs, outputs), "
                           "not called")

    def __repr__(self) -> str:
        return f"<kernel {self.fn.__module__}.{self.__qualname__}>"


class TangentKernel(Kernel):
    """The tangent (forward mode) of a kernel: its parameters, then a tangent for each float one
    (passes/tangent.py); a kernel like any other, with an adjoint of its own (reverse over forward)."""

    def __init__(self, base: Kernel, module: "KernelModule"):
        super().__init__(base.fn, module)
        self.base = base
        self.__name__ = base.__name__ + "_tangent"

    def _forward_ir(self) -> ir.Function:
        try:
            return tangent_function(self.base.compiled().forward)
        except TangentUnsupported as e:
            line = linecache.getline(e.loc.filename, e.loc.lineno).rstrip("\n")
            raise CompileError(f"kernel '{self.base.__name__}' has no tangent: {e}", e.loc.filename,
                               e.loc.lineno, e.loc.col, line) from None

    @property
    def c_name(self) -> str:
        return f"k{self.module.index_of(self)}_{self.fn.__name__}_tangent"


@dataclass
class KernelModule:
    """All kernels defined in one Python module, built into one shared library."""
    name: str
    kernels: list[Kernel] = field(default_factory=list)
    _libraries: dict = field(default_factory=dict)

    def add(self, kernel: Kernel) -> None:
        self.kernels.append(kernel)
        self._libraries.clear()     # a later kernel joins the module: rebuild on next launch

    def index_of(self, kernel: Kernel) -> int:
        return self.kernels.index(kernel)

    def render(self, debug: bool, target: str = "cpu"):
        """The module's source for `target` ("cpu": C++ for the system compiler, "cuda": CUDA C++
        for NVRTC)."""
        # A kernel that does not compile raises when it is launched; it must not break its neighbours.
        ready = []
        for k in self.kernels:
            try:
                ready.append(k.compiled())
            except Exception:
                continue
        render = {"cpu": render_cpu, "cuda": render_cuda}[target]
        return render([c.functions() for c in ready], debug)

    def library(self, debug: bool):
        if debug not in self._libraries:
            rendered = self.render(debug)
            safe = "".join(c if c.isalnum() else "_" for c in self.name)[-40:]
            path = build_cpu_library(rendered.source, f"{safe}{'_debug' if debug else ''}",
                                     include_dirs=[PRELUDE_DIR],
                                     what=f"kernel module '{self.name}' ({len(self.kernels)} kernels)")
            self._libraries[debug] = LoadedModule(load_cpu_library(path), rendered.sites)
        return self._libraries[debug]


class LoadedModule:
    def __init__(self, lib: ctypes.CDLL, sites):
        self.lib = lib
        self.sites = sites
        self.error_site = ctypes.c_int.in_dll(lib, "sp_error_site")
        self.error_index = (ctypes.c_longlong * 4).in_dll(lib, "sp_error_index")
        self._functions = {}

    def function(self, name: str, adjoint: bool):
        """The entry point of IR function `name`: a forward (``fn(buffer, serial)``) or an adjoint
        entry (``fn(buffer, adj_buffer, tape, capacity, count_only, counts, serial)``)."""
        key = (name, adjoint)
        if key not in self._functions:
            f = getattr(self.lib, name if adjoint else name + "_forward")
            if adjoint:
                f.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int,
                              ctypes.c_void_p, ctypes.c_int]
                f.restype = ctypes.c_int
            else:
                f.argtypes = [ctypes.c_char_p, ctypes.c_int]
                f.restype = None
            self._functions[key] = f
        return self._functions[key]


_MODULES: dict[str, KernelModule] = {}


def kernel(fn) -> Kernel:
    """Compile `fn` as a kernel: one thread per launch index, `tid()` gives the index.

    Example::

        @stepper.kernel
        def saxpy(a: float, x: stepper.array(dtype=float), y: stepper.array(dtype=float)):
            i = stepper.tid()
            y[i] = a * x[i] + y[i]
    """
    module = _MODULES.setdefault(fn.__module__, KernelModule(fn.__module__))
    k = Kernel(fn, module)
    module.add(k)
    return k
