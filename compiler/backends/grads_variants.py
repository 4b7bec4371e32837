"""Adjoint entry points specialised on which gradients a launch carries, built the first time a
launch needs one.

A gather adjoint's thread body is a template on a gradient mask (has_grad in prelude.h). A kernel
module renders two instantiations of it: the branch-free one, for launches that carry every gradient
the body touches, and one that tests each gradient pointer, which does not vectorise (a 2-D wave
step whose damping profile has no gradient: 4.8x the branch-free adjoint's time). A launch with any
other subset (a constant field passed as an array: a damping profile, a mask, a coefficient table)
runs an entry specialised on exactly its subset instead: branch-free, with the absent gradients'
accumulations gone. Each is built into a small library (CPU) or module (CUDA) of its own, from the
same emitter as the module, cached on disk like one, once per kernel, subset and device; a launch
in a time loop repeats its subset, so a run builds a handful at most.
"""
from __future__ import annotations

import ctypes
from pathlib import Path

from ..codegen.targets import CPU, CUDA, grads_variant_name, render_grads_variant
from . import cudasim
from .cpu_build import build_cpu_library, load_cpu_library

_CODEGEN = Path(__file__).parent.parent / "codegen"
_ADJOINT_ARGS = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_void_p,
                 ctypes.c_int]


def _variants(kernel) -> dict:
    return kernel.__dict__.setdefault("_grads_variants", {})


def _library_name(kernel, grads: int) -> str:
    return "".join(c if c.isalnum() else "_" for c in kernel.module.name)[-32:] + f"_{kernel.c_name}_g{grads:x}"


def grads_mask(params: tuple[int, ...], args) -> int | None:
    """The gradient mask of the specialised entry that a launch of a gather form with arguments
    `args` runs (bit k where argument k carries a gradient, among the form's `params`: those whose
    gradients its body touches, see codegen.targets.grad_params), or None where the module's entry
    serves: every one of them carries its gradient."""
    mask = full = 0
    for k in params:
        if k < 64:          # a parameter beyond the mask's bits is tested at run time
            full |= 1 << k
            mask |= (1 << k) if args[k].requires_grad and args[k].grad is not None else 0
    return mask if mask != full else None


def cpu_adjoint_entry(kernel, compiled, function, grads: int | None, debug: bool):
    """The CPU entry that runs adjoint `function` of `kernel`: the module's, or (not in debug mode,
    whose checks the module's entries make) the gather form's specialised on gradient mask `grads`."""
    if grads is not None and not debug:
        return cpu_entry(kernel, compiled, grads)
    return kernel.entry(debug).function(function.name, adjoint=True)


def cpu_entry(kernel, compiled, grads: int):
    """The CPU entry of `kernel`'s gather adjoint for gradient mask `grads` (a ctypes function with
    the adjoint entries' signature, see kernel.LoadedModule.function)."""
    variants = _variants(kernel)
    key = ("cpu", grads)
    if key not in variants:
        rendered = render_grads_variant(compiled.functions(), grads, CPU)
        lib = load_cpu_library(build_cpu_library(rendered.source, _library_name(kernel, grads),
                                                 include_dirs=[_CODEGEN]))
        fn = getattr(lib, grads_variant_name(compiled.gather.function.name, grads))
        fn.argtypes, fn.restype = _ADJOINT_ARGS, ctypes.c_int
        variants[key] = (lib, fn)           # the library stays loaded while its entry may run
    return variants[key][1]


def cuda_functions(kernel, compiled, grads: int, device):
    """The CUfunctions (pointwise pass, gather adjoint) of `kernel`'s gather form for gradient mask
    `grads` on `device` (a compiler.runtime.device.Device), loaded into its primary context; the
    first is None for a one-pass form."""
    from . import cuda_driver
    from .cuda_module import CUDA_OPTIONS, PRELUDE, _check_toolkit
    from .nvrtc import compile_cuda
    variants = _variants(kernel)
    key = ("cuda", device.ordinal, grads)
    if key not in variants:
        rendered = render_grads_variant(compiled.functions(), grads, CUDA)
        name = _library_name(kernel, grads)
        if cudasim.enabled():
            image = cudasim.build_image(rendered.source, name)
        else:
            _check_toolkit()
            major, minor = cuda_driver.device_arch(device.ordinal)
            image = compile_cuda(rendered.source, name, arch=f"sm_{major}{minor}",
                                 headers={"prelude.h": PRELUDE.read_text()}, options=CUDA_OPTIONS, output="cubin")
        with cuda_driver.relaxed_capture():     # a first use may come while a graph is captured
            module = cuda_driver.load_module(image, device.ordinal)
        gather = compiled.gather
        first = (cuda_driver.get_function(module, grads_variant_name(gather.pointwise.name, grads))
                 if gather.pointwise is not None else None)
        variants[key] = (module, (first, cuda_driver.get_function(module, grads_variant_name(gather.function.name,
                                                                                               grads))))
    return variants[key][1]


__all__ = ["grads_mask", "cpu_adjoint_entry", "cpu_entry", "cuda_functions"]
