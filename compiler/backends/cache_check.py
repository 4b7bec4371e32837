"""Checked kernel-cache entries: a library is only loaded if its size and SHA-256 match a record
written beside it (``<lib>.check``, JSON ``{"size", "sha256"}``) when it was built.

A truncated library (a full disk, a copy cut short) killed the process with SIGBUS when loaded, and
a garbage or empty one gave a raw "invalid ELF header". The record is written before the library is
moved into place, so a reader that sees the library sees its record; anything that does not match
is rebuilt (a rebuild replaces the file atomically, so a concurrent reader is never left without one).
Hashing costs about a millisecond per library, once per process.

A record proves nothing against someone who can write the cache: they can plant a library and its
record, which we would then load and run as ourselves (users point caches at shared project or
scratch directories on clusters). So `check_private` refuses to load code (a library, a PTX or
CUBIN image) unless both the file and its directory belong to this user and neither is writable by
group or others; the cache directory is created 0700 (common.get_cache_dir) and libraries are
stored 0700 whatever the umask (cpu_build).
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
import threading
from pathlib import Path

from .common import BuildError, atomic_write

__all__ = ["record_path", "write_record", "is_valid", "check_private", "CACHE_HINT"]

CACHE_HINT = ("move the kernel cache with compiler.backends.set_cache_dir(path) (or a build's cache_dir=), "
              "or delete it: that is always safe")

_valid: set[str] = set()
_lock = threading.Lock()


def record_path(lib: Path) -> Path:
    return lib.with_name(lib.name + ".check")


def _digest(data: bytes) -> dict:
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def write_record(lib_data_path: Path, lib: Path) -> None:
    """Record the size and hash of the built file at `lib_data_path`, for `lib` (its final name)."""
    atomic_write(record_path(lib), json.dumps(_digest(lib_data_path.read_bytes())).encode())


def is_valid(lib: Path) -> bool:
    """Whether `lib` exists and matches its record (cached per process after the first check)."""
    key = str(lib)
    with _lock:
        if key in _valid:
            return True
    try:
        record = json.loads(record_path(lib).read_text())
        ok = _digest(lib.read_bytes()) == {"size": record["size"], "sha256": record["sha256"]}
    except (OSError, ValueError, KeyError, TypeError):
        return False
    if ok:
        with _lock:
            _valid.add(key)
    return ok


def forget(lib: Path) -> None:
    with _lock:
        _valid.discard(str(lib))


def check_private(path: Path, what: str = "kernel library") -> None:
    """Raise BuildError unless `path` and its directory are this user's own and not writable by group
    or others (a symlink counts as the file it is, which must then pass too)."""
    path = Path(path)
    for item, kind in ((path.parent, "the kernel cache directory"), (path, f"the {what}")):
        try:
            st = os.stat(item)
        except OSError as exc:
            raise BuildError(f"cannot check {kind} {item} before loading {path}: {exc.strerror or exc}; "
                             f"{CACHE_HINT}") from exc
        mode = stat.S_IMODE(st.st_mode)
        problem = None
        if hasattr(os, "getuid") and st.st_uid != os.getuid():
            problem = f"is owned by uid {st.st_uid}, not by you (uid {os.getuid()})"
        elif mode & 0o022:
            who = " and ".join(w for w, bit in (("group", 0o020), ("others", 0o002)) if mode & bit)
            problem = f"is writable by {who} (mode {mode:#o})"
        if problem:
            fix = f"chmod go-w {item}" if "writable" in problem else "use a cache directory of your own"
            raise BuildError(f"refusing to load {path}: {kind} {item} {problem}, so someone else could have "
                             f"put code there that would run as you. Fix: {fix}, or move the cache to a "
                             f"private directory with compiler.backends.set_cache_dir(path) (created 0700)")
