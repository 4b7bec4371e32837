"""Strong scaling of a decomposed checkpointed gradient: the 2-D wave of examples/wave_mpi.py on 1
and 2 MPI ranks of one machine, and the time each step spends in its halo exchange.

    python benchmarks/mpi_scaling.py                          # 1024^2 and 2048^2, 3 rounds
    python benchmarks/mpi_scaling.py --sizes 512 --steps 100 --rounds 2

Each round runs one `mpiexec -n P` job per configuration, the configurations interleaved (1 rank;
2 ranks exchanging before the launch; 2 ranks overlapping the exchange with the rows that do not
read halos, dist.launch with dist.halo; then again). Every rank uses one OpenMP thread
(OMP_NUM_THREADS=1), so 2 ranks use the cores 1 rank leaves idle and the efficiency T1 / (2 T2)
measures the decomposition alone. A job times `Distributed.gradient` with Revolve once warm, and
reports the time its rank spent posting and waiting for halo messages (forward and adjoint) per
exchange: what the overlap did not hide. The table gives medians and (min-max) over the rounds.
Writes benchmarks/results/mpi_scaling.md.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def job(size: int, steps: int, snapshots: int, overlap: bool) -> dict:
    """One rank's part of a timed gradient (run under mpiexec); rank 0 returns the report."""
    sys.path.insert(0, str(ROOT / "examples"))
    import numpy as np

    import stepper as sp
    from wave_mpi import build, bump, misfit
    model, dist = build(size, overlap)
    rows = dist.local_shape("u")[0]
    start = dist.scatter({"u": bump(size, 0.4, 0.5, 0.08), "u_prev": bump(size, 0.4, 0.5, 0.08)})
    observed = dist.scatter({"u": np.zeros((size, size), np.float32)})["u"]

    def loss(state):
        out = sp.zeros(1, requires_grad=True)
        sp.launch(misfit, (rows, size), inputs=[state.u, observed], outputs=[out])
        return out

    def gradient():
        return dist.gradient(start, steps, loss=loss, schedule=sp.Revolve(steps, snapshots), progress=False)
    gradient()                                       # compile and warm up
    dist.exchanges, dist.exchange_seconds = 0, 0.0
    dist.comm.Barrier()
    began = time.perf_counter()
    result = gradient()
    dist.comm.Barrier()
    seconds = time.perf_counter() - began
    per_exchange = dist.comm.allgather(dist.exchange_seconds / max(dist.exchanges, 1))
    return {"ranks": dist.size, "seconds": seconds, "exchange_us": 1e6 * max(per_exchange),
            "exchanges": dist.exchanges, "overlapped": dist.overlapped, "forward_steps": result.stats.forward_steps,
            "loss": result.loss}


def run(ranks: int, size: int, steps: int, snapshots: int, overlap: bool) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", STEPPER_PROGRESS="0",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    cmd = [shutil.which("mpiexec"), "-n", str(ranks), sys.executable, __file__, "--job",
           json.dumps([size, steps, snapshots, overlap])]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def summary(values: list[float], fmt: str = ".3g") -> str:
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--snapshots", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "mpi_scaling.md"))
    parser.add_argument("--job", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.job:
        report = job(*json.loads(args.job))
        from mpi4py import MPI
        if MPI.COMM_WORLD.Get_rank() == 0:
            print(json.dumps(report))
        return 0
    configs = [(1, True), (2, False), (2, True)]     # (ranks, overlap)
    results = {(n, c): [] for n in args.sizes for c in configs}
    for r in range(args.rounds):
        for n in args.sizes:
            for c in configs:
                results[n, c].append(run(*c[:1], n, args.steps, args.snapshots, c[1]))
                print(f"round {r + 1}: {n}^2 on {c[0]} rank(s), overlap {c[1]}: {results[n, c][-1]}", flush=True)
    lines = [f"# Strong scaling, wave gradient (Revolve({args.steps}, {args.snapshots})), 1 and 2 ranks",
             "", f"- command: `python benchmarks/mpi_scaling.py {' '.join(argv or sys.argv[1:])}`",
             f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {os.cpu_count()} cores, "
             "OMP_NUM_THREADS=1 per rank; medians (min-max) over interleaved rounds",
             "- overlap: the step spelled with dist.launch and dist.halo (rows away from the faces run while the "
             "halos travel) or with dist.exchange then sp.launch; exchange time is what the rank spent posting "
             "and waiting for messages (forward and adjoint), i.e. what the overlap did not hide", "",
             "| grid | ranks | overlap | gradient s | efficiency T1/(P TP) | halo exchange us (per exchange) | "
             "exchange share of the run |", "|---|---:|---|---:|---:|---:|---:|"]
    for n in args.sizes:
        one = [x["seconds"] for x in results[n, (1, True)]]
        for p, overlap in configs:
            runs = results[n, (p, overlap)]
            seconds = [x["seconds"] for x in runs]
            efficiency = [a / (p * b) for a, b in zip(one, seconds)]
            share = [x["exchange_us"] * 1e-6 * x["exchanges"] / x["seconds"] for x in runs]
            lines.append(f"| {n}^2 | {p} | {'yes' if overlap else 'no'} | {summary(seconds)} | "
                         f"{summary(efficiency, '.2f')} | "
                         f"{summary([x['exchange_us'] for x in runs]) if p > 1 else '-'} | "
                         f"{summary(share, '.1%') if p > 1 else '-'} |")
    text = "\n".join(lines) + "\n"
    print(text)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
