"""The binomial reverse sweep shared by Revolve, MultiLevel and Online."""

from __future__ import annotations

from ..actions import END_REVERSE, StorageType, _copy, _forward, _move, _reverse

__all__ = ["reverse_sweep"]


def reverse_sweep(schedule, stack: list, end: int, s: int, advance, tiers):
    """Yield the actions that reverse steps end-1 .. 0, then EndReverse.

    `stack` holds the positions of the stored states (increasing, stack[0] == 0) and is consumed;
    the state at stack[i] lives in tiers[i]. The forward state in WORK is not used: each step
    first restores the nearest stored state, then runs the binomial split (`advance`, see
    binomial.Splitter) with the s - len(stack) + 1 snapshots it may use. `schedule._n` and
    `schedule._r` follow the actions.
    """
    forward, reverse, copy, move = _forward, _reverse, _copy, _move
    work = StorageType.WORK
    push, pop = stack.append, stack.pop
    r = schedule._r
    while end > 0:
        top = stack[-1]
        depth = len(stack) - 1
        schedule._n = top
        if top == end - 1:
            pop()
            yield move(top, tiers[depth], work)
        else:
            yield copy(top, tiers[depth], work)
            pos = top + advance(end - top, s - depth)
            schedule._n = pos
            yield forward(top, pos, False, False, work)
            while pos < end - 1:
                n1 = pos + advance(end - pos, s - len(stack))
                yield forward(pos, n1, True, False, tiers[len(stack)])
                push(pos)
                schedule._n = pos = n1
        schedule._n = end
        yield forward(end - 1, end, False, True, work)
        end -= 1
        r += 1
        schedule._r = r
        yield reverse(end + 1, end, True)
    yield END_REVERSE
