"""Disk tiers: Revolve on disk under a tier-neutral name, and the planned disk volume said before a
run writes it."""
import numpy as np
import pytest

import stepper as sp
from stepper import disk_plan
from stepper.disk_plan import DiskVolumeWarning, planned_disk_snapshots, warn_if_large
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
