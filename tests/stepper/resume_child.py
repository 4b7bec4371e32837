"""Runs a rollout with HDF5 checkpoints slowly, printing each step, so a test can kill it mid-run.

    python resume_child.py PATH STEPS EVERY [DEVICE]
"""
import sys
import time

from stepper_models import chain_initial, chain_model

if __name__ == "__main__":
    path, steps, every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    device = sys.argv[4] if len(sys.argv) > 4 else "cpu"

    def report(n, state):
        print(n, flush=True)
        time.sleep(0.01)
    chain_model(device=device).rollout(chain_initial(device=device), steps, checkpoint=path, checkpoint_every=every,
                                       callback=report)
    print("done", flush=True)
