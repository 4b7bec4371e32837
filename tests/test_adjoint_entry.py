"""The adjoint's entry points: what they print, which body they run for the gradients a launch
carries, and how many threads they use.

- The end of an adjoint's replay is a statement of its own (ir.ReverseMark), which passes that
  rebuild a body keep: it renders as the counting pass's early return, never as output.
"""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

import compiler as sp
from compiler import ir
from compiler.codegen.targets import render_cpu, render_cuda

REPO = Path(__file__).resolve().parents[1]
F1 = sp.array(dtype=float)
F2 = sp.array(dtype=float, ndim=2)


@sp.kernel
def twice_first(J: F1, out: F1):
    out[0] = 2.0 * J[0]


@sp.kernel
def row_start_weighted(u: F2, w: F2, out: F2):
    r, c = sp.tid()
    out[r, c] = w[r, 0] * u[r, c]


def test_adjoints_without_a_loop_tape_render_no_output():
    for kernel in (twice_first, row_start_weighted):
        compiled = kernel.compiled()
        assert not compiled.needs_tape
        for render in (render_cpu, render_cuda):
            source = render([compiled.functions()], False).source
            assert "printf" not in source and "__reverse__" not in source
        marks = [s for s in compiled.adjoint.body if isinstance(s, getattr(ir, "ReverseMark", ()))]
        assert len(marks) == 1


SCRIPT = """\
import numpy as np
import compiler as sp
F1 = sp.array(dtype=float)
F2 = sp.array(dtype=float, ndim=2)

@sp.kernel
def twice_first(J: F1, out: F1):
    out[0] = 2.0 * J[0]

@sp.kernel
def row_start_weighted(u: F2, w: F2, out: F2):
    r, c = sp.tid()
    out[r, c] = w[r, 0] * u[r, c]

device = {device!r}
J = sp.array(np.arange(1, 5, dtype=np.float32), requires_grad=True, device=device)
out = sp.zeros(1, requires_grad=True, device=device)
u = sp.array(np.full((3, 4), 2.0, np.float32), requires_grad=True, device=device)
w = sp.array(np.arange(12, dtype=np.float32).reshape(3, 4), requires_grad=True, device=device)
out2 = sp.zeros((3, 4), requires_grad=True, device=device)
tape = sp.Tape()
with tape:
    sp.launch(twice_first, 4, inputs=[J], outputs=[out])
    sp.launch(row_start_weighted, (3, 4), inputs=[u, w], outputs=[out2])
tape.backward(grads={{out: np.ones(1, np.float32), out2: np.ones((3, 4), np.float32)}})
print("J.grad", J.grad.numpy().tolist())
print("u.grad", u.grad.numpy().tolist())
print("w.grad", w.grad.numpy().tolist())
"""


def test_adjoints_without_a_loop_tape_print_nothing(tmp_path, device):
    """Run in a child process: the kernels' printf output lands on the child's stdout."""
    script = tmp_path / "kernels.py"
    script.write_text(SCRIPT.format(device=device))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, cwd=tmp_path,
                           timeout=300)
    assert child.returncode == 0, child.stderr
    # every one of the 4 threads adds 2 * 1 to J[0]; w[r, 0] gets the row's sum of u
    assert child.stdout.splitlines() == [
        "J.grad [8.0, 0.0, 0.0, 0.0]",
        "u.grad " + str(np.repeat(np.array([[0.0], [4.0], [8.0]]), 4, axis=1).tolist()),
        "w.grad [[8.0, 0.0, 0.0, 0.0], [8.0, 0.0, 0.0, 0.0], [8.0, 0.0, 0.0, 0.0]]",
    ]
