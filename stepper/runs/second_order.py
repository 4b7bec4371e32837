"""Forward mode and second order through rollouts: `Model.jvp` and `Model.hvp`.

Both run the *tangent model*: the model's states and parameters side by side with their tangents
(``x`` and ``x_dot``), whose step runs the user's step function inside a `Tangents` context, so
every launch runs its tangent kernel (compiler/passes/tangent.py) and carries the tangent beside
the state. It is an ordinary Model, so everything a model gets, it gets:

- `jvp` is one forward sweep of it (no checkpointing: nothing is reversed);
- `hvp` is reverse over forward: the checkpointed `gradient` of the tangent model, with the loss's
  tangent L'(x) = dL(x).v as its loss. Its gradient with respect to the primal inputs is
  d(dL.v)/dx = H v; it runs under the same schedules, RAM and disk tiers as `gradient`, and the
  adjoints it runs are those the adjoint pass generates for the tangent kernels' IR.

`hvp`'s ``grads`` come from a plain `gradient` run beforehand, so they are that run's bits; the
second-order sweep costs about twice a gradient (tangent kernels do about twice the work).

``hvp(..., gauss_newton=True)`` gives the generalised Gauss-Newton product J^T H_L J v instead,
where J is the Jacobian of the final state with respect to the initial states and parameters and
H_L the Hessian of the terminal loss in the final state: for a least-squares loss
0.5 |r(x)|^2 with a linear residual that is the Gauss-Newton J_r^T J_r v, positive semi-definite
wherever the loss is convex in the final state, which is what Newton-CG needs far from a minimum.
It leaves out the model's own curvature, so it needs no second-order sweep: a `jvp` gives
w = J v, and a plain `gradient` of the loss's tangent along w held fixed, <dL(x), w>, gives
J^T H_L w (the gradient of <dL(x), w> in x is H_L w). Cost: one tangent sweep and one gradient.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

from compiler import Tangents, array, clone, zeros
from compiler.passes.tangent import tangent_name
from compiler.runtime.forward_mode import check_tangent
from compiler.runtime.tape import outside_tapes

from ..errors import ModelError
from .evaluate import ForwardOnly
from .gradient import GradientStats, start_sweep
from ..step.state import State, check_initial
from ..step.step_context import check_scalar_loss

__all__ = ["jvp", "hvp", "JvpResult", "HvpResult"]


@dataclass(frozen=True)
class JvpResult:
    """``final`` (the final State), ``tangents`` (``{state: array}``: its tangent, the directional
    derivative of the final state), ``loss`` (terminal + running, or None without a loss) and
    ``loss_tangent`` (its directional derivative)."""
    final: State
    tangents: dict
    loss: float | None
    loss_tangent: float | None


@dataclass(frozen=True)
class HvpResult:
    """``loss`` and ``grads`` (exactly `gradient`'s), ``hvp`` (``{name: array}``: the Hessian of the
    loss times the direction, for every float initial state and parameter), ``stats`` (the
    second-order sweep's `GradientStats`) and ``gradient_stats`` (the gradient run's)."""
    loss: float | None
    grads: dict | None
    hvp: dict
    stats: GradientStats
    gradient_stats: GradientStats | None


class TangentModel:
    """`model` with its tangents as states and parameters beside the primal ones. `tangents` names
    float states and parameters of `model` (the others have tangent zero); its arrays are checked
    and copied."""

    def __init__(self, model, initial, tangents, what: str = "tangents"):
        Model = type(model)       # not imported: model.py imports this module (no import circle)
        model._check_ready()
        self.model = model
        self.initial = check_initial(model.states, initial, model.device)
        tangents = _checked(model, tangents, what)
        taken = set(model.states) | set(model.params)
        self.names: dict[str, str] = {}          # primal name -> tangent name (float states, seeded params)
        aug = Model(model.device, dt=model.dt, t0=model.t0, zero_buffers=model.zero_buffers,
                    name=f"tangent of {model.name or 'model'}")
        for name, spec in model.states.items():
            aug.state(name, spec.shape, spec.dtype)
            if spec.dtype.is_float:
                self.names[name] = t = tangent_name(name, taken)
                taken.add(t)
                aug.state(t, spec.shape, spec.dtype)
        for name, p in model.params.items():
            aug.param(name, p)
        for name in model.params:
            if name in tangents:
                self.names[name] = t = tangent_name(name, taken)
                taken.add(t)
                aug.param(t, tangents[name])
        for name, values in model._series.items():
            aug.series(name, values)
        self.aug_initial = dict(initial)
        for name, spec in model.states.items():
            if spec.dtype.is_float:
                given = tangents.get(name)
                self.aug_initial[self.names[name]] = given if given is not None else \
                    zeros(spec.shape, spec.dtype, model.device)
        self.zeros: dict = {}                    # shared zero tangents, kept across steps
        self.primal_running: list[float] = []
        self.keeps_step = False
        aug.step(self._step)
        self.aug = aug

    # -- the tangent model's step, loss and running loss -----------------------------------------------
    def _tangents(self, new) -> Tangents:
        return Tangents(new=new, shared_zeros=self.zeros)

    def _seed(self, tan: Tangents, state: State) -> State:
        """Seed `tan` with the pairs of `state` (a tangent model's State); return its primal part."""
        for name, t in self.names.items():
            if name in state:
                tan.seed(state[name], state[t], check=False)
        return State({n: state[n] for n in self.model.states})

    def _step(self, s):
        tan = self._tangents(_scratch_tangents(s, "step"))
        view = _PrimalStep(s, self, tan)
        with tan:
            self.model.step_fn(view)
        if self.keeps_step:
            self._last_step = (s, tan)   # the running loss of this step sees the same tangents

    def loss(self, user_loss):
        """The tangent model's terminal loss: the tangent of ``user_loss`` (dL.v)."""
        def loss_tangent(state):
            tan = self._tangents(None)
            primal = self._seed(tan, state)
            with tan:
                value = check_scalar_loss(user_loss(primal), "loss(state)")
            return _tangent_or_zero(tan, value)
        return loss_tangent

    def running_loss(self, user_running_loss, record: bool = False):
        """The tangent model's running loss: the tangent of ``user_running_loss(s)``; with `record`,
        the primal values are kept in `primal_running`, step by step."""
        self.keeps_step = True
        def running_tangent(s):
            last = self.__dict__.pop("_last_step", None)
            tan = last[1] if last is not None and last[0] is s else self._tangents(_scratch_tangents(s, "loss"))
            view = _PrimalStep(s, self, tan)
            with tan:
                value = check_scalar_loss(user_running_loss(view), "running_loss(s)")
            if record:
                self.primal_running.append(float(value.numpy().reshape(-1)[0]))
            return _tangent_or_zero(tan, value)
        return running_tangent

    def primal_loss(self, user_loss, state: State) -> tuple[float, float]:
        """(L, dL.v) of the terminal loss at a final tangent-model State."""
        tan = self._tangents(None)
        primal = self._seed(tan, state)
        with outside_tapes(True), tan:
            value = check_scalar_loss(user_loss(primal), "loss(state)")
        return float(value.numpy().reshape(-1)[0]), float(tan[value].numpy().reshape(-1)[0])


def _scratch_tangents(s, where: str):
    """New tangents inside a step are scratch buffers: a fresh version every step."""
    count = [0]

    def new(arr):
        count[0] += 1
        return s.scratch(f"tangent {count[0]} of the {where}", arr.shape, arr.dtype, zero=True)
    return new


def _tangent_or_zero(tan: Tangents, value: array) -> array:
    t = tan.get(value)
    return t if t is not None else zeros(value.shape, value.dtype, value.device, requires_grad=True)


class _PrimalStep:
    """What the user's step function sees inside the tangent model: its own states and parameters
    (their tangents are seeded in `tan`), and scratch buffers that come with tangents."""

    def __init__(self, s, model: TangentModel, tan: Tangents):
        self._s, self._tan = s, tan
        self.prev = model._seed(tan, s.prev)
        self.next = model._seed(tan, s.next)
        for name, t in model.names.items():
            if name in s.params:
                tan.seed(s.params[name], s.params[t], check=False)
        self.params = State({n: s.params[n] for n in model.model.params})
        self.dt, self.series = s.dt, s.series

    @property
    def n(self):
        return self._s.n

    @property
    def t(self):
        return self._s.t

    def scratch(self, name: str, shape, dtype=float, zero: bool | None = None) -> array:
        arr = self._s.scratch(name, shape, dtype, zero)
        if arr.dtype.is_float and arr not in self._tan:
            self._tan.seed(arr, self._s.scratch(f"tangent of {name}", shape, dtype, zero), check=False)
        return arr


def _checked(model, tangents, what: str) -> dict:
    """`tangents` as ``{name: array}`` (copies) after checking names, dtypes, shapes and device."""
    if tangents is None:
        return {}
    if not isinstance(tangents, dict):
        raise ModelError(f"{what} must be a dict of name -> array, got {type(tangents).__name__}")
    out = {}
    for name, value in tangents.items():
        if name in model.states:
            spec = model.states[name]
            shape, dtype = spec.shape, spec.dtype
            if not dtype.is_float:
                raise ModelError(f"{what}['{name}']: state '{name}' holds {dtype} values, which have no tangent "
                                 "(only float states and parameters are differentiable); leave it out")
        elif name in model.params:
            shape, dtype = model.params[name].shape, model.params[name].dtype
        else:
            known = ", ".join(repr(n) for n in (*model.states, *model.params))
            raise ModelError(f"{what} names '{name}', which is neither a state nor a parameter of the model "
                             f"(it has {known})")
        if isinstance(value, np.ndarray):
            want = shape + dtype.inner_shape
            if value.shape != want:
                raise ModelError(f"{what}['{name}']: expected shape {want}, got a NumPy array of shape {value.shape}")
            value = array(value, dtype=dtype, device=model.device)
        try:
            check_tangent(zeros(shape, dtype, model.device) if name in model.states else model.params[name], value,
                          f"{what}['{name}']")
        except (TypeError, ValueError) as e:
            raise ModelError(str(e)) from None
        out[name] = clone(value, requires_grad=False)
    return out


def jvp(model, initial, steps, tangents=None, loss=None, running_loss=None, *, deterministic=True,
        check_finite=False, progress=None) -> JvpResult:
    """See `Model.jvp`."""
    tm = TangentModel(model, initial, tangents)
    rl = tm.running_loss(running_loss, record=True) if running_loss is not None else None
    with outside_tapes(deterministic):
        sweep = start_sweep(tm.aug, tm.aug_initial, steps, schedule=ForwardOnly(steps), running_loss=rl,
                            deterministic=deterministic, check_finite=check_finite, progress=progress, desc="jvp")
        try:
            final = sweep.forward()
            final = State({n: clone(a, requires_grad=False) for n, a in final.items()})
            step_tangents = list(sweep.step_losses)
        finally:
            sweep.close()
    value = value_tangent = None
    if loss is not None or running_loss is not None:
        value, value_tangent = 0.0, 0.0
        if loss is not None:
            value, value_tangent = tm.primal_loss(loss, final)
        if running_loss is not None:
            steps_seen = tm.primal_running
            if len(steps_seen) != steps:       # running losses run natively: the plain sweep says
                value = model.evaluate(initial, steps, loss=loss, running_loss=running_loss,
                                       deterministic=deterministic)
            else:
                for v in steps_seen:
                    value += v
            for v in step_tangents:            # summed as `evaluate` sums: terminal, then step order
                value_tangent += v
    primal = State({n: final[n] for n in model.states})
    return JvpResult(primal, {n: final[t] for n, t in tm.names.items() if n in model.states}, value, value_tangent)


def hvp(model, initial, steps, direction, loss=None, running_loss=None, schedule=None, storage=None, *,
        gradient=True, gauss_newton=False, trajectory=None, **options) -> HvpResult:
    """See `Model.hvp`. ``gradient=False`` skips the plain gradient run (``loss``, ``grads`` and
    ``gradient_stats`` are then None): Newton-CG asks for many products at one point.
    ``gauss_newton=True``: the generalised Gauss-Newton product (module docstring) in ``hvp``;
    `trajectory`: a `KeptTrajectory` at this point, which its reverse sweep runs from."""
    if loss is None and running_loss is None:
        raise ModelError("hvp() needs loss= (a function of the final state) and/or running_loss= "
                         "(a function of each step's s)")
    if not direction:
        raise ModelError("hvp() needs direction={name: array} naming at least one state or parameter")
    if gauss_newton and (running_loss is not None or loss is None):
        raise ModelError("hvp(gauss_newton=True) needs a terminal loss= and no running_loss=: its product "
                         "J^T H_L J v pairs the final state's tangent with the loss's curvature there (a running "
                         "loss would need every step's tangent during the reverse sweep); use the full Hessian "
                         "(gauss_newton=False) for running losses")
    if trajectory is not None:
        if not gauss_newton:
            raise ModelError("hvp(trajectory=...) serves the Gauss-Newton product (gauss_newton=True), whose reverse "
                             "sweep is the model's own; the Hessian's runs the tangent model, whose trajectory "
                             "changes with the direction")
        if trajectory.model is not model or trajectory.steps != steps:
            raise ModelError(f"hvp(trajectory=...) was kept for {trajectory.steps} steps of "
                             f"{'another model' if trajectory.model is not model else 'this model'}; this product "
                             f"is {steps} steps of this one: keep one with model.keep_trajectory(initial, {steps})")
        if schedule is not None or storage is not None:
            raise ModelError("hvp(trajectory=...) reverses the kept records: it takes no schedule= or storage=")
        trajectory.check_start(initial, "hvp(trajectory=...)")
    second_schedule = schedule
    if gradient and schedule is not None and hasattr(schedule, "__iter__"):
        try:
            second_schedule = copy.deepcopy(schedule)      # a schedule runs once; the second sweep runs a copy
        except Exception:
            raise ModelError(f"hvp(schedule=...) runs two sweeps and this {type(schedule).__name__} cannot be "
                             "copied; pass a function steps -> schedule") from None
    if gauss_newton:
        _checked(model, direction, "direction")
    else:
        tm = TangentModel(model, initial, direction, what="direction")
    first = None
    if gradient and trajectory is not None:            # the same bits, from the kept records
        value, grads = trajectory.gradient(loss)
        first = _Kept(grads, value)
    elif gradient:
        first = model.gradient(initial, steps, loss=loss, schedule=schedule, storage=storage,
                               running_loss=running_loss, **options)
    if gauss_newton:
        second = _gauss_newton_sweep(model, initial, steps, direction, loss, second_schedule, storage, options,
                                     trajectory)
    else:
        second = tm.aug.gradient(tm.aug_initial, steps, loss=tm.loss(loss) if loss is not None else None,
                                 schedule=second_schedule, storage=storage,
                                 running_loss=tm.running_loss(running_loss) if running_loss is not None else None,
                                 **options)
    names = [n for n, s in model.states.items() if s.dtype.is_float] + list(model.params)
    hv = {n: second.grads[n] for n in names}
    if first is None:
        return HvpResult(None, None, hv, second.stats, None)
    return HvpResult(first.loss, first.grads, hv, second.stats, first.stats)


def _gauss_newton_sweep(model, initial, steps, direction, loss, schedule, storage, options, trajectory=None):
    """The gradient of <dL(x), w> at the final state x, with w = J v (a jvp's final tangent) held
    fixed: J^T H_L J v in its ``grads`` (from `trajectory`'s records where one is given: then a
    `_Kept`, without stats)."""
    forward = {k: options[k] for k in ("deterministic", "check_finite") if k in options}
    w = jvp(model, initial, steps, direction, progress=options.get("progress"), **forward).tangents

    def curvature(state):
        tan = Tangents()
        for name, t in w.items():
            tan.seed(state[name], t, check=False)
        with tan:
            value = check_scalar_loss(loss(state), "loss(state)")
        return _tangent_or_zero(tan, value)
    if trajectory is not None:
        return _Kept(trajectory.gradient(curvature)[1])
    return model.gradient(initial, steps, loss=curvature, schedule=schedule, storage=storage, **options)


@dataclass(frozen=True)
class _Kept:
    """A reverse sweep run from a KeptTrajectory: its grads (and loss), and no sweep statistics."""
    grads: dict
    loss: float | None = None
    stats: GradientStats | None = None
