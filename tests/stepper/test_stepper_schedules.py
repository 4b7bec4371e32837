"""Every schedule gives the same gradient, to the last bit, and runs exactly its own step count."""
import numpy as np
import pytest

import stepper as sp
from stepper_models import energy_rate, height, particle_initial, particle_model, same_bits

STEPS = 200


@pytest.fixture(scope="module")
def reference(device):
    model, initial = particle_model(device=device), particle_initial(device=device)
    result = model.gradient(initial, STEPS, loss=height, running_loss=energy_rate, schedule=sp.StoreAll(STEPS))
    return model, initial, result


SCHEDULES = {
    "store-all in RAM": lambda: sp.StoreAll(STEPS, sp.StorageType.RAM),
    "revolve 2": lambda: sp.Revolve(STEPS, 2),
    "revolve 5": lambda: sp.Revolve(STEPS, 5),
    "revolve 20": lambda: sp.Revolve(STEPS, 20),
    "online 8": lambda: sp.Online(8),
}


@pytest.mark.parametrize("name", SCHEDULES)
def test_schedules_agree_bit_for_bit(reference, name):
    model, initial, ref = reference
    result = model.gradient(initial, STEPS, loss=height, running_loss=energy_rate, schedule=SCHEDULES[name]())
    same_bits(ref, result)
    assert result.stats.forward_steps == sp.validate(SCHEDULES[name](), STEPS).forward_steps
    assert result.stats.recorded_steps == STEPS and result.stats.reverse_steps == STEPS


def test_multilevel_with_hdf5_agrees_and_counts_disk_traffic(reference, tmp_path):
    model, initial, ref = reference
    result = model.gradient(initial, STEPS, loss=height, running_loss=energy_rate,
                            schedule=sp.MultiLevel(STEPS, 2, 5, write_cost=0, read_cost=0), storage=tmp_path / "snapshots.h5")
    same_bits(ref, result)
    cost = sp.validate(sp.MultiLevel(STEPS, 2, 5, write_cost=0, read_cost=0), STEPS)
    stats = result.stats
    assert stats.forward_steps == cost.forward_steps
    assert stats.snapshots_written(sp.StorageType.DISK) == cost.disk_writes
    assert stats.snapshots_read(sp.StorageType.DISK) == cost.disk_reads
    assert stats.snapshots_written(sp.StorageType.RAM) == cost.ram_writes
    assert stats.snapshots_read(sp.StorageType.RAM) == cost.ram_reads
    state_bytes = model.state_bytes
    assert stats.snapshots[sp.StorageType.DISK].bytes_written == cost.disk_writes * state_bytes
    assert stats.peak_ram_snapshot_bytes <= 2 * state_bytes


def test_checkpoint_schedules_peer_schedules_work(reference, tmp_path):
    cs = pytest.importorskip("checkpoint_schedules")
    model, initial, ref = reference
    result = model.gradient(initial, STEPS, loss=height, running_loss=energy_rate,
                            schedule=cs.Revolve(STEPS, 6))
    same_bits(ref, result)
    assert result.stats.forward_steps == sp.validate(cs.Revolve(STEPS, 6), STEPS).forward_steps
    result = model.gradient(initial, STEPS, loss=height, running_loss=energy_rate,
                            schedule=cs.MultistageCheckpointSchedule(STEPS, 2, 3), storage=tmp_path / "s.h5")
    same_bits(ref, result)


def test_online_schedule_stops_when_the_condition_holds(reference):
    model, initial, _ = reference

    def fallen(state):
        return float(state.x.numpy()[:, 1].mean()) < -0.5
    plain = model.rollout(initial, 1000, until=fallen, deterministic=True)
    n = plain.steps
    assert 10 < n < 1000
    online = model.gradient(initial, loss=height, schedule=sp.Online(4), until=fallen)
    assert online.stats.steps == n
    np.testing.assert_array_equal(online.final.x.numpy(), plain.x.numpy())
    same_bits(model.gradient(initial, n, loss=height, schedule=sp.StoreAll(n)), online)


def test_revolve_memory_is_bounded_by_its_snapshots(reference):
    model, initial, ref = reference
    result = model.gradient(initial, STEPS, loss=height, running_loss=energy_rate, schedule=sp.Revolve(STEPS, 5))
    state = model.state_bytes
    scratch = 64 * 12 + 4 * 2              # force (vec3) and the running loss, for one step
    assert result.stats.peak_ram_snapshot_bytes == 5 * state
    # live: snapshots, the step's input and output with their adjoints (4 states), its scratch with
    # gradients, and the loss seeds
    assert result.stats.peak_memory_bytes <= (5 + 4) * state + 2 * scratch + 64
    assert ref.stats.peak_memory_bytes >= STEPS * state     # store-all keeps every step


def test_ram_snapshots_are_held_states_unless_a_ram_storage_is_given(reference):
    """By default a RAM snapshot is the state's own versions, held in the pool (no copies); a RAM
    storage the caller gives gets copies. Both give store-all's bits, and the same traffic counts."""
    model, initial, ref = reference
    held = model.gradient(initial, STEPS, loss=height, running_loss=energy_rate, schedule=sp.Revolve(STEPS, 5))
    store = sp.MemoryStorage()
    copied = model.gradient(initial, STEPS, loss=height, running_loss=energy_rate, schedule=sp.Revolve(STEPS, 5),
                            storage={sp.StorageType.RAM: store})
    same_bits(ref, held)
    same_bits(ref, copied)
    assert store.stats.snapshots_written == copied.stats.snapshots_written(sp.StorageType.RAM) > 0
    counts = ("snapshots_written", "snapshots_read", "bytes_written", "bytes_read")
    assert [getattr(held.stats.snapshots[sp.StorageType.RAM], c) for c in counts] == \
        [getattr(copied.stats.snapshots[sp.StorageType.RAM], c) for c in counts]
    assert held.stats.peak_ram_snapshot_bytes == copied.stats.peak_ram_snapshot_bytes == 5 * model.state_bytes
    # held snapshots are pool versions, counted once: the same peak as copies next to a smaller pool
    if model.device == "cpu":
        assert held.stats.peak_memory_bytes == copied.stats.peak_memory_bytes
    else:   # a GPU copy on its way to the host keeps its state's versions in the pool until it lands
        from stepper.execute.snapshots import Tiers
        extra = copied.stats.peak_memory_bytes - held.stats.peak_memory_bytes
        assert 0 <= extra <= Tiers.MAX_IN_FLIGHT * model.state_bytes


def test_revolve_peak_memory_is_its_snapshots_plus_three_states(device):
    """With a terminal loss, a step's s.next memory is reused for the previous state's gradient: the
    snapshots, the step's input, the carried adjoint and the new adjoint, plus one step's scratch
    (the force and its gradient)."""
    model, initial = particle_model(device=device), particle_initial(device=device)
    for snapshots in (2, 5, 12):
        result = model.gradient(initial, STEPS, loss=height, schedule=sp.Revolve(STEPS, snapshots))
        force = 64 * 12
        assert result.stats.peak_memory_bytes <= (snapshots + 3) * model.state_bytes + 2 * force


def test_models_that_skip_zero_filling_still_get_zeroed_gradients(device):
    """zero_buffers=False skips filling new state and scratch versions (the chain's kernels store
    every element), never the gradients."""
    from stepper_models import chain_final_x_squared as final_x_squared, chain_initial, chain_model
    model, initial = chain_model(device=device), chain_initial(device=device)
    reference = model.gradient(initial, 60, loss=final_x_squared, schedule=sp.Revolve(60, 4))
    model.zero_buffers = False
    again = model.gradient(initial, 60, loss=final_x_squared, schedule=sp.Revolve(60, 4))
    same_bits(reference, again)
