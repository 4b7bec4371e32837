"""The paths a gradient's steps take, counted from the schedule's actions, and what each costs.

A checkpointed gradient does not run every step alike (stepper/execute/executor.py): a traced step's
first steps run through the Python step function until the runner trusts its trace
(`StepRunner.trusted`, two steps), then every advance runs in the native step loop; a step
recorded for later is kept natively (the state it starts from); a recorded step whose Reverse
comes next is never run (its native reversal replays it, `launches_skipped`); every reversal of a
natively kept step is native, of a tape-recorded one Python's. A step that cannot be traced takes
the Python path throughout. Around the steps, the executor or a native stretch works through each
schedule action in Python, and snapshots go to disk. `plan` replays those decisions on the
schedule's actions alone (a dry plan: no step runs) and `Paths` holds the counts, which equal a
real run's statistics (`Paths.matches`). `PathCosts` prices them with unit costs fitted on probe
gradients that take the same paths (`fit`).
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from checkpoint import Copy, EndForward, Forward, Move, Reverse, StorageType

__all__ = ["Paths", "PathCosts", "plan", "fit"]

_DISK = StorageType.DISK


@dataclass(frozen=True)
class Paths:
    """How many of a gradient's steps take each path (see the module docstring).

    ``python_steps``: forward steps run by the Python step function, not recorded;
    ``python_records``: steps recorded on a tape by it (reversed on the Python path);
    ``advanced``: steps run by native advances (recomputations, the forward sweep);
    ``kept``: steps recorded natively for a later reversal (StoreAll's forward sweep);
    ``at_once``: recorded steps reversed at once, never run; ``native_reversals``,
    ``python_reversals``; ``actions``: the schedule's actions; ``disk_writes``, ``disk_reads``:
    snapshots written to and read from DISK."""
    python_steps: int = 0
    python_records: int = 0
    advanced: int = 0
    kept: int = 0
    at_once: int = 0
    native_reversals: int = 0
    python_reversals: int = 0
    actions: int = 0
    disk_writes: int = 0
    disk_reads: int = 0

    @property
    def stats(self) -> dict:
        """The `GradientStats` fields these counts fix, with the values a real run reports."""
        return {"forward_steps": self.python_steps + self.python_records + self.advanced + self.kept + self.at_once,
                "recorded_steps": self.python_records + self.kept + self.at_once,
                "reverse_steps": self.native_reversals + self.python_reversals,
                "native_steps": self.advanced + self.kept, "native_reversals": self.native_reversals}

    def matches(self, stats) -> dict:
        """The fields of `stats` (a GradientStats) that differ from these counts: {name: (planned, real)}."""
        return {k: (v, getattr(stats, k)) for k, v in self.stats.items() if getattr(stats, k) != v}


def plan(actions, *, native: bool = True, python_first: int = 2) -> Paths:
    """The paths of a run of `actions` (a schedule, or its actions as a list): with `native`, a
    traced step whose first `python_first` steps run through Python (the runner trusts its trace
    after them); without, an untraceable step (every step on the Python path)."""
    actions = list(actions)
    count = dict.fromkeys((f.name for f in fields(Paths)), 0)
    count["actions"] = len(actions)
    seen, reversing = 0, False
    python_recorded: set[int] = set()
    for i, a in enumerate(actions):
        kind = type(a)
        if kind is EndForward:
            reversing = True
        elif kind is Forward:
            if a.write_ics and a.storage is _DISK:
                count["disk_writes"] += 1
            nxt = actions[i + 1] if i + 1 < len(actions) else None
            # Sweep._forward: a recorded step reversed next, and run before, is never run
            dead_last = (a.write_adj_deps and reversing and type(nxt) is Reverse and nxt.n1 == a.n1
                         and a.n1 - 1 < seen)
            for n in range(a.n0, a.n1):
                if not native or (n >= seen and n < python_first):
                    if a.write_adj_deps:
                        count["python_records"] += 1
                        python_recorded.add(n)
                    else:
                        count["python_steps"] += 1
                elif a.write_adj_deps:
                    count["at_once" if dead_last and n == a.n1 - 1 else "kept"] += 1
                else:
                    count["advanced"] += 1
            seen = max(seen, a.n1)
        elif kind is Reverse:
            for k in range(a.n0, a.n1):
                count["python_reversals" if k in python_recorded else "native_reversals"] += 1
                if a.clear_adj_deps:
                    python_recorded.discard(k)
        elif kind in (Copy, Move) and a.from_storage is _DISK and a.to_storage is not StorageType.NONE:
            count["disk_reads"] += 1
        elif kind in (Copy, Move) and a.to_storage is _DISK:
            count["disk_writes"] += 1
    return Paths(**count)


# The counts a path's unit cost multiplies, in PathCosts' order (a run's fixed cost multiplies 1).
_FEATURES = ("python_steps", "python_records", "advanced", "kept", "at_once", "native_reversals",
             "python_reversals", "actions", "disk_writes", "disk_reads")
# The ones `fit` prices. A native run's few Python steps (the same in every run: a trusted
# trace's first two) cost as part of the run, unless `fit` is told to price them; an at-once
# step's replay as part of its reversal; and a schedule's actions (about four a reversed step,
# whatever the budget) as part of the reversals.
_NATIVE = ("advanced", "kept", "native_reversals", "disk_writes", "disk_reads")
_PYTHON = ("python_steps", "python_records", "python_reversals")


@dataclass(frozen=True)
class PathCosts:
    """Seconds per step of each path, per disk snapshot and per run (its setup, seeding and, in a
    native run, its first Python steps): `Paths` priced with `price`. What `fit` folds into
    another path's cost is 0 here."""
    python_step_s: float = 0.0
    python_record_s: float = 0.0
    advance_s: float = 0.0
    kept_s: float = 0.0
    at_once_s: float = 0.0
    native_reversal_s: float = 0.0
    python_reversal_s: float = 0.0
    action_s: float = 0.0
    disk_write_s: float = 0.0
    disk_read_s: float = 0.0
    run_s: float = 0.0

    def price(self, paths: Paths) -> float:
        """Seconds a run taking `paths` should take."""
        unit = [getattr(self, f.name) for f in fields(self)]
        return float(np.dot(_vector(paths), unit))


def _vector(paths: Paths) -> np.ndarray:
    return np.array([*(getattr(paths, k) for k in _FEATURES), 1], dtype=float)


def fit(samples, python: bool = False) -> PathCosts:
    """Unit costs from `samples`: (Paths, seconds) pairs of probe gradients, by least squares on
    relative errors with no cost negative (a path whose cost comes out negative is dropped and the
    rest refitted). The Python paths are priced with `python` only (a step run through Python on
    every first run, say); else their few steps are a run's. Paths no probe took cost 0."""
    rows = np.array([_vector(p) for p, _ in samples])
    seconds = np.array([s for _, s in samples], dtype=float)
    a, b = rows / seconds[:, None], np.ones_like(seconds)     # each probe counts alike, short or long
    columns = [_FEATURES.index(k) for k in _NATIVE + (_PYTHON if python else ())] + [len(_FEATURES)]
    active = [k for k in columns if rows[:, k].any()]
    unit = np.zeros(rows.shape[1])
    while active:
        solution = np.linalg.lstsq(a[:, active], b, rcond=None)[0]
        if (solution >= 0).all():
            unit[active] = solution
            break
        del active[int(np.argmin(solution))]
    return PathCosts(*map(float, unit))
