"""`KeptTrajectory`: a rollout's forward trajectory at one point, kept for many reverse sweeps there.

Newton-type methods ask for many products at one point: a Gauss-Newton product J^T H_L J v is a
tangent sweep (w = J v) and a reverse sweep seeded with H_L w, and every reverse sweep at that
point walks back through the same states. A checkpointed gradient recomputes them each time (a
Revolve-20 reverse of 400 steps runs about 1,350 forward steps and plans as many actions); this
keeps them instead, the way hIPPYlib keeps its linearisation: one store-all recording at the
point, then each reverse sweep reverses the kept records without releasing them (``Reverse`` with
``clear_adj_deps=False``), natively where the step is traced (stepper/execute/fast/native_sweep.py).
The memory is store-all's: each step's start state (the part its adjoint reads) for the life of
the object, which `close` (or leaving a ``with`` block) gives back.

Each reverse sweep runs the same adjoints from the same states as a store-all gradient's, so its
result has the same bits as `gradient` with the same seed (tested).
"""
from __future__ import annotations

import numpy as np

from compiler import clone
from checkpoint import EndForward, EndReverse, Forward, Move, Reverse, StorageType

from ..errors import ModelError
from ..execute.executor import Sweep
from ..execute.fast.native_reverse import Kept
from ..execute.snapshots import Tiers, resolve_storage
from ..step.state import State, check_initial
from .progress import progress_bar

__all__ = ["KeptTrajectory"]

_RAM, _WORK = StorageType.RAM, StorageType.WORK


def _record_once(steps: int):
    """The forward actions: the first two steps run once unrecorded (a traced step is trusted to run
    from its trace after two, so every step can then be recorded natively), then all steps are
    recorded from the start."""
    yield Forward(0, min(2, steps), True, False, _RAM)
    yield Move(0, _RAM, _WORK)
    yield Forward(0, steps, False, True, _WORK)
    yield EndForward()


def _reverse_keeping(steps: int):
    """One reverse sweep's actions, its records kept."""
    yield Reverse(steps, 0, False)
    yield EndReverse()


def _host(value) -> np.ndarray:
    return np.array(value.numpy() if hasattr(value, "numpy") else value)


class KeptTrajectory:
    """The trajectory of ``model.rollout(initial, steps)`` at today's parameters (`Model.keep_trajectory`),
    every step's record kept, for any number of reverse sweeps (`gradient`) from a loss of its final
    state; ``final`` is that state (NumPy copies). The parameters must not change while it is used:
    the records are of today's. Raises ModelError where the step cannot be recorded natively (an
    untraced step: its tape can be reversed only once)."""

    def __init__(self, model, initial, steps: int, *, deterministic: bool = True):
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ModelError(f"steps must be an int >= 1, got {steps!r}")
        model._check_ready()
        self.model, self.steps = model, steps
        values = check_initial(model.states, initial, model.device)
        # The point, to check every use against: a record of other values would give a wrong gradient.
        self._initial = {name: _host(v) for name, v in values.items()}
        self._params = {name: p.numpy().copy() for name, p in model.params.items()}
        tiers = Tiers(*resolve_storage(None, False))
        self._sweep = Sweep(model, values, steps, _record_once(steps), tiers,
                            deterministic=deterministic, progress=progress_bar(False, None, ""))
        try:
            final = self._sweep.forward()
            untraced = [n for n, rec in self._sweep.recorded.items() if type(rec) is not Kept]
            if untraced:
                raise ModelError(f"this model's step {untraced[0]} was recorded on a tape, which is reversed once; "
                                 "a kept trajectory needs a traced step (see the warning on why it is not), "
                                 "so use the recomputing products (model.hvp)")
            self.final = State({name: a.numpy().copy() for name, a in final.items()})
        except BaseException:
            self.close()
            raise

    def gradient(self, loss) -> tuple[float, dict]:
        """``(loss value, grads)``: the gradient of `loss` (a function of the final State returning
        a one-element array, as `Model.gradient`'s) with respect to the float initial states and
        the parameters, ``{name: array}`` (copies): `Model.gradient`'s bits, from the kept records."""
        sw = self._sweep
        if sw is None:
            raise ModelError("this KeptTrajectory is closed: keep a new one (Model.keep_trajectory)")
        changed = [name for name, p in self.model.params.items() if not np.array_equal(p.numpy(), self._params[name])]
        if changed:
            raise ModelError(f"parameter '{changed[0]}' changed since this trajectory was kept, so its records are not "
                             "of today's model: keep a new one (Model.keep_trajectory) after changing parameters")
        for p in self.model.params.values():
            p.grad._zero_memory()
        sw.rewind(self.final, _reverse_keeping(self.steps))
        grads = dict(sw.reverse(loss=loss))
        for name, p in self.model.params.items():
            grads[name] = clone(p.grad, requires_grad=False)
        return sw.terminal_loss, grads

    def check_start(self, initial, what: str) -> None:
        """Raise ModelError unless `initial` is the initial state this trajectory was kept from."""
        values = check_initial(self.model.states, initial, self.model.device)
        for name, v in values.items():
            if not np.array_equal(_host(v), self._initial[name]):
                raise ModelError(f"{what}: the initial state '{name}' differs from the one this trajectory was kept "
                                 "from: keep one from this initial state (Model.keep_trajectory)")

    def close(self) -> None:
        """Give back the kept records (idempotent)."""
        if self._sweep is not None:
            sweep, self._sweep = self._sweep, None
            sweep.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
