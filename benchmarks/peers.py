"""Peer comparison (issue 6): the gradient of a nonlinear wave rollout, ours against Warp, JAX and
equinox, in one run on one machine.

    python benchmarks/peers.py                       # 256 x 256, 10,000 steps (minutes; GiBs of RAM)
    python benchmarks/peers.py --quick               # 64 x 64, 500 steps (about a minute)
    python benchmarks/peers.py --only 'jax-*' ours-storeall --out results.json

The problem (peer_impls/problem.py): u_next = 2u - u_prev + C lap(u) - B u^3, C = 0.25, B = 1e-3,
zero Dirichlet boundaries, u_prev = u = u0 (a Gaussian bump), loss 0.5 sum(u_final^2), gradient
with respect to u0. Each configuration runs in a fresh process, so its peak resident memory is its
own (the parent reads it with os.wait4), and libraries never share an allocator. The
configurations run in `--rounds` interleaved rounds (A B C A B C ...; a fresh process each time) so
that a busy machine slows every contender alike; times are medians with their spread (min-max).
Configurations ending in -1core run pinned to one core. Per configuration:

- forward time (a rollout, no gradient) and gradient time (loss and dloss/du0), compilation excluded;
- ours: the kernel-only bound (step evaluations x the step kernel's time + reverse steps x its
  adjoint's, both measured in the worker by calling the entry points back to back, the median of
  five passes) and wall / bound; and the launch bound, the kernels that actually ran (see
  `add_bound`), with wall / launch bound;
- peak RSS of the process, the RSS after importing the library (the idle baseline), their
  difference, and the peak above the RSS just before the gradient (what the gradient itself held,
  measured by resetting the kernel's high-water mark through /proc/self/clear_refs);
- forward step evaluations in one gradient: ours from result.stats, JAX and equinox counted with a
  jax.debug.callback in the step on an 8 x 8 grid with the same number of steps (the count does not
  depend on the grid), Warp's store-all Tape by construction (one per step);
- correctness: every configuration's gradient against a float64 NumPy reference on a small problem
  (24 x 24, 60 steps), against a float64 JAX run (x64, nested remat) at the benchmark size, and
  against each other (relative max-norm errors).

The table goes to stdout and to benchmarks/results/peers.md (with the command, machine and date);
everything measured goes to benchmarks/results/peers.json (or --out).
"""
from __future__ import annotations

import argparse
import datetime
import fnmatch
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from peer_impls import Config, budgets, configs, reference  # noqa: E402

RESULTS = os.path.join(HERE, "results")
CHECK_N, CHECK_STEPS = 24, 60          # the float64 reference check
COUNT_N = 8                            # the grid of the step-counting runs
MiB = 1024 * 1024


# -- the worker: one configuration, in its own process ---------------------------------------------------
def _status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")                    # resets VmHWM to the current RSS (Linux >= 4.0)
        return True
    except OSError:
        return False


def worker(cfg: Config, n: int, steps: int, repeat: int, count: bool, grad_path: str | None) -> dict:
    import importlib
    if cfg.one_core:                 # before the import: a library sizes its thread pools on import
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    t0 = time.perf_counter()
    module = importlib.import_module(f"peer_impls.{cfg.module}")
    out = {"config": cfg.name, "n": n, "steps": steps, "import_s": time.perf_counter() - t0,
           "rss_import_mib": _status_kib("VmRSS") / 1024, "versions": module.describe(),
           "loadavg_start": os.getloadavg()[0]}
    t0 = time.perf_counter()
    runner = getattr(module, cfg.runner)(n, steps, count=count, **cfg.kwargs)
    runner.warmup()
    out["setup_s"] = time.perf_counter() - t0
    out["rss_ready_mib"] = _status_kib("VmRSS") / 1024
    out["stored"] = runner.stored_states()
    if not count:
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            u_final = runner.forward()
            times.append(time.perf_counter() - t0)
        out["forward_s"] = min(times)
        out["u_final_abs_max"] = float(np.abs(u_final).max())
        del u_final
    times, peaks = [], []
    for _ in range(repeat if not count else 1):
        out["peak_reset"] = _reset_peak()
        before = _status_kib("VmRSS")
        t0 = time.perf_counter()
        loss, grad, stats = runner.gradient()
        times.append(time.perf_counter() - t0)
        peaks.append((_status_kib("VmHWM") - before) / 1024)
    out["gradient_s"] = min(times)
    out["gradient_peak_above_start_mib"] = max(peaks)
    out["loss"] = loss
    out["stats"] = stats
    out["forward_steps_closed_form"] = runner.forward_steps()
    out["grad_abs_max"] = float(np.abs(grad).max())
    out["finite"] = bool(np.all(np.isfinite(grad)))
    if hasattr(runner, "kernel_times") and not count:
        out["kernel_forward_s"], out["kernel_renamed_s"], out["kernel_adjoint_s"] = runner.kernel_times()
    out["loadavg_end"] = os.getloadavg()[0]
    if grad_path:
        np.save(grad_path, grad)
    return out


# -- the parent ------------------------------------------------------------------------------------------
def run_worker(cfg: Config, n: int, steps: int, repeat: int, count: bool, grad_path: str | None,
               timeout: float) -> dict:
    """Run one configuration in a fresh process; returns its report plus its peak RSS (ru_maxrss)."""
    with tempfile.NamedTemporaryFile("r", suffix=".json", delete=False) as f:
        result_path = f.name
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", cfg.name, "--n", str(n), "--steps", str(steps),
           "--repeat", str(repeat), "--result", result_path]
    if count:
        cmd.append("--count")
    if grad_path:
        cmd += ["--grad-out", grad_path]
    log = tempfile.TemporaryFile("w+")
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=worker_env())
    deadline = started + timeout
    status, rusage = 0, None
    while True:
        pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() > deadline:
            proc.kill()
            _, status, rusage = os.wait4(proc.pid, 0)
            break
        time.sleep(0.05)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - started
    try:
        with open(result_path) as f:
            report = json.load(f)
    except (OSError, json.JSONDecodeError):
        log.seek(0)
        tail = log.read()[-3000:]
        timed_out = wall >= timeout
        report = {"config": cfg.name, "error": f"{'timed out after ' + str(int(timeout)) + ' s' if timed_out else 'exit ' + str(proc.returncode)}",
                  "log_tail": tail}
    finally:
        if os.path.exists(result_path):
            os.unlink(result_path)
    report["peak_rss_mib"] = rusage.ru_maxrss / 1024       # KiB on Linux
    report["wall_s"] = wall
    return report


def worker_env() -> dict:
    """The environment of every worker: this one, unchanged. OpenMP runs with its defaults (GNU
    OpenMP spins a while before its threads sleep), as a user's would. Those defaults suit a quiet
    machine; run the comparison on one (the table records the load average): with other processes
    on the cores, spinning threads lose their turn and ours slows down several times, and forcing
    OMP_WAIT_POLICY=passive instead costs ours about 2x on a quiet one (a thread wakes per launch)."""
    return dict(os.environ)


def machine_info() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024**3
    return {"cpu": cpu, "cores": os.cpu_count(), "ram_gib": round(mem, 1), "os": platform.platform(),
            "python": platform.python_version()}


def combine(reports: list[dict]) -> dict:
    """One configuration's rounds as one report: the first round's, with `forward_s`, `gradient_s`
    and the kernel prices replaced by their medians (the rounds' values kept in `*_rounds`), and
    peaks by their maxima. A round that failed makes the whole configuration fail."""
    failed = [r for r in reports if "error" in r]
    if failed:
        return failed[0]
    out = dict(reports[0])
    for key in ("forward_s", "gradient_s", "kernel_forward_s", "kernel_renamed_s", "kernel_adjoint_s", "wall_s"):
        values = [r[key] for r in reports if r.get(key) is not None]
        if values:
            out[key + "_rounds"] = values
            out[key] = float(np.median(values))
    for key in ("peak_rss_mib", "gradient_peak_above_start_mib"):
        out[key] = max(r[key] for r in reports)
    out["loadavg_start_rounds"] = [r.get("loadavg_start") for r in reports]
    return out


def add_bound(r: dict, steps: int) -> None:
    """Ours' kernel-only bounds, prices measured in the same worker, and wall / bound:
    - issue 14's: step evaluations x the step kernel's time + reverse steps x its adjoint's;
    - the launch bound: the kernels the gradient launched. A recorded step reversed at once runs no
      forward launch (`stats.launches_skipped`), and a step whose copy `up_next = x` was renamed
      runs the kernel without that store (`stats.renamed_copies`, one a step here), so issue 14's
      bound prices launches that never ran, and can sit below the wall time's true floor.
    The forward's bounds: steps x the kernel's time, and steps x the renamed variant's (a native
    rollout renames the copy on all but a few steps)."""
    if r.get("kernel_forward_s") is None or r.get("forward_steps") is None:
        return
    full, renamed, adjoint = r["kernel_forward_s"], r.get("kernel_renamed_s"), r["kernel_adjoint_s"]
    r["forward_bound_s"] = steps * full
    r["gradient_bound_s"] = r["forward_steps"] * full + steps * adjoint
    r["forward_over_bound"] = r["forward_s"] / r["forward_bound_s"]
    r["gradient_over_bound"] = r["gradient_s"] / r["gradient_bound_s"]
    stats = r.get("stats", {})
    if renamed is None or "launches_skipped" not in stats:
        return
    launched = r["forward_steps"] - stats["launches_skipped"]
    r["forward_launch_bound_s"] = steps * renamed
    r["gradient_launch_bound_s"] = ((launched - stats["renamed_copies"]) * full + stats["renamed_copies"] * renamed
                                    + steps * adjoint)
    r["forward_over_launch_bound"] = r["forward_s"] / r["forward_launch_bound_s"]
    r["gradient_over_launch_bound"] = r["gradient_s"] / r["gradient_launch_bound_s"]


def spread(r: dict, key: str) -> str:
    """'median (min-max)' over the rounds, or the single value."""
    values = r.get(key + "_rounds")
    if not values or len(values) < 2:
        return fmt(r.get(key))
    return f"{r[key]:.2f} ({min(values):.2f}-{max(values):.2f})"


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def fmt(x, spec=".2f", missing="-"):
    return missing if x is None else format(x, spec)


def markdown(results: list[dict], meta: dict) -> str:
    lines = [
        f"# Peer comparison: nonlinear wave, {meta['n']} x {meta['n']}, {meta['steps']:,} steps",
        "",
        f"- command: `{meta['command']}`",
        f"- date: {meta['date']}",
        f"- machine: {meta['machine']['cpu']}, {meta['machine']['cores']} cores, "
        f"{meta['machine']['ram_gib']} GiB RAM, {meta['machine']['os']}, Python {meta['machine']['python']}",
        f"- versions: {meta['versions']}",
        f"- worker environment: {meta['env']}",
        f"- one state (u_prev, u) = {2 * 4 * meta['n'] ** 2 / MiB:.2f} MiB; float32 everywhere",
        "",
        f"- {meta['rounds']} interleaved rounds (a fresh process per configuration and round); times are "
        "median (min-max) over the rounds; kernel bound: step evaluations x the kernel's time + reverse steps x "
        "its adjoint's; launch bound: the kernels launched (no forward launch for a step reversed at once, the "
        "variant without `up_next = x` where that copy was renamed) x their times + reverse steps x the adjoint's "
        "(ours only, prices measured in the same worker)",
        "",
        "| configuration | stores | forward s | gradient s | gradient / forward | kernel bound fwd / grad s | "
        "wall / bound fwd / grad | launch bound fwd / grad s | wall / launch bound fwd / grad | peak RSS MiB | "
        "idle baseline MiB | peak - baseline MiB | gradient's own peak MiB | forward step evals | "
        "vs float64, 24 x 24 x 60 | vs float64, this size | vs " + meta["cross_ref"] + " |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['config']} | {r['error']} | | | | | | | | | | | | | | | |")
            continue
        ratio = r["gradient_s"] / r["forward_s"] if r.get("forward_s") else None
        evals = r.get("forward_steps")
        lines.append(
            f"| {r['config']} | {r['stored']} | {spread(r, 'forward_s')} | {spread(r, 'gradient_s')} | "
            f"{fmt(ratio, '.1f')} | {fmt(r.get('forward_bound_s'))} / {fmt(r.get('gradient_bound_s'))} | "
            f"{fmt(r.get('forward_over_bound'))} / {fmt(r.get('gradient_over_bound'))} | "
            f"{fmt(r.get('forward_launch_bound_s'))} / {fmt(r.get('gradient_launch_bound_s'))} | "
            f"{fmt(r.get('forward_over_launch_bound'))} / {fmt(r.get('gradient_over_launch_bound'))} | "
            f"{r['peak_rss_mib']:.0f} | {r['rss_import_mib']:.0f} | "
            f"{r['peak_rss_mib'] - r['rss_import_mib']:.0f} | {r['gradient_peak_above_start_mib']:.0f} | "
            f"{fmt(evals, ',d')}{'' if r.get('forward_steps_source') != 'closed form' else '*'} | "
            f"{fmt(r.get('check_rel_err'), '.1e')} | {fmt(r.get('ref64_rel_err'), '.1e')} | "
            f"{fmt(r.get('cross_rel_err'), '.1e')} |")
    lines += ["", "\\* closed form (not counted). Load average (1 min) at the start of each round: " +
              ", ".join(f"{r['config']} " + "/".join(f"{x:.1f}" for x in r.get("loadavg_start_rounds", [])
                                                     if x is not None)
                        for r in results if "loadavg_start" in r) + "."]
    lines += ["", *meta.get("notes", [])]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=None, help="grid side (default 256; 64 with --quick)")
    ap.add_argument("--steps", type=int, default=None, help="time steps (default 10,000; 500 with --quick)")
    ap.add_argument("--quick", action="store_true", help="64 x 64, 500 steps")
    ap.add_argument("--only", nargs="*", default=None, help="configuration names or glob patterns")
    ap.add_argument("--repeat", type=int, default=1, help="time each phase this many times in a worker, keep the best")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (a fresh process per configuration "
                    "and round); the table reports medians and spreads over them")
    ap.add_argument("--no-check", action="store_true", help="skip the float64 reference check")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per configuration")
    ap.add_argument("--out", default=None, help="JSON results (default benchmarks/results/peers[-quick].json)")
    ap.add_argument("--md", default=None, help="Markdown table (default benchmarks/results/peers[-quick].md)")
    ap.add_argument("--list", action="store_true", help="list the configurations and exit")
    # worker mode (internal)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--grad-out", help=argparse.SUPPRESS)
    ap.add_argument("--count", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    n = args.n or (64 if args.quick else 256)
    steps = args.steps or (500 if args.quick else 10_000)
    all_cfgs = configs(steps)

    if args.worker:
        cfg = next(c for c in [*all_cfgs, reference(steps)] if c.name == args.worker)
        report = worker(cfg, n, steps, args.repeat, args.count, args.grad_out)
        with open(args.result, "w") as f:
            json.dump(report, f)
        return 0

    cfgs = all_cfgs if not args.only else [c for c in all_cfgs if any(fnmatch.fnmatch(c.name, p) for p in args.only)]
    if args.list or not cfgs:
        for c in all_cfgs:
            print(c.name, c.kwargs)
        return 0 if args.list else 1
    suffix = "-quick" if args.quick and args.n is None and args.steps is None else ""
    out_json = args.out or os.path.join(RESULTS, f"peers{suffix}.json")
    out_md = args.md or os.path.join(RESULTS, f"peers{suffix}.md")
    command = "python benchmarks/peers.py" + ("" if not sys.argv[1:] else " " + shlex.join(sys.argv[1:]))
    seg, small, large = budgets(steps)
    print(f"# {n} x {n}, {steps} steps; budgets: segment {seg}, small {small}, large {large}", flush=True)

    # 1. correctness against float64 on a small problem (names and budgets of the benchmark size)
    check = {}
    if not args.no_check:
        from peer_impls.problem import initial, reference_gradient
        _, g_ref = reference_gradient(initial(CHECK_N), CHECK_STEPS)
        small_cfgs = configs(CHECK_STEPS)        # the same list, budgets scaled to the check's length
        for cfg in cfgs:
            small_cfg = small_cfgs[all_cfgs.index(cfg)]
            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, "g.npy")
                r = run_worker(small_cfg, CHECK_N, CHECK_STEPS, 1, False, path, args.timeout)
                check[cfg.name] = rel_err(np.load(path), g_ref) if "error" not in r else None
            print(f"check {cfg.name}: rel err vs float64 {check[cfg.name]}", flush=True)

    # 2. the benchmark: rounds of one fresh process per configuration, interleaved (A B C A B C ...)
    #    so that a busy machine slows every contender alike; the table shows medians and spreads.
    rounds: dict[str, list[dict]] = {cfg.name: [] for cfg in cfgs}
    results, grads = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.rounds):
            for cfg in cfgs:
                path = os.path.join(tmp, cfg.name + ".npy")
                r = run_worker(cfg, n, steps, args.repeat, False, path if k == 0 else None, args.timeout)
                rounds[cfg.name].append(r)
                brief = {k: r.get(k) for k in ("forward_s", "gradient_s", "peak_rss_mib", "error")}
                print(f"round {k + 1}/{args.rounds} {cfg.name}: {brief}", flush=True)
        for cfg in cfgs:
            r = combine(rounds[cfg.name])
            path = os.path.join(tmp, cfg.name + ".npy")
            if "error" not in r:
                grads[cfg.name] = np.load(path)
                if cfg.countable:
                    c = run_worker(cfg, COUNT_N, steps, 1, True, None, args.timeout)
                    counted = c.get("stats", {}).get("forward_steps_counted")
                    r["forward_steps"], r["forward_steps_source"] = counted, "counted (jax.debug.callback, 8 x 8)"
                elif "forward_steps" in r.get("stats", {}):
                    r["forward_steps"], r["forward_steps_source"] = r["stats"]["forward_steps"], "result.stats"
                else:
                    r["forward_steps"], r["forward_steps_source"] = r["forward_steps_closed_form"], "closed form"
                add_bound(r, steps)
            r["check_rel_err"] = check.get(cfg.name)
            results.append(r)
        # 3. the float64 reference at this size (JAX, x64, nested remat), unless JAX is missing
        ref_path, ref = os.path.join(tmp, "float64.npy"), None
        if not args.no_check:
            r = run_worker(reference(steps), n, steps, 1, False, ref_path, args.timeout)
            ref = np.load(ref_path) if "error" not in r else None
            print(f"float64 reference: {r.get('error') or 'ok'} ({r.get('gradient_s', 0):.1f} s)", flush=True)
    cross_ref = "jax-scan" if "jax-scan" in grads else (next(iter(grads)) if grads else "-")
    for r in results:
        if r["config"] in grads and cross_ref in grads:
            r["cross_rel_err"] = rel_err(grads[r["config"]], grads[cross_ref])
        if r["config"] in grads and ref is not None:
            r["ref64_rel_err"] = rel_err(grads[r["config"]], ref)

    versions = {}
    for r in results:
        versions.update({k: v for k, v in r.get("versions", {}).items() if k != "devices"})
    meta = {"n": n, "steps": steps, "command": command, "rounds": args.rounds,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": machine_info(), "versions": versions, "cross_ref": cross_ref,
            "budgets": {"segment": seg, "small": small, "large": large}, "notes": NOTES,
            "env": {k: worker_env().get(k) for k in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "XLA_FLAGS")}}
    os.makedirs(os.path.dirname(os.path.abspath(out_json)), exist_ok=True)
    with open(out_json, "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1, default=str)
    md = markdown(results, meta)
    with open(out_md, "w") as f:
        f.write(md)
    print(md)
    return 0


NOTES = [
    "Notes:",
    "- forward: a rollout without gradient; gradient: loss and dloss/du0 (forward sweep, reverse sweep, "
    "recomputations). Compilation is excluded everywhere (JAX is compiled ahead of time, Warp and ours "
    "compile or load their kernels in a warm-up run).",
    "- peak RSS: ru_maxrss of the configuration's own process; idle baseline: RSS after importing the "
    "library; gradient's own peak: the high-water mark above the RSS just before the gradient.",
    "- jax-scan: lax.scan differentiated as is (autodiff keeps each step's residuals); "
    "jax-remat-per-step: jax.checkpoint around the step (the carry of every step is kept, the step "
    "recomputed); jax-nested-remat-S: segments of S steps, each segment and each step checkpointed "
    "(two-level, sqrt(n) x sqrt(n)); equinox-kK: equinox.internal.while_loop(kind='checkpointed', "
    "checkpoints=K), the online Stumm-Walther schedule diffrax uses.",
    "- warp-tape: one Warp kernel per step on device='cpu' (Warp's CPU launches are single-threaded), "
    "a fresh output array per step, one wp.Tape over the rollout (store-all).",
    "- ours: stepper.Model with the same kernel; StoreAll, Revolve(steps, K) and MultiLevel(steps, K RAM, "
    "L disk; HDF5 in a temporary directory); the kernel's adjoint runs in its gather form (parallel, no atomics, "
    "deterministic); zero_buffers=False (the kernel writes every element of s.next). Workers run with the "
    "environment's OpenMP settings (by default GNU OpenMP's): only ours uses OpenMP.",
]


if __name__ == "__main__":
    sys.exit(main())
