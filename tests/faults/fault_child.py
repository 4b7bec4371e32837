"""What the fault tests run in a child process, so that a crash fails a test instead of pytest.

    python fault_child.py JOB PATH [ARGS...]

Jobs (each prints what the parent needs to check, one fact per line, and exits 0 unless killed):
- ``rollout PATH STEPS``: a checkpointed rollout of the chain model, a checkpoint every step; prints
  "done N" after checkpoint N is durable (the callback runs after the checkpoint is written).
- ``rollout_fsize PATH STEPS AT LIMIT``: the same, but at step AT the file-size limit drops to LIMIT
  bytes (a full disk for every later checkpoint); prints the error's type and message.
- ``hdf5_fsize PATH LIMIT``: an HDF5Storage under a file-size limit, written until it refuses.
- ``gradient_fsize PATH LIMIT``: a gradient whose DISK tier is PATH under a file-size limit.
- ``hold PATH``: an HDF5Storage that writes step 0, prints "ready", then waits for a line on stdin
  before writing step 1 and closing: the first job of a double launch.
"""
import os
import resource
import signal
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "stepper"))


def limit_file_size(nbytes: int) -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)      # a write past the limit fails with EFBIG instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


def snapshot(step: int) -> dict:
    """1 MiB of float64 that depends on the step: what the parent expects back, bit for bit."""
    return {"a": np.arange(1 << 17, dtype=np.float64) * (step + 1), "b": np.full(3, step, np.int32)}


def report(error: BaseException) -> None:
    print(f"error {type(error).__name__}: {error}", flush=True)


def main(job: str, path: str, *args: str) -> None:
    if job == "hdf5_fsize":
        from checkpoint.storage import HDF5Storage, StorageError
        limit_file_size(int(args[0]))
        store = HDF5Storage(path)
        try:
            for step in range(100):
                store.write(step, snapshot(step))
                store.flush()
                print(f"written {step}", flush=True)
        except StorageError as exc:
            report(exc)
        store.close()
        return
    if job == "hold":
        from checkpoint.storage import HDF5Storage
        store = HDF5Storage(path)
        store.write(0, snapshot(0))
        store.flush()
        print("ready", flush=True)
        sys.stdin.readline()
        store.write(1, snapshot(1))
        store.close()
        print("closed", flush=True)
        return

    import stepper as sp
    from stepper_models import chain_initial, chain_model
    model = chain_model()
    if job == "rollout":
        def done(n, state):
            print(f"done {n}", flush=True)
        model.rollout(chain_initial(), int(args[0]), checkpoint=path, checkpoint_every=1, callback=done)
    elif job == "rollout_fsize":
        at, limit = int(args[1]), int(args[2])

        def done(n, state):
            print(f"done {n}", flush=True)
            if n == at:
                limit_file_size(limit)
        try:
            model.rollout(chain_initial(), int(args[0]), checkpoint=path, checkpoint_every=1, callback=done)
        except sp.StorageError as exc:
            report(exc)
    elif job == "gradient_fsize":
        from stepper_models import sum_squares64

        def loss(state):
            out = sp.zeros(1, dtype=sp.float64)
            sp.launch(sum_squares64, 16, inputs=[state.x], outputs=[out])
            return out
        limit_file_size(int(args[0]))
        try:
            model.gradient(chain_initial(), 100, loss=loss, schedule=sp.MultiLevel(100, 2, 4), storage=path)
        except sp.StorageError as exc:
            report(exc)
    print("exit", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
