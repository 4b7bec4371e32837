"""A nonlinear 2-D wave (float64) on a grid split over MPI ranks, and the same wave on one process.

tests/test_mpi.py runs this file under ``mpiexec -n P python tests/mpi_wave.py MODE OUTDIR`` and
compares what rank 0 saves with the one-process model it builds from `serial_model` in its own process:

- ``run``: a rollout, and gradients with StoreAll, Revolve and MultiLevel (per-rank HDF5), gathered
  to global arrays and saved to OUTDIR/result.npz, with a dot-product and a finite-difference check
  of the halo exchange's adjoint on the side;
- ``raise``: rank 1 raises inside its step function at step 5 of a gradient (the others then wait
  for its halos, until its abort ends them).

The decomposed kernel reads its block through a halo of one row (local row i is row i + 1 of the
exchanged buffer) and decides the global boundary with the block's global offset.
"""
from __future__ import annotations

import os
import signal
import sys

import numpy as np

import stepper as sp

F = sp.float64
G = sp.array(dtype=sp.float64, ndim=2)
N, M, STEPS = 13, 9, 24            # 13 rows: blocks of 7 + 6 on 2 ranks, 4 + 3 + 3 + 3 on 4
B = 1e-1


@sp.kernel
def wave_full(u: G, u_prev: G, c: sp.array(dtype=sp.float64), b: F, u_next: G, u_now: G):
    i, j = sp.tid()
    n = u.shape[0]
    m = u.shape[1]
    center = u[i, j]
    value = F(0.0)
    if i > 0 and j > 0 and i < n - 1 and j < m - 1:
        lap = u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1] - 4.0 * center
        value = 2.0 * center - u_prev[i, j] + c[0] * lap - b * center * center * center
    u_next[i, j] = value
    u_now[i, j] = center


@sp.kernel
def wave_block(u: G, u_prev: G, offset: int, n: int, c: sp.array(dtype=sp.float64), b: F, u_next: G, u_now: G):
    i, j = sp.tid()
    m = u.shape[1]
    center = u[i + 1, j]
    value = F(0.0)
    gi = i + offset
    if gi > 0 and j > 0 and gi < n - 1 and j < m - 1:
        lap = u[i, j] + u[i + 2, j] + u[i + 1, j - 1] + u[i + 1, j + 1] - 4.0 * center
        value = 2.0 * center - u_prev[i, j] + c[0] * lap - b * center * center * center
    u_next[i, j] = value
    u_now[i, j] = center


@sp.kernel
def wave_grid(u: G, u_prev: G, row: int, col: int, n: int, m: int, c: sp.array(dtype=sp.float64), b: F,
              u_next: G, u_now: G):
    """wave_block on a block split along both axes: element (i, j) is (i + 1, j + 1) of the exchanged
    buffer, and (row, col) is the block's global first element."""
    i, j = sp.tid()
    center = u[i + 1, j + 1]
    value = F(0.0)
    gi = i + row
    gj = j + col
    if gi > 0 and gj > 0 and gi < n - 1 and gj < m - 1:
        lap = u[i, j + 1] + u[i + 2, j + 1] + u[i + 1, j] + u[i + 1, j + 2] - 4.0 * center
        value = 2.0 * center - u_prev[i, j] + c[0] * lap - b * center * center * center
    u_next[i, j] = value
    u_now[i, j] = center


@sp.kernel
def misfit(u: G, observed: G, out: sp.array(dtype=sp.float64)):
    i, j = sp.tid()
    d = u[i, j] - observed[i, j]
    sp.atomic_add(out, 0, 0.5 * d * d)


def initial_global():
    y, x = np.mgrid[0:N, 0:M]
    u0 = np.exp(-((x - 4.0) ** 2 + (y - 5.0) ** 2) / 4.0)
    u0[[0, -1], :] = 0
    u0[:, [0, -1]] = 0
    return {"u": u0, "u_prev": 0.9 * u0}


def observed_global():
    y, x = np.mgrid[0:N, 0:M]
    return np.sin(0.7 * x + 0.3 * y) * 0.2


def serial_model():
    model = sp.Model()
    model.state("u", (N, M), F)
    model.state("u_prev", (N, M), F)
    model.param("c", sp.array([0.25], dtype=F))

    @model.step
    def step(s):
        sp.launch(wave_full, (N, M), inputs=[s.prev.u, s.prev.u_prev, s.params.c, B],
                  outputs=[s.next.u, s.next.u_prev])
    return model


def misfit_loss(observed, shape):
    def loss(state):
        out = sp.zeros(1, dtype=F, requires_grad=True, device=state.u.device)
        sp.launch(misfit, shape, inputs=[state.u, observed], outputs=[out])
        return out
    return loss


def distributed_model(fail_on_rank=None, fail_at=5, kill=False, grid=None, overlap=False, device="cpu"):
    """The wave on a grid of ranks: split along rows (grid None) with wave_block, or along both
    axes of `grid` (e.g. (2, 2) or (1, 2)) with wave_grid. `overlap`: spelled with dist.launch and
    dist.halo, so the rows away from the faces run while the halos travel."""
    from stepper.distributed import Distributed
    model = sp.Model(device)
    dist = Distributed(model, grid=grid)
    dist.state("u", (N, M), F, halo=1)
    dist.state("u_prev", (N, M), F)
    model.param("c", sp.array([0.25], dtype=F, device=device))
    shape, offset = dist.local_shape("u"), dist.offset("u")

    @model.step
    def step(s):
        if dist.rank == fail_on_rank and s.n == fail_at:
            if kill:                                  # no Python left to say anything: as if the node died
                os.kill(os.getpid(), signal.SIGKILL)
            raise ValueError(f"rank {dist.rank} cannot go on at step {s.n}")
        u, launch = (dist.halo(s, "u"), dist.launch) if overlap else (dist.exchange(s, "u"), sp.launch)
        if grid is None:
            launch(wave_block, shape, inputs=[u, s.prev.u_prev, offset, N, s.params.c, B],
                   outputs=[s.next.u, s.next.u_prev])
        else:
            launch(wave_grid, shape, inputs=[u, s.prev.u_prev, offset, dist.offset("u", axis=1), N, M,
                                                s.params.c, B], outputs=[s.next.u, s.next.u_prev])
    return model, dist


def check_exchange_adjoint(dist, rng):
    """<w, E d> == <E^T w, d> over all ranks, and central differences of <w, E x> along d."""
    part = dist.parts["u"]
    halo_shape = dist.halo_shape("u")
    x = sp.array(rng.standard_normal(part.local_shape), dtype=F, requires_grad=True)
    out = sp.zeros(halo_shape, dtype=F, requires_grad=True)
    w = rng.standard_normal(halo_shape)
    d = rng.standard_normal(part.local_shape)
    tape = sp.Tape()
    with tape:
        dist.exchange_into("u", x, out)
    tape.backward(grads={out: w})
    adjoint_side = dist.sum(float(np.vdot(x.grad.numpy(), d)))

    def objective(values):
        y = sp.zeros(halo_shape, dtype=F)
        dist.exchange_into("u", sp.array(values, dtype=F), y)
        return dist.sum(float(np.vdot(w, y.numpy())))
    eps = 1e-3
    base = x.numpy().copy()
    fd = (objective(base + eps * d) - objective(base - eps * d)) / (2 * eps)
    dir_out = sp.zeros(halo_shape, dtype=F)
    dist.exchange_into("u", sp.array(d, dtype=F), dir_out)
    forward_side = dist.sum(float(np.vdot(w, dir_out.numpy())))
    return adjoint_side, forward_side, fd


def tape_recorded(dist, model, initial, observed, saved):
    """The gradient of the same loss through a rollout recorded on a user's Tape, summed over ranks
    with dist.allreduce (the loss) and dist.sum_grads (the replicated parameter)."""
    start = {name: sp.array(v.numpy(), dtype=F, requires_grad=True) for name, v in initial.items()}
    c = model.params["c"]
    c.grad.zero_()                  # gradients add up, as on any Tape; dist.gradient left its own there
    tape = sp.Tape()
    with tape:
        final = dist.rollout(start, STEPS, schedule=sp.Revolve(STEPS, 3))
        total = dist.allreduce(misfit_loss(observed, dist.local_shape("u"))(final))
    tape.backward(grads={total: 1.0})
    dist.sum_grads(c)
    saved["tape_loss"] = total.numpy().copy()
    saved["tape_u"] = dist.gather(start["u"].grad)
    saved["tape_u_prev"] = dist.gather(start["u_prev"].grad)
    saved["tape_c"] = c.grad.numpy().copy()


def exchanged_halos_match_the_global_array(dist):
    """Every element of an exchanged buffer, corners included, is the global array's element there
    (zero beyond the global edges), on every rank."""
    part = dist.parts["u"]
    h, split = part.halo, len(part.extents)
    values = np.arange(N * M, dtype=float).reshape(N, M) + 1.0
    padded = np.pad(values, [(h, h)] * split + [(0, 0)] * (values.ndim - split))
    expected = padded[tuple(slice(o, o + e + 2 * h) for o, e in zip(part.offsets, part.extents))]
    out = sp.zeros(dist.halo_shape("u"), dtype=F)
    dist.exchange_into("u", sp.array(values[part.block], dtype=F), out)
    return all(dist.comm.allgather(bool(np.array_equal(out.numpy(), expected))))


def run(outdir, grid=None):
    model, dist = distributed_model(grid=grid)
    initial = dist.scatter(initial_global())
    observed = dist.scatter({"u": observed_global()})["u"]
    loss = misfit_loss(observed, dist.local_shape("u"))
    final = dist.rollout(initial, STEPS)
    saved = {"rollout_u": dist.gather(final.u), "rollout_u_prev": dist.gather(final.u_prev)}
    schedules = {"storeall": lambda: sp.StoreAll(STEPS), "revolve": lambda: sp.Revolve(STEPS, 3),
                 # costs given: measured ones decide on a loaded machine's timings whether disk pays
                 "multilevel": lambda: sp.MultiLevel(STEPS, 1, 3, write_cost=0.5, read_cost=0.5)}
    for key, schedule in schedules.items():
        storage = os.path.join(outdir, "run.h5") if key == "multilevel" else None
        result = dist.gradient(initial, STEPS, loss=loss, schedule=schedule(), storage=storage)
        saved[f"{key}_loss"] = np.array(result.loss)
        saved[f"{key}_u"] = dist.gather(result.grads["u"])
        saved[f"{key}_u_prev"] = dist.gather(result.grads["u_prev"])
        saved[f"{key}_c"] = result.grads["c"].numpy()
        saved[f"{key}_disk_writes"] = np.array(dist.sum(result.stats.snapshots_written(sp.StorageType.DISK)))
        # every rank holds the same global values: compare with rank 0's, bit for bit
        same = dist.comm.allgather((result.loss, result.grads["c"].numpy().tobytes()))
        saved[f"{key}_ranks_agree"] = np.array(all(s == same[0] for s in same))
    tape_recorded(dist, model, initial, observed, saved)
    overlapped(grid, initial, loss, saved)
    saved["halos_match"] = np.array(exchanged_halos_match_the_global_array(dist))
    saved["exchange"] = np.array(check_exchange_adjoint(dist, np.random.default_rng(dist.rank)))
    # Only the last rank's predicate ever holds, after its 7th step: every rank must stop there.
    calls = []
    stop = lambda state: dist.rank == dist.size - 1 and len(calls.append(1) or calls) >= 7
    saved["until_steps"] = np.array(dist.comm.allgather(dist.rollout(initial, STEPS, until=stop).steps))
    calls.clear()
    online = dist.gradient(initial, None, loss=loss, schedule=sp.Online(3), until=stop)
    saved["online_steps"] = np.array(dist.comm.allgather(online.stats.steps))
    saved["online_u"] = dist.gather(online.grads["u"])
    ensemble(saved)
    if dist.rank == 0:
        np.savez(os.path.join(outdir, "result.npz"), **saved)


def overlapped(grid, initial, loss, saved):
    """The rollout and two gradients again, with the exchange overlapping the launch."""
    model, dist = distributed_model(grid=grid, overlap=True)
    final = dist.rollout(initial, STEPS)
    saved["overlap_rollout_u"] = dist.gather(final.u)
    saved["overlap_rollout_u_prev"] = dist.gather(final.u_prev)
    for key, schedule in {"storeall": sp.StoreAll(STEPS), "revolve": sp.Revolve(STEPS, 3)}.items():
        result = dist.gradient(initial, STEPS, loss=loss, schedule=schedule)
        saved[f"overlap_{key}_loss"] = np.array(result.loss)
        for name in ("u", "u_prev"):
            saved[f"overlap_{key}_{name}"] = dist.gather(result.grads[name])
        saved[f"overlap_{key}_c"] = result.grads["c"].numpy()
    saved["overlapped"] = np.array(dist.comm.allgather((dist.overlapped, dist.exchanges)))


MEMBERS = 5


def member(k, own_c=False):
    """Member k of the ensemble: the wave from a scaled bump against shifted observations, with its
    own wave speed c when `own_c`."""
    from stepper.distributed import Member
    initial = {name: sp.array((1.0 + 0.1 * k) * v, dtype=F) for name, v in initial_global().items()}
    observed = sp.array(np.roll(observed_global(), k, axis=1), dtype=F)
    params = {"c": np.array([0.25 + 0.01 * k])} if own_c else {}
    return Member(initial, misfit_loss(observed, (N, M)), params)


def ensemble(saved):
    from stepper.distributed import Ensemble
    ens = Ensemble(serial_model())
    shared = ens.gradient(MEMBERS, member, STEPS, schedule=lambda steps: sp.Revolve(steps, 3))
    own = ens.gradient(MEMBERS, lambda k: member(k, own_c=True), STEPS)
    saved["ensemble_loss"] = np.array(shared.loss)
    saved["ensemble_losses"] = np.array(shared.losses)
    saved["ensemble_c"] = shared.grads["c"].numpy()
    saved["ensemble_own_has_shared_c"] = np.array("c" in own.grads)
    grads = {k: r.grads["c"].numpy() for k, r in own.members.items()}
    grads_u = {k: r.grads["u"].numpy() for k, r in shared.members.items()}
    for k, g in ((k, g) for part in ens.comm.allgather(grads) for k, g in part.items()):
        saved[f"ensemble_own_c_{k}"] = g
    for k, g in ((k, g) for part in ens.comm.allgather(grads_u) for k, g in part.items()):
        saved[f"ensemble_u_{k}"] = g
    saved["ensemble_members_per_rank"] = np.array(ens.comm.allgather(len(shared.members)))


def on_gpu(outdir, grid=None):
    """The rollout and a Revolve gradient with the blocks on a GPU (the CUDA simulator in CI): split
    by rows, only face and halo rows cross through the host; over a grid, whole host copies."""
    saved = {}
    for device in ("cuda", "cpu"):                   # the same run on the CPU: the bits to match
        model, dist = distributed_model(overlap=True, device=device, grid=grid)
        initial = dist.scatter(initial_global())
        observed = dist.scatter({"u": observed_global()})["u"]
        final = dist.rollout(initial, STEPS)
        result = dist.gradient(initial, STEPS, loss=misfit_loss(observed, dist.local_shape("u")),
                               schedule=sp.Revolve(STEPS, 3))
        saved.update({f"{device}_rollout_u": dist.gather(final.u), f"{device}_loss": np.array(result.loss),
                      f"{device}_device": np.array(final.u.device), f"{device}_overlapped": np.array(dist.overlapped),
                      f"{device}_grad_c": result.grads["c"].numpy()})
        for name in ("u", "u_prev"):
            saved[f"{device}_grad_{name}"] = dist.gather(result.grads[name])
    if dist.rank == 0:
        np.savez(os.path.join(outdir, "gpu.npz"), **saved)


def raise_on_rank_1(kill=False):
    model, dist = distributed_model(fail_on_rank=1, kill=kill)
    initial = dist.scatter(initial_global())
    observed = dist.scatter({"u": observed_global()})["u"]
    dist.gradient(initial, STEPS, loss=misfit_loss(observed, dist.local_shape("u")), schedule=sp.Revolve(STEPS, 3))


def bad_declarations(outdir):
    """Mistakes every rank makes, or one rank makes: each a ModelError on the ranks concerned."""
    from stepper.distributed import Distributed
    messages = []
    dist = Distributed(sp.Model())
    try:
        dist.state("u", (N, M), F, halo=4)          # thinnest block: 3 rows on 4 ranks
    except sp.ModelError as exc:
        messages.append(str(exc))
    model = sp.Model()
    dist = Distributed(model)
    dist.state("u", (N + (dist.rank == 1), M), F, halo=1)     # rank 1 thinks the grid is taller

    @model.step
    def step(s):                                  # never runs: the check before the run refuses
        sp.copy(s.next.u, s.prev.u)
    try:
        dist.rollout(dist.scatter({"u": np.zeros((N + (dist.rank == 1), M))}), 2)
    except sp.ModelError as exc:
        messages.append(str(exc))
    try:
        Distributed(sp.Model(), grid=(3, 2))       # 6 ranks' worth of grid on 4
    except sp.ModelError as exc:
        messages.append(str(exc))
    grid = Distributed(sp.Model(), grid=(2, 2))
    try:
        grid.state("v", (N,), F)                    # one axis cannot be split over a 2-D grid
    except sp.ModelError as exc:
        messages.append(str(exc))
    try:
        dist.sum_grads(sp.zeros(3, dtype=F))        # no gradient to sum
    except sp.ModelError as exc:
        messages.append(str(exc))
    everyone = dist.comm.allgather(messages)
    if dist.rank == 0:
        np.save(os.path.join(outdir, "errors.npy"), np.array(everyone, dtype=object), allow_pickle=True)


def checkpoint_then_raise(outdir, kill=False):
    """A rollout writing per-rank checkpoints every 4 steps; rank 1 raises (or is killed) at step 10."""
    model, dist = distributed_model(fail_on_rank=1, fail_at=10, kill=kill)
    dist.rollout(dist.scatter(initial_global()), STEPS, checkpoint=os.path.join(outdir, "run.ckpt"), checkpoint_every=4)


def priced_apart(outdir):
    """A MultiLevel without costs, priced on each rank's own disk: rank 1's looks 100x slower. The
    ranks must still plan one schedule (or their halo exchanges never meet)."""
    model, dist = distributed_model()
    if dist.rank == 1:
        real = sp.HDF5Storage.measure_costs
        sp.HDF5Storage.measure_costs = lambda self, *a, **k: tuple(100 * x for x in real(self, *a, **k))
    initial = dist.scatter(initial_global())
    observed = dist.scatter({"u": observed_global()})["u"]
    result = dist.gradient(initial, STEPS, loss=misfit_loss(observed, dist.local_shape("u")),
                           schedule=sp.MultiLevel(STEPS, 1, 3), storage=os.path.join(outdir, "priced.h5"))
    counts = dist.comm.allgather((result.stats.forward_steps, result.stats.snapshots_written(sp.StorageType.DISK)))
    if dist.rank == 0:
        np.save(os.path.join(outdir, "priced.npy"), np.array(counts))


def resume(outdir):
    """Resume checkpoint_then_raise's run: to the end on its own rank count, a ModelError on another."""
    model, dist = distributed_model()
    try:
        final = dist.resume(os.path.join(outdir, "run.ckpt"))
    except sp.ModelError as exc:
        messages = dist.comm.allgather(str(exc))
        if dist.rank == 0:
            np.save(os.path.join(outdir, f"resume_error{dist.size}.npy"), np.array(messages, dtype=object),
                    allow_pickle=True)
        return
    saved = {"u": dist.gather(final.u), "u_prev": dist.gather(final.u_prev),
             "steps": np.array(dist.comm.allgather((final.steps, final.stats.steps)))}
    if dist.rank == 0:
        np.savez(os.path.join(outdir, "resumed.npz"), **saved)


if __name__ == "__main__":
    mode, out = sys.argv[1], sys.argv[2]
    if mode == "run":               # an optional third argument: the grid, e.g. 2x2
        run(out, tuple(int(k) for k in sys.argv[3].split("x")) if len(sys.argv) > 3 else None)
    elif mode in ("raise", "kill"):
        raise_on_rank_1(kill=mode == "kill")
    elif mode == "errors":
        bad_declarations(out)
    elif mode in ("checkpoint", "checkpoint-kill"):
        checkpoint_then_raise(out, kill=mode == "checkpoint-kill")
    elif mode == "resume":
        resume(out)
    elif mode == "gpu":
        on_gpu(out, tuple(int(k) for k in sys.argv[3].split("x")) if len(sys.argv) > 3 else None)
    elif mode == "priced":
        priced_apart(out)
    else:
        raise SystemExit(f"unknown mode {mode!r}")
