"""Binomial checkpointing over two tiers: a few snapshots in RAM, more on disk."""

from __future__ import annotations

from ..actions import END_FORWARD, Copy, Forward, Move, StorageType, _forward, _reverse
from .base import Schedule, check_snapshots, check_steps
from .binomial import Splitter
from .sweep import reverse_sweep

__all__ = ["MultiLevel"]

_RAM, _DISK = StorageType.RAM, StorageType.DISK


class _Tally:
    """Stands in for a schedule while counting what a plan costs (reverse_sweep updates _n, _r)."""
    _n = 0
    _r = 0


def _plan_cost(max_n: int, s: int):
    """Run the binomial plan with s snapshots without building actions; return forward steps and,
    per stack depth, how many times a snapshot there is written and read."""
    advance = Splitter(s).advance
    writes, reads = [0] * s, [0] * s
    steps = 0
    stack, pos, end = [], 0, max_n
    while pos < end - 1:
        n1 = pos + advance(end - pos, s - len(stack))
        writes[len(stack)] += 1
        stack.append(pos)
        steps += n1 - pos
        pos = n1
    steps += 1
    tally = _Tally()
    for action in reverse_sweep(tally, stack, end - 1, s, advance, tuple(range(s))):
        kind = type(action)
        if kind is Forward:
            steps += action.n1 - action.n0
            if action.write_ics:
                writes[action.storage] += 1
        elif kind is Copy or kind is Move:
            reads[action.from_storage] += 1
    return steps, writes, reads


class MultiLevel(Schedule):
    """Reverse `max_n` steps with `snapshots_in_ram` snapshots in RAM plus `snapshots_on_disk`
    on disk (the initial state counts as one of them).

    The plan is Revolve's binomial plan over RAM + disk snapshots, so it needs fewer forward
    steps than Revolve with RAM alone. Snapshot slots are ranked by how often the plan writes and
    reads them, and the busiest `snapshots_in_ram` go to RAM (the multistage allocation of Stumm
    and Walther, 2009). `write_cost` and `read_cost` price one disk write or read in forward
    steps; when they are nonzero the schedule uses only as many disk snapshots as minimise
    forward steps + disk traffic, found by a search that dry-runs the plan O(log
    snapshots_on_disk) times at construction. Left out (None), they count as 0 here, and the
    stepper measures them on the run's own disk storage and model (`priced`) before it starts.

    >>> from checkpoint import MultiLevel, Revolve, validate
    >>> validate(MultiLevel(1000, 4, 6), 1000).forward_steps < Revolve(1000, 4).forward_steps
    True
    """

    def __init__(self, max_n: int, snapshots_in_ram: int, snapshots_on_disk: int, *,
                 write_cost: float | None = None, read_cost: float | None = None):
        super().__init__(check_steps(max_n))
        self.snapshots_in_ram = check_snapshots(snapshots_in_ram, "snapshots_in_ram", 0)
        self.snapshots_on_disk = check_snapshots(snapshots_on_disk, "snapshots_on_disk", 0)
        if snapshots_in_ram + snapshots_on_disk < 1:
            raise ValueError("MultiLevel needs at least one snapshot in RAM or on disk (the "
                             "initial state takes one), got 0 and 0")
        for name, cost in (("write_cost", write_cost), ("read_cost", read_cost)):
            if cost is not None and not cost >= 0:
                raise ValueError(f"{name} must be >= 0 (in units of one forward step), got {cost!r}")
        self.costs_given = write_cost is not None or read_cost is not None
        self.write_cost, self.read_cost = write_cost or 0.0, read_cost or 0.0
        self.disk_used = self._choose_disk()
        s = min(self.snapshots_in_ram + self.disk_used, max_n)
        self._s = s
        if s == 0:
            self._tiers = ()
        else:
            _, writes, reads = _plan_cost(max_n, s)
            busiest = sorted(range(s), key=lambda d: (-(writes[d] + reads[d]), -d))
            ram = set(busiest[:self.snapshots_in_ram])
            self._tiers = tuple(_RAM if d in ram else _DISK for d in range(s))

    def _total_cost(self, disk: int) -> float:
        s = min(self.snapshots_in_ram + disk, self.max_n)
        steps, writes, reads = _plan_cost(self.max_n, s)
        # The slots beyond the RAM count go to disk; their traffic is what the costs price.
        order = sorted(range(s), key=lambda d: -(writes[d] + reads[d]))[self.snapshots_in_ram:]
        return (steps + self.write_cost * sum(writes[d] for d in order)
                + self.read_cost * sum(reads[d] for d in order))

    def _choose_disk(self) -> int:
        disk = min(self.snapshots_on_disk, max(self.max_n - self.snapshots_in_ram, 0))
        if disk == 0 or (self.write_cost == 0 and self.read_cost == 0):
            return disk
        # The cost is not unimodal in the disk count (it has several local minima: with costs 7.5/4.9
        # for 2,000 steps and 4 RAM slots, d = 4 is best but d = 248 beats d = 128), so probe a
        # geometric grid first, then search the bracket around the best probe.
        lo = 0 if self.snapshots_in_ram else 1
        cache = {}

        def cost(d):
            if d not in cache:
                cache[d] = self._total_cost(d)
            return cache[d]
        grid = sorted({lo, disk} | {2 ** k for k in range(disk.bit_length() + 1) if lo <= 2 ** k <= disk})
        best = min(grid, key=lambda d: (cost(d), d))
        at = grid.index(best)
        left, right = grid[max(at - 1, 0)], grid[min(at + 1, len(grid) - 1)]
        while right - left > 2:
            a, b = left + (right - left) // 3, right - (right - left) // 3
            if cost(a) <= cost(b):
                right = b
            else:
                left = a
        return min([*range(left, right + 1), best], key=lambda d: (cost(d), d))

    def priced(self, write_cost: float, read_cost: float) -> "MultiLevel":
        """This schedule planned again with disk costs (in forward steps) measured for a run."""
        return MultiLevel(self.max_n, self.snapshots_in_ram, self.snapshots_on_disk,
                          write_cost=write_cost, read_cost=read_cost)

    @property
    def storage_by_depth(self) -> tuple:
        """The tier of the i-th snapshot on the stack (0: the initial state)."""
        return self._tiers

    def _storages(self):
        return frozenset(self._tiers[:max(self.max_n - 1, 0)])

    def _actions(self):
        s, tiers, end = self._s, self._tiers, self.max_n
        advance = Splitter(s).advance
        stack, pos = [], 0
        while pos < end - 1:
            n1 = pos + advance(end - pos, s - len(stack))
            self._n = n1
            yield _forward(pos, n1, True, False, tiers[len(stack)])
            stack.append(pos)
            pos = n1
        self._n = end
        yield _forward(end - 1, end, False, True, StorageType.WORK)
        yield END_FORWARD
        self._r = 1
        yield _reverse(end, end - 1, True)
        yield from reverse_sweep(self, stack, end - 1, s, advance, tiers)
