"""Run I/O tasks in order on one background thread, so disk time overlaps compute.

The queue is bounded: when the disk falls behind, ``submit`` blocks the caller
instead of letting copies of snapshots pile up in memory without limit.
Failures of fire-and-forget tasks (writes, deletes) are kept and handed to the
caller at its next call, never dropped.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from typing import Any, Callable

__all__ = ["BackgroundWorker", "InlineWorker"]

_STOP = object()


class BackgroundWorker:
    """One thread that runs submitted callables in submission order.

    Only this thread calls into the tasks' shared resource (the h5py file), so
    the tasks need no lock of their own.
    """

    def __init__(self, name: str, max_pending: int) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        self._queue: queue.Queue = queue.Queue(maxsize=max_pending)
        self._errors: list[BaseException] = []
        self._errors_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any, report: bool = True) -> Future:
        """Queue ``fn(*args)``; blocks while ``max_pending`` tasks are waiting.

        With ``report=True`` a failure is also kept for ``take_error``, for
        callers that never look at the returned future.
        """
        if not self._thread.is_alive():
            raise RuntimeError("the background I/O thread has stopped; the storage was closed")
        future: Future = Future()
        self._queue.put((fn, args, future, report))
        return future

    def take_error(self) -> BaseException | None:
        """Return (and forget) the first failure of a reported task, or None.

        Later failures are attached as a note, since the first usually causes them.
        """
        with self._errors_lock:
            errors, self._errors = self._errors, []
        if not errors:
            return None
        first = errors[0]
        if len(errors) > 1:
            first.add_note(f"{len(errors) - 1} later background I/O task(s) failed too; first of them: "
                           f"{errors[1]!r}")
        return first

    def drain(self) -> None:
        """Block until every task submitted so far has finished."""
        self._queue.join()

    def stop(self) -> None:
        """Finish the queued tasks, then end the thread."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is _STOP:
                    return
                fn, args, future, report = item
                try:
                    result = fn(*args)
                except BaseException as exc:  # noqa: BLE001 - handed to the caller, never dropped
                    future.set_exception(exc)
                    if report:
                        with self._errors_lock:
                            self._errors.append(exc)
                else:
                    future.set_result(result)
            finally:
                self._queue.task_done()


class InlineWorker:
    """Same interface, but runs each task at once on the caller's thread.

    For ``background=False``: simpler to debug, and errors surface in the very
    call that caused them.
    """

    def submit(self, fn: Callable[..., Any], *args: Any, report: bool = True) -> Future:
        future: Future = Future()
        try:
            future.set_result(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - re-raised below or via the future
            if report:
                raise
            future.set_exception(exc)
        return future

    def take_error(self) -> BaseException | None:
        return None

    def drain(self) -> None:
        pass

    def stop(self) -> None:
        pass
