"""A small network learns the missing reaction term of a 1-D reaction-diffusion model from its state
after 2,000 steps, trained with optax through a checkpointed (Revolve) gradient.

    u_next = u + r (u[i-1] - 2 u[i] + u[i+1]) + dt F(u),   u = 0 outside the domain

The truth has F(u) = 2 u (1 - u) (Fisher-KPP); the model we train knows the diffusion and has a
network N_theta(u) (1 -> 16 -> 16 -> 1, tanh, 321 weights) in place of F, applied to every cell by
JAX inside the step (`stepper.jax.call`). We observe only the final states of four initial profiles.
`stepper.jax.function` turns the model into a JAX function of the weights whose `jax.grad` is our
reverse sweep, so optax's Adam trains the network as it would any JAX model. Recomputations call the
network again; reversals take its `jax.vjp`.

Memory: the same model written in pure JAX (`lax.scan` over the steps, `jax.grad`) stores the
network's activations at every step; we keep Revolve's snapshots of the state. The example prints
both (JAX's: the residuals its VJP closure holds; ours: `GradientStats.peak_memory_bytes`, plus the
residuals of one step's network VJP, which live only while that step reverses) and checks that the
two gradients agree.

Run: python examples/learned_forcing.py [--steps 2000] [--iterations 80] [--png loss.png]
(needs jax and optax: pip install jax optax; matplotlib for the plot)
"""
import argparse
import time

import numpy as np

import stepper as sp

G = sp.array(dtype=sp.float64, ndim=2)
F64 = sp.array(dtype=sp.float64)
SIZES = (1, 16, 16, 1)


@sp.kernel
def diffuse_and_force(u: G, f: G, r: sp.float64, dt: sp.float64, u_next: G):
    k, i = sp.tid()
    n = u.shape[1]
    left = sp.float64(0.0)
    right = sp.float64(0.0)
    if i > 0:
        left = u[k, i - 1]
    if i < n - 1:
        right = u[k, i + 1]
    u_next[k, i] = u[k, i] + r * (left - 2.0 * u[k, i] + right) + dt * f[k, i]


@sp.kernel
def misfit(u: G, observed: G, out: F64):
    k, i = sp.tid()
    d = u[k, i] - observed[k, i]
    sp.atomic_add(out, 0, 0.5 * d * d)


def network(jnp):
    """N(u, *weights) applied to every cell, and the names of its weights (w0, b0, w1, b1, ...)."""
    names = [f"{kind}{layer}" for layer in range(len(SIZES) - 1) for kind in ("w", "b")]

    def net(u, *weights):
        h = u[..., None]
        for layer in range(len(SIZES) - 1):
            h = h @ weights[2 * layer] + weights[2 * layer + 1]
            if layer < len(SIZES) - 2:
                h = jnp.tanh(h)
        return h[..., 0]
    return net, names


def initial_weights(names, seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for layer, (m, n) in enumerate(zip(SIZES, SIZES[1:])):
        out[f"w{layer}"] = rng.standard_normal((m, n)) / np.sqrt(m) * (0.1 if layer == len(SIZES) - 2 else 1.0)
        out[f"b{layer}"] = np.zeros(n)
    return {name: out[name] for name in names}


def profiles(cells):
    """Four initial profiles whose values, while they react and diffuse, cover most of [0, 1]."""
    x = np.linspace(0.0, 1.0, cells)
    bumps = [(0.3, 0.15, 0.95), (0.55, 0.25, 0.6), (0.7, 0.12, 0.35), (0.45, 0.3, 0.15)]
    return np.stack([a * np.exp(-((x - c) / w) ** 2) for c, w, a in bumps])


def build(cells, forcing, weights, kappa=0.05, dt=1e-3):
    """The model with `forcing(u, *weights) -> F` (a JAX function) inside the step."""
    r = kappa * dt * (cells - 1) ** 2          # 0.2 for 64 cells: stable
    shape = (len(profiles(cells)), cells)
    model = sp.Model(dt=dt, name="learned forcing")
    model.state("u", shape, sp.float64)
    for name, value in weights.items():
        model.param(name, sp.array(value, dtype=sp.float64))

    @model.step
    def step(s):
        f = s.scratch("forcing", shape, sp.float64)
        sp.jax.call(forcing, inputs=[s.prev.u, *(s.params[n] for n in weights)], outputs=[f])
        sp.launch(diffuse_and_force, shape, inputs=[s.prev.u, f, r, s.dt], outputs=[s.next.u])
    return model, r, dt


def pure_jax_loss(jax, jnp, net, names, u0, observed, steps, r, dt):
    """The same rollout and misfit in plain JAX: lax.scan stores every step for jax.grad."""
    def loss(weights):
        ws = [weights[n] for n in names]

        def one(u, _):
            padded = jnp.pad(u, ((0, 0), (1, 1)))
            return u + r * (padded[:, :-2] - 2.0 * u + padded[:, 2:]) + dt * net(u, *ws), None
        final, _ = jax.lax.scan(one, u0, None, length=steps)
        return 0.5 * jnp.sum((final - observed) ** 2)
    return loss


def main(cells=64, steps=2000, iterations=80, snapshots=20, lr=1e-2, png=None, verbose=True):
    import jax
    import jax.numpy as jnp
    import optax
    import stepper.jax  # noqa: F401   (sp.jax)
    jax.config.update("jax_enable_x64", True)
    say = print if verbose else (lambda *a, **k: None)

    net, names = network(jnp)
    u0 = profiles(cells)
    truth, _, _ = build(cells, lambda u: 2.0 * u * (1.0 - u), {})
    observed_np = truth.rollout({"u": sp.array(u0, dtype=sp.float64)}, steps).u.numpy().copy()
    observed = sp.array(observed_np, dtype=sp.float64)

    def loss(state):
        out = sp.zeros(1, dtype=sp.float64)
        sp.launch(misfit, state.u.shape, inputs=[state.u, observed], outputs=[out])
        return out

    weights = {n: jnp.asarray(v) for n, v in initial_weights(names).items()}
    model, r, dt = build(cells, net, {n: np.asarray(v) for n, v in weights.items()})
    f = sp.jax.function(model, steps, inputs=names, loss=loss, initial={"u": sp.array(u0, dtype=sp.float64)},
                        schedule=lambda n: sp.Revolve(n, snapshots))
    value_and_grad = jax.value_and_grad(lambda w: f(**w))
    optimiser = optax.adam(lr)
    state = optimiser.init(weights)
    losses = []
    started = time.perf_counter()
    for it in range(iterations):
        value, grads = value_and_grad(weights)
        updates, state = optimiser.update(grads, state)
        weights = optax.apply_updates(weights, updates)
        losses.append(float(value))
        if it % max(1, iterations // 10) == 0 or it == iterations - 1:
            say(f"iteration {it:4d}  misfit {losses[-1]:.4e}")
    seconds = (time.perf_counter() - started) / iterations
    say(f"{seconds:.2f} s per gradient of {steps} steps (Revolve, {snapshots} snapshots)")

    # what the network learned, against the reaction term it replaces, over the values the
    # observed final states take (the data says nothing about F elsewhere)
    lo, hi = np.quantile(observed_np, [0.05, 0.95])
    grid = np.linspace(lo, hi, 41)
    truth_f = 2.0 * grid * (1.0 - grid)

    def error_of(ws):
        return float(np.max(np.abs(np.asarray(net(jnp.asarray(grid), *ws)) - truth_f)))
    error = error_of([weights[n] for n in names])
    untrained = error_of([jnp.asarray(v) for v in initial_weights(names).values()])
    say(f"max |N(u) - 2u(1-u)| for u in [{lo:.2f}, {hi:.2f}] (the final states' range): {error:.3f} "
        f"(untrained: {untrained:.3f})")

    # memory, and the gradient against pure JAX's at the trained weights
    for n in names:
        model.params[n].assign(np.asarray(weights[n]))
    ours = model.gradient({"u": sp.array(u0, dtype=sp.float64)}, steps, loss=loss,
                          schedule=sp.Revolve(steps, snapshots))
    reference = pure_jax_loss(jax, jnp, net, names, jnp.asarray(u0), jnp.asarray(observed_np), steps, r, dt)
    _, pull = jax.vjp(reference, weights)
    jax_bytes = sum(leaf.nbytes for leaf in jax.tree_util.tree_leaves(pull))
    jax_grads = pull(1.0)[0]
    _, one_step = jax.vjp(lambda u, *w: net(u, *w), jnp.asarray(u0), *(weights[n] for n in names))
    step_bytes = sum(leaf.nbytes for leaf in jax.tree_util.tree_leaves(one_step))
    agreement = max(float(np.max(np.abs(ours.grads[n].numpy() - np.asarray(jax_grads[n]))) /
                          max(float(np.max(np.abs(np.asarray(jax_grads[n])))), 1e-300)) for n in names)
    ours_bytes = ours.stats.peak_memory_bytes + step_bytes
    say(f"peak memory of one gradient: pure JAX (scan, every step stored) {jax_bytes / 2**20:.1f} MiB, "
        f"stepper (Revolve {snapshots}) {ours_bytes / 2**20:.3f} MiB: {jax_bytes / ours_bytes:.0f}x less")
    say(f"our gradient against pure JAX's: largest relative difference {agreement:.1e}")

    if png:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            say("(matplotlib is not installed: no plot)")
        else:
            fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
            a.semilogy(losses)
            a.set(xlabel="Adam iteration", ylabel="misfit of the final states", title=f"{steps} steps, Revolve")
            b.plot(grid, truth_f, "k--", label="true F(u) = 2u(1-u)")
            b.plot(grid, np.asarray(net(jnp.asarray(grid), *(weights[n] for n in names))), label="learned N(u)")
            b.set(xlabel="u", title="the reaction term")
            b.legend()
            fig.tight_layout()
            fig.savefig(png, dpi=120)
            say(f"wrote {png}")
    return losses, error, jax_bytes, ours_bytes, agreement


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=64)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--iterations", type=int, default=80)
    parser.add_argument("--snapshots", type=int, default=20)
    parser.add_argument("--png", default="learned_forcing.png")
    args = parser.parse_args()
    main(args.cells, args.steps, args.iterations, args.snapshots, png=args.png)
