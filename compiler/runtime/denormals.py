"""Flushing subnormal floats to zero on the CPU (`set_flush_denormal`).

A wave's leading edge, the tail of a decaying field, an adjoint far from its sources: values that
fall below the smallest normal float (1.2e-38 in float32) become subnormal, and most CPUs compute
with them through a slow microcode path, 10-100x slower per operation. Devito's operators flush
them to zero by default and XLA's CPU backend does too; PyTorch leaves it to
`torch.set_flush_denormal`. We leave IEEE arithmetic alone unless asked, as PyTorch does: flushing
changes results (by less than the smallest normal number per operation, which is what the option
trades) and no gradient here depends on it silently. Measured on Devito's 2-D acoustic example at
8th order (benchmarks/fwi.py, float32, one core): the forward run 3.5x faster with it.

The switch is per process on the CPU: it sets the calling thread's and OpenMP's threads' modes
(kernels run there). It does not change GPUs (NVRTC compiles with IEEE subnormals).
"""
from __future__ import annotations

import pathlib

from ..backends.cpu_build import build_cpu_library, load_cpu_library

_SOURCE = pathlib.Path(__file__).with_name("denormals.cpp")
_library = None


def set_flush_denormal(mode: bool) -> bool:
    """Flush subnormal floats to zero in CPU kernels (``True``), or compute with them as IEEE 754
    says (``False``, the default), for the calling thread and OpenMP's threads. Returns whether the
    mode is supported on this CPU (x86-64 and AArch64), as ``torch.set_flush_denormal`` does; on
    other CPUs nothing changes."""
    global _library
    if not isinstance(mode, bool):
        raise TypeError(f"set_flush_denormal(mode): mode must be True or False, not {mode!r}")
    if _library is None:
        path = build_cpu_library(_SOURCE.read_text(), "compiler_denormals", what="the denormals switch")
        _library = load_cpu_library(path)
    return _library.sp_set_flush_denormal(int(mode)) >= 0
