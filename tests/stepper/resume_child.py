"""Runs a rollout with HDF5 checkpoints slowly, printing each step, so a test can kill it mid-run.

    python resume_child.py PATH STEPS EVERY
"""
import sys
import time

from stepper_models import chain_initial, chain_model

if __name__ == "__main__":
    path, steps, every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

    def report(n, state):
        print(n, flush=True)
        time.sleep(0.01)
    chain_model().rollout(chain_initial(), steps, checkpoint=path, checkpoint_every=every, callback=report)
    print("done", flush=True)
