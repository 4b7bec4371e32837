"""Disk tiers: Revolve on disk under a tier-neutral name, and the planned disk volume said before a
run writes it."""
import numpy as np
import pytest

import stepper as sp
from stepper.execute import disk_plan
from stepper.execute.disk_plan import DiskVolumeWarning, planned_disk_snapshots, warn_if_large
from physics_models import final_theta_squared, pendulum_model


def test_revolve_on_disk_takes_its_count_as_snapshots():
    on_disk = sp.Revolve(100, snapshots=5, storage=sp.StorageType.DISK)
    assert on_disk.snapshots == 5 and on_disk.forward_steps == sp.Revolve(100, 5).forward_steps
    with pytest.raises(TypeError, match="once"):
        sp.Revolve(100, 5, snapshots=5)


def test_planned_disk_snapshots_per_schedule():
    disk = sp.StorageType.DISK
    assert planned_disk_snapshots(sp.Revolve(1000, snapshots=12, storage=disk), 1000) == 12
    assert planned_disk_snapshots(sp.Revolve(1000, 12), 1000) == 0
    assert planned_disk_snapshots(sp.StoreAll(50, storage=disk), 50) == 50
    multi = sp.MultiLevel(1000, 4, 16)
    assert planned_disk_snapshots(multi, 1000) == multi.disk_used


def test_a_large_disk_plan_is_reported_before_the_run():
    with pytest.warns(DiskVolumeWarning, match=r"8 snapshots on disk at once, 4\.0 GiB \(512\.0 MiB a state\)"):
        volume = warn_if_large(sp.Revolve(100, snapshots=8, storage=sp.StorageType.DISK), 100, 512 * 2**20)
    assert volume == 8 * 512 * 2**20


def test_gradient_reports_its_disk_plan_first(tmp_path, monkeypatch):
    model, initial = pendulum_model(n=8)
    monkeypatch.setattr(disk_plan, "REPORT_BYTES", 100)        # 4 snapshots of 128 bytes exceed it
    with pytest.warns(DiskVolumeWarning, match="4 snapshots on disk"):
        on_disk = model.gradient(initial, 20, loss=final_theta_squared,
                                 schedule=sp.Revolve(20, snapshots=4, storage=sp.StorageType.DISK),
                                 storage=str(tmp_path / "snapshots.h5"))
    in_ram = model.gradient(initial, 20, loss=final_theta_squared, schedule=sp.Revolve(20, 4))
    np.testing.assert_array_equal(on_disk.grads["length"].numpy(), in_ram.grads["length"].numpy())


class SlowDisk(sp.MemoryStorage):
    """A disk tier whose every write takes 20 ms: far more than a step of the pendulum model."""

    def write(self, step, arrays, metadata=None):
        import time
        time.sleep(0.02)
        super().write(step, arrays, metadata)


def test_multilevel_without_costs_measures_the_runs_disk_and_plans_with_it(monkeypatch):
    """A MultiLevel told no costs is planned again with the disk's measured write and read time
    over a step's: with a slow disk it keeps fewer snapshots there, and writes less, than the same
    schedule told the disk is free; told costs are never measured. Every plan has store-all's bits."""
    model, initial = pendulum_model(n=8)
    priced = []
    real = sp.MultiLevel.priced
    monkeypatch.setattr(sp.MultiLevel, "priced", lambda self, w, r: priced.append((w, r)) or real(self, w, r))
    steps = 200
    reference = model.gradient(initial, steps, loss=final_theta_squared, schedule=sp.StoreAll(steps))
    slow = SlowDisk()
    measured = model.gradient(initial, steps, loss=final_theta_squared, schedule=sp.MultiLevel(steps, 2, 16),
                              storage=slow)
    assert len(priced) == 1 and priced[0][0] > 1         # a 20 ms write costs many steps
    told = model.gradient(initial, steps, loss=final_theta_squared,
                          schedule=sp.MultiLevel(steps, 2, 16, write_cost=0, read_cost=0), storage=SlowDisk())
    assert len(priced) == 1                              # costs given: nothing measured
    disk = sp.StorageType.DISK
    assert measured.stats.snapshots_written(disk) < told.stats.snapshots_written(disk)
    assert sp.MultiLevel(steps, 2, 16).priced(*priced[0]).disk_used < sp.MultiLevel(steps, 2, 16).disk_used
    assert slow.stats.snapshots_written == measured.stats.snapshots_written(disk)   # the trials are not counted
    for result in (measured, told):
        assert result.loss == reference.loss
        for name in reference.grads:
            np.testing.assert_array_equal(result.grads[name].numpy(), reference.grads[name].numpy())
