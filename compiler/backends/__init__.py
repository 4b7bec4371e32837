"""Compile and load steps of the two backends, each taking source text from the codegen.

CPU:  ``build_cpu_library(source, name, include_dirs)`` -> path of a cached shared library;
      ``load_cpu_library(path)`` -> ``ctypes.CDLL``.
CUDA: ``compile_cuda(source, name, arch, headers=...)`` -> cached PTX/CUBIN bytes (NVRTC, no GPU
      needed); ``load_module(image)``, ``get_function(module, name)``, ``launch(...)`` (driver API).

Both caches live in ``~/.cache/stepper/kernels`` unless a call passes ``cache_dir=`` or
``set_cache_dir(path)`` chose another directory; deleting it is always safe.
"""
from .common import DEFAULT_CACHE_DIR, BuildError, get_cache_dir, set_cache_dir
from .cpu_build import (Compiler, CompilerNotFoundError, build_cpu_library, find_compiler, find_cxx,
                        load_cpu_library, set_build_timeout)
from .cuda_driver import (CudaError, cuda_available, device_arch, device_count, get_function, launch,
                          load_module, primary_context, synchronize)
from .nvrtc import DEFAULT_ARCH, DEFAULT_OPTIONS, NvrtcNotFoundError, compile_cuda, nvrtc_version

__all__ = [
    "BuildError", "set_cache_dir", "get_cache_dir", "DEFAULT_CACHE_DIR",
    "CompilerNotFoundError", "Compiler", "find_cxx", "find_compiler", "build_cpu_library",
    "load_cpu_library", "set_build_timeout",
    "NvrtcNotFoundError", "nvrtc_version", "compile_cuda", "DEFAULT_ARCH", "DEFAULT_OPTIONS",
    "CudaError", "cuda_available", "device_count", "device_arch", "primary_context", "load_module",
    "get_function", "launch", "synchronize",
]
