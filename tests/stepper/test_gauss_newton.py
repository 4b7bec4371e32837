"""The Gauss-Newton product `Model.hvp(..., gauss_newton=True)` and `f.gauss_newton` (issue 30).

On the chain of cubic springs (float64), with the weighted least-squares loss
L = sum (x - target)^2 + 0.5 sum v^2 of the final state (Hessian H_L = diag(2, 1) in (x, v)), the
product must be J^T H_L J v with J the dense float64 Jacobian of the final state with respect to
the initial states and both parameters, built column by column from `Model.jvp`.
"""
import numpy as np
import pytest

import stepper as sp
from stepper_models import chain_initial, chain_model

STEPS, N = 24, 16
F64 = sp.array(dtype=sp.float64)
TARGET = np.linspace(-1.0, 1.0, N)


@sp.kernel
def least_squares(x: F64, v: F64, x_target: F64, v_target: F64, out: F64):
    i = sp.tid()
    d = x[i] - x_target[i]
    e = v[i] - v_target[i]
    sp.atomic_add(out, 0, d * d + 0.5 * e * e)


def misfit(x_target, v_target):
    def loss(state):
        out = sp.zeros(1, dtype=sp.float64, device=state.x.device)
        targets = [sp.array(t, dtype=sp.float64, device=state.x.device) for t in (x_target, v_target)]
        sp.launch(least_squares, N, inputs=[state.x, state.v, *targets], outputs=[out])
        return out
    return loss


loss = misfit(TARGET, np.zeros(N))


INPUTS = (("x", N), ("v", N), ("k", 2), ("c", 1))


def _split(flat, device):
    out, at = {}, 0
    for name, size in INPUTS:
        out[name] = sp.array(flat[at:at + size], dtype=sp.float64, device=device)
        at += size
    return out


def _dense_gauss_newton(model, initial, device):
    """J^T H_L J from the jvp of every unit vector of the inputs (x0, v0, k, c)."""
    size = sum(s for _, s in INPUTS)
    columns = []
    for j in range(size):
        e = np.zeros(size)
        e[j] = 1.0
        t = model.jvp(initial, STEPS, tangents=_split(e, device)).tangents
        columns.append(np.concatenate([t["x"].numpy(), t["v"].numpy()]))
    jac = np.stack(columns, axis=1)
    weights = np.concatenate([np.full(N, 2.0), np.full(N, 1.0)])
    return jac.T @ (weights[:, None] * jac)


def _flat(result):
    return np.concatenate([result.hvp[name].numpy().ravel() for name, _ in INPUTS])


def test_gauss_newton_product_is_the_dense_jacobians_jt_hl_j_v(device):
    model, initial = chain_model(device=device), chain_initial(device=device)
    dense = _dense_gauss_newton(model, initial, device)
    assert np.linalg.eigvalsh(dense).min() > -1e-9 * np.abs(dense).max()      # J^T H_L J is semi-definite
    rng = np.random.default_rng(1)
    for _ in range(2):
        v = rng.standard_normal(dense.shape[0])
        got = model.hvp(initial, STEPS, _split(v, device), loss=loss, gauss_newton=True)
        ref = dense @ v
        np.testing.assert_allclose(_flat(got), ref, rtol=0, atol=1e-12 * np.abs(ref).max())
        g = model.gradient(initial, STEPS, loss=loss)
        assert got.loss == g.loss
        for name in g.grads:
            np.testing.assert_array_equal(got.grads[name].numpy(), g.grads[name].numpy())
    # not the Hessian: the chain's own curvature is what Gauss-Newton leaves out
    full = model.hvp(initial, STEPS, _split(v, device), loss=loss)
    assert np.abs(_flat(full) - ref).max() > 1e-3 * np.abs(ref).max()


def test_gauss_newton_same_bits_under_every_schedule(device, tmp_path):
    model, initial = chain_model(device=device), chain_initial(device=device)
    d = _split(np.random.default_rng(2).standard_normal(2 * N + 3), device)
    runs = {"store_all": dict(schedule=sp.StoreAll(STEPS)), "revolve": dict(schedule=sp.Revolve(STEPS, 3)),
            "multilevel_hdf5": dict(schedule=lambda n: sp.MultiLevel(n, 2, 4, write_cost=0.5, read_cost=0.5),
                                    storage=tmp_path / "gn.h5")}
    results = {k: model.hvp(initial, STEPS, d, loss=loss, gauss_newton=True, **o) for k, o in runs.items()}
    ref = results.pop("store_all")
    assert results["multilevel_hdf5"].stats.snapshots_written(sp.StorageType.DISK) > 0
    for res in results.values():
        np.testing.assert_array_equal(_flat(res), _flat(ref))


def fitting_problem():
    """(model, initial, loss): k and c to fit to a rollout made with other values (a zero-residual
    least-squares problem; the truth is k = (4.4, 0.4), c = 0.1, the start k = (4.0, 0.5))."""
    model, initial = chain_model(), chain_initial()
    model.params["k"].assign(np.array([4.4, 0.4]))
    truth = model.rollout(initial, STEPS)
    fit = misfit(truth.x.numpy().copy(), truth.v.numpy().copy())
    model.params["k"].assign(np.array([4.0, 0.5]))
    return model, initial, fit


def test_value_and_grad_gauss_newton_matches_hvp_and_drives_newton_cg():
    scipy_optimize = pytest.importorskip("scipy.optimize")
    model, initial, loss = fitting_problem()
    f = sp.value_and_grad(model, initial, STEPS, loss=loss, params=["k", "c"])
    p = np.array([0.3, -1.0, 0.5])
    got = f.gauss_newton(f.x0, p)
    d = {"k": sp.array(p[:2], dtype=sp.float64), "c": sp.array(p[2:], dtype=sp.float64)}
    ref = model.hvp(initial, STEPS, d, loss=loss, gauss_newton=True, gradient=False).hvp
    np.testing.assert_array_equal(got, np.concatenate([ref["k"].numpy(), ref["c"].numpy()]))
    start = f(f.x0)[0]
    res = scipy_optimize.minimize(f, f.x0, jac=True, hessp=f.gauss_newton, method="Newton-CG",
                                  options={"maxiter": 10})
    assert res.fun < 1e-6 * start and res.nhev > 0
    np.testing.assert_allclose(res.x, [4.4, 0.4, 0.1], rtol=1e-2)      # k[1] is the least determined


def test_gauss_newton_refuses_running_losses_and_bad_directions():
    model, initial = chain_model(), chain_initial()

    def running(s):
        return loss(s.next)
    with pytest.raises(sp.ModelError, match="gauss_newton=True. needs a terminal loss= and no running_loss="):
        model.hvp(initial, 2, {"k": sp.zeros(2, dtype=sp.float64)}, loss=loss, running_loss=running, gauss_newton=True)
    with pytest.raises(sp.ModelError, match="gauss_newton=True. needs a terminal loss="):
        model.hvp(initial, 2, {"k": sp.zeros(2, dtype=sp.float64)}, running_loss=running, gauss_newton=True)
    with pytest.raises(sp.ModelError, match=r"direction\['k'\] has shape \(3,\) of float64, but it must match"):
        model.hvp(initial, 2, {"k": sp.zeros(3, dtype=sp.float64)}, loss=loss, gauss_newton=True)
    with pytest.raises(sp.ModelError, match="direction names 'kappa', which is neither a state nor a parameter"):
        model.hvp(initial, 2, {"kappa": sp.zeros(2, dtype=sp.float64)}, loss=loss, gauss_newton=True)
