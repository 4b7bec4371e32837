"""Driving a model with an optimiser, and checking its gradient the way adjoint codes are checked.

- `value_and_grad`: a model, a loss and a set of names (parameters and/or initial states) become
  ``f(theta) -> (loss, gradient)`` over one flat float64 vector, ready for
  ``scipy.optimize.minimize(f, f.x0, jac=True, method="L-BFGS-B")``.
- `taylor_test`: the standard check of adjoint codes. For a direction dm and shrinking h, the
  remainders |J(m + h dm) - J(m)| and |J(m + h dm) - J(m) - h dJ.dm| must fall as h and h^2; the
  convergence rates (log2 of the ratio of successive remainders, h halving) are reported; with
  ``hessian=True`` the second-order remainder (through `Model.hvp`) must fall as h^3.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from compiler import array

from .errors import ModelError

__all__ = ["value_and_grad", "taylor_test", "TaylorResult"]


class _Variables:
    """The named parameters and initial states of a model, as one flat float64 vector."""

    def __init__(self, model, initial, names):
        self.model = model
        self.initial = dict(initial)
        known = [*model.params.keys(), *(n for n, s in model.states.items() if s.dtype.is_float)]
        names = list(known if names is None else ([names] if isinstance(names, str) else names))
        for name in names:
            if name not in known:
                raise ModelError(f"'{name}' is neither a parameter nor a float state of the model "
                                 f"(it has {', '.join(map(repr, known))})")
        self.names = names
        self.values = {n: self._current(n) for n in names}       # float64 copies at m
        self.sizes = [v.size for v in self.values.values()]

    def _current(self, name) -> np.ndarray:
        value = self.model.params[name] if name in self.model.params else self.initial[name]
        return np.array(value.numpy() if isinstance(value, array) else value, dtype=np.float64)

    @property
    def x0(self) -> np.ndarray:
        return np.concatenate([v.ravel() for v in self.values.values()])

    def split(self, theta) -> dict:
        theta = np.asarray(theta, dtype=np.float64)
        if theta.shape != (sum(self.sizes),):
            raise ModelError(f"expected a flat vector of {sum(self.sizes)} values ({', '.join(self.names)}), "
                             f"got shape {theta.shape}")
        parts = np.split(theta, np.cumsum(self.sizes)[:-1])
        return {n: p.reshape(self.values[n].shape) for n, p in zip(self.names, parts)}

    def apply(self, theta) -> dict:
        """Set the parameters to `theta`'s values (in place); return the initial state to run from."""
        initial = dict(self.initial)
        for name, value in self.split(theta).items():
            if name in self.model.params:
                p = self.model.params[name]
                np.copyto(p.numpy(), value.astype(p.numpy().dtype))
                p._storage.version += 1      # a change a Tape that read it must see
            else:
                initial[name] = array(value, dtype=self.model.states[name].dtype)
        return initial

    def arrays(self, flat) -> dict:
        """A flat vector as ``{name: array}`` of each name's dtype on the model's device."""
        out = {}
        for name, value in self.split(flat).items():
            dtype = self.model.params[name].dtype if name in self.model.params else self.model.states[name].dtype
            out[name] = array(value, dtype=dtype, device=self.model.device)
        return out

    def flat(self, grads) -> np.ndarray:
        return np.concatenate([np.asarray(grads[n].numpy(), np.float64).ravel() for n in self.names])


def value_and_grad(model, initial, steps, *, loss=None, running_loss=None, params=None, schedule=None,
                   keep_trajectory=False, **options):
    """``f(theta) -> (loss, gradient)``: `theta` is the flat float64 vector of the arrays named in
    `params` (parameters and/or initial states; default: all of them), in that order. Each call
    sets the parameters to `theta` (in place), runs `Model.gradient` and returns the loss as a float
    and the gradient as a float64 vector. ``f.hessp(theta, p)`` is the Hessian at `theta` times
    the vector `p` (`Model.hvp`: one second-order sweep, about twice a gradient), for scipy's
    ``Newton-CG``, ``trust-ncg`` and ``trust-krylov``; ``f.gauss_newton(theta, p)`` the Gauss-Newton
    product instead (``Model.hvp(gauss_newton=True)``: terminal losses; positive semi-definite for
    least squares; one jvp and one gradient). ``keep_trajectory=True`` (terminal losses, no
    schedule) keeps the rollout at the latest `theta` (`Model.keep_trajectory`: store-all memory,
    one trajectory at a time): `f` reverses it and the Gauss-Newton products there reuse it, each a
    jvp and a reverse sweep without recomputation. ``f.x0`` is the starting vector (today's values),
    ``f.split(theta)`` gives ``{name: ndarray}``. `schedule`: a function ``steps -> schedule`` (a
    schedule runs once; the default is Revolve). Example::

        f = stepper.value_and_grad(model, initial, 500, loss=misfit, params=["kappa"])
        res = scipy.optimize.minimize(f, f.x0, jac=True, method="L-BFGS-B")
        res = scipy.optimize.minimize(f, f.x0, jac=True, hessp=f.hessp, method="Newton-CG")
    """
    if schedule is not None and hasattr(schedule, "__iter__"):
        raise ModelError("value_and_grad(schedule=...) runs many gradients and a schedule runs once; pass a "
                         "function steps -> schedule, e.g. lambda n: stepper.Revolve(n, 20)")
    variables = _Variables(model, initial, params)
    kept = _KeptAt(model, steps, options) if keep_trajectory else None
    if kept is not None and (running_loss is not None or schedule is not None or loss is None):
        raise ModelError("value_and_grad(keep_trajectory=True) reverses one kept trajectory from a terminal loss: "
                         "give loss= and no running_loss= or schedule=")

    def f(theta):
        start = variables.apply(theta)
        if kept is not None:
            value, grads = kept.at(theta, start).gradient(loss)
            return float(value), variables.flat(grads)
        result = model.gradient(start, steps, loss=loss, running_loss=running_loss, schedule=schedule, **options)
        return float(result.loss), variables.flat(result.grads)

    def product(theta, p, gauss_newton=False):
        start = variables.apply(theta)
        trajectory = kept.at(theta, start) if kept is not None and gauss_newton else None
        result = model.hvp(start, steps, variables.arrays(p), loss=loss, running_loss=running_loss,
                           schedule=schedule, gradient=False, gauss_newton=gauss_newton, trajectory=trajectory,
                           **options)
        return variables.flat(result.hvp)

    f.hessp = product
    f.gauss_newton = lambda theta, p: product(theta, p, gauss_newton=True)
    f.x0 = variables.x0
    f.split = variables.split
    f.names = tuple(variables.names)
    return f


class _KeptAt:
    """`value_and_grad`'s kept trajectory: one at a time, at the latest theta asked for."""

    def __init__(self, model, steps, options):
        self.model, self.steps = model, steps
        self.deterministic = options.get("deterministic", True)
        self.theta = self.kept = None

    def at(self, theta, start):
        theta = np.asarray(theta, dtype=np.float64)
        if self.kept is None or not np.array_equal(theta, self.theta):
            if self.kept is not None:
                self.kept.close()
                self.kept = None
            self.kept = self.model.keep_trajectory(start, self.steps, deterministic=self.deterministic)
            self.theta = theta.copy()
        return self.kept


@dataclass
class TaylorResult:
    """``h``: the step sizes; ``remainders0``: ``|J(m+h dm) - J(m)|`` (falls as h);
    ``remainders1``: ``|J(m+h dm) - J(m) - h dJ.dm|`` (falls as h^2 if the gradient is right);
    ``rates0``/``rates1``: their convergence rates between successive h; ``passed``: every
    ``rates1`` above ``min_rate``, or the remainders at rounding level (exact for linear losses).
    With ``hessian=True`` also ``remainders2``: ``|J(m+h dm) - J(m) - h dJ.dm - h^2/2 dm.H.dm|``
    (falls as h^3 if the Hessian-vector product is right) and ``rates2``, which must be above
    ``min_rate + 1`` too."""
    h: list
    remainders0: list
    remainders1: list
    rates0: list
    rates1: list
    passed: bool
    remainders2: list | None = None
    rates2: list | None = None

    def __str__(self) -> str:
        second = self.remainders2 is not None
        rows = [f"{'h':>10} {'|J(m+h dm)-J(m)|':>18} {'rate':>6} {'|... - h dJ.dm|':>16} {'rate':>6}"
                + (f" {'|... - h^2/2 dm.H.dm|':>22} {'rate':>6}" if second else "")]
        for k, h in enumerate(self.h):
            r0 = f"{self.rates0[k - 1]:6.3f}" if k else " " * 6
            r1 = f"{self.rates1[k - 1]:6.3f}" if k else " " * 6
            row = f"{h:10.3e} {self.remainders0[k]:18.6e} {r0} {self.remainders1[k]:16.6e} {r1}"
            if second:
                r2 = f"{self.rates2[k - 1]:6.3f}" if k else " " * 6
                row += f" {self.remainders2[k]:22.6e} {r2}"
            rows.append(row)
        return "\n".join(rows)


def taylor_test(model, initial, steps, *, loss=None, running_loss=None, params=None, direction=None,
                h=1e-2, halvings=4, seed=0, min_rate=1.9, hessian=False, **options) -> TaylorResult:
    """Taylor-remainder test of `Model.gradient` on the whole model. `params`: names of parameters
    and/or initial states to perturb (default: all); `direction`: a flat vector (default: random,
    scaled like the values, seeded by `seed`); `h` the first step, halved `halvings` times. The
    parameters are restored afterwards. ``hessian=True`` also tests `Model.hvp` (the second-order
    remainder, which falls as h^3). Check ``result.passed``; print ``result`` for the table."""
    variables = _Variables(model, initial, params)
    m = variables.x0
    if direction is None:
        rng = np.random.default_rng(seed)
        scale = np.concatenate([np.full(v.size, max(np.abs(v).max(), 1.0)) for v in variables.values.values()])
        direction = rng.uniform(-1.0, 1.0, m.size) * scale
    direction = np.asarray(direction, np.float64)
    if direction.shape != m.shape:
        raise ModelError(f"direction must be a flat vector of {m.size} values, got shape {direction.shape}")
    run = dict(loss=loss, running_loss=running_loss, **options)
    try:
        result = model.gradient(variables.apply(m), steps, **run)
        j0, dj = float(result.loss), float(variables.flat(result.grads) @ direction)
        if hessian:
            second = model.hvp(variables.apply(m), steps, variables.arrays(direction), gradient=False, **run)
            d2j = float(variables.flat(second.hvp) @ direction)
        hs, r0, r1, r2 = [], [], [], []
        for k in range(halvings + 1):
            hk = h / 2 ** k
            j = model.evaluate(variables.apply(m + hk * direction), steps, loss=loss, running_loss=running_loss,
                               **{k: v for k, v in options.items() if k in ("deterministic", "check_finite")})
            hs.append(hk)
            r0.append(abs(j - j0))
            r1.append(abs(j - j0 - hk * dj))
            if hessian:
                r2.append(abs(j - j0 - hk * dj - 0.5 * hk * hk * d2j))
    finally:
        variables.apply(m)                   # the parameters as they were
    rates0 = [_rate(a, b) for a, b in zip(r0, r0[1:])]
    rates1 = [_rate(a, b) for a, b in zip(r1, r1[1:])]
    floor = 64 * np.finfo(np.float64).eps * max(abs(j0), 1e-300)
    passed = all(r >= min_rate or small <= floor for r, small in zip(rates1, r1[1:]))
    if not hessian:
        return TaylorResult(hs, r0, r1, rates0, rates1, passed)
    rates2 = [_rate(a, b) for a, b in zip(r2, r2[1:])]
    passed = passed and all(r >= min_rate + 1 or small <= floor for r, small in zip(rates2, r2[1:]))
    return TaylorResult(hs, r0, r1, rates0, rates1, passed, r2, rates2)


def _rate(a, b) -> float:
    return math.log2(a / b) if a > 0 and b > 0 else math.inf
