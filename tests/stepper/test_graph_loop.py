"""GPU step loops (stepper/execute/fast/graph_loop.py): on a GPU, recomputations of a traced step run as CUDA
graph launches (two steps a graph), and recordings reversed at once without a tape
(stepper/execute/fast/native_reverse.py), with the bits of the step-by-step path and of store-all; a run finds
the graph an earlier run captured. On the CUDA simulator."""
import numpy as np
import pytest

import stepper as sp
import stepper.execute.fast.graph_loop as graph_loop
from compiler.backends import cudasim
from stepper.execute.executor import Sweep
from stepper_models import (instances_made, chain_initial, chain_model, same_bits, sum_squares64, wave_initial,
                            wave_model)

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not cudasim.enabled(), reason="runs on the CUDA simulator (STEPPER_CUDA_SIM=1)")]

F64 = sp.array(dtype=sp.float64)
STEPS = 60


@sp.kernel
def total(x: F64, acc: F64):
    i = sp.tid()                          # acc += ...: needs its scratch zero-filled every step
    sp.atomic_add(acc, 0, x[i])


@sp.kernel
def smooth_inside(x: F64, acc: F64, y: F64):
    i = sp.tid()                          # leaves y[0] and y[n-1] alone: the zero fill sets them
    n = x.shape[0]
    if i > 0 and i < n - 1:
        y[i] = 0.25 * x[i - 1] + 0.5 * x[i] + 0.25 * x[i + 1] - 0.001 * acc[0] * x[i]


def zero_relying_model(n=12):
    model = sp.Model("cuda")
    model.state("x", n, sp.float64)

    @model.step
    def step(s):
        acc = s.scratch("acc", 1, sp.float64)
        sp.launch(total, n, inputs=[s.prev.x], outputs=[acc])
        sp.launch(smooth_inside, n, inputs=[s.prev.x, acc], outputs=[s.next.x])
    return model, {"x": np.linspace(0.5, 1.5, n)}


def chain():
    return chain_model(device="cuda"), {k: v.numpy() for k, v in chain_initial().items()}


def loss(state):
    out = sp.zeros(1, dtype=sp.float64, device="cuda")
    sp.launch(sum_squares64, state.x.shape[0], inputs=[state.x], outputs=[out])
    return out


def loops_made(monkeypatch) -> list:
    return instances_made(monkeypatch, graph_loop.GraphLoops)


@pytest.mark.parametrize("schedule", [lambda: sp.Revolve(STEPS, 2), lambda: sp.Revolve(STEPS, 4),
                                      lambda: sp.MultiLevel(STEPS, 1, 2, write_cost=2, read_cost=1)])
@pytest.mark.parametrize("make", [chain, zero_relying_model])
def test_graph_recomputations_give_the_python_paths_and_store_alls_bits(schedule, make, monkeypatch, tmp_path):
    # Peaks compared between runs must not hang on timing: MultiLevel's disk costs are given (measured,
    # they could differ between the runs, and so its plan), and disk copies are synchronous (a copy
    # still in flight holds its version for as long as it takes: two runs' peaks came out 496 and
    # 592 bytes, by timing)
    from stepper.execute.snapshots import Tiers
    monkeypatch.setattr(Tiers, "MAX_IN_FLIGHT", 0)
    model, initial = make()
    stored = model.gradient(initial, STEPS, loss=loss, schedule=sp.StoreAll(STEPS))
    monkeypatch.setattr(Sweep, "native_loops", False)
    python = model.gradient(initial, STEPS, loss=loss, schedule=schedule(), storage=tmp_path / "a.h5")
    monkeypatch.setattr(Sweep, "native_loops", True)
    graphs = model.gradient(initial, STEPS, loss=loss, schedule=schedule(), storage=tmp_path / "b.h5")
    assert python.stats.native_steps == 0 and graphs.stats.native_steps > 0
    # recordings reversed at once go without a tape (stepper/execute/fast/native_reverse.py) on a GPU too, and
    # so does the first sweep's last, recorded natively (the state it started from kept)
    assert python.stats.native_reversals == 0 and graphs.stats.native_reversals == STEPS
    assert graphs.stats.forward_steps == python.stats.forward_steps
    # the ring takes only versions the pool has free: no more memory than step by step
    assert graphs.stats.peak_memory_bytes <= python.stats.peak_memory_bytes
    same_bits(stored, python)
    same_bits(stored, graphs)


def test_runs_find_the_graphs_earlier_runs_captured(monkeypatch):
    """The ring versions go back to the pool to be handed out last and are asked for again, so a
    long Revolve gradient captures few graphs and launches them many times."""
    from compiler.backends.cudasim import driver
    made = loops_made(monkeypatch)
    launched = []
    real = driver.cuGraphLaunch
    monkeypatch.setattr(driver, "cuGraphLaunch", lambda g, s: (launched.append(g), real(g, s))[1])
    model, initial = chain()
    result = model.gradient(initial, 1200, loss=loss, schedule=sp.Revolve(1200, 8))
    loops = made[-1]
    assert loops.calls > 0 and loops.steps == result.stats.native_steps
    assert loops.captures + loops.reuses == loops.calls
    assert loops.reuses > 2 * loops.captures
    assert len(launched) >= (loops.steps - 3 * loops.calls) // 2


def test_short_runs_keep_to_the_python_path(monkeypatch):
    made = loops_made(monkeypatch)
    model, initial = chain()
    result = model.gradient(initial, 40, loss=loss, schedule=sp.Revolve(40, 20))   # recomputations of 1-2 steps
    assert result.stats.native_steps == 0 and made[-1].captures == 0


def wave():
    return wave_model(device="cuda"), {k: v.numpy() for k, v in wave_initial().items()}


def wave_loss(state):
    out = sp.zeros(1, dtype=sp.float64, device="cuda")
    sp.launch(sum_squares64, state.u.shape[0], inputs=[state.u], outputs=[out])
    return out


@pytest.mark.parametrize("make", [chain, zero_relying_model, wave])
def test_store_all_records_without_a_tape_on_a_gpu(make, monkeypatch):
    """StoreAll's recordings of a trusted step keep only the state each started from (the trace's
    launches replayed from Python, no tape), and each is reversed from it natively: the tape path's
    bits and counts, and no more memory. Of that state only what the reversal reads: the wave's
    `up` is not kept, (steps - 2) fewer versions of it than on the tape path."""
    model, initial = make()
    loss_of = wave_loss if make is wave else loss
    monkeypatch.setattr(Sweep, "native_loops", False)
    tape = model.gradient(initial, STEPS, loss=loss_of, schedule=sp.StoreAll(STEPS))
    monkeypatch.setattr(Sweep, "native_loops", True)
    native = model.gradient(initial, STEPS, loss=loss_of, schedule=sp.StoreAll(STEPS))
    assert tape.stats.native_reversals == 0
    assert native.stats.native_reversals == STEPS - 2         # all but the two that trust the step
    for field in ("forward_steps", "recorded_steps", "reverse_steps"):
        assert getattr(native.stats, field) == getattr(tape.stats, field), field
    assert native.stats.peak_memory_bytes <= tape.stats.peak_memory_bytes
    if make is wave:
        assert tape.stats.peak_memory_bytes - native.stats.peak_memory_bytes >= (STEPS - 5) * model.states["up"].nbytes
    same_bits(tape, native)


def test_a_gradients_first_sweep_runs_trusted_steps_from_the_trace(monkeypatch):
    """The graph loops take no run of the first sweep (no spare ring memory yet), so its steps ran
    the step function, each with its checks: ~100 us a step of host time on an H100 (2026-11-26).
    Trusted steps replay their trace there instead, with the step function's bits."""
    import stepper.step.step_context as step_context
    calls = []
    run = step_context.StepRunner.run
    monkeypatch.setattr(step_context.StepRunner, "run", lambda self, *a, **k: (calls.append(a[0]), run(self, *a, **k))[1])
    model, initial = chain()
    fast = model.gradient(initial, STEPS, loss=loss, schedule=sp.Revolve(STEPS, 4))
    assert len(calls) == 2
    monkeypatch.setattr(Sweep, "native_loops", False)
    monkeypatch.setattr(step_context.StepRunner, "trusted", property(lambda self: False))
    same_bits(model.gradient(initial, STEPS, loss=loss, schedule=sp.Revolve(STEPS, 4)), fast)
    assert len(calls) > STEPS


def test_runs_where_the_pool_is_short_take_the_step_by_step_paths_memory(monkeypatch):
    """A gradient's first sweep, and Revolve's runs when its snapshots fill the pool, find no free
    ring: those runs capture graphs of their own in the versions the step-by-step path would take,
    with its bits and never more memory (they kept to the Python path before: on an H100 the 256^2
    wave's Revolve-100 gradient of 10,000 steps ran no step in a graph)."""
    short = []
    real = graph_loop.GraphLoops._in_step_memory
    monkeypatch.setattr(graph_loop.GraphLoops, "_in_step_memory",
                        lambda self, trace, prev, starts, steps, n: (short.append(steps), real(self, trace, prev, starts, steps, n))[1])
    model, initial = wave()
    graphs = model.gradient(initial, 400, loss=wave_loss, schedule=sp.Revolve(400, 4))
    assert short and graphs.stats.native_steps >= sum(short)
    monkeypatch.setattr(Sweep, "native_loops", False)
    python = model.gradient(initial, 400, loss=wave_loss, schedule=sp.Revolve(400, 4))
    same_bits(graphs, python)
    assert graphs.stats.peak_memory_bytes <= python.stats.peak_memory_bytes
