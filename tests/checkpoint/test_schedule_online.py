"""Online: valid for every stopping point, and its measured overhead over the offline optimum."""

from math import comb

import pytest

from checkpoint import EndForward, Forward, Online, optimal_steps, validate


def overheads(s, ns):
    """Worst ratio online / offline-optimum forward steps over the stopping points ns."""
    return max(validate(Online(s), n, snapshots_in_ram=s).forward_steps / optimal_steps(n, s)
               for n in ns)


def test_stopping_anywhere_gives_a_valid_reverse_sweep():
    for s in (1, 2, 3, 5):
        for n in range(1, 120):
            cost = validate(Online(s), n, snapshots_in_ram=s)
            assert cost.reverse_steps == n and cost.peak_ram <= s


def test_the_only_loss_for_short_runs_is_running_the_last_step_twice():
    # With n <= s every state is stored: 2n steps against the offline 2n - 1.
    for n in range(1, 11):
        assert validate(Online(10), n).forward_steps == 2 * n == optimal_steps(n, 10) + 1


# Measured bounds (worst case over the range; asserted as measured, rounded up):
#   s   n in (2s, C(s+3,3)]   n in (C(s+3,3), 3*C(s+3,3)]
#   5        7.9 %                  4.9 %
#  10        4.0 %                  3.6 %
#  20        2.0 %                  2.0 %
@pytest.mark.parametrize("s,near,far", [(5, 1.079, 1.049), (10, 1.040, 1.036), (20, 1.020, 1.020)])
def test_overhead_over_the_offline_optimum(s, near, far):
    b3 = comb(s + 3, 3)
    step = max(1, b3 // 60)    # sample the long ranges so the test stays fast
    assert overheads(s, range(2 * s + 1, b3 + 1, step)) <= near
    assert overheads(s, range(b3 + 1, 3 * b3 + 1, 3 * step)) <= far


def test_small_snapshot_counts_have_larger_overhead():
    # Few snapshots leave little room to hedge: measured 23 % (s=2) and 16 % (s=3) at worst.
    assert overheads(2, range(5, 31)) <= 1.228
    assert overheads(3, range(7, 61)) <= 1.16


def test_forward_sweep_hands_out_long_stretches():
    schedule = Online(3)
    actions = []
    for action in schedule:
        actions.append(action)
        if type(action) is Forward and action.n1 >= 1000:
            schedule.finalize(1000)
        if type(action) is EndForward:
            break
    first_sweep = [a for a in actions if type(a) is Forward]
    assert len(first_sweep) < 100   # far fewer actions than steps


def test_finalize_errors_say_what_is_allowed():
    schedule = Online(3)
    with pytest.raises(ValueError, match="before any Forward"):
        schedule.finalize(1)
    first = next(schedule)
    assert (first.n0, first.n1, first.write_ics) == (0, 1, True)
    with pytest.raises(ValueError, match=r"0 < n <= 1"):
        schedule.finalize(5)
    with pytest.raises(ValueError, match="int >= 1"):
        schedule.finalize(0)
    schedule.finalize(1)
    with pytest.raises(ValueError, match="already called"):
        schedule.finalize(1)


def test_online_needs_a_snapshot():
    with pytest.raises(ValueError, match="snapshots_in_ram must be at least 1"):
        Online(0)
