"""A rollout recorded on a `Tape`: one operation whose backward is the checkpointed reverse sweep.

The forward half of the schedule runs at once (the final state is returned as new arrays with
gradients); ``tape.backward()`` runs the reverse half, seeded with the final arrays' ``.grad``, and
adds the initial state's adjoint to the initial arrays' ``.grad`` and each parameter's to its own.
A second backward (after ``tape.zero()``) runs the whole schedule again, which needs `schedule` to
be None or a function steps -> schedule.
"""
from __future__ import annotations

import numpy as np

from compiler import array, clone
from compiler.runtime.tape import RecordedOp, caller_location

from ..errors import ModelError
from ..step.state import State, check_initial
from .gradient import start_sweep

__all__ = ["record_rollout"]


def record_rollout(model, tape, initial, steps, *, schedule=None, storage=None, check_finite=False,
                   progress=None) -> State:
    values = check_initial(model.states, initial, model.device)
    saved = {name: v.copy() if isinstance(v, np.ndarray) else clone(v, requires_grad=False)
             for name, v in values.items()}
    reusable = schedule is None or (callable(schedule) and not hasattr(schedule, "__iter__"))

    def new_sweep(first: bool):
        if not first and not reusable:
            raise ModelError("this rollout's schedule was used by the first backward; to differentiate "
                             "it again pass schedule= as a function steps -> schedule (or None)")
        sweep = start_sweep(model, saved, steps, schedule=schedule, storage=storage, deterministic=True,
                            check_finite=check_finite, progress=progress, desc="rollout")
        try:
            live = sweep.forward()
        except BaseException:
            sweep.close()
            raise
        return sweep, live

    sweep, live = new_sweep(True)
    outputs = {name: clone(a, requires_grad=a.dtype.is_float) for name, a in live.items()}
    pending = [sweep]

    def backward():
        current = pending.pop() if pending else new_sweep(False)[0]
        try:
            seeds = {name: out.grad.numpy() for name, out in outputs.items() if out.grad is not None}
            adjoint = current.reverse(seeds=seeds)
        finally:
            current.close()
        for name, value in initial.items():
            if isinstance(value, array) and value.requires_grad and name in adjoint:
                value.grad._add_host(adjoint[name].numpy())

    reads = {f"initial['{n}']": a for n, a in initial.items() if isinstance(a, array)}
    reads.update({f"params.{n}": p for n, p in model.params.items()})
    label = f"rollout of {steps} steps" + (f" of model '{model.name}'" if model.name else "")
    tape.record(RecordedOp(label, reads, {f"final['{n}']": a for n, a in outputs.items()}, {}, backward,
                           caller_location()))
    return State(outputs)
