"""The memory/time trade-off of checkpointed gradients, measured on one example model.

`sweep` runs the real gradient once per configuration (Revolve with each RAM snapshot budget,
MultiLevel RAM + HDF5 splits with measured disk costs, and store-all) and returns one `Row` each:
the measured wall time and peak memory next to what the schedule's own step counts predict with
per-step times measured beforehand (`Costs`). `advise` picks, for a memory limit, the fastest
configuration that fits and the slowdown to expect against store-all.

    from stepper.bench import problems, tradeoff
    p = problems.make("wave", 64)
    costs = tradeoff.calibrate(p)
    rows = tradeoff.sweep(p, 2000, tradeoff.configurations(2000, [4, 8, 16]), costs)
    print(tradeoff.advise(rows, 8 * 2**20, p.model.state_bytes, costs).text)
"""
from __future__ import annotations

import math
import os
import tempfile
import time
from dataclasses import asdict, dataclass

import numpy as np

import stepper as sp

from . import rss
from .problems import Problem

__all__ = ["Config", "Costs", "Row", "Advice", "calibrate", "measure_disk", "configurations", "sweep", "advise"]


@dataclass(frozen=True)
class Config:
    """One schedule to try: ``kind`` is 'revolve', 'multilevel' or 'storeall'."""
    kind: str
    ram: int = 0
    disk: int = 0

    def schedule(self, steps: int, costs: "Costs"):
        if self.kind == "storeall":
            return sp.StoreAll(steps)
        if self.kind == "revolve":
            return sp.Revolve(steps, self.ram)
        # Disk costs in units of one forward step, as MultiLevel prices them.
        return sp.MultiLevel(steps, self.ram, self.disk, write_cost=costs.write_s / costs.forward_s,
                             read_cost=costs.read_s / costs.forward_s)

    @property
    def label(self) -> str:
        return {"storeall": "store-all", "revolve": f"Revolve s={self.ram}",
                "multilevel": f"MultiLevel {self.ram}+{self.disk}"}[self.kind]


@dataclass(frozen=True)
class Costs:
    """Per-step times measured on this machine, in seconds: a forward step of a checkpointed sweep
    (recorded or not: recording reuses pooled buffers), one step's adjoint, a recorded step of
    store-all (which touches fresh memory every step), and one disk snapshot write/read."""
    forward_s: float
    adjoint_s: float
    storeall_step_s: float
    write_s: float = 0.0
    read_s: float = 0.0

    def predict(self, summary, store_all: bool = False) -> float:
        """Seconds a schedule should take, from its `checkpoint.validate` summary."""
        if store_all:
            return summary.forward_steps * self.storeall_step_s + summary.reverse_steps * self.adjoint_s
        return (summary.forward_steps * self.forward_s + summary.reverse_steps * self.adjoint_s
                + summary.disk_writes * self.write_s + summary.disk_reads * self.read_s)

    def storeall_s(self, steps: int) -> float:
        return steps * (self.storeall_step_s + self.adjoint_s)


@dataclass(frozen=True)
class Row:
    """One measured configuration. Memory in MiB; ``peak_mib`` is the stepper's own count (states,
    scratch, gradients, RAM snapshots), ``rss_peak_mib`` the whole process's peak during the run and
    ``rss_growth_mib`` that peak less the process's size when the run started (None off Linux).
    ``cpu_s`` is the process's CPU time during the run (all threads): with one thread it shows the
    work done even when other processes share the cores and stretch ``wall_s``.
    ``slowdown`` and ``theory_slowdown`` are relative to store-all (measured, and predicted)."""
    config: str
    kind: str
    ram_snapshots: int
    disk_snapshots: int
    forward_steps: int
    schedule_forward_steps: int
    disk_writes: int
    disk_reads: int
    peak_mib: float
    rss_peak_mib: float | None
    rss_growth_mib: float | None
    wall_s: float
    cpu_s: float
    io_s: float
    theory_s: float
    slowdown: float = math.nan
    theory_slowdown: float = math.nan


def calibrate(problem: Problem, probe: int = 50, *, deterministic: bool = True, repeats: int = 5) -> Costs:
    """Per-step times of `problem`, each the best of `repeats` gradients over `probe` steps: forward
    and adjoint from Revolve(probe, 2) (mostly recomputation), store-all's recorded step from
    StoreAll(probe)."""
    model, initial = problem.model, problem.initial
    model.rollout(initial, 2, deterministic=deterministic, progress=False)      # compile, warm up
    forward = adjoint = storeall = math.inf

    def stats(schedule):
        return model.gradient(initial, probe, loss=problem.loss, running_loss=problem.running_loss,
                              schedule=schedule, deterministic=deterministic,
                              progress=False).stats
    for _ in range(repeats):
        st = stats(sp.Revolve(probe, 2) if probe > 2 else sp.StoreAll(probe))
        forward, adjoint = min(forward, st.forward_seconds / st.forward_steps), min(adjoint, st.adjoint_seconds / probe)
        st = stats(sp.StoreAll(probe))
        storeall = min(storeall, st.forward_seconds / probe)
    return Costs(forward, adjoint, storeall)


def measure_disk(problem: Problem, costs: Costs, directory: str) -> Costs:
    """`costs` with the HDF5 write/read time of one snapshot of `problem`'s state (measure_costs)."""
    example = {name: a.numpy() for name, a in problem.initial.items()}
    with sp.HDF5Storage(os.path.join(directory, "measure.h5")) as store:
        write_s, read_s = store.measure_costs(example, repeats=5)
    os.remove(os.path.join(directory, "measure.h5"))
    return Costs(costs.forward_s, costs.adjoint_s, costs.storeall_step_s, write_s, read_s)


def configurations(steps: int, budgets, disk_snapshots=(), storeall: bool = True) -> list[Config]:
    """Revolve for each RAM budget below `steps`, MultiLevel(budget, d) for each d in
    `disk_snapshots`, then store-all: roughly in order of growing memory."""
    configs = []
    for s in sorted(set(budgets)):
        if s < 1 or s >= steps:
            continue
        configs.append(Config("revolve", s))
        configs += [Config("multilevel", s, d) for d in sorted(set(disk_snapshots)) if d >= 1]
    if storeall:
        configs.append(Config("storeall"))
    return configs


def _gradient(problem: Problem, steps: int, config: Config, costs: Costs, path, deterministic: bool):
    """One run: (result, seconds of process CPU time, peak RSS growth in bytes or None)."""
    rss.trim()
    have_rss = rss.reset_peak()
    before = rss.current_bytes()
    cpu = time.process_time()
    result = problem.model.gradient(problem.initial, steps, loss=problem.loss, running_loss=problem.running_loss,
                                    schedule=config.schedule(steps, costs),
                                    storage=path, deterministic=deterministic, progress=False)
    cpu = time.process_time() - cpu
    peak = rss.peak_bytes() if have_rss and before is not None else None
    if path and os.path.exists(path):
        os.remove(path)
    return result, cpu, None if peak is None else (peak, peak - before)


def _run_one(problem: Problem, steps: int, config: Config, costs: Costs, directory: str,
             deterministic: bool, repeats: int) -> Row:
    summary = sp.validate(config.schedule(steps, costs), steps)
    disk = config.kind == "multilevel"
    path = os.path.join(directory, "snapshots.h5") if disk else None
    runs = [_gradient(problem, steps, config, costs, path, deterministic) for _ in range(repeats)]
    result, cpu, memory = min(runs, key=lambda run: run[0].stats.total_seconds)
    st = result.stats
    return Row(
        config=config.label, kind=config.kind,
        ram_snapshots=config.ram if config.kind != "storeall" else steps,
        disk_snapshots=config.schedule(steps, costs).disk_used if disk else 0,
        forward_steps=st.forward_steps, schedule_forward_steps=summary.forward_steps,
        disk_writes=st.snapshots_written(sp.StorageType.DISK), disk_reads=st.snapshots_read(sp.StorageType.DISK),
        peak_mib=st.peak_memory_bytes / 2**20, rss_peak_mib=None if memory is None else memory[0] / 2**20,
        rss_growth_mib=None if memory is None else memory[1] / 2**20,
        wall_s=st.total_seconds, cpu_s=cpu, io_s=st.io_seconds,
        theory_s=costs.predict(summary, config.kind == "storeall"))


def sweep(problem: Problem, steps: int, configs, costs: Costs, *, deterministic: bool = True,
          directory: str | None = None, repeats: int = 1, log=None) -> list[Row]:
    """Run the gradient of `problem` over `steps` steps for each configuration, `repeats` times
    (the fastest run counts; shared machines are noisy); HDF5 snapshots go to `directory`
    (default: a temporary one). `log(row)` is called after each configuration."""
    rows = []
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        for config in configs:
            row = _run_one(problem, steps, config, costs, tmp, deterministic, repeats)
            rows.append(row)
            if log:
                log(row)
    return relative_to_storeall(rows, steps, costs)


def relative_to_storeall(rows: list[Row], steps: int, costs: Costs) -> list[Row]:
    """Fill in the slowdowns: against the measured store-all row, or its prediction if none ran."""
    theory = costs.storeall_s(steps)
    measured = next((r.wall_s for r in rows if r.kind == "storeall"), theory)
    return [Row(**{**asdict(r), "slowdown": r.wall_s / measured, "theory_slowdown": r.theory_s / theory})
            for r in rows]


@dataclass(frozen=True)
class Advice:
    """The fastest measured configuration within the limit (None if none fits) and a message."""
    row: Row | None
    text: str


def advise(rows: list[Row], limit_bytes: float, state_bytes: int, costs: Costs | None = None,
           steps: int | None = None) -> Advice:
    """Pick the fastest measured configuration whose peak memory (the stepper's count) is within
    `limit_bytes`. With `costs` and `steps`, also estimate the largest Revolve budget that fits
    (each RAM snapshot holds one state of `state_bytes`) when it lies beyond the measured ones."""
    limit_mib = limit_bytes / 2**20
    fits = [r for r in rows if r.peak_mib <= limit_mib]
    if not fits:
        smallest = min(rows, key=lambda r: r.peak_mib)
        return Advice(None, f"nothing measured fits in {limit_mib:g} MiB: the smallest, {smallest.config}, "
                            f"peaks at {smallest.peak_mib:.2f} MiB; try fewer RAM snapshots or --disk")
    best = min(fits, key=lambda r: r.wall_s)
    text = (f"within {limit_mib:g} MiB: {best.config} (peak {best.peak_mib:.2f} MiB), "
            f"{best.wall_s:.2f} s, {best.slowdown:.2f}x store-all's time (theory {best.theory_slowdown:.2f}x)")
    revolves = [r for r in rows if r.kind == "revolve"]
    if costs is not None and steps and revolves and best.kind != "storeall":
        # Memory grows by one state per RAM snapshot over a fixed base (states in flight, gradients).
        base = float(np.median([r.peak_mib * 2**20 - r.ram_snapshots * state_bytes for r in revolves]))
        s = min(int((limit_bytes - base) // state_bytes), steps - 1)
        if s > best.ram_snapshots and s not in {r.ram_snapshots for r in revolves}:
            text += "\n" + _unmeasured(s, best, revolves, costs, steps, (base + s * state_bytes) / 2**20)
    return Advice(best, text)


def _unmeasured(s, best, revolves, costs, steps, mib) -> str:
    """What to expect of the unmeasured Revolve budget `s`, consistent with the measurements: the
    theory scaled by the measured/theory ratio of the nearest measured budget, and never faster
    than a measured budget with at least as many snapshots (more snapshots never cost time)."""
    nearest = min(revolves, key=lambda r: (abs(r.ram_snapshots - s), -r.ram_snapshots))
    predicted = sp.optimal_steps(steps, s) * costs.forward_s + steps * costs.adjoint_s
    if nearest.theory_s > 0:
        predicted *= nearest.wall_s / nearest.theory_s
    larger = [r.wall_s for r in revolves if r.ram_snapshots >= s]
    if larger:
        predicted = max(predicted, min(larger))
    storeall = best.wall_s / best.slowdown if best.slowdown > 0 else costs.storeall_s(steps)
    text = (f"not measured: Revolve s={s} should fit too (about {mib:.2f} MiB), predicted {predicted:.2f} s, "
            f"{predicted / storeall:.2f}x store-all's time (theory scaled by {nearest.config}'s measured/theory)")
    if predicted >= best.wall_s:
        text += f"; no faster than {best.config} as measured: keep {best.config}"
    return text
