"""Checkpointed rollouts inside PyTorch, and PyTorch code inside steps (``import stepper.torch``;
needs PyTorch).

- ``stepper.torch.function(model, steps, inputs=[...], loss=...)``: a function of tensors, passed by
  keyword by the names in `inputs` (initial states and parameters), returning the loss as a 0-d
  float64 tensor (or, without a loss, the final state as ``{name: tensor}``). It is a
  `torch.autograd.Function`: ``backward()`` puts `Model.gradient`'s gradient (bit for bit) into the
  ``.grad`` of the tensors that require it, ``nn.Module`` parameters included, so `torch.optim`
  optimisers drive it. Tensors are shared with our arrays through DLPack (no copy, CPU or GPU) and
  must be on the model's device.
- ``stepper.torch.call(fn, inputs=[...], outputs=[...])`` inside a step: ``fn`` (tensors in, one
  tensor or a tuple out; an ``nn.Module`` applied through `torch.func.functional_call`, say) computes
  the outputs from the inputs. Recomputations call it again; reversals run `torch.autograd.grad` of
  it from the inputs the recorded step holds. Such a step is not native: it runs through Python
  every time and crosses to PyTorch and back on each call.
"""
from __future__ import annotations

import weakref

import numpy as np

try:
    import torch
except ImportError:                   # pragma: no cover - the message is the point
    raise ImportError("stepper.torch needs PyTorch: pip install 'stepper[torch]' (or pip install torch)") from None

from compiler import array, from_dlpack

from .errors import ModelError
from .runs.interop import RolloutFunction, check_call_arrays, record_call

__all__ = ["function", "call"]

_NUMPY = {torch.float64: np.float64, torch.float32: np.float32, torch.float16: np.float16,
          torch.int64: np.int64, torch.int32: np.int32}


def _share(core: RolloutFunction, name: str, t) -> array:
    """Tensor `t` given for input `name` as a stepper array on the same memory (DLPack), checked."""
    if not isinstance(t, torch.Tensor):
        raise ModelError(f"{core.who}: {name}= must be a torch.Tensor, got {type(t).__name__}")
    dtype = _NUMPY.get(t.dtype)
    if dtype is None:
        want_shape, want_dtype = core.specs[name]
        raise ModelError(f"{core.who}: {name}= must be {want_dtype} of shape {want_shape} (the "
                         f"{core.describe(name)}), got {t.dtype}")
    core.check_value(name, t.shape, dtype)
    device = core.model.device
    if str(t.device) != device and not (device == "cuda:0" and str(t.device) == "cuda"):
        raise ModelError(f"{core.who}: {name}= is on {t.device} but the model runs on '{device}'; move it "
                         f"with .to('{device}')")
    return from_dlpack(t.detach().contiguous(), dtype=core.dtype_of(name))


def _tensor(a: array):
    """A stepper array (ours to give away) as a tensor on the same memory."""
    return torch.from_numpy(a.numpy()) if a.device == "cpu" else torch.from_dlpack(a)


class _Rollout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, core, *tensors):
        values = {n: _share(core, n, t) for n, t in zip(core.inputs, tensors)}
        ctx.core = core
        if core.scalar:
            ctx.grads = None
            if any(ctx.needs_input_grad[1:]):
                value, grads = core.loss_and_grads(values)
                ctx.grads = [_tensor(grads[n]) for n in core.inputs]
            else:
                value = core.loss_value(values)
            return torch.tensor(value, dtype=torch.float64, device=tensors[0].device)
        ctx.save_for_backward(*tensors)
        final = core.final(values)
        return tuple(_tensor(final[n]) for n in core.outputs)

    @staticmethod
    def backward(ctx, *cotangents):
        core = ctx.core
        if core.scalar:
            g = cotangents[0]
            # g is 1.0 under loss.backward(), so the gradient is Model.gradient's bits
            return (None, *((g * d).to(d.dtype) for d in ctx.grads))
        values = {n: _share(core, n, t) for n, t in zip(core.inputs, ctx.saved_tensors)}
        seeds = {n: (c.detach().cpu().numpy() if c is not None else np.zeros(core.output_specs[n][0],
                                                                             core.output_specs[n][1]))
                 for n, c in zip(core.outputs, cotangents) if core.model.states[n].dtype.is_float}
        grads = core.final_vjp(values, seeds)
        return (None, *(_tensor(grads[n]) for n in core.inputs))


def function(model, steps: int, *, inputs, loss=None, running_loss=None, schedule=None, storage=None,
             initial=None):
    """A rollout of `steps` steps of `model` as a differentiable PyTorch function of the tensors named
    in `inputs` (float initial states and parameters), taken by keyword with their own shapes and
    dtypes (vector components last: a ``vec3`` state of shape n is ``(n, 3)``), on the model's device.

    - With `loss` and/or `running_loss` (as `Model.gradient` takes them) it returns the loss as a 0-d
      float64 tensor; when an input requires grad, the forward runs `Model.gradient` with
      `schedule` (a function ``steps -> schedule``, default Revolve) and `storage`, and ``backward``
      hands its gradients over.
    - Without either it returns the final state as ``{name: tensor}``; ``backward`` pulls its
      gradient back with one checkpointed sweep (that runs the forward again).
    - `initial`: values (NumPy or stepper arrays) of the states not in `inputs`, held fixed.

    Parameters in `inputs` replace the model's for each run; the model keeps its own values. Example::

        f = stepper.torch.function(model, 1000, inputs=["u", "kappa"], loss=misfit)
        kappa = torch.nn.Parameter(torch.ones(n, dtype=torch.float64))
        f(u=u0, kappa=kappa).backward()          # kappa.grad
    """
    core = RolloutFunction(model, steps, inputs=inputs, loss=loss, running_loss=running_loss, schedule=schedule,
                           storage=storage, initial=initial, who="stepper.torch.function")

    def rollout_function(**kwargs):
        core.check_names(kwargs)
        out = _Rollout.apply(core, *(kwargs[n] for n in core.inputs))
        return out if core.scalar else dict(zip(core.outputs, out))

    rollout_function.inputs = tuple(core.inputs)
    rollout_function.__doc__ = f"The rollout of {steps} steps as a function of {', '.join(core.inputs)} (by keyword)."
    return rollout_function


# -- PyTorch code inside a step ---------------------------------------------------------------------
def _as_tuple(result):
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


def _result(t):
    if not isinstance(t, torch.Tensor):
        raise ModelError(f"stepper.torch.call: the function returned a {type(t).__name__}; return tensors")
    t = t.detach()
    return t.numpy() if t.device.type == "cpu" else from_dlpack(t.contiguous())


def call(fn, inputs, outputs) -> None:
    """Inside a step: ``outputs = fn(*inputs)`` computed by PyTorch. `fn` takes one tensor per input
    (sharing the input's memory; vector components last) and returns one tensor, or a tuple with one
    per output, of the outputs' shapes and dtypes. `inputs`: stepper arrays (``s.prev.u``,
    ``s.params.w``, a scratch buffer); `outputs`: new arrays of the step (``s.scratch(...)``,
    ``s.next.<state>``). Differentiable on the step's tape through `torch.autograd.grad` of `fn`; a
    function whose outputs do not depend differentiably on its inputs is refused, naming it. Example::

        @model.step
        def step(s):
            f = s.scratch("forcing", n, stepper.float64)
            stepper.torch.call(net, inputs=[s.prev.u, s.params.w1, s.params.w2], outputs=[f])
            stepper.launch(advance, n, inputs=[s.prev.u, f, s.dt], outputs=[s.next.u])
    """
    if not callable(fn):
        raise ModelError(f"stepper.torch.call(fn, ...): fn must be a function of tensors, got {type(fn).__name__}")
    ins, outs = check_call_arrays("stepper.torch.call", inputs, outputs)
    name = f"stepper.torch.call({getattr(fn, '__name__', type(fn).__name__)})"

    def forward(arrays):
        with torch.no_grad():
            return [_result(t) for t in _as_tuple(fn(*map(_tensor, arrays)))]

    def vjp(arrays, cotangents, wanted):
        # From the inputs the recorded step holds: PyTorch's graph is built again, used once, dropped.
        tensors = [_tensor(a) for a in arrays]
        leaves = [tensors[i].detach().requires_grad_(True) for i in wanted]
        for i, leaf in zip(wanted, leaves):
            tensors[i] = leaf
        with torch.enable_grad():
            results = _as_tuple(fn(*tensors))
            _check_differentiable(name, "", results)
            grads = torch.autograd.grad(results, leaves, [_tensor(c) for c in cotangents], allow_unused=True)
        return [np.zeros(a.shape, a.dtype.np_dtype) if g is None else _result(g)
                for a, g in zip((arrays[i] for i in wanted), grads)]

    def check(where):
        # Does any output carry a graph back to the inputs? Asked once per function and shapes.
        key = tuple((a.shape, a.dtype) for a in (*ins, *outs))
        try:
            seen = _checked.setdefault(fn, set())
        except TypeError:            # not weak-referenceable: ask every time
            seen = set()
        if key in seen:
            return
        tensors = [_tensor(a).detach().requires_grad_(a.dtype.is_float) for a in ins]
        with torch.enable_grad():
            _check_differentiable(name, where, _as_tuple(fn(*tensors)))
        seen.add(key)

    record_call(name, ins, outs, forward, vjp, check)


_checked: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _check_differentiable(name: str, where: str, results) -> None:
    if not any(isinstance(t, torch.Tensor) and t.requires_grad for t in results):
        at = f" ({where})" if where else ""
        raise ModelError(f"{name}{at}: PyTorch cannot differentiate it: none of its outputs depends on its inputs "
                         f"through differentiable operations (detach(), .numpy(), integer ops or torch.no_grad() "
                         f"inside it cut the graph). Make it differentiable, or call it only where no gradient "
                         f"is taken")
