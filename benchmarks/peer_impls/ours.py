"""Ours: the same step as a stepper kernel, reversed with a checkpointing schedule.

The state is (up, u); each step writes both next.up (= prev.u) and next.u in one kernel, so a
snapshot is the same two arrays a peer's carry holds. `schedule` is "storeall", "revolve" (with
`snapshots` in RAM) or "multilevel" (`snapshots` in RAM plus `disk` on disk, HDF5 in a temporary
directory). The wave kernel's adjoint runs in its gather form (compiler/passes/gather.py): every gradient
element sums its neighbours' contributions itself, in parallel and without atomics, so it is
deterministic whatever ``deterministic`` says, and every schedule gives the same bits.
"""
from __future__ import annotations

import os
import sys
import tempfile

import numpy as np

from .problem import B, C, initial

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import stepper as sp                               # noqa: E402

F2 = sp.array(dtype=float, ndim=2)
F1 = sp.array(dtype=float)


@sp.kernel
def wave_step(up: F2, u: F2, c: float, b: float, up_next: F2, u_next: F2):
    i, j = sp.tid()
    n = u.shape[0]
    m = u.shape[1]
    x = u[i, j]
    lap = -4.0 * x
    if i > 0:
        lap += u[i - 1, j]
    if i < n - 1:
        lap += u[i + 1, j]
    if j > 0:
        lap += u[i, j - 1]
    if j < m - 1:
        lap += u[i, j + 1]
    up_next[i, j] = x
    u_next[i, j] = 2.0 * x - up[i, j] + c * lap - b * x * x * x


@sp.kernel
def half_sum_sq(u: F2, out: F1):
    i, j = sp.tid()
    sp.atomic_add(out, 0, 0.5 * u[i, j] * u[i, j])


def make_model(n: int) -> "sp.Model":
    # The kernel writes every element of s.next, so new versions need no zero-filling.
    model = sp.Model(zero_buffers=False)
    model.state("up", (n, n), sp.float32)
    model.state("u", (n, n), sp.float32)

    @model.step
    def step(s):
        sp.launch(wave_step, (n, n), inputs=[s.prev.up, s.prev.u, C, B], outputs=[s.next.up, s.next.u])
    return model


def loss(state):
    out = sp.zeros(1, requires_grad=True)
    sp.launch(half_sum_sq, state.u.shape, inputs=[state.u], outputs=[out])
    return out


class OursRunner:
    def __init__(self, n: int, steps: int, schedule: str, snapshots: int | None = None, disk: int = 0,
                 deterministic: bool = True, count: bool = False, native: bool = True):
        if not native:                              # this worker process only: recompute step by step
            from stepper.execute.executor import Sweep
            Sweep.native_loops = False
        self.n, self.steps, self.kind = n, steps, schedule
        self.snapshots, self.disk, self.deterministic = snapshots, disk, deterministic
        self.model = make_model(n)
        self.u0 = initial(n)
        self.final = None
        self.stats = None
        self._tmp = tempfile.TemporaryDirectory(prefix="peers-ours-")

    def _initial(self):
        return {"up": sp.array(self.u0.copy(), dtype=sp.float32), "u": sp.array(self.u0.copy(), dtype=sp.float32)}

    def _schedule(self, steps):
        if self.kind == "storeall":
            return sp.StoreAll(steps)
        if self.kind == "revolve":
            return sp.Revolve(steps, min(self.snapshots, steps))
        if self.kind == "multilevel":
            # Disk traffic priced in forward steps, as measured here: writing or reading one 512 KiB
            # snapshot to HDF5 (with checksums) costs about as much as 5 and 3 steps of this model.
            return sp.MultiLevel(steps, self.snapshots, self.disk, write_cost=5, read_cost=3)
        raise ValueError(f"unknown schedule {self.kind!r}")

    def _storage(self):
        return os.path.join(self._tmp.name, "snapshots.h5") if self.kind == "multilevel" else None

    def warmup(self) -> None:
        # compile (or load from the kernel cache) and touch every code path once, on 4 steps
        self.model.rollout(self._initial(), steps=4)
        self.model.gradient(self._initial(), steps=4, loss=loss, schedule=self._schedule(4),
                            storage=self._storage(), deterministic=self.deterministic)

    def forward(self) -> np.ndarray:
        final = self.model.rollout(self._initial(), steps=self.steps, deterministic=self.deterministic)
        self.final = (final.up.numpy().copy(), final.u.numpy().copy())     # what kernel_times runs on
        return self.final[1]

    def gradient(self) -> tuple[float, np.ndarray, dict]:
        result = self.model.gradient(self._initial(), steps=self.steps, loss=loss,
                                     schedule=self._schedule(self.steps), storage=self._storage(),
                                     deterministic=self.deterministic)
        self.stats = result.stats
        g = result.grads["u"].numpy() + result.grads["up"].numpy()   # u_prev = u = u0
        st = result.stats
        stats = {"forward_steps": st.forward_steps, "recorded_steps": st.recorded_steps,
                 "peak_memory_bytes_reported": st.peak_memory_bytes,
                 "io_seconds": st.io_seconds,
                 "launches_skipped": st.launches_skipped, "renamed_copies": st.renamed_copies,
                 "snapshots_ram": st.snapshots_written(sp.StorageType.RAM),
                 "snapshots_disk": st.snapshots_written(sp.StorageType.DISK)}
        return float(result.loss), g, stats

    def kernel_times(self, calls: int = 300, passes: int = 5) -> tuple[float, float, float]:
        """Seconds per call of the step kernel, of its variant without the identity store
        (``up_next = x``, which native runs rename) and of its adjoint, each called back to back on
        the same buffers through its ctypes entry point (about a microsecond of ctypes per call
        included): the kernel-only bounds' prices. The median of `passes` passes of `calls` calls
        each, the three interleaved (one slow pass on a busy machine moved the bound by 10% when it
        was one pass of 300), each pass after ten untimed calls (the first calls after another
        kernel ran 20-40% slower in passes of 100). They run on the rollout's final state where
        `forward` ran, else on the initial one: the initial bump's tails make the cube in the step
        underflow (4,949 elements at 256^2), and subnormal arithmetic made the renamed variant 17 us
        against 12 us on a state the wave has spread over, which most steps of a run are."""
        import statistics
        import time
        n = self.n
        up, u = (sp.array(values.copy(), dtype=sp.float32, requires_grad=True)
                 for values in (self.final or (self.u0, self.u0)))
        up_next, u_next = (sp.zeros((n, n), dtype=sp.float32, requires_grad=True) for _ in range(2))
        args = [up, u, C, B, up_next, u_next]
        with sp.capture() as graph:
            sp.launch(wave_step, (n, n), inputs=args[:4], outputs=args[4:])
        launch = graph.launches[0]
        module = wave_step.entry(False)
        real, seen = module.function, []

        def spy(name, adjoint):                     # catch the adjoint entry and its arguments
            fn = real(name, adjoint)
            return (lambda *a: (seen.append((fn, a)), fn(*a))[1]) if adjoint else fn
        module.function = spy
        try:
            tape = sp.Tape()
            with tape:
                sp.launch(wave_step, (n, n), inputs=args[:4], outputs=args[4:])
            tape.backward(grads={u_next: np.ones((n, n), np.float32), up_next: np.ones((n, n), np.float32)})
        finally:
            module.function = real
        fn, a = seen[-1]
        variant = module.function(wave_step.compiled().identity.function.name, adjoint=False)

        def timed(call) -> float:
            for _ in range(10):                   # the first calls after another kernel run slower
                call()
            t0 = time.perf_counter()
            for _ in range(calls):
                call()
            return (time.perf_counter() - t0) / calls
        forward, renamed, adjoint = [], [], []
        for _ in range(passes):
            forward.append(timed(lambda: launch.entry(launch.buffer, launch.serial)))
            renamed.append(timed(lambda: variant(launch.buffer, launch.serial)))
            adjoint.append(timed(lambda: fn(*a)))
        return statistics.median(forward), statistics.median(renamed), statistics.median(adjoint)

    def forward_steps(self) -> int | None:
        return None                                # reported by result.stats

    def stored_states(self) -> str:
        if self.kind == "storeall":
            return f"{self.steps} steps recorded"
        if self.kind == "revolve":
            return f"{self.snapshots} snapshots"
        return f"{self.snapshots} RAM + {self.disk} disk snapshots"


def describe() -> dict:
    return {"stepper": sp.__version__, "device": f"cpu (OpenMP, {os.cpu_count()} cores)"}
