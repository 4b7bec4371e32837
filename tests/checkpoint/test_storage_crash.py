"""A writer process SIGKILLed mid-snapshot leaves a file that opens, with every
finished snapshot intact and the interrupted one reported as incomplete."""

import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from checkpoint.storage import HDF5Storage, SnapshotIncompleteError, StorageError

REPO = Path(__file__).resolve().parents[2]
BIG_STEP = 3

# The child writes steps 0..2, then a big step 3 made of several arrays, and
# tells the parent (one line on stdout) when it is inside the big write, at the
# point given by argv[2]; it then waits there to be killed. Waiting inside a
# patched layout function makes the kill land at a known point every time.
CHILD = textwrap.dedent("""
    import sys, time
    import numpy as np
    from checkpoint.storage import HDF5Storage, layout

    path, where = sys.argv[1], sys.argv[2]

    def arrays(step, n):
        return {f"a{k}": np.arange(n, dtype=np.float64) * (step + 1) + k for k in range(4)}

    def announce_and_wait():
        print("inside", flush=True)
        time.sleep(60)

    if where == "after_first_array":
        real_chunk_shape, calls = layout.chunk_shape, []
        def chunk_shape(shape, itemsize, target):
            if shape[0] == 1 << 20:
                calls.append(shape)
            if len(calls) == 2:  # about to create the big step's 2nd array
                announce_and_wait()
            return real_chunk_shape(shape, itemsize, target)
        layout.chunk_shape = chunk_shape
    elif where == "before_marker":
        real_mark = layout.mark_complete
        def mark_complete(f, step, group=None):
            if step == %(big)d:
                announce_and_wait()
            real_mark(f, step, group)
        layout.mark_complete = mark_complete

    store = HDF5Storage(path)
    for step in range(%(big)d):
        store.write(step, arrays(step, 1000))
    if where == "streaming":
        store.flush()
        print("inside", flush=True)
        step = %(big)d
        while True:  # the parent kills us at a random moment
            store.write(step, arrays(step, 1 << 17))
            step += 1
    store.write(%(big)d, arrays(%(big)d, 1 << 20))  # 4 arrays of 8 MiB
    store.close()
    print("finished without being killed", flush=True)
""") % {"big": BIG_STEP}


def expected(step, n):
    return {f"a{k}": np.arange(n, dtype=np.float64) * (step + 1) + k for k in range(4)}


def run_and_kill(path, where, delay=0.0):
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(path), where], cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline()
        assert line == "inside\n", f"child failed before the big write: {child.stderr.read()}"
        if delay:
            import time
            time.sleep(delay)
        child.send_signal(signal.SIGKILL)
        assert child.wait(10) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
        child.stdout.close()
        child.stderr.close()


def assert_bit_exact(snapshot, arrays):
    assert set(snapshot.arrays) == set(arrays)
    for name, array in arrays.items():
        assert snapshot.arrays[name].tobytes() == array.tobytes(), (snapshot.step, name)


@pytest.mark.parametrize("where", ["after_first_array", "before_marker"])
@pytest.mark.parametrize("attempt", range(2))
def test_kill_during_a_big_snapshot(tmp_path, where, attempt):
    path = tmp_path / "killed.h5"
    run_and_kill(path, where)
    with HDF5Storage(path, mode="a") as store:
        assert store.steps() == [0, 1, 2]
        assert store.incomplete_steps() == [BIG_STEP]
        for step in range(BIG_STEP):
            assert_bit_exact(store.read(step), expected(step, 1000))
        with pytest.raises(SnapshotIncompleteError, match=f"step {BIG_STEP} in {path}"):
            store.read(BIG_STEP)
        store.write(BIG_STEP, expected(BIG_STEP, 10))  # the file is writable again
    with HDF5Storage(path, mode="r") as store:
        assert store.steps() == [0, 1, 2, BIG_STEP] and store.incomplete_steps() == []


@pytest.mark.parametrize("seed", range(4))
def test_kill_at_a_random_moment_of_a_stream_of_writes(tmp_path, seed):
    """Either the file opens with a prefix of complete, bit-exact snapshots, or (rarely: the kill
    landed inside HDF5's own update of the file's group index, which HDF5 does not make atomic) it
    refuses to open with an error that says so. Never a half-written snapshot read as a good one."""
    path = tmp_path / "stream.h5"
    run_and_kill(path, "streaming", delay=random.Random(seed).uniform(0.02, 0.3))
    try:
        store = HDF5Storage(path, mode="r")
    except StorageError as exc:
        assert "damaged beyond what completion markers protect against" in str(exc) and str(path) in str(exc)
        return
    with store:
        steps, incomplete = store.steps(), store.incomplete_steps()
        assert steps[:BIG_STEP] == [0, 1, 2]
        assert steps == list(range(len(steps))), "complete snapshots form a prefix of the stream"
        assert incomplete in ([], [len(steps)]), "at most the one snapshot being written is incomplete"
        for step in steps:
            assert_bit_exact(store.read(step), expected(step, 1000 if step < BIG_STEP else 1 << 17))
