"""Offline binomial checkpointing with the fewest forward steps (Griewank & Walther's revolve)."""

from __future__ import annotations

from ..actions import END_FORWARD, END_REVERSE, StorageType, _copy, _forward, _move, _reverse
from .base import Schedule, check_snapshots, check_steps
from .binomial import Splitter, optimal_steps

__all__ = ["Revolve"]


class Revolve(Schedule):
    """Reverse `max_n` steps keeping at most `snapshots_in_ram` states in RAM.

    The snapshot count includes the initial state. The schedule runs exactly
    `optimal_steps(max_n, snapshots_in_ram)` forward steps, the Griewank-Walther optimum, counted
    as checkpoint_schedules counts them (each step is recorded by the forward run just before its
    reverse, and that run counts). Each action costs O(1) amortised time and the step numbers are
    Python ints, so there is no limit on `max_n`.

    >>> from checkpoint import Revolve, validate
    >>> validate(Revolve(100, 5), 100).forward_steps
    253
    """

    def __init__(self, max_n: int, snapshots_in_ram: int, *, storage=StorageType.RAM):
        super().__init__(check_steps(max_n))
        self.snapshots_in_ram = check_snapshots(snapshots_in_ram, "snapshots_in_ram")
        if storage not in (StorageType.RAM, StorageType.DISK):
            raise ValueError(f"storage must be StorageType.RAM or StorageType.DISK, got {storage!r}")
        self.storage = storage

    @property
    def forward_steps(self) -> int:
        """The total number of forward steps the schedule runs (the optimum)."""
        return optimal_steps(self.max_n, self.snapshots_in_ram)

    def _storages(self):
        return frozenset((self.storage,)) if self.max_n > 1 else frozenset()

    def _actions(self):
        # Locals, not attributes, in the loop: this generator is the hot path of every benchmark.
        forward, reverse, copy, move = _forward, _reverse, _copy, _move
        work, store = StorageType.WORK, self.storage
        s = min(self.snapshots_in_ram, self.max_n)
        advance = Splitter(s).advance
        stack = []  # positions of stored states, increasing
        push, pop = stack.append, stack.pop
        end = self.max_n   # steps at and beyond `end` are reversed
        pos = 0

        while pos < end - 1:
            n1 = pos + advance(end - pos, s - len(stack))
            push(pos)
            self._n = n1
            yield forward(pos, n1, True, False, store)
            pos = n1
        self._n = end
        yield forward(end - 1, end, False, True, work)
        yield END_FORWARD
        end -= 1
        self._r += 1
        yield reverse(end + 1, end, True)

        while end > 0:
            top = stack[-1]
            self._n = top
            if top == end - 1:
                pop()
                yield move(top, store, work)
            else:
                yield copy(top, store, work)
                pos = top + advance(end - top, s - len(stack) + 1)
                self._n = pos
                yield forward(top, pos, False, False, work)
                while pos < end - 1:
                    n1 = pos + advance(end - pos, s - len(stack))
                    push(pos)
                    self._n = n1
                    yield forward(pos, n1, True, False, store)
                    pos = n1
            self._n = end
            yield forward(end - 1, end, False, True, work)
            end -= 1
            self._r += 1
            yield reverse(end + 1, end, True)
        yield END_REVERSE
