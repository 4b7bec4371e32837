"""The simulator's streams, events and graphs (cuStream*, cuEvent*, cuGraph*): part of the fake
driver, which driver.py re-exports; see its docstring for what they check.

A non-blocking stream that is not capturing queues its work (`CUstream.queued`) and runs it only
when something waits for it; a capturing stream records it into a `CUgraph`; the legacy stream
(handle 0) runs everything at once.
"""
from __future__ import annotations

import threading

from .core import (_OK, CUevent, CUgraph, CUgraphExec, CUresult, CUstream, CUstreamCaptureMode, _api, _catch_up,
                     _context, _Fail, _no_capture_on_legacy, _run_or_capture, _stream, _streams, recent_launches)

__all__ = [
    "cuStreamCreate", "cuStreamDestroy", "cuStreamSynchronize", "cuEventCreate", "cuEventRecord",
    "cuEventQuery", "cuEventSynchronize", "cuStreamWaitEvent", "cuEventDestroy", "cuStreamBeginCapture",
    "cuStreamEndCapture", "cuGraphInstantiate", "cuGraphLaunch", "cuGraphDestroy",
    "cuGraphExecDestroy"
]


@_api
def cuStreamCreate(flags):
    ctx = _context()
    s = CUstream(next(CUstream._ids), flags)
    s.context = ctx
    _streams[s.value] = s
    return s


@_api
def cuStreamDestroy(stream):
    s = _streams.pop(int(stream), None)
    if s is not None:
        _catch_up(s)          # queued work still completes


@_api
def cuStreamSynchronize(stream):
    _context()
    s = _stream(stream)
    if s is None:
        _no_capture_on_legacy()
    else:
        _catch_up(s)


# -- events --------------------------------------------------------------------------------------------
@_api
def cuEventCreate(flags):
    _context()
    return CUevent()


@_api
def cuEventRecord(event, stream):
    _context()
    s = _stream(stream)
    if s is not None and s.capture is not None:
        raise _Fail(CUresult.CUDA_ERROR_INVALID_VALUE)     # the project never records events into graphs
    if s is not None and s.runs_late:
        event.stream, event.done = s, False

        def happen():
            event.stream, event.done = None, True
        s.queued.append(happen)
    else:
        event.stream, event.done = None, True


@_api
def cuEventQuery(event):
    _context()
    if not event.done:
        raise _Fail(CUresult.CUDA_ERROR_NOT_READY)


@_api
def cuEventSynchronize(event):
    _context()
    if not event.done:
        _catch_up(event.stream, event)


@_api
def cuStreamWaitEvent(stream, event, flags):
    _context()
    s = _stream(stream)
    if event.done:
        return
    source = event.stream
    if s is not None and s.runs_late:
        s.queued.append(lambda: _catch_up(source, event))
    else:
        _catch_up(source, event)     # work queued behind this on an eager stream must see the event


@_api
def cuEventDestroy(event):
    pass


@_api
def cuStreamBeginCapture(stream, mode):
    _context()
    s = _stream(stream)
    if s is None or s.capture is not None:     # the legacy stream cannot be captured
        raise _Fail(CUresult.CUDA_ERROR_INVALID_VALUE)
    s.capture = CUgraph()
    s.capture_mode, s.capture_thread = CUstreamCaptureMode(int(mode)), threading.get_ident()


@_api
def cuStreamEndCapture(stream):
    _context()
    s = _stream(stream)
    if s is None or s.capture is None:
        raise _Fail(CUresult.CUDA_ERROR_INVALID_VALUE)
    graph, s.capture = s.capture, None
    return graph


@_api
def cuGraphInstantiate(graph, flags):
    return CUgraphExec(list(graph.nodes), _context())


@_api
def cuGraphLaunch(exec_, stream):
    ctx = _context()
    if exec_.context is not ctx or exec_.destroyed:
        raise _Fail(CUresult.CUDA_ERROR_INVALID_HANDLE)

    recent_launches.append(("<graph>", len(exec_.nodes), None, int(stream) if stream is not None else 0))

    def run():
        for node in exec_.nodes:
            if ctx.error != _OK:
                return
            node()
    _run_or_capture(stream, run)


@_api
def cuGraphDestroy(graph):
    pass


@_api
def cuGraphExecDestroy(exec_):
    exec_.destroyed = True
