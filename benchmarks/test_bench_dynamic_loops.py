"""What exact dynamic-loop adjoints cost: adjoint time over forward time, and loop-tape memory.

    python -m pytest benchmarks/test_bench_dynamic_loops.py --benchmark-only -q -s

The case is issue 3's: a product over a runtime range, n = 1000 iterations per thread, 4096 threads,
on the CPU. The adjoint (``tape.backward``) runs a counting pass, allocates the loop tape, replays the
forward pushing each iteration's carried value, then sweeps the iterations in reverse. Goal: adjoint
at most 5x the forward. The tape holds one 8-byte word per carried scalar per iteration per thread,
measured here with `autograd.loop_tape_words` (the counting pass itself).
"""
from __future__ import annotations

import time

import numpy as np
import pytest

import compiler as sp
from compiler import autograd

THREADS, ITERATIONS = 4096, 1000


@sp.kernel
def product_rows(x: sp.array(dtype=float), n: int, out: sp.array(dtype=float)):
    i = sp.tid()
    prod = float(1.0)
    for k in range(n):
        prod *= x[i * n + k]
    out[i] = prod


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(0)
    x = sp.array(1.0 + rng.uniform(-1e-3, 1e-3, THREADS * ITERATIONS).astype(np.float32), requires_grad=True)
    out = sp.zeros(THREADS, requires_grad=True)
    tape = sp.Tape()
    with tape:
        sp.launch(product_rows, THREADS, inputs=[x, ITERATIONS], outputs=[out])
    seed = np.ones(THREADS, np.float32)
    return x, out, tape, seed


def _forward(x, out):
    sp.launch(product_rows, THREADS, inputs=[x, ITERATIONS], outputs=[out])


def test_forward(benchmark, problem):
    x, out, _, _ = problem
    scratch = sp.zeros(THREADS, requires_grad=True)      # leave the recorded output alone
    benchmark(_forward, x, scratch)


def test_adjoint(benchmark, problem):
    _, out, tape, seed = problem
    benchmark.pedantic(lambda: tape.backward(grads={out: seed}), setup=tape.zero, rounds=10, warmup_rounds=1)


def _best_of(fn, rounds: int, setup=lambda: None) -> float:
    best = float("inf")
    for _ in range(rounds):
        setup()
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _ratio(x, out, seed, deterministic: bool):
    """Best-of-15 forward and adjoint times; deterministic runs the threads serially on one core."""
    tape = sp.Tape(deterministic=deterministic)
    with tape:
        sp.launch(product_rows, THREADS, inputs=[x, ITERATIONS], outputs=[out])
    scratch = sp.zeros(THREADS, requires_grad=True)

    def forward():
        sp.launch(product_rows, THREADS, inputs=[x, ITERATIONS], outputs=[scratch], deterministic=deterministic)
    forward()
    return _best_of(forward, 15), _best_of(lambda: tape.backward(grads={out: seed}), 15, setup=tape.zero)


def test_adjoint_over_forward_and_tape_memory(benchmark, problem):
    x, _, _, seed = problem
    lines = [f"\nproduct loop, {THREADS} threads x {ITERATIONS} iterations on the CPU:"]
    for deterministic in (False, True):
        out = sp.zeros(THREADS, requires_grad=True)
        forward, adjoint = _ratio(x, out, seed, deterministic)
        ratio = adjoint / forward
        mode = "serial" if deterministic else "parallel"
        benchmark.extra_info.update({f"{mode}_forward_ms": forward * 1e3, f"{mode}_adjoint_ms": adjoint * 1e3,
                                     f"{mode}_ratio": ratio})
        lines.append(f"  {mode:8s}: forward {forward * 1e3:6.2f} ms, adjoint {adjoint * 1e3:6.2f} ms: "
                     f"{ratio:5.2f}x the forward (goal <= 5x: {'met' if ratio <= 5 else 'NOT met'})")
    words = autograd.loop_tape_words(product_rows, THREADS, [x, ITERATIONS], [out])
    carried_scalars = 1                                  # prod; the counter k is recomputed, not saved
    bytes_per = words.max() * 8 / ITERATIONS / carried_scalars
    tape_mib = words.max() * THREADS * 8 / 2 ** 20
    benchmark.extra_info.update(bytes_per_thread_iteration_value=bytes_per, tape_mib=tape_mib)
    benchmark.pedantic(lambda: None, rounds=1)
    lines.append(f"  loop tape: {bytes_per:.0f} bytes per thread per iteration per carried value, "
                 f"{tape_mib:.1f} MiB for the launch")
    print("\n".join(lines))
    assert bytes_per == 8
