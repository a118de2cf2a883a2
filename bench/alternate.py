# SPDX-License-Identifier: Apache-2.0
"""Alternating timing, shared by the report's Python benchmarks (bench/peers/peers.py in the
peers' environment, bench/python/python_bench.py in the package's): several callables timed
in rounds on the same inputs, so that a ratio between two of them is paired within a round,
and the split of the rounds into visits (worker processes run one after another)."""
import time


def alternate(fns, min_time, rounds):
    """The callables `fns` timed in alternation: after a warm-up call of each, `rounds`
    rounds that each time every one (the order rotated every round, so none always runs
    first; for two, swapped every other round), each calling its function for about
    min_time / rounds seconds. [[seconds per call of fns[i] in each round] for each i]."""
    counts = []
    for fn in fns:
        fn()  # warm-up (and compilation, for JIT peers)
        t0 = time.perf_counter()
        fn()
        counts.append(max(1, int(min_time / rounds / max(time.perf_counter() - t0, 1e-7))))
    times = [[] for _ in fns]
    for r in range(rounds):
        for j in range(len(fns)):
            i = (j + r) % len(fns)
            t0 = time.perf_counter()
            for _ in range(counts[i]):
                fns[i]()
            times[i].append((time.perf_counter() - t0) / counts[i])
    return times


def visit_rounds(rounds, visits):
    """The rounds of each visit: `rounds` split as evenly as `visits` allows (the first
    ones the larger), at least two each (a worker pairs from two rounds); one visit where
    that leaves fewer (rounds < 4, or unpaired)."""
    n = max(1, min(visits, rounds // 2))
    return [rounds // n + (1 if i < rounds % n else 0) for i in range(n)]
