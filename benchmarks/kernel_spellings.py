"""Adjoint / forward kernel time of each stencil spelling and order (benchmarks/stencil_spellings.py).

    python benchmarks/spellings.py --kernels [--orders 2 4 8] [--ndims 2 3] [--dtypes float32 float64]
                                             [--n2 512] [--n3 64] [--rounds 7] [--no-before] [--device cuda]

Each kernel's forward and adjoint entry points are called directly (no Tape, no Python between
calls) on the same buffers, every gradient present; the row "fwi, damping constant" is `fwi` as the
FWI gradient launches it: the damping field without a gradient, `up`'s overwritten. `before` is the same kernel with the one-pass
gather form of its adjoint (one copy of the adjoint per stencil offset), as before the two-pass form
(compiler/passes/transpose.py); loops stay unrolled there (without unrolling, the tables' spellings
do not compile: a tuple indexed by a loop counter). Contenders run
interleaved (each round times every kernel of a group once); the tables give medians over rounds,
with (min-max) of the adjoint/forward ratio, and each spelling's forward and adjoint time over the
fastest spelling's of the same group. On a GPU (`--device cuda`, run by benchmarks/gpu.py at 4096^2
and 256^3) each time is of launches queued back to back, from one synchronisation to the next.
"""
import contextlib
import ctypes
import functools
import time
from unittest import mock

import numpy as np

import stencil_spellings
import stepper as sp
from compiler.codegen import memory, prefetch
from compiler.kernel import Kernel, KernelModule
from compiler.passes.adjoint import adjoint_function
from compiler.passes.gather import gather_adjoint
from compiler.backends.cuda_driver import synchronize
from compiler.runtime import launch as launch_module

DTYPES = {"float32": sp.float32, "float64": sp.float64}
_FORWARD = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_int)
_ADJOINT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int64,
                            ctypes.c_int, ctypes.c_void_p, ctypes.c_int)


# The forms a table's last column may compare with (see kernel_table): gather_adjoint's options.
BEFORE = {"one-pass": dict(two_pass=False, halo=False), "no-halo": dict(halo=False),
          "not-reassociated": dict(reassociate=False)}


def _rendered_as(before: str | None):
    """A context in which kernels build as `before` says where it changes how the CPU entries are
    rendered rather than the form ("no-prefetch": the loops without compiler/codegen/prefetch.py;
    "whole-scratch": a two-pass form's passes in turn, without compiler/codegen/scratch.py's windows);
    for any other `before`, as they are."""
    if before == "no-prefetch":
        return mock.patch.object(prefetch, "plan", lambda *_, **__: None)
    if before == "whole-scratch":       # the passes in turn, their scratch arrays over the whole launch
        return mock.patch.object(memory, "passes_apart", lambda *_: None)
    return contextlib.nullcontext()


def _copies(group: dict, label: str, before: str | None) -> dict:
    """The group's kernels rebuilt in a module of their own (so that a group compiles alone), with
    `before` (see kernel_table), where it is a key of BEFORE, their adjoints in that form."""
    module = KernelModule(f"kernel_spellings_{label}{'_' + before.replace('-', '_') if before else ''}")
    out = {}
    for name, k in group.items():
        copy = Kernel(k.fn, module)
        module.add(copy)
        if before in BEFORE:
            compiled = copy.compiled()
            if compiled.gather is not None:
                compiled.gather = gather_adjoint(adjoint_function(compiled.forward), **BEFORE[before])
        out[name] = copy
    return out


def _calls(kernel, shape, args, device: str = "cpu", fresh=()):
    """(forward call, adjoint call) of `kernel` on `args`, both running the compiled entries (on a
    GPU, each call queues one launch). `fresh`: arrays whose gradients the adjoint may overwrite
    (new memory standing for zeros, as Tape.backward's `fresh`), the others' it adds into."""
    entry, buffer, serial, _ = launch_module.packed_forward(kernel, shape, args, False, device)
    forward = (lambda: entry(buffer)) if device != "cpu" else functools.partial(_FORWARD(entry), buffer, serial)
    pending = {id(a.grad._storage): a.grad for a in fresh}
    try:
        entry_adj, adj_buffer, adj_serial = launch_module.packed_adjoint(kernel, shape, args, False, pending, device)
    except ValueError:                   # a loop tape: the launch path sizes it per call
        compiled, sig = kernel.compiled(), launch_module._signature(kernel)
        return forward, (lambda: launch_module._run_adjoint(kernel, compiled, sig, args, shape, buffer, False, 0))
    if device != "cpu":
        return forward, (lambda: entry_adj(buffer, adj_buffer))
    adjoint = _ADJOINT(entry_adj)
    return forward, (lambda: adjoint(buffer, adj_buffer, None, 0, 0, None, adj_serial))


def _shared_arguments(shape, dtype, rng, order: int, device: str = "cpu") -> dict:
    """The arrays every spelling of one stencil runs on: the same memory for all of them. Where an
    array lies matters as much as the spread between spellings: at 512^2 in float32 one 8th-order
    forward took 97-140 us by the arrays' offsets within their pages alone, and four spellings
    run on the same arrays were within 3% of each other (2026-11-28, sixth session)."""
    arrays = {name: sp.array((rng.standard_normal(shape) * s).astype(dtype.np_dtype), requires_grad=True,
                             device=device)
              for name, s in zip(("up", "u", "m", "damp"), (1.0, 1.0, 0.1, 0.05))}
    arrays["w"] = sp.array(np.array(stencil_spellings.WEIGHTS[order], dtype.np_dtype), device=device)  # no gradient
    arrays["damp_constant"] = sp.array(arrays["damp"].numpy(), device=device)  # as the FWI gradient passes it
    arrays["u_next"] = sp.zeros(shape, dtype=dtype, requires_grad=True, device=device)
    arrays["u_next"].grad.assign(rng.standard_normal(shape).astype(dtype.np_dtype))
    return arrays


def _arguments(name: str, shared: dict) -> list:
    """Spelling `name`'s arguments, from `_shared_arguments`: (up, u, u_next) for the waves; (up, u,
    m, damp, u_next) for `fwi`, with the weights before u_next for `fwi_array`."""
    roles = ["up", "u", *(("m", "damp") if name.startswith("fwi") else ()), *(("w",) if name == "fwi_array" else ()),
             "u_next"]
    return [shared[role] for role in roles]


def launched_calls(kernel, shape, shared: dict, device: str = "cpu") -> tuple:
    """(forward call, adjoint call, the arguments they need alive) of `fwi` (`kernel`) as the FWI
    gradient launches it (CONSTANT_DAMPING): the damping field without a gradient, `up`'s
    gradient new memory that the adjoint overwrites."""
    args = _arguments("fwi", {**shared, "damp": shared["damp_constant"]})
    return (*_calls(kernel, shape, args, device, fresh=[shared["up"]]), args)


def _seconds(call, budget: float = 0.02, device: str = "cpu") -> float:
    """Seconds per call: calls repeated until `budget` has passed. On a GPU the calls are queued in
    batches that double, timed from one synchronisation to the next, so that the queue stays full
    and the time is the device's (the sizes must make a launch longer than its host cost)."""
    if device != "cpu":
        batch = 1
        while True:
            synchronize(0)
            began = time.perf_counter()
            for _ in range(batch):
                call()
            synchronize(0)
            elapsed = time.perf_counter() - began
            if elapsed > budget:
                return elapsed / batch
            batch *= 2
    reps, began = 0, time.perf_counter()
    while True:
        call()
        reps += 1
        elapsed = time.perf_counter() - began
        if elapsed > budget:
            return elapsed / reps


# The FWI stencil as the FWI gradient launches it: the damping field without a gradient (its own
# array, so placed elsewhere in memory than the shared one), and `up`'s gradient new memory that
# the adjoint overwrites (a native reversal of benchmarks/peer_impls/fwi_ours.py's step passes it
# so: `u`'s gradient has the copy's adjoint in it by then, and m's sums over the steps).
CONSTANT_DAMPING = "fwi, damping constant"


def kernel_table(orders, ndims, dtypes, n2: int, n3: int, rounds: int, before: str | None,
                 device: str = "cpu") -> list[str]:
    """Markdown rows, one per (ndim, order, dtype, spelling), and one for `fwi` as the FWI gradient
    launches it (CONSTANT_DAMPING), timed on `device`. `before`: the last column's form, "one-pass"
    (one adjoint copy per offset), "no-halo" (two passes, scratch the launch's size: the forms
    before GatherAdjoint.halo), "not-reassociated" (the halo form, each root times its weight:
    compiler/passes/reassociate.py), "no-prefetch" (the loop nests without prefetching the next
    row's streams: compiler/codegen/prefetch.py), "whole-scratch" (a two-pass form's passes in
    turn over scratch arrays the launch's size, not by windows of rows: compiler/codegen/scratch.py),
    or None for no such column."""
    rng = np.random.default_rng(0)
    lines = ["| dims | order | dtype | spelling | forward us | adjoint us | adjoint/forward (min-max) | "
             "forward / fastest | adjoint / fastest |" + (f" {before}: adjoint/forward |" if before else ""),
             "|---|---:|---|---|---:|---:|---:|---:|---:|" + ("---:|" if before else "")]
    print("\n".join(lines), flush=True)                 # (the rows follow as each group is timed)
    for ndim in ndims:
        shape = (n2,) * 2 if ndim == 2 else (n3,) * 3
        for order in orders:
            for dname in dtypes:
                dtype = DTYPES[dname]
                group = stencil_spellings.kernels(order, ndim, dtype)
                label = f"{ndim}d_{order}_{dname}"
                variants = {"after": _copies(group, label, None)}
                if before:
                    variants["before"] = _copies(group, label, before)
                calls = {}
                shared = _shared_arguments(shape, dtype, rng, order, device)
                for variant, kernels in variants.items():
                    with _rendered_as(before if variant == "before" else None):      # (_calls builds)
                        for name, k in kernels.items():
                            args = _arguments(name, shared)
                            calls[(variant, name)] = (*_calls(k, shape, args, device), args)
                        calls[(variant, CONSTANT_DAMPING)] = launched_calls(kernels["fwi"], shape, shared, device)
                times = {key: ([], []) for key in calls}
                for key, (forward, adjoint, _) in calls.items():      # warm up (and compile)
                    forward(), adjoint()
                for _ in range(rounds):
                    for key, (forward, adjoint, _) in calls.items():
                        times[key][0].append(_seconds(forward, device=device))
                        times[key][1].append(_seconds(adjoint, device=device))
                med = {key: (np.median(f), np.median(a)) for key, (f, a) in times.items()}
                waves = [name for name in group if not name.startswith("fwi")]
                fastest_f = min(med[("after", name)][0] for name in waves)
                fastest_a = min(med[("after", name)][1] for name in waves)
                names = [*group, CONSTANT_DAMPING]
                for name in names:
                    f, a = med[("after", name)]
                    ratios = np.array(times[("after", name)][1]) / np.array(times[("after", name)][0])
                    row = (f"| {ndim}-D {shape[0]}^{ndim} | {order} | {dname} | {name} | {f * 1e6:.0f} | {a * 1e6:.0f} | "
                           f"{a / f:.2f} ({ratios.min():.2f}-{ratios.max():.2f}) | "
                           + (f"{f / fastest_f:.2f} | {a / fastest_a:.2f} |" if name in waves else "- | - |"))
                    if before:
                        fb, ab = med[("before", name)]
                        row += f" {ab / fb:.2f} |"
                    lines.append(row)
                print("\n".join(lines[-len(names):]), flush=True)
    return lines
