"""Domain decomposition over MPI: `mpiexec -n P` runs tests/mpi_wave.py as a subprocess (with a
timeout, in its own process group), and its results are compared with the one-process model here.

Needs mpi4py and an MPI (``pip install mpi4py mpich``); skipped with that reason without them.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest

import stepper as sp
from checkpoint.storage.checkpoint_dir import checkpoint_file, list_checkpoints

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import mpi_wave as mw  # noqa: E402

MPIEXEC = shutil.which("mpiexec")
needs_mpi = pytest.mark.skipif(
    importlib.util.find_spec("mpi4py") is None or MPIEXEC is None,
    reason="needs mpi4py and mpiexec (pip install mpi4py mpich, or pip install -e '.[mpi]')")
TIMEOUT = 180          # seconds for one mpiexec job: far above what it takes, so only a hang reaches it


def mpiexec(ranks: int, mode: str, outdir, script=os.path.join(HERE, "mpi_wave.py")) -> subprocess.CompletedProcess:
    """Run `script` MODE OUTDIR (default tests/mpi_wave.py; MODE may be a list of arguments) on `ranks`
    ranks; kill the whole job if it outlives TIMEOUT."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])),
               STEPPER_PROGRESS="0")
    args = [mode, str(outdir)] if isinstance(mode, str) else list(mode)
    cmd = [MPIEXEC, "-n", str(ranks), sys.executable, script, *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"mpiexec -n {ranks} {os.path.basename(script)} {mode} did not end within {TIMEOUT} s (a hang)\n{err[-3000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@pytest.fixture(scope="module", params=[1, 2, 4, (1, 2), (2, 2)],
                ids=lambda p: f"{p}ranks" if isinstance(p, int) else f"grid{p[0]}x{p[1]}")
def job(request, tmp_path_factory):
    """Rows split over 1, 2 or 4 ranks; columns over 2 (a 1 x 2 grid); both axes over a 2 x 2 grid."""
    grid = request.param
    ranks = grid if isinstance(grid, int) else int(np.prod(grid))
    outdir = tmp_path_factory.mktemp(f"mpi{ranks}")
    args = ["run", str(outdir)] if isinstance(grid, int) else ["run", str(outdir), "x".join(map(str, grid))]
    done = mpiexec(ranks, args, outdir)
    assert done.returncode == 0, f"mpiexec -n {ranks} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return ranks, outdir, dict(np.load(outdir / "result.npz"))


@pytest.fixture(scope="module")
def serial():
    """The same wave on one process, with the plain (undecomposed) kernel."""
    model = mw.serial_model()
    initial = {k: sp.array(v, dtype=mw.F) for k, v in mw.initial_global().items()}
    final = model.rollout(initial, mw.STEPS)
    observed = sp.array(mw.observed_global(), dtype=mw.F)
    result = model.gradient(initial, mw.STEPS, loss=mw.misfit_loss(observed, (mw.N, mw.M)),
                            schedule=sp.StoreAll(mw.STEPS))
    return {"u": final.u.numpy().copy(), "u_prev": final.u_prev.numpy().copy(), "loss": result.loss,
            "grads": {n: g.numpy().copy() for n, g in result.grads.items()}}


@needs_mpi
def test_decomposed_rollout_equals_the_single_process_rollout_bit_for_bit(job, serial):
    _, _, got = job
    np.testing.assert_array_equal(got["rollout_u"], serial["u"])
    np.testing.assert_array_equal(got["rollout_u_prev"], serial["u_prev"])


@needs_mpi
def test_decomposed_gradient_equals_the_single_process_gradient(job, serial):
    _, _, got = job
    for name in ("u", "u_prev", "c"):
        ref = serial["grads"][name]
        assert np.abs(ref).max() > 1e-3                     # not a vacuous comparison
        err = np.abs(got[f"storeall_{name}"] - ref).max() / np.abs(ref).max()
        assert err <= 1e-12, f"grads['{name}'] differs from the single-process gradient by {err:.3g} (relative)"
    assert abs(float(got["storeall_loss"]) - serial["loss"]) <= 1e-12 * abs(serial["loss"])


@needs_mpi
def test_schedules_agree_bit_for_bit_on_the_same_rank_count(job):
    ranks, outdir, got = job
    for schedule in ("revolve", "multilevel"):
        for name in ("u", "u_prev", "c"):
            np.testing.assert_array_equal(got[f"{schedule}_{name}"], got[f"storeall_{name}"])
        assert float(got[f"{schedule}_loss"]) == float(got["storeall_loss"])
    assert int(got["multilevel_disk_writes"]) > 0             # the disk tier really was used
    names = ["run.h5"] if ranks == 1 else [f"run.rank{r:04d}.h5" for r in range(ranks)]
    assert sorted(p.name for p in outdir.glob("run*.h5")) == names


@needs_mpi
def test_a_rollout_recorded_on_a_tape_reduces_over_ranks_like_dist_gradient(job):
    _, _, got = job
    assert float(got["tape_loss"][0]) == float(got["storeall_loss"])
    for name in ("u", "u_prev", "c"):
        np.testing.assert_array_equal(got[f"tape_{name}"], got[f"storeall_{name}"])


@needs_mpi
def test_every_rank_gets_the_same_global_loss_and_parameter_gradient(job):
    _, _, got = job
    for schedule in ("storeall", "revolve", "multilevel"):
        assert bool(got[f"{schedule}_ranks_agree"])


@needs_mpi
def test_launches_overlapping_their_exchange_give_the_same_bits(job):
    """dist.launch(kernel, ..., inputs=[dist.halo(s, "u"), ...]) runs the rows away from the faces
    while the halos travel: the rollout and gradients are those of dist.exchange + sp.launch."""
    _, _, got = job
    for name in ("u", "u_prev"):
        np.testing.assert_array_equal(got[f"overlap_rollout_{name}"], got[f"rollout_{name}"])
    for schedule in ("storeall", "revolve"):
        for name in ("u", "u_prev", "c"):
            np.testing.assert_array_equal(got[f"overlap_{schedule}_{name}"], got[f"storeall_{name}"])
        assert float(got[f"overlap_{schedule}_loss"]) == float(got["storeall_loss"])
    for launches, exchanges in got["overlapped"]:
        # every forward step's launch ran in parts (the adjoint exchanges are not overlapped)
        assert launches > 0 and exchanges > launches


@needs_mpi
def test_exchanged_halos_hold_the_neighbours_values_corners_included(job):
    assert bool(job[2]["halos_match"])


@needs_mpi
def test_halo_exchange_adjoint_passes_dot_product_and_finite_difference_checks(job):
    adjoint_side, forward_side, fd = job[2]["exchange"]
    assert abs(forward_side) > 1.0
    assert abs(adjoint_side - forward_side) <= 1e-12 * abs(forward_side)     # <w, E d> == <E^T w, d>
    assert abs(fd - adjoint_side) <= 1e-9 * abs(forward_side)               # E is linear: FD exact but rounding


@needs_mpi
def test_until_holding_on_one_rank_stops_every_rank_at_the_same_step(job, serial_7):
    ranks, _, got = job
    assert got["until_steps"].tolist() == [7] * ranks
    assert got["online_steps"].tolist() == [7] * ranks
    err = np.abs(got["online_u"] - serial_7).max() / np.abs(serial_7).max()
    assert err <= 1e-12


@pytest.fixture(scope="module")
def serial_7():
    model = mw.serial_model()
    initial = {k: sp.array(v, dtype=mw.F) for k, v in mw.initial_global().items()}
    observed = sp.array(mw.observed_global(), dtype=mw.F)
    return model.gradient(initial, 7, loss=mw.misfit_loss(observed, (mw.N, mw.M)),
                          schedule=sp.StoreAll(7)).grads["u"].numpy().copy()


@pytest.fixture(scope="module")
def members_one_by_one():
    """Each member's gradient on one process, one after the other (shared c, then each with its own c)."""
    model = mw.serial_model()
    c = model.params["c"]
    shared, own = [], []
    for k in range(mw.MEMBERS):
        m = mw.member(k)
        shared.append(model.gradient(m.initial, mw.STEPS, loss=m.loss, schedule=sp.Revolve(mw.STEPS, 3)))
        m = mw.member(k, own_c=True)
        c.assign(m.params["c"])
        own.append(model.gradient(m.initial, mw.STEPS, loss=m.loss))
        c.assign(np.array([0.25]))
    return shared, own


@needs_mpi
def test_ensemble_gradient_equals_the_sum_of_members_computed_one_by_one(job, members_one_by_one):
    ranks, _, got = job
    shared, own = members_one_by_one
    total_loss, total_c = shared[0].loss, shared[0].grads["c"].numpy().copy()
    for r in shared[1:]:
        total_loss += r.loss
        total_c = total_c + r.grads["c"].numpy()
    assert float(got["ensemble_loss"]) == total_loss                  # bit for bit: summed in member order
    np.testing.assert_array_equal(got["ensemble_c"], total_c)
    assert got["ensemble_losses"].tolist() == [r.loss for r in shared]
    for k in range(mw.MEMBERS):
        np.testing.assert_array_equal(got[f"ensemble_u_{k}"], shared[k].grads["u"].numpy())
        np.testing.assert_array_equal(got[f"ensemble_own_c_{k}"], own[k].grads["c"].numpy())
    assert not bool(got["ensemble_own_has_shared_c"])                 # c is every member's own there
    assert got["ensemble_members_per_rank"].tolist() == {1: [5], 2: [3, 2], 4: [2, 1, 1, 1]}[ranks]


@needs_mpi
@pytest.mark.parametrize("grid", [1, 2, (1, 2)], ids=["1rank", "2ranks", "grid1x2"])
def test_blocks_on_a_gpu_exchange_through_the_host(tmp_path, serial, grid, monkeypatch):
    """On the CUDA simulator (a real GPU where there is one): the decomposed rollout and gradient
    are those of the same ranks on the CPU, bit for bit (so the rollout is the one-process one's,
    the gradient within 1e-12 of it); split by rows (face rows through the host) and over a grid
    (whole host copies)."""
    from compiler.runtime.device import is_cuda_available
    if not is_cuda_available():
        monkeypatch.setenv("STEPPER_CUDA_SIM", "1")
    ranks = grid if isinstance(grid, int) else int(np.prod(grid))
    done = mpiexec(ranks, ["gpu", str(tmp_path)] + ([] if isinstance(grid, int) else ["x".join(map(str, grid))]), None)
    assert done.returncode == 0, f"mpiexec -n {ranks} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    got = dict(np.load(tmp_path / "gpu.npz"))
    assert str(got["cuda_device"]).startswith("cuda") and int(got["cuda_overlapped"]) > 0
    np.testing.assert_array_equal(got["cuda_rollout_u"], serial["u"])
    for name in ("grad_u", "grad_u_prev", "grad_c", "loss"):
        np.testing.assert_array_equal(got[f"cuda_{name}"], got[f"cpu_{name}"])
    ref = serial["grads"]["u"]
    assert np.abs(got["cuda_grad_u"] - ref).max() <= 1e-12 * np.abs(ref).max()


@needs_mpi
def test_a_rank_that_raises_ends_every_rank_with_its_error(tmp_path):
    done = mpiexec(2, "raise", tmp_path)          # fails the test if the job hangs past TIMEOUT
    assert done.returncode != 0
    assert "stepper.distributed: rank 1 of 2 raised; aborting every rank" in done.stderr
    assert "ValueError: rank 1 cannot go on at step 5" in done.stderr


@needs_mpi
def test_ranks_measuring_different_disk_costs_still_plan_one_schedule(tmp_path):
    """A MultiLevel without costs is priced on each rank's own disk; rank 1's looks 100x slower. The
    ranks agree on the costs (the maximum), so they run one schedule and the job ends."""
    done = mpiexec(2, "priced", tmp_path)          # fails the test if the job hangs past TIMEOUT
    assert done.returncode == 0, done.stderr[-3000:]
    counts = np.load(tmp_path / "priced.npy")
    assert (counts == counts[0]).all()


@needs_mpi
def test_a_rank_killed_mid_gradient_ends_the_job_without_a_hang(tmp_path):
    """SIGKILL leaves the rank no chance to abort the others: mpiexec must end the job (the test
    fails if it hangs past TIMEOUT), with an error, while rank 0 waits on its halo exchange."""
    done = mpiexec(2, "kill", tmp_path)
    assert done.returncode != 0
    said = (done.stdout + done.stderr).lower()
    assert "signal 9" in said or "killed" in said       # the launcher names the kill (MPICH: "Killed (signal 9)")
    assert "ValueError" not in done.stderr              # the killed rank said nothing; the job still ended


@needs_mpi
@pytest.mark.parametrize("mode", ["checkpoint", "checkpoint-kill"])
def test_checkpoints_before_a_failing_rank_are_kept_and_resume_only_on_the_same_decomposition(tmp_path, mode):
    done = mpiexec(2, mode, tmp_path)       # rank 1 raises or is killed at step 10; checkpoints every 4 steps
    assert done.returncode != 0
    assert mode == "checkpoint-kill" or "ValueError: rank 1 cannot go on at step 10" in done.stderr
    model = mw.serial_model()
    initial = {k: sp.array(v, dtype=mw.F) for k, v in mw.initial_global().items()}
    # What each rank kept: complete snapshots, each its block of the one-process state, bit for bit. Rank 1
    # wrote step 8 before failing at step 10; rank 0 was killed, so its last write may be cut.
    last = []
    for rank, (offset, rows) in enumerate([(0, 7), (7, 6)]):
        directory = tmp_path / f"run.rank{rank:04d}.ckpt"
        kept = list_checkpoints(directory)
        assert kept and set(kept) <= {0, 4, 8} and (rank == 0 or 8 in kept)
        for n in kept:
            store = sp.HDF5Storage(checkpoint_file(directory, n), mode="r")
            try:
                snap, expected = store.read(n), model.rollout(initial, n) if n else initial
                for name in ("u", "u_prev"):
                    np.testing.assert_array_equal(snap.arrays[name], expected[name].numpy()[offset:offset + rows])
            finally:
                store.close()
        last.append(kept[-1])
    assert mpiexec(4, "resume", tmp_path).returncode == 0
    messages = np.load(tmp_path / "resume_error4.npy", allow_pickle=True)
    assert len(set(messages)) == 1 and messages[0].startswith(
        f"resume('{tmp_path / 'run.ckpt'}'): the checkpoints were written by 2 rank(s) with 'u' (13, 9) in blocks "
        f"(offset, rows) (0, 7), (7, 6)")
    assert messages[0].endswith("resume with mpiexec -n 2 and the same states")
    resumed = mpiexec(2, "resume", tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    got = np.load(tmp_path / "resumed.npz")
    final = model.rollout(initial, mw.STEPS)
    np.testing.assert_array_equal(got["u"], final.u.numpy())
    np.testing.assert_array_equal(got["u_prev"], final.u_prev.numpy())
    common = min(last)                              # the last step both ranks have a snapshot of
    assert got["steps"].tolist() == [[mw.STEPS, mw.STEPS - common]] * 2


@needs_mpi
def test_bad_decompositions_are_clear_errors_on_every_rank(tmp_path):
    done = mpiexec(4, "errors", tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    everyone = np.load(tmp_path / "errors.npy", allow_pickle=True)
    for messages in everyone:
        assert len(messages) == 5
        assert messages[0] == ("state 'u': halo 4 is wider than the thinnest block (3 rows of 13 over 4 ranks); a "
                               "halo comes from the next rank only, so use fewer ranks or a smaller halo")
        assert messages[1].startswith("rollout: rank 1 declares or runs something else than rank 0")
        assert "(14, 9)" in messages[1] and "(13, 9)" in messages[1]
        assert messages[2] == ("grid (3, 2) does not fit 4 rank(s): its counts multiply to 6; run with mpiexec -n 6 "
                               "or give a grid whose counts multiply to 4")
        assert messages[3] == ("state 'v': shape (13,) has fewer axes than the grid of ranks (2, 2) splits; give "
                               "Distributed a grid with at most 1 axes")
        assert messages[4].startswith("sum_grads: an array without a gradient")


@needs_mpi
def test_wave_mpi_example_on_two_ranks_follows_the_one_rank_run(tmp_path):
    args = ["--size", "12", "--steps", "100", "--iterations", "2", "--ram", "3", "--disk", "4"]
    losses = {}
    for ranks in (1, 2):
        done = mpiexec(ranks, args, None, script=os.path.join(ROOT, "examples", "wave_mpi.py"))
        assert done.returncode == 0, done.stderr[-4000:]
        losses[ranks] = [float(v) for v in done.stdout.split("losses:")[1].split()]
    assert losses[2][-1] < 0.2 * losses[2][0]
    # float32 misfits summed per rank then over ranks: the same to rounding, not to the bit
    np.testing.assert_allclose(losses[2], losses[1], rtol=1e-5)


def test_missing_mpi4py_is_a_clear_error(monkeypatch):
    from stepper.distributed import require_mpi
    monkeypatch.setitem(sys.modules, "mpi4py", None)       # import mpi4py now raises ImportError
    with pytest.raises(sp.ModelError, match=r"needs mpi4py and an MPI library .*pip install mpi4py mpich"):
        require_mpi()


def test_block_partition_and_per_rank_paths():
    from stepper.distributed.domain import block_rows, rank_path
    assert [block_rows(13, 4, r) for r in range(4)] == [(0, 4), (4, 3), (7, 3), (10, 3)]
    assert [block_rows(13, 2, r) for r in range(2)] == [(0, 7), (7, 6)]
    assert rank_path("out/run.h5", 3, 4) == "out/run.rank0003.h5"
    assert rank_path("out/run.h5", 0, 1) == "out/run.h5"
