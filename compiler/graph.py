"""Capture a sequence of launches once, replay it many times without Python-side checks.

On the CPU a captured launch is its compiled entry point plus its packed argument buffer, so a
replay is one foreign call per launch: no argument checks, no packing, no Tape bookkeeping. As
with CUDA graphs, a replay reuses the captured arrays (their memory, not their values: change the
data in place between replays) and the captured scalar arguments.

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

from .runtime.tape import settle

_local = threading.local()


@dataclass
class CapturedLaunch:
    entry: object            # the compiled forward entry point (a ctypes function)
    buffer: bytes            # the packed launch header and arguments
    serial: int
    written: tuple           # arrays whose version counters a run bumps


@dataclass
class Graph:
    """Launches recorded by `capture`; `replay()` runs them again in the same order."""
    launches: list[CapturedLaunch] = field(default_factory=list)

    def replay(self) -> None:
        settle()                     # launches a Tape holds (Tape.defer_launches) run first
        for launch in self.launches:
            launch.entry(launch.buffer, launch.serial)
            for array in launch.written:
                array._mark_written()

    def __len__(self) -> int:
        return len(self.launches)


def capturing() -> Graph | None:
    """The graph the current thread is capturing into, if any."""
    return getattr(_local, "graph", None)


@contextlib.contextmanager
def capture():
    """Record the launches made inside the block (they also run once) into a `Graph`.

    Launches recorded on a Tape cannot be captured (a replay would bypass the Tape), nor can
    `debug=True` launches (their bounds checks report through Python)."""
    if capturing() is not None:
        raise RuntimeError("capture() blocks cannot be nested; finish the outer capture first")
    graph = Graph()
    _local.graph = graph
    try:
        yield graph
    finally:
        _local.graph = None
