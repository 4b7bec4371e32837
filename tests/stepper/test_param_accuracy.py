"""A float32 parameter gradient over a long rollout stays within float32's reach of float64.

An ensemble of damped pendulums (Heun's method) shares one damping c; the loss is the sum of
squared final-angle misfits. dL/dc sums one contribution per pendulum and step: 4 * 10^6 of them
here (10^8 in issue 31's full case). Summed into one float32 element they drifted (2.5e-4 relative
here, 2.6% for 10^4 pendulums over 10^4 steps); summed per launch in float64 partials (add_log in
compiler/codegen/prelude.h) and over steps in a float64 accumulator (stepper/execute/param_sums.py) they
agree with the float64 model to 1.4e-7. Still deterministic: checkpointed == store-all bit for bit,
on every path, and the same bits on any thread count.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import stepper as sp
from stepper.execute.executor import Sweep

F32 = sp.array(dtype=sp.float32)
F64 = sp.array(dtype=sp.float64)
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


@sp.kernel
def heun32(th: F32, om: F32, length: F32, c: F32, dt: float, th_n: F32, om_n: F32):
    i = sp.tid()
    a0 = -9.81 / length[i] * sp.sin(th[i]) - c[0] * om[i]
    t1 = th[i] + dt * om[i]
    w1 = om[i] + dt * a0
    a1 = -9.81 / length[i] * sp.sin(t1) - c[0] * w1
    th_n[i] = th[i] + 0.5 * dt * (om[i] + w1)
    om_n[i] = om[i] + 0.5 * dt * (a0 + a1)


@sp.kernel
def heun64(th: F64, om: F64, length: F64, c: F64, dt: sp.float64, th_n: F64, om_n: F64):
    i = sp.tid()
    a0 = -9.81 / length[i] * sp.sin(th[i]) - c[0] * om[i]
    t1 = th[i] + dt * om[i]
    w1 = om[i] + dt * a0
    a1 = -9.81 / length[i] * sp.sin(t1) - c[0] * w1
    th_n[i] = th[i] + 0.5 * dt * (om[i] + w1)
    om_n[i] = om[i] + 0.5 * dt * (a0 + a1)


@sp.kernel
def misfit32(th: F32, target: F32, out: F32):
    i = sp.tid()
    d = th[i] - target[i]
    sp.atomic_add(out, 0, d * d)


@sp.kernel
def misfit64(th: F64, target: F64, out: F64):
    i = sp.tid()
    d = th[i] - target[i]
    sp.atomic_add(out, 0, d * d)


def pendulums(n: int, dtype, device: str = "cpu", dt: float = 0.001):
    """The ensemble (Heun's method, damping c = 0.3), its initial state and its loss."""
    f64 = dtype == sp.float64
    step_kernel, misfit = (heun64, misfit64) if f64 else (heun32, misfit32)
    np_type = np.float64 if f64 else np.float32
    rng = np.random.default_rng(0)
    theta, omega, target = rng.uniform(-1, 1, n), rng.uniform(-0.5, 0.5, n), rng.uniform(-0.5, 0.5, n)

    def values(a):
        return sp.array(np.asarray(a, np_type), dtype=dtype, device=device)
    model = sp.Model(dt=dt, device=device, name=f"pendulums_{dtype}")
    model.state("th", n, dtype)
    model.state("om", n, dtype)
    model.param("length", values(np.linspace(0.5, 2.0, n)))
    model.param("c", values([0.3]))

    @model.step
    def step(s):
        sp.launch(step_kernel, n, inputs=[s.prev.th, s.prev.om, s.params.length, s.params.c, s.dt],
                  outputs=[s.next.th, s.next.om])
    goal = values(target)

    def loss(final):
        out = sp.zeros(1, dtype=dtype, device=device)
        sp.launch(misfit, n, inputs=[final.th, goal], outputs=[out])
        return out
    return model, {"th": values(theta), "om": values(omega)}, loss


def dc(dtype, n, steps, device="cpu", schedule=None):
    model, initial, loss = pendulums(n, dtype, device)
    result = model.gradient(initial, steps, loss=loss, schedule=schedule or sp.Revolve(steps, 100))
    return result.grads["c"].numpy()[0], result


def test_a_float32_damping_gradient_over_4000_steps_is_within_1e_5_of_float64(device):
    exact, _ = dc(sp.float64, 1000, 4000, device)
    ours, _ = dc(sp.float32, 1000, 4000, device)
    # One float32 accumulator gave 2.5e-4; float64 partials and sums (folded every 8 steps) 1.4e-7.
    assert abs(ours - exact) / abs(exact) < 1e-5, (ours, exact)


def test_checkpointed_and_store_all_give_the_same_bits_on_every_path(device, monkeypatch):
    steps = 300
    store_all, ref = dc(sp.float32, 1000, steps, device, sp.StoreAll(steps))
    revolve, _ = dc(sp.float32, 1000, steps, device, sp.Revolve(steps, 7))
    monkeypatch.setattr(Sweep, "native_loops", False)      # the tape and Python paths throughout
    stepwise, other = dc(sp.float32, 1000, steps, device, sp.Revolve(steps, 7))
    assert store_all.tobytes() == revolve.tobytes() == stepwise.tobytes()
    assert ref.grads["length"].numpy().tobytes() == other.grads["length"].numpy().tobytes()


_CHILD = """
import sys, json
sys.path.insert(0, {root!r}); sys.path.insert(0, {here!r})
import stepper as sp
import test_param_accuracy as t
value, r = t.dc(sp.float32, 40_000, 60, schedule=sp.Revolve(60, 5))
print(json.dumps([value.tobytes().hex(), r.grads["length"].numpy().tobytes().hex()]))
"""


def test_the_same_bits_on_1_2_and_5_threads():
    """40,000 pendulums: above the parallel threshold, so the chunks are shared out among threads."""
    code = _CHILD.format(root=ROOT, here=HERE)
    runs = {}
    for threads in (1, 2, 5):
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        runs[threads] = json.loads(done.stdout.strip().splitlines()[-1])
    assert runs[1] == runs[2] == runs[5]


@pytest.mark.parametrize("dtype", [sp.vec3], ids=["vec3"])
def test_vector_parameters_are_summed_componentwise_in_float64(dtype):
    """A vec3 parameter's three components each get a float64 sum (ParamSums views them as floats)."""
    from stepper.execute.param_sums import ParamSums
    p = sp.array(np.zeros((2, 3), np.float32), dtype=dtype, requires_grad=True)
    sums = ParamSums({"p": p}, "cpu")
    tiny = np.float32(2e-8)
    p.grad._write_host(np.float32(1.0))
    sums.fold()
    for _ in range(1000):
        p.grad._write_host(tiny)        # each alone is below float32's half ulp of 1.0
        sums.fold()
    sums.finish()
    expected = np.float32(1.0 + 1000 * np.float64(tiny))
    np.testing.assert_array_equal(p.grad.numpy(), np.full((2, 3), expected))
    assert expected != np.float32(1.0)
