"""The field's standard workload against its reference tool: the FWI gradient of Devito's 2-D
acoustic example (examples.seismic, 'layers-isotropic', a Ricker source, a receiver per grid
column, damping layer of 20 points), Devito 4.8 + pyrevolve against ours written the README way
(peer_impls/fwi_ours.py, the same discretisation term for term; Devito's side: peer_impls/devito_peer.py).

    python benchmarks/fwi.py                                  # 256^2, orders 2 and 8, 3 rounds
    python benchmarks/fwi.py --n 64 --orders 2 --rounds 1     # a quick look
    python benchmarks/fwi.py --check                          # float64 gradients, ours vs Devito

`--check` (64^2, float64, store-all): 4.9e-13 relative (max norm) at order 2; 3.8e-7 at order 8,
because Devito's generated float64 weights carry ~1e-11 relative rounding (2.00000000011642e-3 for
1/5 / h^2) that the misfit amplifies: with those exact values substituted in fwi_ours.WEIGHTS the
two gradients agree to 3.8e-13 (2026-11-26).

Needs the bench extra (`pip install -e ".[bench]"`: devito, pyrevolve). Devito builds the problem
(velocity models, damping field, wavelet, observed data from the true model) once in the parent;
every configuration then runs in a fresh process, pinned to one core (`--threads all`: both
cores; Devito then runs with DEVITO_LANGUAGE=openmp), in interleaved rounds (A B C ... A B C),
and the table gives medians with (min-max), and peak RSS above the RSS before the first
(untimed) run.

Per tool and order:
- forward: one modelling run with the receivers (Devito `forward(save=False)`; ours
  `model.evaluate` with the misfit as running loss);
- checkpointed gradient: Devito's `jacobian_adjoint(checkpointing=True)` driven by pyrevolve's
  Revolver (forward sweep, residual, reverse sweep), ours `model.gradient(schedule=Revolve(n, s))`
  with s = pyrevolve's snapshot count;
- store-all gradient: Devito `forward(save=True)` + residual + `jacobian_adjoint`, ours StoreAll.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
RESULTS = os.path.join(HERE, "results")
from peer_impls.devito_peer import NBL, build_problem   # noqa: E402  (Devito itself loads on first use)
MODES = ("forward", "revolve", "storeall")
# ours as before 2026-11-30: runs of steps write u_next into a third buffer, never over the up it
# reads (paired_fwi.py's BEFORE["3-buffers"]); `--tools devito ours ours-3-buffers`
THREE_BUFFERS = "ours-3-buffers"


def worker(args) -> dict:
    if args.threads == "one":
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    problem = dict(np.load(args.problem))
    if args.tool == "devito":
        from peer_impls.devito_peer import runner
    else:
        from peer_impls.fwi_ours import runner
    if args.tool == THREE_BUFFERS:
        from paired_fwi import BEFORE
        BEFORE["3-buffers"][0]()                              # its switch off
    run, info = runner(problem, args.mode, args.snapshots)
    from stepper.bench import rss
    # Peak memory from before the first run: a tool whose buffers outlive a call (ours did until
    # 10e1e09: a store-all gradient's ~490 MiB at 256^2, 8th order, lived until Python's cycle
    # collector ran) would otherwise show none in the timed run.
    rss.reset_peak()
    before = rss.current_bytes()
    run()                                                     # compiles, warms caches
    t0 = time.perf_counter()
    value = run()
    seconds = time.perf_counter() - t0
    out = {"seconds": seconds, "peak_mib": (rss.peak_bytes() - before) / 2**20, **info}
    if np.ndim(value) == 0:
        out["loss"] = float(value)
    elif args.grad_out:
        np.save(args.grad_out, value)
    return out


# -- the parent --------------------------------------------------------------------------------------
def run_config(tool, mode, problem_path, threads, snapshots, timeout, grad_out=None) -> dict:
    with tempfile.NamedTemporaryFile("r", suffix=".json", delete=False) as f:
        result = f.name
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", tool, "--mode", mode, "--problem", problem_path,
           "--threads", threads, "--result", result]
    if snapshots:
        cmd += ["--snapshots", str(snapshots)]
    if grad_out:
        cmd += ["--grad-out", grad_out]
    env = dict(os.environ)
    env["DEVITO_LANGUAGE"] = "openmp" if threads == "all" else "C"
    env["DEVITO_LOGGING"] = "ERROR"
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        if proc.returncode:
            return {"error": f"exit {proc.returncode}", "log": (proc.stdout + proc.stderr)[-2000:]}
        with open(result) as f:
            return json.load(f)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    finally:
        if os.path.exists(result):
            os.unlink(result)


def check(n: int, order: int, ndim: int) -> None:
    """Ours against Devito in float64: relative max-norm difference of the two gradients."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "problem.npz")
        build_problem(n, order, np.float64, path, ndim)
        grads = {}
        for tool in ("devito", "ours"):
            out = os.path.join(tmp, f"{tool}.npy")
            report = run_config(tool, "storeall", path, "one", None, 900, grad_out=out)
            if "error" in report:
                print(tool, report)
                return
            grads[tool] = np.load(out)
        d, o = grads["devito"], grads["ours"]
        inner = (slice(NBL, -NBL),) * ndim
        print(f"float64 {n}^{ndim} order {order}: |ours - devito| / |devito| = "
              f"{np.abs(o - d).max() / np.abs(d).max():.2e} (max norms); physical domain only: "
              f"{np.abs(o - d)[inner].max() / np.abs(d)[inner].max():.2e}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--ndim", type=int, default=2, choices=[2, 3])
    ap.add_argument("--orders", type=int, nargs="+", default=[2, 8])
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    ap.add_argument("--tools", nargs="+", default=["devito", "ours"])
    ap.add_argument("--threads", default="one", choices=["one", "all"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--snapshots", type=int, default=None, help="Revolve's snapshots (default: pyrevolve's)")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--worker", choices=["devito", "ours", THREE_BUFFERS])
    ap.add_argument("--mode", choices=MODES)
    ap.add_argument("--problem")
    ap.add_argument("--result")
    ap.add_argument("--grad-out")
    args = ap.parse_args(argv)
    if args.worker:
        args.tool = args.worker
        report = worker(args)
        with open(args.result, "w") as f:
            json.dump(report, f)
        return 0
    if args.check:
        for order in args.orders:
            check(min(args.n, 64 if args.ndim == 2 else 24), order, args.ndim)
        return 0
    rows, runs = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for order in args.orders:
            path = os.path.join(tmp, f"problem-{order}.npz")
            build_problem(args.n, order, np.float32, path, args.ndim)
            nt = int(np.load(path)["nt"])
            snapshots = args.snapshots
            for _ in range(args.rounds):
                for mode in args.modes:
                    for tool in args.tools:
                        report = run_config(tool, mode, path, args.threads, snapshots, args.timeout)
                        if tool == "devito" and mode == "revolve" and snapshots is None and "snapshots" in report:
                            snapshots = report["snapshots"]
                        runs.setdefault((order, mode, tool), []).append(report)
            for mode in args.modes:
                for tool in args.tools:
                    reports = runs[(order, mode, tool)]
                    bad = [r for r in reports if "error" in r]
                    if bad:
                        rows.append((order, mode, tool, nt, None, None, None, bad[0]["error"] + " " +
                                     bad[0].get("log", "")[-300:]))
                        continue
                    t = sorted(r["seconds"] for r in reports)
                    rows.append((order, mode, tool, nt, float(np.median(t)), (t[0], t[-1]),
                                 max(r["peak_mib"] for r in reports), snapshots if mode == "revolve" else ""))
    lines = [f"# FWI gradient, Devito vs ours ({args.n}^{args.ndim} + {NBL}-point damping layer, threads: {args.threads})", "",
             f"`python benchmarks/fwi.py {' '.join(sys.argv[1:])}`, {datetime.datetime.now():%Y-%m-%d %H:%M}, "
             f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}", "",
             "| order | mode | tool | steps | median s (min-max) | ours / devito | peak MiB | note |",
             "|---:|---|---|---:|---:|---:|---:|---|"]
    medians = {(o, m, t): s for o, m, t, _, s, *_ in rows}
    for order, mode, tool, nt, sec, spread, peak, note in rows:
        if sec is None:
            lines.append(f"| {order} | {mode} | {tool} | {nt} | failed | | | {note} |")
            continue
        ref = medians.get((order, mode, "devito"))
        ratio = f"{sec / ref:.2f}" if tool.startswith("ours") and ref else ""
        lines.append(f"| {order} | {mode} | {tool} | {nt - 2} | {sec:.3f} ({spread[0]:.3f}-{spread[1]:.3f}) | "
                     f"{ratio} | {peak:.0f} | {'snapshots ' + str(note) if note else ''} |")
    if THREE_BUFFERS in args.tools and "ours" in args.tools:
        lines += ["", f"Paired, per round: ours / {THREE_BUFFERS}, median (min-max):", ""]
        for order in args.orders:
            for mode in args.modes:
                pairs = [a["seconds"] / b["seconds"] for a, b in zip(runs[(order, mode, "ours")],
                                                                     runs[(order, mode, THREE_BUFFERS)])
                         if "error" not in a and "error" not in b]
                if pairs:
                    lines.append(f"- order {order} {mode}: {np.median(pairs):.3f} ({min(pairs):.3f}-{max(pairs):.3f})")
    text = "\n".join(lines)
    print(text)
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, f"fwi-{args.ndim}d-{args.n}-{args.threads}.md"), "w") as f:
        f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
