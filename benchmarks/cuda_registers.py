"""Registers and spills of every CUDA entry point of the test suite's kernels, per architecture.

    python benchmarks/cuda_registers.py                      # sm_80 and sm_90, table to stdout
    python benchmarks/cuda_registers.py --arch sm_90 --out benchmarks/results/cuda_registers.md

Needs NVRTC (nvidia-cuda-nvrtc-cu12) and the CUDA toolkit's `ptxas` on PATH; no GPU. Every module
of tests/**/test_*.py is rendered for CUDA, compiled to PTX by NVRTC and assembled by ptxas, whose
report gives each entry's registers and spill bytes. `__launch_bounds__(256, 2)` caps registers
at 128 (25% occupancy or more), and the gather form's passes at 32 or 64 (float32 or float64
values); the table lists the heaviest entries first, then a summary.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def import_test_kernels() -> None:
    """Import every tests/**/test_*.py, so that their module-level kernels register."""
    import pytest
    sys.path.insert(0, str(ROOT / "tests"))
    sys.path.insert(0, str(ROOT / "tests" / "stepper"))
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        loaded = {Path(m.__file__).resolve() for m in list(sys.modules.values()) if getattr(m, "__file__", None)}
        if path.resolve() in loaded:        # imported already by a file before it
            continue
        name = "_registers_" + "_".join(path.relative_to(ROOT / "tests").with_suffix("").parts)
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        try:
            sys.modules[name] = module
            spec.loader.exec_module(module)
        except (Exception, pytest.skip.Exception):      # a file that cannot load here has nothing to report
            sys.modules.pop(name, None)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", action="append", help="sm_80, sm_90 (repeatable; default both)")
    parser.add_argument("--top", type=int, default=25, help="rows of the heaviest entries to list")
    parser.add_argument("--out", help="also write the table to this Markdown file")
    args = parser.parse_args(argv)
    from compiler.backends import ptxas
    from compiler.backends.cuda_module import cuda_image
    from compiler.codegen.targets import CUDA_BLOCK_SIZE, CUDA_MIN_BLOCKS_PER_SM
    if ptxas.ptxas_path() is None:
        print("ptxas (the CUDA toolkit's assembler) is not on PATH", file=sys.stderr)
        return 2
    kernel_modules = sys.modules["compiler.kernel"]._MODULES
    import_test_kernels()
    archs = args.arch or ["sm_80", "sm_90"]
    rows = []
    for name, module in sorted(kernel_modules.items()):
        try:
            ptx = cuda_image(module, False, arch="compute_75", output="ptx")[0]
        except Exception:            # a module broken on purpose (the tests say which)
            continue
        for arch in archs:
            for entry, usage in ptxas.assemble(ptx, arch).items():
                rows.append((usage.registers, usage.spill_stores, usage.spill_loads, arch, name, entry))
    cap = 65536 // (CUDA_BLOCK_SIZE * CUDA_MIN_BLOCKS_PER_SM)
    rows.sort(reverse=True)
    registers = sorted(r[0] for r in rows)
    lines = [f"# CUDA registers per entry (ptxas {'.'.join(map(str, ptxas.ptxas_version()))}, {', '.join(archs)})", "",
             f"{len(rows)} entries; registers median {registers[len(registers) // 2]}, max {registers[-1]} "
             f"(cap {cap}); {sum(r[1] > 0 for r in rows)} entries spill.", "",
             "| registers | spill stores (B) | spill loads (B) | arch | module | entry |", "|---:|---:|---:|---|---|---|"]
    lines += [f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]} | {r[5]} |" for r in rows[:args.top]]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
