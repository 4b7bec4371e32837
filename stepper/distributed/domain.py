"""Domain-decomposed rollouts and checkpointed gradients over MPI (mpi4py).

Every rank builds the same `Model` and wraps it in a `Distributed`. States are declared with their
*global* shapes; their leading axes are split into contiguous blocks over a grid of ranks
(``grid=(P,)``, the default, splits the first axis over every rank; ``grid=(P0, P1)`` the first two
axes, rank r sitting at row-major coordinates ``np.unravel_index(r, grid)``). Each rank's model holds
only its block. A state that a step reads beyond its block declares a ``halo`` width; inside the step,
``dist.exchange(s, "u")`` returns a scratch buffer `halo` elements wider on each side of every split
axis (``dist.halo_shape("u")``): the neighbours' values in the halos, corners included (zeros beyond
the global edges), ``s.prev.u`` in between. The exchange is an operation of the step's tape: its
adjoint sends the halos' adjoints back to their owners, who add them to their elements. Kernels get
the local block and its global offsets, so one kernel serves 1 rank and N ranks::

    dist = Distributed(model)                      # comm=MPI.COMM_WORLD, grid=(size,)
    dist.state("u", (n, n), float, halo=1)
    dist.state("u_prev", (n, n), float)

    @model.step
    def step(s):
        u = dist.exchange(s, "u")                  # (rows + 2, n): row i of s.prev.u is row i + 1
        sp.launch(wave_step, dist.local_shape("u"), inputs=[u, s.prev.u_prev, dist.offset("u"), n, ...],
                  outputs=[s.next.u, s.next.u_prev])
        # or, the rows that read no halo running while the halos travel (same bits):
        # dist.launch(wave_step, ..., inputs=[dist.halo(s, "u"), s.prev.u_prev, ...], outputs=[...])

    result = dist.gradient(dist.scatter({"u": u0, "u_prev": u0}), steps, loss=..., schedule=...)

With ``grid=(2, 2)`` the exchanged buffer is ``(rows + 2, cols + 2)``, element (i, j) of the block is
(i + 1, j + 1) there, and ``dist.offset("u", axis=1)`` is the block's first global column. The
exchange itself, and launches that overlap it, are in halo_exchange.py.

Every rank runs the same schedule (schedules are deterministic), so the exchanges of every rank
meet. A loss is each rank's own part (built from its block); ``dist.gradient`` seeds every rank's
part with 1 (the adjoint of the sum over ranks) and returns the sum over ranks as ``result.loss``.
Replicated parameters' gradients are summed over ranks. Sums over ranks are taken in rank order on
every rank, so every rank gets the same bits. ``result.grads`` of a state is this rank's block
(``dist.gather`` assembles the global array). A path given as ``storage=`` or ``checkpoint=`` gets
the rank in its name (``run.h5`` -> ``run.rank0003.h5``) when there is more than one rank.

``dist.jvp`` and ``dist.hvp`` are `Model.jvp` / `Model.hvp` on every rank, reduced like
``dist.gradient``: the loss and its tangent are summed over ranks, and so are replicated
parameters' ``hvp`` (a parameter's direction must be the same on every rank; a state's is this
rank's block, from `scatter`). The tangent of a halo exchange is the exchange of the tangents
(it is linear), made beside it inside the tangent model's steps, and its adjoint is again an
exchange's adjoint: so both run through every schedule and tier as gradients do.

A rank that raises inside ``dist.rollout`` / ``dist.gradient`` prints its error and aborts the
communicator (``comm.Abort``), so that no rank waits forever for a message that will not come.
"""
from __future__ import annotations

import json
import math
import os
import sys
import traceback
from dataclasses import dataclass, replace

import numpy as np

from compiler import array, zeros
from compiler.runtime.forward_mode import active_tangents
from compiler.runtime.tape import RecordedOp, active_tape, caller_location

from ..execute.disk_plan import agreed_costs
from ..errors import ModelError
from .halo_exchange import HaloExchanges

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
    """One state's block partition along its leading ``len(offsets)`` axes: its global shape, this
    rank's block (``offsets[a] .. offsets[a] + extents[a] - 1`` along split axis a) and the halo width."""
    name: str
    global_shape: tuple
    dtype: object
    halo: int
    offsets: tuple
    extents: tuple

    @property
    def offset(self) -> int:
        return self.offsets[0]

    @property
    def rows(self) -> int:
        return self.extents[0]

    @property
    def local_shape(self) -> tuple:
        return tuple(self.extents) + tuple(self.global_shape[len(self.extents):])

    @property
    def halo_shape(self) -> tuple:
        """The shape `exchange` returns: `halo` more on each side of every split axis."""
        return tuple(e + 2 * self.halo for e in self.extents) + tuple(self.global_shape[len(self.extents):])

    @property
    def block(self) -> tuple:
        """This rank's block as a tuple of slices of the global array."""
        return tuple(slice(o, o + e) for o, e in zip(self.offsets, self.extents))

    @property
    def interior(self) -> tuple:
        """The block's place in the exchanged buffer, as a tuple of slices."""
        return tuple(slice(self.halo, self.halo + e) for e in self.extents)


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

    def allreduce(self, x: array) -> array:
        """The sum over ranks of `x` (added in rank order: the same bits on every rank), as a new
        array, for a loss built on a recording Tape (say, after a rollout recorded there). Its
        backward treats the sum as one value that every rank holds: each rank's `x` gets the
        sum's gradient as this rank sees it, so seed it alike on every rank (``tape.backward(
        grads={total: 1.0})`` on each). Replicated parameters then hold this rank's part of their
        gradient; `sum_grads` adds the parts up."""
        total = array(self.sum(x.numpy()), dtype=x.dtype, device=x.device, requires_grad=x.requires_grad)
        tape = active_tape()
        if tape is not None and x.requires_grad:
            def backward():
                if total.grad is not None and x.grad is not None:
                    x.grad._add_host(total.grad.numpy())
            tape.record(RecordedOp("sum over ranks", {"part": x}, {"total": total}, {}, backward, caller_location()))
        return total

    def sum_grads(self, *arrays) -> None:
        """Replace each array's ``.grad`` (this rank's part of a replicated parameter's gradient,
        after a Tape's backward) with the sum over ranks, in rank order: the same bits on every rank."""
        for a in arrays:
            if a.grad is None:
                raise ModelError("sum_grads: an array without a gradient (requires_grad=False, or no "
                                 "backward has run yet); every rank must pass the same arrays")
            a.grad.assign(self.sum(a.grad.numpy()))

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


class Distributed(HaloExchanges, Ranks):
    """`model` run by every rank of `comm` (default ``MPI.COMM_WORLD``) on its block of the states
    declared here; `grid`: ranks along each split leading axis (default: every rank along the first).
    See the module docstring for the pattern."""

    def __init__(self, model, comm=None, *, grid=None, abort_on_error: bool = True):
        super().__init__(model, comm, abort_on_error)
        self.grid = (self.size,) if grid is None else _checked_grid(grid, self.size)
        self.coords = tuple(int(c) for c in np.unravel_index(self.rank, self.grid))
        self.parts: dict[str, Partition] = {}
        self._tags: dict[str, int] = {}
        self._init_exchanges()

    # -- declarations ------------------------------------------------------------------------------
    def state(self, name: str, global_shape, dtype=float, *, halo: int = 0) -> Partition:
        """Declare a state of `global_shape`, its leading axes split over the grid of ranks; this
        rank's model gets ``model.state(name, local_shape)``. `halo`: elements of each neighbour that
        a step reads (through `exchange`) along every split axis; no block may be thinner than that."""
        dims = (int(global_shape),) if isinstance(global_shape, (int, np.integer)) else tuple(map(int, global_shape))
        if isinstance(halo, bool) or not isinstance(halo, (int, np.integer)) or halo < 0:
            raise ModelError(f"state '{name}': halo must be an int >= 0, got {halo!r}")
        if len(dims) < len(self.grid):
            raise ModelError(f"state '{name}': shape {dims} has fewer axes than the grid of ranks {self.grid} "
                             f"splits; give Distributed a grid with at most {len(dims)} axes")
        blocks = []
        for axis, (n, ranks) in enumerate(zip(dims, self.grid)):
            where = "its first axis" if len(self.grid) == 1 else f"its axis {axis}"
            if n < ranks:
                raise ModelError(f"state '{name}': {where} ({n}) cannot be split over {ranks} ranks (every rank "
                                 f"needs at least one row); run on fewer ranks")
            thinnest = min(block_rows(n, ranks, r)[1] for r in range(ranks))
            if halo > thinnest and ranks > 1:
                raise ModelError(f"state '{name}': halo {halo} is wider than the thinnest block ({thinnest} rows of "
                                 f"{n} over {ranks} ranks{'' if len(self.grid) == 1 else f' along axis {axis}'}); "
                                 f"a halo comes from the next rank only, so use fewer ranks or a smaller halo")
            blocks.append(block_rows(n, ranks, self.coords[axis]))
        offsets, extents = zip(*blocks)
        spec = self.model.state(name, extents + dims[len(extents):], dtype)
        part = self.parts[name] = Partition(name, dims, spec.dtype, int(halo), offsets, extents)
        self._tags[name] = len(self._tags)
        return part

    def _part(self, name: str) -> Partition:
        part = self.parts.get(name)
        if part is None:
            raise ModelError(f"'{name}' is not a distributed state (declared with dist.state): "
                             f"{', '.join(map(repr, self.parts)) or 'none are'}")
        return part

    def offset(self, name: str, axis: int = 0) -> int:
        """The global index of this rank's first element of state `name` along split axis `axis`."""
        part = self._part(name)
        if not 0 <= axis < len(part.offsets):
            raise ModelError(f"offset('{name}', axis={axis}): the grid {self.grid} splits axes 0..{len(self.grid) - 1}")
        return part.offsets[axis]

    def rows(self, name: str) -> int:
        return self._part(name).rows

    def local_shape(self, name: str) -> tuple:
        return self._part(name).local_shape

    def halo_shape(self, name: str) -> tuple:
        """The shape of what ``exchange(s, name)`` returns."""
        return self._part(name).halo_shape

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
            out[name] = array(np.ascontiguousarray(values[part.block]), dtype=part.dtype, device=self.model.device)
        return out

    def gather(self, local, name: str | None = None) -> np.ndarray:
        """This rank's block of a distributed state (an array or ndarray; `name` picks the partition,
        default the first declared with the same block shape) -> the global ndarray, on every rank."""
        values = np.ascontiguousarray(local.numpy() if isinstance(local, array) else np.asarray(local))
        if name is not None:
            part = self._part(name)
        else:
            part = next((p for p in self.parts.values() if p.local_shape == values.shape[:len(p.local_shape)]), None)
            if part is None:
                raise ModelError(f"gather: no distributed state has blocks of shape {values.shape} on rank "
                                 f"{self.rank}; pass name= of the state the block belongs to")
        pieces = self.comm.allgather((part.block, values))
        whole = np.empty(part.global_shape + values.shape[len(part.global_shape):], values.dtype)
        for block, piece in pieces:
            whole[block] = piece
        return whole

    # -- checks ------------------------------------------------------------------------------------------
    def _check_same(self, what: str, steps, schedule) -> None:
        """Every rank must run the same declarations and schedule; a collective check, so a mismatch
        is the same ModelError on every rank rather than a hang."""
        mine = (tuple((p.name, p.global_shape, str(p.dtype), p.halo) for p in self.parts.values()),
                tuple((n, s.shape, str(s.dtype)) for n, s in self.model.states.items() if n not in self.parts),
                tuple((n, p.shape, str(p.dtype)) for n, p in self.model.params.items()),
                steps, type(schedule).__name__ if schedule is not None else None, self.grid)
        everyone = self.comm.allgather(mine)
        for r, theirs in enumerate(everyone):
            if theirs != everyone[0]:
                raise ModelError(f"{what}: rank {r} declares or runs something else than rank 0 (rank 0: "
                                 f"{everyone[0]}; rank {r}: {theirs}); every rank must declare the same grid, "
                                 f"states, halos and parameters and run the same steps and schedule")

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
        blocks = lambda p: [[list(block_rows(n, ranks, c)) for n, ranks, c in zip(p.global_shape, self.grid, coords)]
                            for coords in np.ndindex(*self.grid)]
        return {"ranks": self.size, "grid": list(self.grid), "states": {
            name: {"global_shape": list(p.global_shape), "dtype": str(p.dtype), "halo": p.halo, "blocks": blocks(p)}
            for name, p in self.parts.items()}}

    def gradient(self, initial, steps=None, loss=None, schedule=None, storage=None, **options):
        """`Model.gradient` on every rank (see the module docstring): ``result.loss`` is the sum over
        ranks, parameters' gradients are summed over ranks; states' gradients and ``result.final``
        are this rank's block."""
        self._check_same("gradient", steps, schedule)
        options = self._per_rank(dict(options, storage=storage))

        def run():
            with agreed_costs(self._agree):
                result = self.model.gradient(initial, steps, loss, schedule, **options)
            return replace(result, loss=float(self.sum(result.loss)), grads=self._summed(result.grads))
        return self._guarded(run)

    def jvp(self, initial, steps, tangents=None, loss=None, running_loss=None, **options):
        """`Model.jvp` on every rank: ``final`` and ``tangents`` are this rank's blocks, ``loss`` and
        ``loss_tangent`` the sums over ranks. `tangents` of states are blocks (`scatter`), those of
        parameters the same on every rank."""
        from ..runs.second_order import jvp
        self._check_same("jvp", steps, None)
        self._check_direction(tangents, "tangents")

        def run():
            result = jvp(self.model, initial, steps, tangents, loss, running_loss, **options)
            if result.loss is None:
                return result
            return replace(result, loss=float(self.sum(result.loss)),
                           loss_tangent=float(self.sum(result.loss_tangent)))
        return self._guarded(run)

    def hvp(self, initial, steps, direction, loss=None, running_loss=None, schedule=None, storage=None,
            **options):
        """`Model.hvp` on every rank: ``loss`` is the sum over ranks, parameters' ``grads`` and
        ``hvp`` are summed over ranks, states' are this rank's block (`gather` assembles them)."""
        from ..runs.second_order import hvp
        self._check_same("hvp", steps, schedule)
        self._check_direction(direction, "direction")
        options = self._per_rank(dict(options, storage=storage))

        def run():
            with agreed_costs(self._agree):
                result = hvp(self.model, initial, steps, direction, loss, running_loss, schedule, **options)
            if result.grads is None:
                return replace(result, hvp=self._summed(result.hvp))
            return replace(result, loss=float(self.sum(result.loss)), grads=self._summed(result.grads),
                           hvp=self._summed(result.hvp))
        return self._guarded(run)

    def _check_direction(self, tangents, what: str) -> None:
        """A collective check of jvp's tangents / hvp's direction: a mistake on any rank (a global
        array for a block, say) is the same ModelError on every rank, and so is a replicated
        parameter's tangent that is not the same on every rank."""
        from ..runs.second_order import _checked
        problem, params = None, {}
        try:
            checked = _checked(self.model, tangents, what)
            params = {n: t.numpy().tobytes() for n, t in checked.items() if n in self.model.params}
        except ModelError as exc:
            problem = str(exc)
            if any(f"{what}['{n}']: expected shape" in problem or f"{what}['{n}'] has shape" in problem
                   for n in self.parts):
                problem += " (a distributed state's tangent is this rank's block: dist.scatter({name: global}) gives it)"
        everyone = self.comm.allgather((problem, params))
        for r, (theirs, _) in enumerate(everyone):
            if theirs is not None:
                raise ModelError(f"rank {r}: {theirs}")
        for name, mine in everyone[0][1].items():
            differs = [r for r, (_, theirs) in enumerate(everyone) if theirs.get(name) != mine]
            if differs:
                raise ModelError(f"{what}['{name}'] differs between rank 0 and rank {differs[0]}: '{name}' is a "
                                 f"parameter every rank holds whole, so its tangent must be the same on every rank")

    def _agree(self, costs):
        return tuple(self.comm.allreduce(c, op=self._MPI.MAX) for c in costs)

    def _summed(self, grads: dict) -> dict:
        """`grads` with every parameter's entry summed over ranks (in rank order)."""
        grads = dict(grads)
        for name, p in self.model.params.items():
            if name in grads:
                grads[name] = array(self.sum(grads[name].numpy()), dtype=p.dtype, device=p.device)
        return grads

    def _begin_exchange(self, name: str, x: array, out: array):
        """`HaloExchanges._begin_exchange`, and inside `Tangents` (a tangent model's step) the same
        exchange of the tangents: the block's (zeros if it has none, so that every rank's messages
        meet) into the tangent of `out`. Its messages follow the values' on the same tags, and
        MPI keeps the order of messages between two ranks, so each lands where it belongs."""
        finish = super()._begin_exchange(name, x, out)
        tan = active_tangents()
        if tan is None:
            return finish
        out_dot = tan.get(out)
        if out_dot is None:
            out_dot = zeros(out.shape, out.dtype, out.device, requires_grad=out.requires_grad)
            tan.seed(out, out_dot, check=False)
        x_dot = tan.get(x)
        finish_dot = super()._begin_exchange(name, x_dot if x_dot is not None else tan.zero_for(x), out_dot)

        def complete():
            finish()
            finish_dot()
        return complete


def _checked_grid(grid, size: int) -> tuple:
    """`grid` as a tuple of ints >= 1 whose product is the rank count, or a ModelError."""
    try:
        dims = tuple(int(g) for g in grid)
    except (TypeError, ValueError):
        raise ModelError(f"grid must be a tuple of rank counts, one per split axis, got {grid!r}") from None
    ranks = math.prod(dims) if dims else 0
    if not dims or min(dims) < 1 or ranks != size:
        raise ModelError(f"grid {dims} does not fit {size} rank(s): its counts multiply to {ranks}; run with "
                         f"mpiexec -n {ranks if dims else 1} or give a grid whose counts multiply to {size}")
    return dims


def _sidecar(path) -> str:
    return os.path.splitext(os.fspath(path))[0] + ".decomposition.json"


def _describe_blocks(decomposition: dict) -> str:
    """'u' (13, 9) in blocks (offset, rows) (0, 7), (7, 6) -- or, over a grid of ranks, one
    ((offset, extent), ...) per split axis for each block."""
    def block(axes):
        return str(tuple(axes[0])) if len(axes) == 1 else str(tuple(tuple(a) for a in axes))
    grid = decomposition.get("grid", [decomposition["ranks"]])
    what = "(offset, rows)" if len(grid) == 1 else f"over a {' x '.join(map(str, grid))} grid ((offset, extent) per axis)"
    return "; ".join(f"'{name}' {tuple(d['global_shape'])} in blocks {what} "
                     f"{', '.join(block(b) for b in d['blocks'])}" for name, d in decomposition["states"].items())


def _write_durably(path: str, text: str) -> None:
    """Write `path` whole or not at all: a temporary file, flushed and fsynced, renamed into place."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
