"""Compile step of the CPU backend: C++ source text -> cached shared library -> ctypes handle.

    lib_path = build_cpu_library(source, "my_kernel", include_dirs=[prelude_dir])
    lib = load_cpu_library(lib_path)          # ctypes.CDLL; a second call is a dict lookup

The compiler is ``$CXX`` if set (it may carry arguments, e.g. ``CXX="ccache g++"``), else the first
of ``c++``, ``g++``, ``clang++`` on ``PATH``. Flags are ``-O3 -shared -fPIC -std=c++17
-ffp-contract=off`` (and, for GCC, a higher limit on the overlap checks it may add to vectorise a
loop, and no memset calls for loops that store zeros), plus ``-march=native`` and ``-fopenmp``
where the compiler supports them (Apple clang has no OpenMP: the library is then built
single-threaded and a debug log says so).

``-march=native`` only widens the vectors (a 256x256 stencil step 1.6x faster with AVX2 than with
the SSE2 baseline): float results stay the same bits on every machine, because each IEEE operation
is exact whatever the vector width, ``-ffp-contract=off`` stops the compiler from fusing ``a*b+c``
into an FMA, and there is no fast-math (which would reorder sums). A native library only runs on
CPUs like the one it was built on, so its file name carries this CPU's model and feature flags.

Cache: the library is ``<cache_dir>/<name>-<source key>-<compiler key>[-<cpu tag>]<ext>``. The
source key hashes the source text, every header under ``include_dirs``, the extra flags and our
version; the compiler key hashes the compiler's path, file stamp and ``--version`` output, and the
full flag list; the CPU tag (native builds only) this CPU's model and flags. A cache hit runs no
compiler (its ``--version`` is asked once per process). The generated source is kept next to the
library as ``<name>-<source key>.cpp`` for inspection. Without any C++ compiler a library built
earlier from the same source key, by whichever compiler, is reused if it runs on this CPU.
"""
from __future__ import annotations

import ctypes
import json
import logging
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from . import cache_check
from .cache_check import CACHE_HINT
from .._version import __version__
from .common import (BuildError, Hasher, atomic_write, get_cache_dir, safe_name,
                     temp_path_for, unlink_quietly)

__all__ = ["CompilerNotFoundError", "Compiler", "find_cxx", "find_compiler", "build_cpu_library",
           "load_cpu_library", "BASE_FLAGS", "set_build_timeout"]

log = logging.getLogger(__name__)

BASE_FLAGS = ("-O3", "-shared", "-fPIC", "-std=c++17", "-ffp-contract=off")
OPENMP_FLAG = "-fopenmp"
NATIVE_FLAG = "-march=native"
# GCC gives up vectorising a loop that would need more than 10 run-time overlap checks between the
# arrays it reads and writes; a stencil's adjoint reads a dozen neighbour streams. Clang has no
# such limit (and does not know the option). And GCC turns a loop that stores zeros into calls of
# memset: an adjoint's loops over the few threads at a row's ends (which store zero roots and
# gradients there) became up to three calls each, per row and end (21 call sites in the 3-D
# 8th-order FWI update's adjoint); with the 64-thread rows of a 3-D 64^3 grid, 0.90-0.99 of the
# adjoints' time without them, forwards 0.93-1.03, 2-D 512^2 0.95-1.04 (Intel Xeon,
# benchmarks/README.md).
GCC_FLAGS = ("--param", "vect-max-version-for-alias-checks=64", "-fno-tree-loop-distribute-patterns")
CANDIDATES = ("c++", "g++", "clang++")
LIB_SUFFIX = ".dylib" if sys.platform == "darwin" else ".so"
# Bump when the way we build changes in a way that the hashed inputs do not show.
_RECIPE = "cpu-build-1"
# Seconds one compiler run may take (set_build_timeout). The slowest build in the suite and examples,
# test_builtin_vectors' 11,600 generated lines of vector and matrix adjoints, took 55 s on a loaded 2-core VM
# (most take 0.2-9 s): 300 s leaves room for a slower machine without ten minutes of silence.
_build_timeout = [300.0]
# A build still running after this long says so, once: a user waiting in silence assumes a hang.
BUILD_NOTICE_SECONDS = 5.0


def set_build_timeout(seconds: float) -> None:
    """How long one C++ compiler run may take before it is killed and the build fails with a
    `BuildError` (default 300 s; generated kernels build in 0.2-9 s, the suite's largest module in
    55 s on a loaded 2-core machine)."""
    if not seconds > 0:
        raise ValueError(f"the build timeout must be a positive number of seconds, got {seconds!r}")
    _build_timeout[0] = float(seconds)

_INSTALL_HINT = (
    "Install a C++17 compiler with OpenMP:\n"
    "  Debian/Ubuntu:  sudo apt-get install g++\n"
    "  Fedora/RHEL:    sudo dnf install gcc-c++\n"
    "  macOS:          xcode-select --install\n"
    "  conda:          conda install -c conda-forge cxx-compiler\n"
    "or point $CXX at one (e.g. export CXX=/usr/bin/g++-12)."
)


class CompilerNotFoundError(RuntimeError):
    """No usable C++ compiler: the message lists what was tried and how to install one."""


@dataclass(frozen=True)
class Compiler:
    """A C++ compiler as the cache sees it."""
    command: tuple[str, ...]   # argv prefix, e.g. ("/usr/bin/g++",) or ("/usr/bin/ccache", "g++")
    identity: str              # resolved path, file stamp and `--version` output
    openmp: bool               # whether -fopenmp works
    native: bool = False       # whether -march=native works

    def flags(self, extra: Sequence[str] = ()) -> tuple[str, ...]:
        gcc = "clang" not in self.identity.lower()
        return (BASE_FLAGS + ((NATIVE_FLAG,) if self.native else ()) + (GCC_FLAGS if gcc else ())
                + ((OPENMP_FLAG,) if self.openmp else ()) + tuple(extra))


def find_cxx() -> tuple[str, ...]:
    """The C++ compiler command: ``$CXX`` if set, else ``c++``, ``g++`` or ``clang++`` from ``PATH``.

    A ``$CXX`` that names nothing executable is an error rather than a silent fallback to another
    compiler. Raises :class:`CompilerNotFoundError` naming everything tried.
    """
    cxx = os.environ.get("CXX", "").strip()
    if cxx:
        argv = shlex.split(cxx)
        exe = shutil.which(argv[0])
        if exe is None:
            raise CompilerNotFoundError(
                f"No C++ compiler: $CXX is set to {cxx!r}, but {argv[0]!r} is not an executable "
                f"file or a command on PATH.\nFix $CXX, or unset it to search PATH for "
                f"{', '.join(CANDIDATES)}.\n{_INSTALL_HINT}")
        return (exe, *argv[1:])
    for candidate in CANDIDATES:
        exe = shutil.which(candidate)
        if exe is not None:
            return (exe,)
    raise CompilerNotFoundError(
        f"No C++ compiler: $CXX is not set and none of {', '.join(CANDIDATES)} is on PATH "
        f"(PATH={os.environ.get('PATH', '')!r}).\n{_INSTALL_HINT}")


_identities: dict[tuple, str] = {}
_support: dict[str, tuple[bool, bool]] = {}
_lock = threading.Lock()


def find_compiler(cache_dir: str | os.PathLike | None = None) -> Compiler:
    """The compiler :func:`find_cxx` picks, with its identity, OpenMP and -march=native support.

    ``--version`` runs once per process and compiler; the probes (tiny builds) run once per
    compiler identity and are remembered in ``<cache_dir>/compilers/``.
    """
    command = find_cxx()
    exe = os.path.realpath(command[0])
    st = os.stat(exe)
    stamp = (command, exe, st.st_size, st.st_mtime_ns)
    with _lock:
        identity = _identities.get(stamp)
    if identity is None:
        version = _run_quietly([*command, "--version"])
        identity = f"{' '.join(command)}\n{exe} {st.st_size} {st.st_mtime_ns}\n{version}"
        with _lock:
            _identities[stamp] = identity
    return Compiler(command, identity, *_supported(command, identity, get_cache_dir(cache_dir)))


def build_cpu_library(source: str, name: str, include_dirs: Iterable[str | os.PathLike] = (),
                      cache_dir: str | os.PathLike | None = None,
                      flags: Sequence[str] | None = None, what: str | None = None) -> Path:
    """Build ``source`` (C++17) into a shared library and return its path in the cache.

    ``include_dirs`` are passed as ``-I`` and every header in them is part of the cache key;
    ``flags`` are extra compiler flags, appended after the defaults; ``what`` names what is built
    (e.g. "kernel module 'physics' (12 kernels)") in the notice a build still running after
    BUILD_NOTICE_SECONDS logs (a warning, once per build). If the library is already in
    the cache, no compiler runs. Raises :class:`BuildError` with the compiler's diagnostics (pointing
    at the user's Python lines through ``#line`` directives) and :class:`CompilerNotFoundError`.
    """
    cache = _cache_dir(cache_dir)
    include_dirs = [Path(d).resolve() for d in include_dirs]
    extra = tuple(flags or ())
    source_key = (Hasher().add("recipe", _RECIPE).add("version", __version__)
                  .add("source", source).add_include_dirs(include_dirs)
                  .add("flags", "\0".join(extra)).hexdigest(20))
    stem = f"{safe_name(name)}-{source_key}"
    try:
        compiler = find_compiler(cache)
    except CompilerNotFoundError:
        prebuilt = _prebuilt(cache, stem)
        if prebuilt is None:
            raise
        log.debug("no C++ compiler; reusing %s, built earlier from the same source", prebuilt)
        return prebuilt
    all_flags = compiler.flags(extra)
    compiler_key = Hasher().add("identity", compiler.identity).add("flags", "\0".join(all_flags)).hexdigest(8)
    cpu = f"-{cpu_tag()}" if compiler.native else ""
    lib = cache / f"{stem}-{compiler_key}{cpu}{LIB_SUFFIX}"
    if cache_check.is_valid(lib):
        return lib
    if lib.exists():
        log.warning("kernel cache entry %s does not match its size/hash record: rebuilding it", lib)
    return _compile(compiler, all_flags, include_dirs, source, name, cache / f"{stem}.cpp", lib,
                    what or f"'{name}'")


_loaded: dict[str, ctypes.CDLL] = {}


def load_cpu_library(path: str | os.PathLike) -> ctypes.CDLL:
    """Load a library from :func:`build_cpu_library` with ctypes; loading a path twice is free."""
    key = os.path.abspath(path)
    lib = _loaded.get(key)
    if lib is None:
        with _lock:
            lib = _loaded.get(key)
            if lib is None:
                _limit_openmp_spinning()
                cache_check.check_private(Path(key))
                try:
                    lib = _loaded[key] = ctypes.CDLL(key)
                except OSError as exc:
                    raise BuildError(f"cannot load the kernel library {key} from the kernel cache: {exc}. "
                                     f"Delete that file to rebuild it, or {CACHE_HINT}") from exc
    return lib


def _cache_dir(cache_dir) -> Path:
    """The cache directory, created and checked writable now, so a bad one is a clear error."""
    try:
        cache = get_cache_dir(cache_dir)
        probe = cache / f".write-probe-{os.getpid()}-{threading.get_ident()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise BuildError(f"the kernel cache {exc.filename or cache_dir or '~/.cache/stepper/kernels'} is not "
                         f"usable ({exc.strerror or exc}); {CACHE_HINT}") from exc
    return cache


def _limit_openmp_spinning() -> None:
    """OpenMP threads spin ~0.3 ms after each parallel loop by default, waiting for the next one.
    When other processes share the cores (CI machines, a busy laptop) that spinning steals the
    cores the next launch needs: one launch measured 16 ms instead of 1.2 ms. A short spin keeps
    back-to-back launches fast on an idle machine. Explicit user settings win; libgomp reads these
    when it is first loaded, which is here."""
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = "10000"


def _compile(compiler: Compiler, flags: Sequence[str], include_dirs: Sequence[Path], source: str,
             name: str, src_path: Path, lib: Path, what: str) -> Path:
    # The source file's name is a pure function of its text, so concurrent writers agree.
    atomic_write(src_path, source.encode("utf-8"))
    tmp_lib = temp_path_for(lib)
    cmd = [*compiler.command, *flags, *(f"-I{d}" for d in include_dirs), str(src_path), "-o", str(tmp_lib)]
    t0 = time.perf_counter()
    proc = _run_compiler(cmd, tmp_lib, name, what, lib.parent)
    if proc.returncode != 0:
        unlink_quietly(tmp_lib)
        failed = src_path.parent / f"{safe_name(name)}.failed.cpp"
        atomic_write(failed, source.encode("utf-8"))
        command = shlex.join(cmd)
        raise BuildError(
            f"C++ compilation of {name!r} failed (exit code {proc.returncode}).\n"
            f"{(proc.stderr or proc.stdout).rstrip()}\n"
            f"command: {command}\n"
            f"the failing source is saved as {failed}",
            log=proc.stderr, command=command, source_path=failed)
    try:
        built = tmp_lib.stat().st_size
    except OSError:
        built = 0
    if built == 0:
        unlink_quietly(tmp_lib)
        raise BuildError(f"C++ compilation of {name!r} exited 0 but wrote no library to {tmp_lib}; check the "
                         f"compiler ($CXX or {', '.join(CANDIDATES)} on PATH): command {shlex.join(cmd)}",
                         log=proc.stderr, command=shlex.join(cmd))
    try:
        os.chmod(tmp_lib, 0o700)       # whatever the umask: a group-writable library would be refused
        cache_check.write_record(tmp_lib, lib)       # before the library: whoever sees it sees its record
        os.replace(tmp_lib, lib)
    except OSError as exc:
        unlink_quietly(tmp_lib)
        raise BuildError(f"cannot store the built kernel library in the kernel cache {lib.parent} "
                         f"({exc.strerror or exc}); {CACHE_HINT}") from exc
    cache_check.forget(lib)
    log.debug("built %s in %.2f s: %s", lib.name, time.perf_counter() - t0, shlex.join(cmd))
    return lib


def _run_compiler(cmd: list[str], tmp_lib: Path, name: str, what: str, cache: Path) -> subprocess.CompletedProcess:
    """Run the compiler in its own process group, so that on timeout it and its helpers (cc1plus,
    as, ld) are all killed; a run past BUILD_NOTICE_SECONDS says so once."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
                            start_new_session=True)
    limit, notice = _build_timeout[0], BUILD_NOTICE_SECONDS
    try:
        try:
            out, err = proc.communicate(timeout=min(notice, limit))
        except subprocess.TimeoutExpired:
            if limit <= notice:
                raise
            log.warning("compiling %s into the kernel cache %s: still running after %g s (once per change of "
                        "the source; later runs load it from the cache; killed after %g s, "
                        "compiler.backends.set_build_timeout(seconds))", what, cache, notice, limit)
            out, err = proc.communicate(timeout=limit - notice)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        unlink_quietly(tmp_lib)
        raise BuildError(f"C++ compilation of {name!r} did not finish within {_build_timeout[0]:g} s and was "
                         f"killed; raise the limit with compiler.backends.set_build_timeout(seconds) or check "
                         f"the compiler: {shlex.join(cmd)}", command=shlex.join(cmd)) from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _prebuilt(cache: Path, stem: str) -> Path | None:
    """A library built earlier from this source, for any CPU if portable, else for this one."""
    def runs_here(p: Path) -> bool:
        tags = p.name[len(stem) + 1:-len(LIB_SUFFIX)].split("-")[1:]
        return tags in ([], [cpu_tag()])
    found = [p for p in cache.glob(f"{stem}-*{LIB_SUFFIX}")
             if not p.name.startswith(".") and runs_here(p) and cache_check.is_valid(p)]
    return max(found, key=lambda p: p.stat().st_mtime_ns) if found else None


_cpu_tag: list[str] = []


def cpu_tag() -> str:
    """A short hash of this CPU's model and feature flags: what a -march=native library needs."""
    if not _cpu_tag:
        try:
            with open("/proc/cpuinfo") as f:
                lines = [line for line in f if line.split(":")[0].strip() in (
                    "model name", "flags", "Features", "CPU implementer", "CPU part")]
            description = "".join(sorted(set(lines)))
        except OSError:
            description = ""
        description += f"{platform.machine()} {platform.processor()} {platform.system()}"
        _cpu_tag.append(Hasher().add("cpu", description).hexdigest(8))
    return _cpu_tag[0]


_OPENMP_PROBE = """\
#include <omp.h>
extern "C" int stepper_openmp_probe(void) {
    int n = 0;
    #pragma omp parallel reduction(+ : n)
    n += 1;
    return n + omp_get_max_threads();
}
"""


def _supported(command: tuple[str, ...], identity: str, cache: Path) -> tuple[bool, bool]:
    """(whether -fopenmp works, whether -march=native works) for this compiler, probed once."""
    key = Hasher().add("identity", identity).add("probe", _OPENMP_PROBE).hexdigest(16)
    with _lock:
        known = _support.get(key)
    if known is not None:
        return known
    record = cache / "compilers" / f"{key}.json"
    try:
        data = json.loads(record.read_text())
        supported = (bool(data["openmp"]), bool(data["native"]))
    except (OSError, ValueError, KeyError, TypeError):
        supported = (_probe(command, OPENMP_FLAG, _OPENMP_PROBE), _probe(command, NATIVE_FLAG, _NATIVE_PROBE))
        record.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(record, json.dumps({"compiler": identity, "openmp": supported[0],
                                         "native": supported[1]}).encode())
    if not supported[0]:
        log.debug("%s does not support %s: CPU kernels will run on one thread", command[0], OPENMP_FLAG)
    with _lock:
        _support[key] = supported
    return supported


_NATIVE_PROBE = """\
extern "C" float stepper_native_probe(const float* x, int n) {
    float s = 0.0f;
    for (int i = 0; i < n; ++i) s += x[i] * x[i];
    return s;
}
"""


def _probe(command: tuple[str, ...], flag: str, source: str) -> bool:
    with tempfile.TemporaryDirectory(prefix="stepper-probe-") as tmp:
        src = Path(tmp) / "probe.cpp"
        src.write_text(source)
        cmd = [*command, *BASE_FLAGS, flag, str(src), "-o", str(Path(tmp) / f"probe{LIB_SUFFIX}")]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=120)
        except (OSError, subprocess.TimeoutExpired) as e:
            log.debug("%s probe could not run (%s)", flag, e)
            return False
    if proc.returncode != 0:
        log.debug("%s probe failed: %s\n%s", flag, shlex.join(cmd), proc.stderr)
    return proc.returncode == 0


def _run_quietly(cmd: list[str]) -> str:
    """``cmd``'s output, or the reason it failed (an identity string needs no more than that)."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=60)
        return (proc.stdout + proc.stderr).strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"<{type(e).__name__}: {e}>"
