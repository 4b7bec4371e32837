"""The one problem every peer solves: the nonlinear wave equation on an n x n grid.

    u_next = 2 u - u_prev + C lap(u) - B u^3,   C = 0.25, B = 1e-3

with zero Dirichlet boundaries (neighbours outside the grid read as 0), a Gaussian bump as the
initial displacement u0 and zero initial velocity (u_prev = u = u0 at step 0). The loss is
0.5 * sum(u_final^2) and the gradient is taken with respect to u0, which reaches the loss through
both u_prev and u. The cubic term is what makes this a checkpointing problem: the adjoint of a step
needs u at that step, so some state must be stored or recomputed (a linear step would let JAX
transpose the scan without storing anything).

Everything here is float64 NumPy: the initial condition (cast to float32 by each peer) and a
store-all reference gradient with a hand-written adjoint, the oracle for small sizes.
"""
from __future__ import annotations

import numpy as np

C = 0.25
B = 1e-3


def initial(n: int) -> np.ndarray:
    """An off-centre Gaussian bump of height 1 (float32, shape (n, n))."""
    x = (np.arange(n) + 1.0) / (n + 1.0)
    X, Y = np.meshgrid(x, x, indexing="ij")
    u0 = np.exp(-((X - 0.4) ** 2 + (Y - 0.55) ** 2) / (2 * 0.08**2))
    return u0.astype(np.float32)


def laplacian(u: np.ndarray) -> np.ndarray:
    """5-point Laplacian with zero Dirichlet ghosts (the operator is symmetric)."""
    p = np.pad(u, 1)
    return p[:-2, 1:-1] + p[2:, 1:-1] + p[1:-1, :-2] + p[1:-1, 2:] - 4.0 * u


def step(u_prev: np.ndarray, u: np.ndarray) -> np.ndarray:
    return 2.0 * u - u_prev + C * laplacian(u) - B * u**3


def rollout(u0: np.ndarray, steps: int) -> np.ndarray:
    """u after `steps` steps, in float64."""
    up = u = np.asarray(u0, np.float64)
    for _ in range(steps):
        up, u = u, step(up, u)
    return u


def reference_gradient(u0: np.ndarray, steps: int) -> tuple[float, np.ndarray]:
    """(loss, dloss/du0) in float64, storing every u (meant for small sizes)."""
    u0 = np.asarray(u0, np.float64)
    us = [u0, u0]                                  # us[k] = u at step k - 1; us[0] is u_prev
    for _ in range(steps):
        us.append(step(us[-2], us[-1]))
    loss = 0.5 * float(np.sum(us[-1] ** 2))
    # a_next = dL/du_{k+1}, a = dL/du_k; u_{k+1} = 2u_k - u_{k-1} + C lap(u_k) - B u_k^3
    a_next, a = us[-1].copy(), np.zeros_like(u0)
    for k in range(len(us) - 2, 0, -1):
        u = us[k]
        a = a + (2.0 * a_next + C * laplacian(a_next) - 3.0 * B * u**2 * a_next)
        a_prev = -a_next                           # contribution to dL/du_{k-1}
        a_next, a = a, a_prev
    # after the loop: a_next = dL/d(us[1]), a = dL/d(us[0]); both are u0
    return loss, a_next + a
