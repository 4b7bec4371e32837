"""Write-behind and prefetch: overlap, bounded queue, and errors that are never dropped."""

import threading

import numpy as np
import pytest

from checkpoint.storage import HDF5Storage, StorageError, layout


@pytest.fixture
def gate(monkeypatch):
    """Hold every background write at a gate until the test opens it."""
    opened = threading.Event()
    real_write = layout.write_snapshot

    def held_write(*args, **kwargs):
        assert opened.wait(10), "test forgot to open the gate"
        return real_write(*args, **kwargs)

    monkeypatch.setattr(layout, "write_snapshot", held_write)
    return opened


def test_write_returns_before_the_disk_write_and_reads_see_it(tmp_path, gate):
    with HDF5Storage(tmp_path / "s.h5", max_pending=4) as store:
        store.write(1, {"x": np.arange(4.0)})  # would hang here if write waited for the disk
        assert store.steps() == [1]
        assert store.read(1).arrays["x"].tolist() == [0.0, 1.0, 2.0, 3.0]
        gate.set()
        store.flush()
    with HDF5Storage(tmp_path / "s.h5", mode="r") as store:
        assert store.read(1).arrays["x"].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_queue_is_bounded_so_write_waits_when_the_disk_falls_behind(tmp_path, gate):
    with HDF5Storage(tmp_path / "s.h5", max_pending=1) as store:
        store.write(0, {"x": np.zeros(1)})  # taken by the I/O thread, held at the gate
        store.write(1, {"x": np.zeros(1)})  # fills the one queue slot (or waits for the first)
        third = threading.Thread(target=store.write, args=(2, {"x": np.zeros(1)}))
        third.start()
        third.join(0.3)
        assert third.is_alive(), "a third write should wait for room in the queue"
        gate.set()
        third.join(10)
        store.flush()
        assert store.steps() == [0, 1, 2]


def failing_write(f, step, *args):
    raise OSError(28, "No space left on device")


def test_background_error_surfaces_at_the_next_call(tmp_path, monkeypatch):
    path = tmp_path / "full.h5"
    with HDF5Storage(path) as store:
        store.write(0, {"x": np.zeros(3)})
        store.flush()
        monkeypatch.setattr(layout, "write_snapshot", failing_write)
        store.write(1, {"x": np.zeros(3)})  # returns: the failure happens on the I/O thread
        store._worker.drain()  # let it fail, without a call that would report it
        with pytest.raises(StorageError) as info:
            store.read(0)
        message = str(info.value)
        assert "step 1" in message and str(path) in message and "No space left on device" in message
        assert isinstance(info.value.__cause__, OSError)
        # Reported once; the failed step is not readable and is listed as incomplete.
        assert store.steps() == [0] and store.incomplete_steps() == [1]
        assert store.read(0).arrays["x"].tolist() == [0.0, 0.0, 0.0]


def test_close_flushes_and_reraises_a_pending_error(tmp_path, monkeypatch):
    store = HDF5Storage(tmp_path / "full.h5")
    monkeypatch.setattr(layout, "write_snapshot", failing_write)
    store.write(0, {"x": np.zeros(3)})
    with pytest.raises(StorageError, match="step 0.*No space left on device"):
        store.close()


def test_every_failure_is_reported_with_the_first_one(tmp_path, monkeypatch):
    both_queued = threading.Event()      # no write fails before both are queued, so write(1) cannot see it

    def failing_after_both_are_queued(f, step, *args):
        both_queued.wait(timeout=60)
        failing_write(f, step)
    monkeypatch.setattr(layout, "write_snapshot", failing_after_both_are_queued)
    store = HDF5Storage(tmp_path / "full.h5", max_pending=4)
    store.write(0, {"x": np.zeros(1)})
    store.write(1, {"x": np.zeros(1)})
    both_queued.set()
    store._worker.drain()
    with pytest.raises(StorageError, match="step 0") as info:
        store.flush()
    assert any("1 later background I/O task(s) failed too" in note for note in info.value.__notes__)
    store.close()


def test_inline_mode_raises_in_the_call_itself(tmp_path, monkeypatch):
    monkeypatch.setattr(layout, "write_snapshot", failing_write)
    with HDF5Storage(tmp_path / "s.h5", background=False) as store:
        with pytest.raises(StorageError, match="step 0"):
            store.write(0, {"x": np.zeros(1)})


def test_prefetched_read_comes_from_the_prefetch_buffer(tmp_path, monkeypatch):
    with HDF5Storage(tmp_path / "s.h5") as store:
        store.write(3, {"x": np.arange(5)})
        store.flush()
        calls = []
        real_read = layout.read_snapshot
        monkeypatch.setattr(layout, "read_snapshot", lambda f, step: calls.append(step) or real_read(f, step))
        store.prefetch(3)
        store.flush()  # the prefetch has run
        assert calls == [3]
        assert store.read(3).arrays["x"].tolist() == [0, 1, 2, 3, 4]
        assert calls == [3], "read should have used the prefetched copy"


def test_only_the_io_thread_touches_the_file(tmp_path, monkeypatch):
    threads = set()
    for name in ("write_snapshot", "commit", "read_snapshot", "delete_snapshot"):
        real = getattr(layout, name)
        monkeypatch.setattr(layout, name, lambda *a, _real=real: threads.add(threading.get_ident()) or _real(*a))
    with HDF5Storage(tmp_path / "s.h5") as store:
        for step in range(5):
            store.write(step, {"x": np.full(10, step)})
        store.flush()
        store.prefetch(1)
        assert store.read(1).arrays["x"][0] == 1 and store.read(2).arrays["x"][0] == 2
        store.delete(3)
        store.flush()
    assert len(threads) == 1 and threading.get_ident() not in threads


def test_a_deleted_step_stays_deleted_even_if_its_write_was_queued(tmp_path, gate):
    with HDF5Storage(tmp_path / "s.h5", max_pending=4) as store:
        store.write(1, {"x": np.zeros(1)})
        store.delete(1)
        store.write(2, {"x": np.ones(1)})
        gate.set()
    with HDF5Storage(tmp_path / "s.h5", mode="r") as store:
        assert store.steps() == [2] and store.incomplete_steps() == []
