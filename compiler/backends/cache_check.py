"""Checked kernel-cache entries: a library is only loaded if its size and SHA-256 match a record
written beside it (``<lib>.check``, JSON ``{"size", "sha256"}``) when it was built.

A truncated library (a full disk, a copy cut short) killed the process with SIGBUS when loaded, and
a garbage or empty one gave a raw "invalid ELF header". The record is written before the library is
moved into place, so a reader that sees the library sees its record; anything that does not match
is rebuilt (a rebuild replaces the file atomically, so a concurrent reader is never left without one).
Hashing costs about a millisecond per library, once per process.
"""
from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

from .common import atomic_write

__all__ = ["record_path", "write_record", "is_valid", "CACHE_HINT"]

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
