"""Nothing lost, nothing crashes: a full disk, a second writer and files that are not ours.

Whatever can crash runs in a child process (fault_child.py), so that a crash fails a test instead of
killing pytest; the parent then checks what was kept, bit for bit.
"""
import os
import signal
import subprocess
import sys

import h5py
import numpy as np
import pytest

import stepper as sp
from checkpoint.storage import HDF5Storage, StorageError
from checkpoint.storage.checkpoint_dir import read_checkpoint

from fault_child import snapshot

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests", "stepper"))
from stepper_models import chain_initial, chain_model, sum_squares64  # noqa: E402


def final_x_squared(state):
    out = sp.zeros(1, dtype=sp.float64)
    sp.launch(sum_squares64, 16, inputs=[state.x], outputs=[out])
    return out


def child(job, path, *args, stdin=None):
    """Start fault_child.py; stdout is a pipe of lines."""
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, os.path.join(HERE, "fault_child.py"), job, str(path), *map(str, args)],
                            stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=HERE)


def run_child(job, path, *args):
    proc = child(job, path, *args)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, f"{job} child died with {proc.returncode}: {err}"
    return out.splitlines()


def error_line(lines):
    errors = [line for line in lines if line.startswith("error ")]
    assert len(errors) == 1, lines
    return errors[0]


# -- a full disk (a file-size limit in the child) -------------------------------------------------
def test_full_disk_keeps_hdf5_snapshots_and_raises_storage_error(tmp_path):
    path = tmp_path / "scratch.h5"
    lines = run_child("hdf5_fsize", path, 4_000_000)       # room for two 1 MiB snapshots, not three
    assert lines[:2] == ["written 0", "written 1"] and lines[-1].startswith("error StorageError: ")
    assert "no room for the snapshot of step 2" in lines[-1] and "file-size limit (4000000 bytes" in lines[-1]
    assert str(path) in lines[-1]
    with HDF5Storage(path, mode="r") as store:             # the file is intact and complete
        assert store.steps() == [0, 1] and store.incomplete_steps() == []
        for step in (0, 1):
            got = store.read(step).arrays
            for name, want in snapshot(step).items():
                assert got[name].tobytes() == want.tobytes()


def test_full_disk_in_a_gradient_is_a_storage_error(tmp_path):
    lines = run_child("gradient_fsize", tmp_path / "scratch.h5", 500_000)
    assert error_line(lines).startswith("error StorageError: no room for the snapshot of step ")
    assert lines[-1] == "exit"


def test_full_disk_keeps_every_completed_rollout_checkpoint(tmp_path):
    path = tmp_path / "run.ckpt"
    lines = run_child("rollout_fsize", path, 20, 5, 1000)   # from step 5 on, no file may pass 1000 bytes
    assert lines[:5] == [f"done {n}" for n in range(1, 6)]
    assert error_line(lines).startswith(f"error StorageError: writing the checkpoint of step 6 to {path}")
    assert "file-size limit" in error_line(lines)
    assert sorted(os.listdir(path)) == ["step-000000000004.h5", "step-000000000005.h5"]   # no partial file
    reference = chain_model().rollout(chain_initial(), 5, record_every=1).history
    for n in (4, 5):
        snap = read_checkpoint(str(path / f"step-{n:012d}.h5"), n)
        for name in ("x", "v"):
            assert snap.arrays[name].tobytes() == reference[n - 1][1][name].tobytes()
    resumed = chain_model().resume(path, steps=8)
    assert resumed.stats.steps == 3
    np.testing.assert_array_equal(resumed.x.numpy(), chain_model().rollout(chain_initial(), 8).x.numpy())


# -- a second writer ------------------------------------------------------------------------------
def test_second_writer_of_an_hdf5_file_fails_without_touching_it(tmp_path):
    path = tmp_path / "scratch.h5"
    first = child("hold", path, stdin=subprocess.PIPE)
    try:
        assert first.stdout.readline() == "ready\n"
        size = os.path.getsize(path)
        for mode in ("w", "a", "r"):
            with pytest.raises(StorageError, match=f"snapshot file {path} is in use by another writer"):
                HDF5Storage(path, mode=mode)
        with pytest.raises(StorageError, match="in use by another writer"):
            chain_model().gradient(chain_initial(), 20, loss=final_x_squared, schedule=sp.MultiLevel(20, 1, 4),
                                   storage=path)
        assert os.path.getsize(path) == size                # not truncated
        first.stdin.write("go\n")
        first.stdin.flush()
        assert first.stdout.readline() == "closed\n"
    finally:
        first.stdin.close()
        first.wait(timeout=60)
    assert first.returncode == 0
    with HDF5Storage(path, mode="r") as store:             # the first job's data survived
        assert store.steps() == [0, 1]
        assert store.read(1).arrays["a"].tobytes() == snapshot(1)["a"].tobytes()


def test_second_rollout_on_the_same_checkpoints_fails_without_touching_them(tmp_path):
    path = tmp_path / "run.ckpt"
    first = child("rollout", path, 100_000)
    try:
        assert first.stdout.readline() == "done 1\n"
        with pytest.raises(StorageError, match="in use by another writer"):
            chain_model().rollout(chain_initial(), 10, checkpoint=path, checkpoint_every=1, overwrite=True)
        with pytest.raises(StorageError, match="in use by another writer"):
            chain_model().resume(path, steps=10)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    resumed = chain_model().resume(path, steps=max(sp_steps(path)) + 2)   # the first job's checkpoints
    assert resumed.stats.steps == 2


def sp_steps(path):
    return [int(name[5:17]) for name in os.listdir(path) if name.startswith("step-")]


# -- paths that hold something else ---------------------------------------------------------------
def test_rollout_refuses_a_path_that_holds_something_else(tmp_path):
    model, initial = chain_model(), chain_initial()
    text = tmp_path / "notes.txt"
    text.write_text("keep me")
    with pytest.raises(StorageError, match="is an existing file, not a checkpoint directory"):
        model.rollout(initial, 5, checkpoint=text, checkpoint_every=1)
    assert text.read_text() == "keep me"
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "data.h5").write_bytes(b"x")
    with pytest.raises(StorageError, match=r"holds files that are not checkpoints \(data.h5\)"):
        model.rollout(initial, 5, checkpoint=folder, checkpoint_every=1, overwrite=True)
    assert os.listdir(folder) == ["data.h5"]


def test_rerunning_over_a_killed_runs_checkpoints_asks_for_resume_or_overwrite(tmp_path):
    model, initial = chain_model(), chain_initial()
    path = tmp_path / "run.ckpt"
    model.rollout(initial, 5, checkpoint=path, checkpoint_every=1)
    before = {name: (path / name).read_bytes() for name in os.listdir(path)}
    with pytest.raises(StorageError, match=r"earlier run \(steps 4, 5\); continue it with model.resume\(.*\) or "
                                           r"start again with overwrite=True"):
        model.rollout(initial, 5, checkpoint=path, checkpoint_every=1)
    assert {name: (path / name).read_bytes() for name in os.listdir(path)} == before
    again = model.rollout(initial, 3, checkpoint=path, checkpoint_every=1, overwrite=True)
    assert sorted(os.listdir(path)) == ["step-000000000002.h5", "step-000000000003.h5"]
    assert again.steps == 3


def test_gradient_refuses_to_truncate_a_file_that_is_not_a_snapshot_file(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("keep me")
    foreign = tmp_path / "data.h5"
    with h5py.File(foreign, "w") as f:
        f["results"] = np.arange(3)
    for path in (text, foreign):
        with pytest.raises(StorageError, match=f"{path} holds something other than snapshots"):
            chain_model().gradient(chain_initial(), 20, loss=final_x_squared, schedule=sp.MultiLevel(20, 1, 4),
                                   storage=path)
    assert text.read_text() == "keep me"
    with h5py.File(foreign, "r") as f:
        assert f["results"][...].tolist() == [0, 1, 2]


def test_resume_refuses_checkpoints_of_another_model(tmp_path):
    path = tmp_path / "run.ckpt"
    chain_model().rollout(chain_initial(), 5, checkpoint=path, checkpoint_every=1)
    with pytest.raises(sp.ModelError, match=r"written by a model with dt=0.05, this model has dt=0.1"):
        chain_model(dt=0.1).resume(path, steps=8)
    with pytest.raises(sp.ModelError, match=r"with states=.*\[16\].*this model has states=.*\[8\]"):
        chain_model(n=8).resume(path, steps=8)


# -- silent mismatches ----------------------------------------------------------------------------
def test_reading_refuses_other_format_versions_and_files_without_a_format(tmp_path):
    path = tmp_path / "newer.h5"
    with HDF5Storage(path) as store:
        store.write(0, snapshot(0))
    with h5py.File(path, "a") as f:
        f.attrs["format_version"] = 3
    with pytest.raises(StorageError, match=f"{path} has snapshot format version 3; this code reads version 2"):
        HDF5Storage(path, mode="r")
    bare = tmp_path / "bare.h5"
    with h5py.File(bare, "w") as f:
        f.create_group("snapshots")
    with pytest.raises(StorageError, match=f"{bare} is an HDF5 file but not a snapshot file"):
        HDF5Storage(bare, mode="r")


def test_a_snapshot_file_deleted_or_replaced_while_open_is_an_error_at_flush_and_close(tmp_path):
    path = tmp_path / "scratch.h5"
    store = HDF5Storage(path)
    store.write(0, snapshot(0))
    os.unlink(path)
    with pytest.raises(StorageError, match=f"{path} was deleted while this storage had it open"):
        store.flush()
    with pytest.raises(StorageError, match="snapshots written to it are lost"):
        store.close()
    other = tmp_path / "other"
    other.write_text("someone else's")
    store = HDF5Storage(path)
    store.write(0, snapshot(0))
    os.replace(other, path)
    with pytest.raises(StorageError, match=f"{path} was replaced by another file while this storage had it open"):
        store.close()
    assert path.read_text() == "someone else's"


def test_resume_falls_back_to_the_older_checkpoint_when_the_newest_is_damaged(tmp_path):
    path = tmp_path / "run.ckpt"
    model, initial = chain_model(), chain_initial()
    model.rollout(initial, 6, checkpoint=path, checkpoint_every=1)
    newest = path / "step-000000000006.h5"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])     # cut short after the fact
    with pytest.warns(RuntimeWarning, match=rf"resuming from an older checkpoint \(step 5\): the checkpoint "
                                            rf"{newest} cannot be read"):
        resumed = model.resume(path, steps=8)
    assert resumed.stats.steps == 3
    assert resumed.x.numpy().tobytes() == model.rollout(initial, 8).x.numpy().tobytes()


def test_a_truncated_snapshot_file_is_a_storage_error_that_says_it_is_damaged(tmp_path):
    path = tmp_path / "scratch.h5"
    with HDF5Storage(path) as store:
        for step in range(3):
            store.write(step, snapshot(step))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 99 // 100])          # 1% cut off
    for mode in ("r", "a"):
        with pytest.raises(StorageError, match=rf"cannot open snapshot file {path} with mode='{mode}': .*truncated.*"
                                               r"the file is damaged \(cut short or overwritten\)"):
            HDF5Storage(path, mode=mode)
    assert path.read_bytes() == data[: len(data) * 99 // 100]  # and left as it was
