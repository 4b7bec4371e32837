"""`Model`: declared state arrays, differentiable parameters and a step function.

    model = stepper.Model(dt=0.01)
    model.state("x", shape=n, dtype=stepper.vec3)
    model.state("v", shape=n, dtype=stepper.vec3)
    model.param("k", stepper.array([50.0]))

    @model.step
    def step(s):
        f = s.scratch("force", n, stepper.vec3)
        stepper.launch(forces, n, inputs=[s.prev.x, s.params.k], outputs=[f])
        stepper.launch(integrate, n, inputs=[s.prev.x, s.prev.v, f, s.dt], outputs=[s.next.x, s.next.v])
"""
from __future__ import annotations

from compiler import array, float32
from compiler.runtime.device import get_device, require_cuda

from .errors import ModelError
from .runs import gradient as _gradient
from .runs import rollout as _rollout
from .step.state import State, StateSpec, make_spec
from .step.trace import series_row

__all__ = ["Model"]


class Model:
    """A time-stepping model. ``t0`` and ``dt`` give each step its time ``s.t = t0 + n dt``.
    ``zero_buffers=False`` skips zero-filling new versions (``s.next`` arrays and scratch) when your
    kernels write every element of them."""

    def __init__(self, device: str = "cpu", *, dt: float = 1.0, t0: float = 0.0, zero_buffers: bool = True,
                 name: str | None = None):
        try:
            self.device = str(get_device(device))
            require_cuda(get_device(device))
        except (ValueError, RuntimeError) as e:
            raise ModelError(f"Model(device={device!r}): {e}") from None
        self.dt, self.t0 = float(dt), float(t0)
        self.zero_buffers = zero_buffers
        self.name = name
        self.states: dict[str, StateSpec] = {}
        self._params: dict[str, array] = {}
        self._params_state = State({})       # what `params` gives; every step reads it
        self._series: dict[str, array] = {}  # time-indexed inputs, row n for step n (see series)
        self.step_fn = None

    # -- declarations ------------------------------------------------------------------------------
    def state(self, name: str, shape, dtype=float32) -> StateSpec:
        """Declare a state array: every step reads it as ``s.prev.<name>`` and must write
        ``s.next.<name>``, a fresh version each step."""
        spec = make_spec(name, shape, dtype)
        if name in self.states or name in self._params:
            raise ModelError(f"'{name}' is already declared (as a {'state' if name in self.states else 'param'})")
        self.states[name] = spec
        return spec

    def param(self, name: str, value: array) -> array:
        """Declare a differentiable parameter (read by steps as ``s.params.<name>``); its gradient sums
        the contributions of every step. The array is used as is (not copied) and gets
        ``requires_grad=True``."""
        if not isinstance(name, str) or not name.isidentifier():
            raise ModelError(f"param name {name!r} must be a Python identifier")
        if name in self.states or name in self._params:
            raise ModelError(f"'{name}' is already declared (as a {'state' if name in self.states else 'param'})")
        if not isinstance(value, array):
            raise ModelError(f"param '{name}' must be a stepper.array, got {type(value).__name__}")
        if value.device != self.device:
            raise ModelError(f"param '{name}' is on '{value.device}' but the model runs on '{self.device}'")
        if not value.dtype.is_float:
            raise ModelError(f"param '{name}' must be a float array to be differentiable, got {value.dtype}")
        value.requires_grad = True
        self._params[name] = value
        self._params_state = State(self._params)
        return value

    def series(self, name: str, values: array) -> array:
        """Declare a time-indexed input: step n reads row n of `values` (``values[n]``; a
        one-element array for a 1-D `values`) as ``s.series.<name>``. Per-step data (forcing terms,
        the samples a recursion consumes) read this way keep steps traceable, which passing
        ``s.n`` to a kernel does not. Read only; not differentiated. `values` needs a row per step."""
        if not isinstance(name, str) or not name.isidentifier():
            raise ModelError(f"series name {name!r} must be a Python identifier")
        if name in self.states or name in self._params or name in self._series:
            raise ModelError(f"'{name}' is already declared")
        if not isinstance(values, array) or values.device != self.device:
            raise ModelError(f"series '{name}' must be a stepper.array on '{self.device}', got "
                             f"{type(values).__name__}")
        self._series[name] = values
        return values

    def series_row(self, n: int) -> State:
        """The time-indexed inputs of step n (views of row n), as ``s.series`` gives them."""
        rows = {}
        for name, values in self._series.items():
            if n >= values.shape[0]:
                raise ModelError(f"series '{name}' has {values.shape[0]} rows, but step {n} ran; give it a row "
                                 f"per step")
            rows[name] = series_row(name, values, n)
        return State(rows)

    def step(self, fn):
        """Decorator: the step function ``fn(s)``; it reads ``s.prev``/``s.params`` and writes ``s.next``."""
        if not callable(fn):
            raise ModelError(f"@model.step needs a function of s, got {type(fn).__name__}")
        self.step_fn = fn
        return fn

    @property
    def params(self) -> State:
        return self._params_state

    @property
    def state_bytes(self) -> int:
        """Bytes of one state (all declared arrays)."""
        return sum(spec.nbytes for spec in self.states.values())

    def _check_ready(self) -> None:
        if not self.states:
            raise ModelError("the model declares no state; add model.state(name, shape, dtype)")
        if self.step_fn is None:
            raise ModelError("the model has no step function; decorate one with @model.step")

    # -- running -------------------------------------------------------------------------------------
    def rollout(self, initial, steps: int | None = None, **options):
        """Run `steps` steps forward from `initial` (``{name: array}``); return the final state as a
        `Rollout` (a State with ``.steps``, ``.history``, ``.stats``). Only two versions of the state
        are live at once. Options: ``callback(n, state)`` every ``every`` steps; ``record_every=k``
        keeps NumPy copies of every k-th state in ``.history``; ``checkpoint="run.ckpt"`` with
        ``checkpoint_every=k`` writes crash-safe checkpoints (a directory of HDF5 files, one per
        checkpoint; ``overwrite=True`` replaces an earlier run's) that `resume` continues from; ``until(state)``
        stops early; ``check_finite``; ``deterministic`` (serial atomics, for bit-exact reruns);
        ``progress``. Inside a recording `Tape` the rollout is recorded as one operation (options
        ``schedule=``, ``storage=``) whose backward is the checkpointed reverse sweep."""
        return _rollout.rollout(self, initial, steps, **options)

    def resume(self, path, steps: int | None = None, **options):
        """Continue a rollout that wrote checkpoints to directory `path` from its newest intact one,
        to `steps` (default: the run's original length); returns what that rollout would have.
        A model whose parameter values or step kernels differ from the writer's is refused (the
        error names them); ``allow_changes=True`` continues anyway and the new checkpoints record
        the changes (metadata ``changes``)."""
        return _rollout.resume(self, path, steps, **options)

    def gradient(self, initial, steps: int | None = None, loss=None, schedule=None, storage=None, **options):
        """The loss of a rollout and its gradients, reversed with a checkpointing `schedule`.

        - ``loss(state)``: a terminal loss, built with ordinary kernels from the final State; returns a
          one-element float array. ``running_loss=lambda s: ...``: a per-step contribution, built from
          a step's ``s`` (e.g. ``s.next``), also a one-element array (``s.scratch`` is handy for it).
        - ``schedule``: any checkpoint/ schedule (``Revolve(steps, 20)``, ``MultiLevel``, ``StoreAll``,
          ``Online(16)`` with ``until=``) or checkpoint_schedules' own, or a function steps ->
          schedule; default ``Revolve(steps, ceil(sqrt(steps)))``.
        - ``storage``: where DISK snapshots go: a path (HDF5, checked before the run), a Storage, or
          ``{StorageType.RAM: ..., StorageType.DISK: ...}``. RAM snapshots default to memory.
        - ``deterministic=True`` (default) fixes the order of every sum, so every schedule and
          thread count gives the same bits: gathered adjoints (each thread writes its own elements)
          run parallel as they are; adds into a few elements (a loss, a shared parameter's
          gradient) are summed in fixed chunks, in parallel; other atomics run serially in
          thread order, which costs the multithreading of those kernels.
          ``check_finite=True`` names the first step whose state is NaN or infinite.

        Returns a `GradientResult`: ``.loss``, ``.grads[name]`` for initial states and parameters,
        ``.final`` and ``.stats`` (`GradientStats`)."""
        return _gradient.gradient(self, initial, steps, loss, schedule, storage, **options)

    def jvp(self, initial, steps: int, tangents=None, loss=None, running_loss=None, **options):
        """One sweep with the tangent carried beside the state (forward mode; nothing stored):
        ``tangents={name: array}`` names initial states and parameters (the others have tangent
        zero). Returns a `JvpResult`: ``.final`` (State), ``.tangents[name]`` (the final state's
        tangent: d final / d(initial, params) . tangents), ``.loss`` and ``.loss_tangent`` (terminal
        + running loss and its directional derivative; None without a loss). Options
        ``deterministic`` (default True), ``check_finite``, ``progress``."""
        from .runs.second_order import jvp
        return jvp(self, initial, steps, tangents, loss, running_loss, **options)

    def hvp(self, initial, steps: int, direction, loss=None, running_loss=None, schedule=None, storage=None,
            **options):
        """The Hessian of the loss times ``direction={name: array}`` (initial states and parameters;
        the others zero), reversed through the same schedules and storage as `gradient` (reverse over
        forward: the gradient of the loss's tangent). Returns an `HvpResult`: ``.loss`` and
        ``.grads`` (those of `gradient`, bit for bit), ``.hvp[name]`` for every float initial state
        and parameter, ``.stats`` (the second-order sweep) and ``.gradient_stats``. A schedule object
        is copied for the second sweep; options as for `gradient`. ``gauss_newton=True``: the
        Gauss-Newton product J^T H_L J v in ``.hvp`` instead (terminal losses; stepper/runs/second_order.py);
        with ``trajectory=`` (a `keep_trajectory` of the same initial state and steps) its reverse
        sweep runs from the kept records instead of recomputing them: a jvp and a reverse sweep
        (and ``.grads``, the same bits, another reverse sweep of them)."""
        from .runs.second_order import hvp
        return hvp(self, initial, steps, direction, loss, running_loss, schedule, storage, **options)

    def keep_trajectory(self, initial, steps: int, *, deterministic: bool = True):
        """The rollout's trajectory at today's parameters, every step's record kept in memory
        (store-all's: the states each step's adjoint reads), for many reverse sweeps at this point:
        ``kept.gradient(loss)`` (`gradient`'s bits) and ``hvp(..., gauss_newton=True,
        trajectory=kept)``, which then cost no recomputation. A `KeptTrajectory`; ``close()`` it (or
        use ``with``) to give the memory back. Needs a traced step (stepper/runs/kept_trajectory.py)."""
        from .runs.kept_trajectory import KeptTrajectory
        return KeptTrajectory(self, initial, steps, deterministic=deterministic)

    def evaluate(self, initial, steps: int | None = None, loss=None, *, running_loss=None, **options) -> float:
        """The loss of a rollout of `steps` steps from `initial`, as a Python float, without its
        gradient and without recording anything: the same steps, kernels and order as `gradient`,
        so ``evaluate(...) == gradient(...).loss`` bit for bit. Made for finite-difference checks and
        line searches. ``loss`` and ``running_loss`` as in `gradient`; options ``deterministic``
        (default True), ``check_finite``, ``progress``."""
        from .runs.evaluate import evaluate
        return evaluate(self, initial, steps, loss, running_loss=running_loss, **options)

    def __repr__(self) -> str:
        states = ", ".join(f"{n}: {s.dtype} {s.shape}" for n, s in self.states.items())
        return f"Model(states=[{states}], params={list(self._params)})"
