"""Native step loops (stepper/execute/fast/native_loop.py): recomputations of a traced step run as one compiled
call per Forward action, not Python once per step, and give the bits of the step-by-step path and
of store-all."""
import numpy as np
import pytest

import stepper as sp
import stepper.execute.fast.native_loop as native_loop
from stepper.execute.executor import Sweep
from stepper.step.trace_notes import UntraceableStepWarning
from stepper_models import (chain_initial, chain_model, instances_made, integrate_particles, same_bits, spring_forces,
                            wave_1d, wave_initial, wave_model)

F64 = sp.array(dtype=sp.float64)
F32 = sp.array(dtype=float)
I32 = sp.array(dtype=sp.int32)
V3 = sp.array(dtype=sp.vec3)
STEPS = 30


@sp.kernel
def square_sum(x: F64, out: F64):
    i = sp.tid()
    sp.atomic_add(out, 0, x[i] * x[i])


@sp.kernel
def interior_smooth(x: F64, y: F64):
    i = sp.tid()                          # leaves y[0] and y[n-1] alone: they must be zero-filled
    n = x.shape[0]
    if i > 0 and i < n - 1:
        y[i] = 0.25 * x[i - 1] + 0.5 * x[i] + 0.25 * x[i + 1] + 0.01 * x[i] * x[i]


@sp.kernel
def accumulate_into(x: F64, acc: F64):
    i = sp.tid()                          # acc += ...: needs its scratch zero-filled every step
    sp.atomic_add(acc, 0, x[i])


@sp.kernel
def shift_by(x: F64, acc: F64, y: F64):
    i = sp.tid()
    y[i] = x[i] - 0.001 * acc[0]


def loss(state):
    out = sp.zeros(1, dtype=sp.float64, requires_grad=True)
    sp.launch(square_sum, state.x.shape[0], inputs=[state.x], outputs=[out])
    return out


def zero_relying_model(n=12):
    """Two kernels, a scratch buffer that is accumulated into (zero-filled as asked) and a state
    whose first and last elements only the zero fill of s.next sets."""
    model = sp.Model()
    model.state("x", n, sp.float64)

    @model.step
    def step(s):
        acc = s.scratch("acc", 1, sp.float64)
        sp.launch(accumulate_into, n, inputs=[s.prev.x], outputs=[acc])
        mid = s.scratch("mid", n, sp.float64)
        sp.launch(interior_smooth, n, inputs=[s.prev.x], outputs=[mid])
        sp.launch(shift_by, n, inputs=[mid, acc], outputs=[s.next.x])
    return model, {"x": sp.array(np.linspace(0.5, 1.5, n), dtype=sp.float64)}


def copying_model(n=12):
    """A state written by `sp.copy` (a traced launch of the copy kernel), the other from it."""
    model = sp.Model()
    model.state("x", n, sp.float64)
    model.state("y", n, sp.float64)

    @model.step
    def step(s):
        sp.launch(interior_smooth, n, inputs=[s.prev.y], outputs=[s.next.x])
        sp.copy(s.next.y, s.prev.x)
    return model, {"x": sp.array(np.linspace(0.5, 1.5, n), dtype=sp.float64),
                   "y": sp.array(np.linspace(1.0, -1.0, n), dtype=sp.float64)}


@sp.kernel
def count_high(x: F64, hits: I32, x_next: F64, hits_next: I32):
    i = sp.tid()
    h = hits[i]
    if x[i] > 0.9:
        h = h + 1
    hits_next[i] = h
    x_next[i] = 0.95 * x[i] + 0.01 * x[i] * x[i] + 0.001 * sp.float64(h)


def counting_model(n=12):
    """A float state and an int32 one (no gradient): a stretch's gradients are versions of fewer
    kinds than its states, and take what the states release."""
    model = sp.Model()
    model.state("x", n, sp.float64)
    model.state("hits", n, sp.int32)

    @model.step
    def step(s):
        sp.launch(count_high, n, inputs=[s.prev.x, s.prev.hits], outputs=[s.next.x, s.next.hits])
    return model, {"x": sp.array(np.linspace(0.5, 1.5, n), dtype=sp.float64),
                   "hits": sp.array(np.zeros(n, np.int32), dtype=sp.int32)}


def gradients(model, initial, schedule, native: bool, monkeypatch, steps=STEPS, **kw):
    monkeypatch.setattr(Sweep, "native_loops", native)
    return model.gradient(initial, steps, **{"loss": loss, **kw}, schedule=schedule)


SCHEDULES = [lambda: sp.Revolve(STEPS, 2), lambda: sp.Revolve(STEPS, 5), lambda: sp.MultiLevel(STEPS, 2, 3, write_cost=0, read_cost=0)]


@pytest.mark.filterwarnings("error::stepper.step.trace_notes.UntraceableStepWarning")   # every model here is traced
@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("make", [lambda: (chain_model(), chain_initial()), zero_relying_model, copying_model,
                                  counting_model])
def test_native_recomputations_give_the_python_paths_and_store_alls_bits(schedule, make, monkeypatch, tmp_path):
    model, initial = make()
    storage = str(tmp_path / "snapshots.h5")
    stored = gradients(model, initial, sp.StoreAll(STEPS), False, monkeypatch)
    python = gradients(model, initial, schedule(), False, monkeypatch, storage=storage)
    native = gradients(model, initial, schedule(), True, monkeypatch, storage=storage)
    assert python.stats.native_steps == 0 and stored.stats.native_steps == 0
    assert native.stats.native_steps > 0
    assert native.stats.forward_steps == python.stats.forward_steps
    # the ring reuses the starting version: no more memory than step by step
    assert native.stats.peak_memory_bytes <= python.stats.peak_memory_bytes
    same_bits(stored, python)
    same_bits(stored, native)


@pytest.mark.parametrize("make", [lambda: (chain_model(), chain_initial()), zero_relying_model, copying_model])
def test_store_all_records_trusted_steps_natively_with_the_tapes_bits(make, monkeypatch):
    """StoreAll's recordings of a trusted step keep only the state the step starts from (its
    adjoint replays the step from there): the tape path's bits and counts, and less memory (no
    scratch or tape kept per step)."""
    model, initial = make()
    tape = gradients(model, initial, sp.StoreAll(STEPS), False, monkeypatch)
    native = gradients(model, initial, sp.StoreAll(STEPS), True, monkeypatch)
    assert tape.stats.native_reversals == 0
    assert native.stats.native_reversals == native.stats.native_steps == STEPS - 2    # all but the two that trust
    for field in ("forward_steps", "recorded_steps", "reverse_steps"):
        assert getattr(native.stats, field) == getattr(tape.stats, field), field
    assert native.stats.peak_memory_bytes <= tape.stats.peak_memory_bytes
    same_bits(tape, native)


class OneSweep:
    """Store-all as one recording Forward and one Reverse over every step (how checkpoint_schedules
    writes it), instead of StoreAll's action per step."""

    def __init__(self, steps):
        self.steps = steps

    def __iter__(self):
        yield sp.Forward(0, self.steps, False, True, sp.StorageType.WORK)
        yield sp.EndForward()
        yield sp.Reverse(self.steps, 0, True)
        yield sp.EndReverse()


def wave_loss(state):
    out = sp.zeros(1, dtype=sp.float64, requires_grad=True)
    sp.launch(square_sum, state.u.shape[0], inputs=[state.u], outputs=[out])
    return out


@pytest.mark.parametrize("make", [lambda: (chain_model(), chain_initial()), copying_model,
                                  lambda: (wave_model(), wave_initial())])
def test_store_all_keeps_only_the_states_its_reversals_read(make, monkeypatch):
    """A recording kept for later keeps the part of its start state that its reversal reads
    (StepTrace.reversal_reads): the chain's adjoint reads x and v, the copying model's y (its
    smoothing is nonlinear; the copy of x reads nothing in its adjoint), and the wave's only u (``-up``'s derivative is a constant; ``next.up = u`` reads u).
    The rest of each state takes turns in two versions: the chain's StoreAll holds (steps - 2)
    fewer copies of `v`'s than with every state kept, with the same bits as the tape path, Revolve's
    and a run keeping everything. A copied state whose source is kept costs nothing either way
    (its copy is renamed: the source's kept array): the wave's up, and the copying model's y where
    x is kept too."""
    model, initial = make()
    is_wave = "up" in model.states
    loss_of = wave_loss if is_wave else loss
    kept = []
    real_keep = native_loop.NativeLoops.advance_keeping
    keep_all = False

    def keeping(self, trace, prev, steps, keep, *at):
        kept.append(keep)
        return real_keep(self, trace, prev, steps, frozenset(self._names) if keep_all else keep, *at)
    monkeypatch.setattr(native_loop.NativeLoops, "advance_keeping", keeping)
    tape = gradients(model, initial, sp.StoreAll(STEPS), False, monkeypatch, loss=loss_of)
    native = gradients(model, initial, sp.StoreAll(STEPS), True, monkeypatch, loss=loss_of)
    revolve = gradients(model, initial, sp.Revolve(STEPS, 4), True, monkeypatch, loss=loss_of)
    keep_all = True
    everything = gradients(model, initial, sp.StoreAll(STEPS), True, monkeypatch, loss=loss_of)
    expected = {"x", "v"} if "v" in model.states else {"u"} if is_wave else {"y"}
    assert kept[0] == expected
    for other in (native, revolve, everything):
        same_bits(tape, other)
    assert native.stats.native_reversals == STEPS - 2
    unkept = sum(spec.nbytes for name, spec in model.states.items() if name not in expected)
    if "v" in model.states:
        assert everything.stats.renamed_copies == 0
        assert everything.stats.peak_memory_bytes - native.stats.peak_memory_bytes >= (STEPS - 5) * unkept
    else:
        assert everything.stats.renamed_copies == STEPS - 2
        assert native.stats.renamed_copies == (STEPS - 2 if is_wave else 0)    # (x is not kept)
        assert everything.stats.peak_memory_bytes <= native.stats.peak_memory_bytes


@sp.kernel
def damped_smooth(x: F64, y: F64, x_next: F64):
    i = sp.tid()                          # nonlinear in both: a reversal reads x and y
    n = x.shape[0]
    x_next[i] = 0.5 * x[i] + 0.25 * x[sp.max(i - 1, 0)] + 0.25 * x[sp.min(i + 1, n - 1)] - 0.1 * x[i] * y[i]


def rotating_model(n=64):
    """A state written by `sp.copy` from another that its reversal reads (an FWI step's
    ``sp.copy(s.next.up, s.prev.u)``, both read by its adjoint)."""
    model = sp.Model()
    model.state("x", n, sp.float64)
    model.state("y", n, sp.float64)

    @model.step
    def step(s):
        sp.launch(damped_smooth, n, inputs=[s.prev.x, s.prev.y], outputs=[s.next.x])
        sp.copy(s.next.y, s.prev.x)
    return model, {"x": sp.array(np.linspace(0.5, 1.5, n), dtype=sp.float64),
                   "y": sp.array(np.linspace(1.0, -1.0, n), dtype=sp.float64)}


@pytest.mark.parametrize("steps", [3, 4, 5, STEPS])
def test_store_all_keeps_a_copied_state_once(steps, monkeypatch):
    """StoreAll's native recordings rename a whole-state copy whose source they keep: no copy runs,
    and step k + 1's y is step k's x itself (one array kept a step, not two). The tape path's bits,
    the copies counted as renamed, and (steps - 2) arrays less than the same run copying."""
    model, initial = rotating_model()
    tape = gradients(model, initial, sp.StoreAll(steps), False, monkeypatch, steps=steps)
    native = gradients(model, initial, sp.StoreAll(steps), True, monkeypatch, steps=steps)
    assert native.stats.renamed_copies == native.stats.native_steps == steps - 2
    same_bits(tape, native)
    monkeypatch.setattr(native_loop, "renamed_copies", lambda launches, nxt: [])
    copying = gradients(model, initial, sp.StoreAll(steps), True, monkeypatch, steps=steps)
    assert copying.stats.renamed_copies == 0
    same_bits(tape, copying)
    nbytes = model.states["y"].nbytes
    assert copying.stats.peak_memory_bytes - native.stats.peak_memory_bytes >= (steps - 3) * nbytes


@pytest.mark.parametrize("steps", [3, 4, 5])
def test_short_store_all_runs_keep_the_tapes_bits(steps, monkeypatch):
    """Runs of one, two and three steps kept natively (after the two that trust the step): the
    state not kept takes turns in none, one and two versions."""
    model, initial = wave_model(), wave_initial()
    monkeypatch.setattr(Sweep, "native_loops", False)
    tape = model.gradient(initial, steps, loss=wave_loss, schedule=sp.StoreAll(steps))
    monkeypatch.setattr(Sweep, "native_loops", True)
    native = model.gradient(initial, steps, loss=wave_loss, schedule=sp.StoreAll(steps))
    assert native.stats.native_steps == steps - 2
    same_bits(tape, native)


@pytest.mark.parametrize("schedule", [sp.StoreAll, OneSweep])
@pytest.mark.parametrize("make", [lambda: (chain_model(), chain_initial()), zero_relying_model, copying_model])
def test_store_all_records_in_one_native_call_and_reverses_in_one_stretch(schedule, make, monkeypatch):
    """A store-all forward sweep of a trusted step keeps every step's start state in one native
    call (NativeLoops.advance_keeping), whether the schedule records step by step or in one action;
    after the first reversal (which plans it) the reverse sweep is one native stretch. The tape
    path's bits, counts and memory."""
    import stepper.execute.fast.native_sweep as native_sweep
    runs, stretches = [], []
    real_keep, real_run = native_loop.NativeLoops.advance_keeping, native_sweep.NativeSweep.run
    monkeypatch.setattr(native_loop.NativeLoops, "advance_keeping",
                        lambda self, t, prev, steps, keep, *at: runs.append(steps) or real_keep(self, t, prev, steps, keep, *at))
    monkeypatch.setattr(native_sweep.NativeSweep, "run", lambda self, a: stretches.append(a) or real_run(self, a))
    model, initial = make()
    tape = gradients(model, initial, sp.StoreAll(STEPS), False, monkeypatch)
    native = gradients(model, initial, schedule(STEPS), True, monkeypatch)
    assert runs == [STEPS - 2]                       # the first two steps establish the trace and trust it
    # the reverse sweep after its first step, down to the two steps recorded on the tape (StoreAll:
    # one more that takes the Move before the last and stops at that tape-recorded step's Reverse)
    assert len(stretches) == (2 if schedule is sp.StoreAll else 1)
    assert native.stats.native_reversals == STEPS - 2
    for field in ("forward_steps", "recorded_steps", "reverse_steps"):
        assert getattr(native.stats, field) == getattr(tape.stats, field), field
    assert native.stats.peak_memory_bytes <= tape.stats.peak_memory_bytes
    same_bits(tape, native)


def test_recomputations_make_one_native_call_per_forward_action_and_no_python_launches(monkeypatch):
    """Each first-sweep Forward is one call into the driver once the step is trusted, and so is
    the first sweep's last step, recorded natively (its start kept); the reverse sweep's advances
    and recordings run inside one native stretch. Python relaunches nothing."""
    import stepper.step.trace as trace
    relaunched, calls = [], []
    real_relaunch, real_advance = trace.relaunch, native_loop.NativeLoops.advance
    monkeypatch.setattr(trace, "relaunch", lambda kernel, *a, **k: (relaunched.append(kernel),
                                                                    real_relaunch(kernel, *a, **k)))

    def advance(self, trace_, prev, steps, *at):
        calls.append(steps)
        return real_advance(self, trace_, prev, steps, *at)
    monkeypatch.setattr(native_loop.NativeLoops, "advance", advance)
    model, initial = chain_model(), chain_initial()
    result = model.gradient(initial, STEPS, loss=loss, schedule=sp.Revolve(STEPS, 3))
    actions = list(sp.Revolve(STEPS, 3))
    first_sweep = actions[:actions.index(sp.EndForward())]
    assert [a.n1 - a.n0 for a in first_sweep] == [16, 9, 4, 1] and first_sweep[-1].write_adj_deps
    # the first Forward calls the step function twice (those steps establish the trace and trust
    # it), then runs the rest of its steps natively; the last Forward records (advance_keeping)
    assert calls == [14, 9, 4]
    evaluations = sum(a.n1 - a.n0 for a in actions if type(a) is sp.Forward)
    # every other evaluation ran natively: advanced, or recorded and reversed at once (29 steps)
    assert result.stats.native_steps + 29 == evaluations - 2
    assert result.stats.native_reversals == result.stats.recorded_steps == STEPS     # and the kept one
    assert relaunched == []


def loops_made(monkeypatch) -> list:
    return instances_made(monkeypatch, native_loop.NativeLoops)


@sp.kernel
def clamped_smooth(x: F64, y: F64):
    i = sp.tid()                          # writes every element: no zero fill needed
    n = x.shape[0]
    y[i] = 0.25 * x[sp.max(i - 1, 0)] + 0.5 * x[i] + 0.25 * x[sp.min(i + 1, n - 1)] + 0.01 * x[i] * x[i]


def renaming_model(zero_buffers: bool, read_copy: bool = False, n=12):
    """copying_model's step written whole (so it may skip zero fills); with `read_copy` a later
    launch reads the copy, so s.next.y must be written every step."""
    model = sp.Model(zero_buffers=zero_buffers)
    for name in ("x", "y", "z"):
        model.state(name, n, sp.float64)

    @model.step
    def step(s):
        sp.launch(clamped_smooth, n, inputs=[s.prev.y], outputs=[s.next.x])
        sp.copy(s.next.y, s.prev.x)
        sp.launch(clamped_smooth, n, inputs=[s.next.y if read_copy else s.prev.z], outputs=[s.next.z])
    return model, {"x": sp.array(np.linspace(0.5, 1.5, n), dtype=sp.float64),
                   "y": sp.array(np.linspace(1.0, -1.0, n), dtype=sp.float64),
                   "z": sp.array(np.cos(np.arange(n)), dtype=sp.float64)}


@pytest.mark.parametrize("steps", [3, 4, 5, 6, 9, 30])
@pytest.mark.parametrize("make", [lambda: copying_model(), lambda: renaming_model(True), lambda: renaming_model(False),
                                  lambda: (wave_model(), wave_initial())])
def test_a_copy_of_a_state_is_a_buffer_rename_in_native_runs(steps, make, monkeypatch):
    """``sp.copy(s.next.y, s.prev.x)`` in a native run of two steps or more: every step skips the
    copy and reads the buffer itself the next step (sp_advance turns x's buffers over three, or two
    in place); the result's y is the x the run wrote before its last step, so it owns its buffers
    (a run of one step copies). So does a kernel that copies as it goes (the wave's
    ``up_next[i] = x``, x = u[i]: a variant without that store runs instead). The step-by-step
    path's bits for every run length (the first two steps of a rollout run in Python and trust the
    trace), with and without zero fills, and in checkpointed gradients from snapshots that others
    hold (store-all's bits)."""
    made = loops_made(monkeypatch)
    model, initial = make()
    monkeypatch.setattr(Sweep, "native_loops", False)
    python = model.rollout(initial, steps)
    monkeypatch.setattr(Sweep, "native_loops", True)
    native = model.rollout(initial, steps)
    loops = made[-1]
    assert loops.steps == steps - 2 and loops.renamed_copies == (steps - 2 if steps > 3 else 0)
    for name in python:
        np.testing.assert_array_equal(native[name].numpy(), python[name].numpy(), err_msg=name)
    loss_of = x_and_z_loss if "z" in model.states else wave_loss if "up" in model.states else loss
    stored = gradients(model, initial, sp.StoreAll(STEPS), False, monkeypatch, loss=loss_of)
    revolve = gradients(model, initial, sp.Revolve(STEPS, 3), True, monkeypatch, loss=loss_of)
    assert revolve.stats.renamed_copies == made[-1].renamed_copies > 0
    assert stored.stats.renamed_copies == 0           # the Python path copies
    same_bits(stored, revolve)


def x_and_z_loss(state):
    out = sp.zeros(1, dtype=sp.float64, requires_grad=True)
    sp.launch(square_sum, state.z.shape[0], inputs=[state.z], outputs=[out])
    sp.launch(square_sum, state.x.shape[0], inputs=[state.x], outputs=[out])
    return out


def part_copying_wave(n=16):
    """The 1-D wave launched over all but the last element: its identity store copies part of u."""
    model = sp.Model()
    model.state("up", n, sp.float64)
    model.state("u", n, sp.float64)

    @model.step
    def step(s):
        sp.launch(wave_1d, n - 1, inputs=[s.prev.up, s.prev.u, 0.2], outputs=[s.next.up, s.next.u])
    return model, wave_initial(n)


@pytest.mark.parametrize("make", [lambda: renaming_model(False, read_copy=True), part_copying_wave])
def test_a_copy_that_is_read_or_partial_is_not_renamed(make, monkeypatch):
    """A copy a later launch reads must be written every step; a kernel whose identity store
    covers part of the state (launched over fewer threads) copies only that part."""
    made = loops_made(monkeypatch)
    model, initial = make()
    monkeypatch.setattr(Sweep, "native_loops", False)
    python = model.rollout(initial, 12)
    monkeypatch.setattr(Sweep, "native_loops", True)
    native = model.rollout(initial, 12)
    assert made[-1].steps == 10 and made[-1].renamed_copies == 0
    for name in python:
        np.testing.assert_array_equal(native[name].numpy(), python[name].numpy(), err_msg=name)


def test_a_step_that_is_not_traced_stays_on_the_python_path(monkeypatch):
    """A step whose launches depend on its index is not replayed: nothing runs natively."""
    n = 16
    model = sp.Model()
    model.state("x", n, sp.float64)
    initial = {"x": sp.array(np.linspace(0.5, 1.5, n), dtype=sp.float64)}

    @model.step
    def step(s):
        acc = s.scratch("acc", 1, sp.float64)
        sp.launch(accumulate_into, n if s.n % 2 else n - 1, inputs=[s.prev.x], outputs=[acc])
        sp.launch(shift_by, n, inputs=[s.prev.x, acc], outputs=[s.next.x])
    with pytest.warns(UntraceableStepWarning, match="branches on the step"):
        stored = gradients(model, initial, sp.StoreAll(STEPS), True, monkeypatch)
    result = gradients(model, initial, sp.Revolve(STEPS, 3), True, monkeypatch)
    assert result.stats.native_steps == 0
    same_bits(stored, result)


def test_native_loops_run_deterministic_atomics_in_order(monkeypatch):
    """Float atomics scattered into a vec3 force (spring_forces) run serially in deterministic
    mode, in the native loop too: the state has the bits of store-all."""
    n = 64
    model = sp.Model(dt=0.01)
    model.state("x", n, sp.vec3)
    model.state("v", n, sp.vec3)
    model.param("k", sp.array(np.array([3.0], np.float32)))
    model.param("g", sp.array(np.array([9.8], np.float32)))

    @model.step
    def step(s):
        f = s.scratch("f", n, sp.vec3)
        sp.launch(spring_forces, n - 1, inputs=[s.prev.x, s.params.k], outputs=[f])
        sp.launch(integrate_particles, n, inputs=[s.prev.x, s.prev.v, f, s.params.g, s.dt],
                  outputs=[s.next.x, s.next.v])
    rng = np.random.default_rng(1)
    x0 = np.stack([np.arange(n), np.zeros(n), np.zeros(n)], 1).astype(np.float32) * 1.1
    initial = {"x": sp.array(x0 + 0.01 * rng.standard_normal((n, 3)).astype(np.float32), dtype=sp.vec3),
               "v": sp.array(np.zeros((n, 3), np.float32), dtype=sp.vec3)}

    def vec_loss(state):
        out = sp.zeros(1, requires_grad=True)
        sp.launch(vec_square_sum, n, inputs=[state.x], outputs=[out])
        return out
    monkeypatch.setattr(Sweep, "native_loops", True)
    stored = model.gradient(initial, STEPS, loss=vec_loss, schedule=sp.StoreAll(STEPS))
    native = model.gradient(initial, STEPS, loss=vec_loss, schedule=sp.Revolve(STEPS, 3))
    assert native.stats.native_steps > 0
    same_bits(stored, native)


@sp.kernel
def vec_square_sum(x: V3, out: F32):
    i = sp.tid()
    sp.atomic_add(out, 0, sp.dot(x[i], x[i]))


@sp.kernel
def damped_by_product(x: F64, n: int, y: F64):
    i = sp.tid()
    p = sp.float64(1.0)
    for k in range(n):                    # a runtime trip count: the adjoint keeps a loop tape
        p *= 0.5 + 0.01 * x[k]
    y[i] = x[i] * 0.9 + 0.01 * p


def test_a_step_whose_adjoint_keeps_a_loop_tape_is_reversed_on_the_tape_path(monkeypatch):
    """Native reversal packs adjoints once; one that needs per-call tape memory keeps the tape
    path (recomputations still run natively), with store-all's bits."""
    assert damped_by_product.compiled().needs_tape
    model = sp.Model()
    model.state("x", 6, sp.float64)
    model.step(lambda s: sp.launch(damped_by_product, 6, inputs=[s.prev.x, 6], outputs=[s.next.x]))
    initial = {"x": sp.array(np.linspace(0.5, 1.5, 6), dtype=sp.float64)}
    stored = gradients(model, initial, sp.StoreAll(STEPS), True, monkeypatch)
    native = gradients(model, initial, sp.Revolve(STEPS, 3), True, monkeypatch)
    assert native.stats.native_reversals == 0 and native.stats.native_steps > 0
    same_bits(stored, native)


class Edited:
    """A schedule's actions with one replaced: a schedule with a mistake."""

    def __init__(self, schedule, at, replace):
        self.actions = list(schedule)
        self.at, self.replace = at, replace

    def __iter__(self):
        for k, a in enumerate(self.actions):
            yield self.replace(a) if k == self.at else a


def test_a_native_stretch_leaves_the_executors_state_and_statistics(monkeypatch):
    """The reverse sweep's stretch (stepper/execute/fast/native_sweep.py) works out holds, snapshots and counts
    as the executor would: same bits, same counts, no more memory, nothing left held."""
    import stepper.execute.fast.native_sweep as native_sweep
    stretches = []
    real = native_sweep.NativeSweep.run
    monkeypatch.setattr(native_sweep.NativeSweep, "run", lambda self, a: stretches.append(a) or real(self, a))
    model, initial = chain_model(), chain_initial()
    python = gradients(model, initial, sp.Revolve(STEPS, 4), False, monkeypatch)
    native = gradients(model, initial, sp.Revolve(STEPS, 4), True, monkeypatch)
    assert len(stretches) == 1                # the whole reverse sweep after its first Reverse
    same_bits(python, native)
    for field in ("forward_steps", "recorded_steps", "reverse_steps", "launches_skipped", "snapshots"):
        assert getattr(native.stats, field) == getattr(python.stats, field), field
    assert native.stats.peak_memory_bytes <= python.stats.peak_memory_bytes


def test_schedule_mistakes_inside_a_stretch_are_the_executors_errors(monkeypatch):
    """A stretch ends before an action it cannot take; the executor then runs it and says what is
    wrong, as without native stretches."""
    actions = list(sp.Revolve(STEPS, 3))
    copy_at = next(k for k, a in enumerate(actions) if type(a) is sp.Copy and k > actions.index(sp.EndForward()))
    reverse_at = next(k for k in range(copy_at, len(actions)) if type(actions[k]) is sp.Reverse)
    model, initial = chain_model(), chain_initial()
    for native in (False, True):
        monkeypatch.setattr(Sweep, "native_loops", native)
        unwritten = Edited(sp.Revolve(STEPS, 3), copy_at, lambda a: sp.Copy(STEPS - 1, a.from_storage, a.to_storage))
        with pytest.raises(sp.ModelError, match=f"reads RAM snapshot {STEPS - 1}, which it never wrote"):
            model.gradient(initial, STEPS, loss=loss, schedule=unwritten)
        skipping = Edited(sp.Revolve(STEPS, 3), reverse_at, lambda a: sp.Reverse(a.n1 - 1, a.n0 - 1, a.clear_adj_deps))
        with pytest.raises(sp.ModelError, match="but the adjoint is at step"):
            model.gradient(initial, STEPS, loss=loss, schedule=skipping)


def test_store_all_mistakes_are_named_as_the_schedule_wrote_them(monkeypatch):
    """StoreAll's recordings run as one native call and its reverse sweep as a stretch, but a
    recording that skips a step, or a Reverse of the wrong step, is still named as written."""
    actions = list(sp.StoreAll(STEPS))
    forward_at = actions.index(sp.Forward(20, 21, False, True, sp.StorageType.RAM))
    reverse_at = actions.index(sp.Reverse(10, 9, True))
    model, initial = chain_model(), chain_initial()
    for native in (False, True):
        monkeypatch.setattr(Sweep, "native_loops", native)
        skipping = Edited(sp.StoreAll(STEPS), forward_at, lambda a: sp.Forward(21, 22, False, True, a.storage))
        with pytest.raises(sp.ModelError, match=r"asks for Forward\(n0=21, n1=22, .* but the state is at step 20"):
            model.gradient(initial, STEPS, loss=loss, schedule=skipping)
        wrong = Edited(sp.StoreAll(STEPS), reverse_at, lambda a: sp.Reverse(9, 8, True))
        with pytest.raises(sp.ModelError, match=r"asks for Reverse\(n1=9, n0=8, .* but the adjoint is at step 10"):
            model.gradient(initial, STEPS, loss=loss, schedule=wrong)


@pytest.mark.parametrize("make, unread", [(copying_model, {0, 1}), (zero_relying_model, {2}),
                                          (lambda: (chain_model(), chain_initial()), {1})])
def test_a_recording_reversed_at_once_runs_only_the_launches_a_later_one_reads(make, unread, monkeypatch):
    """A recording whose reversal comes next needs its step's outputs for nothing (each adjoint
    replays its launch from that launch's inputs): it runs only launches whose outputs a later
    launch of the step reads. The copying model's kernel and copy both stay unrun; a scratch a
    later launch reads is still computed. Both paths skip the same launches, with store-all's bits."""
    import stepper.execute.fast.native_reverse as native_reverse
    traces = []
    real = native_reverse.NativeReversal.reverse
    monkeypatch.setattr(native_reverse.NativeReversal, "reverse",
                        lambda self, trace, prev, carry, n: traces.append(trace) or real(self, trace, prev, carry, n))
    model, initial = make()
    stored = gradients(model, initial, sp.StoreAll(STEPS), False, monkeypatch)
    python = gradients(model, initial, sp.Revolve(STEPS, 3), False, monkeypatch)
    native = gradients(model, initial, sp.Revolve(STEPS, 3), True, monkeypatch)
    assert traces[-1].unread == unread
    assert native.stats.launches_skipped == python.stats.launches_skipped >= (STEPS - 2) * len(unread)
    same_bits(stored, python)
    same_bits(stored, native)


def test_store_all_running_out_of_memory_midway_raises_and_leaves_the_model_usable(monkeypatch):
    """Memory running out while StoreAll's recordings take their versions (in one native run) is a
    MemoryError naming the version asked for; nothing is left half-done, and the next gradient
    gives the same bits as one that never failed."""
    import stepper.step.versions as versions
    model, initial = copying_model()
    before = gradients(model, initial, sp.StoreAll(STEPS), True, monkeypatch)
    real, calls = versions.allocate, []

    def allocate(*args):
        calls.append(args)
        if len(calls) > 12:
            raise MemoryError("out of memory")
        return real(*args)
    monkeypatch.setattr(versions, "allocate", allocate)
    sp.release_memory()                  # (else the first run's memory serves this one)
    with pytest.raises(MemoryError, match=r"a new version of shape \(12,\) and dtype float64 on cpu: out of memory") \
            as raised:
        model.gradient(initial, STEPS, loss=loss, schedule=sp.StoreAll(STEPS))
    assert any(entry.name == "advance_keeping" for entry in raised.traceback)
    monkeypatch.setattr(versions, "allocate", real)
    same_bits(before, gradients(model, initial, sp.StoreAll(STEPS), True, monkeypatch))

