"""jvp and hvp of the decomposed wave (tests/mpi_wave.py) under ``mpiexec -n P python
tests/mpi_second_order.py OUTDIR [GRID]``; rank 0 saves the gathered results to
OUTDIR/second_order.npz, and tests/test_mpi_second_order.py compares them with the one-process
model's jvp and hvp:

- a jvp along a direction of every state and the replicated parameter c, with a terminal and a
  running misfit;
- hvp along it under StoreAll, Revolve and MultiLevel with per-rank HDF5, and under Revolve with
  the launches overlapping their exchanges (dist.launch), with a plain dist.gradient beside them;
- the Gauss-Newton product along it (terminal misfit only);
- directions refused on every rank: a global array for a block, a parameter's that differs on a rank.
"""
from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mpi_wave as mw  # noqa: E402

import stepper as sp  # noqa: E402

F, STEPS = mw.F, mw.STEPS


def direction_global() -> dict:
    """A direction in every state and the wave speed, the same on every rank."""
    rng = np.random.default_rng(30)
    return {"u": 0.1 * rng.standard_normal((mw.N, mw.M)), "u_prev": 0.1 * rng.standard_normal((mw.N, mw.M)),
            "c": np.array([0.02])}


def running_misfit(observed, shape):
    """A tenth of the misfit of every step's new u."""
    def running(s):
        out = s.scratch("misfit", 1, F, zero=True)
        sp.launch(mw.misfit, shape, inputs=[s.next.u, observed], outputs=[out])
        return out
    return running


def losses(dist):
    observed = dist.scatter({"u": mw.observed_global()})["u"]
    shape = dist.local_shape("u")
    return mw.misfit_loss(observed, shape), running_misfit(observed, shape)


def blocks(dist, direction: dict) -> dict:
    local = dist.scatter(direction)
    return {n: v if isinstance(v, sp.array) else sp.array(v, dtype=F) for n, v in local.items()}


def run(outdir, grid=None):
    model, dist = mw.distributed_model(grid=grid)
    initial = dist.scatter(mw.initial_global())
    loss, running = losses(dist)
    d = blocks(dist, direction_global())
    saved = {}
    r = dist.jvp(initial, STEPS, tangents=d, loss=loss, running_loss=running)
    for name in ("u", "u_prev"):
        saved[f"jvp_final_{name}"] = dist.gather(r.final[name])
        saved[f"jvp_tangent_{name}"] = dist.gather(r.tangents[name])
    saved["jvp_loss"] = np.array([r.loss, r.loss_tangent])
    schedules = {"storeall": lambda: sp.StoreAll(STEPS), "revolve": lambda: sp.Revolve(STEPS, 3),
                 "multilevel": lambda: sp.MultiLevel(STEPS, 1, 3, write_cost=0.5, read_cost=0.5)}
    for key, schedule in schedules.items():
        storage = os.path.join(outdir, "hvp.h5") if key == "multilevel" else None
        h = dist.hvp(initial, STEPS, d, loss=loss, running_loss=running, schedule=schedule(), storage=storage)
        save_hvp(dist, saved, key, h)
        saved[f"{key}_disk_writes"] = np.array(dist.sum(h.stats.snapshots_written(sp.StorageType.DISK)))
        same = dist.comm.allgather((h.loss, h.hvp["c"].numpy().tobytes(), h.grads["c"].numpy().tobytes()))
        saved[f"{key}_ranks_agree"] = np.array(all(s == same[0] for s in same))
    gn = dist.hvp(initial, STEPS, d, loss=loss, schedule=sp.Revolve(STEPS, 3), gauss_newton=True, gradient=False)
    for name in ("u", "u_prev"):
        saved[f"gauss_newton_{name}"] = dist.gather(gn.hvp[name])
    saved["gauss_newton_c"] = gn.hvp["c"].numpy()
    g = dist.gradient(initial, STEPS, loss=loss, running_loss=running, schedule=sp.Revolve(STEPS, 3))
    saved["gradient_loss"] = np.array(g.loss)
    for name in ("u", "u_prev"):
        saved[f"gradient_{name}"] = dist.gather(g.grads[name])
    saved["gradient_c"] = g.grads["c"].numpy()
    model, dist = mw.distributed_model(grid=grid, overlap=True)
    save_hvp(dist, saved, "overlap", dist.hvp(initial, STEPS, d, loss=loss, running_loss=running,
                                              schedule=sp.Revolve(STEPS, 3)))
    saved["overlapped"] = np.array(dist.overlapped)
    saved["errors"] = np.array(refused(dist, initial, loss))      # strings: loadable without pickle
    if dist.rank == 0:
        np.savez(os.path.join(outdir, "second_order.npz"), **saved)


def refused(dist, initial, loss) -> list:
    """The messages of a direction holding the global array of a state, and of a parameter direction
    that differs on rank 1 (the same ModelError on every rank, so none waits for the others)."""
    messages = []
    wrong = [{"u": sp.array(mw.initial_global()["u"], dtype=F)},
             {"c": sp.array([0.02 + 0.01 * (dist.rank == 1)], dtype=F)}]
    for direction in wrong:
        try:
            dist.hvp(initial, STEPS, direction, loss=loss)
        except sp.ModelError as exc:
            messages.append(str(exc))
    everyone = dist.comm.allgather(messages)
    return everyone


def save_hvp(dist, saved, key, h):
    saved[f"{key}_loss"] = np.array(h.loss)
    for name in ("u", "u_prev"):
        saved[f"{key}_hvp_{name}"] = dist.gather(h.hvp[name])
        saved[f"{key}_grad_{name}"] = dist.gather(h.grads[name])
    saved[f"{key}_hvp_c"] = h.hvp["c"].numpy()
    saved[f"{key}_grad_c"] = h.grads["c"].numpy()


if __name__ == "__main__":
    run(sys.argv[1], tuple(int(k) for k in sys.argv[2].split("x")) if len(sys.argv) > 2 else None)
