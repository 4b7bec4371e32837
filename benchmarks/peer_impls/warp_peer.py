"""Warp peer: one kernel per step on device="cpu", and a store-all `wp.Tape` over the whole rollout.

Warp's Tape stores nothing itself: the adjoint of each launch reads the arrays it was launched with,
so every step writes a fresh array (overwriting a buffer would silently corrupt the gradient). The
memory of a gradient is therefore `steps` arrays with their `.grad` twins. Warp's CPU backend runs a
launch on one thread.
"""
from __future__ import annotations

import numpy as np

from .problem import B, C, initial

import warp as wp                                 # noqa: E402

wp.config.quiet = True
wp.init()


@wp.kernel
def wave_step(up: wp.array2d(dtype=float), u: wp.array2d(dtype=float), un: wp.array2d(dtype=float),
              c: float, b: float):
    i, j = wp.tid()
    n = u.shape[0]
    m = u.shape[1]
    x = u[i, j]
    lap = -4.0 * x
    if i > 0:
        lap += u[i - 1, j]
    if i < n - 1:
        lap += u[i + 1, j]
    if j > 0:
        lap += u[i, j - 1]
    if j < m - 1:
        lap += u[i, j + 1]
    un[i, j] = 2.0 * x - up[i, j] + c * lap - b * x * x * x


@wp.kernel
def half_sum_sq(u: wp.array2d(dtype=float), loss: wp.array(dtype=float)):
    i, j = wp.tid()
    wp.atomic_add(loss, 0, 0.5 * u[i, j] * u[i, j])


class WarpRunner:
    def __init__(self, n: int, steps: int, count: bool = False):
        self.n, self.steps = n, steps
        self.u0_host = initial(n)
        self.device = "cpu"

    def warmup(self) -> None:
        wp.load_module(device=self.device)        # compile (or load from Warp's cache) once

    def forward(self) -> np.ndarray:
        shape = (self.n, self.n)
        up = wp.array(self.u0_host, dtype=float, device=self.device)
        u = wp.array(self.u0_host, dtype=float, device=self.device)
        un = wp.zeros(shape, dtype=float, device=self.device)
        for _ in range(self.steps):
            wp.launch(wave_step, dim=shape, inputs=[up, u, un, C, B], device=self.device)
            up, u, un = u, un, up                 # three rotating buffers: forward only
        wp.synchronize_device(self.device)
        return u.numpy()

    def gradient(self) -> tuple[float, np.ndarray, dict]:
        shape = (self.n, self.n)
        u0 = wp.array(self.u0_host, dtype=float, device=self.device, requires_grad=True)
        loss = wp.zeros(1, dtype=float, device=self.device, requires_grad=True)
        tape = wp.Tape()
        with tape:
            up, u = u0, u0
            for _ in range(self.steps):
                un = wp.empty(shape, dtype=float, device=self.device, requires_grad=True)
                wp.launch(wave_step, dim=shape, inputs=[up, u, un, C, B], device=self.device)
                up, u = u, un
            wp.launch(half_sum_sq, dim=shape, inputs=[u, loss], device=self.device)
        tape.backward(loss=loss)
        wp.synchronize_device(self.device)
        g = u0.grad.numpy().copy()
        value = float(loss.numpy()[0])
        tape.reset()
        return value, g, {}

    def forward_steps(self) -> int:
        return self.steps                         # store-all: each step runs once, then its adjoint

    def stored_states(self) -> str:
        return f"{self.steps} arrays + grads"


def describe() -> dict:
    return {"warp": wp.config.version, "device": "cpu (one thread per launch)"}
