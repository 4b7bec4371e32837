"""Gradient of the nonlinear 2-D wave equation through stepper's schedules (CPU): time and memory.

    python benchmarks/wave.py                      # 512x512 float32, 2,000 steps, all schedules
    python benchmarks/wave.py --n 128 --steps 200  # quick

Each schedule runs in its own process (so its peak RSS is its own) and reports, measured in that run:
- t_f: one forward step (a plain rollout), t_a: one adjoint step (a recorded step's backward);
- forward steps (must equal the schedule's own count), gradient wall time, and
  wall / (forward_steps t_f + n t_a) (goal <= 1.1), gradient time / forward time (n t_f);
- "in-run": wall / (time inside the run's forward steps + adjoint steps), the same ratio with the
  step times measured during the gradient itself (robust to a machine whose load changes);
- peak memory counted by the stepper (state versions, scratch, gradients, RAM snapshots) in state
  sizes, against the goal (RAM snapshots + 3) states + one step's scratch (none here) + a constant;
  and the process's peak RSS growth during the gradient.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

CONFIGS = ["storeall", "revolve10", "revolve20", "revolve50", "multilevel"]


def make_schedule(name, steps, tmp, disk_costs=(0.0, 0.0)):
    """The schedule, its storage and its RAM snapshot count; `disk_costs` prices a disk snapshot's
    write and read in forward steps (measured in `one`), so MultiLevel trades I/O for recomputation."""
    import stepper as sp
    if name == "storeall":
        return sp.StoreAll(steps), None, 0
    if name.startswith("revolve"):
        s = int(name[len("revolve"):])
        return sp.Revolve(steps, s), None, s
    if name == "multilevel":
        write_cost, read_cost = disk_costs
        return (sp.MultiLevel(steps, 10, 40, write_cost=write_cost, read_cost=read_cost),
                os.path.join(tmp, "wave_snapshots.h5"), 10)
    raise SystemExit(f"unknown config {name}")


def rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def current_rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def one(name: str, n: int, steps: int, deterministic: bool) -> dict:
    import stepper as sp
    from stepper.bench.problems.wave import make, wave_step
    problem = make(n)            # the trade-off tool's wave: the same kernel, model and loss
    model, initial, energy = problem.model, problem.initial, problem.loss
    u0 = initial["u"].numpy().copy()
    model.rollout(initial, 3, deterministic=deterministic)          # compile and warm up

    probe = min(steps, 50)
    start = time.perf_counter()
    model.rollout(initial, probe, deterministic=deterministic, progress=False)
    t_f = (time.perf_counter() - start) / probe

    arrays = [sp.array(u0, requires_grad=True) for _ in range(4)]
    tape = sp.Tape(deterministic=deterministic)
    with tape:
        sp.launch(wave_step, (n, n), inputs=[arrays[0], arrays[1], 0.25, 1e-3, n], outputs=arrays[2:])
    tape.backward(grads={arrays[2]: 1.0, arrays[3]: 1.0})
    # One adjoint step: the recorded launch's backward alone (what a reverse step runs per step;
    # seeding the Tape's outputs with 512 x 512 arrays of ones would cost more than the adjoint).
    launch, = tape.ops
    reps = 20
    start = time.perf_counter()
    for _ in range(reps):
        launch.backward()
    t_a = (time.perf_counter() - start) / reps

    with tempfile.TemporaryDirectory() as tmp:
        costs = (0.0, 0.0)
        if name == "multilevel":
            with sp.HDF5Storage(os.path.join(tmp, "probe.h5")) as probe_store:
                write_s, read_s = probe_store.measure_costs({"u": u0, "u_prev": u0})
            costs = (write_s / t_f, read_s / t_f)
        schedule, storage, ram = make_schedule(name, steps, tmp, costs)
        expected = sp.validate(make_schedule(name, steps, tmp, costs)[0], steps)
        rss_before = current_rss()
        start = time.perf_counter()
        result = model.gradient(initial, steps, loss=energy, schedule=schedule, storage=storage,
                                deterministic=deterministic, progress=False)
        wall = time.perf_counter() - start
        rss_peak = rss_bytes()
    st = result.stats
    state = model.state_bytes
    bound = st.forward_steps * t_f + steps * t_a
    disk = st.snapshots.get(sp.StorageType.DISK)
    return {
        "config": name, "n": n, "steps": steps, "deterministic": deterministic,
        "t_forward_ms": 1e3 * t_f, "t_adjoint_ms": 1e3 * t_a,
        "forward_steps": st.forward_steps, "schedule_forward_steps": expected.forward_steps,
        "wall_s": wall, "forward_s": st.forward_seconds, "adjoint_s": st.adjoint_seconds, "io_s": st.io_seconds,
        "wall_over_bound": wall / bound, "gradient_over_forward": wall / (steps * t_f),
        "wall_over_in_run_steps": wall / (st.forward_seconds + st.adjoint_seconds),
        "ram_snapshots": ram if name != "storeall" else 0,
        "peak_states": st.peak_memory_bytes / state,
        "goal_states": (ram + 3) if name != "storeall" else None,
        "rss_growth_states": max(rss_peak - rss_before, 0) / state,
        "disk_writes": disk.snapshots_written if disk else 0, "disk_reads": disk.snapshots_read if disk else 0,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=512)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--nondeterministic", action="store_true", help="parallel adjoints (atomics in any order)")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    det = not args.nondeterministic
    if args.one:
        print(json.dumps(one(args.one, args.n, args.steps, det)))
        return
    rows = []
    header = (f"{'config':<11} {'fwd steps':>9} {'=sched':>6} {'t_f ms':>7} {'t_a ms':>7} {'wall s':>7} "
              f"{'wall/bound':>10} {'in-run':>6} {'grad/fwd':>8} {'peak':>6} {'goal':>5} {'RSS+':>6} {'disk w/r':>9}")
    print(f"wave {args.n}x{args.n} float32, {args.steps} steps, deterministic={det}, "
          f"{os.cpu_count()} CPUs; memory in state sizes ({2 * 4 * args.n * args.n / 2**20:.1f} MiB)")
    print(header)
    for name in args.configs.split(","):
        out = subprocess.run([sys.executable, __file__, "--one", name, "--n", str(args.n), "--steps",
                              str(args.steps)] + (["--nondeterministic"] if not det else []),
                             capture_output=True, text=True, check=True)
        row = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append(row)
        goal = "-" if row["goal_states"] is None else str(row["goal_states"])
        print(f"{name:<11} {row['forward_steps']:>9} {str(row['forward_steps'] == row['schedule_forward_steps']):>6} "
              f"{row['t_forward_ms']:>7.2f} {row['t_adjoint_ms']:>7.2f} {row['wall_s']:>7.2f} "
              f"{row['wall_over_bound']:>10.3f} {row['wall_over_in_run_steps']:>6.3f} {row['gradient_over_forward']:>8.2f} {row['peak_states']:>6.2f} "
              f"{goal:>5} {row['rss_growth_states']:>6.1f} {row['disk_writes']:>4}/{row['disk_reads']:<4}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
