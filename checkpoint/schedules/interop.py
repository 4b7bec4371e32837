"""Converters between our actions and checkpoint_schedules' actions, so either side can drive the
other. checkpoint_schedules is imported when a converter is called: it is an optional peer, and
nothing else in `checkpoint` needs it."""

from __future__ import annotations

from ..actions import Action, Copy, EndForward, EndReverse, Forward, Move, Reverse, StorageType

__all__ = ["to_checkpoint_schedules", "from_checkpoint_schedules"]


def _peer():
    try:
        import checkpoint_schedules
    except ImportError as exc:
        raise ImportError(
            "converting actions needs the checkpoint_schedules package (pip install "
            "checkpoint-schedules); our own schedules and validator work without it") from exc
    return checkpoint_schedules


def to_checkpoint_schedules(action: Action):
    """The checkpoint_schedules action with the same meaning as `action`."""
    cs = _peer()
    if isinstance(action, Forward):
        return cs.Forward(action.n0, action.n1, action.write_ics, action.write_adj_deps,
                          cs.StorageType[action.storage.name])
    if isinstance(action, Reverse):
        return cs.Reverse(action.n1, action.n0, action.clear_adj_deps)
    if isinstance(action, (Copy, Move)):
        cls = cs.Copy if isinstance(action, Copy) else cs.Move
        return cls(action.n, cs.StorageType[action.from_storage.name],
                   cs.StorageType[action.to_storage.name])
    if isinstance(action, EndForward):
        return cs.EndForward()
    if isinstance(action, EndReverse):
        return cs.EndReverse()
    raise TypeError(f"expected one of our actions (Forward, Reverse, Copy, Move, EndForward, "
                    f"EndReverse), got {action!r}")


def from_checkpoint_schedules(action) -> Action:
    """Our action with the same meaning as the checkpoint_schedules action `action`."""
    cs = _peer()
    if isinstance(action, cs.Forward):
        return Forward(action.n0, action.n1, bool(action.write_ics), bool(action.write_adj_deps),
                       StorageType[action.storage.name])
    if isinstance(action, cs.Reverse):
        return Reverse(action.n1, action.n0, bool(action.clear_adj_deps))
    if isinstance(action, (cs.Copy, cs.Move)):
        cls = Copy if isinstance(action, cs.Copy) else Move
        return cls(action.n, StorageType[action.from_storage.name],
                   StorageType[action.to_storage.name])
    if isinstance(action, cs.EndForward):
        return EndForward()
    if isinstance(action, cs.EndReverse):
        return EndReverse()
    raise TypeError(f"expected a checkpoint_schedules action (Forward, Reverse, Copy, Move, "
                    f"EndForward, EndReverse), got {action!r}")
