"""Main demo: aim 64 projectiles so that they land on a target shape 3,000 steps later.

Each projectile flies under gravity and quadratic air drag (nonlinear, so the reverse sweep needs
the forward states). We optimise the initial velocities with Newton-scaled gradient descent. Every gradient reverses the
3,000 steps with binomial checkpointing (Revolve, 24 snapshots): the run prints the loss falling
and the memory the gradient held against what storing every step would take, and writes demo.png
(trajectories and targets).

Run: python examples/demo.py [--iterations 30] [--steps 3000]
"""
import argparse
import time

import numpy as np

import stepper as sp

V2 = sp.array(dtype=sp.vec2)


@sp.kernel
def fly(x: V2, v: V2, drag: float, dt: float, x_next: V2, v_next: V2):
    i = sp.tid()
    speed = sp.length(v[i])
    a = sp.vec2(0.0, -9.81) - drag * speed * v[i]
    vn = v[i] + dt * a
    v_next[i] = vn
    x_next[i] = x[i] + dt * vn


@sp.kernel
def distance_to_target(x: V2, target: V2, out: sp.array(dtype=float)):
    i = sp.tid()
    d = x[i] - target[i]
    sp.atomic_add(out, 0, sp.dot(d, d))


def targets(n):
    """A smiling face: an outline circle, two eyes and a mouth, centred 30 m away."""
    t = np.linspace(0, 2 * np.pi, n // 2, endpoint=False)
    face = np.stack([np.cos(t), np.sin(t)], 1) * 6
    eyes = np.array([[-2.2, 2.0], [2.2, 2.0]])
    eyes = np.repeat(eyes, 4, 0) + 0.3 * np.stack([np.cos(t[:8] * 4), np.sin(t[:8] * 4)], 1)
    m = n - len(face) - len(eyes)
    s = np.linspace(-0.8, 0.8, m) * np.pi / 2
    mouth = np.stack([3.5 * np.sin(s), -1.5 - 2 * np.cos(s)], 1)
    return (np.concatenate([face, eyes, mouth]) + [30.0, 8.0]).astype(np.float32)


def build(n, dt, drag, device="cpu"):
    model = sp.Model(dt=dt, device=device)
    model.state("x", n, sp.vec2)
    model.state("v", n, sp.vec2)

    @model.step
    def step(s):
        sp.launch(fly, n, inputs=[s.prev.x, s.prev.v, drag, s.dt], outputs=[s.next.x, s.next.v])
    return model


def main(iterations=30, steps=3000, n=64, snapshots=24, dt=1e-3, drag=0.02, png="demo.png", device="cpu"):
    model = build(n, dt, drag, device)
    goal = targets(n)
    target = sp.array(goal, dtype=sp.vec2, device=device)
    x0 = np.zeros((n, 2), np.float32)
    velocity = np.tile(np.array([[10.0, 10.0]], np.float32), (n, 1))     # everyone aims the same at first

    def loss(state):
        out = sp.zeros(1, requires_grad=True, device=device)
        sp.launch(distance_to_target, n, inputs=[state.x, target], outputs=[out])
        return out

    store_all = steps * model.state_bytes
    print(f"{n} projectiles, {steps} steps of {dt} s, Revolve with {snapshots} snapshots")
    flight = steps * dt
    history = []
    for it in range(iterations):
        start = time.perf_counter()
        initial = {"x": sp.array(x0, dtype=sp.vec2, device=device), "v": sp.array(velocity, dtype=sp.vec2, device=device)}
        result = model.gradient(initial, steps, loss=loss, schedule=sp.Revolve(steps, snapshots),
                                deterministic=False)
        g = result.grads["v"].numpy()
        # Without drag, x_T = v T + const, so the loss's curvature in v is 2 T^2: dividing the
        # gradient by it is a Newton step for the drag-free problem, and drag only slows it a bit.
        velocity = velocity - g / (2 * flight ** 2)
        history.append(result.loss)
        if it % 5 == 0 or it == iterations - 1:
            st = result.stats
            print(f"iteration {it:3d}: loss {result.loss:10.3f}  ({time.perf_counter() - start:.2f} s, "
                  f"{st.forward_steps} forward steps, gradient memory {st.peak_memory_bytes / 1024:.0f} KiB "
                  f"vs {store_all / 1024:.0f} KiB to store every step)")
    mean_miss = np.sqrt(history[-1] / n)
    print(f"loss {history[0]:.1f} -> {history[-1]:.3f}; mean miss distance {mean_miss:.3f} m")
    if png:
        save_png(png, model, x0, velocity, goal, steps)
    return history


def save_png(path, model, x0, velocity, goal, steps):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: skipping the picture (pip install matplotlib)")
        return
    frames = []
    model.rollout({"x": x0, "v": velocity}, steps,
                  callback=lambda k, state: frames.append(state.x.numpy().copy()), every=30)
    paths = np.array(frames)
    fig, ax = plt.subplots(figsize=(7, 5))
    for i in range(paths.shape[1]):
        ax.plot(paths[:, i, 0], paths[:, i, 1], lw=0.5, color="tab:blue", alpha=0.5)
    ax.scatter(goal[:, 0], goal[:, 1], s=30, facecolors="none", edgecolors="tab:red", label="targets")
    ax.scatter(paths[-1, :, 0], paths[-1, :, 1], s=8, color="black", label=f"after {steps} steps")
    ax.set_aspect("equal")
    ax.legend(loc="upper left")
    ax.set_title("initial velocities optimised through a checkpointed gradient")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    print(f"wrote {path}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    args = parser.parse_args()
    main(args.iterations, args.steps, device=args.device)
