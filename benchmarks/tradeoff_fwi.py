"""The FWI model of benchmarks/fwi.py (Devito's 2-D acoustic example: a Ricker source and one
receiver per grid column, read from `model.series` every step, the misfit a running loss, the
gradient w.r.t. the squared slowness), as a `stepper.bench.Problem` for the trade-off tool:

    cd benchmarks && python -m stepper.bench tradeoff --model tradeoff_fwi:make --size 64 --steps 500 \\
        --budgets 4..64 --disk --threads 1 --repeats 5

Needs Devito (the bench extra) to build the problem once; it is cached in $TMPDIR by size.
`--steps` is at most the problem's time steps (Devito's 1 s at its dt, about 600 at size 64)."""
import os
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

ORDER = 2


def make(n: int = 64):
    from peer_impls.devito_peer import build_problem
    from peer_impls.fwi_ours import make_model
    from stepper.bench import Problem

    path = os.path.join(tempfile.gettempdir(), f"tradeoff-fwi-{n}-order{ORDER}.npz")
    if not os.path.exists(path):
        build_problem(n, ORDER, np.float32, path)
    problem = dict(np.load(path))
    model, initial, running_loss = make_model(problem, ORDER)
    steps = problem["wavelet"].shape[0]
    return Problem("fwi", f"acoustic FWI, {n}x{n} + damping layer, order {ORDER}, float32, "
                          f"{steps} steps of data", model, initial, None, running_loss)
