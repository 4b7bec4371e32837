"""Offline binomial checkpointing with the fewest forward steps (Griewank & Walther's revolve)."""

from __future__ import annotations

from ..actions import END_FORWARD, StorageType, _forward, _reverse
from .base import Schedule, check_snapshots, check_steps
from .binomial import Splitter, optimal_steps
from .sweep import reverse_sweep

__all__ = ["Revolve"]


class Revolve(Schedule):
    """Reverse `max_n` steps keeping at most `snapshots_in_ram` states in RAM.

    ``Revolve(max_n, snapshots=s, storage=StorageType.DISK)`` keeps the same `s` snapshots on disk
    instead (the gradient's `storage=` then needs an HDF5 path or storage); `snapshots` is the
    tier-neutral name of the count, `snapshots_in_ram` the historical one (the same number).

    The snapshot count includes the initial state. The schedule runs exactly
    `optimal_steps(max_n, snapshots_in_ram)` forward steps, the Griewank-Walther optimum, counted
    as checkpoint_schedules counts them (each step is recorded by the forward run just before its
    reverse, and that run counts). Each action costs O(1) amortised time and the step numbers are
    Python ints, so there is no limit on `max_n`.

    >>> from checkpoint import Revolve, validate
    >>> validate(Revolve(100, 5), 100).forward_steps
    416
    """

    def __init__(self, max_n: int, snapshots_in_ram: int | None = None, *, storage=StorageType.RAM,
                 snapshots: int | None = None):
        super().__init__(check_steps(max_n))
        if (snapshots_in_ram is None) == (snapshots is None):
            raise TypeError("Revolve(max_n, snapshots): give the snapshot count once, as snapshots= "
                            "(or positionally)")
        count = snapshots if snapshots is not None else snapshots_in_ram
        self.snapshots_in_ram = check_snapshots(count, "snapshots" if snapshots is not None else "snapshots_in_ram")
        if storage not in (StorageType.RAM, StorageType.DISK):
            raise ValueError(f"storage must be StorageType.RAM or StorageType.DISK, got {storage!r}")
        self.storage = storage

    @property
    def snapshots(self) -> int:
        """How many states the schedule keeps at once (in `storage`'s tier), the initial one included."""
        return self.snapshots_in_ram

    @property
    def forward_steps(self) -> int:
        """The total number of forward steps the schedule runs (the optimum)."""
        return optimal_steps(self.max_n, self.snapshots_in_ram)

    def _storages(self):
        return frozenset((self.storage,)) if self.max_n > 1 else frozenset()

    def _actions(self):
        # Locals, not attributes, in the loop: this generator is the hot path of every benchmark.
        forward, store = _forward, self.storage
        s = min(self.snapshots_in_ram, self.max_n)
        advance = Splitter(s).advance
        stack = []  # positions of stored states, increasing
        end = self.max_n
        pos = 0
        while pos < end - 1:
            n1 = pos + advance(end - pos, s - len(stack))
            stack.append(pos)
            self._n = n1
            yield forward(pos, n1, True, False, store)
            pos = n1
        self._n = end
        yield forward(end - 1, end, False, True, StorageType.WORK)
        yield END_FORWARD
        self._r = 1
        yield _reverse(end, end - 1, True)
        yield from reverse_sweep(self, stack, end - 1, s, advance, (store,) * s)
