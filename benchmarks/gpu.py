"""The one GPU command: on a machine with an NVIDIA GPU (and no network), install the project without
dependencies, run the test suite on the GPU, and measure what only hardware can show.

    python benchmarks/gpu.py                    # install, suite with --device cuda, benchmarks
    python benchmarks/gpu.py --skip-install --skip-tests --quick

Writes a Markdown table (default benchmarks/results/gpu.md) with:
- saxpy bandwidth against the device's own copy bandwidth (cuMemcpyDtoD of the same bytes);
- the cost of one `launch` (tiny kernel, queued back to back) and of one launch replayed from a
  `capture()` graph; the host's cost of a trace replay's launch against the driver call alone;
- a deterministic loss over 1M floats (chunked partials, the CPU's bits) against atomics;
- the 256^2 and 2048^2 nonlinear wave (benchmarks/peer_impls/problem.py): our Revolve gradient
  against JAX's nested remat on the same GPU, and our forward rollout against a CuPy raw-kernel loop;
- our own alternatives side by side: native loops (recomputations as CUDA graphs, recordings
  reversed at once without a tape) against launch by launch through the tape, the reversals alone,
  and disk snapshots copied asynchronously against synchronously;
- the nonlinear wave's adjoint kernel under the gather form's launch bounds against 2 blocks an SM,
  and the 8th-order FWI update's as the FWI gradient launches it against half the gather bound;
- the adjoint / forward kernel time of each stencil spelling, 2nd/4th/8th order, 4096^2 and 256^3,
  float32 and float64 (benchmarks/kernel_spellings.py, a table of its own).
Every number is the median of interleaved rounds (A B A B ...), with the spread (min-max). Peers
that are not installed are left out. Under the CUDA simulator (STEPPER_CUDA_SIM=1) it runs too,
which checks the script, not the speed.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def _sync():
    from compiler.backends.cuda_driver import synchronize
    synchronize(0)


def _timed(fn) -> float:
    _sync()
    t0 = time.perf_counter()
    fn()
    _sync()
    return time.perf_counter() - t0


def interleaved(contenders: dict, rounds: int) -> dict:
    """{name: [seconds per round]}, running the contenders in turn, round after round."""
    times = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            times[name].append(_timed(fn))
    return times


def summary(seconds: list[float], scale: float = 1.0) -> str:
    s = [x * scale for x in seconds]
    return f"{statistics.median(s):.4g} ({min(s):.4g}-{max(s):.4g})"


def bandwidth(rows: list, n: int, rounds: int) -> None:
    import stepper as sp
    from compiler.backends.cuda_driver import _check, _driver

    @sp.kernel
    def saxpy(a: float, x: sp.array(dtype=float), y: sp.array(dtype=float), out: sp.array(dtype=float)):
        i = sp.tid()
        out[i] = a * x[i] + y[i]

    x, y, out = sp.ones(n, device="cuda"), sp.ones(n, device="cuda"), sp.zeros(n, device="cuda")
    sp.launch(saxpy, n, inputs=[2.0, x, y], outputs=[out])
    t = interleaved({"saxpy": lambda: sp.launch(saxpy, n, inputs=[2.0, x, y], outputs=[out]),
                     "copy": lambda: _check(_driver().cuMemcpyDtoD(out.ptr, x.ptr, 4 * n), "cuMemcpyDtoD")}, rounds)
    gbs = lambda secs, nbytes: [nbytes / s / 1e9 for s in secs]      # noqa: E731
    saxpy_gbs, copy_gbs = gbs(t["saxpy"], 12 * n), gbs(t["copy"], 8 * n)
    ratio = [a / b for a, b in zip(saxpy_gbs, copy_gbs)]
    rows.append((f"saxpy, {n:,} floats", "GB/s (12 B/element)", summary(saxpy_gbs), "device copy", summary(copy_gbs),
                 summary(ratio)))


def launch_overhead(rows: list, rounds: int, count: int = 1000) -> None:
    import stepper as sp

    @sp.kernel
    def bump(x: sp.array(dtype=float)):
        x[sp.tid()] = x[sp.tid()] + 1.0

    x = sp.zeros(32, device="cuda")
    sp.launch(bump, 32, inputs=[], outputs=[x])
    with sp.capture() as graph:
        for _ in range(count):
            sp.launch(bump, 32, inputs=[], outputs=[x])

    def launches():
        for _ in range(count):
            sp.launch(bump, 32, inputs=[], outputs=[x])
    t = interleaved({"launch": launches, "graph": graph.replay}, rounds)
    rows.append(("launch of a 32-thread kernel", "us per launch", summary(t["launch"], 1e6 / count),
                 "graph replay", summary(t["graph"], 1e6 / count),
                 summary([a / b for a, b in zip(t["launch"], t["graph"])])))


def host_cost(rows: list, rounds: int, count: int = 2000, n: int = 256) -> None:
    """What one launch costs the host: a step's trace replay (`relaunch`, what recomputed steps and
    reversals outside graphs pay per launch) against the cuda-bindings `cuLaunchKernel` call alone,
    its arguments prepared (an n x n wave step; the GPU side is queued, not waited for)."""
    import ctypes

    import stepper as sp
    from compiler.backends import cuda_driver
    from compiler.backends import cuda_launch as cl
    from compiler.backends.cuda_module import cuda_module
    from compiler.runtime.device import get_device
    from compiler.runtime.launch import packed_forward, relaunch
    from peer_impls.ours import wave_step
    from peer_impls.problem import B, C
    a, b, c, d = (sp.zeros((n, n), dtype=sp.float32, device="cuda") for _ in range(4))
    args = [a, b, C, B, c, d]
    relaunch(wave_step, (n, n), args, False)
    fn = cuda_module(wave_step.module, False, get_device("cuda:0")).function(wave_step.compiled().forward.name,
                                                                             adjoint=False)
    _, packed, serial, _ = packed_forward(wave_step, (n, n), args, False, "cuda:0")
    buf = cl._by_value(packed)
    params = (ctypes.c_void_p * 1)(ctypes.addressof(buf))
    driver, stream = cuda_driver._driver(), cuda_driver._driver().CUstream(0)
    grid, block = cl._grid(n * n, serial, 0)

    def repeat(fn):
        def run():
            for _ in range(count):
                fn()
        return run
    t = interleaved({"relaunch": repeat(lambda: relaunch(wave_step, (n, n), args, False)),
                     "raw": repeat(lambda: driver.cuLaunchKernel(fn, grid, 1, 1, block, 1, 1, 0, stream,
                                                                 ctypes.addressof(params), 0))}, rounds)
    rows.append((f"host cost of a trace replay's launch (relaunch), {n}^2 wave step", "us per launch", summary(t["relaunch"], 1e6 / count),
                 "cuLaunchKernel call alone", summary(t["raw"], 1e6 / count),
                 summary([x / y for x, y in zip(t["relaunch"], t["raw"])])))


def deterministic_loss(rows: list, n: int, rounds: int, count: int = 20) -> None:
    """A loss kernel adding n float32 values into one element: deterministic (a GPU thread per
    chunk of 4,096, partials added in chunk order: the CPU's bits) against atomics in any order."""
    import stepper as sp

    @sp.kernel
    def sum_squares(x: sp.array(dtype=float), out: sp.array(dtype=float)):
        i = sp.tid()
        sp.atomic_add(out, 0, x[i] * x[i])

    x, out = sp.ones(n, device="cuda"), sp.zeros(1, device="cuda")

    def runs(deterministic: bool):
        def run():
            for _ in range(count):
                sp.launch(sum_squares, n, inputs=[x], outputs=[out], deterministic=deterministic)
        return run
    runs(True)(), runs(False)()
    t = interleaved({"chunked": runs(True), "atomics": runs(False)}, rounds)
    rows.append((f"deterministic loss, {n:,} floats", "us per launch", summary(t["chunked"], 1e6 / count),
                 "atomics (any order)", summary(t["atomics"], 1e6 / count),
                 summary([a / b for a, b in zip(t["chunked"], t["atomics"])])))


def _wave_model(n: int):
    """(model, loss, initial state) of the n x n nonlinear wave on the GPU."""
    import stepper as sp
    from peer_impls.ours import half_sum_sq, wave_step
    from peer_impls.problem import B, C, initial

    model = sp.Model(device="cuda", zero_buffers=False)
    model.state("up", (n, n), sp.float32)
    model.state("u", (n, n), sp.float32)

    @model.step
    def step(s):
        sp.launch(wave_step, (n, n), inputs=[s.prev.up, s.prev.u, C, B], outputs=[s.next.up, s.next.u])

    def loss(state):
        out = sp.zeros(1, device="cuda", requires_grad=True)
        sp.launch(half_sum_sq, (n, n), inputs=[state.u], outputs=[out])
        return out
    u0 = initial(n)
    return model, loss, {"up": u0, "u": u0}


def wave(rows: list, n: int, steps: int, snapshots: int, rounds: int) -> None:
    import stepper as sp
    from peer_impls.problem import B, C
    model, loss, start = _wave_model(n)
    u0 = start["u"]
    ours = {"forward": lambda: model.rollout(start, steps=steps),
            "gradient": lambda: model.gradient(start, steps=steps, loss=loss, schedule=sp.Revolve(steps, snapshots))}
    peers = {}
    try:
        from peer_impls.jax_peers import JaxRunner
        jax = JaxRunner(n, steps, "nested")
        peers["gradient"] = ("JAX nested remat", jax.gradient)
    except Exception as e:      # not installed, or no GPU backend
        print(f"JAX left out: {e}")
    try:
        peers["forward"] = ("CuPy raw kernel", _cupy_forward(n, steps, C, B, u0))
    except Exception as e:
        print(f"CuPy left out: {e}")
    for what in ("forward", "gradient"):
        ours[what]()                     # compile and warm up
        contenders = {"ours": ours[what]}
        if what in peers:
            peers[what][1]()
            contenders["peer"] = peers[what][1]
        t = interleaved(contenders, rounds)
        peer = peers.get(what, ("-", None))[0]
        rows.append((f"wave {n}^2, {steps} steps, {what}" + (f" (Revolve-{snapshots})" if what == "gradient" else ""),
                     "s", summary(t["ours"]), peer, summary(t["peer"]) if "peer" in t else "-",
                     summary([a / b for a, b in zip(t["ours"], t["peer"])]) if "peer" in t else "-"))


def own_alternatives(rows: list, n: int, steps: int, rounds: int, scratch: Path) -> None:
    """Our own paths side by side: native loops (recomputations as CUDA graphs, stepper/execute/fast/graph_loop.py,
    and recordings reversed at once without a tape, stepper/execute/fast/native_reverse.py) against launch by
    launch through the tape; the reversals alone against the tape; and disk snapshots leaving the
    GPU by asynchronous copies against waiting for each copy (Tiers.MAX_IN_FLIGHT = 0)."""
    import stepper as sp
    import stepper.execute.fast.native_reverse as native_reverse
    from stepper.execute.executor import Sweep
    from stepper.execute.fast.graph_loop import GraphLoops
    from stepper.execute.snapshots import Tiers
    model, loss, start = _wave_model(n)
    revolve = lambda: model.gradient(start, steps=steps, loss=loss, schedule=sp.Revolve(steps, 10))  # noqa: E731

    def multilevel():
        path = scratch / "snapshots.h5"
        path.unlink(missing_ok=True)
        model.gradient(start, steps=steps, loss=loss, schedule=sp.MultiLevel(steps, 2, 8), storage=path)

    def toggled(fn, owner, name, value):
        def run():
            saved = getattr(owner, name)
            setattr(owner, name, value)
            try:
                fn()
            finally:
                setattr(owner, name, saved)
        return run
    for label, fn, owner, name, off, peer in (
            ("Revolve-10 gradient, native loops", revolve, Sweep, "native_loops", False,
             "launch by launch, through the tape"),
            ("Revolve-10 gradient, reversals without a tape", revolve, native_reverse, "plannable",
             lambda trace: False, "through the tape"),
            ("MultiLevel(2 RAM, 8 HDF5) gradient, async snapshot copies", multilevel, Tiers, "MAX_IN_FLIGHT", 0,
             "synchronous copies"),
            (f"Revolve-10 gradient, graphs from {GraphLoops.MIN_STEPS} steps", revolve, GraphLoops, "MIN_STEPS", 3,
             "graphs from 3 steps (a first step and one pair)")):
        fn()                             # compile and warm up
        t = interleaved({"ours": fn, "peer": toggled(fn, owner, name, off)}, rounds)
        rows.append((f"wave {n}^2, {steps} steps, {label}", "s", summary(t["ours"]), peer, summary(t["peer"]),
                     summary([a / b for a, b in zip(t["ours"], t["peer"])])))


def _cupy_forward(n, steps, C, B, u0):
    import cupy as cp
    kernel = cp.RawKernel(r"""
extern "C" __global__ void wave(const float* up, const float* u, float c, float b, int n, float* up_next, float* u_next) {
    int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n * n) return;
    int i = k / n, j = k % n;
    float x = u[k], lap = -4.0f * x;
    if (i > 0) lap += u[k - n];
    if (i < n - 1) lap += u[k + n];
    if (j > 0) lap += u[k - 1];
    if (j < n - 1) lap += u[k + 1];
    up_next[k] = x;
    u_next[k] = 2.0f * x - up[k] + c * lap - b * x * x * x;
}""", "wave")
    bufs = [cp.asarray(u0) for _ in range(4)]
    blocks = (n * n + 255) // 256

    def run():
        a, b_, c_, d = bufs
        for _ in range(steps):
            kernel((blocks,), (256,), (a, b_, np.float32(C), np.float32(B), np.int32(n), c_, d))
            a, b_, c_, d = c_, d, a, b_
        cp.cuda.Device().synchronize()
    return run


def gather_bound(rows: list, n: int, rounds: int) -> None:
    """The nonlinear wave's adjoint kernel alone (benchmarks/gpu_launch_bounds.py's `wave` case) under
    the gather form's `__launch_bounds__` (targets.CUDA_GATHER_MIN_BLOCKS_PER_SM: 32 registers)
    against 2 blocks (52 registers): the one difference in the CUDA source of the 2048^2 gradient
    between e7ea571 (0.224 s on an H200) and e847f18 (0.272 s)."""
    import stepper as sp
    import kernel_spellings
    from compiler.codegen import targets
    from gpu_launch_bounds import calls_under_bounds
    shared = kernel_spellings._shared_arguments((n, n), sp.float32, np.random.default_rng(0), 2, "cuda")
    forward, gather = targets.CUDA_MIN_BLOCKS_PER_SM, targets.CUDA_GATHER_MIN_BLOCKS_PER_SM
    built = calls_under_bounds("wave", sp.float32, (n, n), shared, [(forward, gather), (forward, forward)])
    rows.append(_adjoints_row(f"wave {n}^2 adjoint kernel, gather passes at {gather} blocks an SM",
                              built[("wave", forward, gather)][1], f"{forward} blocks an SM",
                              built[("wave", forward, forward)][1], rounds))


def _adjoints_row(label: str, ours, peer_label: str, peer, rounds: int) -> tuple:
    """A table row timing two adjoint calls on the GPU, interleaved over `rounds`, in us."""
    import kernel_spellings
    t = {"ours": [], "peer": []}
    for _ in range(rounds):
        for key, adjoint in (("ours", ours), ("peer", peer)):
            t[key].append(kernel_spellings._seconds(adjoint, device="cuda"))
    return (label, "us", summary(t["ours"], 1e6), peer_label, summary(t["peer"], 1e6),
            summary([a / b for a, b in zip(t["ours"], t["peer"])]))


def fwi_bound(rows: list, n2: int, n3: int, rounds: int) -> None:
    """The float32 8th-order FWI update's adjoint kernel as the FWI gradient launches it, 2-D and 3-D,
    with the gather form's passes at targets.CUDA_GATHER_MIN_BLOCKS_PER_SM blocks an SM (32
    registers: ptxas 13.0 spills 64 bytes a thread in the 2-D transposed pass, 160 in the 3-D one)
    against half as many (64 registers, no spills): which costs more, spills or occupancy."""
    import stepper as sp
    import kernel_spellings
    from compiler.codegen import targets
    from gpu_launch_bounds import calls_under_bounds
    forward, gather = targets.CUDA_MIN_BLOCKS_PER_SM, targets.CUDA_GATHER_MIN_BLOCKS_PER_SM
    for case, shape in (("2:8", (n2, n2)), ("3:8", (n3,) * 3)):
        shared = kernel_spellings._shared_arguments(shape, sp.float32, np.random.default_rng(0), 8, "cuda")
        built = calls_under_bounds(case, sp.float32, shape, shared, [(forward, gather), (forward, gather // 2)],
                                   as_launched=True)
        rows.append(_adjoints_row(f"FWI {len(shape)}-D {shape[0]}^{len(shape)} 8th-order adjoint kernel as launched, "
                                  f"gather passes at {gather} blocks an SM", built[("fwi", forward, gather)][1],
                                  f"{gather // 2} blocks an SM", built[("fwi", forward, gather // 2)][1], rounds))


def kernel_spellings(quick: bool, rounds: int, failed: list) -> list[str]:
    """The kernel spellings' table on the GPU (rows printed as they come), or [] where it failed."""
    from kernel_spellings import kernel_table
    try:
        return kernel_table([2] if quick else [2, 4, 8], [2, 3], ["float32", "float64"], 24 if quick else 4096,
                            8 if quick else 256, rounds, None, "cuda")
    except Exception:
        traceback.print_exc()
        failed.append("kernel_spellings")
        return []


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--skip-install", action="store_true")
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (checks the script, e.g. on the simulator)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-spellings", action="store_true", help="leave out the kernel spellings' table")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "gpu.md"))
    args = parser.parse_args(argv)
    lines = [f"# GPU run, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", ""]
    if os.environ.get("STEPPER_CUDA_SIM", "") not in ("", "0"):
        lines += ["**On the CUDA simulator: these numbers say nothing about a GPU.**", ""]
    if not args.skip_install:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e",
                        str(ROOT)], check=True)
    if not args.skip_tests:
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--device", "cuda"],
                              cwd=ROOT, capture_output=True, text=True)
        tail = [line for line in proc.stdout.splitlines() if line.strip()][-1:] or ["(no output)"]
        print(proc.stdout[-5000:], proc.stderr[-2000:])
        lines += [f"Test suite with `--device cuda`: `{tail[0]}` (exit code {proc.returncode})", ""]
    rounds = 3 if args.quick else args.rounds
    rows: list = []
    failed = []

    def section(fn, *fn_args):
        # Each row is printed as it comes and a failing section does not stop the others: device time
        # is scarce, and a run cut off at its time limit still reports what it measured.
        done = len(rows)
        try:
            fn(rows, *fn_args)
        except Exception:
            traceback.print_exc()
            failed.append(fn.__name__)
        for row in rows[done:]:
            print("| " + " | ".join(row) + " |", flush=True)
    section(bandwidth, 1 << 12 if args.quick else 1 << 26, rounds)
    section(launch_overhead, rounds, 20 if args.quick else 1000)
    section(host_cost, rounds, 5 if args.quick else 2000, 16 if args.quick else 256)
    section(deterministic_loss, 1 << 15 if args.quick else 1 << 20, rounds, 2 if args.quick else 20)
    for n, steps, snapshots in ([(16, 20, 4)] if args.quick else [(256, 10_000, 100), (2048, 1_000, 30)]):
        section(wave, n, steps, snapshots, rounds)
    section(gather_bound, 24 if args.quick else 2048, rounds)
    section(fwi_bound, 24 if args.quick else 4096, 10 if args.quick else 256, rounds)
    with tempfile.TemporaryDirectory() as scratch:
        section(own_alternatives, 16 if args.quick else 256, 60 if args.quick else 2_000, rounds, Path(scratch))
    spellings = [] if args.no_spellings else kernel_spellings(args.quick, rounds, failed)
    if failed:
        lines += [f"Failed (traceback in the output): {', '.join(failed)}", ""]
    lines += [f"Medians over {rounds} interleaved rounds (min-max).", "",
              "| measurement | unit | ours | peer | peer's | ours / peer |", "|---|---|---:|---|---:|---:|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    if spellings:
        lines += ["", "Kernel spellings (benchmarks/kernel_spellings.py), every gradient present:", "", *spellings]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
