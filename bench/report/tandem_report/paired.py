# SPDX-License-Identifier: Apache-2.0
"""Paired measurements: two implementations timed in alternation (A, B, A, B, ...) on the
same shape in the same process, one ratio per round. A ratio is reported as the median of
the per-round ratios with their spread (the quartiles; PEER_SPAN for a speed-up over a
peer), and a target on it is decided only when that spread lies wholly on one side of the
bound."""
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


# The spread of a speed-up over a peer: its 10th to 90th percentile, not its quartiles. Its
# rounds come from several processes minutes apart (peers.py --visits), and a peer's speed
# moves between processes, and over minutes on a shared host, by more than the rounds of one
# process spread: two standard runs of the same 40 peer ratios on a 2-core Zen 4 guest (four
# visits each) agreed, each median inside the other run's spread, on 16 by their quartiles
# and on 31 by these percentiles (bench/README.md, "Paired ratios").
PEER_SPAN = (0.10, 0.90)


class Spread(NamedTuple):
    """A median and the bounds of its spread over `n` values: lo, hi the 25th and 75th
    percentiles (PEER_SPAN's for a speed-up over a peer)."""
    median: float
    lo: float
    hi: float
    n: int

    def text(self, unit="×"):
        return f"{self.median:.2f}{unit} ({self.lo:.2f}–{self.hi:.2f})"


def spread(values, span=(0.25, 0.75)):
    """The Spread of `values` between the quantiles `span` (the quartiles unless told), or
    None for none."""
    vs = [v for v in values if v is not None]
    if not vs:
        return None
    return Spread(quantile(vs, 0.5), quantile(vs, span[0]), quantile(vs, span[1]), len(vs))


def visits_spread(values, visit_rounds=None):
    """The Spread of per-round ratios: PEER_SPAN's percentiles where the rounds came from
    several visits (visit_rounds, the rounds of each; python_bench.py --visits), whose
    medians move as a peer's do, else the quartiles of one process."""
    return spread(values, PEER_SPAN if visit_rounds and len(visit_rounds) > 1 else (0.25, 0.75))


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
    bound reaches it, not met when even its upper bound falls short, else not decided
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
    spread."""
    return a.lo <= b.median <= a.hi and b.lo <= a.median <= b.hi
