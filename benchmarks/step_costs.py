"""Per-step costs against the kernel's own time, contenders interleaved, medians (min-max).

    python benchmarks/step_costs.py                 # both measurements, 5 rounds
    python benchmarks/step_costs.py --rounds 3 --only rollout

- rollout: the 256^2 nonlinear wave (benchmarks/peer_impls), a forward rollout per step with
  trusted steps run from their trace (stepper/runs/rollout.py) and with the step function called every
  step, against the kernel alone replayed from a `capture()` graph on the same buffers.
- pendulums: issue 14's ensemble, 10,000 damped pendulums with a running loss (deterministic), a
  Revolve gradient per step evaluation (forward evaluations + reverse steps), against one launch of
  the forward kernel.
- series: a 2-D acoustic wave (float32, squared slowness `m` a parameter) whose step reads its
  source's value from a series (``s.series.src``, a row a step) and whose running loss samples
  receivers against observed data from another series: `evaluate` (forward, running loss) and a
  Revolve gradient, native and on the Python path (``Sweep.native_loops = False``: what every
  such step ran before the native paths served series and running losses), against the same
  kernels on fixed buffers called back to back from compiled code (`_LOOP`): forward, the step's
  and the loss's launch; reversed, the step's launch then the two adjoints, as the native reversal
  runs them; and forward, the step's kernel as a native run calls it on all but its last step,
  without its copying store ``up_next = u`` (renamed), which halves its time here.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests" / "stepper"))


def summary(values: list[float], digits: int = 1) -> str:
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def interleaved(contenders: dict, rounds: int) -> dict:
    """{name: [µs per step, one per round]}; each contender returns (seconds, steps)."""
    out = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            seconds, steps = fn()
            out[name].append(seconds / steps * 1e6)
    return out


def rollout_costs(rounds: int, steps: int = 3000) -> list[str]:
    import stepper as sp
    import stepper.runs.rollout as rollout_module
    from peer_impls.ours import make_model, wave_step
    from peer_impls.problem import B, C, initial
    n = 256
    u0 = initial(n)
    model, start = make_model(n), {"up": u0, "u": u0}
    buffers = [sp.array(u0) for _ in range(4)]
    with sp.capture() as graph:
        sp.launch(wave_step, (n, n), inputs=[buffers[0], buffers[1], C, B], outputs=[buffers[2], buffers[3]])

    def kernel():
        began = time.perf_counter()
        for _ in range(steps):
            graph.replay()
        return time.perf_counter() - began, steps

    def roll(loops: bool):
        def run():
            rollout_module.native_loops = loops
            began = time.perf_counter()
            model.rollout(start, steps, progress=False)
            return time.perf_counter() - began, steps
        return run
    roll(True)()
    roll(False)()
    t = interleaved({"kernel": kernel, "trusted": roll(True), "stepwise": roll(False)}, rounds)
    rollout_module.native_loops = True
    return [f"| 256^2 wave rollout, trusted steps from the trace | µs / step | {summary(t['trusted'])} | "
            f"{summary(t['kernel'])} | |",
            f"| 256^2 wave rollout, step function every step | µs / step | {summary(t['stepwise'])} | "
            f"{summary(t['kernel'])} | |"]


def pendulum_costs(rounds: int, steps: int = 4000) -> list[str]:
    import stepper as sp
    from physics_models import final_theta_squared, omega_squared, pendulum_model, pendulum_step
    n = 10_000
    model, initial = pendulum_model(n=n)
    theta, omega, a, b = (sp.array(np.ones(n), dtype=sp.float64) for _ in range(4))
    length, c = model.params["length"], model.params["c"]

    def kernel():
        began = time.perf_counter()
        for _ in range(1000):
            sp.launch(pendulum_step, n, inputs=[theta, omega, length, c, 0.01], outputs=[a, b])
        return time.perf_counter() - began, 1000

    def gradient():
        began = time.perf_counter()
        r = model.gradient(initial, steps, loss=final_theta_squared, running_loss=omega_squared,
                           schedule=sp.Revolve(steps, 40), progress=False)
        return time.perf_counter() - began, r.stats.forward_steps + r.stats.reverse_steps
    gradient()
    t = interleaved({"kernel": kernel, "gradient": gradient}, rounds)
    return [f"| 10,000 pendulums, running loss, Revolve({steps}, 40) gradient | µs / step evaluation | "
            f"{summary(t['gradient'])} | {summary(t['kernel'])} | |"]


_LOOP = r"""
#include <cstdint>
typedef void (*forward_t)(const char*, int);
typedef int (*adjoint_t)(const char*, const char*, void*, int64_t, int, void*, int);
// `steps` times: forward entries (entry, buffer, 0, serial) then adjoints (entry, buffer, adj buffer, serial)
extern "C" void kernel_loop(int64_t steps, const int64_t* f, int64_t n_f, const int64_t* a, int64_t n_a) {
    for (int64_t k = 0; k < steps; ++k) {
        for (int64_t l = 0; l < n_f; ++l)
            ((forward_t)f[4 * l])((const char*)f[4 * l + 1], (int)f[4 * l + 3]);
        for (int64_t l = 0; l < n_a; ++l)
            ((adjoint_t)a[4 * l])((const char*)a[4 * l + 1], (const char*)a[4 * l + 2], nullptr, 0, 0, nullptr,
                                  (int)a[4 * l + 3]);
    }
}
"""


def _kernel_loop():
    """Kernels back to back in compiled code, on the buffers they were packed with: their own time."""
    import ctypes
    from compiler.backends.cpu_build import build_cpu_library, load_cpu_library
    fn = load_cpu_library(build_cpu_library(_LOOP, "bench_kernel_loop")).kernel_loop
    fn.argtypes = [ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64]
    fn.restype = None
    return fn


def series_costs(rounds: int, n: int = 64, steps: int = 1000, snapshots: int = 20) -> list[str]:
    import ctypes
    import stepper as sp
    from compiler.runtime.copy_kernels import renamed_forward
    from compiler.runtime.launch import packed_adjoint, packed_forward
    from stepper.execute.executor import Sweep
    from acoustic_series import acoustic_model
    model, initial, running_loss, fixed = acoustic_model(n, steps)
    entries, buffers = [], []                        # forward: step, loss; then the adjoints: loss, step
    for kernel, dims, inputs, outputs in fixed:
        entry, packed, serial, _ = packed_forward(kernel, dims, [*inputs, *outputs], True)
        buffers.append(ctypes.create_string_buffer(packed, len(packed)))
        entries.append((entry, ctypes.addressof(buffers[-1]), serial))
    adjoints = []
    for (kernel, dims, inputs, outputs), (_, buf, _) in reversed(list(zip(fixed, entries))):
        entry, packed, serial = packed_adjoint(kernel, dims, [*inputs, *outputs], True, {})
        buffers.append(ctypes.create_string_buffer(packed, len(packed)))
        adjoints.append((entry, buf, ctypes.addressof(buffers[-1]), serial))
    loop = _kernel_loop()
    forward_table = (ctypes.c_int64 * 12)(*[x for e in entries for x in (e[0], e[1], 0, e[2])])
    # as a native run calls them on all but its last step: the step's kernel without its copying
    # store up_next = u (renamed: stepper/execute/fast/native_loop.py), which takes about half the time here
    renamed_table = (ctypes.c_int64 * 12)(*forward_table)
    renamed_table[0] = renamed_forward(fixed[0][0])
    reverse_table = (ctypes.c_int64 * 12)(*[x for e in adjoints for x in e])

    def forward_kernels():
        began = time.perf_counter()
        loop(steps, forward_table, 2, None, 0)
        return time.perf_counter() - began, steps

    def renamed_kernels():
        began = time.perf_counter()
        loop(steps, renamed_table, 2, None, 0)
        return time.perf_counter() - began, steps

    def reverse_kernels():                           # the step's launch (the loss reads it), the adjoints
        began = time.perf_counter()
        loop(steps, forward_table, 1, reverse_table, 2)
        return time.perf_counter() - began, steps

    def evaluate(native: bool):
        def run():
            Sweep.native_loops = native
            began = time.perf_counter()
            model.evaluate(initial, steps, running_loss=running_loss, progress=False)
            return time.perf_counter() - began, steps
        return run

    counts = {}

    def gradient(native: bool):
        def run():
            Sweep.native_loops = native
            began = time.perf_counter()
            r = model.gradient(initial, steps, running_loss=running_loss, schedule=sp.Revolve(steps, snapshots),
                               progress=False)
            counts[native] = (r.stats.forward_steps, r.stats.reverse_steps, r.loss)
            return time.perf_counter() - began, 1
        return run
    for fn in (evaluate(True), evaluate(False), gradient(True), gradient(False)):
        fn()
    assert counts[True] == counts[False], (counts, "the native and Python paths must agree")
    t = interleaved({"fwd": forward_kernels, "renamed": renamed_kernels, "rev": reverse_kernels, "eval": evaluate(True),
                     "eval_py": evaluate(False), "grad": gradient(True), "grad_py": gradient(False)}, rounds)
    Sweep.native_loops = True
    fwd_steps, rev_steps, _ = counts[True]
    kernels = [f * fwd_steps + r * rev_steps for f, r in zip(t["fwd"], t["rev"])]     # µs per gradient
    renamed = [f * fwd_steps + r * rev_steps for f, r in zip(t["renamed"], t["rev"])]
    # ratios with two decimals: the bound they are read against is 1.15x
    ratio = lambda ours, base: summary([a / b for a, b in zip(ours, base)], 2)       # noqa: E731
    return [f"| {n}^2 acoustic wave, source from a series, receivers' running loss: forward (`evaluate`), "
            f"native | µs / step | {summary(t['eval'])} | {summary(t['fwd'])} | "
            f"{ratio(t['eval'], t['fwd'])}x |",
            f"| same, native, against the kernels as it calls them (the copy renamed) | µs / step | "
            f"{summary(t['eval'])} | {summary(t['renamed'])} | {ratio(t['eval'], t['renamed'])}x |",
            f"| same, Python path | µs / step | {summary(t['eval_py'])} | {summary(t['fwd'])} | "
            f"{ratio(t['eval_py'], t['fwd'])}x |",
            f"| same, Revolve({steps}, {snapshots}) gradient ({fwd_steps} forward + {rev_steps} reverse steps), "
            f"native | ms | {summary([x / 1e3 for x in t['grad']])} | {summary([x / 1e3 for x in kernels])} | "
            f"{ratio(t['grad'], kernels)}x |",
            f"| same, native, forward steps' kernels as an advance calls them (the copy renamed) | ms | "
            f"{summary([x / 1e3 for x in t['grad']])} | {summary([x / 1e3 for x in renamed])} | "
            f"{ratio(t['grad'], renamed)}x |",
            f"| same, Python path | ms | {summary([x / 1e3 for x in t['grad_py']])} | "
            f"{summary([x / 1e3 for x in kernels])} | {ratio(t['grad_py'], kernels)}x |",
            f"| (the kernels: one step forward, step + loss (renamed) / reversed, step + both adjoints) | µs | "
            f"{summary(t['fwd'])} ({summary(t['renamed'])}) / {summary(t['rev'])} | | |"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", choices=["rollout", "pendulums", "series"])
    parser.add_argument("--size", type=int, default=64, help="grid side of the series measurement")
    parser.add_argument("--steps", type=int, default=1000, help="steps of the series measurement")
    args = parser.parse_args(argv)
    rows = ["| measurement | unit | ours | kernel alone | ratio |", "|---|---|---:|---:|---:|"]
    if args.only in (None, "rollout"):
        rows += rollout_costs(args.rounds)
    if args.only in (None, "pendulums"):
        rows += pendulum_costs(args.rounds)
    if args.only in (None, "series"):
        rows += series_costs(args.rounds, args.size, args.steps)
    print(f"Medians (min-max) over {args.rounds} interleaved rounds.\n")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
