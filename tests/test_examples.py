"""Every example runs, in a short mode, and gives the numbers it promises."""
import importlib.util
import pathlib

import numpy as np
import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"


def load(name):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quickstart_gradient_is_analytic():
    ours, expected = load("quickstart").main()
    assert ours == pytest.approx(expected, rel=1e-5)


def test_recursive_formulations_match_finite_differences():
    ewma_error, blend_error, seed_grad = load("recursive_formulations").main(rows=8, cols=60)
    assert ewma_error < 1e-6 and blend_error < 1e-6
    d = np.array([0.417022, 0.72032449])
    np.testing.assert_allclose(seed_grad, [0.5 * d.sum()] * 2, rtol=1e-12)


def test_cloth_gradients_match_finite_differences(device):
    results = load("cloth").main(size=6, steps=120, device=device)
    for name, (ours, fd) in results.items():
        assert ours == pytest.approx(fd, rel=1e-5), name


def test_wave_inverse_problem_reduces_the_misfit(tmp_path):
    losses, error = load("wave_inverse").main(size=16, steps=300, iterations=3, ram=4, disk=8,
                                              png=str(tmp_path / "wave.png"))
    assert losses[-1] < 0.6 * losses[0]


def test_online_run_stops_on_energy_and_matches_offline_bit_for_bit():
    steps, forward, optimum, same = load("online_energy").main(n=8, threshold=1e-1, snapshots=6)
    assert same
    assert optimum <= forward <= 1.1 * optimum


def test_main_demo_loss_falls(tmp_path, device):
    history = load("demo").main(iterations=12, steps=300, dt=1e-2, n=16, snapshots=6, png=str(tmp_path / "demo.png"),
                                device=device)
    assert history[-1] < 0.5 * history[0]
    try:
        import matplotlib  # noqa: F401   (an optional extra: the demo skips its picture without it)
    except ImportError:
        return
    assert (tmp_path / "demo.png").exists()


def test_diffusivity_is_recovered_with_scipy_lbfgsb():
    pytest.importorskip("scipy", reason="the L-BFGS-B example needs scipy")
    first, last, error0, error = load("diffusivity_inverse").main(cells=20, steps=150, iterations=40)
    assert last < 1e-3 * first and error < 0.2 * error0


def test_fwi_recovers_part_of_the_velocity_anomaly(tmp_path):
    pytest.importorskip("scipy", reason="the FWI example's L-BFGS-B needs scipy")
    history, error0, error = load("fwi").main(size=21, shots=3, iterations=4, snapshots=8,
                                              png=str(tmp_path / "fwi.png"))
    assert min(history) < 0.2 * history[0] and error < 0.9 * error0


def test_learned_forcing_trains_a_network_inside_the_step(tmp_path):
    pytest.importorskip("jax", reason="the example needs jax (in the test extra)")
    pytest.importorskip("optax", reason="the example needs optax (in the test extra)")
    losses, error, jax_bytes, ours_bytes, agreement = load("learned_forcing").main(
        cells=16, steps=120, iterations=6, snapshots=6, png=str(tmp_path / "learned.png"), verbose=False)
    assert losses[-1] < 0.3 * losses[0]
    assert agreement < 1e-10                  # our gradient is pure JAX's (different kernels, same maths)
    assert jax_bytes > 10 * ours_bytes        # every step's activations against Revolve's snapshots


def test_diffusivity_with_hessian_vector_products_reaches_lbfgsb_misfit():
    pytest.importorskip("scipy", reason="the example needs scipy")
    rows, ratio = load("diffusivity_newton").main(cells=20, steps=150, iterations=40,
                                                  methods=("trust-ncg", "Newton-CG (GN, kept)"))
    (_, lbfgs_iters, _, _, _, lbfgs_misfit, _, _), *others = rows
    for _, iters, _, hessps, _, misfit, error, _ in others:
        assert misfit <= lbfgs_misfit and iters < lbfgs_iters and hessps > 0 and error < 0.1
    assert ratio > 0
