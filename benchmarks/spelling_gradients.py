"""Issue 28's spellings of one stencil as whole models: rollout and Revolve gradient per spelling.

benchmarks/kernel_spellings.py times the kernels alone; this runs each wave spelling of
benchmarks/stencil_spellings.py (written out, with a `@sp.func` helper, with a coefficient table, as a
loop over neighbours) as a stepper model, states (up, u), the step the kernel into s.next.u and
``sp.copy(s.next.up, s.prev.u)``, the loss half the sum of u squared: a rollout and a Revolve
gradient per spelling, interleaved over rounds. Medians (min-max) in ms and the ratio to the fastest
spelling of the same stencil (order, dimensions, dtype). Before timing, every spelling's final state
and gradient are checked against the first's (to 1e-3 relative: the neighbour loop multiplies each
neighbour by its weight, the others each sum, so float32 results differ in rounding).

Run: OMP_NUM_THREADS=1 taskset -c 1 python benchmarks/spelling_gradients.py [--orders 2 4 8]
[--ndims 2 3] [--dtypes float32 float64] [--n2 256] [--n3 64] [--steps 400] [--rounds 3]
"""
import argparse
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import stepper as sp  # noqa: E402

import stencil_spellings  # noqa: E402

WAVES = ("unrolled", "helper", "table", "neighbours")


def _model(kernel, shape, dtype):
    model = sp.Model(zero_buffers=False)
    model.state("up", shape, dtype)
    model.state("u", shape, dtype)

    @model.step
    def step(s):
        sp.launch(kernel, shape, inputs=[s.prev.up, s.prev.u], outputs=[s.next.u])
        sp.copy(s.next.up, s.prev.u)
    return model


def _half_sum_sq(dtype, ndim):
    A = sp.array(dtype=dtype, ndim=ndim)
    if ndim == 2:
        @sp.kernel
        def half_sum_sq(u: A, out: sp.array(dtype=dtype)):
            i, j = sp.tid()
            sp.atomic_add(out, 0, 0.5 * u[i, j] * u[i, j])
    else:
        @sp.kernel
        def half_sum_sq(u: A, out: sp.array(dtype=dtype)):
            i, j, k = sp.tid()
            sp.atomic_add(out, 0, 0.5 * u[i, j, k] * u[i, j, k])

    def loss(state):
        out = sp.zeros(1, dtype=dtype, requires_grad=True)
        sp.launch(half_sum_sq, state.u.shape, inputs=[state.u], outputs=[out])
        return out
    return loss


def _initial(shape, dtype):
    axes = np.meshgrid(*[np.linspace(-1, 1, n) for n in shape], indexing="ij")
    u0 = np.exp(-20 * sum(a * a for a in axes)).astype(dtype.np_dtype)
    return {"up": sp.array(u0, dtype=dtype), "u": sp.array(u0, dtype=dtype)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--orders", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--ndims", type=int, nargs="+", default=[2, 3])
    ap.add_argument("--dtypes", nargs="+", default=["float32", "float64"])
    ap.add_argument("--n2", type=int, default=256)
    ap.add_argument("--n3", type=int, default=64)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--snapshots", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    steps = args.steps
    print(f"{steps} steps, Revolve({steps}, {args.snapshots}); {args.rounds} interleaved rounds; medians (min-max) "
          "in ms, ratio to the fastest spelling of the same stencil")
    print("| grid | order | dtype | spelling | rollout | ratio | gradient | ratio |\n|---|---:|---|---|---:|---:|---:|---:|")
    for ndim in args.ndims:
        shape = (args.n2,) * 2 if ndim == 2 else (args.n3,) * 3
        for order in args.orders:
            for dname in args.dtypes:
                dtype = getattr(sp, dname)
                kernels = stencil_spellings.kernels(order, ndim, dtype)
                loss = _half_sum_sq(dtype, ndim)
                models = {name: _model(kernels[name], shape, dtype) for name in WAVES}
                reference = None
                for name, model in models.items():            # compile, and check the answers
                    final = model.rollout(_initial(shape, dtype), steps)
                    g = model.gradient(_initial(shape, dtype), steps, loss=loss,
                                       schedule=sp.Revolve(steps, args.snapshots))
                    got = np.concatenate([final.u.numpy().ravel(), g.grads["u"].numpy().ravel()]).astype(np.float64)
                    reference = got if reference is None else reference
                    err = np.abs(got - reference).max() / np.abs(reference).max()
                    if err > 1e-3:
                        raise SystemExit(f"spelling '{name}' computes something else (relative difference {err:.2g})")
                times = {name: ([], []) for name in models}
                for _ in range(args.rounds):
                    for name, model in models.items():
                        t0 = time.perf_counter()
                        model.rollout(_initial(shape, dtype), steps)
                        t1 = time.perf_counter()
                        model.gradient(_initial(shape, dtype), steps, loss=loss, schedule=sp.Revolve(steps, args.snapshots))
                        t2 = time.perf_counter()
                        times[name][0].append(t1 - t0)
                        times[name][1].append(t2 - t1)
                fastest = [min(np.median(t[k]) for t in times.values()) for k in (0, 1)]
                for name, t in times.items():
                    cells = []
                    for k in (0, 1):
                        v = np.array(t[k]) * 1e3
                        cells += [f"{np.median(v):.1f} ({v.min():.1f}-{v.max():.1f})",
                                  f"{np.median(t[k]) / fastest[k]:.2f}"]
                    print(f"| {ndim}-D {shape[0]}^{ndim} | {order} | {dname} | {name} | " + " | ".join(cells) + " |",
                          flush=True)


if __name__ == "__main__":
    main()
