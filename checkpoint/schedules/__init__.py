"""Checkpointing schedules: pure generators of actions, no I/O."""

from .base import Schedule
from .binomial import optimal_steps
from .interop import from_checkpoint_schedules, to_checkpoint_schedules
from .revolve import Revolve

__all__ = ["Schedule", "Revolve", "optimal_steps", "to_checkpoint_schedules",
           "from_checkpoint_schedules"]
