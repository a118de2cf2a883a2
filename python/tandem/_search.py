# SPDX-License-Identifier: Apache-2.0
"""The budgeted Hypothesis search of every tandem.testing check: draw from
a strategy until an example fails or the time budget is spent, then shrink
the failure to its smallest form."""

import time

from hypothesis import HealthCheck, Verbosity, given, settings
from hypothesis import seed as _hseed


class _Rejected(AssertionError):
    """One example a check rejected: args (problem text, example)."""


def shrunk_failure(strategy, problem_of, max_examples, time_budget, seed):
    """(example, problem) of the smallest example drawn from `strategy`
    whose `problem_of(example)` is not None, or None when none fails. Past
    `time_budget` seconds exploration stops (the remaining examples return
    at once); once a failure is seen, shrinking always runs to the end."""
    start = time.monotonic()
    failed = []

    @settings(max_examples=max_examples, deadline=None, database=None,
              verbosity=Verbosity.quiet, print_blob=False,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def property_(example):
        if not failed and time.monotonic() - start > time_budget:
            return
        problem = problem_of(example)
        if problem:
            failed.append(example)
            raise _Rejected(problem, example)

    if seed is not None:
        property_ = _hseed(seed)(property_)
    try:
        property_()
    except _Rejected as e:
        problem, example = e.args
        return example, problem
    return None
