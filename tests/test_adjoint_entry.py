"""The adjoint's entry points: what they print, which body they run for the gradients a launch
carries, and how many threads they use.

- The end of an adjoint's replay is a statement of its own (ir.ReverseMark), which passes that
  rebuild a body keep: it renders as the counting pass's early return, never as output.
"""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import compiler as sp
from compiler import ir
from compiler.backends.nvrtc import NvrtcNotFoundError, compile_cuda, nvrtc_version
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


# ---- the adjoint body specialised on which gradients a launch carries ---------------------------

D2 = sp.array(dtype=sp.float64, ndim=2)


@sp.kernel
def damped(up: F2, u: F2, damp: F2, u_next: F2):
    i, j = sp.tid()
    n = u.shape[0]
    m = u.shape[1]
    value = 0.0
    if i > 0 and j > 0 and i < n - 1 and j < m - 1:
        x = u[i, j]
        lap = u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1] - 4.0 * x
        d = damp[i, j]
        value = (2.0 * x - (1.0 - d) * up[i, j] + 0.2 * lap - 0.001 * x * x * x) / (1.0 + d)
    u_next[i, j] = value


@sp.kernel
def damped64(up: D2, u: D2, damp: D2, u_next: D2):
    i, j = sp.tid()
    n = u.shape[0]
    m = u.shape[1]
    value = sp.float64(0.0)
    if i > 0 and j > 0 and i < n - 1 and j < m - 1:
        x = u[i, j]
        lap = u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1] - 4.0 * x
        d = damp[i, j]
        value = (2.0 * x - (1.0 - d) * up[i, j] + 0.2 * lap - 0.001 * x * x * x) / (1.0 + d)
    u_next[i, j] = value


def damped_reference(up, u, damp):
    """The damped step in float64 numpy: zero on the boundary."""
    out = np.zeros_like(u)
    x = u[1:-1, 1:-1]
    lap = u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:] - 4.0 * x
    d = damp[1:-1, 1:-1]
    out[1:-1, 1:-1] = (2.0 * x - (1.0 - d) * up[1:-1, 1:-1] + 0.2 * lap - 0.001 * x ** 3) / (1.0 + d)
    return out


def damped_gradients(kernel, shape, damp_grad: bool, device, np_dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    up, u = (sp.array(rng.standard_normal(shape).astype(np_dtype), requires_grad=True, device=device)
             for _ in range(2))
    damp = sp.array((0.1 * rng.random(shape)).astype(np_dtype), requires_grad=damp_grad, device=device)
    out = sp.zeros(shape, dtype=up.dtype, requires_grad=True, device=device)
    w = rng.standard_normal(shape).astype(np_dtype)
    tape = sp.Tape()
    with tape:
        sp.launch(kernel, shape, inputs=[up, u, damp], outputs=[out])
    tape.backward(grads={out: w})
    return up, u, damp, w


def test_a_constant_field_runs_the_entry_specialised_on_the_gradients_present(device):
    assert damped.compiled().gather is not None
    up, u, damp, _ = damped_gradients(damped, (40, 56), False, device)
    mask = 1 << 0 | 1 << 1 | 1 << 3          # up, u and u_next carry gradients; damp does not
    assert [k[-1] for k in damped.__dict__.get("_grads_variants", {})] == [mask]
    assert damp.grad is None


def test_the_specialised_body_gives_the_bits_of_the_body_that_tests_each_gradient(device, monkeypatch):
    from compiler.backends import grads_variants
    special = damped_gradients(damped, (37, 64), False, device, seed=1)
    with_grad = damped_gradients(damped, (37, 64), True, device, seed=1)
    monkeypatch.setattr(grads_variants, "grads_mask", lambda *args: None)    # the module's entry, as before
    tested = damped_gradients(damped, (37, 64), False, device, seed=1)
    for k in (0, 1):     # up, u
        np.testing.assert_array_equal(special[k].grad.numpy(), tested[k].grad.numpy())
        np.testing.assert_array_equal(special[k].grad.numpy(), with_grad[k].grad.numpy())


def test_on_the_gpu_both_passes_of_the_two_pass_form_run_specialised(device):
    """On the GPU the two passes are two launches: with damp's gradient absent both run the entries
    specialised on the gradients present (the module's pointwise entry replayed the forward's value
    and loaded `up` for damp's absent gradient), with the CPU's bits. The CUDA simulator records
    which entries ran."""
    from compiler.backends import cudasim
    if device == "cpu" or not cudasim.enabled():
        pytest.skip("the CUDA simulator (--device cuda, STEPPER_CUDA_SIM=1) records the entries launched")
    from compiler.backends.cudasim import driver
    gather = damped64.compiled().gather
    assert gather.pointwise is not None                  # the two-pass form
    driver.recent_launches.clear()
    on_gpu = damped_gradients(damped64, (29, 35), False, device, np_dtype=np.float64, seed=3)
    names = [launch[0] for launch in driver.recent_launches]
    assert any(n.startswith(f"{gather.pointwise.name}_grads") for n in names), names
    assert any(n.startswith(f"{gather.function.name}_grads") for n in names), names
    assert gather.pointwise.name not in names and gather.function.name not in names
    on_cpu = damped_gradients(damped64, (29, 35), False, "cpu", np_dtype=np.float64, seed=3)
    for k in (0, 1):     # up, u
        np.testing.assert_array_equal(on_gpu[k].grad.numpy(), on_cpu[k].grad.numpy())


def test_the_specialised_body_matches_float64_finite_differences(device):
    shape = (9, 12)
    up, u, damp, w = damped_gradients(damped64, shape, False, device, np_dtype=np.float64, seed=2)
    values = {"up": up.numpy(), "u": u.numpy()}
    loss = lambda v: float(np.sum(w * damped_reference(v["up"], v["u"], damp.numpy())))   # noqa: E731
    eps = 1e-6
    for name, a in (("up", up), ("u", u)):
        fd = np.zeros(shape)
        for index in np.ndindex(shape):
            plus = {k: v.copy() for k, v in values.items()}
            minus = {k: v.copy() for k, v in values.items()}
            plus[name][index] += eps
            minus[name][index] -= eps
            fd[index] = (loss(plus) - loss(minus)) / (2 * eps)
        np.testing.assert_allclose(a.grad.numpy(), fd, rtol=1e-7, atol=1e-8)


I2 = sp.array(dtype=int, ndim=2)


@sp.kernel
def masked_blur(u: F2, keep: I2, out: F2):
    i, j = sp.tid()
    value = u[i, j]
    if j > 0:
        value += 0.5 * u[i, j - 1]
    out[i, j] = value * float(keep[i, j])


def test_an_integer_array_does_not_keep_the_module_from_its_branch_free_body(device):
    """The body touches the gradients of u and out only: an int array (which has none) leaves the
    launch with every gradient it needs, so the module's branch-free entry runs, no specialised one."""
    rng = np.random.default_rng(4)
    u = sp.array(rng.standard_normal((6, 9)).astype(np.float32), requires_grad=True, device=device)
    keep = rng.integers(0, 2, (6, 9)).astype(np.int32)
    out = sp.zeros((6, 9), requires_grad=True, device=device)
    w = rng.standard_normal((6, 9)).astype(np.float32)
    tape = sp.Tape()
    with tape:
        sp.launch(masked_blur, (6, 9), inputs=[u, sp.array(keep, device=device)], outputs=[out])
    tape.backward(grads={out: w})
    assert masked_blur.compiled().gather is not None and not masked_blur.__dict__.get("_grads_variants")
    source = render_cpu([masked_blur.compiled().functions()], False).source
    assert "if (G.a_u.data && G.a_out.data)" in source and "G.a_keep.data" not in source
    g = (w * keep).astype(np.float64)
    expected = g.copy()
    expected[:, :-1] += 0.5 * g[:, 1:]
    np.testing.assert_allclose(u.grad.numpy(), expected, rtol=1e-6, atol=1e-6)


def test_the_specialised_entries_compile_to_ptx_and_for_the_cpu():
    """Every subset of damped's gradients renders an entry of its own, which NVRTC and the C++
    compiler take (NVRTC is needed for the first half only)."""
    from compiler.backends import build_cpu_library, load_cpu_library
    from compiler.backends.cuda_module import CUDA_OPTIONS, PRELUDE
    from compiler.codegen.targets import CPU, CUDA, gather_grad_params, grads_variant_name, render_grads_variant
    from compiler.kernel import PRELUDE_DIR
    compiled = damped.compiled()
    gather = compiled.gather
    assert gather_grad_params(gather) == (0, 1, 2, 3)
    name = grads_variant_name(gather.function.name, 0b1011)
    cpu = render_grads_variant(compiled.functions(), 0b1011, CPU).source
    assert hasattr(load_cpu_library(build_cpu_library(cpu, "grads_variant_check", include_dirs=[PRELUDE_DIR])), name)
    assert "sp::ALL_GRADS, 0xbull" in cpu and "_thread<0, 0>" not in cpu
    try:
        nvrtc_version()
    except NvrtcNotFoundError as e:
        pytest.skip(f"NVRTC is not installed: {e}")
    cuda = render_grads_variant(compiled.functions(), 0b1011, CUDA).source
    ptx = compile_cuda(cuda, "grads_variant_check", arch="compute_75", headers={"prelude.h": PRELUDE.read_text()},
                       options=CUDA_OPTIONS)
    assert f".entry {name}(" in ptx.decode()
    # the GPU launches a two-pass form's pointwise pass first: its entry is specialised beside it
    assert gather.pointwise is not None
    assert f".entry {grads_variant_name(gather.pointwise.name, 0b1011)}(" in ptx.decode()
    assert "sp::ALL_GRADS, 0xbull" in cuda and "_thread<0, 0>" not in cuda


# ---- threads for small launches -----------------------------------------------------------------

@sp.kernel
def costly(u: F2, damp: F2, u_next: F2):
    """A step whose threads do enough work that a 64 x 80 launch forks (see parallel_threshold)."""
    i, j = sp.tid()
    n = u.shape[0]
    m = u.shape[1]
    value = 0.0
    if i > 1 and j > 1 and i < n - 2 and j < m - 2:
        x = u[i, j]
        lap = -5.0 * x + 1.3333333 * (u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1])
        lap += -0.083333333 * (u[i - 2, j] + u[i + 2, j] + u[i, j - 2] + u[i, j + 2])
        value = (2.0 * x + 0.1 * lap - 0.01 * sp.sin(x) * sp.exp(-x * x)) / (1.0 + damp[i, j])
    u_next[i, j] = value


@sp.kernel
def shared_scale(x: F1, c: F1, y: F1):
    """Every thread's adjoint adds into c's gradient: a deterministic launch logs its adds."""
    i = sp.tid()
    y[i] = c[0] * sp.sin(x[i]) * sp.exp(-x[i] * x[i])


SMALL = (64, 80)       # 5,120 threads: below the 32,768 of the earlier, fixed bar
N_SCALE = 10_007        # three chunks of ADD_CHUNK threads (the adds are logged from the threshold on)

_THREADS_CHILD = """
import json, sys
import numpy as np
sys.path.insert(0, {root!r}); sys.path.insert(0, {tests!r})
import compiler as sp
import test_adjoint_entry as t
rng = np.random.default_rng(5)
u = sp.array(rng.standard_normal(t.SMALL).astype(np.float32), requires_grad=True)
damp = sp.array((0.1 * rng.random(t.SMALL)).astype(np.float32))
out = sp.zeros(t.SMALL, requires_grad=True)
x = sp.array(rng.standard_normal(t.N_SCALE).astype(np.float32), requires_grad=True)
c = sp.array(np.array([0.7], np.float32), requires_grad=True)
y = sp.zeros(t.N_SCALE, requires_grad=True)
tape = sp.Tape(deterministic=True)
with tape:
    sp.launch(t.costly, t.SMALL, inputs=[u, damp], outputs=[out])
    sp.launch(t.shared_scale, t.N_SCALE, inputs=[x, c], outputs=[y])
tape.backward(grads={{out: rng.standard_normal(t.SMALL).astype(np.float32),
                      y: rng.standard_normal(t.N_SCALE).astype(np.float32)}})
print(json.dumps([a.tobytes().hex() for a in (out.numpy(), y.numpy(), u.grad.numpy(), x.grad.numpy(),
                                              c.grad.numpy())]))
"""


def test_small_launches_that_fork_give_the_same_bits_on_1_and_2_threads():
    from compiler.codegen.threads import parallel_threshold
    compiled = costly.compiled()
    # the launches below fork on two threads: their work reaches the bar
    assert parallel_threshold(compiled.forward) <= SMALL[0] * SMALL[1]
    assert parallel_threshold(compiled.gather.function) <= SMALL[0] * SMALL[1]
    assert parallel_threshold(shared_scale.compiled().adjoint) <= N_SCALE
    code = _THREADS_CHILD.format(root=str(REPO), tests=str(Path(__file__).parent))
    runs = {}
    for threads in (1, 2):
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": str(threads)}
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        runs[threads] = done.stdout.strip().splitlines()[-1]
    assert runs[1] == runs[2]
