"""Capture a sequence of launches once, replay it many times without Python-side checks.

On the CPU a captured launch is its compiled entry point plus its packed argument buffer, so a
replay is one foreign call per launch: no argument checks, no packing, no Tape bookkeeping. On a GPU
the launches are captured into a CUDA graph (stream capture), and a replay is one graph launch. In
both, as with CUDA graphs, a replay reuses the captured arrays (their memory, not their values:
change the data in place between replays) and the captured scalar arguments.

    with stepper.capture() as graph:
        stepper.launch(forces, n, inputs=[x, k], outputs=[f])
        stepper.launch(integrate, n, inputs=[x, v, f, dt], outputs=[x_next, v_next])
    for _ in range(1000):
        graph.replay()
"""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field

from ..backends.cuda_launch import StreamCapture, zero_async
from .tape import settle

_local = threading.local()


@dataclass
class CapturedLaunch:
    entry: object            # the compiled forward entry point (a ctypes function)
    buffer: bytes            # the packed launch header and arguments
    serial: int
    written: tuple           # arrays whose version counters a run bumps


@dataclass
class Graph:
    """Launches recorded by `capture`; `replay()` runs them again in the same order. A graph holds
    the launches of one device."""
    launches: list[CapturedLaunch] = field(default_factory=list)     # CPU launches
    device: str | None = None
    written: list[tuple] = field(default_factory=list)    # per launch, the arrays it writes
    _cuda: object = None                                  # backends.cuda_launch.StreamCapture of a GPU graph

    def replay(self) -> None:
        settle()                     # launches a Tape holds (Tape.defer_launches) run first
        if self._cuda is not None:
            self._cuda.launch()
        for launch in self.launches:
            launch.entry(launch.buffer, launch.serial)
        for arrays in self.written:
            for array in arrays:
                array._mark_written()

    def __len__(self) -> int:
        return len(self.written)

    # -- what launch() calls while capturing ---------------------------------------------------------
    def add(self, launch: CapturedLaunch, device: str) -> None:
        """A CPU launch (it also runs now)."""
        self._same_device(device)
        self.launches.append(launch)
        self.written.append(launch.written)

    def cuda_stream(self, device: str):
        """The stream a GPU launch inside the capture goes to (capture starts with the first)."""
        self._same_device(device)
        if self._cuda is None:
            self._cuda = StreamCapture(device)
        return self._cuda.stream

    def note_writes(self, arrays: tuple, device: str) -> None:
        self.written.append(arrays)

    def zero(self, arr) -> None:
        """Zero-fill GPU array `arr` as a step of the graph (in order with its launches)."""
        zero_async(arr._data.ptr, arr._data.nbytes, self.cuda_stream(arr.device))
        self.written.append((arr,))

    def _same_device(self, device: str) -> None:
        if self.device is None:
            self.device = device
        elif device != self.device:
            raise RuntimeError(f"capture(): a graph holds the launches of one device; this one captured on "
                               f"{self.device} and got a launch on {device}: capture each device's launches "
                               "in a capture() of their own")

    def finish(self, run: bool = True) -> None:
        """End a GPU capture and, with `run`, run the captured launches once, as a CPU capture runs
        them (`capture()` does; a graph built to be replayed later passes ``run=False``)."""
        if self._cuda is not None:
            self._cuda.finish()
            if run:
                self._cuda.launch()


def capturing() -> Graph | None:
    """The graph the current thread is capturing into, if any."""
    return getattr(_local, "graph", None)


@contextlib.contextmanager
def capture():
    """Record the launches made inside the block (they also run once) into a `Graph`.

    Launches recorded on a Tape cannot be captured (a replay would bypass the Tape), nor can
    `debug=True` launches (their bounds checks report through Python). On a GPU the launches run
    when the block ends (they are captured into a CUDA graph first), not as each is made."""
    if capturing() is not None:
        raise RuntimeError("capture() blocks cannot be nested; finish the outer capture first")
    graph = Graph()
    _local.graph = graph
    try:
        yield graph
    except BaseException:
        if graph._cuda is not None:
            graph._cuda.finish()         # ends the stream capture; the graph is dropped
        raise
    finally:
        _local.graph = None
    graph.finish()
