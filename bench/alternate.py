# SPDX-License-Identifier: Apache-2.0
"""Alternating timing, shared by the report's Python benchmarks (bench/peers/peers.py in the
peers' environment, bench/python/python_bench.py in the package's): several callables timed
in rounds on the same inputs, so that a ratio between two of them is paired within a round."""
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
