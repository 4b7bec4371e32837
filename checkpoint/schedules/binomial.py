"""Closed forms of binomial checkpointing (Griewank & Walther, ACM TOMS 26(1), 2000).

Counting convention (the one of checkpoint_schedules, so numbers compare one to one): `s`
snapshots include the one holding the state at the start of the range; the forward sweep of a step
that is about to be reversed is recorded as it runs (Forward(..., write_adj_deps=True)) and counts
as one forward step. Reversing `l` steps with `s` snapshots then costs at least

    optimal_steps(l, s) = l + t(l, s),   t(l, s) = r*l - beta(s+1, r-1),

forward steps, where beta(s, r) = C(s+r, s) and r is the least integer with beta(s, r) >= l
(r = 0 for l = 1). Snapshots beyond l - 1 cannot help: optimal_steps(l, s) = 2l - 1 then.
"""

from __future__ import annotations

from math import comb

__all__ = ["beta", "repetitions", "optimal_steps", "Splitter"]


def beta(s: int, r: int) -> int:
    """C(s+r, s): the most steps that s snapshots reverse with r repetitions per step."""
    return comb(s + r, s) if r >= 0 else 0


def repetitions(l: int, s: int) -> int:
    """The least r with beta(s, r) >= l."""
    r, b = 0, 1
    while b < l:
        r += 1
        b = b * (s + r) // r
    return r


def optimal_steps(l: int, s: int) -> int:
    """The fewest forward steps that reverse l steps with s snapshots (see the module docstring)."""
    if l < 1 or s < 1:
        raise ValueError(f"optimal_steps needs l >= 1 steps and s >= 1 snapshots, got l={l}, s={s}")
    r = repetitions(l, s)
    return l + r * l - beta(s + 1, r - 1)


class Splitter:
    """Where to place the next snapshot, in O(1) amortised time per call.

    `advance(l, c)` is the number of steps to run from a stored state before storing the next one,
    when l steps remain to reverse and c snapshots (the stored one included) are free. It follows
    Griewank & Walther's revolve rule (end of p. 34 of the paper). The repetition number r changes
    slowly between successive calls with the same c, so r and beta(c, r) are kept per c and walked
    up or down by exact integer ratios instead of being searched from zero.
    """

    __slots__ = ("_r", "_b")

    def __init__(self, snapshots: int):
        self._r = [0] * (snapshots + 2)
        self._b = [1] * (snapshots + 2)

    def advance(self, l: int, c: int) -> int:
        if c == 1:
            return l - 1
        if c >= l - 1:
            return 1
        r = self._r[c]
        b = self._b[c]
        while b < l:
            r += 1
            b = b * (c + r) // r
        bp = b * r // (c + r)
        while bp >= l:
            b = bp
            r -= 1
            bp = b * r // (c + r)
        self._r[c] = r
        self._b[c] = b
        # Here beta(c, r-1) = bp < l <= b = beta(c, r) and r >= 2 because l > c + 1.
        c1 = bp * c // (c + r - 1)              # beta(c-1, r-1)
        c2 = c1 * (c - 1) // (c + r - 2)        # beta(c-2, r-1)
        if l <= bp + c2:
            return bp * (r - 1) // (c + r - 1)  # beta(c, r-2)
        if l < bp + c1 + c2:
            return l - c1 - c2
        return bp
