"""What crossing into JAX costs: per step of a model whose forcing a JAX network computes
(`stepper.jax.call`), and per call of a rollout made a JAX function (`stepper.jax.function`).

    python benchmarks/interop_crossing.py [--rounds 15]

Within one process, over interleaved rounds (medians and spreads), on the example's network
(examples/learned_forcing.py: 4 x 64 cells, 1 -> 16 -> 16 -> 1):
- `native step`: a forward step of the same model with a zero forcing, no JAX (the native loop);
- `net alone`: the jitted network on JAX arrays (what the step would cost inside JAX);
- `call forward`: sp.jax.call in a forward rollout step, less the same step with a zero forcing
  kernel in its place: the network plus the crossing (NumPy in, NumPy out, a Tape record);
- `reverse step`: one recorded step's reversal (StoreAll), the network's jax.vjp and the kernel's adjoint;
- `function`: jax.jit(f) of a 1-step rollout, less Model.evaluate of the same: the pure_callback.
"""
import argparse
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "examples"))


def main(rounds=15, steps=200):
    import jax
    import jax.numpy as jnp
    jax.config.update("jax_enable_x64", True)
    import learned_forcing as lf
    import stepper as sp
    import stepper.jax  # noqa: F401
    import warnings
    warnings.simplefilter("ignore")

    net, names = lf.network(jnp)
    weights = lf.initial_weights(names)
    u0 = lf.profiles(64)
    model, _, _ = lf.build(64, net, weights)
    zero = sp.Model(dt=1e-3)                   # the same step with a zero forcing, all native
    zero.state("u", u0.shape, sp.float64)

    @zero.step
    def step(s):
        f = s.scratch("forcing", u0.shape, sp.float64)
        sp.launch(lf.diffuse_and_force, u0.shape, inputs=[s.prev.u, f, 0.2, s.dt], outputs=[s.next.u])
    init = {"u": sp.array(u0, dtype=sp.float64)}
    obs = sp.array(u0, dtype=sp.float64)

    def loss(state):
        out = sp.zeros(1, dtype=sp.float64)
        sp.launch(lf.misfit, state.u.shape, inputs=[state.u, obs], outputs=[out])
        return out

    jnet = jax.jit(net)
    ju, jw = jnp.asarray(u0), [jnp.asarray(weights[n]) for n in names]
    one = sp.jax.function(model, 1, inputs=["u"], loss=loss)
    one_jit = jax.jit(lambda u: one(u=u))
    model.rollout(init, 3), zero.rollout(init, 3), model.gradient(init, 3, loss=loss), one_jit(ju).block_until_ready()

    def per(fn, n):
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) / n * 1e6

    rows = {"native step": [], "net alone": [], "call forward": [], "reverse step": [], "function": []}
    for _ in range(rounds):
        rows["net alone"].append(per(lambda: [jnet(ju, *jw).block_until_ready() for _ in range(steps)], steps))
        learned = per(lambda: model.rollout(init, steps), steps)
        plain = per(lambda: zero.rollout(init, steps), steps)
        rows["native step"].append(plain)
        rows["call forward"].append(learned - plain)
        store = model.gradient(init, steps, loss=loss, schedule=sp.StoreAll(steps)).stats
        rows["reverse step"].append(store.adjoint_seconds / steps * 1e6)
        rows["function"].append(per(lambda: [one_jit(ju).block_until_ready() for _ in range(20)], 20) -
                                per(lambda: [model.evaluate(init, 1, loss) for _ in range(20)], 20))
    for name, values in rows.items():
        print(f"{name:>13}: median {statistics.median(values):8.1f} us  (spread {min(values):.1f} .. {max(values):.1f})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    main(parser.parse_args().rounds)
