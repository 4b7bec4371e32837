"""Why a step stopped being traceable, said once per model.

A step that cannot be replayed from its trace (stepper/step/trace.py) still runs correctly, through its
Python step function every time, but slower. Users should know, and know why: this module looks
at the step's tape (and the first step's trace) and names the first thing that stops replays."""
from __future__ import annotations

import warnings

from compiler import array

from .trace import Slot, _same_argument

__all__ = ["UntraceableStepWarning", "warn_untraceable"]


class UntraceableStepWarning(UserWarning):
    """A model's step runs through its Python function every time (no trace replays)."""


def warn_untraceable(model, n: int, tape, first, prev, nxt, scratch, series=None) -> None:
    """Warn, once per model, why step `n` (run under `tape`) cannot be replayed; `first` is the
    trace every earlier step made, or None when this is the first step."""
    if model.__dict__.get("_untraceable_warned"):
        return
    model._untraceable_warned = True
    reason = _first_reason(tape, prev, nxt, scratch) if first is None else \
        _difference(first, n, tape, {"prev": prev, "next": nxt, "scratch": scratch, "series": series or {}})
    warnings.warn(f"the step function of {model.name or 'the model'} cannot be replayed from its trace, so every "
                  f"step runs through Python (correct, but slower): {reason}",
                  UntraceableStepWarning, stacklevel=2)


def _first_reason(tape, prev, nxt, scratch) -> str:
    if tape.writes_checked != len(tape._ops):
        return "it writes an array without a kernel launch (a partial copy, assign or fill_); write it in a kernel"
    writable = {id(a) for a in (*nxt.values(), *scratch.values())}
    own = {id(a._storage) for group in (prev, nxt, scratch) for a in group.values()}
    mine = {id(a) for group in (prev, nxt, scratch) for a in group.values()}
    for op in tape._ops:
        where = f" ({op.where})" if op.where else ""
        if op.launch is None:
            return f"{op.name}{where} is not a kernel launch"
        kernel, dims, args, device, debug, deterministic = op.launch
        if debug:
            return f"{op.name}{where} is a debug launch"
        if device != "cpu":
            return f"{op.name}{where} runs on '{device}'"
        if any(id(a) not in writable for a in (*op.writes.values(), *op.accumulates.values())):
            return f"{op.name}{where} writes an array that is not s.next or s.scratch(...)"
        if any(isinstance(a, array) and id(a) not in mine and id(a._storage) in own for a in args):
            return f"{op.name}{where} passes a view of one of the step's buffers"
    return "its running loss is not an s.scratch(...) buffer"


def _difference(first, n, tape, groups) -> str:
    ops = tape._ops
    if tape.writes_checked != len(ops):
        return f"step {n} writes an array without a kernel launch (a partial copy, assign or fill_)"
    for k, (op, traced) in enumerate(zip(ops, first.launches)):
        if op.launch is None:
            return f"step {n} makes {op.name} ({op.where}), which is not a kernel launch"
        kernel, dims, args, *_ = op.launch
        if kernel is not traced.kernel or tuple(dims) != traced.dims:
            return (f"step {n} launches kernel '{kernel.__name__}' ({op.where}) where the earlier steps launched "
                    f"'{traced.kernel.__name__}' with dims {traced.dims}: the step function branches on the step "
                    f"(s.n or s.t)")
        params = [p.name for p in kernel.params]
        for j, (a, t) in enumerate(zip(args, traced.args)):
            same = groups[t.group].get(t.name) is a if type(t) is Slot else _same_argument(a, t)
            if not same:
                name = params[j] if j < len(params) else f"#{j}"
                shown = "a different array" if isinstance(a, array) else f"{a!r} (earlier steps: {t!r})"
                return (f"step {n} passes {shown} as argument '{name}' of kernel '{kernel.__name__}' ({op.where}): "
                        f"a value that changes with the step, such as s.t or s.n; to read per-step data, "
                        f"declare it with model.series(name, values) and pass s.series.<name>")
    if len(ops) != len(first.launches):
        return (f"step {n} makes {len(ops)} launches where the earlier steps made {len(first.launches)}: the step "
                f"function branches on the step (s.n or s.t)")
    return f"step {n} takes different s.scratch(...) buffers or running loss than the earlier steps"
