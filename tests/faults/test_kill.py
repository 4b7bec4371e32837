"""A checkpointed rollout SIGKILLed at random moments loses at most the checkpoint being written.

Each trial starts a rollout that writes a checkpoint every step (fault_child.py "rollout"), kills it
with SIGKILL after a random delay, then checks: the newest checkpoint on disk is at least the last
one the child reported durable (none lost), it holds the exact bits of an uninterrupted rollout at
its step, and the first `resume` succeeds and reaches the uninterrupted rollout's bits.

CI runs a few trials; ``STEPPER_KILL_TRIALS=200`` runs many (the numbers are in the README).
"""
import os
import random
import select
import signal
import time

from checkpoint.storage.checkpoint_dir import list_checkpoints, read_checkpoint
from test_storage_faults import child, chain_initial, chain_model

TRIALS = int(os.environ.get("STEPPER_KILL_TRIALS", "3"))
STEPS = 100_000              # more than any trial reaches: the kill always lands mid-run
EXTRA = 3                    # steps each resume runs past the checkpoint it starts from


def kill_at_random(path, delay):
    """Run the rollout child, SIGKILL it ``delay`` seconds after its first checkpoint; return the
    last step it reported durable."""
    proc = child("rollout", path, STEPS)
    try:
        first = proc.stdout.readline()
        assert first == "done 1\n", f"the child failed before its first checkpoint: {proc.stderr.read()}"
        deadline = time.monotonic() + delay
        lines = [first]
        while (left := deadline - time.monotonic()) > 0:
            if select.select([proc.stdout], [], [], left)[0]:
                lines.append(proc.stdout.readline())
        proc.send_signal(signal.SIGKILL)
        rest = proc.stdout.read()
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    reported = [int(line.split()[1]) for line in [*lines, *rest.splitlines(keepends=True)] if line.startswith("done ")]
    return reported[-1]


def test_random_kills_lose_no_completed_checkpoint(tmp_path):
    rng = random.Random(int(os.environ.get("STEPPER_KILL_SEED", "15")))
    model, initial = chain_model(), chain_initial()
    lost, failed_resumes, kept, mid_write = [], [], [], 0
    for trial in range(TRIALS):
        path = tmp_path / f"run{trial}.ckpt"
        durable = kill_at_random(path, rng.uniform(0.0, 0.4))
        steps = list_checkpoints(str(path))
        mid_write += any(name.endswith(".tmp") for name in os.listdir(path))     # killed inside a write
        if not steps or steps[-1] < durable:
            lost.append((trial, durable, steps))
            continue
        newest = steps[-1]
        reference = model.rollout(initial, newest + EXTRA, record_every=1).history
        snap = read_checkpoint(str(path / f"step-{newest:012d}.h5"), newest)
        assert {k: a.tobytes() for k, a in snap.arrays.items()} == \
            {k: a.tobytes() for k, a in reference[newest - 1][1].items()}, f"trial {trial}: checkpoint {newest}"
        try:
            resumed = model.resume(path, steps=newest + EXTRA)
        except Exception as exc:  # noqa: BLE001 - counted, then reported all at once
            failed_resumes.append((trial, repr(exc)))
            continue
        assert resumed.x.numpy().tobytes() == reference[-1][1]["x"].tobytes()
        assert resumed.v.numpy().tobytes() == reference[-1][1]["v"].tobytes()
        kept.append(newest - durable)       # 0, or 1 when the kill fell between write and report
    print(f"\n{TRIALS} kills: {len(lost)} lost completed checkpoints, {len(failed_resumes)} failed first "
          f"resumes; {mid_write} kills landed inside a checkpoint's write; newest checkpoint - last reported: "
          f"{sorted(set(kept))}")
    assert lost == [] and failed_resumes == []
    assert set(kept) <= {0, 1}
