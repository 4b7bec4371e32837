"""Checkpointed rollouts inside JAX, and JAX code inside steps (``import stepper.jax``; needs JAX).

- ``stepper.jax.function(model, steps, inputs=[...], loss=...)``: a function of JAX arrays, passed by
  keyword by the names in `inputs` (initial states and parameters), returning the loss as a JAX
  scalar (or, without a loss, the final state as ``{name: array}``). `jax.grad`/`jax.vjp` go
  through our checkpointed reverse sweep (`jax.custom_vjp`), so the gradient is `Model.gradient`'s,
  bit for bit. It works under `jax.jit`: each run is a host callback (`jax.pure_callback`); on a GPU
  that callback copies the inputs to the host and the results back (XLA's FFI would hand over
  device buffers without copies: not done yet). `jax.vmap` is supported sequentially: one rollout per
  batch member (``vmap_method="sequential"``).
- ``stepper.jax.call(fn, inputs=[...], outputs=[...])`` inside a step: ``fn`` (JAX arrays in, one
  array or a tuple out) computes the outputs from the inputs, e.g. a small network's forcing term
  from ``s.prev.u`` and weights held as model parameters. Recomputations call it again; reversals
  call `jax.vjp` of it (jitted, once traced per shape), and its gradients flow into the weights'.
  Such a step is not native: it runs through Python every time, and each call crosses from our
  arrays to JAX's and back (tens of microseconds on a CPU, see the README).

float64 models need JAX's 64-bit mode: ``jax.config.update("jax_enable_x64", True)`` before use.
"""
from __future__ import annotations

import weakref

import numpy as np

try:
    import jax
    import jax.numpy as jnp
except ImportError:                   # pragma: no cover - the message is the point
    raise ImportError("stepper.jax needs JAX: pip install 'stepper[jax]' (or pip install jax)") from None

from .errors import ModelError
from .runs.interop import RolloutFunction, check_call_arrays, record_call

__all__ = ["function", "call"]


def _check_x64(who: str, dtypes) -> None:
    if any(np.dtype(d) == np.float64 for d in dtypes) and not jax.config.read("jax_enable_x64"):
        raise ModelError(f"{who}: the model holds float64 arrays but JAX runs in 32-bit mode, where float64 "
                         f"inputs would silently become float32; call jax.config.update('jax_enable_x64', True) "
                         f"first")


def function(model, steps: int, *, inputs, loss=None, running_loss=None, schedule=None, storage=None,
             initial=None):
    """A rollout of `steps` steps of `model` as a differentiable JAX function of the arrays named in
    `inputs` (float initial states and parameters), taken by keyword with their own shapes and
    dtypes (vector components last: a ``vec3`` state of shape n is ``(n, 3)``).

    - With `loss` and/or `running_loss` (as `Model.gradient` takes them) it returns the loss as a
      JAX scalar (float64 in 64-bit mode); `jax.grad` runs `Model.gradient` with `schedule` (a
      function ``steps -> schedule``, default Revolve) and `storage`.
    - Without either it returns the final state as ``{name: array}``; `jax.vjp` pulls cotangents of
      it back with one checkpointed sweep (that runs the forward again: the primal run keeps nothing).
    - `initial`: values (NumPy or stepper arrays) of the states not in `inputs`, held fixed.

    Parameters in `inputs` replace the model's for each run; the model keeps its own values. Example::

        f = stepper.jax.function(model, 1000, inputs=["u", "kappa"], loss=misfit)
        value, grads = jax.value_and_grad(lambda u, k: f(u=u, kappa=k), argnums=(0, 1))(u0, k0)
    """
    core = RolloutFunction(model, steps, inputs=inputs, loss=loss, running_loss=running_loss, schedule=schedule,
                           storage=storage, initial=initial, who="stepper.jax.function")
    _check_x64(core.who, [d for _, d in (*core.specs.values(), *core.output_specs.values())])
    names = core.inputs
    in_specs = tuple(jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in core.specs.values())

    def values_of(args) -> dict:
        return {n: np.asarray(a) for n, a in zip(names, args)}

    if core.scalar:
        loss_dtype = np.float64 if jax.config.read("jax_enable_x64") else np.float32
        loss_spec = jax.ShapeDtypeStruct((), loss_dtype)

        def value_host(*args):
            return np.asarray(core.loss_value(values_of(args)), loss_dtype)

        def grad_host(*args):
            value, grads = core.loss_and_grads(values_of(args))
            return np.asarray(value, loss_dtype), tuple(grads[n].numpy() for n in names)

        @jax.custom_vjp
        def run(*args):
            return jax.pure_callback(value_host, loss_spec, *args, vmap_method="sequential")

        def run_fwd(*args):
            value, grads = jax.pure_callback(grad_host, (loss_spec, in_specs), *args, vmap_method="sequential")
            return value, grads

        def run_bwd(grads, g):
            # g is 1.0 under jax.grad, so the gradient is Model.gradient's bits
            return tuple((g * d).astype(d.dtype) for d in grads)
    else:
        floats = [n for n in core.outputs if model.states[n].dtype.is_float]
        out_specs = {n: jax.ShapeDtypeStruct(*core.output_specs[n]) for n in core.outputs}

        def final_host(*args):
            return {n: a.numpy() for n, a in core.final(values_of(args)).items()}

        def vjp_host(*args):
            values = values_of(args[:len(names)])
            grads = core.final_vjp(values, dict(zip(floats, map(np.asarray, args[len(names):]))))
            return tuple(grads[n].numpy() for n in names)

        @jax.custom_vjp
        def run(*args):
            return jax.pure_callback(final_host, out_specs, *args, vmap_method="sequential")

        def run_fwd(*args):
            return run(*args), args

        def run_bwd(args, cotangents):
            return jax.pure_callback(vjp_host, in_specs, *args, *(cotangents[n] for n in floats),
                                     vmap_method="sequential")

    run.defvjp(run_fwd, run_bwd)

    def rollout_function(**kwargs):
        core.check_names(kwargs)
        args = []
        for n in names:
            value = kwargs[n]
            if not (hasattr(value, "shape") and hasattr(value, "dtype")):
                raise ModelError(f"{core.who}: {n}= must be a JAX (or NumPy) array, got {type(value).__name__}")
            core.check_value(n, value.shape, value.dtype)
            args.append(value)
        return run(*args)

    rollout_function.inputs = tuple(names)
    rollout_function.__doc__ = f"The rollout of {steps} steps as a function of {', '.join(names)} (by keyword)."
    return rollout_function


# -- JAX code inside a step -----------------------------------------------------------------------
class _Compiled:
    """`fn` jitted, and its VJP jitted (with respect to the float inputs), traced once per shape."""

    def __init__(self, fn):
        self.fn = fn
        self.forward = jax.jit(lambda *args: _as_tuple(fn(*args)))
        self.vjp = jax.jit(self._vjp)
        self.checked = set()

    def _vjp(self, primals, cotangents):
        floats = [i for i, p in enumerate(primals) if jnp.issubdtype(p.dtype, jnp.floating)]

        def of_floats(*values):
            args = list(primals)
            for i, v in zip(floats, values):
                args[i] = v
            return _as_tuple(self.fn(*args))

        _, pull = jax.vjp(of_floats, *(primals[i] for i in floats))
        grads = dict(zip(floats, pull(tuple(cotangents))))
        return tuple(grads.get(i, jnp.zeros(())) for i in range(len(primals)))

    def check(self, name: str, where: str, inputs, outputs) -> None:
        """Trace the VJP for these shapes once; JAX's refusal becomes an error naming the function."""
        key = tuple((a.shape, a.dtype) for a in (*inputs, *outputs))
        if key in self.checked:
            return
        primals = tuple(jax.ShapeDtypeStruct(a.shape + a.dtype.inner_shape, a.dtype.np_dtype) for a in inputs)
        cotangents = tuple(jax.ShapeDtypeStruct(o.shape + o.dtype.inner_shape, o.dtype.np_dtype) for o in outputs)
        try:
            results = jax.eval_shape(lambda *a: _as_tuple(self.fn(*a)), *primals)
        except Exception:
            return                   # the function itself fails: running it shows the user that error
        if [(r.shape, r.dtype) for r in results] != [(c.shape, c.dtype) for c in cotangents]:
            return                   # results that do not fit the outputs: the forward's check names them
        try:
            jax.eval_shape(self._vjp, primals, cotangents)
        except Exception as exc:     # JAX's own error types vary; the message is what the user needs
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ModelError(f"{name} ({where}): JAX cannot differentiate {getattr(self.fn, '__qualname__', self.fn)!s}"
                             f" ({type(exc).__name__}: {first}). Make it differentiable (e.g. give it a "
                             f"jax.custom_vjp), or call it only where no gradient is taken") from exc
        self.checked.add(key)


def _as_tuple(result):
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


_compiled: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _compile(fn) -> _Compiled:
    try:
        found = _compiled.get(fn)
    except TypeError:                # not weak-referenceable: compile per call
        return _Compiled(fn)
    if found is None:
        found = _compiled[fn] = _Compiled(fn)
    return found


def _jax_device(device: str):
    """The JAX device for a stepper device name: JAX's CPU for "cpu", its n-th GPU for "cuda:n" (JAX's
    first device where it has no GPU, e.g. under the CUDA simulator)."""
    if device == "cpu":
        return jax.devices("cpu")[0]
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:         # no GPU backend in this JAX
        return jax.devices()[0]
    ordinal = int(device.partition(":")[2] or 0)
    return gpus[ordinal] if ordinal < len(gpus) else jax.devices()[0]


def call(fn, inputs, outputs) -> None:
    """Inside a step: ``outputs = fn(*inputs)`` computed by JAX. `fn` takes one JAX array per input
    (vector components last) and returns one array, or a tuple with one per output, of the outputs'
    shapes and dtypes. `inputs`: stepper arrays (``s.prev.u``, ``s.params.w``, a scratch buffer);
    `outputs`: new arrays of the step (``s.scratch(...)``, ``s.next.<state>``). Differentiable on
    the step's tape through `jax.vjp` of `fn`; a function JAX cannot differentiate is refused when
    the first gradient is recorded, naming it. Example::

        @model.step
        def step(s):
            f = s.scratch("forcing", n, stepper.float64)
            stepper.jax.call(net, inputs=[s.prev.u, s.params.w1, s.params.w2], outputs=[f])
            stepper.launch(advance, n, inputs=[s.prev.u, f, s.dt], outputs=[s.next.u])
    """
    if not callable(fn):
        raise ModelError(f"stepper.jax.call(fn, ...): fn must be a function of JAX arrays, got {type(fn).__name__}")
    ins, outs = check_call_arrays("stepper.jax.call", inputs, outputs)
    _check_x64("stepper.jax.call", [a.dtype.np_dtype for a in (*ins, *outs)])
    compiled = _compile(fn)
    name = f"stepper.jax.call({getattr(fn, '__name__', 'fn')})"

    # Through the host: the arguments go to the JAX device matching the model's (one copy in), the
    # results come back to NumPy. Never JAX's default device: that is the GPU on a GPU machine even
    # for a CPU model, and XLA's CPU and GPU arithmetic differ in the last bits, so a run inside
    # `stepper.jax.function`'s callback and a run outside it gave different bits on an H100.
    def on_device(values):
        where = _jax_device(ins[0].device if ins else outs[0].device)
        return tuple(jax.device_put(v, where) for v in values)

    def forward(arrays):
        return [np.asarray(r) for r in compiled.forward(*on_device(a.numpy() for a in arrays))]

    def vjp(arrays, cotangents, wanted):
        grads = compiled.vjp(on_device(a.numpy() for a in arrays), on_device(c.numpy() for c in cotangents))
        return [np.asarray(grads[i]) for i in wanted]

    record_call(name, ins, outs, forward, vjp, lambda where: compiled.check(name, where, ins, outs))
