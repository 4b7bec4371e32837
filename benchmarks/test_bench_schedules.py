"""Action generation rate: our Revolve against checkpoint_schedules and pyrevolve (when installed).

Run: python -m pytest benchmarks/test_bench_schedules.py --benchmark-only
Each benchmark drains one schedule of n steps with 20 snapshots; actions/second is reported in
extra_info. Benchmarks, not tests: nothing here asserts on time.
"""

import pytest

from checkpoint import Revolve

SNAPSHOTS = 20


def drain(schedule, end_type):
    count = 0
    for action in schedule:
        count += 1
        if type(action) is end_type:
            break
    return count


def run(benchmark, make, end_type):
    count = benchmark.pedantic(lambda: drain(make(), end_type), rounds=1, iterations=1,
                               warmup_rounds=0)
    benchmark.extra_info["actions"] = count
    if not benchmark.disabled:       # --benchmark-disable runs once and times nothing
        benchmark.extra_info["actions_per_second"] = count / benchmark.stats.stats.mean


@pytest.mark.parametrize("n", [10**3, 10**5, 10**6])
def test_ours_revolve(benchmark, n):
    from checkpoint import EndReverse
    run(benchmark, lambda: Revolve(n, SNAPSHOTS), EndReverse)


@pytest.mark.parametrize("n", [10**3])
def test_checkpoint_schedules_revolve(benchmark, n):
    # Its Revolve tabulates the whole H-Revolve sequence up front (about 5 s at n=1e3 and over
    # 200 s at n=1e5 on our machine), so it runs at n=1e3 only; Multistage is its fast peer.
    cs = pytest.importorskip("checkpoint_schedules")
    run(benchmark, lambda: cs.Revolve(n, SNAPSHOTS), cs.EndReverse)


@pytest.mark.parametrize("n", [10**5, 10**6])
def test_checkpoint_schedules_multistage(benchmark, n):
    cs = pytest.importorskip("checkpoint_schedules")
    run(benchmark, lambda: cs.MultistageCheckpointSchedule(n, SNAPSHOTS, 0), cs.EndReverse)


@pytest.mark.parametrize("n", [10**5, 10**6])
def test_pyrevolve(benchmark, n):
    pr = pytest.importorskip("pyrevolve")
    crevolve = pytest.importorskip("pyrevolve.crevolve")

    def make():
        # pyrevolve's Revolver drives callbacks; its action generator is the crevolve binding.
        r = crevolve.CRevolve(SNAPSHOTS, n)
        def actions():
            while True:
                action = r.revolve()
                yield action
                if action == crevolve.Action.terminate or action == crevolve.Action.error:
                    return
        return actions()
    run(benchmark, make, type(None))
    del pr
