"""Sources and receivers at off-grid positions (the README's pattern, used by examples/fwi.py): a
source's value is spread over the four grid points around it with bilinear weights (an
`atomic_add` into s.next after the step's kernel wrote it), a receiver reads the same four points
with the same weights. Both adjoints (the injection's, into the medium and the source's amplitude;
the sampling's, a scatter into the field) against float64 finite differences, and the native paths
against store-all bit for bit."""
import numpy as np
import pytest

import stepper as sp
from stepper.execute.executor import Sweep

G = sp.array(dtype=sp.float64, ndim=2)
F = sp.array(dtype=sp.float64)
I2 = sp.array(dtype=sp.int32, ndim=2)
N, STEPS, DT2 = 14, 30, 0.2


@sp.kernel
def wave(up: G, u: G, m: G, up_next: G, u_next: G):
    i, j = sp.tid()
    x = u[i, j]
    lap = -4.0 * x
    if i > 0:
        lap += u[i - 1, j]
    if i < u.shape[0] - 1:
        lap += u[i + 1, j]
    if j > 0:
        lap += u[i, j - 1]
    if j < u.shape[1] - 1:
        lap += u[i, j + 1]
    up_next[i, j] = x
    u_next[i, j] = 2.0 * x - up[i, j] + DT2 / m[i, j] * lap


@sp.kernel
def inject(m: G, corner: I2, weight: G, amplitude: F, value: F, u_next: G):
    p, c = sp.tid()                       # source p, corner c
    i = corner[p, 0] + c // 2
    j = corner[p, 1] + c % 2
    sp.atomic_add(u_next, i, j, weight[p, c] * DT2 / m[i, j] * amplitude[0] * value[0])


@sp.kernel
def sample_misfit(u: G, corner: I2, weight: G, observed: F, out: F):
    r = sp.tid()
    i = corner[r, 0]
    j = corner[r, 1]
    v = weight[r, 0] * u[i, j] + weight[r, 1] * u[i, j + 1] + weight[r, 2] * u[i + 1, j] + weight[r, 3] * u[i + 1, j + 1]
    d = v - observed[r]
    sp.atomic_add(out, 0, 0.5 * d * d)


def bilinear(points):
    points = np.asarray(points, np.float64)
    corner = np.floor(points).astype(np.int32)
    fx, fz = (points - corner).T
    weights = np.stack([(1 - fx) * (1 - fz), (1 - fx) * fz, fx * (1 - fz), fx * fz], axis=1)
    return sp.array(corner, dtype=sp.int32), sp.array(weights, dtype=sp.float64)


SOURCE = [[6.3, 5.7]]
RECEIVERS = [[3.25, 2.5 + 2.1 * k] for k in range(5)]


def model_and_loss(m=None):
    rng = np.random.default_rng(4)
    model = sp.Model(zero_buffers=False)
    model.state("up", (N, N), sp.float64)
    model.state("u", (N, N), sp.float64)
    model.param("m", sp.array(m if m is not None else 1.0 + 0.3 * rng.random((N, N)), dtype=sp.float64))
    model.param("amplitude", sp.array([1.5], dtype=sp.float64))
    model.series("wavelet", sp.array(np.sin(np.arange(STEPS) * 0.4), dtype=sp.float64))
    model.series("observed", sp.array(0.01 * rng.random((STEPS, len(RECEIVERS))), dtype=sp.float64))
    source, receivers = bilinear(SOURCE), bilinear(RECEIVERS)

    @model.step
    def step(s):
        sp.launch(wave, (N, N), inputs=[s.prev.up, s.prev.u, s.params.m], outputs=[s.next.up, s.next.u])
        sp.launch(inject, (len(SOURCE), 4), inputs=[s.params.m, *source, s.params.amplitude, s.series.wavelet],
                  outputs=[s.next.u])

    def running_loss(s):
        out = s.scratch("misfit", 1, sp.float64, zero=True)
        sp.launch(sample_misfit, len(RECEIVERS), inputs=[s.next.u, *receivers, s.series.observed], outputs=[out])
        return out
    return model, running_loss


def test_a_source_spreads_over_its_four_neighbours_with_bilinear_weights():
    """From rest: step 0 injects sin(0) = 0, so the field stays zero; step 1 injects its value
    times dt^2/m at the four points around (6.3, 5.7), with weights 0.7*0.3, 0.7*0.7, 0.3*0.3 and
    0.3*0.7 (the stencil has nothing to spread yet)."""
    model, _ = model_and_loss(m=np.full((N, N), 2.0))
    zero = np.zeros((N, N))
    assert not model.rollout({"up": zero, "u": zero}, 1).u.numpy().any()
    u = model.rollout({"up": zero, "u": zero}, 2).u.numpy()
    value = DT2 / 2.0 * 1.5 * np.sin(0.4)
    expected = np.zeros((N, N))
    for (di, dj), w in zip([(0, 0), (0, 1), (1, 0), (1, 1)], [0.7 * 0.3, 0.7 * 0.7, 0.3 * 0.3, 0.3 * 0.7]):
        expected[6 + di, 5 + dj] = w * value
    np.testing.assert_allclose(u, expected, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("name", ["m", "amplitude", "u"])
def test_the_injection_and_sampling_adjoints_match_float64_finite_differences(name):
    """The gradient of the receivers' misfit summed over every step, along a random direction,
    against a central difference: in the medium (through the stencil and the injection's dt^2/m),
    the source's amplitude (the injection's adjoint) and the initial field (the sampling's)."""
    model, running_loss = model_and_loss()
    rng = np.random.default_rng(7)
    u0 = 0.01 * rng.random((N, N))
    initial = {"up": u0, "u": u0}
    f = sp.value_and_grad(model, initial, STEPS, running_loss=running_loss, params=[name],
                          schedule=lambda n: sp.Revolve(n, 5))
    theta = f.x0.copy()
    _, grad = f(theta)
    direction = rng.standard_normal(theta.shape)
    eps = 1e-6 * max(1.0, np.abs(theta).max())
    plus, _ = f(theta + eps * direction)
    minus, _ = f(theta - eps * direction)
    f(theta)
    assert np.dot(grad, direction) == pytest.approx((plus - minus) / (2 * eps), rel=1e-6)


def test_sources_and_receivers_run_natively_with_store_alls_bits(monkeypatch):
    model, running_loss = model_and_loss()
    zero = np.zeros((N, N))
    results = []
    for native, schedule in ((False, sp.StoreAll(STEPS)), (True, sp.Revolve(STEPS, 4)), (True, sp.StoreAll(STEPS))):
        monkeypatch.setattr(Sweep, "native_loops", native)
        results.append(model.gradient({"up": zero, "u": zero}, STEPS, running_loss=running_loss, schedule=schedule))
    assert results[1].stats.native_reversals > 0 and results[1].stats.native_steps > 0
    for other in results[1:]:
        assert other.loss == results[0].loss
        for name in ("m", "amplitude", "u", "up"):
            np.testing.assert_array_equal(other.grads[name].numpy(), results[0].grads[name].numpy())
