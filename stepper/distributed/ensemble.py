"""Ensembles over MPI ranks: independent members (initial states, per-member parameters, losses) of
one replicated `Model`, split into contiguous blocks of members, one block per rank.

    ens = Ensemble(model)                            # comm=MPI.COMM_WORLD
    result = ens.gradient(8, lambda k: Member(initial=initial_of(k), loss=loss_of(k)), steps,
                          schedule=lambda steps: sp.Revolve(steps, 10))
    result.loss, result.grads["c"]                   # sums over all 8 members, on every rank
    result.members[k]                                # GradientResult of each member this rank ran

Each rank runs its members one after the other with `Model.gradient`. The total loss and the shared
parameters' gradients are then summed over *all* members in member order, on every rank, so they
are the same bits as the sum of the members' gradients computed one by one on one process.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from compiler import array

from ..errors import ModelError
from .domain import Ranks, block_rows

__all__ = ["Ensemble", "EnsembleResult", "Member"]


@dataclass(frozen=True)
class Member:
    """One ensemble member: its initial state (``{name: array or ndarray}``), its loss (a function of
    the final State, as `Model.gradient` takes) and, optionally, values of its own for some
    parameters (``{param name: ndarray}``; the others are shared by every member)."""
    initial: dict
    loss: object
    params: dict = field(default_factory=dict)


@dataclass(frozen=True)
class EnsembleResult:
    """``loss``: the sum of every member's loss; ``grads``: the sum over members of each shared
    parameter's gradient; ``losses``: every member's loss, in member order; ``members``: ``{k:
    GradientResult}`` of the members this rank ran (their initial states' and own parameters'
    gradients)."""
    loss: float
    grads: dict
    losses: list
    members: dict


class Ensemble(Ranks):
    """`model`, the same on every rank of `comm`, run for members split over the ranks."""

    def __init__(self, model, comm=None, *, abort_on_error: bool = True):
        super().__init__(model, comm, abort_on_error)

    def members(self, count: int) -> range:
        """The members this rank runs: a contiguous block of ``range(count)``."""
        start, rows = block_rows(count, self.size, self.rank)
        return range(start, start + rows)

    def gradient(self, count: int, member, steps=None, schedule=None, **options) -> EnsembleResult:
        """Gradients of `count` members, `member(k)` giving member k as a `Member` (called only on
        the rank that runs k). `schedule`: None or a function steps -> schedule (each member runs a
        schedule of its own); other options are `Model.gradient`'s, with paths made per rank."""
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ModelError(f"Ensemble.gradient: count must be an int >= 1, got {count!r}")
        if schedule is not None and not (callable(schedule) and not hasattr(schedule, "__iter__")):
            raise ModelError("Ensemble.gradient: every member runs a schedule of its own, so pass schedule= as "
                             "a function steps -> schedule (e.g. lambda steps: Revolve(steps, 10)), or None")
        everyone = self.comm.allgather((count, steps, tuple(self.model.params)))
        if any(theirs != everyone[0] for theirs in everyone):
            raise ModelError(f"Ensemble.gradient: the ranks disagree on (count, steps, params): {everyone}")
        options = self._per_rank(options)
        return self._guarded(lambda: self._run(count, member, steps, schedule, options))

    def _run(self, count, member, steps, schedule, options) -> EnsembleResult:
        params = self.model.params
        saved = {name: p.numpy().copy() for name, p in params.items()}
        results, own = {}, {}
        try:
            for k in self.members(count):
                m = member(k)
                if not isinstance(m, Member):
                    raise ModelError(f"Ensemble.gradient: member({k}) must return a Member(initial, loss, params), "
                                     f"got {type(m).__name__}")
                unknown = [n for n in m.params if n not in params]
                if unknown:
                    raise ModelError(f"member {k}: params {unknown} are not parameters of the model "
                                     f"({', '.join(params) or 'it has none'})")
                for name, p in params.items():
                    p.assign(m.params.get(name, saved[name]))
                results[k] = self.model.gradient(m.initial, steps, m.loss, schedule, **options)
                own[k] = set(m.params)
        finally:
            for name, p in params.items():
                p.assign(saved[name])
        # Every member's loss and shared-parameter gradients, gathered, then summed in member order.
        mine = {k: (r.loss, {n: r.grads[n].numpy() for n in params if n not in own[k]}) for k, r in results.items()}
        gathered = {}
        for part in self.comm.allgather(mine):
            gathered.update(part)
        losses = [gathered[k][0] for k in range(count)]
        total = losses[0]
        for value in losses[1:]:
            total += value
        grads = {}
        for name, p in params.items():
            sums = None
            for k in range(count):
                g = gathered[k][1].get(name)
                if g is not None:
                    sums = np.array(g, copy=True) if sums is None else sums + g
            if sums is not None:
                grads[name] = array(sums, dtype=p.dtype, device=p.device)
        return EnsembleResult(float(total), grads, losses, results)
