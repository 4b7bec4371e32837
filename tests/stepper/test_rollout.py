"""Forward rollouts: results, callbacks, history, early stops, finiteness checks, and resuming a
killed run from its HDF5 checkpoints to the same bits."""
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

import stepper as sp
from step_kernels import double, total
from stepper_models import chain_initial, chain_model

HERE = os.path.dirname(os.path.abspath(__file__))


def test_rollout_matches_a_hand_written_loop(device):
    model, initial = chain_model(device=device), chain_initial(device=device)
    final = model.rollout(initial, 30)
    x, v = initial["x"], initial["v"]
    # the same kernels by hand, with fresh buffers each step
    from stepper_models import chain_force, chain_integrate
    for _ in range(30):
        f = sp.zeros(16, dtype=sp.float64, device=device)
        sp.launch(chain_force, 16, inputs=[x, model.params.k, 1.0, 16], outputs=[f])
        xn, vn = sp.zeros(16, dtype=sp.float64, device=device), sp.zeros(16, dtype=sp.float64, device=device)
        sp.launch(chain_integrate, 16, inputs=[x, v, f, model.params.c, model.dt], outputs=[xn, vn])
        x, v = xn, vn
    np.testing.assert_array_equal(final.x.numpy(), x.numpy())
    np.testing.assert_array_equal(final.v.numpy(), v.numpy())
    assert final.steps == 30 and final.stats.steps == 30
    np.testing.assert_array_equal(initial["x"].numpy(), chain_initial(device=device)["x"].numpy())   # input untouched


def test_callback_history_and_time(device):
    model = sp.Model(dt=0.5, t0=1.0, device=device)
    model.state("x", 2)
    times = []

    @model.step
    def step(s):
        times.append(s.t)
        sp.launch(double, 2, inputs=[s.prev.x], outputs=[s.next.x])
    seen = []
    final = model.rollout({"x": sp.array([1.0, -1.0], device=device)}, 6,
                          callback=lambda n, s: seen.append((n, s.x.numpy()[0])), every=2, record_every=3)
    assert times == [1.0, 1.5, 2.0, 2.5, 3.0, 3.5]
    assert seen == [(2, 4.0), (4, 16.0), (6, 64.0)]
    assert [n for n, _ in final.history] == [3, 6]
    np.testing.assert_array_equal(final.history[0][1]["x"], [8.0, -8.0])


def test_until_stops_early(device):
    model = sp.Model(device=device)
    model.state("x", 1)
    model.step(lambda s: sp.launch(double, 1, inputs=[s.prev.x], outputs=[s.next.x]))
    final = model.rollout({"x": sp.array([1.0], device=device)}, 100, until=lambda s: s.x.numpy()[0] > 1000)
    assert final.steps == 10 and final.x.numpy()[0] == 1024.0


def total_of_x(state):
    out = sp.zeros(1, device=state.x.device)
    sp.launch(total, state.x.shape[0], inputs=[state.x], outputs=[out])
    return out


def test_check_finite_reports_the_first_bad_step(device):
    model = sp.Model(device=device)
    model.state("x", 3)
    model.step(lambda s: sp.launch(double, 3, inputs=[s.prev.x], outputs=[s.next.x]))
    initial = {"x": sp.array([1.0, 2.0 ** 20, 1.0], device=device)}
    with pytest.raises(sp.NonFiniteError) as info:
        model.rollout(initial, 200, check_finite=True)
    # float32 overflows past 2**127: element 1 (2**20) becomes inf in step 107 (its result is 2**128)
    assert info.value.step == 107 and info.value.state == "x" and info.value.index == (1,)
    assert "step 107" in str(info.value) and "'x'" in str(info.value)
    with pytest.raises(sp.NonFiniteError, match="step 107"):
        model.gradient(initial, 200, loss=total_of_x, schedule=sp.Revolve(200, 4), check_finite=True)
    assert model.rollout(initial, 200).x.numpy()[1] == np.inf        # unchecked: runs through


def test_checkpoints_and_resume_of_a_finished_run(tmp_path, device):
    model, initial = chain_model(device=device), chain_initial(device=device)
    path = tmp_path / "run.ckpt"
    final = model.rollout(initial, 25, checkpoint=path, checkpoint_every=10)
    assert final.stats.checkpoints_written == 4          # steps 0, 10, 20 and the end
    # one file per checkpoint; the two newest are kept
    assert sorted(os.listdir(path)) == ["step-000000000020.h5", "step-000000000025.h5"]
    with sp.HDF5Storage(path / "step-000000000025.h5", mode="r") as store:
        assert store.steps() == [25]
        np.testing.assert_array_equal(store.read(25).arrays["x"], final.x.numpy())
    again = model.resume(path)
    assert again.steps == 25 and again.stats.steps == 0
    np.testing.assert_array_equal(again.x.numpy(), final.x.numpy())
    longer = model.resume(path, steps=40)
    np.testing.assert_array_equal(longer.x.numpy(), model.rollout(initial, 40).x.numpy())


def test_resume_after_killing_the_process_gives_the_same_bits(tmp_path, device):
    path = str(tmp_path / "killed.ckpt")
    steps, every = 400, 20
    env = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
    child = subprocess.Popen([sys.executable, os.path.join(HERE, "resume_child.py"), path, str(steps), str(every),
                              device], stdout=subprocess.PIPE, text=True, env=env)
    try:
        for line in child.stdout:
            if line.strip() == "130":       # mid-run, between snapshots
                break
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait()
    assert child.returncode == -signal.SIGKILL
    model, initial = chain_model(device=device), chain_initial(device=device)
    resumed = model.resume(path)
    assert resumed.steps == steps and 0 < resumed.stats.steps < steps - 100
    straight = model.rollout(initial, steps)
    np.testing.assert_array_equal(resumed.x.numpy(), straight.x.numpy())
    np.testing.assert_array_equal(resumed.v.numpy(), straight.v.numpy())


def test_rollout_progress_bar_follows_the_option(capsys, device):
    pytest.importorskip("tqdm")
    model, initial = chain_model(device=device), chain_initial(device=device)
    model.rollout(initial, 5, progress=False)
    assert capsys.readouterr().err == ""
    model.rollout(initial, 5, progress=True)
    assert "rollout:" in capsys.readouterr().err


def test_check_finite_blames_a_bad_initial_state_on_itself_not_on_step_0(device):
    model = sp.Model(device=device)
    model.state("x", 3)
    model.step(lambda s: sp.launch(double, 3, inputs=[s.prev.x], outputs=[s.next.x]))
    initial = {"x": sp.array([1.0, 2.0, np.nan], device=device)}
    for run in (lambda: model.rollout(initial, 10, check_finite=True),
                lambda: model.gradient(initial, 10, loss=total_of_x, schedule=sp.Revolve(10, 3), check_finite=True)):
        with pytest.raises(sp.NonFiniteError, match=r"the initial state 'x' holds nan at index \(2,\), before any "
                                                    r"step ran: fix the initial values") as info:
            run()
        assert info.value.step is None and info.value.index == (2,)
