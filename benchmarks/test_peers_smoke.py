"""Smoke test of the peer comparison: every configuration whose library is installed computes the
float64 reference gradient of a tiny problem (12 x 12, 20 steps) to float32 accuracy, and the
step-count callback counts what the closed forms say. Runs in-process, so it is quick."""
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from peer_impls import configs  # noqa: E402
from peer_impls.problem import initial, reference_gradient, rollout  # noqa: E402

N, STEPS = 12, 20
NEEDS = {"jax_peers": "jax", "warp_peer": "warp", "ours": "compiler"}


@pytest.fixture(scope="module")
def reference():
    loss, grad = reference_gradient(initial(N), STEPS)
    return loss, grad, rollout(initial(N), STEPS)


@pytest.mark.parametrize("cfg", configs(STEPS), ids=lambda c: c.name)
def test_peer_matches_float64(cfg, reference):
    pytest.importorskip(NEEDS[cfg.module])
    if cfg.family == "equinox":
        pytest.importorskip("equinox")
    import importlib
    module = importlib.import_module(f"peer_impls.{cfg.module}")
    runner = getattr(module, cfg.runner)(N, STEPS, count=cfg.countable, **cfg.kwargs)
    runner.warmup()
    loss, grad, stats = runner.gradient()
    ref_loss, ref_grad, ref_final = reference
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    assert np.abs(grad - ref_grad).max() <= 1e-5 * np.abs(ref_grad).max()
    assert np.abs(runner.forward() - ref_final).max() <= 1e-5
    expected = runner.forward_steps()
    counted = stats.get("forward_steps_counted", stats.get("forward_steps"))
    if expected is not None and counted is not None:
        assert counted == expected
