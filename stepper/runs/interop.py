"""What `stepper.jax` and `stepper.torch` share: a rollout as a function of named arrays, and a step
operation that runs another framework's code on a step's arrays.

- `RolloutFunction`: the checks and runs behind ``stepper.jax.function`` / ``stepper.torch.function``.
  Values come in by the names in `inputs` (initial states and parameters) as NumPy arrays or
  stepper arrays; the loss and its gradient come from `Model.evaluate` / `Model.gradient` (the same
  bits), the final state and its vector-Jacobian product from one checkpointed sweep seeded with
  the cotangents. Parameters given as inputs replace the model's values for the run and are put
  back afterwards, so the functions leave the model as they found it.
- `record_call`: one operation of a step, ``outputs = forward(inputs)`` computed by JAX or PyTorch,
  recorded on the step's Tape with a backward that asks the framework for its vector-Jacobian
  product. Recomputations run the forward again; reversals run the framework's VJP from the
  inputs the recorded step holds (nothing of the framework's is kept between forward and backward).
"""
from __future__ import annotations

import threading
from contextlib import contextmanager

import numpy as np

from compiler import array, clone, zeros_like
from compiler.runtime.tape import RecordedOp, active_tape, caller_location, outside_tapes, settle_for_host

from ..errors import ModelError
from ..step.state import check_initial, write_values
from .evaluate import ForwardOnly
from .gradient import start_sweep

__all__ = ["RolloutFunction", "record_call", "check_call_arrays"]

# Runs that set a model's parameters from a function's inputs must not interleave (a framework may
# call back from several threads).
_RUNS = threading.RLock()


class RolloutFunction:
    """A model, a number of steps and a loss, as a function of the arrays named in `inputs`.

    `who` names the public function in messages (``"stepper.jax.function"``). `initial`: values of
    the states not named in `inputs` (fixed, not differentiated)."""

    def __init__(self, model, steps, *, inputs, loss, running_loss, schedule, storage, initial, who):
        self.who = who
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ModelError(f"{who}(model, steps): steps must be an int >= 1, got {steps!r}")
        if schedule is not None and not (callable(schedule) and not hasattr(schedule, "__iter__")):
            raise ModelError(f"{who}(schedule=...): every call runs a schedule and a schedule runs once; pass a "
                             f"function steps -> schedule, e.g. lambda n: stepper.Revolve(n, 20)")
        model._check_ready()
        if not isinstance(inputs, (list, tuple)) or not all(isinstance(n, str) for n in inputs):
            raise ModelError(f"{who}(inputs=...): expected a list of names, got {inputs!r}")
        inputs = list(inputs)
        if not inputs:
            raise ModelError(f"{who}(inputs=[]): name at least one initial state or parameter")
        known = [*model.states, *model.params]
        for name in inputs:
            if name not in known:
                raise ModelError(f"{who}: '{name}' in inputs is neither a state nor a parameter of the model "
                                 f"(it has {', '.join(map(repr, known))})")
            if name in model.states and not model.states[name].dtype.is_float:
                raise ModelError(f"{who}: state '{name}' holds {model.states[name].dtype} values, which have no "
                                 f"gradient; give its initial value in initial= instead of inputs")
        if len(set(inputs)) != len(inputs):
            raise ModelError(f"{who}(inputs={inputs}): a name appears twice")
        initial = dict(initial or {})
        for name in initial:
            if name not in model.states or name in inputs:
                raise ModelError(f"{who}(initial=...): '{name}' is " + (
                    "also in inputs; give it in one place" if name in inputs else "not a state of the model"))
        missing = [n for n in model.states if n not in inputs and n not in initial]
        if missing:
            raise ModelError(f"{who}: the initial value of state(s) {', '.join(map(repr, missing))} is missing; "
                             f"name them in inputs= (differentiable) or give them in initial= (fixed)")
        # Fixed states are checked (and copied: later changes to the caller's arrays do not leak in) now
        initial = {n: v if isinstance(v, array) else np.array(v) for n, v in initial.items()}
        initial = {n: clone(v, requires_grad=False) if isinstance(v, array) else v.copy() for n, v in
                   check_initial({n: model.states[n] for n in initial}, initial, model.device,
                                 f"{who}(initial=...)").items()}
        self.model, self.steps, self.inputs, self.fixed = model, steps, inputs, initial
        self.loss, self.running_loss = loss, running_loss
        self.schedule, self.storage = schedule, storage
        self.scalar = loss is not None or running_loss is not None
        # (shape, NumPy dtype) of each input as the framework holds it, vector components last
        self.specs = {n: self._spec(n) for n in inputs}
        self.outputs = list(model.states)
        self.output_specs = {n: (s.shape + s.dtype.inner_shape, np.dtype(s.dtype.np_dtype))
                             for n, s in model.states.items()}

    def _spec(self, name):
        if name in self.model.params:
            p = self.model.params[name]
            return p.shape + p.dtype.inner_shape, np.dtype(p.dtype.np_dtype)
        s = self.model.states[name]
        return s.shape + s.dtype.inner_shape, np.dtype(s.dtype.np_dtype)

    def dtype_of(self, name):
        return self.model.params[name].dtype if name in self.model.params else self.model.states[name].dtype

    def describe(self, name) -> str:
        shape, dtype = self.specs[name]
        kind = "parameter" if name in self.model.params else "initial state"
        return f"{kind} '{name}' (shape {shape}, {dtype})"

    def check_names(self, given) -> None:
        """`given`: the keyword names of a call; raises naming what is missing or unknown."""
        missing = [n for n in self.inputs if n not in given]
        extra = [n for n in given if n not in self.inputs]
        if missing or extra:
            parts = [f"missing {', '.join(map(repr, missing))}"] if missing else []
            if extra:
                parts.append(f"{', '.join(map(repr, extra))} not in inputs")
            raise ModelError(f"{self.who}: {'; '.join(parts)} (the function takes {', '.join(self.inputs)} by "
                             f"keyword; other states go in initial=, other parameters keep the model's values)")

    def check_value(self, name, shape, dtype) -> None:
        """Raise naming `name` if an array of `shape` and `dtype` (NumPy) does not fit its spec."""
        want_shape, want_dtype = self.specs[name]
        if tuple(shape) != want_shape or np.dtype(dtype) != want_dtype:
            raise ModelError(f"{self.who}: {name}= must be {want_dtype} of shape {want_shape} (the "
                             f"{self.describe(name)}), got {np.dtype(dtype)} of shape {tuple(shape)}")

    # -- runs; `values`: {name: NumPy array or stepper array on the model's device} ------------------
    @contextmanager
    def _bound(self, values):
        """The initial state to run from, with the model's parameters set to `values`' for the run."""
        model = self.model
        with _RUNS:
            saved = {}
            try:
                for name in self.inputs:
                    if name in model.params:
                        p = model.params[name]
                        saved[name] = clone(p, requires_grad=False)
                        _assign(p, values[name])      # a change a Tape that read it must see
                initial = dict(self.fixed)
                initial.update({n: values[n] for n in self.inputs if n in model.states})
                with outside_tapes(True):            # our runs never land on a user's Tape
                    yield initial
            finally:
                for name, old in saved.items():
                    _assign(model.params[name], old)

    def loss_value(self, values) -> float:
        with self._bound(values) as initial:
            return self.model.evaluate(initial, self.steps, self.loss, running_loss=self.running_loss,
                                       progress=False)

    def loss_and_grads(self, values) -> tuple[float, dict]:
        """The loss and ``{name: array}`` for every input, from `Model.gradient`."""
        with self._bound(values) as initial:
            result = self.model.gradient(initial, self.steps, self.loss, self.schedule, self.storage,
                                         running_loss=self.running_loss, progress=False)
            return result.loss, {n: result.grads[n] for n in self.inputs}

    def final(self, values) -> dict:
        """The final state, ``{name: array}`` (new arrays)."""
        with self._bound(values) as initial:
            sweep = start_sweep(self.model, initial, self.steps, schedule=ForwardOnly(self.steps),
                                deterministic=True, progress=False, desc="rollout")
            try:
                return {n: clone(a, requires_grad=False) for n, a in sweep.forward().items()}
            finally:
                sweep.close()

    def final_vjp(self, values, cotangents) -> dict:
        """``{name: array}`` for every input: the cotangents of the final state (``{state: NumPy}``)
        pulled back through the rollout by one checkpointed sweep."""
        with self._bound(values) as initial:
            model = self.model
            sweep = start_sweep(model, initial, self.steps, schedule=self.schedule, storage=self.storage,
                                deterministic=True, progress=False, desc="gradient")
            for p in model.params.values():
                p.grad._zero_memory()
            try:
                sweep.forward()
                adjoint = sweep.reverse(seeds={n: np.asarray(c) for n, c in cotangents.items()
                                               if model.states[n].dtype.is_float})
                return {n: clone(model.params[n].grad, requires_grad=False) if n in model.params else adjoint[n]
                        for n in self.inputs}
            finally:
                sweep.close()


def _assign(p: array, value) -> None:
    """Set parameter `p` to `value` (NumPy, or a stepper array on any device) as a write a Tape sees."""
    if isinstance(value, array) and (value.device == "cpu" or value.device != p.device):
        value = value.numpy()
    write_values(p, value)
    p._storage.version += 1


# -- a step that calls another framework ------------------------------------------------------------
def check_call_arrays(who: str, inputs, outputs) -> tuple[list, list]:
    """`inputs` and `outputs` as lists of stepper arrays, or a ModelError naming the one at fault."""
    lists = []
    for what, arrays in (("inputs", inputs), ("outputs", outputs)):
        if isinstance(arrays, array):
            arrays = [arrays]
        if not isinstance(arrays, (list, tuple)):
            raise ModelError(f"{who}({what}=...): expected a list of stepper arrays, got {type(arrays).__name__}")
        for i, a in enumerate(arrays):
            if not isinstance(a, array):
                raise ModelError(f"{who}: {what}[{i}] is a {type(a).__name__}; pass stepper arrays (s.prev.u, "
                                 f"s.params.w, s.scratch(...)): the step's data lives in them")
        lists.append(list(arrays))
    ins, outs = lists
    if not outs:
        raise ModelError(f"{who}(outputs=[]): name the arrays (s.next.<state> or s.scratch(...)) the result goes to")
    for j, o in enumerate(outs):
        if not o.dtype.is_float:
            raise ModelError(f"{who}: outputs[{j}] holds {o.dtype} values; a differentiable call writes float arrays")
        if any(o._storage is a._storage for a in ins):
            raise ModelError(f"{who}: outputs[{j}] is also an input; write the result into a new array "
                             f"(s.scratch(...) or s.next.<state>)")
    return ins, outs


def record_call(name: str, inputs: list, outputs: list, forward, vjp, check=None) -> None:
    """Run ``forward(inputs) -> [value of each output]`` and write the outputs; on a recording Tape
    whose inputs carry gradients, record it with a backward that adds
    ``vjp(inputs, [cotangent of each output], wanted) -> [cotangent of inputs[i] for i in wanted]``
    to the inputs' gradients (`wanted`: the float inputs that have one). The framework's functions
    get stepper arrays and return NumPy arrays or stepper arrays sharing the framework's memory
    (DLPack, for GPU results). `check(where)` runs before a recording (a differentiability check
    that raises naming the user's function and line)."""
    settle_for_host()                   # the data leaves for another library (see stepper/step/trace.py)
    tape = active_tape()
    where = caller_location()
    op = RecordedOp(name, {f"inputs[{i}]": a for i, a in enumerate(inputs)},
                    {f"outputs[{j}]": o for j, o in enumerate(outputs)}, {}, lambda: None, where)
    differentiable = any(a.requires_grad for a in inputs) and any(o.requires_grad for o in outputs)
    if tape is not None and differentiable:
        if check is not None:
            check(where)

        def backward():
            if all(o.grad is None for o in outputs):
                return
            wanted = [i for i, a in enumerate(inputs) if a.grad is not None and a.dtype.is_float]
            if not wanted:
                return
            cotangents = [o.grad if o.grad is not None else zeros_like(o, requires_grad=False) for o in outputs]
            for i, g in zip(wanted, vjp(inputs, cotangents, wanted)):
                inputs[i].grad._add_host(g.numpy() if isinstance(g, array) else np.asarray(g))

        op.backward = backward
    if tape is not None:
        # Recorded even when nothing needs its gradient, so that messages about the step (why it
        # cannot be traced, overwrites) name this call; before writing, so a refused overwrite
        # leaves the data untouched.
        tape.record(op)
    results = list(forward(inputs))
    if len(results) != len(outputs):
        raise ModelError(f"{name} ({where}) returned {len(results)} array(s) for {len(outputs)} output(s); return "
                         f"one array per output, in order")
    for j, (o, value) in enumerate(zip(outputs, results)):
        want = o.shape + o.dtype.inner_shape
        shape, dtype = (value.shape, np.dtype(value.dtype.np_dtype)) if isinstance(value, array) else \
            (np.shape(value), np.asarray(value).dtype)
        if shape != want or dtype != np.dtype(o.dtype.np_dtype):
            raise ModelError(f"{name} ({where}) returned {dtype} of shape {shape} for outputs[{j}], which is "
                             f"{np.dtype(o.dtype.np_dtype)} of shape {want}")
        if isinstance(value, array) and value.device == o.device and o.device != "cpu":
            write_values(o, value)      # device to device
        else:
            o._write_host(value.numpy() if isinstance(value, array) else value)
        o._mark_written()
