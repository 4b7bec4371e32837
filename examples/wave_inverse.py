"""Recover an initial displacement from final observations of a nonlinear 2-D wave, 10,000 steps.

    u_next = 2 u - u_prev + C lap(u) - b u^3        (C = 0.25, b = 1e-3, zero boundary)

A hidden initial bump ("truth") is propagated for 10,000 steps; we observe the last two frames and run
conjugate gradients on the initial displacement from a zero guess. Each gradient reverses the 10,000
steps with a two-level schedule: a few snapshots in RAM, the rest spilled to an HDF5 file, with
the stored states a few MiB instead of the 176 MiB (at 48 x 48) that storing every
step would take. The cubic term makes the adjoint depend on the forward states, so the
checkpointing is really exercised. Writes wave_inverse.png (truth, recovered, error).

Run: python examples/wave_inverse.py [--size 40] [--steps 10000] [--iterations 8]
"""
import argparse
import os
import tempfile
import time

import numpy as np

import stepper as sp

G = sp.array(dtype=float, ndim=2)


@sp.kernel
def wave_step(u: G, u_prev: G, c: float, b: float, u_next: G, u_now: G):
    i, j = sp.tid()
    n = u.shape[0]
    m = u.shape[1]
    center = u[i, j]
    value = float(0.0)
    if i > 0 and j > 0 and i < n - 1 and j < m - 1:
        lap = u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1] - 4.0 * center
        value = 2.0 * center - u_prev[i, j] + c * lap - b * center * center * center
    u_next[i, j] = value
    u_now[i, j] = center


@sp.kernel
def misfit(u: G, observed: G, out: sp.array(dtype=float)):
    i, j = sp.tid()
    d = u[i, j] - observed[i, j]
    sp.atomic_add(out, 0, 0.5 * d * d)


def build(size):
    model = sp.Model()
    model.state("u", (size, size), float)
    model.state("u_prev", (size, size), float)

    @model.step
    def step(s):
        sp.launch(wave_step, (size, size), inputs=[s.prev.u, s.prev.u_prev, 0.25, 1e-3],
                  outputs=[s.next.u, s.next.u_prev])
    return model


def bump(size, cx, cy, width, height=1.0):
    y, x = np.mgrid[0:size, 0:size] / (size - 1)
    field = height * np.exp(-((x - cx) ** 2 + (y - cy) ** 2) / (2 * width ** 2))
    field[[0, -1], :] = 0
    field[:, [0, -1]] = 0
    return field.astype(np.float32)


def initial(u0):
    return {"u": sp.array(u0), "u_prev": sp.array(u0)}      # zero initial velocity


def main(size=40, steps=10_000, iterations=8, ram=16, disk=48, png="wave_inverse.png", seed=0):
    model = build(size)
    truth = bump(size, 0.35, 0.6, 0.08) + 0.6 * bump(size, 0.7, 0.3, 0.05)
    final = model.rollout(initial(truth), steps)
    # The last two frames: together they fix the wave's state (displacement and velocity).
    observed = [sp.array(final.u.numpy()), sp.array(final.u_prev.numpy())]
    # A disk snapshot costs about as much as 10 steps here (HDF5 with checksums), so the schedule
    # trades disk traffic against recomputation with those costs.
    schedule = lambda: sp.MultiLevel(steps, snapshots_in_ram=ram, snapshots_on_disk=disk, write_cost=10, read_cost=5)

    def loss(state):
        out = sp.zeros(1, requires_grad=True)
        sp.launch(misfit, (size, size), inputs=[state.u, observed[0]], outputs=[out])
        sp.launch(misfit, (size, size), inputs=[state.u_prev, observed[1]], outputs=[out])
        return out

    state_mib = 2 * size * size * 4 / 2**20
    print(f"{size}x{size} nonlinear wave, {steps} steps; two-level schedule with {ram} RAM + {disk} disk snapshots "
          f"(store-all would hold {steps * state_mib:.0f} MiB of states)")
    losses = []
    with tempfile.TemporaryDirectory() as tmp:
        def gradient(u0):
            result = model.gradient(initial(u0), steps, loss=loss, schedule=schedule(),
                                    storage=os.path.join(tmp, "snapshots.h5"), deterministic=False)
            # u and u_prev both start from the guess, so its gradient is the sum of theirs.
            return result, result.grads["u"].numpy() + result.grads["u_prev"].numpy()

        # Conjugate gradients with an exact step: the misfit is nearly quadratic (b is small), so the
        # Hessian times a direction p is the change of the gradient along p (one more gradient).
        guess = np.zeros((size, size), np.float32)
        direction, previous = None, None
        for it in range(iterations):
            start = time.perf_counter()
            result, grad = gradient(guess)
            if direction is None:
                direction = -grad
            else:
                beta = max(0.0, float(np.vdot(grad, grad - previous) / np.vdot(previous, previous)))
                direction = -grad + beta * direction
            _, grad_along = gradient(guess + direction)
            curvature = float(np.vdot(direction, grad_along - grad))
            guess = guess - float(np.vdot(grad, direction)) / curvature * direction
            previous = grad
            losses.append(result.loss)
            st = result.stats
            print(f"iteration {it}: loss {result.loss:.6f}   {time.perf_counter() - start:.1f} s for two gradients, "
                  f"{st.forward_steps} forward steps each, peak memory {st.peak_memory_bytes / 2**20:.1f} MiB, "
                  f"{st.snapshots_written(sp.StorageType.DISK)} snapshots to disk")
    error = np.linalg.norm(guess - truth) / np.linalg.norm(truth)
    print(f"relative error of the recovered initial displacement: {error:.3f}")
    if png:
        save_png(png, truth, guess)
    return losses, error


def save_png(path, truth, recovered):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: skipping the picture (pip install matplotlib)")
        return
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.4))
    for ax, (title, field) in zip(axes, [("truth", truth), ("recovered", recovered),
                                         ("error", recovered - truth)]):
        im = ax.imshow(field, cmap="RdBu_r", vmin=-1, vmax=1)
        ax.set_title(title)
        ax.axis("off")
    fig.colorbar(im, ax=axes, shrink=0.8)
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=40)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--iterations", type=int, default=8)
    args = parser.parse_args()
    main(args.size, args.steps, args.iterations)
