"""Replay any action sequence on an abstract machine and report what it costs.

The machine holds what a driver holds: the forward position (the step whose start state is live in
WORK, or none), snapshots per tier (RAM, DISK), the steps whose adjoint dependencies are recorded,
and the adjoint position (steps at and beyond it are reversed). Each action is checked against the
meanings in `checkpoint.actions`; the first illegal one raises ValueError naming its index.
"""

from __future__ import annotations

from dataclasses import dataclass

from .actions import Copy, EndForward, EndReverse, Forward, Move, Reverse, StorageType
from .schedules.interop import from_checkpoint_schedules

__all__ = ["validate", "CostSummary"]

_RAM, _DISK, _WORK, _NONE = StorageType.RAM, StorageType.DISK, StorageType.WORK, StorageType.NONE
_TIERS = (_RAM, _DISK)


@dataclass(frozen=True)
class CostSummary:
    """What a valid schedule cost. Forward steps include the recording runs (write_adj_deps)."""

    max_n: int
    actions: int
    forward_steps: int
    recorded_steps: int
    reverse_steps: int
    ram_writes: int
    disk_writes: int
    ram_reads: int
    disk_reads: int
    peak_ram: int
    peak_disk: int

    @property
    def recomputed_steps(self) -> int:
        """Forward steps beyond the first sweep."""
        return self.forward_steps - self.max_n

    def cost(self, *, write_cost: float = 0.0, read_cost: float = 0.0) -> float:
        """Forward steps plus disk traffic, with costs in units of one forward step."""
        return self.forward_steps + write_cost * self.disk_writes + read_cost * self.disk_reads


class _Machine:
    def __init__(self, max_n, budgets):
        self.max_n = max_n
        self.budgets = budgets
        self.pos = 0                    # forward state in WORK is the state at `pos`; None: none
        self.adj = max_n                # steps >= adj have been reversed
        self.held = {_RAM: {}, _DISK: {}}   # tier -> {n: None (a state) or n1 (deps of n..n1-1)}
        self.recorded = []              # [n0, n1) intervals with adjoint dependencies at hand
        self.ended_forward = False
        self.ended_reverse = False
        self.fwd = self.rec = self.rev = 0
        self.writes = {_RAM: 0, _DISK: 0}
        self.reads = {_RAM: 0, _DISK: 0}
        self.peak = {_RAM: 0, _DISK: 0}

    def store(self, tier, n, item):
        if tier not in _TIERS:
            raise ValueError(f"data can only be stored in StorageType.RAM or StorageType.DISK, "
                             f"not {tier!r}")
        held = self.held[tier]
        if n in held:
            raise ValueError(f"{tier!r} already holds data for step {n}; delete it first "
                             f"(Move({n}, {tier!r}, StorageType.NONE))")
        budget = self.budgets[tier]
        if budget is not None and len(held) >= budget:
            raise ValueError(f"{tier!r} would hold {len(held) + 1} snapshots but its budget is "
                             f"{budget} (it holds steps {sorted(held)})")
        held[n] = item
        self.writes[tier] += 1
        self.peak[tier] = max(self.peak[tier], len(held))

    def forward(self, a: Forward):
        n0, n1 = a.n0, a.n1
        if self.pos is None:
            raise ValueError("no forward state is loaded (after a Reverse or loading adjoint data, "
                             "Copy or Move a snapshot to StorageType.WORK first)")
        if n0 != self.pos:
            raise ValueError(f"the forward is at step {self.pos}, so a Forward must start there, "
                             f"not at {n0}")
        if n1 <= n0:
            raise ValueError(f"a Forward must advance at least one step (n1 > n0), got n0={n0}, "
                             f"n1={n1}")
        if n1 > self.adj:
            raise ValueError(f"steps {self.adj} and beyond are already reversed (or beyond "
                             f"max_n={self.max_n}); a Forward may run to step {self.adj} at most, "
                             f"got n1={n1}")
        if a.write_ics:
            self.store(a.storage, n0, None)
        if a.write_adj_deps:
            if a.storage in _TIERS:
                if n1 != n0 + 1:
                    raise ValueError("adjoint dependencies stored in RAM or DISK must cover one "
                                     f"step (n1 = n0 + 1), got n0={n0}, n1={n1}")
                self.store(a.storage, n0, n1)
            elif a.storage is not _WORK:
                raise ValueError("write_adj_deps needs a storage of RAM, DISK or WORK, got "
                                 f"{a.storage!r}")
            else:
                self.recorded.append([n0, n1])
            self.rec += n1 - n0
        self.fwd += n1 - n0
        self.pos = n1

    def reverse(self, a: Reverse):
        n1, n0 = a.n1, a.n0
        if not self.ended_forward:
            raise ValueError("a Reverse must come after EndForward")
        if n1 != self.adj:
            raise ValueError(f"the adjoint is at step {self.adj}, so a Reverse must start there "
                             f"(n1={self.adj}), got n1={n1}")
        if not 0 <= n0 < n1:
            raise ValueError(f"a Reverse must go back at least one step and not below 0 "
                             f"(0 <= n0 < n1), got n1={n1}, n0={n0}")
        for interval in reversed(self.recorded):
            if interval[0] <= n0 and n1 <= interval[1]:
                break
        else:
            raise ValueError(f"steps {n0}..{n1 - 1} are not recorded; run them with "
                             f"Forward(..., write_adj_deps=True) first (recorded: "
                             f"{[tuple(i) for i in self.recorded]})")
        if a.clear_adj_deps:
            self.recorded.remove(interval)
            if interval[0] < n0:
                self.recorded.append([interval[0], n0])
        self.rev += n1 - n0
        self.adj = n0

    def load(self, a, move: bool):
        n, src, dst = a.n, a.from_storage, a.to_storage
        name = "Move" if move else "Copy"
        if src not in _TIERS:
            raise ValueError(f"{name} reads from StorageType.RAM or StorageType.DISK, not {src!r}")
        held = self.held[src]
        if n not in held:
            raise ValueError(f"{src!r} holds no data for step {n} (it holds {sorted(held)})")
        item = held[n]
        if move:
            del held[n]
        if dst is _NONE:
            if not move:
                raise ValueError("Copy to StorageType.NONE means nothing; use Move to delete")
            return
        self.reads[src] += 1
        if dst is _WORK:
            if item is None:
                self.pos = n
            else:
                self.recorded.append([n, item])
                self.pos = None
        else:
            self.store(dst, n, item)

    def end_forward(self):
        if self.ended_forward:
            raise ValueError("EndForward came twice")
        if self.pos != self.max_n:
            raise ValueError(f"EndForward needs the forward at step max_n={self.max_n}, but it is "
                             f"at {self.pos}")
        self.ended_forward = True

    def end_reverse(self):
        if self.adj != 0:
            raise ValueError(f"EndReverse needs the adjoint at step 0, but it is at {self.adj}")
        self.ended_reverse = True


def validate(schedule, max_n: int, *, snapshots_in_ram: int | None = None,
             snapshots_on_disk: int | None = None) -> CostSummary:
    """Check that `schedule` (a schedule or any iterable of actions, ours or checkpoint_schedules')
    reverses `max_n` steps correctly within the snapshot budgets (None: unlimited), and return its
    cost. Raises ValueError naming the index and action of the first illegal step.

    An online schedule (one with `finalize` whose `max_n` is still None) is driven as a driver
    would: a Forward that runs past `max_n` is stopped there and `finalize(max_n)` is called.
    """
    if isinstance(max_n, bool) or not isinstance(max_n, int) or max_n < 1:
        raise ValueError(f"max_n must be an int >= 1 (the number of forward steps), got {max_n!r}")
    m = _Machine(max_n, {_RAM: snapshots_in_ram, _DISK: snapshots_on_disk})
    online = hasattr(schedule, "finalize") and getattr(schedule, "max_n", 0) is None
    convert = _converter(schedule)
    index = -1
    action = None
    try:
        for index, action in enumerate(schedule):
            if convert is not None:
                action = convert(action)
            if m.ended_reverse:
                raise ValueError("no action may follow EndReverse")
            kind = type(action)
            if kind is Forward:
                if online and action.n1 >= max_n:
                    m.forward(Forward(action.n0, max_n, action.write_ics, action.write_adj_deps,
                                      action.storage))
                    schedule.finalize(max_n)
                    online = False
                else:
                    m.forward(action)
            elif kind is Reverse:
                m.reverse(action)
            elif kind is Copy or kind is Move:
                m.load(action, kind is Move)
            elif kind is EndForward:
                m.end_forward()
            elif kind is EndReverse:
                m.end_reverse()
                if not isinstance(schedule, (list, tuple)):
                    break   # some peer schedules start another reverse sweep after this
            else:
                raise ValueError(f"{action!r} is not an action (expected Forward, Reverse, Copy, "
                                 "Move, EndForward or EndReverse)")
    except ValueError as exc:
        raise ValueError(f"action #{index} {action!r}: {exc}") from None
    if not m.ended_reverse:
        raise ValueError(f"the actions ended after #{index} without EndReverse (adjoint at step "
                         f"{m.adj}, forward at step {m.pos})")
    return CostSummary(max_n, index + 1, m.fwd, m.rec, m.rev, m.writes[_RAM], m.writes[_DISK],
                       m.reads[_RAM], m.reads[_DISK], m.peak[_RAM], m.peak[_DISK])


def _converter(schedule):
    """checkpoint_schedules' actions are translated on the fly; ours pass through."""
    module = type(schedule).__module__ or ""
    if module.startswith("checkpoint_schedules"):
        return from_checkpoint_schedules
    return None
