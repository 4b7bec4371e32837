"""The CUDA half of a kernel module: render -> NVRTC (PTX or CUBIN) -> load -> the entry points.

Compiling needs only NVRTC, so every machine checks that each module compiles for CUDA
(tests/test_cuda_codegen.py). Loading and launching need a GPU (`cuda_launch.py`).

    ptx, rendered = cuda_image(kernel.module, debug=False)                   # any machine
    loaded = cuda_module(kernel.module, debug=False, device=get_device("cuda"))   # with a GPU
"""
from __future__ import annotations

import ctypes
import functools
from pathlib import Path

from ..codegen.targets import RenderedModule
from . import cuda_driver, cudasim
from .cuda_driver import _check, _driver, primary_context
from .nvrtc import DEFAULT_ARCH, compile_cuda, nvrtc_version

PRELUDE = Path(__file__).parent.parent / "codegen" / "prelude.h"

# --fmad=false: no contraction of a*b+c into FMA, so float results match the CPU build's
# -ffp-contract=off (math functions such as sinf still differ from the host libm in the last bits).
# 177/550: the emitter declares every parameter and temp up front; unused ones are not mistakes.
CUDA_OPTIONS = ("--fmad=false", "-diag-suppress=177,550")


def cuda_image(module, debug: bool, arch: str = DEFAULT_ARCH, output: str = "ptx") -> tuple[bytes, RenderedModule]:
    """The module's CUDA source compiled by NVRTC (cached on disk), and the rendering it came from."""
    rendered = module.render(debug, target="cuda")
    image = compile_cuda(rendered.source, _safe_name(module.name, debug), arch=arch,
                         headers={"prelude.h": PRELUDE.read_text()}, options=CUDA_OPTIONS, output=output)
    return image, rendered


@functools.cache
def _check_toolkit() -> None:
    cuda_driver.check_toolkit(cuda_driver.driver_version(), nvrtc_version())


def _safe_name(name: str, debug: bool) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)[-40:] + ("_debug" if debug else "")


_LOADED: dict = {}     # (module name, len(kernels), debug, ordinal) -> LoadedCudaModule


def cuda_module(module, debug: bool, device) -> "LoadedCudaModule":
    """The module compiled to CUBIN for `device`'s architecture and loaded into its primary context
    (once per process; a kernel added to the module later triggers a rebuild)."""
    key = (module.name, len(module.kernels), debug, device.ordinal)
    loaded = _LOADED.get(key)
    if loaded is None:
        if cudasim.enabled():
            rendered = module.render(debug, target="cuda")
            image = cudasim.build_image(rendered.source, _safe_name(module.name, debug))
        else:
            _check_toolkit()
            major, minor = cuda_driver.device_arch(device.ordinal)
            image, rendered = cuda_image(module, debug, arch=f"sm_{major}{minor}", output="cubin")
        loaded = _LOADED[key] = LoadedCudaModule(cuda_driver.load_module(image, device.ordinal), rendered.sites,
                                                 device.ordinal)
    return loaded


class LoadedCudaModule:
    """Entry points and the device-side error globals of one loaded module.

    The globals (`sp_error_site`, `sp_error_index`, `sp_tape_overflow`, `sp_tape_words`, see
    codegen/targets.py) are read and reset with synchronous copies after a launch.
    """

    def __init__(self, module, sites, ordinal: int):
        self.module = module
        self.sites = sites
        self.ordinal = ordinal
        self._functions: dict = {}

    def function(self, name: str, adjoint: bool):
        key = (name, adjoint)
        if key not in self._functions:
            self._functions[key] = cuda_driver.get_function(self.module, name if adjoint else name + "_forward")
        return self._functions[key]

    def _global(self, name: str):
        ptr, size = _check(_driver().cuModuleGetGlobal(self.module, name.encode()), f"cuModuleGetGlobal({name!r})")
        return int(ptr), int(size)

    def read(self, name: str, ctype):
        """Copy the global `name` to the host as a ctypes value (synchronises with the device)."""
        primary_context(self.ordinal)
        ptr, size = self._global(name)
        value = ctype()
        assert ctypes.sizeof(value) == size, (name, size)
        _check(_driver().cuMemcpyDtoH(ctypes.addressof(value), ptr, size), f"cuMemcpyDtoH({name})")
        return value

    def write(self, name: str, value) -> None:
        """Overwrite the global `name` with the ctypes value `value`."""
        primary_context(self.ordinal)
        ptr, size = self._global(name)
        _check(_driver().cuMemcpyHtoD(ptr, ctypes.addressof(value), ctypes.sizeof(value)), f"cuMemcpyHtoD({name})")
