"""The errors the stepper raises about a user's model, inputs or run (besides the compiler's
`OverwriteError`, raised for refused writes)."""
from __future__ import annotations

__all__ = ["ModelError", "NonFiniteError"]


class ModelError(ValueError):
    """A model, its inputs or a run's options do not fit together: an initial state with the wrong
    names, shapes, dtypes or device; a step that never writes a declared state; a loss that is not a
    scalar; a schedule for another number of steps. Raised before the run when it can be."""


class NonFiniteError(FloatingPointError):
    """With ``check_finite=True``: the state became NaN or infinite. ``step`` is the first step whose
    result was not finite (None: the initial state already was), ``state`` the name of the offending
    state array, ``index`` its first bad element."""

    def __init__(self, message: str, step: int, state: str, index: tuple):
        super().__init__(message)
        self.step, self.state, self.index = step, state, index
