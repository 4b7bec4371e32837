"""A chain rollout with checkpoints, written or resumed by a model that may have changed since.

    python changed_model_child.py PATH JOB VARIANT

JOB: ``write`` (8 steps, a checkpoint every 2), ``resume`` (to step 12), ``resume-allowed``
(``allow_changes=True``) or ``full`` (12 steps, no resume). VARIANT: ``same``, ``stiffer`` (stiffness [4.0, 0.6] for [4.0, 0.5]) or
``kernel`` (the integrator's source changed: a semi-implicit damping) or ``launch`` (the same
kernels, launched with another rest length). Prints ``final`` and the
state's bytes in hex, or ``error`` and the message; and the newest checkpoint's ``changes``.
Run in a child process: a real resume follows a crash, in a new process, maybe with edited code.
"""
import json
import sys

import numpy as np

import stepper as sp
from checkpoint.storage.checkpoint_dir import CheckpointDirectory
from stepper_models import chain_force, chain_initial

F64 = sp.array(dtype=sp.float64)
path, job, variant = sys.argv[1], sys.argv[2], sys.argv[3]

if variant == "kernel":
    @sp.kernel
    def chain_integrate(x: F64, v: F64, f: F64, c: F64, dt: sp.float64, x_next: F64, v_next: F64):
        i = sp.tid()
        vn = (v[i] + dt * f[i]) / (1.0 + dt * c[0])
        v_next[i] = vn
        x_next[i] = x[i] + dt * vn
else:
    @sp.kernel
    def chain_integrate(x: F64, v: F64, f: F64, c: F64, dt: sp.float64, x_next: F64, v_next: F64):
        i = sp.tid()
        vn = v[i] + dt * (f[i] - c[0] * v[i])
        v_next[i] = vn
        x_next[i] = x[i] + dt * vn


def chain(k1):
    model = sp.Model("cpu", dt=0.05)
    model.state("x", 16, sp.float64)
    model.state("v", 16, sp.float64)
    model.param("k", sp.array(np.array([4.0, k1]), dtype=sp.float64))
    model.param("c", sp.array(np.array([0.1]), dtype=sp.float64))

    @model.step
    def step(s):
        f = s.scratch("force", 16, sp.float64)
        sp.launch(chain_force, 16, inputs=[s.prev.x, s.params.k, rest, 16], outputs=[f])
        sp.launch(chain_integrate, 16, inputs=[s.prev.x, s.prev.v, f, s.params.c, s.dt],
                  outputs=[s.next.x, s.next.v])
    return model


rest = 1.1 if variant == "launch" else 1.0
model = chain(0.6 if variant == "stiffer" else 0.5)
try:
    if job in ("write", "full"):
        final = model.rollout(chain_initial(), 8 if job == "write" else 12, checkpoint=path, checkpoint_every=2)
    else:
        final = model.resume(path, steps=12, allow_changes=job == "resume-allowed")
    print("final", final.x.numpy().tobytes().hex())
except sp.ModelError as exc:
    print("error", exc)
with CheckpointDirectory(path, mode="a") as store:
    latest = store.read_latest()
    print("latest", latest.step, json.dumps(latest.metadata.get("changes")))
