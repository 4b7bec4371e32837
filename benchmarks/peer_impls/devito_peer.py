"""Devito's side of benchmarks/fwi.py: its own 2-D and 3-D acoustic examples (examples.seismic,
'layers-isotropic', a Ricker source, a receiver per grid column, a damping layer of NBL points)
build the problem, and its solver runs the forward, the store-all gradient (`forward(save=True)` +
`jacobian_adjoint`) and the checkpointed one (`jacobian_adjoint` driven by pyrevolve's Revolver).
Needs the bench extra (devito, pyrevolve; Devito's `examples` package imports scipy, pytest and
matplotlib)."""
import os

import numpy as np

NBL = 20
SPACING = 10.0
TN = 1000.0                         # ms, Devito's 2-D example
TN3 = 300.0                         # ms, its 3-D one


def acoustic_solver(n: int, order: int, dtype, ndim: int = 2):
    """Devito's AcousticWaveSolver for its example at `n` points a side (plus the damping layer)."""
    os.environ.setdefault("DEVITO_LOGGING", "ERROR")
    from examples.seismic.acoustic.acoustic_example import acoustic_setup
    return acoustic_setup(shape=(n,) * ndim, spacing=(SPACING,) * ndim, nbl=NBL, tn=TN if ndim == 2 else TN3,
                          space_order=order, preset="layers-isotropic", dtype=dtype)


def _smooth(vp: np.ndarray) -> np.ndarray:
    """The starting model: the true one blurred (a 21-point box filter along each axis)."""
    out = vp.astype(np.float64)
    k = np.ones(21) / 21
    for axis in range(out.ndim):
        out = np.apply_along_axis(lambda v: np.convolve(np.pad(v, 10, mode="edge"), k, mode="valid"), axis, out)
    return out


def build_problem(n: int, order: int, dtype, path: str, ndim: int = 2) -> None:
    """Write the problem's arrays to `path` (.npz), in `dtype`."""
    solver = acoustic_solver(n, order, dtype, ndim)
    model, geometry = solver.model, solver.geometry
    rec_true, _, _ = solver.forward(save=False)
    vp_true = np.array(model.vp.data)                                   # the padded grid, no halo
    vp0 = _smooth(vp_true)
    origin = np.array(model.origin, np.float64) - NBL * SPACING          # the padded grid's corner
    src = (geometry.src_positions[0] - origin) / SPACING
    corner = np.floor(src).astype(int)
    p = src - corner
    corners = np.stack(np.meshgrid(*([[0, 1]] * ndim), indexing="ij"), -1).reshape(-1, ndim)
    weights = np.prod(np.where(corners == 1, p, 1 - p), axis=1)        # multilinear, Devito's order
    rec = np.rint((geometry.rec_positions - origin) / SPACING).astype(int)
    nt = geometry.nt
    np.savez(path, m0=(1.0 / vp0**2).astype(dtype), vp0=vp0.astype(dtype), damp=np.array(model.damp.data),
             dt=geometry.dt, spacing=SPACING, nt=nt, order=order, n=n,
             wavelet=np.array(geometry.src.data[1:nt - 1, 0]),          # step k injects Devito's time k + 1
             observed=np.array(rec_true.data[1:nt - 1]), observed_full=np.array(rec_true.data),
             src_index=corner, src_weights=weights, rec_index=rec)


def runner(problem: dict, mode: str, snapshots: int | None):
    """(a function running `mode` once, what it reports): the worker times the second call."""
    from devito import Function, TimeFunction
    from devito.checkpointing import CheckpointOperator, DevitoCheckpoint
    from pyrevolve import Revolver
    n, order = int(problem["n"]), int(problem["order"])
    dtype = problem["m0"].dtype.type
    solver = acoustic_solver(n, order, dtype, problem["m0"].ndim)
    vp0 = Function(name="vp0", grid=solver.model.grid, space_order=order)
    vp0.data[:] = problem["vp0"]
    observed = problem["observed_full"]
    geometry = solver.geometry
    residual = geometry.rec
    info = {}

    def forward():
        rec, _, _ = solver.forward(save=False, vp=vp0)
        return float(0.5 * np.sum((rec.data[1:-1] - observed[1:-1]) ** 2))

    def storeall():
        rec, u, _ = solver.forward(save=True, vp=vp0)
        residual.data[:] = rec.data - observed
        grad, _ = solver.jacobian_adjoint(residual, u, vp=vp0)
        return np.array(grad.data)

    def revolve():
        grad = Function(name="grad", grid=solver.model.grid)
        u = TimeFunction(name="u", grid=solver.model.grid, time_order=2, space_order=order)
        v = TimeFunction(name="v", grid=solver.model.grid, time_order=2, space_order=order)
        rec = geometry.new_rec(name="rec_pred")
        cp = DevitoCheckpoint([u])
        fw = CheckpointOperator(solver.op_fwd(save=False), src=geometry.src, u=u, rec=rec, vp=vp0, dt=solver.dt)
        rv = CheckpointOperator(solver.op_grad(save=False), u=u, v=v, rec=residual, grad=grad, vp=vp0,
                                dt=solver.dt)
        wrp = Revolver(cp, fw, rv, snapshots, residual.data.shape[0] - 2)
        info["snapshots"] = int(wrp.n_checkpoints) if hasattr(wrp, "n_checkpoints") else snapshots
        wrp.apply_forward()
        residual.data[:] = rec.data - observed
        wrp.apply_reverse()
        return np.array(grad.data)

    return {"forward": forward, "storeall": storeall, "revolve": revolve}[mode], info

