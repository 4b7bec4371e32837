"""Halo exchanges of a `Distributed` model, and launches that overlap them.

``dist.exchange(s, "u")`` returns ``s.prev.u`` in a scratch buffer `halo` elements wider on each
side of every split axis, the neighbours' elements in the halos (zeros beyond the global edges).
One split axis after the other, each rank sends the `halo` slabs next to its block's faces, whole
along every other axis (halos included), and receives its neighbours' into its own halos; the
later axes carry what the earlier ones received, so corners arrive too. The first axis goes last,
so that its messages can travel while a kernel runs:

    dist.launch(wave_step, block, inputs=[dist.halo(s, "u"), s.prev.u_prev, ...], outputs=[...])

exchanges ``s.prev.u`` as `exchange` does, but runs the launch in parts (compiler.runtime.launch.
launch_in_parts): the rows of the launch that read only the block's own rows, known from the
kernel's indices (compiler.passes.bounds.row_reach: row ``tid()[0] + c``, c from lo to hi), run while
the first axis's halos travel; then the exchange completes and the rows next to the faces run. The
buffer, the launch's results and its tape record are those of `exchange` plus `sp.launch`, bit for
bit. Where the kernel's rows cannot be told apart (another index on the first axis) it is exactly
that: the exchange, then the launch. ``dist.overlapped`` counts the launches that ran in parts.

On a tape an exchange is one operation whose adjoint sends the halos' adjoints back to their
owners, who add them to their faces, axis by axis in the reverse order (not overlapped).

Blocks on a GPU split by rows (one split axis) move only what crosses ranks through the host: the
block is copied into the exchanged buffer on the device, the face rows go down and the halo rows
come up (the adjoint likewise, its sums made as on the CPU). Over a grid of ranks a GPU block's
exchange goes through a host copy of the whole buffer (no CUDA-aware MPI), complete before any
of the launch runs.
"""
from __future__ import annotations

import time

import numpy as np

from compiler import array, launch
from compiler.passes.bounds import row_reach
from compiler.runtime.copy_kernels import add_into
from compiler.runtime.launch import launch_in_parts
from compiler.runtime.tape import RecordedOp, active_tape, caller_location

from ..errors import ModelError

__all__ = ["Halo", "HaloExchanges"]


class Halo:
    """What `Distributed.halo` returns: an argument of `Distributed.launch` that stands for
    ``dist.exchange(s, name)``."""

    def __init__(self, state, name: str):
        self.state, self.name = state, name

    def __repr__(self) -> str:
        return f"dist.halo(s, {self.name!r})"

    @property
    def launch_hint(self) -> str:
        """What sp.launch says when given one."""
        return (f"{self!r} is an argument of dist.launch; launch with dist.launch(...), or pass "
                f"dist.exchange(s, {self.name!r}) to sp.launch")


class HaloExchanges:
    """The halo exchanges of `Distributed` (a mixin: it needs the declared `parts`, `grid`,
    `coords`, `comm` and `_MPI`)."""

    def _init_exchanges(self) -> None:
        self.exchanges = 0                   # halo exchanges run (forward and adjoint) by this rank
        self.exchange_seconds = 0.0          # and the time they took, waiting for neighbours included
        self.overlapped = 0                  # launches run in parts while their halos travelled
        self._reach: dict = {}               # (kernel, parameter) -> row_reach

    # -- the exchange ---------------------------------------------------------------------------------
    def exchange(self, s, name: str) -> array:
        """``s.prev.<name>`` with `halo` elements of each neighbour around it, as a new scratch buffer
        of the step (`halo_shape`; zeros beyond the global edges). On the step's tape it is one
        operation whose adjoint returns the halos' adjoints to their owners."""
        out = self._halo_buffer(s, name)
        self.exchange_into(name, s.prev[name], out)
        return out

    def exchange_into(self, name: str, x: array, out: array) -> None:
        """The exchange of `exchange` from the block `x` into `out` (`halo_shape`), differentiable on
        a recording Tape (for tests and custom steps)."""
        self._begin_exchange(name, x, out)()

    def halo(self, s, name: str) -> Halo:
        """An argument of `launch` standing for ``exchange(s, name)``, exchanged while the launch runs."""
        self._part(name)
        return Halo(s, name)

    def launch(self, kernel, dim, inputs=(), outputs=()) -> None:
        """`sp.launch` with `halo` arguments exchanged while the rows of the launch that do not read
        their halos run (see the module docstring); without one it is `sp.launch`."""
        args = list(inputs) + list(outputs)
        halos = [(k, a) for k, a in enumerate(args) if isinstance(a, Halo)]
        if not halos:
            launch(kernel, dim, inputs, outputs)
            return
        rows = int(dim) if isinstance(dim, (int, np.integer)) else int(dim[0])
        core = (0, rows)                     # the launch's rows that read no halo of the first axis
        finishes = []
        for k, h in halos:
            out = args[k] = self._halo_buffer(h.state, h.name)
            finishes.append(self._begin_exchange(h.name, h.state.prev[h.name], out))
            part, reach = self.parts[h.name], self._row_reach(kernel, k)
            if reach is None:
                core = (0, 0)                # nothing runs before the exchange is complete
            else:
                # thread i reads exchanged rows i + lo .. i + hi; the block's own are halo .. halo + extent - 1
                lo, hi = reach
                core = (max(core[0], part.halo - lo), min(core[1], part.halo + part.extents[0] - hi))
        if core[0] >= core[1]:
            core = (0, 0)

        def complete():
            for finish in finishes:
                finish()
        in_parts = launch_in_parts(kernel, dim, args[:len(inputs)], args[len(inputs):], first_rows=core,
                                   between=complete)
        self.overlapped += in_parts and core[1] > core[0]

    def _halo_buffer(self, s, name: str) -> array:
        part = self._part(name)
        return s.scratch(f"halo.{name}", part.halo_shape, part.dtype, zero=False)

    def _row_reach(self, kernel, k: int):
        key = (kernel, k)
        if key not in self._reach:
            self._reach[key] = row_reach(kernel.compiled().forward, kernel.params[k].name)
        return self._reach[key]

    def _begin_exchange(self, name: str, x: array, out: array):
        """Start the exchange of `exchange_into`: every axis but the first done, the first's messages
        posted. Returns the function that completes it (a no-op where it is complete already)."""
        part = self._part(name)
        if x.shape != part.local_shape or out.shape != part.halo_shape:
            raise ModelError(f"exchange of '{name}': expected a block of shape {part.local_shape} and an output of "
                             f"shape {part.halo_shape}, got {x.shape} and {out.shape}")
        tape = active_tape()
        if tape is not None:
            # Not a launch (op.launch is None), so stepper/step/trace.py never replays a step that makes
            # it without calling the step function: recomputations exchange halos too.
            op = RecordedOp(f"halo exchange of '{name}'", {"block": x}, {"halo": out}, {},
                            lambda: self._backward(part, x, out), caller_location())
            if x.requires_grad and out.requires_grad:
                tape.record(op)
            else:
                tape.check_writes(op)
        if out.device != "cpu" and len(self.grid) == 1:
            return self._begin_on_device(part, x, out)
        host = out.numpy()                      # a view on the CPU, a host copy of a GPU array
        axes = self._axes(part)
        for axis in axes:                       # halos start at zero: what the global edges keep
            for halo in self._slabs(part, axis)[1]:
                host[halo] = 0
        host[part.interior] = x.numpy()
        pending = None
        for axis in axes:
            if pending is not None:
                self._complete(pending, add=False)
            faces, halos = self._slabs(part, axis)
            lo, hi = self._neighbours(axis)
            tag = self._tag(part, axis, backward=False)
            pending = self._post([(host[faces[0]], lo, tag), (host[faces[1]], hi, tag + 1)],
                                 [(host, halos[0], lo, tag + 1), (host, halos[1], hi, tag)])
        out._mark_written()                     # before any launch reads it (the tape's order)

        def complete():
            if pending is not None:
                self._complete(pending, add=False)
        if out.device == "cpu":
            return complete
        complete()
        out._write_host(host)
        return lambda: None

    def _begin_on_device(self, part, x: array, out: array):
        """`_begin_exchange` of a GPU block split by rows: the block is copied into the middle of
        `out` on the device, and only the face rows go down to the host and the halo rows up."""
        h, rows = part.halo, part.extents[0]
        block, halos = x._data, out._data            # DeviceMemory
        row = block.nbytes // rows                   # bytes of one row, whole along the other axes
        halos.copy_bytes_from(block, h * row, 0, rows * row)
        out._mark_written()
        if not h:
            return lambda: None
        faces = [_rows_to_host(block, first, h) for first in (0, rows - h)]
        landed = np.zeros((2 * h,) + block.shape[1:], block.dtype)      # zeros stay at the global edges
        lo, hi = self._neighbours(0)
        tag = self._tag(part, 0, backward=False)
        pending = self._post([(faces[0], lo, tag), (faces[1], hi, tag + 1)],
                             [(landed, slice(0, h), lo, tag + 1), (landed, slice(h, 2 * h), hi, tag)])

        def complete():
            self._complete(pending, add=False)
            halos.buffer.copy_from_host(landed[:h], halos.offset)
            halos.buffer.copy_from_host(landed[h:], halos.offset + (rows + h) * row)
        return complete

    def _backward_on_device(self, part, x: array, out: array) -> None:
        """`_backward` of a GPU block split by rows, moving only halo and face rows through the
        host. The sums are the host path's: each face's adjoint plus what the neighbour sends,
        then added to the block's gradient (on the device)."""
        h, rows = part.halo, part.extents[0]
        g = out.grad._data if out.grad is not None else None
        if not h:
            if x.grad is not None and g is not None:
                add_into(x.grad, out.grad)
            return
        row = out._data.nbytes // (rows + 2 * h)
        shape = (h,) + out._data.shape[1:]
        sends = [_rows_to_host(g, first, h) if g is not None else np.zeros(shape, out._data.dtype)
                 for first in (0, rows + h)]
        faces = [np.zeros(shape, out._data.dtype) for _ in range(2)]
        lo, hi = self._neighbours(0)
        tag = self._tag(part, 0, backward=True)
        received = self._post([(sends[0], lo, tag), (sends[1], hi, tag + 1)],
                              [(faces[0], slice(None), lo, tag + 1), (faces[1], slice(None), hi, tag)])
        self._complete(received, add=False)
        if x.grad is None or g is None:
            return
        for face, first, neighbour in zip(faces, (h, rows), (lo, hi)):     # the exchanged buffer's face rows
            if neighbour != self._MPI.PROC_NULL:
                g.buffer.copy_from_host(_rows_to_host(g, first, h) + face, g.offset + first * row)
        interior = array._wrap(type(g)(g.buffer, (rows,) + g.shape[1:], g.dtype, g.offset + h * row),
                               out.grad._dtype, device=out.grad.device)
        add_into(x.grad, interior)

    def _axes(self, part) -> list:
        """The split axes in the order the forward exchanges them: the first last (see the module docstring)."""
        return list(range(1, len(self.grid))) + [0] if part.halo else []

    def _backward(self, part, x: array, out: array) -> None:
        # The neighbours wait for this rank's halo adjoints whatever its own gradients are, so the
        # messages go out even when there is nothing to send (zeros) or nowhere to add. The axes go
        # in reverse: each sends its halos' adjoints (and forgets them) and adds what comes back
        # to the faces they were copied from.
        if out.device != "cpu" and len(self.grid) == 1:
            return self._backward_on_device(part, x, out)
        g = np.array(out.grad.numpy()) if out.grad is not None else np.zeros(part.halo_shape, out.numpy().dtype)
        for axis in reversed(self._axes(part)):
            faces, halos = self._slabs(part, axis)
            lo, hi = self._neighbours(axis)
            tag = self._tag(part, axis, backward=True)
            # My low halo's adjoint belongs to the rank below (its high face), and so on.
            sends = [(np.array(g[halos[0]]), lo, tag), (np.array(g[halos[1]]), hi, tag + 1)]
            g[halos[0]] = 0
            g[halos[1]] = 0
            self._complete(self._post(sends, [(g, faces[0], lo, tag + 1), (g, faces[1], hi, tag)]), add=True)
        if x.grad is not None:
            x.grad._add_host(g[part.interior])

    def _slabs(self, part, axis: int):
        """((low face, high face), (low halo, high halo)) along `axis`, as index tuples of the
        exchanged buffer, whole along every other axis."""
        h, e = part.halo, part.extents[axis]
        at = lambda start: (slice(None),) * axis + (slice(start, start + h),)
        return (at(h), at(e)), (at(0), at(e + h))

    def _tag(self, part, axis: int, backward: bool) -> int:
        return 4 * (self._tags[part.name] * len(self.grid) + axis) + 2 * backward

    def _neighbours(self, axis: int = 0):
        """The ranks before and after this one along `axis` of the grid (PROC_NULL at the edges)."""
        proc_null = self._MPI.PROC_NULL

        def rank_at(step):
            coords = list(self.coords)
            coords[axis] += step
            if not 0 <= coords[axis] < self.grid[axis]:
                return proc_null
            return int(np.ravel_multi_index(coords, self.grid))
        return rank_at(-1), rank_at(+1)

    def _post(self, sends, recvs):
        """Post every receive and send (non-blocking). A receive ``(target, index, source, tag)``
        lands in a contiguous buffer first; `_complete` copies it into (or adds it to) ``target[index]``."""
        began = time.perf_counter()
        landing = [np.empty(target[index].shape, target.dtype) for target, index, _, _ in recvs]
        requests = [self.comm.Irecv(buf, source=src, tag=tag) for buf, (_, _, src, tag) in zip(landing, recvs)]
        requests += [self.comm.Isend(np.ascontiguousarray(buf), dest=dst, tag=tag) for buf, dst, tag in sends]
        self.exchange_seconds += time.perf_counter() - began
        return requests, landing, recvs

    def _complete(self, pending, add: bool) -> None:
        """Wait for the messages of `_post` and put what came where it belongs."""
        began = time.perf_counter()
        requests, landing, recvs = pending
        self._MPI.Request.Waitall(requests)
        proc_null = self._MPI.PROC_NULL
        for buf, (target, index, src, _) in zip(landing, recvs):
            if src == proc_null:
                continue                     # nothing came: a global edge keeps its zeros
            if add:
                target[index] += buf
            else:
                target[index] = buf
        self.exchanges += 1
        self.exchange_seconds += time.perf_counter() - began


def _rows_to_host(memory, first: int, count: int) -> np.ndarray:
    """Rows first .. first + count - 1 of a C-contiguous `DeviceMemory`, copied to a new ndarray."""
    row = memory.nbytes // memory.shape[0]
    return memory.buffer.copy_to_host(np.empty((count,) + memory.shape[1:], memory.dtype), memory.offset + first * row)
