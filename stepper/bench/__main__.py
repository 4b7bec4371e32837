"""``python -m stepper.bench tradeoff [options]``: see ``--help``."""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import asdict, fields

from .problems import PROBLEMS


def parse_budgets(texts) -> list[int]:
    """'4,8,16', '4 8 16' or '4..64' (powers of two from 4 to 64) -> [4, 8, 16, ...]."""
    out = []
    for text in texts:
        for part in str(text).split(","):
            part = part.strip()
            if ".." in part:
                lo, hi = (int(p) for p in part.split(".."))
                if lo < 1 or hi < lo:
                    raise argparse.ArgumentTypeError(f"budget range {part!r} must be lo..hi with 1 <= lo <= hi")
                while lo <= hi:
                    out.append(lo)
                    lo *= 2
            elif part:
                out.append(int(part))
    if any(b < 1 for b in out):
        raise argparse.ArgumentTypeError(f"snapshot budgets must be >= 1, got {out}")
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m stepper.bench", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("tradeoff", help="memory/time trade-off of checkpointed gradients on an example model",
                       description="Sweep the snapshot budget (and with --disk the RAM/HDF5 split), run the "
                                   "real gradient for each, write a table and a plot, and advise a budget.")
    t.add_argument("--example", choices=list(PROBLEMS), default="wave")
    t.add_argument("--model", metavar="MODULE:FUNCTION",
                   help="your own model instead of an example: FUNCTION([size]) returns a stepper.bench.Problem "
                        "(model, initial state, loss and/or running_loss); MODULE is imported from the current "
                        "directory")
    t.add_argument("--size", type=int, help="problem size: " + ", ".join(
        f"{k}: {v[2]} (default {v[1]})" for k, v in PROBLEMS.items()))
    t.add_argument("--steps", type=int, default=2000, help="steps of the rollout (default 2000)")
    t.add_argument("--budgets", nargs="+", default=["4..64"],
                   help="RAM snapshot budgets: '4 8 16', '4,8,16' or '4..64' (powers of two); default 4..64")
    t.add_argument("--disk", action="store_true", help="also MultiLevel RAM + HDF5 configurations, with disk "
                   "costs measured by HDF5Storage.measure_costs")
    t.add_argument("--disk-snapshots", nargs="+", default=["256"],
                   help="disk snapshot budgets to pair with each RAM budget under --disk (default 256)")
    t.add_argument("--disk-dir", help="where HDF5 snapshots go (default: a temporary folder)")
    t.add_argument("--memory-limit", type=float, metavar="MiB",
                   help="advise the fastest configuration whose peak memory fits in this many MiB")
    t.add_argument("--no-storeall", action="store_true", help="do not run store-all (its time is then predicted)")
    t.add_argument("--nondeterministic", action="store_true",
                   help="multithreaded adjoints (atomics in any order) instead of model.gradient's default")
    t.add_argument("--threads", type=int, help="OpenMP threads (sets OMP_NUM_THREADS before any kernel loads)")
    t.add_argument("--repeats", type=int, default=1, help="interleaved rounds of runs (every configuration and "
                   "the calibration probes once a round); a row keeps the fastest run and the medians (default 1)")
    t.add_argument("--probe", type=int, default=50, help="steps of the short timing probes of the per-path costs "
                   "(the long ones run over --steps)")
    t.add_argument("--out", help="output folder (default: tradeoff-<example>)")
    return parser


def _how(costs) -> str:
    """How the model's steps run, as calibrate found them (the plan that gave the probes' stats)."""
    from .tradeoff import ALL
    if not costs.native:
        return "every step on the Python path (untraceable)"
    if costs.python_first >= ALL:
        return "first runs on the Python path, reruns native (the trace is never trusted)"
    return f"native after the first {costs.python_first} steps"


def _per_path(costs) -> str:
    """Each path's unit cost in us, wall / CPU, and how the model's steps run."""
    return ", ".join(f"{f.name[:-2].replace('_', ' ')} {getattr(costs.wall, f.name) * 1e6:.1f} / "
                     f"{getattr(costs.cpu, f.name) * 1e6:.1f}"
                     for f in fields(costs.wall) if getattr(costs.wall, f.name) or getattr(costs.cpu, f.name)) + (
        f" (us, wall / CPU); {_how(costs)}")


def tradeoff_main(args) -> int:
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)      # read when the first kernel library loads
    from . import problems, report
    from .tradeoff import advise, calibrate, configurations, measure_disk, sweep

    budgets = parse_budgets(args.budgets)
    disk = parse_budgets(args.disk_snapshots) if args.disk else []
    if args.model:
        try:
            problem = problems.load(args.model, args.size)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    else:
        problem = problems.make(args.example, args.size)
    out = args.out or f"tradeoff-{problem.name if args.model else args.example}"
    os.makedirs(out, exist_ok=True)
    deterministic = not args.nondeterministic
    steps = args.steps
    state_mib = problem.model.state_bytes / 2**20
    threads = os.environ.get("OMP_NUM_THREADS", f"{os.cpu_count()} CPUs")
    title = (f"{problem.description}, {steps:,} steps; one state {state_mib * 1024:.0f} KiB; "
             f"deterministic={deterministic}, OMP threads {threads}, "
             + (f"{args.repeats} interleaved rounds (fastest; theory fitted on probes run in the same rounds)"
                if args.repeats > 1
                else "one run each"))
    print(title, flush=True)

    configs = configurations(steps, budgets, disk, storeall=not args.no_storeall)
    revolve = [c.ram for c in configs if c.kind == "revolve"] or [3]
    costs = calibrate(problem, min(args.probe, steps), deterministic=deterministic,
                      directory=(args.disk_dir or out) if disk else None, max_steps=steps,
                      budgets=(min(revolve), max(revolve)))
    if disk:
        costs = measure_disk(problem, costs, args.disk_dir or out)
    print(f"per step: forward {costs.forward_s * 1e3:.3f} ms, adjoint {costs.adjoint_s * 1e3:.3f} ms, "
          f"store-all's recorded forward {costs.storeall_step_s * 1e3:.3f} ms"
          + (f"; HDF5 snapshot write {costs.write_s * 1e3:.3f} ms, read {costs.read_s * 1e3:.3f} ms" if disk else ""),
          flush=True)
    print("per path, calibrated: " + _per_path(costs), flush=True)
    started = time.perf_counter()

    def log(row):
        print(f"  {row.config:<22} {row.forward_steps:>9,} forward steps  peak {row.peak_mib:8.2f} MiB  "
              f"{row.wall_s:7.2f} s (theory {row.theory_s:.2f} s, median {row.wall_median_s:.2f} s), "
              f"CPU {row.cpu_s:.2f} s (theory {row.theory_cpu_s:.2f} s)"
              + ("" if row.paths_exact else "  (paths differ from the plan)"), flush=True)
    rows, costs = sweep(problem, steps, configs, costs, deterministic=deterministic, directory=args.disk_dir,
                        repeats=args.repeats, log=log)
    print("per path, refitted on the probes run in the sweep's rounds: " + _per_path(costs))
    print(f"sweep took {time.perf_counter() - started:.1f} s\n")

    table = report.markdown(rows, f"**{title}**")
    advice = None
    limit = args.memory_limit
    if limit is not None:
        advice = advise(rows, limit * 2**20, problem.model.state_bytes, costs, steps)
        table += "\n" + advice.text.replace("\n", "  \n") + "\n"
    print(table)
    paths = {ext: os.path.join(out, f"tradeoff.{ext}") for ext in ("md", "csv", "json", "png")}
    with open(paths["md"], "w") as f:
        f.write(table)
    report.write_csv(rows, paths["csv"])
    meta = {"example": args.model or args.example, "description": problem.description, "steps": steps,
            "state_bytes": problem.model.state_bytes, "deterministic": deterministic, "omp_threads": threads,
            "repeats": args.repeats,
            "costs": asdict(costs),
            "memory_limit_mib": limit, "advice": None if advice is None else {
                "config": advice.row.config if advice.row else None, "text": advice.text}}
    report.write_json(rows, meta, paths["json"])
    skipped = report.plot(rows, paths["png"], title, limit)
    if skipped:
        print(skipped)
        del paths["png"]
    print("wrote " + ", ".join(paths.values()))
    return 0


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "tradeoff":
        return tradeoff_main(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
