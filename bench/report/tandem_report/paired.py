# SPDX-License-Identifier: Apache-2.0
"""Paired measurements: two implementations timed in alternation (A, B, A, B, ...) on the
same shape in the same process, one ratio per round. A ratio is reported as the median of
the per-round ratios with their quartiles, and a target on it is decided only when that
spread lies wholly on one side of the bound."""
from typing import NamedTuple, Optional


def quantile(values, q):
    """The q-quantile (0 ≤ q ≤ 1) of `values` by linear interpolation between order
    statistics (numpy's default); None for no values."""
    xs = sorted(values)
    if not xs:
        return None
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


class Spread(NamedTuple):
    """A median and its quartiles (lo = 25th, hi = 75th percentile), over `n` values."""
    median: float
    lo: float
    hi: float
    n: int

    def text(self, unit="×"):
        return f"{self.median:.2f}{unit} ({self.lo:.2f}–{self.hi:.2f})"


def spread(values):
    """The Spread of `values`, or None for none."""
    vs = [v for v in values if v is not None]
    if not vs:
        return None
    return Spread(quantile(vs, 0.5), quantile(vs, 0.25), quantile(vs, 0.75), len(vs))


def paired_ratios(num, den):
    """num[i] / den[i] for each round i: e.g. the peer's time ÷ tandem's time in the same
    round is tandem's speed-up over the peer in that round."""
    if len(num) != len(den):
        raise ValueError(f"paired_ratios: {len(num)} rounds against {len(den)}")
    return [a / b for a, b in zip(num, den) if a and b]


def relative_spread(values):
    """(75th − 25th percentile) ÷ median of repeated measurements of one benchmark: the
    run's noise on it; None for fewer than two values."""
    s = spread(values)
    if s is None or s.n < 2 or not s.median:
        return None
    return (s.hi - s.lo) / s.median


# The statuses of a target decided on a Spread (targets.py shows them).
MET, MISSED, UNDECIDED = "met", "not met", "not decided"


def verdict(s: Optional[Spread], need):
    """Whether the speed-up Spread `s` meets `need` (at least): met when even its lower
    quartile reaches it, not met when even its upper quartile falls short, else not decided
    (the spread straddles the target); None when not measured."""
    if s is None:
        return None
    if s.lo >= need:
        return MET
    if s.hi < need:
        return MISSED
    return UNDECIDED


def combine(verdicts):
    """One status for several shapes' verdicts: not met if any is, else not decided if any
    is, else met; None when there are none."""
    vs = [v for v in verdicts if v is not None]
    if not vs:
        return None
    for status in (MISSED, UNDECIDED):
        if status in vs:
            return status
    return MET


def agree(a: Spread, b: Spread):
    """Whether two runs' Spreads of the same ratio agree: each median lies within the other's
    quartiles."""
    return a.lo <= b.median <= a.hi and b.lo <= a.median <= b.hi
