"""What every schedule shares: argument checks, one-shot iteration, and the pull interface."""

from __future__ import annotations

from typing import Iterator

from ..actions import Action, EndReverse

__all__ = ["Schedule", "check_steps", "check_snapshots"]


def check_steps(max_n, what: str = "max_n") -> int:
    if isinstance(max_n, bool) or not isinstance(max_n, int):
        raise ValueError(f"{what} must be an int (the number of forward steps), got {max_n!r}")
    if max_n < 1:
        raise ValueError(f"{what} must be at least 1 (the number of forward steps), got {max_n}")
    return max_n


def check_snapshots(count, what: str, minimum: int = 1) -> int:
    if isinstance(count, bool) or not isinstance(count, int):
        raise ValueError(f"{what} must be an int, got {count!r}")
    if count < minimum:
        raise ValueError(f"{what} must be at least {minimum} (the initial state takes one "
                         f"snapshot), got {count}")
    return count


class Schedule:
    """A checkpointing schedule: an iterable of actions, computed on demand, with no I/O.

    `for action in schedule` yields every action once, ending with EndReverse. The
    checkpoint_schedules-style pull interface `next(schedule)` reads from the same stream.
    A schedule runs once: iterating it again, or pulling after EndReverse, raises ValueError.

    Attributes: `max_n` (the number of forward steps; None for an online schedule until
    `finalize`), `n` (the forward position after the last action yielded) and `r` (the number of
    adjoint steps done so far).
    """

    max_n: int | None

    def __init__(self, max_n: int | None):
        self.max_n = max_n
        self._n = 0
        self._r = 0
        self._stream: Iterator[Action] | None = None
        self._done = False

    @property
    def n(self) -> int:
        return self._n

    @property
    def r(self) -> int:
        return self._r

    @property
    def is_exhausted(self) -> bool:
        """Whether EndReverse has been yielded."""
        return self._done

    def _actions(self) -> Iterator[Action]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _guarded(self) -> Iterator[Action]:
        yield from self._actions()
        self._done = True

    def __iter__(self) -> Iterator[Action]:
        if self._stream is not None:
            raise ValueError(f"{type(self).__name__} has already been iterated; a schedule runs "
                             "once, so create a new one for another reverse sweep")
        self._stream = self._guarded()
        return self._stream

    def __next__(self) -> Action:
        if self._stream is None:
            self.__iter__()
        if self._done:
            raise ValueError(f"{type(self).__name__} has no actions after EndReverse; the "
                             "reverse sweep is complete, create a new schedule to run again")
        action = next(self._stream)
        if isinstance(action, EndReverse):
            self._done = True
        return action

    def uses_storage_type(self, storage) -> bool:
        """Whether any snapshot goes to `storage` (checkpoint_schedules' interface)."""
        return storage in self._storages()

    def _storages(self) -> frozenset:  # pragma: no cover - abstract
        raise NotImplementedError
