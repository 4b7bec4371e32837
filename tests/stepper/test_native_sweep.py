"""A native stretch's one-step recomputations (stepper/execute/fast/native_sweep.py, `_renamed_step`): a step
whose whole-state copy (``s.next.y = s.prev.x``) is renamed shares that array with the state it
started from, and neither is written over while the other is held."""
import pytest

import stepper as sp
import stepper.execute.fast.native_sweep as native_sweep
from stepper.execute.executor import Sweep
from stepper_models import wave_initial, wave_model
from test_native_loop import STEPS, copying_model, gradients, loss, renaming_model, same_bits, wave_loss, x_and_z_loss

MODELS = [(copying_model, loss), (lambda: renaming_model(False), x_and_z_loss),
          (lambda: renaming_model(True), x_and_z_loss),            # zero fills of s.next but the copy's
          (lambda: (wave_model(), wave_initial()), wave_loss)]


@pytest.mark.parametrize("make, loss_of", MODELS)
@pytest.mark.parametrize("schedule", [lambda: sp.Revolve(STEPS, 10),
                                      lambda: sp.MultiLevel(STEPS, 6, 3, write_cost=0, read_cost=0)])
def test_one_step_recomputations_share_the_array_their_copy_renames(make, loss_of, schedule, monkeypatch, tmp_path):
    """Revolve's innermost recomputations advance one step and keep the result as a snapshot: the
    step runs without its copy and the new snapshot's `y` is the array of the one before. With
    disk snapshots between (MultiLevel) a later stretch finds snapshots sharing arrays. Store-all's
    and the Python path's bits, and the copies counted as renamed."""
    shared = []
    real = native_sweep._Stretch._renamed_step
    monkeypatch.setattr(native_sweep._Stretch, "_renamed_step",
                        lambda self, start, renamed: shared.append(renamed) or real(self, start, renamed))
    model, initial = make()
    storage = str(tmp_path / "snapshots.h5")
    stored = gradients(model, initial, sp.StoreAll(STEPS), False, monkeypatch, loss=loss_of)
    python = gradients(model, initial, schedule(), False, monkeypatch, loss=loss_of, storage=storage)
    native = gradients(model, initial, schedule(), True, monkeypatch, loss=loss_of, storage=storage)
    assert shared and native.stats.renamed_copies >= len(shared)
    assert native.stats.peak_buffer_bytes <= python.stats.peak_buffer_bytes
    same_bits(stored, python)
    same_bits(stored, native)


class FromOneSnapshot:
    """Every step recomputed from one snapshot of step 0: one step (whose copy is renamed: the
    result shares an array with the snapshot), then the rest in one advance, which must not take
    the shared result's buffers for its ring."""

    def __init__(self, steps):
        self.steps = steps

    def __iter__(self):
        n, ram, work = self.steps, sp.StorageType.RAM, sp.StorageType.WORK
        yield sp.Forward(0, n - 1, True, False, ram)
        yield sp.Forward(n - 1, n, False, True, work)
        yield sp.EndForward()
        yield sp.Reverse(n, n - 1, True)
        for k in range(n - 2, -1, -1):
            yield (sp.Copy if k else sp.Move)(0, ram, work)
            if k >= 1:
                yield sp.Forward(0, 1, False, False, work)
            if k >= 2:
                yield sp.Forward(1, k, False, False, work)
            yield sp.Forward(k, k + 1, False, True, work)
            yield sp.Reverse(k + 1, k, True)
        yield sp.EndReverse()


@pytest.mark.parametrize("make, loss_of", MODELS)
def test_an_advance_from_a_state_sharing_an_array_leaves_the_sharer_alone(make, loss_of, monkeypatch):
    model, initial = make()
    stored = gradients(model, initial, sp.StoreAll(STEPS), False, monkeypatch, loss=loss_of)
    native = gradients(model, initial, FromOneSnapshot(STEPS), True, monkeypatch, loss=loss_of)
    assert native.stats.native_steps > 0
    same_bits(stored, native)


@pytest.mark.parametrize("make, loss_of", MODELS)
def test_schedules_of_many_shapes_give_store_alls_bits(make, loss_of, monkeypatch, tmp_path):
    """Revolve and MultiLevel over step counts and budgets that make one-step recomputations,
    longer advances, disk snapshots between stretches and snapshots read again: store-all's bits."""
    model, initial = make()
    storage = str(tmp_path / "snapshots.h5")
    for steps in (13, 31):
        monkeypatch.setattr(Sweep, "native_loops", False)          # the tape's store-all
        stored = model.gradient(initial, steps, loss=loss_of, schedule=sp.StoreAll(steps))
        monkeypatch.setattr(Sweep, "native_loops", True)
        for budget in (2, 3, 6):
            for schedule in (sp.Revolve(steps, budget), sp.MultiLevel(steps, budget, 2, write_cost=0, read_cost=0),
                             sp.MultiLevel(steps, 1, budget, write_cost=0, read_cost=0)):
                native = model.gradient(initial, steps, loss=loss_of, schedule=schedule, storage=storage)
                assert native.stats.native_steps > 0, (steps, budget, schedule)
                same_bits(stored, native)


@pytest.mark.parametrize("make, loss_of", MODELS[1:])
def test_a_stretchs_advance_of_many_steps_renames_its_copies(make, loss_of, monkeypatch):
    """Each step of a stretch's advance of two steps or more skips its copies, as a native run
    outside a stretch does: the arrays end where the driver leaves them (`ring_result`), store-all's bits,
    no more memory than copying, and every copy not run counted (one pair a step in these models)."""
    advances = []
    real = native_sweep._Stretch._advance
    monkeypatch.setattr(native_sweep._Stretch, "_advance",
                        lambda self, steps: advances.append(steps) or real(self, steps))
    model, initial = make()
    stored = gradients(model, initial, sp.StoreAll(STEPS), False, monkeypatch, loss=loss_of)
    advances.clear()
    native = gradients(model, initial, FromOneSnapshot(STEPS), True, monkeypatch, loss=loss_of)
    skipped = sum(steps for steps in advances if steps > 1)           # Forward(1, k), k = STEPS - 3 .. 2
    assert skipped == sum(range(2, STEPS - 2))
    monkeypatch.setattr(native_sweep, "ring_result", lambda *args: None)     # every such advance copies
    copying = gradients(model, initial, FromOneSnapshot(STEPS), True, monkeypatch, loss=loss_of)
    assert native.stats.renamed_copies - copying.stats.renamed_copies == skipped
    assert native.stats.peak_buffer_bytes == copying.stats.peak_buffer_bytes
    same_bits(stored, native)
    same_bits(stored, copying)


@pytest.mark.parametrize("schedule", [lambda: sp.StoreAll(STEPS), lambda: sp.Revolve(STEPS, 10)])
def test_a_gradients_buffers_are_freed_when_it_returns_not_by_the_cycle_collector(schedule):
    """The runners refer to the sweep and to each other; the sweep's close drops those edges, so a
    run's buffer pool (a store-all gradient's every state) goes when `gradient` returns, with the
    cycle collector off (before: 485 MiB stayed after a 256^2 FWI gradient until gc ran)."""
    import gc
    from stepper.step.versions import BufferPool
    model, initial = wave_model(), wave_initial()

    def pools():
        return sum(isinstance(o, BufferPool) for o in gc.get_objects())

    model.gradient(initial, STEPS, loss=wave_loss, schedule=schedule())     # builds and caches what it needs
    gc.collect()
    gc.disable()
    try:
        before = pools()
        model.gradient(initial, STEPS, loss=wave_loss, schedule=schedule())
        assert pools() == before
    finally:
        gc.enable()
