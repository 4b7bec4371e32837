"""`Model.evaluate`: the loss of a rollout without its gradient, for finite differences, line
searches and Taylor tests. It runs the same steps and the same loss kernels, summed in the same
order, as `Model.gradient`, so its value is the same bits as ``gradient(...).loss``."""
from __future__ import annotations

from checkpoint import EndForward, Forward, StorageType

from compiler.runtime.tape import outside_tapes

from ..errors import ModelError
from ..step.step_context import check_scalar_loss
from .gradient import start_sweep


class ForwardOnly:
    """A schedule that runs every step once, storing nothing: the forward half of a gradient (an
    evaluation, a jvp: nothing is reversed)."""

    def __init__(self, steps: int):
        self.max_n = steps

    def __iter__(self):
        yield Forward(0, self.max_n, False, False, StorageType.NONE)
        yield EndForward()


def evaluate(model, initial, steps, loss=None, *, running_loss=None, deterministic=True,
             check_finite=False, progress=None) -> float:
    """See `Model.evaluate`."""
    if loss is None and running_loss is None:
        raise ModelError("evaluate() needs loss= (a function of the final state) and/or running_loss= "
                         "(a function of each step's s)")
    if steps is None:
        raise ModelError("evaluate() needs steps=")
    with outside_tapes(deterministic):         # never lands on a user's Tape
        sweep = start_sweep(model, initial, steps, schedule=ForwardOnly(steps), running_loss=running_loss,
                            deterministic=deterministic, check_finite=check_finite, progress=progress,
                            desc="evaluate")
        try:
            final = sweep.forward()
            if loss is not None:
                value = check_scalar_loss(loss(final), "loss(state)")
                sweep.terminal_loss = float(value.numpy().reshape(-1)[0])
            return sweep.loss
        finally:
            sweep.close()
