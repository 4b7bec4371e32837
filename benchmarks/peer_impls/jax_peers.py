"""JAX peers: lax.scan as autodiff stores it, lax.scan with jax.checkpoint per step, nested (two
level, sqrt(n) x sqrt(n)) remat, and equinox's checkpointed while loop (the one diffrax uses).

Every runner is compiled ahead of time (`jit(...).lower(...).compile()`), so the timed calls never
include tracing or XLA compilation. With ``count=True`` the step reports every evaluation to a
Python counter through `jax.debug.callback` (slow, used on a tiny grid only to count forward step
evaluations; the count does not depend on the grid size).
"""
from __future__ import annotations

import math

import numpy as np

from .problem import B, C, initial

import jax                                        # noqa: E402  (after numpy, for a clean baseline)
import jax.numpy as jnp                           # noqa: E402
from jax import lax                               # noqa: E402

_COUNT = [0]


def _bump(_):
    _COUNT[0] += 1


def make_step(count: bool):
    def step(carry):
        up, u = carry
        if count:
            jax.debug.callback(_bump, u[0, 0])    # depends on the carry, so it is not hoisted
        p = jnp.pad(u, 1)
        lap = p[:-2, 1:-1] + p[2:, 1:-1] + p[1:-1, :-2] + p[1:-1, 2:] - 4.0 * u
        return u, 2.0 * u - up + C * lap - B * u * u * u
    return step


def _scan(step, carry, length):
    return lax.scan(lambda c, _: (step(c), None), carry, None, length=length)[0]


def _loss(u):
    return 0.5 * jnp.sum(u * u)


class JaxRunner:
    """`mode`: "scan" (no remat: autodiff stores what each step's adjoint needs), "remat" (each step
    wrapped in jax.checkpoint: the carry is stored, the step recomputed in the backward scan),
    "nested" (segments of `segment` steps, each segment and each step checkpointed), or
    "equinox" (equinox.internal.while_loop(kind="checkpointed", checkpoints=k))."""

    def __init__(self, n: int, steps: int, mode: str, k: int | None = None, segment: int | None = None,
                 count: bool = False, x64: bool = False):
        if x64:                                   # the float64 reference at the benchmark size
            jax.config.update("jax_enable_x64", True)
        self.n, self.steps, self.mode, self.k = n, steps, mode, k
        self.segment = segment or max(1, round(math.sqrt(steps)))
        self.count = count
        self.u0 = jnp.asarray(initial(n).astype(np.float64) if x64 else initial(n))
        step = make_step(count)
        rollout = self._rollout_fn(step)
        self._fwd = jax.jit(lambda u0: rollout(u0)[1]).lower(self.u0).compile()
        self._grad = jax.jit(jax.value_and_grad(lambda u0: _loss(rollout(u0)[1]))).lower(self.u0).compile()

    def _rollout_fn(self, step):
        steps = self.steps
        if self.mode == "scan":
            return lambda u0: _scan(step, (u0, u0), steps)
        if self.mode == "remat":
            return lambda u0: _scan(jax.checkpoint(step), (u0, u0), steps)
        if self.mode == "nested":
            seg = self.segment
            outer, rest = divmod(steps, seg)
            inner = jax.checkpoint(lambda c: _scan(jax.checkpoint(step), c, seg))
            tail = jax.checkpoint(lambda c: _scan(jax.checkpoint(step), c, rest))

            def rollout(u0):
                c = _scan(inner, (u0, u0), outer)
                return tail(c) if rest else c
            return rollout
        if self.mode == "equinox":
            import equinox.internal as eqxi

            def body(c):
                i, up, u = c
                up, u = step((up, u))
                return i + 1, up, u

            def rollout(u0):
                _, up, u = eqxi.while_loop(lambda c: c[0] < steps, body, (0, u0, u0), max_steps=steps,
                                           kind="checkpointed", checkpoints=self.k)
                return up, u
            return rollout
        raise ValueError(f"unknown JAX mode {self.mode!r}")

    def warmup(self) -> None:
        pass                                       # compiled ahead of time in __init__

    def forward(self) -> np.ndarray:
        return np.asarray(self._fwd(self.u0).block_until_ready())

    def gradient(self) -> tuple[float, np.ndarray, dict]:
        _COUNT[0] = 0
        loss, g = self._grad(self.u0)
        g = np.asarray(g.block_until_ready())
        if self.count:
            jax.effects_barrier()
        stats = {"forward_steps_counted": _COUNT[0]} if self.count else {}
        return float(loss), g, stats

    def forward_steps(self) -> int | None:
        """Forward step evaluations of one gradient, where the schedule makes it a closed form."""
        return {"scan": self.steps, "remat": 2 * self.steps, "nested": 3 * self.steps}.get(self.mode)

    def stored_states(self) -> str:
        seg = self.segment
        return {"scan": f"{self.steps} step residuals",
                "remat": f"{self.steps} carries",
                "nested": f"{math.ceil(self.steps / seg)} + {seg} carries",
                "equinox": f"{self.k} carries"}[self.mode]


def describe() -> dict:
    return {"jax": jax.__version__, "backend": jax.default_backend(),
            "devices": [str(d) for d in jax.devices()]}
