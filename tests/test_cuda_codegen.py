"""CUDA codegen is checked on every machine: each kernel of the test suite compiles to PTX with NVRTC.

No GPU is needed. tests/conftest.py runs this file after every other test, so kernels that tests
define inside their functions are registered by then; module-level kernels of test files that did
not run (say `pytest tests/test_cuda_codegen.py` alone) are picked up by importing those files.
"""
from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import numpy as np
import pytest

import compiler as sp
from compiler.backends.common import BuildError
from compiler.backends.nvrtc import NvrtcNotFoundError, nvrtc_version
from compiler.backends.cuda_module import cuda_image
from compiler.runtime.device import is_cuda_available

_kernel_module = sys.modules["compiler.kernel"]   # `compiler.kernel` the attribute is the decorator

TESTS = Path(__file__).parent


def _nvrtc_or_skip():
    try:
        return nvrtc_version()
    except NvrtcNotFoundError as e:
        pytest.skip(f"NVRTC is not installed: {e}")


def _import_test_files():
    """Import every tests/**/test_*.py not imported yet, so their module-level kernels register."""
    loaded = {Path(m.__file__).resolve() for m in list(sys.modules.values())
              if getattr(m, "__file__", None)}
    for path in sorted(TESTS.rglob("test_*.py")):
        if path.resolve() in loaded or path.resolve() == Path(__file__).resolve():
            continue
        name = "_cuda_codegen_import_" + "_".join(path.relative_to(TESTS).with_suffix("").parts)
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        try:
            sys.modules[name] = module
            spec.loader.exec_module(module)
        except (Exception, pytest.skip.Exception):
            # The file's own collection reports (or skips) this; it has no kernels to check here.
            sys.modules.pop(name, None)


def _entries(ptx: bytes) -> set[str]:
    return set(re.findall(r"\.entry\s+(\w+)\s*\(", ptx.decode()))


def _ready_kernels(module):
    """The kernels KernelModule.render includes: those whose frontend and verifier accept them."""
    ready = []
    for k in module.kernels:
        try:
            ready.append(k.compiled())
        except Exception:
            continue
    return ready


def _cpu_build_fails(module, debug) -> bool:
    """True for modules that are broken on purpose (a native snippet that does not compile, say)."""
    from compiler.backends import build_cpu_library
    from compiler.kernel import PRELUDE_DIR
    try:
        build_cpu_library(module.render(debug).source, "cuda_codegen_check", include_dirs=[PRELUDE_DIR])
    except BuildError:
        return True
    return False


@pytest.mark.parametrize("debug", [False, True], ids=["release", "debug"])
def test_every_kernel_of_the_test_suite_compiles_to_ptx(debug):
    version = _nvrtc_or_skip()
    _import_test_files()
    failures, checked, forward, adjoint = [], 0, 0, 0
    for name, module in list(_kernel_module._MODULES.items()):
        ready = _ready_kernels(module)
        if not ready:
            continue
        try:
            ptx, _ = cuda_image(module, debug, arch="compute_75", output="ptx")
        except BuildError as e:
            if not _cpu_build_fails(module, debug):
                failures.append(f"module {name}: {e}")
            continue
        checked += 1
        entries = _entries(ptx)
        for c in ready:
            want = [c.forward.name + "_forward"] + ([c.adjoint.name] if c.adjoint is not None else []) \
                + ([c.gather.function.name] if c.gather is not None else [])
            missing = [w for w in want if w not in entries]
            if missing:
                failures.append(f"module {name}: no .entry for {missing} in the PTX")
            forward += 1
            adjoint += c.adjoint is not None
    assert not failures, f"NVRTC {version}: " + "\n\n".join(failures)
    assert checked > 0, "no kernel modules were found to compile"
    print(f"NVRTC {version[0]}.{version[1]}: {checked} modules, {forward} forward and {adjoint} adjoint "
          f"entry points compiled to PTX ({'debug' if debug else 'release'})")


# A module of its own that exercises what the emitter and prelude offer, so this file checks them
# even when the rest of the suite defines few kernels.
@sp.kernel
def _features(a: float, x: sp.array(dtype=float), xd: sp.array(dtype=sp.float64), xi: sp.array(dtype=int),
              xl: sp.array(dtype=sp.int64), v: sp.array(dtype=sp.vec3), m: sp.array(dtype=sp.mat33),
              n: int, out: sp.array(dtype=float), vout: sp.array(dtype=sp.vec3)):
    i = sp.tid()
    w = m[i] * v[i]
    vout[i] = sp.normalize(w) + sp.cross(w, v[i]) + sp.inverse(m[i]) * v[i]
    s = float(0.0)
    j = int(0)
    while j < n:                       # a dynamic loop: its adjoint uses the per-thread tape
        s = s * x[i] + sp.sin(a) / (1.0 + sp.exp(x[i]))
        if s > 100.0:
            break
        j += 1
    out[i] = s + sp.dot(w, w) + sp.determinant(m[i]) + float(i // 3) + float(i % 2) + sp.pow(sp.abs(a), 1.5)
    sp.atomic_add(out, 0, sp.length(v[i]))
    sp.atomic_min(out, 1, x[i])
    sp.atomic_max(out, 2, x[i])
    sp.atomic_add(xd, 0, 1.0)
    sp.atomic_min(xd, 1, 2.0)
    sp.atomic_max(xi, 0, i)
    sp.atomic_sub(xi, 1, i)
    sp.atomic_add(xl, 0, sp.int64(i))
    sp.atomic_max(xl, 1, sp.int64(i))
    sp.atomic_add(vout, 0, w)
    if i == 0:
        print("first thread: s = {}, w = {}", s, w)


def test_feature_kernel_has_forward_and_adjoint_entries():
    _nvrtc_or_skip()
    module = _features.module
    c = _features.compiled()
    assert c.adjoint is not None and c.needs_tape
    for debug in (False, True):
        ptx, rendered = cuda_image(module, debug)
        assert {c.forward.name + "_forward", c.adjoint.name} <= _entries(ptx)
        assert "__grid_constant__" in rendered.source and "__launch_bounds__" in rendered.source
        assert ".maxntid 256, 1, 1" in ptx.decode()
        assert bool(rendered.sites) == debug          # bounds-check sites only in debug builds
        # The host reads these with cuModuleGetGlobal after launches (error sites in debug builds).
        names = set(re.findall(r"^(?:\.visible )?\.global .* (sp_\w+)", ptx.decode(), re.MULTILINE))
        assert {"sp_tape_overflow", "sp_tape_words"} <= names
        if debug:
            assert {"sp_error_site", "sp_error_index"} <= names


@sp.kernel
def _blur32(x: sp.array(dtype=sp.float32), y: sp.array(dtype=sp.float32)):
    i = sp.tid()
    if i >= 1 and i < x.shape[0] - 1:
        y[i] = x[i - 1] * x[i] + x[i + 1]


@sp.kernel
def _blur64(x: sp.array(dtype=sp.float64), y: sp.array(dtype=sp.float64)):
    i = sp.tid()
    if i >= 1 and i < x.shape[0] - 1:
        y[i] = x[i - 1] * x[i] + x[i + 1]


@sp.kernel
def _blur_vec3(x: sp.array(dtype=sp.vec3), y: sp.array(dtype=sp.vec3)):
    i = sp.tid()
    if i >= 1 and i < x.shape[0] - 1:
        y[i] = sp.cross(x[i - 1], x[i]) + x[i + 1]


_blurs = {"float32": _blur32, "float64": _blur64, "vec3": _blur_vec3}


@pytest.mark.parametrize("dtype, gather_blocks", [("float32", 8), ("float64", 4), ("vec3", 2)])
def test_gather_passes_fit_more_blocks_as_their_values_narrow(dtype, gather_blocks):
    """The gather form's entries ask for as many resident blocks as their widest float values leave
    registers for (8 x 256 threads: 32 registers, for float32); forward and one-pass adjoint entries
    keep 2 (128 registers)."""
    from compiler.codegen.targets import render_cuda
    kernel = _blurs[dtype]
    compiled = kernel.compiled()
    assert compiled.gather is not None
    source = render_cuda([compiled.functions()], False).source
    bounds = {name: int(blocks) for blocks, name in re.findall(r"__launch_bounds__\(256, (\d+)\) (\w+)\(", source)}
    assert bounds[compiled.forward.name + "_forward"] == 2 and bounds[compiled.adjoint.name] == 2
    assert bounds[compiled.gather.function.name] == gather_blocks


def test_nvrtc_errors_point_at_the_users_line():
    """#line directives from the emitter make NVRTC report the kernel's Python file and line."""
    _nvrtc_or_skip()
    from compiler.backends.nvrtc import compile_cuda
    from compiler.backends.cuda_module import CUDA_OPTIONS, PRELUDE
    _, rendered = cuda_image(_features.module, False)
    line = next(l for l in rendered.source.splitlines() if l.startswith("#line") and "test_cuda_codegen" in l)
    broken = rendered.source.replace(line, line + "\nthis_is_not_cuda;", 1)
    with pytest.raises(BuildError) as info:
        compile_cuda(broken, "broken", headers={"prelude.h": PRELUDE.read_text()}, options=CUDA_OPTIONS)
    lineno = line.split()[1]
    assert f"test_cuda_codegen.py:{lineno}:" in str(info.value)


@pytest.mark.skipif(is_cuda_available(), reason="checks the message on machines without a GPU")
def test_cuda_without_a_gpu_says_what_was_not_found():
    with pytest.raises(RuntimeError, match=r"no NVIDIA driver/GPU was found \(.+\)"):
        sp.zeros(4, device="cuda")
    x = sp.zeros(4)
    with pytest.raises(RuntimeError, match=r"no NVIDIA driver/GPU was found \(.+\)"):
        sp.launch(_features, 4, inputs=[1.0, x, sp.zeros(2, dtype=sp.float64), sp.zeros(2, dtype=int),
                                        sp.zeros(2, dtype=sp.int64), sp.zeros(4, dtype=sp.vec3),
                                        sp.zeros(4, dtype=sp.mat33), 3],
                  outputs=[sp.zeros(4), sp.zeros(4, dtype=sp.vec3)], device="cuda")
    assert np.all(x.numpy() == 0)


def test_every_kernel_assembles_with_ptxas_within_the_register_cap(request):
    """NVRTC's PTX of every test module assembles for real GPUs, and `__launch_bounds__` keeps each
    entry at or under 128 registers (25% occupancy or more). Device-independent: the CPU run does it."""
    from concurrent.futures import ThreadPoolExecutor

    from compiler.backends import ptxas
    from compiler.codegen.targets import CUDA_BLOCK_SIZE, CUDA_MIN_BLOCKS_PER_SM
    if ptxas.ptxas_path() is None:
        pytest.skip("ptxas (the CUDA toolkit's assembler) is not on PATH")
    if request.config.getoption("--device") != "cpu":
        pytest.skip("device-independent: checked by the CPU run")
    _nvrtc_or_skip()
    _import_test_files()
    images = []
    for name, module in list(_kernel_module._MODULES.items()):
        if _ready_kernels(module):
            try:
                images.append((name, cuda_image(module, False, arch="compute_75", output="ptx")[0]))
            except BuildError:
                continue                 # broken on purpose; the PTX test above tells them apart
    archs = [a for a in ptxas.ARCHITECTURES if ptxas.supported(a)]
    jobs = [(name, ptx, arch) for name, ptx in images for arch in archs]
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda job: (job, _assemble_or_message(ptxas, *job[1:])), jobs))
    failures = [f"{job[0]} for {job[2]}: {usage}" for job, usage in results if isinstance(usage, str)]
    assert not failures, "\n".join(failures)
    cap = 65536 // (CUDA_BLOCK_SIZE * CUDA_MIN_BLOCKS_PER_SM)
    entries = [(job[0], job[2], entry, u) for job, usage in results for entry, u in usage.items()]
    heavy = [f"{m} {a} {e}: {u.registers} registers" for m, a, e, u in entries if u.registers > cap]
    assert not heavy, "\n".join(heavy)
    regs = sorted(u.registers for *_, u in entries)
    print(f"ptxas {ptxas.ptxas_version()}: {len(images)} modules x {archs} (sm_70 needs ptxas < 13): "
          f"{len(entries)} entries, registers median {regs[len(regs) // 2]}, max {regs[-1]}, "
          f"{sum(u.spill_stores > 0 for *_, u in entries)} spilling")


def _assemble_or_message(ptxas, ptx, arch):
    try:
        return ptxas.assemble(ptx, arch)
    except RuntimeError as e:
        return str(e)
