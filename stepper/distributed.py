"""Domain-decomposed rollouts and checkpointed gradients over MPI (mpi4py).

Every rank builds the same `Model` and wraps it in a `Distributed`. States are declared with their
*global* shapes; the first axis is split into contiguous blocks, one per rank (rank r owns rows
``offset(name) .. offset(name) + rows(name) - 1``), and each rank's model holds only its block.
A state that a step reads beyond its own rows declares a ``halo`` width; inside the step,
``dist.exchange(s, "u")`` returns a scratch buffer of ``rows + 2 * halo`` rows: the neighbours' rows
in the halos (zeros beyond the global edges), ``s.prev.u`` in between. The exchange is an operation
of the step's tape: its adjoint sends the halos' adjoints back to their owners, who add them to their
rows. Kernels get the local block and the global offset, so one kernel serves 1 rank and N ranks::

    dist = Distributed(model)                      # comm=MPI.COMM_WORLD
    dist.state("u", (n, n), float, halo=1)
    dist.state("u_prev", (n, n), float)

    @model.step
    def step(s):
        u = dist.exchange(s, "u")                  # (rows + 2, n): row i of s.prev.u is row i + 1
        sp.launch(wave_step, dist.local_shape("u"), inputs=[u, s.prev.u_prev, dist.offset("u"), n, ...],
                  outputs=[s.next.u, s.next.u_prev])

    result = dist.gradient(dist.scatter({"u": u0, "u_prev": u0}), steps, loss=..., schedule=...)

Every rank runs the same schedule (schedules are deterministic), so the exchanges of every rank
meet. A loss is each rank's own part (built from its block); ``dist.gradient`` seeds every rank's
part with 1 (the adjoint of the sum over ranks) and returns the sum over ranks as ``result.loss``.
Replicated parameters' gradients are summed over ranks. Sums over ranks are taken in rank order on
every rank, so every rank gets the same bits. ``result.grads`` of a state is this rank's block
(``dist.gather`` assembles the global array). A path given as ``storage=`` or ``checkpoint=`` gets
the rank in its name (``run.h5`` -> ``run.rank0003.h5``) when there is more than one rank.

A rank that raises inside ``dist.rollout`` / ``dist.gradient`` prints its error and aborts the
communicator (``comm.Abort``), so that no rank waits forever for a message that will not come.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
from dataclasses import dataclass, replace

import numpy as np

from compiler import array
from compiler.runtime.tape import RecordedOp, active_tape, caller_location

from .disk_plan import agreed_costs
from .errors import ModelError

__all__ = ["Distributed", "Partition", "rank_path", "require_mpi"]

_INSTALL = "pip install mpi4py mpich (or pip install -e '.[mpi]')"


def require_mpi():
    """The `mpi4py.MPI` module, or a ModelError saying how to install it."""
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise ModelError(f"stepper.distributed needs mpi4py and an MPI library ({exc}); install them with "
                         f"{_INSTALL}") from None
    return MPI


def rank_path(path, rank: int, size: int):
    """``run.h5`` -> ``run.rank0003.h5`` on rank 3 of more than one; the path itself on one rank."""
    if size == 1:
        return path
    root, ext = os.path.splitext(os.fspath(path))
    return f"{root}.rank{rank:04d}{ext}"


@dataclass(frozen=True)
class Partition:
    """One state's block partition along its first axis: its global shape, this rank's rows
    ``offset .. offset + rows - 1`` and the halo width."""
    name: str
    global_shape: tuple
    dtype: object
    halo: int
    offset: int
    rows: int

    @property
    def local_shape(self) -> tuple:
        return (self.rows,) + tuple(self.global_shape[1:])


def block_rows(n: int, size: int, rank: int) -> tuple[int, int]:
    """(offset, rows) of `rank`'s block when `n` rows are split over `size` ranks: the first
    ``n % size`` ranks get one row more."""
    base, extra = divmod(n, size)
    return rank * base + min(rank, extra), base + (1 if rank < extra else 0)


class Ranks:
    """What `Distributed` and `Ensemble` share: a communicator of their own (a Dup of `comm`, default
    ``MPI.COMM_WORLD``, so that our messages never meet the user's), sums over ranks in rank order,
    per-rank paths, and aborting every rank when one raises."""

    def __init__(self, model, comm=None, abort_on_error: bool = True):
        MPI = require_mpi()
        self._MPI = MPI
        self.model = model
        world = MPI.COMM_WORLD if comm is None else comm
        self.comm = world.Dup()
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.abort_on_error = abort_on_error

    def sum(self, values):
        """The sum over ranks of `values` (a float or ndarray), added in rank order: the same bits on
        every rank, whatever the MPI library's reduction order."""
        parts = self.comm.allgather(values)
        total = np.array(parts[0], copy=True) if isinstance(parts[0], np.ndarray) else parts[0]
        for p in parts[1:]:
            total = total + p
        return total

    def _per_rank(self, options: dict) -> dict:
        """`options` of a rollout or gradient with ``until`` decided on global values (every rank
        stops when one rank's predicate holds) and paths made per rank."""
        options = dict(options)
        until = options.get("until")
        if until is not None:
            lor = self._MPI.LOR
            options["until"] = lambda state: bool(self.comm.allreduce(bool(until(state)), op=lor))
        for key in ("checkpoint", "storage"):
            value = options.get(key)
            if isinstance(value, (str, os.PathLike)):
                options[key] = rank_path(value, self.rank, self.size)
            elif isinstance(value, dict):
                options[key] = {k: rank_path(v, self.rank, self.size) if isinstance(v, (str, os.PathLike)) else v
                                for k, v in value.items()}
        return options

    def _guarded(self, run):
        if self.size == 1 or not self.abort_on_error:
            return run()
        try:
            return run()
        except BaseException as exc:
            text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            sys.stderr.write(f"stepper.distributed: rank {self.rank} of {self.size} raised; aborting every rank "
                             f"(the others would wait for its messages forever):\n{text}")
            sys.stderr.flush()
            self.comm.Abort(1)
            raise


class Distributed(Ranks):
    """`model` run by every rank of `comm` (default ``MPI.COMM_WORLD``) on its block of the states
    declared here. See the module docstring for the pattern."""

    def __init__(self, model, comm=None, *, abort_on_error: bool = True):
        super().__init__(model, comm, abort_on_error)
        self.parts: dict[str, Partition] = {}
        self._tags: dict[str, int] = {}
        self.exchanges = 0                   # halo exchanges run (forward and adjoint) by this rank
        self.exchange_seconds = 0.0          # and the time they took, waiting for neighbours included

    # -- declarations ------------------------------------------------------------------------------
    def state(self, name: str, global_shape, dtype=float, *, halo: int = 0) -> Partition:
        """Declare a state of `global_shape`, split along its first axis over the ranks; this rank's
        model gets ``model.state(name, local_shape)``. `halo`: rows of each neighbour that a step
        reads (through `exchange`); no rank's block may be thinner than that."""
        dims = (int(global_shape),) if isinstance(global_shape, (int, np.integer)) else tuple(map(int, global_shape))
        if isinstance(halo, bool) or not isinstance(halo, (int, np.integer)) or halo < 0:
            raise ModelError(f"state '{name}': halo must be an int >= 0, got {halo!r}")
        if not dims or dims[0] < self.size:
            raise ModelError(f"state '{name}': its first axis ({dims[0] if dims else 'none'}) cannot be split over "
                             f"{self.size} ranks (every rank needs at least one row); run on fewer ranks")
        thinnest = min(block_rows(dims[0], self.size, r)[1] for r in range(self.size))
        if halo > thinnest and self.size > 1:
            raise ModelError(f"state '{name}': halo {halo} is wider than the thinnest block ({thinnest} rows of "
                             f"{dims[0]} over {self.size} ranks); a halo comes from the next rank only, so use "
                             f"fewer ranks or a smaller halo")
        offset, rows = block_rows(dims[0], self.size, self.rank)
        spec = self.model.state(name, (rows,) + dims[1:], dtype)
        part = self.parts[name] = Partition(name, dims, spec.dtype, int(halo), offset, rows)
        self._tags[name] = 2 * len(self._tags)
        return part

    def _part(self, name: str) -> Partition:
        part = self.parts.get(name)
        if part is None:
            raise ModelError(f"'{name}' is not a distributed state (declared with dist.state): "
                             f"{', '.join(map(repr, self.parts)) or 'none are'}")
        return part

    def offset(self, name: str) -> int:
        """The global index of this rank's first row of state `name`."""
        return self._part(name).offset

    def rows(self, name: str) -> int:
        return self._part(name).rows

    def local_shape(self, name: str) -> tuple:
        return self._part(name).local_shape

    # -- moving blocks -------------------------------------------------------------------------------
    def scatter(self, global_state: dict) -> dict:
        """``{name: global ndarray or array}`` (the same on every rank) -> ``{name: this rank's block}``
        as stepper arrays on the model's device. Names that are not distributed pass through."""
        out = {}
        for name, value in global_state.items():
            part = self.parts.get(name)
            if part is None:
                out[name] = value
                continue
            values = value.numpy() if isinstance(value, array) else np.asarray(value)
            if values.shape[:len(part.global_shape)] != part.global_shape:
                raise ModelError(f"scatter: '{name}' has shape {values.shape}, expected the global shape "
                                 f"{part.global_shape}")
            block = np.ascontiguousarray(values[part.offset:part.offset + part.rows])
            out[name] = array(block, dtype=part.dtype, device=self.model.device)
        return out

    def gather(self, local, name: str | None = None) -> np.ndarray:
        """This rank's block of a distributed state (an array or ndarray; `name` picks the partition,
        default the first declared with the same block shape) -> the global ndarray, on every rank."""
        values = local.numpy() if isinstance(local, array) else np.asarray(local)
        blocks = self.comm.allgather(np.ascontiguousarray(values))
        return np.concatenate(blocks, axis=0)

    # -- the halo exchange -----------------------------------------------------------------------------
    def exchange(self, s, name: str) -> array:
        """``s.prev.<name>`` with `halo` rows of each neighbour around it, as a new scratch buffer of
        the step (``rows + 2 * halo`` rows; zeros beyond the global first and last rows). On the
        step's tape it is one operation whose adjoint returns the halos' adjoints to their owners."""
        part = self._part(name)
        x = s.prev[name]
        out = s.scratch(f"halo.{name}", (part.rows + 2 * part.halo,) + part.global_shape[1:], part.dtype, zero=False)
        self.exchange_into(name, x, out)
        return out

    def exchange_into(self, name: str, x: array, out: array) -> None:
        """The exchange of `exchange` from the block `x` into `out` (``rows + 2 * halo`` rows),
        differentiable on a recording Tape (for tests and custom steps)."""
        part = self._part(name)
        h, rows = part.halo, part.rows
        if x.shape != part.local_shape or out.shape != (rows + 2 * h,) + part.local_shape[1:]:
            raise ModelError(f"exchange of '{name}': expected a block of shape {part.local_shape} and an output of "
                             f"{(rows + 2 * h,) + part.local_shape[1:]} rows, got {x.shape} and {out.shape}")
        tape = active_tape()
        if tape is not None:
            # Not a launch (op.launch is None), so stepper/trace.py never replays a step that makes
            # it without calling the step function: recomputations exchange halos too.
            op = RecordedOp(f"halo exchange of '{name}'", {"block": x}, {"halo": out}, {},
                            lambda: self._backward(part, x, out), caller_location())
            if x.requires_grad and out.requires_grad:
                tape.record(op)
            else:
                tape.check_writes(op)
        values = x.numpy()
        host = out.numpy()                      # a view on the CPU, a host copy of a GPU array
        host[h:h + rows] = values
        if h:
            up, down = self._neighbours()
            host[:h] = 0
            host[h + rows:] = 0
            tag = self._tags[name]
            self._swap([(values[:h], up, tag), (values[rows - h:], down, tag + 1)],
                       [(host[:h], up, tag + 1), (host[h + rows:], down, tag)])
        if out.device != "cpu":
            out._write_host(host)
        out._mark_written()

    def _backward(self, part: Partition, x: array, out: array) -> None:
        # The neighbours wait for this rank's halo adjoints whatever its own gradients are, so the
        # messages go out even when there is nothing to send (zeros) or nowhere to add.
        h, rows = part.halo, part.rows
        g = out.grad.numpy() if out.grad is not None else np.zeros(out.numpy().shape, out.numpy().dtype)
        add = np.array(g[h:h + rows])
        if h:
            up, down = self._neighbours()
            from_up, from_down = np.zeros_like(g[:h]), np.zeros_like(g[:h])
            tag = self._tags[part.name] + 2 * len(self._tags)    # not the forward's tags
            # My top halo's adjoint belongs to the rank above (its last rows), and so on.
            self._swap([(np.ascontiguousarray(g[:h]), up, tag), (np.ascontiguousarray(g[h + rows:]), down, tag + 1)],
                       [(from_up, up, tag + 1), (from_down, down, tag)])
            add[:h] += from_up
            add[rows - h:] += from_down
        if x.grad is not None:
            x.grad._add_host(add)

    def _neighbours(self):
        proc_null = self._MPI.PROC_NULL
        up = self.rank - 1 if self.rank > 0 else proc_null
        down = self.rank + 1 if self.rank < self.size - 1 else proc_null
        return up, down

    def _swap(self, sends, recvs) -> None:
        """Post every receive and send (non-blocking), then wait for all of them."""
        began = time.perf_counter()
        requests = [self.comm.Irecv(buf, source=src, tag=tag) for buf, src, tag in recvs]
        requests += [self.comm.Isend(np.ascontiguousarray(buf), dest=dst, tag=tag) for buf, dst, tag in sends]
        self._MPI.Request.Waitall(requests)
        self.exchanges += 1
        self.exchange_seconds += time.perf_counter() - began

    # -- checks ------------------------------------------------------------------------------------------
    def _check_same(self, what: str, steps, schedule) -> None:
        """Every rank must run the same declarations and schedule; a collective check, so a mismatch
        is the same ModelError on every rank rather than a hang."""
        mine = (tuple((p.name, p.global_shape, str(p.dtype), p.halo) for p in self.parts.values()),
                tuple((n, s.shape, str(s.dtype)) for n, s in self.model.states.items() if n not in self.parts),
                tuple((n, p.shape, str(p.dtype)) for n, p in self.model.params.items()),
                steps, type(schedule).__name__ if schedule is not None else None)
        everyone = self.comm.allgather(mine)
        for r, theirs in enumerate(everyone):
            if theirs != everyone[0]:
                raise ModelError(f"{what}: rank {r} declares or runs something else than rank 0 (rank 0: "
                                 f"{everyone[0]}; rank {r}: {theirs}); every rank must declare the same states, "
                                 f"halos and parameters and run the same steps and schedule")

    # -- running ----------------------------------------------------------------------------------------
    def rollout(self, initial, steps=None, **options):
        """`Model.rollout` on every rank from its block `initial`; ``until`` is decided on global
        values (every rank stops when one's predicate holds). ``checkpoint="run.ckpt"`` writes one
        checkpoint directory per rank (``run.rank0000.ckpt``, ...) and, first, the decomposition to
        ``run.decomposition.json``, which `resume` checks."""
        self._check_same("rollout", steps, options.get("schedule"))
        path = options.get("checkpoint")
        if isinstance(path, (str, os.PathLike)):
            if self.rank == 0:
                _write_durably(_sidecar(path), json.dumps(self._decomposition(), indent=1))
            self.comm.Barrier()          # recorded before any rank writes a checkpoint
        options = self._per_rank(options)
        return self._guarded(lambda: self.model.rollout(initial, steps, **options))

    def resume(self, path, steps=None, **options):
        """Continue a rollout that wrote checkpoints to `path` (through `rollout`), on the same
        decomposition, from the last step that every rank completed a snapshot of; snapshots some
        ranks wrote beyond it are deleted first (the run recomputes them, with the same bits).
        Another rank count or other states is a ModelError on every rank."""
        self._check_same("resume", steps, None)
        sidecar = _sidecar(path)
        try:
            with open(sidecar, encoding="utf-8") as f:
                recorded = json.load(f)
        except FileNotFoundError:
            raise ModelError(f"resume({os.fspath(path)!r}): {sidecar} is missing, so the decomposition that wrote the "
                             f"checkpoints is unknown; resume runs written by Distributed.rollout(checkpoint=...)") from None
        mine = self._decomposition()
        if recorded != mine:
            raise ModelError(f"resume({os.fspath(path)!r}): the checkpoints were written by {recorded['ranks']} rank(s) "
                             f"with {_describe_blocks(recorded)}, but this run has {self.size} rank(s) with "
                             f"{_describe_blocks(mine)}; resume with mpiexec -n {recorded['ranks']} and the same states")
        from checkpoint.storage.checkpoint_dir import checkpoint_file, list_checkpoints
        mine_path = rank_path(path, self.rank, self.size)
        if not os.path.isdir(mine_path):
            raise ModelError(f"resume({os.fspath(path)!r}): rank {self.rank}'s checkpoint directory {mine_path} is missing")
        done = list_checkpoints(mine_path)
        common = min(s[-1] if s else -1 for s in self.comm.allgather(done))
        if common < 0 or common not in done:
            raise ModelError(f"resume({os.fspath(path)!r}): the ranks hold no complete checkpoint of one same step "
                             f"(rank {self.rank} holds steps {done})")
        for n in done:           # a rank ahead of the others goes back: the run recomputes the same bits
            if n > common:
                os.remove(checkpoint_file(mine_path, n))
        options = self._per_rank(options)
        return self._guarded(lambda: self.model.resume(mine_path, steps, **options))

    def _decomposition(self) -> dict:
        return {"ranks": self.size, "states": {
            name: {"global_shape": list(p.global_shape), "dtype": str(p.dtype), "halo": p.halo,
                   "blocks": [list(block_rows(p.global_shape[0], self.size, r)) for r in range(self.size)]}
            for name, p in self.parts.items()}}

    def gradient(self, initial, steps=None, loss=None, schedule=None, storage=None, **options):
        """`Model.gradient` on every rank (see the module docstring): ``result.loss`` is the sum over
        ranks, parameters' gradients are summed over ranks; states' gradients and ``result.final``
        are this rank's block."""
        self._check_same("gradient", steps, schedule)
        options = self._per_rank(dict(options, storage=storage))

        def run():
            with agreed_costs(lambda costs: tuple(self.comm.allreduce(c, op=self._MPI.MAX) for c in costs)):
                result = self.model.gradient(initial, steps, loss, schedule, **options)
            grads = dict(result.grads)
            for name, p in self.model.params.items():
                grads[name] = array(self.sum(grads[name].numpy()), dtype=p.dtype, device=p.device)
            return replace(result, loss=float(self.sum(result.loss)), grads=grads)
        return self._guarded(run)


def _sidecar(path) -> str:
    return os.path.splitext(os.fspath(path))[0] + ".decomposition.json"


def _describe_blocks(decomposition: dict) -> str:
    return "; ".join(f"'{name}' {tuple(d['global_shape'])} in blocks (offset, rows) "
                     f"{', '.join(str(tuple(b)) for b in d['blocks'])}" for name, d in decomposition["states"].items())


def _write_durably(path: str, text: str) -> None:
    """Write `path` whole or not at all: a temporary file, flushed and fsynced, renamed into place."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
