"""What a checkpoint must match to be resumed: the model's times, shapes, parameter values and kernels.

A checkpointed rollout resumed by a model whose parameters or kernels changed would continue with
a trajectory made by two models (issue 31). So each checkpoint records
- ``dt``, ``t0``, the states' and parameters' shapes and dtypes (`fingerprint`);
- ``param_values``: a SHA-256 of each parameter's dtype, shape and bytes (`fingerprint`);
- ``kernels``: for each kernel the step launches, a SHA-256 of its source and of the ``@func``
  helpers it calls, and ``launches``: a SHA-256 of the step's launch trace (kernels, dims, scalar
  arguments, which state or scratch buffer each array argument is) where the step is traceable
  (`step_fingerprint`). The step's kernels are known once it has run, so they are recorded from
  the first step on and checked after the first resumed step, before anything is written.

`mismatches` lists what differs, for `resume`'s error (or, with ``allow_changes=True``, for the
``changes`` the new checkpoints record).
"""
from __future__ import annotations

import hashlib
import inspect
import json
import textwrap

import numpy as np

from compiler.func import Func
from compiler.runtime.array import array

from .trace import Slot

__all__ = ["fingerprint", "step_fingerprint", "mismatches"]

_SHORT = 16          # hex digits kept of each SHA-256: enough to tell versions apart


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:_SHORT]


def _value_hash(a: array) -> str:
    values = np.ascontiguousarray(a.numpy())
    return _sha(f"{a.dtype}:{list(a.shape)}:".encode() + values.tobytes())


def fingerprint(model) -> dict:
    """The parts known before a step runs: times, shapes and dtypes, parameter values."""
    return {"dt": model.dt, "t0": model.t0,
            "states": {n: [list(s.shape), str(s.dtype)] for n, s in model.states.items()},
            "params": {n: [list(p.shape), str(p.dtype)] for n, p in model.params.items()},
            "param_values": {n: _value_hash(p) for n, p in model.params.items()}}


def _source(fn, seen: set) -> str:
    """`fn`'s source and that of the ``@func`` helpers it names, each once."""
    if fn in seen:
        return ""
    seen.add(fn)
    try:
        text = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        text = getattr(fn, "__qualname__", repr(fn))
    helpers = [fn.__globals__.get(name) for name in getattr(fn.__code__, "co_names", ())]
    return text + "".join(_source(h.fn, seen) for h in helpers if isinstance(h, Func))


def _kernel_name(kernel) -> str:
    return f"{kernel.fn.__module__}.{kernel.fn.__qualname__}"


def _argument(a) -> str:
    if isinstance(a, Slot):
        return f"{a.group}.{a.name}"
    if isinstance(a, array):
        return f"array[{a.dtype}, {list(a.shape)}]"          # parameters: their values are hashed apart
    if isinstance(a, np.ndarray):
        return f"{a.dtype}:{a.tolist()}"
    return repr(a)


def step_fingerprint(trace, tape=None) -> dict:
    """The step's kernels (name -> source hash) and its launch trace's hash, from its StepTrace;
    for a step that is not traceable, its kernels from the `tape` it ran under."""
    if not trace:
        ran = [op.launch[0] for op in getattr(tape, "_ops", ()) if op.launch is not None]
        return {"kernels": {_kernel_name(k): _sha(_source(k.fn, set()).encode()) for k in ran}} if ran else {}
    kernels = {_kernel_name(t.kernel): _sha(_source(t.kernel.fn, set()).encode()) for t in trace.launches}
    launches = [[_kernel_name(t.kernel), list(t.dims), [_argument(a) for a in t.args], t.deterministic]
                for t in trace.launches]
    return {"kernels": kernels, "launches": _sha(json.dumps(launches).encode())}


def mismatches(found: dict, mine: dict) -> list[str]:
    """What of `mine` differs from the checkpoint's `found`, one phrase each (keys absent from the
    checkpoint are not compared: older checkpoints, or a run that stopped before its first step)."""
    out = []
    for key in ("dt", "t0", "states", "params"):
        if key in found and key in mine and _jsonish(found[key]) != _jsonish(mine[key]):
            out.append(f"{key}: the checkpoints were written by a model with {key}={found[key]!r}, "
                       f"this model has {key}={mine[key]!r}")
    for key, what in (("param_values", "the values of parameter"), ("kernels", "the source of kernel")):
        if key not in found or key not in mine:
            continue
        for name in sorted(set(found[key]) | set(mine[key])):
            was, now = found[key].get(name), mine[key].get(name)
            if was != now:
                out.append(f"{what} '{name}' changed (SHA-256 {was or 'absent'} in the checkpoints, "
                           f"{now or 'absent'} now)")
    if "launches" in found and "launches" in mine and found["launches"] != mine["launches"] and not any(
            "kernel" in m for m in out):
        out.append(f"the step's launches changed (dims, scalar arguments or buffers; launch trace SHA-256 "
                   f"{found['launches']} in the checkpoints, {mine['launches']} now)")
    return out


def _jsonish(value):
    return json.loads(json.dumps(value))
