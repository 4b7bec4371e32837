"""The memory/time trade-off of checkpointed gradients, measured on one example model.

`sweep` runs the real gradient once per configuration (Revolve with each RAM snapshot budget,
MultiLevel RAM + HDF5 splits with measured disk costs, and store-all) and returns one `Row` each:
the measured wall and CPU time and peak memory next to the theory: the paths the schedule's run
takes (native advances, native reversals, steps kept natively, Python steps, disk snapshots:
`paths.plan`, a dry plan of its actions) priced with unit costs fitted on probe gradients that
take the same paths, run in the sweep's own rounds (`Costs.wall`, `Costs.cpu`; `calibrate`,
`probes`). `advise` picks, for a memory limit, the fastest configuration that fits and the
slowdown to expect against store-all.

    from stepper.bench import problems, tradeoff
    p = problems.make("wave", 64)
    costs = tradeoff.calibrate(p)
    rows, costs = tradeoff.sweep(p, 2000, tradeoff.configurations(2000, [4, 8, 16]), costs)
    print(tradeoff.advise(rows, 8 * 2**20, p.model.state_bytes, costs).text)
"""
from __future__ import annotations

import math
import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, replace

import numpy as np

import stepper as sp

from . import rss
from .paths import PathCosts, Paths, fit, plan
from .problems import Problem

__all__ = ["Config", "Costs", "Row", "Advice", "probes", "calibrate", "measure_disk", "configurations", "sweep",
           "advise"]


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
    store-all (which touches fresh memory every step), and one disk snapshot write/read (these
    price MultiLevel's disk snapshots). ``wall`` and ``cpu``: each path's unit cost in wall and
    process CPU seconds (`paths.PathCosts`, None: priced per step by `predict`); ``native`` and
    ``python_first``: how the model's steps run (`paths.plan`), as its probes ran;
    ``probe_steps``, ``probe_budgets``, ``disk_probes``: the `probes` calibrated on, which `sweep`
    reruns."""
    forward_s: float
    adjoint_s: float
    storeall_step_s: float
    write_s: float = 0.0
    read_s: float = 0.0
    wall: PathCosts | None = None
    cpu: PathCosts | None = None
    native: bool = True
    python_first: int = 2
    probe_steps: tuple[int, int] = (0, 0)
    probe_budgets: tuple[int, int] = (3, 0)
    disk_probes: bool = False

    def paths(self, schedule) -> Paths:
        """The paths a run of `schedule` (a fresh one: it is consumed) takes with this model."""
        return plan(schedule, native=self.native, python_first=self.python_first)

    def price(self, paths: Paths, cpu: bool = False) -> float:
        """Seconds (wall, or CPU with `cpu`) a run taking `paths` should take (nan uncalibrated)."""
        unit = self.cpu if cpu else self.wall
        return math.nan if unit is None else unit.price(paths)

    def predict(self, summary, store_all: bool = False) -> float:
        """Seconds a schedule should take, from its `checkpoint.validate` summary, pricing every
        step alike (what `price` refines by path)."""
        if store_all:
            return summary.forward_steps * self.storeall_step_s + summary.reverse_steps * self.adjoint_s
        return (summary.forward_steps * self.forward_s + summary.reverse_steps * self.adjoint_s
                + summary.disk_writes * self.write_s + summary.disk_reads * self.read_s)

    def storeall_s(self, steps: int) -> float:
        if self.wall is not None:
            return self.price(self.paths(sp.StoreAll(steps)))
        return steps * (self.storeall_step_s + self.adjoint_s)


@dataclass(frozen=True)
class Row:
    """One measured configuration. Memory in MiB; ``peak_mib`` is the stepper's own count (states,
    scratch, gradients, RAM snapshots), ``rss_peak_mib`` the whole process's peak during the run and
    ``rss_growth_mib`` that peak less the process's size when the run started (None off Linux).
    ``cpu_s`` is the process's CPU time during the run (all threads): with one thread it shows the
    work done even when other processes share the cores and stretch ``wall_s``.
    ``slowdown`` and ``theory_slowdown`` are relative to store-all (measured, and predicted).
    ``theory_cpu_s``: the CPU time predicted; ``wall_median_s``, ``cpu_median_s``: the medians
    over the repeats (the other times are the fastest run's); ``paths_exact``: whether the run's
    statistics equal the planned path counts (`paths.Paths.matches`)."""
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
    theory_cpu_s: float = math.nan
    wall_median_s: float = math.nan
    cpu_median_s: float = math.nan
    paths_exact: bool | None = None


def probes(probe: int, long: int, budgets: tuple[int, int] = (3, 0), disk: bool = False) -> list:
    """The probe gradients the unit costs are fitted on, as schedule makers: Revolve and store-all
    over `probe` steps (they fix a run's own cost), and over `long` steps, the sweep's length,
    store-all and Revolve with the fewest and the most RAM snapshots of `budgets` (0: long // 8).
    A step's cost depends on how much memory the run touches (store-all's kept states; snapshots
    that outgrow a cache), which the paths do not count: probes as long as the sweep, spanning its
    budgets, touch what its runs touch. With `disk`, MultiLevel probes writing HDF5 snapshots too.
    The first two give `Costs`' per-step estimates."""
    fewest, most = min(budgets[0], long - 1), min(budgets[1] or max(2, long // 8), long - 1)
    made = [lambda: sp.Revolve(probe, 2) if probe > 2 else sp.StoreAll(probe), lambda: sp.StoreAll(probe),
            lambda: sp.StoreAll(long)]
    if probe > 2:
        made += [lambda: sp.Revolve(probe, 1), lambda: sp.Revolve(long, fewest), lambda: sp.Revolve(long, most)]
    if disk and long > 4:
        made += [lambda: sp.MultiLevel(long, 2, max(2, long // 8), write_cost=1.0, read_cost=1.0),
                 lambda: sp.MultiLevel(long, 4, max(2, long // 4), write_cost=0.5, read_cost=0.5)]
    return made


def calibrate(problem: Problem, probe: int = 50, *, deterministic: bool = True, repeats: int = 5,
              directory: str | None = None, max_steps: int | None = None,
              budgets: tuple[int, int] = (3, 0)) -> Costs:
    """Per-step and per-path costs of `problem` from `repeats` interleaved rounds of the `probes`
    (the long ones over `max_steps`, default 8x `probe`, with the fewest and most RAM snapshots
    of `budgets`): forward and adjoint per step from Revolve(probe, 2) (mostly recomputation),
    store-all's recorded step from StoreAll(probe); per path (`Costs.wall`, `Costs.cpu`) fitted on
    all probes, whose paths are counted by `paths.plan` (with `directory`, MultiLevel probes write
    HDF5 snapshots there). How the model's steps run (native or not, after how many Python steps)
    is the plan that reproduces the probes' statistics. `sweep` refits the paths' costs on the
    same probes run in its own rounds."""
    model = problem.model
    model.rollout(problem.initial, 2, deterministic=deterministic, progress=False)      # compile, warm up
    long = max(probe, max_steps or 8 * probe)
    made = probes(probe, long, budgets, disk=directory is not None)
    on_disk = _disk_paths(made, None if directory is None else os.path.join(directory, "calibrate.h5"))
    runs = _probe_runs(problem, made, on_disk, deterministic, repeats)
    forward = min(r.stats.forward_seconds / r.stats.forward_steps for r, _, _ in runs[0])
    adjoint = min(r.stats.adjoint_seconds / r.stats.steps for r, _, _ in runs[0])
    storeall = min(r.stats.forward_seconds / r.stats.steps for r, _, _ in runs[1])
    native, python_first = _how_steps_run([(make, rs[0][0].stats) for make, rs in zip(made, runs)])
    costs = Costs(forward, adjoint, storeall, native=native, python_first=python_first,
                  probe_steps=(probe, long), probe_budgets=budgets, disk_probes=directory is not None)
    return _fitted(costs, made, runs)


def _disk_paths(made, path) -> list:
    """Per probe of `made`, the HDF5 file its snapshots go to (`path`) if its schedule writes any."""
    return [path if path is not None and plan(make()).disk_writes else None for make in made]


def _probe_runs(problem: Problem, made, on_disk, deterministic: bool, repeats: int = 1, runs=None) -> list:
    """`repeats` rounds of the probes `made` (snapshots to `on_disk`, `_disk_paths`), appended to
    `runs` (one list per probe)."""
    runs = runs if runs is not None else [[] for _ in made]
    for _ in range(repeats):
        for k, make in enumerate(made):
            schedule = make()
            runs[k].append(_gradient(problem, schedule.max_n, schedule, on_disk[k], deterministic))
    return runs


def _fitted(costs: Costs, made, runs) -> Costs:
    """`costs` with the unit cost of each path fitted on the fastest of each probe's `runs`: a
    shared machine's load only adds time, so the fastest of interleaved runs is what repeats (two
    runs of one schedule in the same rounds agree within a few percent by it, and by up to a third
    by their medians, on our 2-core VM), and it is what the rows' theory is compared with."""
    paths = [plan(make(), native=costs.native, python_first=costs.python_first) for make in made]
    python = not costs.native or costs.python_first > 2
    wall = fit([(p, min(r.stats.total_seconds for r, _, _ in rs)) for p, rs in zip(paths, runs)], python)
    cpu = fit([(p, min(c for _, c, _ in rs)) for p, rs in zip(paths, runs)], python)
    return replace(costs, wall=wall, cpu=cpu)


ALL = 2**62     # python_first of a step whose trace is never trusted: every first run on Python


def _how_steps_run(probes) -> tuple[bool, int]:
    """(native, python_first) whose plans give every probe's statistics (see `paths.plan`): a
    trusted trace's, one never trusted (its steps' first runs on Python: it reads s.n, say), an
    untraceable step's; a trusted trace's if none does (its rows then say paths_exact=False)."""
    for native, python_first in ((True, 2), (True, ALL), (False, 0), (True, 1), (True, 3), (True, 0)):
        if all(not plan(make(), native=native, python_first=python_first).matches(stats) for make, stats in probes):
            return native, python_first
    return True, 2


def measure_disk(problem: Problem, costs: Costs, directory: str) -> Costs:
    """`costs` with the HDF5 write/read time of one snapshot of `problem`'s state (measure_costs)."""
    example = {name: a.numpy() for name, a in problem.initial.items()}
    with sp.HDF5Storage(os.path.join(directory, "measure.h5")) as store:
        write_s, read_s = store.measure_costs(example, repeats=5)
    os.remove(os.path.join(directory, "measure.h5"))
    return replace(costs, write_s=write_s, read_s=read_s)


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


def _gradient(problem: Problem, steps: int, schedule, path, deterministic: bool):
    """One run: (result, seconds of process CPU time, (peak RSS, its growth) in bytes or None).
    Memory freed before goes back to the system first, so that each run (probes too) pays for the
    fresh pages it touches alike: store-all's kept steps touch new memory every step."""
    rss.trim()
    have_rss = rss.reset_peak()
    before = rss.current_bytes()
    cpu = time.process_time()
    result = problem.model.gradient(problem.initial, steps, loss=problem.loss, running_loss=problem.running_loss,
                                    schedule=schedule, storage=path, deterministic=deterministic, progress=False)
    cpu = time.process_time() - cpu
    peak = rss.peak_bytes() if have_rss and before is not None else None
    if path and os.path.exists(path):
        os.remove(path)
    return result, cpu, None if peak is None else (peak, peak - before)


def _row(config: Config, steps: int, costs: Costs, runs) -> Row:
    """The Row of `config` from its `runs` (_gradient's results): the fastest run's numbers, the
    medians, and the theory of the paths its schedule takes."""
    summary = sp.validate(config.schedule(steps, costs), steps)
    paths = costs.paths(config.schedule(steps, costs))
    result, cpu, memory = min(runs, key=lambda run: run[0].stats.total_seconds)
    st = result.stats
    priced = costs.wall is not None
    return Row(
        config=config.label, kind=config.kind,
        ram_snapshots=config.ram if config.kind != "storeall" else steps,
        disk_snapshots=config.schedule(steps, costs).disk_used if config.kind == "multilevel" else 0,
        forward_steps=st.forward_steps, schedule_forward_steps=summary.forward_steps,
        disk_writes=st.snapshots_written(sp.StorageType.DISK), disk_reads=st.snapshots_read(sp.StorageType.DISK),
        peak_mib=st.peak_memory_bytes / 2**20, rss_peak_mib=None if memory is None else memory[0] / 2**20,
        rss_growth_mib=None if memory is None else memory[1] / 2**20,
        wall_s=st.total_seconds, cpu_s=cpu, io_s=st.io_seconds,
        theory_s=costs.price(paths) if priced else costs.predict(summary, config.kind == "storeall"),
        theory_cpu_s=costs.price(paths, cpu=True),
        wall_median_s=statistics.median(r.stats.total_seconds for r, _, _ in runs),
        cpu_median_s=statistics.median(c for _, c, _ in runs),
        paths_exact=not paths.matches(st) and (paths.disk_writes, paths.disk_reads) == (
            st.snapshots_written(sp.StorageType.DISK), st.snapshots_read(sp.StorageType.DISK)))


def sweep(problem: Problem, steps: int, configs, costs: Costs, *, deterministic: bool = True,
          directory: str | None = None, repeats: int = 1, log=None) -> tuple[list[Row], Costs]:
    """Run the gradient of `problem` over `steps` steps for each configuration, in `repeats`
    interleaved rounds (each configuration once per round: a shared machine's load falls on all
    alike); a Row keeps the fastest run and the medians. Each round runs `costs`' calibration
    probes too, and the theory prices the rows with unit costs refitted on them: a shared
    machine's speed drifts between a calibration and a sweep that follows it, not within a round.
    Returns the rows and the refitted costs. HDF5 snapshots go to `directory` (default: a
    temporary one). `log(row)` is called for each row once all rounds ran."""
    configs = list(configs)
    runs = [[] for _ in configs]
    recalibrate = costs.wall is not None and costs.probe_steps[0] > 0
    made = probes(*costs.probe_steps, costs.probe_budgets, costs.disk_probes) if recalibrate else []
    probe_runs = [[] for _ in made]
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        path = os.path.join(tmp, "snapshots.h5")
        on_disk = _disk_paths(made, os.path.join(tmp, "probe.h5"))
        for _ in range(repeats):
            _probe_runs(problem, made, on_disk, deterministic, runs=probe_runs)
            for k, config in enumerate(configs):
                runs[k].append(_gradient(problem, steps, config.schedule(steps, costs),
                                         path if config.kind == "multilevel" else None, deterministic))
    if recalibrate:
        costs = _fitted(costs, made, probe_runs)
    rows = [_row(config, steps, costs, runs[k]) for k, config in enumerate(configs)]
    for row in rows if log else ():
        log(row)
    return relative_to_storeall(rows, steps, costs), costs


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
    if costs.wall is not None:
        predicted = costs.price(costs.paths(sp.Revolve(steps, s)))
    else:
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
