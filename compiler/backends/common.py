"""What the CPU and CUDA build steps share: the on-disk cache, content hashing, atomic writes, BuildError.

The kernel cache is a flat directory of files named ``<name>-<sha256 prefix>.<ext>``. A file's name is
a hash of everything that decides its contents, so a name is never reused for different contents and
a stale binary is never found; files are written under a temporary name and moved into place with
``os.replace``, so a concurrent process sees either no file or a complete one.

The cache directory is, in order: the ``cache_dir=`` argument of a build call, the directory last
given to :func:`set_cache_dir`, or ``~/.cache/stepper/kernels``. Deleting it at any time is safe.
It is created 0700, and code is loaded from it only while it and the file are the user's own and
not writable by group or others (cache_check.check_private).
"""
from __future__ import annotations

import hashlib
import os
import re
import secrets
import tempfile
from pathlib import Path
from typing import Iterable

__all__ = ["BuildError", "set_cache_dir", "get_cache_dir", "DEFAULT_CACHE_DIR"]

DEFAULT_CACHE_DIR = Path("~/.cache/stepper/kernels")

# Headers that may sit in an include directory; a change to any of them changes every cache key that
# names the directory (cheap: include directories are our own small folders, not /usr/include).
HEADER_SUFFIXES = (".h", ".hpp", ".cuh", ".inl")

_cache_dir_override: Path | None = None


class BuildError(RuntimeError):
    """A C++ or CUDA compiler rejected generated source.

    ``str(err)`` holds the compiler's own diagnostics; the codegen's ``#line`` directives make them
    point at the user's Python file and line. Attributes: ``log`` (the compiler output as it came),
    ``command`` (the command line or option list used), ``source_path`` (where the failing source was
    saved, or None).
    """

    def __init__(self, message: str, *, log: str = "", command: str = "", source_path: Path | None = None):
        super().__init__(message)
        self.log = log
        self.command = command
        self.source_path = source_path


def set_cache_dir(path: str | os.PathLike | None) -> None:
    """Make ``path`` the kernel cache directory for builds that pass no ``cache_dir=``.

    ``set_cache_dir(None)`` goes back to the default, ``~/.cache/stepper/kernels``.
    """
    global _cache_dir_override
    _cache_dir_override = None if path is None else Path(path)


def get_cache_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """The directory a build with ``cache_dir=cache_dir`` uses (created if missing)."""
    if cache_dir is not None:
        path = Path(cache_dir)
    elif _cache_dir_override is not None:
        path = _cache_dir_override
    else:
        path = DEFAULT_CACHE_DIR
    path = path.expanduser()
    # Private: only we may put code here that we will load (cache_check.check_private).
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def safe_name(name: str) -> str:
    """``name`` reduced to characters that are safe in a file name on every platform."""
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._")
    return cleaned[:80] or "kernel"


class Hasher:
    """sha256 over a sequence of labelled parts (labels and lengths keep parts from running together)."""

    def __init__(self) -> None:
        self._h = hashlib.sha256()

    def add(self, label: str, data: str | bytes) -> "Hasher":
        if isinstance(data, str):
            data = data.encode("utf-8")
        self._h.update(f"{label}:{len(data)}:".encode())
        self._h.update(data)
        return self

    def add_include_dirs(self, include_dirs: Iterable[str | os.PathLike]) -> "Hasher":
        """Hash the path and contents of every header under each include directory."""
        for d in include_dirs:
            root = Path(d)
            self.add("include_dir", str(root.resolve()))
            if not root.is_dir():
                continue
            for header in sorted(p for p in root.rglob("*") if p.suffix in HEADER_SUFFIXES and p.is_file()):
                self.add("header_name", header.relative_to(root).as_posix())
                self.add("header_text", header.read_bytes())
        return self

    def hexdigest(self, n: int = 24) -> str:
        return self._h.hexdigest()[:n]


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file, no file, or all of ``data``."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        unlink_quietly(Path(tmp))
        raise


def temp_path_for(path: Path) -> Path:
    """A unique, not yet existing name in ``path``'s directory for a tool (a compiler) to write to.

    Hidden (leading dot) so that cache globs skip it; left to the tool to create so that it gets the
    tool's usual permissions.
    """
    return path.with_name(f".{path.stem}.{os.getpid()}.{secrets.token_hex(6)}.tmp{path.suffix}")


def unlink_quietly(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass
