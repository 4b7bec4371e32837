"""The CUDA simulator: `device="cuda"` on a machine without a GPU, for tests and CI.

Switched on by one documented environment variable, in the spirit of numba's NUMBA_ENABLE_CUDASIM:

    STEPPER_CUDA_SIM=1 python -m pytest --device cuda

Then every CUDA driver call goes to `driver.py`, a strict host-memory fake of exactly the calls the
project makes, and a module's kernels run from its **CUDA rendering** (the source NVRTC compiles
on a GPU machine) built by the host C++ compiler with `cudasim.h` force-included: the real entry
points, grid-stride loops and launch configuration, one thread after another.
`STEPPER_CUDA_SIM_SHUFFLE=<seed>` runs blocks and threads in a seeded random order, so results that
depend on thread order show up as differences. The simulator shows what the CUDA path computes and
which driver rules it breaks; it says nothing about speed, occupancy or real races.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from ..cache_check import check_private
from ..cpu_build import build_cpu_library
from .driver import image_for

SIM_DIR = Path(__file__).parent
_ENTRY = re.compile(r'extern "C" __global__ void (?:__launch_bounds__\([\d, ]+\) )?(\w+)\(')
_GLOBAL = re.compile(r"^__device__ [\w ]+? (sp_\w+)(?:\[\d+\])? =", re.M)


def enabled() -> bool:
    """Whether STEPPER_CUDA_SIM asks for the simulator (read at each call: tests switch it)."""
    return os.environ.get("STEPPER_CUDA_SIM", "").strip() not in ("", "0")


def build_image(source: str, name: str) -> bytes:
    """The simulator's module image for the CUDA `source`: a host build of it (cached like CPU
    builds) with a launcher per `__global__` entry and the size of each `__device__` global."""
    codegen = SIM_DIR.parent.parent / "codegen"
    tail = [f"SP_SIM_ENTRY({e})" for e in _ENTRY.findall(source)]
    tail += [f"SP_SIM_GLOBAL({g})" for g in _GLOBAL.findall(source)]
    full = '#include "cudasim.h"\n' + source + "\n" + "\n".join(tail) + "\n"
    # -O1: simulated modules are built once per test module and run small launches.
    library = build_cpu_library(full, f"{name}_cudasim", include_dirs=[codegen, SIM_DIR], flags=("-O1",),
                                what=f"simulated CUDA module '{name}' ({len(tail)} entries and globals)")
    check_private(library)              # the fake driver loads it as the real one would load PTX
    return image_for(library)
