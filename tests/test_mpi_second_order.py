"""jvp and hvp of a domain-decomposed model (issue 30): `mpiexec -n P` runs
tests/mpi_second_order.py on the wave of tests/mpi_wave.py split over 2 and 4 ranks and over a
2 x 2 grid, and its gathered results are compared with the one-process model's here.

The rollout's tangent is the one-process tangent bit for bit (every element is computed by the
same arithmetic; only sums over ranks are added in another order); the losses, gradients and
Hessian-vector products agree to 1e-12, and on one rank count every schedule and tier gives the
same bits. Needs mpi4py and mpiexec; skipped with that reason without them.
"""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import stepper as sp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import mpi_second_order as mso  # noqa: E402
import mpi_wave as mw  # noqa: E402
from test_mpi import mpiexec, needs_mpi  # noqa: E402


@pytest.fixture(scope="module", params=[2, 4, (2, 2)],
                ids=lambda p: f"{p}ranks" if isinstance(p, int) else f"grid{p[0]}x{p[1]}")
def job(request, tmp_path_factory):
    grid = request.param
    ranks = grid if isinstance(grid, int) else int(np.prod(grid))
    outdir = tmp_path_factory.mktemp(f"second_order{ranks}")
    args = [str(outdir)] + ([] if isinstance(grid, int) else ["x".join(map(str, grid))])
    done = mpiexec(ranks, args, outdir, script=os.path.join(HERE, "mpi_second_order.py"))
    assert done.returncode == 0, f"mpiexec -n {ranks} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return ranks, outdir, dict(np.load(outdir / "second_order.npz"))


@pytest.fixture(scope="module")
def serial():
    """The same jvp and hvp on one process, with the undecomposed kernel."""
    model = mw.serial_model()
    initial = {k: sp.array(v, dtype=mw.F) for k, v in mw.initial_global().items()}
    observed = sp.array(mw.observed_global(), dtype=mw.F)
    loss = mw.misfit_loss(observed, (mw.N, mw.M))
    running = mso.running_misfit(observed, (mw.N, mw.M))
    d = {n: sp.array(v, dtype=mw.F) for n, v in mso.direction_global().items()}
    r = model.jvp(initial, mw.STEPS, tangents=d, loss=loss, running_loss=running)
    h = model.hvp(initial, mw.STEPS, d, loss=loss, running_loss=running, schedule=sp.StoreAll(mw.STEPS))
    gn = model.hvp(initial, mw.STEPS, d, loss=loss, gauss_newton=True, gradient=False)
    return r, h, gn


def _close(got, ref, what):
    ref = np.asarray(ref)
    assert np.abs(ref).max() > 1e-6, f"{what}: a vacuous comparison"
    err = np.abs(np.asarray(got) - ref).max() / np.abs(ref).max()
    assert err <= 1e-12, f"{what} differs from the one-process value by {err:.3g} (relative)"


@needs_mpi
def test_decomposed_jvp_carries_the_single_process_tangent_bit_for_bit(job, serial):
    _, _, got = job
    r, _, _ = serial
    for name in ("u", "u_prev"):
        np.testing.assert_array_equal(got[f"jvp_final_{name}"], r.final[name].numpy())
        np.testing.assert_array_equal(got[f"jvp_tangent_{name}"], r.tangents[name].numpy())
    loss, loss_tangent = got["jvp_loss"]
    _close(loss, r.loss, "jvp loss")
    _close(loss_tangent, r.loss_tangent, "jvp loss_tangent")


@needs_mpi
def test_decomposed_hvp_equals_the_single_process_hvp(job, serial):
    _, _, got = job
    _, h, _ = serial
    for name in ("u", "u_prev", "c"):
        _close(got[f"storeall_hvp_{name}"], h.hvp[name].numpy(), f"hvp['{name}']")
        _close(got[f"storeall_grad_{name}"], h.grads[name].numpy(), f"grads['{name}']")
    _close(got["storeall_loss"], h.loss, "hvp loss")


@needs_mpi
def test_decomposed_hvp_is_the_same_bits_under_every_schedule_tier_and_overlap(job):
    ranks, outdir, got = job
    for key in ("revolve", "multilevel", "overlap"):
        for name in ("u", "u_prev", "c"):
            np.testing.assert_array_equal(got[f"{key}_hvp_{name}"], got[f"storeall_hvp_{name}"])
            np.testing.assert_array_equal(got[f"{key}_grad_{name}"], got[f"storeall_grad_{name}"])
        assert float(got[f"{key}_loss"]) == float(got["storeall_loss"])
    assert int(got["multilevel_disk_writes"]) > 0                   # the disk tier really was used
    assert int(got["overlapped"]) > 0                               # and the launches ran in parts
    assert sorted(p.name for p in outdir.glob("hvp*.h5")) == [f"hvp.rank{r:04d}.h5" for r in range(ranks)]


@needs_mpi
def test_decomposed_hvp_grads_are_dist_gradient_bits_and_every_rank_agrees(job):
    _, _, got = job
    for name in ("u", "u_prev", "c"):
        np.testing.assert_array_equal(got[f"revolve_grad_{name}"], got[f"gradient_{name}"])
    assert float(got["revolve_loss"]) == float(got["gradient_loss"])
    for key in ("storeall", "revolve", "multilevel"):
        assert bool(got[f"{key}_ranks_agree"])


@needs_mpi
def test_decomposed_gauss_newton_product_equals_the_single_process_one(job, serial):
    _, _, got = job
    _, _, gn = serial
    for name in ("u", "u_prev", "c"):
        _close(got[f"gauss_newton_{name}"], gn.hvp[name].numpy(), f"Gauss-Newton product ['{name}']")


@needs_mpi
def test_a_wrong_direction_is_the_same_error_on_every_rank(job):
    ranks, _, got = job
    everyone = got["errors"].tolist()
    assert len(everyone) == ranks and all(m == everyone[0] for m in everyone)
    block_shape, param = everyone[0]
    assert block_shape.startswith("rank 0: direction['u'] has shape (13, 9) of float64, but it must match its array")
    assert block_shape.endswith("(a distributed state's tangent is this rank's block: dist.scatter({name: global}) gives it)")
    assert param.startswith("direction['c'] differs between rank 0 and rank 1: 'c' is a parameter every rank holds")
