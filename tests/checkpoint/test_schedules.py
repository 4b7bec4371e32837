"""Offline schedules: exact step counts against the Griewank-Walther closed form, validity on the
abstract machine, and errors that say what is allowed."""

import functools
import sys
from math import comb

import pytest

from checkpoint import (Copy, EndForward, EndReverse, Forward, Move, MultiLevel, Reverse, Revolve,
                        StorageType, StoreAll, optimal_steps, validate)
from checkpoint.schedules.binomial import Splitter

RAM, DISK, WORK, NONE = StorageType.RAM, StorageType.DISK, StorageType.WORK, StorageType.NONE


def closed_form(n, s):
    """n + t(n, s) with t = r*n - C(s+r, r-1), r the least integer with C(s+r, s) >= n."""
    r = 0
    while comb(s + r, s) < n:
        r += 1
    return n + r * n - (comb(s + r, r - 1) if r >= 1 else 0)


def forward_steps(schedule):
    return sum(a.n1 - a.n0 for a in schedule if type(a) is Forward)


def test_actions_are_frozen_and_compare_by_value():
    a = Forward(0, 3, True, False, RAM)
    assert a == Forward(0, 3, True, False, RAM) and len(a) == 3
    with pytest.raises(AttributeError):
        a.n0 = 1
    assert Reverse(5, 4, True).n0 == 4 and StorageType.NONE.value is None


def test_revolve_small_schedule_is_the_textbook_one():
    # Six steps, two snapshots: 14 forward steps = 6 + t(6, 2).
    assert list(Revolve(6, 2)) == [
        Forward(0, 3, True, False, RAM), Forward(3, 5, True, False, RAM),
        Forward(5, 6, False, True, WORK), EndForward(), Reverse(6, 5, True),
        Copy(3, RAM, WORK), Forward(3, 4, False, False, WORK), Forward(4, 5, False, True, WORK),
        Reverse(5, 4, True), Move(3, RAM, WORK), Forward(3, 4, False, True, WORK),
        Reverse(4, 3, True), Copy(0, RAM, WORK), Forward(0, 1, False, False, WORK),
        Forward(1, 2, True, False, RAM), Forward(2, 3, False, True, WORK), Reverse(3, 2, True),
        Move(1, RAM, WORK), Forward(1, 2, False, True, WORK), Reverse(2, 1, True),
        Move(0, RAM, WORK), Forward(0, 1, False, True, WORK), Reverse(1, 0, True), EndReverse()]


@pytest.mark.parametrize("s", range(1, 7))
def test_revolve_is_optimal_and_valid_for_every_n_below_200(s):
    for n in range(1, 200):
        cost = validate(Revolve(n, s), n, snapshots_in_ram=s)
        assert cost.forward_steps == closed_form(n, s) == optimal_steps(n, s), (n, s)
        assert cost.reverse_steps == n and cost.peak_ram == min(s, n - 1)


def test_revolve_matches_closed_form_at_one_million_steps():
    assert forward_steps(Revolve(10**6, 20)) == closed_form(10**6, 20) == 7_815_960


def test_splitter_plan_is_optimal_at_ten_million_steps():
    # Generating 4e7 actions takes too long for a unit test; this replays the same split rule
    # as a recursion (the cost of reversing l steps with c snapshots) and checks its total.
    split = Splitter(20).advance

    @functools.lru_cache(maxsize=None)
    def plan(l, c):
        if l == 1:
            return 1
        m = split(l, c)
        return m + plan(l - m, c - 1) + plan(m, c)

    sys.setrecursionlimit(10000)
    for n, s in [(10**7, 20), (10**7, 8), (123_456_789, 20)]:
        plan.cache_clear()
        split = Splitter(s).advance
        assert plan(n, s) == closed_form(n, s), (n, s)


def test_revolve_matches_checkpoint_schedules_step_for_step():
    cs = pytest.importorskip("checkpoint_schedules")
    from checkpoint import from_checkpoint_schedules, to_checkpoint_schedules
    for n, s in [(1, 1), (7, 2), (30, 3), (100, 6)]:
        theirs = []
        for a in cs.MultistageCheckpointSchedule(n, s, 0, trajectory="revolve"):
            theirs.append(from_checkpoint_schedules(a))
            if isinstance(a, cs.EndReverse):
                break
        assert list(Revolve(n, s)) == theirs
        assert [type(to_checkpoint_schedules(a)).__name__ for a in theirs] == \
            [type(a).__name__ for a in theirs]


def test_peer_schedules_run_on_our_validator():
    cs = pytest.importorskip("checkpoint_schedules")
    n = 60
    assert validate(cs.Revolve(n, 4), n, snapshots_in_ram=4).forward_steps == closed_form(n, 4)
    assert validate(cs.MultistageCheckpointSchedule(n, 3, 4), n, snapshots_in_ram=3,
                    snapshots_on_disk=4).forward_steps == closed_form(n, 7)
    for sched in [cs.HRevolve(n, 2, 5), cs.DiskRevolve(n, 3), cs.TwoLevelCheckpointSchedule(7, 3),
                  cs.SingleMemoryStorageSchedule(), cs.SingleDiskStorageSchedule()]:
        assert validate(sched, n).reverse_steps == n


def test_store_all_records_every_step_once():
    for storage in (RAM, DISK, WORK):
        cost = validate(StoreAll(50, storage), 50)
        assert (cost.forward_steps, cost.recorded_steps, cost.reverse_steps) == (50, 50, 50)


@pytest.mark.parametrize("n,ram,disk", [(100, 3, 5), (1000, 4, 6), (10000, 5, 20), (57, 0, 4)])
def test_multilevel_needs_fewer_steps_than_revolve_with_the_same_ram(n, ram, disk):
    cost = validate(MultiLevel(n, ram, disk), n, snapshots_in_ram=ram, snapshots_on_disk=disk)
    assert cost.forward_steps == closed_form(n, ram + disk)
    if ram:
        assert cost.forward_steps < closed_form(n, ram)
        assert cost.peak_ram == ram


def test_multilevel_counts_against_closed_form_for_small_n():
    for n in range(1, 80):
        for ram, disk in [(1, 1), (2, 3), (0, 2)]:
            cost = validate(MultiLevel(n, ram, disk), n, snapshots_in_ram=ram,
                            snapshots_on_disk=disk)
            assert cost.forward_steps == closed_form(n, ram + disk), (n, ram, disk)


def test_multilevel_keeps_the_busiest_snapshots_in_ram():
    m = MultiLevel(1000, 4, 6)
    # The top of the stack is restored at almost every reverse step.
    assert m.storage_by_depth == (DISK,) * 6 + (RAM,) * 4
    cost = validate(m, 1000)
    assert cost.ram_reads > cost.disk_reads


def test_multilevel_trades_disk_traffic_against_recomputation():
    free = validate(MultiLevel(1000, 4, 6), 1000)
    costly = MultiLevel(1000, 4, 6, write_cost=50, read_cost=50)
    paid = validate(costly, 1000)
    assert costly.disk_used < 6 and paid.disk_writes < free.disk_writes
    assert paid.cost(write_cost=50, read_cost=50) < free.cost(write_cost=50, read_cost=50)


@pytest.mark.parametrize("make,message", [
    (lambda: Revolve(0, 3), "max_n must be at least 1"),
    (lambda: Revolve(10, 0), "snapshots_in_ram must be at least 1"),
    (lambda: Revolve(2.5, 1), "max_n must be an int"),
    (lambda: MultiLevel(10, 0, 0), "at least one snapshot"),
    (lambda: MultiLevel(10, 1, 1, write_cost=-1), "write_cost must be >= 0"),
    (lambda: StoreAll(-1), "max_n must be at least 1"),
])
def test_bad_arguments_say_what_is_allowed(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_no_action_after_end_reverse():
    schedule = Revolve(3, 2)
    while not isinstance(next(schedule), EndReverse):
        pass
    with pytest.raises(ValueError, match="no actions after EndReverse"):
        next(schedule)
    with pytest.raises(ValueError, match="already been iterated"):
        iter(schedule)


@pytest.mark.parametrize("actions,index,message", [
    ([Forward(0, 2, False, True, WORK), Reverse(2, 0, True)], 1, "after EndForward"),
    ([Forward(1, 2, False, True, WORK)], 0, "must start there"),
    ([Forward(0, 3, True, False, RAM)], 0, "at most"),
    ([Forward(0, 1, True, False, RAM), Forward(1, 2, False, False, WORK), EndForward(),
      Reverse(2, 1, True)], 3, "not recorded"),
    ([Forward(0, 1, True, False, RAM), Forward(1, 2, False, True, WORK), EndForward(),
      Reverse(2, 1, True), Copy(1, RAM, WORK)], 4, "holds no data for step 1"),
    ([Forward(0, 1, True, False, RAM), Forward(1, 2, True, False, RAM)], 1, "budget is 1"),
    ([Forward(0, 2, False, True, WORK), EndForward(), Reverse(2, 0, True), EndReverse(),
      EndReverse()], 4, "no action may follow"),
    ([Forward(0, 2, False, True, WORK), EndForward(), Reverse(2, 1, True), EndReverse()], 3,
     "adjoint at step 0"),
])
def test_validator_names_the_bad_action(actions, index, message):
    with pytest.raises(ValueError, match=f"action #{index} .*{message}"):
        validate(actions, 2, snapshots_in_ram=1)


def test_validator_reports_costs():
    cost = validate(Revolve(10, 3), 10, snapshots_in_ram=3)
    assert (cost.forward_steps, cost.reverse_steps, cost.recomputed_steps) == (25, 10, 15)
    assert (cost.peak_ram, cost.disk_writes, cost.disk_reads) == (3, 0, 0)
    assert cost.ram_reads == 9   # one restore before every reverse step but the first


def test_multilevel_disk_count_is_never_worse_than_no_disk_when_cost_has_several_minima():
    # Its cost over the disk count has several local minima; a ternary search used to pick 248 slots,
    # costlier than using no disk at all.
    m = MultiLevel(2000, 4, 256, write_cost=7.55, read_cost=4.88)
    best = min(range(0, 257, 1), key=m._total_cost)
    assert m._total_cost(m.disk_used) <= m._total_cost(0)
    assert m._total_cost(m.disk_used) <= 1.01 * m._total_cost(best)
