"""The 2-D wave inverse problem of wave_inverse.py on a grid split over MPI ranks.

    mpiexec -n 2 python examples/wave_mpi.py [--size 48] [--steps 2000] [--iterations 4]

Each rank owns a block of rows of the grid (plus one halo row from each neighbour, exchanged every
step) and runs the same two-level schedule: a few snapshots in RAM, the rest in an HDF5 file of its
own (snapshots.rank0000.h5, ...). The kernel is wave_inverse.py's with two changes, the pattern
for any stencil: it reads the exchanged buffer one row down (local row i is row i + 1 there), and it
decides the global boundary with its block's global offset. The loss is each rank's misfit on its
rows; `Distributed.gradient` adds them up, and the conjugate-gradient dot products are sums over
ranks too. Every rank computes the same iterates; rank 0 prints.

The conjugate-gradient step is exact for a quadratic misfit and has no line search: it needs the
misfit near quadratic along a whole step. At 48 x 48 and 2,000 steps it is (misfit 22 -> 0.33 in
four iterations, 19% error in the recovered displacement on 2 ranks); at 64 x 64 and 2,000 steps
the third step overshoots into the cubic term's reach and the run diverges. A real inversion wants
a line search (or `sp.value_and_grad` with scipy's L-BFGS-B, see diffusivity_inverse.py).
"""
import argparse
import os
import tempfile
import time

import numpy as np

import stepper as sp
from stepper.distributed import Distributed

G = sp.array(dtype=float, ndim=2)


@sp.kernel
def wave_step(u: G, u_prev: G, offset: int, n: int, c: float, b: float, u_next: G, u_now: G):
    i, j = sp.tid()                       # i: a row of this rank's block; u holds it at row i + 1
    m = u.shape[1]
    center = u[i + 1, j]
    value = float(0.0)
    gi = i + offset                       # the row's global index: the grid's edges are global
    if gi > 0 and j > 0 and gi < n - 1 and j < m - 1:
        lap = u[i, j] + u[i + 2, j] + u[i + 1, j - 1] + u[i + 1, j + 1] - 4.0 * center
        value = 2.0 * center - u_prev[i, j] + c * lap - b * center * center * center
    u_next[i, j] = value
    u_now[i, j] = center


@sp.kernel
def misfit(u: G, observed: G, out: sp.array(dtype=float)):
    i, j = sp.tid()
    d = u[i, j] - observed[i, j]
    sp.atomic_add(out, 0, 0.5 * d * d)


def build(size, overlap=True):
    model = sp.Model(zero_buffers=False)        # wave_step writes every element of s.next
    dist = Distributed(model)
    dist.state("u", (size, size), float, halo=1)
    dist.state("u_prev", (size, size), float)
    block, offset = dist.local_shape("u"), dist.offset("u")

    @model.step
    def step(s):
        if overlap:
            # s.prev.u with a neighbour's row above and below; the rows that need neither run
            # while those two rows travel
            dist.launch(wave_step, block, inputs=[dist.halo(s, "u"), s.prev.u_prev, offset, size, 0.25, 1e-3],
                        outputs=[s.next.u, s.next.u_prev])
        else:                             # the same, the exchange complete before the launch
            u = dist.exchange(s, "u")
            sp.launch(wave_step, block, inputs=[u, s.prev.u_prev, offset, size, 0.25, 1e-3],
                      outputs=[s.next.u, s.next.u_prev])
    return model, dist


def bump(size, cx, cy, width, height=1.0):
    y, x = np.mgrid[0:size, 0:size] / (size - 1)
    field = height * np.exp(-((x - cx) ** 2 + (y - cy) ** 2) / (2 * width ** 2))
    field[[0, -1], :] = 0
    field[:, [0, -1]] = 0
    return field.astype(np.float32)


def main(size=48, steps=2000, iterations=4, ram=8, disk=24, workdir=None):
    model, dist = build(size)
    say = print if dist.rank == 0 else (lambda *a, **k: None)
    truth = bump(size, 0.35, 0.6, 0.08) + 0.6 * bump(size, 0.7, 0.3, 0.05)
    start, rows = dist.offset("u"), dist.rows("u")
    block = lambda field: np.ascontiguousarray(field[start:start + rows])       # this rank's rows
    initial = lambda u0: {"u": sp.array(u0), "u_prev": sp.array(u0)}           # zero initial velocity
    final = dist.rollout(initial(block(truth)), steps)
    observed = [sp.array(final.u.numpy()), sp.array(final.u_prev.numpy())]   # this rank's rows of them
    dot = lambda a, b: dist.sum(float(np.vdot(a, b)))                          # over the whole grid

    def loss(state):
        out = sp.zeros(1, requires_grad=True)
        sp.launch(misfit, (rows, size), inputs=[state.u, observed[0]], outputs=[out])
        sp.launch(misfit, (rows, size), inputs=[state.u_prev, observed[1]], outputs=[out])
        return out

    say(f"{size}x{size} nonlinear wave on {dist.size} rank(s) ({rows} rows on rank 0), {steps} steps; "
        f"two-level schedule with {ram} RAM + {disk} disk snapshots per rank")
    losses = []
    with tempfile.TemporaryDirectory(dir=workdir) if dist.rank == 0 else _nothing() as tmp:
        tmp = dist.comm.bcast(tmp)         # one folder, one HDF5 file per rank in it
        snapshots = os.path.join(tmp, "snapshots.h5")

        def gradient(u0):
            result = dist.gradient(initial(u0), steps, loss=loss, storage=snapshots,
                                   schedule=sp.MultiLevel(steps, ram, disk, write_cost=10, read_cost=5))
            return result, result.grads["u"].numpy() + result.grads["u_prev"].numpy()

        guess = np.zeros((rows, size), np.float32)
        direction, previous = None, None
        for it in range(iterations):
            began = time.perf_counter()
            result, grad = gradient(guess)
            if direction is None:
                direction = -grad
            else:
                beta = max(0.0, dot(grad, grad - previous) / dot(previous, previous))
                direction = -grad + beta * direction
            _, grad_along = gradient(guess + direction)
            curvature = dot(direction, grad_along - grad)
            guess = (guess - dot(grad, direction) / curvature * direction).astype(np.float32)
            previous = grad
            losses.append(result.loss)
            say(f"iteration {it}: loss {result.loss:.6f}   {time.perf_counter() - began:.1f} s for two gradients, "
                f"{result.stats.forward_steps} forward steps each, "
                f"{result.stats.snapshots_written(sp.StorageType.DISK)} snapshots to disk on rank 0")
        dist.comm.Barrier()                # every rank is done with its file before rank 0 removes the folder
    error = (dot(guess - block(truth), guess - block(truth)) / dot(block(truth), block(truth))) ** 0.5
    say(f"relative error of the recovered initial displacement: {error:.3f}")
    say("losses:", " ".join(f"{v!r}" for v in losses))
    return losses, error


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=48)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--ram", type=int, default=8)
    parser.add_argument("--disk", type=int, default=24)
    args = parser.parse_args()
    main(args.size, args.steps, args.iterations, args.ram, args.disk)
