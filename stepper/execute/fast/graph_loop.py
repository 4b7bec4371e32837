"""GPU step loops: a run of recomputed steps of a traced step as CUDA graph launches.

On the CPU a run of recomputations is one native call (native_loop.py). On a GPU each launch from
Python costs the host microseconds, about what a small kernel takes, while one graph launch runs
any number of kernels. The buffer ring is native_loop's: the first step reads the starting state
and writes version A; after it the steps alternate A -> B and B -> A, so a pair of steps
(A -> B -> A) always uses the same memory and makes one graph, launched once per pair. The first
step, and a last odd one, replay the trace from Python. Zero fills the Python path makes (s.next
when the model's `zero_buffers`, scratch asked with zero) are nodes of the graph, in order, so each
launch sees what a replay from Python gives it and the state comes out with the same bits.

A graph bakes in its pointers, so graphs are kept (the last `KEEP`) by the versions they use, and
the ring goes back to the pool to be handed out last and is asked for again: a Revolve(1200, 8)
gradient of the chain test model captured 15 graphs in 80 runs of 2,030 steps (taking any
free versions found none again). The price is memory: the ring is two versions besides the
run's result, one state more than the step-by-step path holds while a run lasts, so a run
takes the ring only where the pool has that memory free already (a gradient never grows past the
step-by-step path's peak for it). Where it has not, the run takes versions as the step-by-step path
would and captures a graph of its own (`_in_step_memory`): until 2026-11-26 such runs kept to the
Python path, which left a gradient's first sweep, and every run of Revolve-100 over the 256^2
wave's 10,000 steps, without a graph (~40 us of host time a step on an H100). A rollout's runs (``in_place``) need no ring of their
own: the run's starting version and one other alternate, the two a rollout holds anyway.
Capturing costs about what its launches cost and instantiating more, so runs shorter than
`MIN_STEPS` keep to the Python path. A step that reads a series reads, in the graph, two row
buffers of the loops' own (one for each step of the pair), which each replay first fills with its
steps' rows by device-to-device copies on the graph's stream.
"""
from __future__ import annotations

from collections import Counter, OrderedDict

from compiler.runtime.graph import Graph
from compiler.runtime.launch import relaunch

from ...step.state import State
from ...step.trace import SeriesRows, Slot
from .native_reverse import kept_part

__all__ = ["GraphLoops"]


class GraphLoops:
    """Runs steps of a traced step on a GPU, for a Sweep or a rollout; `advance` is NativeLoops'."""

    MIN_STEPS = 8
    KEEP = 8

    def __init__(self, pool, states: dict, in_place: bool = False, series: dict | None = None):
        self.pool = pool
        self._series = series or {}
        self.in_place = in_place
        self._names = list(states)
        self._kinds = [pool.kind(spec.shape, spec.dtype) for spec in states.values()]
        self._graphs: OrderedDict[tuple, tuple] = OrderedDict()     # versions' pointers -> (trace, Graph)
        self._ring: list = []                  # the last run's ring versions, asked for again
        self._rows: _RowBuffers | None = None  # the graphs' series rows
        self.steps = self.calls = 0            # steps run here, and the calls that ran them
        self.renamed_copies = 0                # (copies of a state run as copies in a graph)
        self.captures = self.reuses = 0        # graphs captured, and found again

    def advance(self, trace, prev: State, steps: int, n: int = 0, losses=None) -> State | None:
        """Run `steps` steps of `trace` from `prev` (step `n` first), taking over the caller's
        hold on it; return the new state (one hold, the caller's), or None to say: use the Python
        path. A graph bakes in its pointers, so the series rows it reads are two row buffers of
        its own (the pair's first step reads one, its second the other), into which each replay's
        rows are copied first (`_RowBuffers`). First runs with a running loss (`losses`) keep to
        the Python path: each step's loss would be read back."""
        if steps < self.MIN_STEPS or not trace or losses is not None:
            return None
        rows = SeriesRows(self._series, trace)
        if not rows.fits(n + steps):
            return None
        if self._rows is None or self._rows.trace is not trace:
            self._rows = _RowBuffers(trace, rows)
        starts = [prev[name] for name in self._names]
        if self.in_place and all(self.pool.holds(s) == 1 for s in starts):
            result = self._in_place(trace, prev, starts, steps, n)
        elif self._spare_memory(trace, starts):
            result = self._in_ring(trace, prev, starts, steps, n)
        else:
            result = self._in_step_memory(trace, prev, starts, steps, n)
        self.steps += steps
        self.calls += 1
        return result

    def advance_keeping(self, trace, prev: State, steps: int, keep, n: int = 0, losses=None) -> list[State] | None:
        """NativeLoops.advance_keeping on a GPU: `steps` steps of `trace` from `prev` (step `n`
        first), each into versions of its own, returned (each held once, the caller's; all but the
        last only the names in `keep`; `prev` untouched), or None for the tape path. Each step
        writes new versions, so no graph would be launched twice: the trace's launches are
        replayed from Python, without a tape (not counted in `steps`), with the running loss's
        where `losses` (NativeLoops.advance's) asks for them."""
        rows = SeriesRows(self._series, trace) if trace else None
        if not trace or not rows.fits(n + steps) or losses is not None and (
                trace.loss is None or trace.loss.group != "scratch"):
            return None
        pool, states = self.pool, []
        for k in range(steps):
            nxt = State({name: pool.take(kind, False) for name, kind in zip(self._names, self._kinds)})
            scratch = {name: pool.acquire(shape, dtype, False) for name, shape, dtype, _ in trace.scratch}
            try:
                self._step(trace, states[-1] if states else prev, nxt, scratch, series=rows.views(n + k),
                           with_loss=losses is not None)
                if losses is not None:
                    losses[k] = float(scratch[trace.loss.name].numpy().reshape(-1)[0])
            except BaseException:
                pool.release_all((*nxt.values(), *scratch.values()))
                for state in states:
                    pool.release_all(state.values())
                raise
            pool.release_all(scratch.values())
            if states:                               # what no reversal reads serves the next steps
                states[-1] = kept_part(pool, states[-1], keep)
            states.append(nxt)
        return states

    def _in_place(self, trace, prev: State, starts: list, steps: int, n: int) -> State:
        """A rollout's run: `prev` (only the caller holds it) and one other version make the ring,
        pairs prev -> B -> prev by graph and a last prev -> B when `steps` is odd. A rollout has
        these two versions only, so its runs use the same two buffers and find their graphs."""
        pool, ring = self.pool, iter(self._ring)
        b = [pool.take(kind, False, next(ring, None)) for kind in self._kinds]
        scratch = {name: pool.take(pool.kind(shape, dtype), False, next(ring, None))
                   for name, shape, dtype, _ in trace.scratch}
        other = State(dict(zip(self._names, b)))
        rows = self._rows
        try:
            graph = self._graph(trace, prev, other, scratch)
            for k in range(steps // 2):
                rows.load(n + 2 * k)
                graph.replay()
            if steps % 2:
                self._step(trace, prev, other, scratch, series=rows.rows.views(n + steps - 1))
        except BaseException:
            pool.release_all((*b, *scratch.values()))
            raise
        result, spare = (other, prev) if steps % 2 else (prev, other)
        for arr in (*starts, *b, *scratch.values()):
            arr._storage.version += 1                 # written, as launches mark what they write
        self._ring = [*b, *scratch.values()]
        pool.release_all([*spare.values(), *scratch.values()])
        return result

    def _in_ring(self, trace, prev: State, starts: list, steps: int, n: int) -> State:
        """A recomputation's run: the first step from `prev` into ring version A, then pairs
        A -> B -> A by graph, one more A -> B when the count asks, and the last into the result,
        which is `prev`'s own memory where only the caller holds it. The ring goes back to the
        pool to be handed out last, and is asked for again next time, so that the next run
        finds its graph (`prev` is a different snapshot's each time)."""
        pool, ring = self.pool, iter(self._ring)
        a = [pool.take(kind, False, next(ring, None)) for kind in self._kinds]
        b = [pool.take(kind, False, next(ring, None)) for kind in self._kinds]
        scratch = {name: pool.take(pool.kind(shape, dtype), False, next(ring, None))
                   for name, shape, dtype, _ in trace.scratch}
        out = [s if pool.holds(s) == 1 else pool.take(kind, False) for s, kind in zip(starts, self._kinds)]
        first, second = State(dict(zip(self._names, a))), State(dict(zip(self._names, b)))
        result = State(dict(zip(self._names, out)))
        extra = (steps - 2) % 2
        pairs, rows = (steps - 2 - extra) // 2, self._rows
        try:
            self._step(trace, prev, first, scratch, series=rows.rows.views(n))
            graph = self._graph(trace, first, second, scratch)
            for k in range(pairs):
                rows.load(n + 1 + 2 * k)
                graph.replay()
            if extra:
                self._step(trace, first, second, scratch, series=rows.rows.views(n + 1 + 2 * pairs))
            self._step(trace, second if extra else first, result, scratch, series=rows.rows.views(n + steps - 1))
        except BaseException:
            pool.release_all((*a, *b, *scratch.values()))
            pool.release_all([x for x, s in zip(out, starts) if x is not s])
            raise
        for arr in (*a, *b, *scratch.values()):
            arr._storage.version += 1                 # written, as launches mark what they write
        self._ring = [*a, *b, *scratch.values()]
        pool.release_all(self._ring, last=True)
        pool.release_all([s for s, x in zip(starts, out) if x is not s])    # the caller's hold, taken over
        return result

    def _spare_memory(self, trace, starts: list) -> bool:
        """Whether the pool has free versions for the ring and the result: a run never makes a
        gradient take more memory than the step-by-step path would (at the cost of runs that
        come when the pool is short keeping to that path)."""
        need = Counter(self._kinds * 2)
        need.update(kind for s, kind in zip(starts, self._kinds) if self.pool.holds(s) != 1)
        need.update(self.pool.kind(shape, dtype) for _, shape, dtype, _ in trace.scratch)
        return all(len(kind.free) >= count for kind, count in need.items())

    def _in_step_memory(self, trace, prev: State, starts: list, steps: int, n: int) -> State:
        """`_in_ring` where the pool is short: versions taken when and as the step-by-step path takes
        them, so no more memory than it. The first step from `prev` into A, then pairs A -> B -> A
        by graph and one more A -> B when the count asks; the version written last is the result. B
        is `prev`'s own memory where only the caller holds it (as the step-by-step path's second
        step would reuse it), else a version from the pool. The versions differ from run to run, so
        each run captures its graph (a pair's launches and an instantiation), which still beats
        launching every step from Python from runs of `MIN_STEPS` on."""
        pool = self.pool
        a = [pool.take(kind, False) for kind in self._kinds]
        own = [s if pool.holds(s) == 1 else None for s in starts]
        b = [pool.take(kind, False) if s is None else s for s, kind in zip(own, self._kinds)]
        scratch = {name: pool.take(pool.kind(shape, dtype), False) for name, shape, dtype, _ in trace.scratch}
        first, second = State(dict(zip(self._names, a))), State(dict(zip(self._names, b)))
        pairs, extra = divmod(steps - 1, 2)
        rows = self._rows
        try:
            self._step(trace, prev, first, scratch, series=rows.rows.views(n))
            if pairs:
                graph = self._graph(trace, first, second, scratch, keep=False)
                for j in range(pairs):
                    rows.load(n + 1 + 2 * j)
                    graph.replay()
            if extra:
                self._step(trace, first, second, scratch, series=rows.rows.views(n + steps - 1))
        except BaseException:
            pool.release_all((*a, *scratch.values(), *(x for x, o in zip(b, own) if o is None)))
            raise
        for arr in (*a, *b, *scratch.values()):
            arr._storage.version += 1                 # written, as launches mark what they write
        result, spare = (b, a) if extra else (a, b)
        # Each of a, b holds once: ours, or for `prev`'s own memory the caller's. The result's is the
        # caller's now; the caller's hold on a start held elsewhere is taken over.
        pool.release_all([s for s, o in zip(starts, own) if o is None])
        pool.release_all((*spare, *scratch.values()), last=True)
        return State(dict(zip(self._names, result)))

    def _step(self, trace, prev: State, nxt: State, scratch: dict, graph: Graph | None = None,
              series: dict | None = None, with_loss: bool = False) -> None:
        """One step from `prev` into `nxt`: run now, or (with `graph`) captured into it."""
        zero = graph.zero if graph is not None else _zero
        if self.pool.zero:
            for arr in nxt.values():
                zero(arr)
        for name, _, _, asked in trace.scratch:
            if asked is not False and (asked or self.pool.zero):
                zero(scratch[name])
        groups = {"prev": prev, "next": nxt, "scratch": scratch, "series": series}
        for t in trace.launches if with_loss else trace.launches[:trace.step_launches]:
            args = [groups[x.group][x.name] if type(x) is Slot else x for x in t.args]
            relaunch(t.kernel, t.dims, args, t.deterministic, where=t.where, graph=graph)

    def _graph(self, trace, first: State, second: State, scratch: dict, keep: bool = True) -> Graph:
        """The graph of two steps, first -> second -> first: kept, or captured now (and kept for
        later runs unless `keep` is False: a graph of versions that are not a ring's)."""
        key = tuple(arr._data.ptr for arr in (*first.values(), *second.values(), *scratch.values()))
        kept = self._graphs.get(key)
        if kept is not None and kept[0] is trace:
            self._graphs.move_to_end(key)
            self.reuses += 1
            return kept[1]
        graph = Graph()
        try:
            self._step(trace, first, second, scratch, graph, series=self._rows.buffers[0])
            self._step(trace, second, first, scratch, graph, series=self._rows.buffers[1])
        finally:
            graph.finish(run=False)
        self.captures += 1
        if not keep:
            return graph
        self._graphs[key] = (trace, graph)
        if len(self._graphs) > self.KEEP:
            self._graphs.popitem(last=False)
        return graph


class _RowBuffers:
    """The series rows a graph of two steps reads: a buffer per series for each of the two steps,
    baked into the graph, which `load` fills with the rows of steps n and n + 1 before a replay
    (device-to-device copies on the stream the graph runs on, so in order with it)."""

    def __init__(self, trace, rows: SeriesRows):
        from compiler import zeros
        self.trace, self.rows = trace, rows
        first = rows.views(0)
        self.buffers = [{name: zeros(view.shape, dtype=view.dtype, device=view.device) for name, view in first.items()}
                        for _ in range(2)]
        self._copies = [(a._data, b._data, values._data, values._data.strides[0], a._data.nbytes)
                        for values, a, b in zip(rows.arrays, self.buffers[0].values(), self.buffers[1].values())]

    def load(self, n: int) -> None:
        for first, second, values, stride, nbytes in self._copies:
            first.copy_bytes_from(values, 0, n * stride, nbytes)
            second.copy_bytes_from(values, 0, (n + 1) * stride, nbytes)
        for buffers in self.buffers:
            for a in buffers.values():
                a._mark_written()


def _zero(arr) -> None:
    arr._zero_memory()
    arr._mark_written()

