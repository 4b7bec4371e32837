"""The process's resident memory, for peak-RSS columns: Linux /proc only, None elsewhere.

`reset_peak` uses /proc/self/clear_refs ("5" resets VmHWM to the current RSS, Linux >= 4.0), so each
configuration of a sweep gets its own peak even though they share one process; `trim` first hands
freed heap back to the OS (glibc's malloc_trim) so one run's leftovers do not count as the next's.
"""
from __future__ import annotations

import ctypes
import ctypes.util

__all__ = ["current_bytes", "peak_bytes", "reset_peak", "trim"]


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def current_bytes() -> int | None:
    kib = _status_kib("VmRSS")
    return None if kib is None else kib * 1024


def peak_bytes() -> int | None:
    """The most the process has held resident since the last `reset_peak` (or its start)."""
    kib = _status_kib("VmHWM")
    return None if kib is None else kib * 1024


def reset_peak() -> bool:
    """Make the peak start again from the current RSS; False where the system cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def trim() -> None:
    name = ctypes.util.find_library("c")
    try:
        ctypes.CDLL(name).malloc_trim(0)
    except (OSError, AttributeError, TypeError):
        pass            # not glibc: nothing to hand back explicitly
