"""Assemble PTX with the CUDA toolkit's `ptxas`, where one is installed, and read what it reports.

No GPU is needed: this checks that NVRTC's PTX assembles for real architectures and says what each
entry point costs in registers and spills (which bound occupancy on hardware).

    for entry, usage in assemble(ptx, "sm_90").items():
        print(entry, usage.registers, usage.spill_stores)
"""
from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ptxas_path", "ptxas_version", "assemble", "Usage", "ARCHITECTURES"]

ARCHITECTURES = ("sm_70", "sm_80", "sm_90")


@dataclass(frozen=True)
class Usage:
    registers: int
    spill_stores: int       # bytes
    spill_loads: int        # bytes


def ptxas_path() -> str | None:
    return shutil.which("ptxas")


def ptxas_version() -> tuple[int, int]:
    out = subprocess.run([ptxas_path(), "--version"], capture_output=True, text=True, timeout=60).stdout
    major, minor = re.search(r"release (\d+)\.(\d+)", out).groups()
    return int(major), int(minor)


def supported(arch: str) -> bool:
    """Whether this ptxas assembles for `arch` (CUDA 13 dropped everything below sm_75)."""
    return not (ptxas_version()[0] >= 13 and int(arch[3:5]) < 75)


def assemble(ptx: bytes, arch: str, timeout: float = 300) -> dict[str, Usage]:
    """Registers and spills of every entry of `ptx` assembled for `arch`; raises RuntimeError with
    ptxas' own message when it refuses the PTX."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "module.ptx"
        src.write_bytes(ptx)
        proc = subprocess.run([ptxas_path(), "-v", f"-arch={arch}", str(src), "-o", str(Path(tmp) / "module.cubin")],
                              capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"ptxas -arch={arch} failed:\n{proc.stderr.strip()}")
    usage, entry, spills = {}, None, (0, 0)
    for line in proc.stderr.splitlines():
        if m := re.search(r"Compiling entry function '(\w+)'", line):
            entry = m.group(1)
        elif m := re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line):
            spills = (int(m.group(1)), int(m.group(2)))
        elif (m := re.search(r"Used (\d+) registers", line)) and entry is not None:
            usage[entry] = Usage(int(m.group(1)), *spills)
            entry, spills = None, (0, 0)
    return usage
