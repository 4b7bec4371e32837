"""Python kernels compiled to C++ (CPU) and CUDA, with generated adjoints, arrays and a Tape.

`import compiler` works on its own; most users `import stepper`, which re-exports all of this.
"""
from ._version import __version__  # noqa: F401  (read by stepper and the kernel cache keys)

from . import autograd
from .builtins import BUILTINS as _BUILTINS
from .errors import CompileError, OverwriteError
from .func import adjoint, func, func_grad, func_native, func_replay
from .runtime.graph import Graph, capture
from .kernel import Kernel, kernel
from .runtime.launch import LaunchError, launch
from .runtime.array import (array, clone, empty, empty_like, from_dlpack, full, full_like, ones, ones_like, zeros,
                            zeros_like)
from .runtime.copy_kernels import copy
from .runtime.denormals import set_flush_denormal
from .runtime.forward_mode import Dual, Tangents
from .runtime.tape import Tape
from .types import (bool_, float32, float64, int32, int64, mat22, mat33, mat44, matrix, vec2, vec3, vec4,
                    vector)

globals().update(_BUILTINS)

__all__ = [
    "kernel", "capture", "Graph", "func", "func_grad", "func_replay", "func_native", "adjoint", "launch", "Kernel", "LaunchError", "Tape", "Tangents", "Dual", "CompileError", "OverwriteError", "autograd",
    "array", "zeros", "ones", "full", "empty", "zeros_like", "ones_like", "full_like", "empty_like", "clone", "copy",
    "from_dlpack", "set_flush_denormal",
    "float32", "float64", "int32", "int64", "bool_", "vec2", "vec3", "vec4", "mat22", "mat33", "mat44",
    "vector", "matrix", *_BUILTINS,
]
