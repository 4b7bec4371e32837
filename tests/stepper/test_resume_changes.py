"""`resume` refuses a model that is not the one that wrote the checkpoints (issue 31).

A checkpoint records the parameters' values and the step's kernels (stepper/step/fingerprint.py); a
resume with other values, or with a kernel whose source changed, stops with an error naming the
parameter or kernel and both hashes, before it writes anything. ``allow_changes=True`` continues
deliberately and the new checkpoints record what changed. Each run is a child process
(changed_model_child.py), as a resume after a crash is: a new process, perhaps with edited code.
"""
import json
import os
import re
import subprocess
import sys

from checkpoint.storage.checkpoint_dir import CheckpointDirectory

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def run(path, job, variant):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, os.path.join(HERE, "changed_model_child.py"), str(path), job, variant],
                          capture_output=True, text=True, env=env, cwd=HERE, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in done.stdout.strip().splitlines())
    step, changes = lines["latest"].split(" ", 1)
    return lines, int(step), json.loads(changes)


def steps_on_disk(path):
    with CheckpointDirectory(path, mode="a") as store:
        return sorted(store.steps())


def test_the_same_model_resumes_to_the_uninterrupted_runs_bits(tmp_path):
    run(tmp_path / "a", "write", "same")
    lines, step, changes = run(tmp_path / "a", "resume", "same")
    assert step == 12 and changes is None and "error" not in lines
    uninterrupted, _, _ = run(tmp_path / "b", "full", "same")
    assert lines["final"] == uninterrupted["final"]


def test_changed_parameter_values_are_refused_naming_the_parameter_and_both_hashes(tmp_path):
    path = tmp_path / "run.ckpt"
    run(path, "write", "same")
    kept = steps_on_disk(path)
    lines, step, changes = run(path, "resume", "stiffer")
    assert "final" not in lines and step == 8 and steps_on_disk(path) == kept      # nothing written
    assert re.search(r"the values of parameter 'k' changed \(SHA-256 [0-9a-f]{16} in the checkpoints, "
                     r"[0-9a-f]{16} now\)", lines["error"]), lines["error"]
    assert "'c'" not in lines["error"] and "allow_changes=True" in lines["error"]


def test_a_changed_kernel_is_refused_naming_the_kernel(tmp_path):
    path = tmp_path / "run.ckpt"
    run(path, "write", "same")
    kept = steps_on_disk(path)
    lines, step, _ = run(path, "resume", "kernel")
    assert "final" not in lines and step == 8 and steps_on_disk(path) == kept
    assert re.search(r"the source of kernel '__main__.chain_integrate' changed \(SHA-256 [0-9a-f]{16} in the "
                     r"checkpoints, [0-9a-f]{16} now\)", lines["error"]), lines["error"]
    assert "chain_force" not in lines["error"] and "parameter" not in lines["error"]


def test_a_changed_launch_of_the_same_kernels_is_refused(tmp_path):
    path = tmp_path / "run.ckpt"
    run(path, "write", "same")
    lines, step, _ = run(path, "resume", "launch")
    assert "final" not in lines and step == 8
    assert re.search(r"the step's launches changed \(dims, scalar arguments or buffers; launch trace SHA-256 "
                     r"[0-9a-f]{16} in the checkpoints, [0-9a-f]{16} now\)", lines["error"]), lines["error"]


def test_allow_changes_continues_and_the_new_checkpoints_record_what_changed(tmp_path):
    path = tmp_path / "run.ckpt"
    run(path, "write", "same")
    lines, step, changes = run(path, "resume-allowed", "stiffer")
    assert step == 12 and "final" in lines
    assert len(changes) == 1 and changes[0]["step"] == 8
    assert changes[0]["changed"][0].startswith("the values of parameter 'k' changed")
    same, _, _ = run(tmp_path / "b", "full", "same")
    assert same["final"] != lines["final"]                 # the continuation is the changed model's
