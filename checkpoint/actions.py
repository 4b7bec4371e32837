"""The action vocabulary shared by every schedule and every driver.

The names, fields and meanings are those of the checkpoint_schedules package (Firedrake), so a
driver written for one side can run schedules from the other (see `to_checkpoint_schedules` and
`from_checkpoint_schedules`). Steps are numbered from 0; "the state at n" is the state at the start
of step n, i.e. after n forward steps from the initial state.

- `Forward(n0, n1, write_ics, write_adj_deps, storage)`: advance the forward from the state at n0 to
  the state at n1 (steps n0 .. n1-1). If `write_ics`, first store the state at n0 (the forward
  restart data, "initial conditions") in `storage`. If `write_adj_deps`, record steps n0 .. n1-1 so
  that their adjoints can run later (the data goes to `storage`; WORK means working memory).
- `Reverse(n1, n0, clear_adj_deps)`: run the adjoint of steps n1-1 down to n0; they must have been
  recorded. If `clear_adj_deps`, drop that recorded data afterwards.
- `Copy(n, from_storage, to_storage)`: copy the snapshot of the state at n. With `to_storage` WORK
  this loads it as the current forward state (the stored copy stays).
- `Move(n, from_storage, to_storage)`: as Copy, but the source copy is dropped. With `to_storage`
  NONE this only deletes the snapshot.
- `EndForward()`: the first forward sweep is over. `EndReverse()`: the adjoint reached step 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

__all__ = [
    "StorageType", "Action", "Forward", "Reverse", "Copy", "Move", "EndForward", "EndReverse",
]


class StorageType(Enum):
    """Where data lives. RAM and DISK hold snapshots; WORK is the live state the forward and
    adjoint run on; NONE is nowhere (a Move to NONE deletes). Values match checkpoint_schedules."""

    RAM = 0
    DISK = 1
    WORK = -1
    NONE = None

    def __repr__(self) -> str:
        return f"StorageType.{self.name}"


class Action:
    """Base class of all actions (for isinstance checks and single dispatch)."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Forward(Action):
    n0: int
    n1: int
    write_ics: bool
    write_adj_deps: bool
    storage: StorageType

    def __len__(self) -> int:
        return self.n1 - self.n0


@dataclass(frozen=True, slots=True)
class Reverse(Action):
    n1: int
    n0: int
    clear_adj_deps: bool

    def __len__(self) -> int:
        return self.n1 - self.n0


@dataclass(frozen=True, slots=True)
class Copy(Action):
    n: int
    from_storage: StorageType
    to_storage: StorageType


@dataclass(frozen=True, slots=True)
class Move(Action):
    n: int
    from_storage: StorageType
    to_storage: StorageType


@dataclass(frozen=True, slots=True)
class EndForward(Action):
    pass


@dataclass(frozen=True, slots=True)
class EndReverse(Action):
    pass


def _fast_constructor(cls):
    """A constructor for a frozen slotted dataclass that skips the generated __init__.

    Schedules emit millions of actions; the generated frozen __init__ goes through
    object.__setattr__ once per field and halves the generation rate. Writing the slots through
    their member descriptors builds an identical, equal and equally immutable object.
    """
    setters = tuple(cls.__dict__[name].__set__ for name in cls.__dataclass_fields__)
    new = object.__new__
    if len(setters) == 3:
        s0, s1, s2 = setters

        def make(a, b, c):
            obj = new(cls)
            s0(obj, a)
            s1(obj, b)
            s2(obj, c)
            return obj
    else:
        s0, s1, s2, s3, s4 = setters

        def make(a, b, c, d, e):
            obj = new(cls)
            s0(obj, a)
            s1(obj, b)
            s2(obj, c)
            s3(obj, d)
            s4(obj, e)
            return obj
    return make


# Private fast paths for schedules; users call the classes.
_forward = _fast_constructor(Forward)
_reverse = _fast_constructor(Reverse)
_copy = _fast_constructor(Copy)
_move = _fast_constructor(Move)
END_FORWARD = EndForward()
END_REVERSE = EndReverse()
