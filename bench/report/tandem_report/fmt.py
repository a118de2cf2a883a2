# SPDX-License-Identifier: Apache-2.0
"""How the report writes numbers, fractions, ratios and durations."""
import math


def fnum(x, digits=3):
    """Human number: 3 significant digits, or '–'."""
    if x is None or (isinstance(x, float) and (math.isnan(x) or math.isinf(x))):
        return "–"
    if x == 0:
        return "0"
    mag = abs(x)
    if mag >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{max(0, digits - 1 - int(math.floor(math.log10(mag))))}f}"


def fpct(x):
    """A fraction as a whole percentage ('–' when unknown)."""
    return "–" if x is None else f"{100 * x:.0f} %"


def fratio(x):
    """A ratio such as a speed-up, '1.23×' ('–' when unknown)."""
    return "–" if x is None else f"{x:.2f}×"


def fms(seconds):
    """A duration in s, ms or µs ('–' when unknown)."""
    if seconds is None:
        return "–"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} µs"


def fmt_dur(s):
    """Seconds as minutes:seconds."""
    s = int(round(s))
    return f"{s // 60}:{s % 60:02d}"
