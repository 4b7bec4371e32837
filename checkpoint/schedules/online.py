"""Online checkpointing: the number of steps is learned when the driver stops."""

from __future__ import annotations

import sys

from ..actions import END_FORWARD, StorageType, _forward, _move
from .base import Schedule, check_snapshots
from .binomial import Splitter, optimal_steps
from .sweep import reverse_sweep

__all__ = ["Online"]


class Online(Schedule):
    """Binomial checkpointing when the number of steps is unknown during the forward sweep.

    The driver runs each Forward it is given and may stop at any step n inside it
    (n0 < n <= n1); it then calls `finalize(n)` and the schedule continues with EndForward and a
    binomial reverse sweep over the snapshots it kept.

    Placement is greedy with one step of lookahead: the reverse sweep's cost for a given set of
    snapshots has a closed form (a sum of `optimal_steps` over the gaps), so at each step the
    schedule keeps the set that would be cheapest if the run stopped one step later, storing the
    current state and dropping at most one older snapshot. The decision depends only on positions,
    so the schedule looks ahead to the next store and hands the driver whole stretches at once.
    Measured against the offline optimum (tests/checkpoint/test_schedule_online.py): the only
    unavoidable loss is that the last step is run twice (the driver cannot record a step before
    it knows it is the last), which costs 1 step; beyond n = 2s the total is within a few percent.
    """

    def __init__(self, snapshots_in_ram: int, *, storage: StorageType = StorageType.RAM):
        super().__init__(None)
        self.snapshots_in_ram = check_snapshots(snapshots_in_ram, "snapshots_in_ram")
        if storage not in (StorageType.RAM, StorageType.DISK):
            raise ValueError(f"storage must be StorageType.RAM or StorageType.DISK, got {storage!r}")
        self.storage = storage
        self._span = None   # (n0, n1) of the Forward the driver is running

    def finalize(self, n: int) -> None:
        """Tell the schedule that the forward sweep stopped at step n (the state at n is live)."""
        if self.max_n is not None:
            raise ValueError(f"finalize was already called (with n={self.max_n}); it may be "
                             "called once per schedule")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"finalize needs the number of forward steps run, an int >= 1, "
                             f"got {n!r}")
        if self._span is None:
            raise ValueError("finalize came before any Forward was run; take the first action "
                             "from the schedule and run it first")
        n0, n1 = self._span
        if not n0 < n <= n1:
            raise ValueError(f"the driver is running Forward({n0}, {n1}), so finalize needs "
                             f"{n0} < n <= {n1} (a step it reached), got {n}")
        self.max_n = n

    def _storages(self):
        return frozenset((self.storage,))

    def _actions(self):
        s, store = self.snapshots_in_ram, self.storage
        stored = [0]
        pos = 0
        while True:
            nxt, drop = (sys.maxsize, None) if s == 1 else _next_store(stored, pos, s)
            self._span = (pos, nxt)
            yield _forward(pos, nxt, pos == stored[-1], False, store)
            if self.max_n is not None:
                break
            pos = self._n = nxt
            if drop is not None:
                yield _move(stored.pop(drop), store, StorageType.NONE)
            stored.append(pos)
        end = self._n = self.max_n
        self._span = None
        yield END_FORWARD
        yield from reverse_sweep(self, stored, end, s, Splitter(s).advance, (store,) * s)


def _next_store(stored: list, pos: int, s: int):
    """The next step at which to store the state, and the index of the snapshot to drop then
    (None: a slot is free). `stored` holds the stored positions; pos == stored[-1] is the last.

    Costs are forward steps of the reverse sweep if the run stopped one step after the decision;
    everything except the gaps touching the current step is fixed between stores, so those parts
    are summed once here and the scan only evaluates three closed forms per step.
    """
    if len(stored) < s:
        return pos + 1, None
    F = optimal_steps
    k = len(stored) - 1            # the snapshot at stored[t] reverses its gap with s - t slots
    gaps = [stored[t + 1] - stored[t] for t in range(k)]
    prefix = [0]
    for t in range(k):
        prefix.append(prefix[-1] + F(gaps[t], s - t))
    fixed = prefix[k - 1]          # gaps 0 .. k-2, untouched by every option below
    # Dropping stored[j], 1 <= j < k: gaps j-1 and j merge, and later gaps gain one slot.
    best_a, best_j = None, None
    shifted = 0                    # sum over t in j+1 .. k-1 of F(gap t, s - t + 1)
    for j in range(k - 1, 0, -1):
        a = prefix[j - 1] + F(gaps[j - 1] + gaps[j], s - j + 1) + shifted
        if best_a is None or a <= best_a:
            best_a, best_j = a, j
        shifted += F(gaps[j], s - j + 1)
    last_gap = F(gaps[k - 1], s - k + 1)
    before = stored[k - 1]
    top_slots = s - k
    i = pos + 1
    while True:
        keep = fixed + last_gap + F(i + 1 - pos, top_slots)
        merge_top = fixed + F(i - before, top_slots + 1) + 1
        if best_a is not None:
            drop_inner = best_a + F(i - pos, top_slots + 1) + 1
            if drop_inner <= merge_top and drop_inner < keep:
                return i, best_j
        if merge_top < keep:
            return i, k
        i += 1
