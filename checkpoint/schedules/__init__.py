"""Checkpointing schedules: pure generators of actions, no I/O."""

from .base import Schedule
from .binomial import optimal_steps
from .interop import from_checkpoint_schedules, to_checkpoint_schedules
from .multilevel import MultiLevel
from .online import Online
from .revolve import Revolve
from .store_all import StoreAll

__all__ = ["Schedule", "Revolve", "MultiLevel", "Online", "StoreAll", "optimal_steps",
           "to_checkpoint_schedules", "from_checkpoint_schedules"]
