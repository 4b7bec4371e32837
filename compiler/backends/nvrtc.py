"""Compile step of the CUDA backend: CUDA C++ source text -> cached PTX or CUBIN bytes, with NVRTC.

    ptx = compile_cuda(source, "my_kernel", headers={"prelude.h": prelude_text})
    cubin = compile_cuda(source, "my_kernel", arch="sm_90", output="cubin")

NVRTC comes from ``cuda-bindings`` (``cuda-python``), which loads whichever NVRTC shared library is
installed: the ``nvidia-cuda-nvrtc-cu12`` wheel (NVRTC 12.x) or ``nvidia-cuda-nvrtc`` (13.x). No GPU
and no driver are needed to compile, so CUDA codegen is checked on every machine.

NVRTC has no C++ standard library and no system headers: the prelude must be self-contained. Write
no ``#include <cmath>``/``<cstdint>``; use the CUDA builtins (``sinf``, ``sqrt``, ``atomicAdd``, ...,
all declared without includes) and spell fixed-width types as typedefs (``typedef long long
int64;``). Headers are passed as text through ``headers={"name.h": text}`` or found in
``include_dirs``.

Options valid on both NVRTC 12 and 13 (NVRTC 13 dropped every architecture below sm_75):
``--gpu-architecture=compute_75`` (PTX, loads on any sm_75+ GPU through the driver's JIT) or
``sm_XY`` (CUBIN), ``--std=c++17``, ``-lineinfo``; more can be passed through ``options=`` (e.g.
``--fmad=false`` for results without FMA contraction, like the CPU backend's ``-ffp-contract=off``).

Cache: ``<cache_dir>/<name>-<key>.ptx`` (or ``.cubin``), the key hashing the source, the headers,
the NVRTC version, the architecture, the output kind, the options and our version.
"""
from __future__ import annotations

import logging
import os
import re
import time
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from .cache_check import check_private
from .._version import __version__
from .common import BuildError, Hasher, atomic_write, get_cache_dir, safe_name

__all__ = ["NvrtcNotFoundError", "nvrtc_version", "compile_cuda", "DEFAULT_ARCH", "DEFAULT_OPTIONS"]

log = logging.getLogger(__name__)

DEFAULT_ARCH = "compute_75"        # the oldest architecture NVRTC 13 still accepts
DEFAULT_OPTIONS = ("--std=c++17", "-lineinfo")
_OUTPUTS = ("ptx", "cubin")

_INSTALL_HINT = (
    "Install NVRTC and its Python bindings (no GPU is needed to compile):\n"
    "  pip install cuda-python nvidia-cuda-nvrtc-cu12     # CUDA 12\n"
    "  pip install cuda-python nvidia-cuda-nvrtc          # CUDA 13\n"
    "or install the CUDA toolkit so that libnvrtc is on the library path."
)


class NvrtcNotFoundError(RuntimeError):
    """NVRTC could not be loaded: the message says what was tried and how to install it."""


_nvrtc_module = None


def _nvrtc():
    """The ``nvrtc`` module of cuda-bindings, with its shared library known to load."""
    global _nvrtc_module
    if _nvrtc_module is not None:
        return _nvrtc_module
    tried = []
    for import_name in ("cuda.bindings.nvrtc", "cuda.nvrtc"):   # cuda-python >= 12.6, then older
        try:
            module = __import__(import_name, fromlist=["nvrtcVersion"])
            err, major, minor = module.nvrtcVersion()     # first call loads libnvrtc
            if int(err) != 0:
                raise RuntimeError(f"nvrtcVersion returned {err}")
        except Exception as e:          # ImportError, or the library failing to load in any way
            tried.append(f"  {import_name}: {type(e).__name__}: {e}")
            continue
        _nvrtc_module = module
        return module
    raise NvrtcNotFoundError("Could not load NVRTC. Tried:\n" + "\n".join(tried) + "\n" + _INSTALL_HINT)


def nvrtc_version() -> tuple[int, int]:
    """The (major, minor) version of the NVRTC library in use, e.g. (12, 9)."""
    err, major, minor = _nvrtc().nvrtcVersion()
    return int(major), int(minor)


def compile_cuda(source: str, name: str, arch: str | int = DEFAULT_ARCH,
                 headers: Mapping[str, str] | None = None,
                 include_dirs: Iterable[str | os.PathLike] = (),
                 options: Sequence[str] = (), output: str = "ptx",
                 cache_dir: str | os.PathLike | None = None) -> bytes:
    """Compile CUDA C++ ``source`` with NVRTC and return the PTX (text, no trailing NUL) or CUBIN.

    ``arch``: ``"compute_75"``/``"sm_86"`` or a number (75 -> compute_75 for PTX, sm_75 for CUBIN);
    CUBIN needs a real ``sm_XY``. ``headers`` maps include names to header text; ``include_dirs``
    become ``-I`` options and their headers are part of the cache key. ``options`` are appended to
    ``--std=c++17 -lineinfo --gpu-architecture=<arch>``. Results are cached on disk; a hit does not
    call NVRTC. Raises :class:`BuildError` with NVRTC's log (pointing at the user's Python lines
    through ``#line`` directives) and :class:`NvrtcNotFoundError`.
    """
    if output not in _OUTPUTS:
        raise ValueError(f"output must be one of {_OUTPUTS}, not {output!r}")
    arch = _arch_name(arch, output)
    headers = dict(headers or {})
    include_dirs = [Path(d).resolve() for d in include_dirs]
    version = nvrtc_version()
    if version[0] >= 13 and int(re.search(r"\d+", arch).group()) < 75:
        raise ValueError(f"NVRTC {version[0]}.{version[1]} supports sm_75 and newer only, not {arch!r}")
    opts = [*DEFAULT_OPTIONS, f"--gpu-architecture={arch}", *(f"-I{d}" for d in include_dirs), *options]

    h = (Hasher().add("version", __version__).add("nvrtc", f"{version[0]}.{version[1]}")
         .add("output", output).add("options", "\0".join(o for o in opts if not o.startswith("-I")))
         .add("source", source).add_include_dirs(include_dirs))
    for header_name in sorted(headers):
        h.add("header_name", header_name).add("header_text", headers[header_name])
    target = get_cache_dir(cache_dir) / f"{safe_name(name)}-{h.hexdigest(24)}.{output}"
    if target.exists():
        check_private(target, "PTX/CUBIN image")         # code the GPU runs as us
        try:
            return target.read_bytes()
        except FileNotFoundError:
            pass
    t0 = time.perf_counter()
    image = _compile(source, name, headers, opts, output, target)
    atomic_write(target, image)
    log.debug("NVRTC %d.%d compiled %s in %.2f s", *version, target.name, time.perf_counter() - t0)
    return image


def _arch_name(arch: str | int, output: str) -> str:
    if isinstance(arch, int) or str(arch).isdigit():
        return f"{'sm' if output == 'cubin' else 'compute'}_{int(arch)}"
    arch = str(arch)
    if not re.fullmatch(r"(compute|sm)_\d+[a-z]?", arch):
        raise ValueError(f"arch must look like 'compute_75', 'sm_86' or 75, not {arch!r}")
    if output == "cubin" and arch.startswith("compute_"):
        raise ValueError(f"a CUBIN is built for a real GPU: use arch='sm_{arch[8:]}', not {arch!r}")
    return arch


def _compile(source: str, name: str, headers: dict[str, str], opts: list[str], output: str,
             target: Path) -> bytes:
    nvrtc = _nvrtc()
    err, prog = nvrtc.nvrtcCreateProgram(
        source.encode(), f"{safe_name(name)}.cu".encode(), len(headers),
        [text.encode() for text in headers.values()], [n.encode() for n in headers])
    _check(nvrtc, err, "nvrtcCreateProgram")
    try:
        encoded = [o.encode() for o in opts]
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(encoded), encoded)
        program_log = _program_log(nvrtc, prog)
        if int(result) != 0:
            failed = target.with_name(f"{safe_name(name)}.failed.cu")
            atomic_write(failed, source.encode())
            command = " ".join(opts)
            raise BuildError(
                f"CUDA compilation of {name!r} failed ({_error_string(nvrtc, result)}, "
                f"NVRTC {'.'.join(map(str, nvrtc_version()))}).\n"
                f"{_gcc_style_locations(program_log).rstrip()}\n"
                f"options: {command}\n"
                f"the failing source is saved as {failed}",
                log=program_log, command=command, source_path=failed)
        if program_log.strip():
            log.debug("NVRTC messages for %s:\n%s", name, program_log)
        if output == "ptx":
            err, size = nvrtc.nvrtcGetPTXSize(prog)
            _check(nvrtc, err, "nvrtcGetPTXSize")
            buf = b" " * size
            _check(nvrtc, nvrtc.nvrtcGetPTX(prog, buf)[0], "nvrtcGetPTX")
            return buf.rstrip(b"\0")
        err, size = nvrtc.nvrtcGetCUBINSize(prog)
        _check(nvrtc, err, "nvrtcGetCUBINSize")
        buf = b" " * size
        _check(nvrtc, nvrtc.nvrtcGetCUBIN(prog, buf)[0], "nvrtcGetCUBIN")
        return buf
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _program_log(nvrtc, prog) -> str:
    err, size = nvrtc.nvrtcGetProgramLogSize(prog)
    if int(err) != 0 or size <= 1:
        return ""
    buf = b" " * size
    nvrtc.nvrtcGetProgramLog(prog, buf)
    return buf.rstrip(b"\0").decode(errors="replace")


def _gcc_style_locations(program_log: str) -> str:
    """NVRTC writes ``user.py(7): error: ...``; say ``user.py:7: error: ...`` as gcc and clang do."""
    return re.sub(r"^(.+?)\((\d+)\): ", r"\1:\2: ", program_log, flags=re.MULTILINE)


def _error_string(nvrtc, result) -> str:
    try:
        return nvrtc.nvrtcGetErrorString(result)[1].decode()
    except Exception:
        return str(result)


def _check(nvrtc, err, what: str) -> None:
    if int(err) != 0:
        raise RuntimeError(f"{what} failed: {_error_string(nvrtc, err)}")
