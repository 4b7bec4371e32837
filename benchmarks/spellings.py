"""The same nonlinear wave step spelled the ways users write it: forward and gradient time of each.

    python benchmarks/spellings.py [--n 256] [--steps 1000] [--snapshots 20] [--rounds 3] [--forward-only]
    python benchmarks/spellings.py --kernels [--orders 2 4 8] [--ndims 2 3] [--dtypes float32 float64]
                                             [--before one-pass|no-halo|not-reassociated|no-prefetch|whole-scratch]
                                             [--no-before]

`--kernels` times kernels instead of models: the adjoint / forward kernel time of 2nd-, 4th- and
8th-order stencils in 2-D and 3-D, each spelled unrolled, with a `@sp.func` helper, with a loop over
a coefficient table and with loops over neighbours (benchmarks/kernel_spellings.py), against the
same kernels compiled as before the two-pass adjoint form.

Issue 14 asks that no common spelling be more than 1.3x slower than the fastest, forward and
Revolve gradient. Every spelling computes the same step (zero Dirichlet boundary: a boundary
element's next value is 0) except `periodic`, which wraps around; each runs as a stepper model of
two states, (up, u), once in float32 and once in float64 (the kernels come from one factory per
dtype). Contenders run interleaved (A B C ... A B C ...) for `--rounds` rounds; the table gives
medians with (min-max) and the ratio of each median to the fastest spelling's of the same dtype
(float64 moves twice the bytes; the last line gives that ratio for scale). Before timing, every
Dirichlet spelling's final state and gradient are checked against the first spelling's of its dtype
(to 1e-3 relative; float32 rounding over a run reaches 1e-4), so a fast wrong spelling cannot win.
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stepper as sp  # noqa: E402

C, B = 0.2, 1e-3
DTYPES = {"float32": sp.float32, "float64": sp.float64}


def spelling_kernels(dtype) -> dict:
    """name -> kernel, each spelling of the step typed for `dtype` (a factory, as a user who runs a
    model in both precisions writes it). The step kernels take (up, u[, n]) and write (up_next,
    u_next), except `next_only`, which writes u_next alone (the sp.copy spelling copies up)."""
    A = sp.array(dtype=dtype, ndim=2)

    @sp.kernel
    def guard_per_neighbour(up: A, u: A, up_next: A, u_next: A):
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
        value = 2.0 * x - up[i, j] + 0.2 * lap - 0.001 * x * x * x
        if i == 0 or j == 0 or i == n - 1 or j == m - 1:
            value = dtype(0.0)
        up_next[i, j] = x
        u_next[i, j] = value

    @sp.kernel
    def combined_guard(up: A, u: A, up_next: A, u_next: A):
        i, j = sp.tid()
        n = u.shape[0]
        x = u[i, j]
        value = dtype(0.0)
        if i > 0 and j > 0 and i < n - 1 and j < n - 1:
            lap = u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1] - 4.0 * x
            value = 2.0 * x - up[i, j] + 0.2 * lap - 0.001 * x * x * x
        up_next[i, j] = x
        u_next[i, j] = value

    @sp.kernel
    def size_argument(up: A, u: A, n: int, up_next: A, u_next: A):
        i, j = sp.tid()
        x = u[i, j]
        value = dtype(0.0)
        if i > 0 and j > 0 and i < n - 1 and j < n - 1:
            lap = u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1] - 4.0 * x
            value = 2.0 * x - up[i, j] + 0.2 * lap - 0.001 * x * x * x
        up_next[i, j] = x
        u_next[i, j] = value

    @sp.kernel
    def clamped(up: A, u: A, up_next: A, u_next: A):
        i, j = sp.tid()
        n = u.shape[0]
        x = u[i, j]
        lap = (u[sp.max(i - 1, 0), j] + u[sp.min(i + 1, n - 1), j] + u[i, sp.max(j - 1, 0)]
               + u[i, sp.min(j + 1, n - 1)] - 4.0 * x)
        value = 2.0 * x - up[i, j] + 0.2 * lap - 0.001 * x * x * x
        if i == 0 or j == 0 or i == n - 1 or j == n - 1:
            value = dtype(0.0)
        up_next[i, j] = x
        u_next[i, j] = value

    @sp.kernel
    def periodic(up: A, u: A, up_next: A, u_next: A):
        i, j = sp.tid()
        n = u.shape[0]
        x = u[i, j]
        lap = u[(i + 1) % n, j] + u[(i + n - 1) % n, j] + u[i, (j + 1) % n] + u[i, (j + n - 1) % n] - 4.0 * x
        up_next[i, j] = x
        u_next[i, j] = 2.0 * x - up[i, j] + 0.2 * lap - 0.001 * x * x * x

    @sp.kernel
    def next_only(up: A, u: A, u_next: A):
        i, j = sp.tid()
        n = u.shape[0]
        x = u[i, j]
        value = dtype(0.0)
        if i > 0 and j > 0 and i < n - 1 and j < n - 1:
            lap = u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1] - 4.0 * x
            value = 2.0 * x - up[i, j] + 0.2 * lap - 0.001 * x * x * x
        u_next[i, j] = value

    @sp.kernel
    def half_sum_sq(u: A, out: sp.array(dtype=dtype)):
        i, j = sp.tid()
        sp.atomic_add(out, 0, 0.5 * u[i, j] * u[i, j])

    return {k.__name__: k for k in (guard_per_neighbour, combined_guard, size_argument, clamped, periodic,
                                    next_only, half_sum_sq)}


def spelling_models(n: int, dtype) -> dict:
    """name -> model; every step function launches its spelling over (n, n) in `dtype`."""
    kernels = spelling_kernels(dtype)

    def model_of(step):
        model = sp.Model(zero_buffers=False)
        model.state("up", (n, n), dtype)
        model.state("u", (n, n), dtype)
        model.step(step)
        return model

    def two_outputs(kernel, *extra):
        return lambda s: sp.launch(kernel, (n, n), inputs=[s.prev.up, s.prev.u, *extra], outputs=[s.next.up, s.next.u])

    def with_copy(s):
        sp.launch(kernels["next_only"], (n, n), inputs=[s.prev.up, s.prev.u], outputs=[s.next.u])
        sp.copy(s.next.up, s.prev.u)

    return {
        "guard per neighbour": model_of(two_outputs(kernels["guard_per_neighbour"])),
        "one combined guard": model_of(two_outputs(kernels["combined_guard"])),
        "size as int argument": model_of(two_outputs(kernels["size_argument"], n)),
        "clamped indices": model_of(two_outputs(kernels["clamped"])),
        "sp.copy for the 2nd state": model_of(with_copy),
        "periodic (%)": model_of(two_outputs(kernels["periodic"])),
    }


def initial(n: int, dtype) -> dict:
    x = np.linspace(-1, 1, n)
    u0 = np.exp(-20 * (x[:, None] ** 2 + x[None, :] ** 2))
    u0[[0, -1], :] = 0
    u0[:, [0, -1]] = 0
    return {"up": sp.array(u0, dtype=dtype), "u": sp.array(u0, dtype=dtype)}


def loss_of(kernel, dtype):
    def loss(state):
        out = sp.zeros(1, dtype=dtype, requires_grad=True)
        sp.launch(kernel, state.u.shape, inputs=[state.u], outputs=[out])
        return out
    return loss


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--snapshots", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--forward-only", action="store_true",
                        help="time the rollouts only (longer ones, with --steps, weigh their setup less)")
    parser.add_argument("--kernels", action="store_true", help="adjoint/forward kernel time per spelling and order")
    parser.add_argument("--orders", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--ndims", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES))
    parser.add_argument("--n2", type=int, default=512, help="--kernels: 2-D grid side")
    parser.add_argument("--n3", type=int, default=64, help="--kernels: 3-D grid side")
    parser.add_argument("--no-before", action="store_true", help="--kernels: skip the kernels compiled as before")
    parser.add_argument("--before", default="one-pass",
                        choices=["one-pass", "no-halo", "not-reassociated", "no-prefetch", "whole-scratch"],
                        help="--kernels: what 'before' is: the one-pass gather form, the two-pass form without "
                             "its halo (scratch the launch's size, variants near the faces), the halo form "
                             "without summing the roots of one weight first, the loops without prefetching, "
                             "or the two passes in turn over whole scratch arrays (not windows of rows)")
    parser.add_argument("--device", default="cpu", help="--kernels: where the kernels run (cpu or cuda)")
    args = parser.parse_args()
    if args.kernels:
        from kernel_spellings import kernel_table
        print(f"kernels, {max(args.rounds, 5)} interleaved rounds, {os.cpu_count()} CPUs, device {args.device}, "
              f"all gradients present")
        kernel_table(args.orders, args.ndims, args.dtypes, args.n2, args.n3, max(args.rounds, 5),
                     None if args.no_before else args.before, args.device)
        return
    n, steps = args.n, args.steps
    contenders = {}                                       # (dtype name, spelling) -> (model, dtype, loss)
    for dname, dtype in DTYPES.items():
        loss = loss_of(spelling_kernels(dtype)["half_sum_sq"], dtype)
        contenders.update({(dname, name): (model, dtype, loss) for name, model in spelling_models(n, dtype).items()})
    schedule = lambda: sp.Revolve(steps, args.snapshots)

    reference = {}
    # Warm up (compile) and check the answers, over at most 1000 steps: the wave is nonlinear, and
    # float32 rounding differences between spellings grow past the tolerance over longer runs.
    check = min(steps, 1000)
    for (dname, name), (model, dtype, loss) in contenders.items():
        final = model.rollout(initial(n, dtype), check)
        result = model.gradient(initial(n, dtype), check, loss=loss, schedule=sp.Revolve(check, args.snapshots))
        got = np.concatenate([final.u.numpy().ravel(), result.grads["u"].numpy().ravel()]).astype(np.float64)
        if name.startswith("periodic"):
            continue
        ref = reference.setdefault(dname, got)
        err = np.abs(got - ref).max() / np.abs(ref).max()
        if err > 1e-3:                                  # float32 rounding over the run: ~1e-4
            raise SystemExit(f"spelling '{name}' ({dname}) computes something else (relative difference {err:.2g})")

    kinds = ("forward",) if args.forward_only else ("forward", "gradient")
    times = {key: {kind: [] for kind in kinds} for key in contenders}
    for _ in range(args.rounds):
        for key, (model, dtype, loss) in contenders.items():
            start = time.perf_counter()
            model.rollout(initial(n, dtype), steps)
            times[key]["forward"].append(time.perf_counter() - start)
            if args.forward_only:
                continue
            start = time.perf_counter()
            model.gradient(initial(n, dtype), steps, loss=loss, schedule=schedule())
            times[key]["gradient"].append(time.perf_counter() - start)

    fastest = {(dname, kind): min(np.median(t[kind]) for (d, _), t in times.items() if d == dname)
               for dname in DTYPES for kind in kinds}
    print(f"wave {n}x{n}, {steps} steps, Revolve({steps}, {args.snapshots}); {args.rounds} interleaved rounds, "
          f"{os.cpu_count()} CPUs; medians (min-max) in ms, ratio to the fastest spelling of the same dtype")
    print("| spelling | " + " | ".join(f"{d} {kind} | ratio" for d in DTYPES for kind in kinds) + " |")
    print("|---|" + "---:|---:|" * len(DTYPES) * len(kinds))
    for name in dict.fromkeys(name for _, name in contenders):
        cells = []
        for dname in DTYPES:
            for kind in kinds:
                v = np.array(times[(dname, name)][kind]) * 1e3
                cells += [f"{np.median(v):.0f} ({v.min():.0f}-{v.max():.0f})",
                          f"{np.median(v) / 1e3 / fastest[(dname, kind)]:.2f}"]
        print(f"| {name} | " + " | ".join(cells) + " |")
    print("fastest float64 / fastest float32 (twice the bytes): " + ", ".join(
        f"{kind} {fastest[('float64', kind)] / fastest[('float32', kind)]:.2f}" for kind in kinds))


if __name__ == "__main__":
    main()
