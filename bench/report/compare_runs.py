#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Compares the paired ratios of two report runs on the same machine: for every speed-up over
a peer (and every ratio of the Python table) measured in both, the two medians with their
spreads (a peer's: its 10th–90th percentiles, paired.PEER_SPAN; the Python table's the same
where its rounds came from several visits, else its quartiles; paired.visits_spread) and
whether they agree (each median within the other run's spread).

    bench/report/compare_runs.py report-a/raw/run.json report-b/raw/run.json
"""
import json
import sys

from tandem_report.paired import agree, paired_ratios, visits_spread
from tandem_report.results import Results


def paired_spreads(run):
    """{(what, shape, threads): Spread} of every paired ratio in raw/run.json's `run`."""
    res = Results.from_run(run)
    out = {}
    for p in res.peer_rows:
        if p.speedup is not None:
            out[(f"{p.op} vs {p.peer}", p.shape.tag, p.threads)] = p.speedup
    for r in res.python.get("results", []):
        v = r.get("visit_rounds")
        if r.get("tandem_python_rounds_s") and r.get("torch_sdpa_rounds_s"):
            out[("Python: torch SDPA ÷ tandem", r["shape"], None)] = visits_spread(
                paired_ratios(r["torch_sdpa_rounds_s"], r["tandem_python_rounds_s"]), v)
        if r.get("tandem_python_rounds_s") and r.get("kernel_rounds_s"):
            out[("Python: tandem via Python ÷ C++ entry", r["shape"], None)] = visits_spread(
                paired_ratios(r["tandem_python_rounds_s"], r["kernel_rounds_s"]), v)
    return out


def main(argv):
    if len(argv) != 3:
        print(__doc__)
        return 2
    runs = []
    for path in argv[1:]:
        with open(path) as f:
            runs.append(paired_spreads(json.load(f)))
    a, b = runs
    both = [k for k in a if k in b]
    print("| ratio | shape | run A | run B | agree |")
    print("|---|---|---|---|---|")
    for k in both:
        print(f"| {k[0]} | {k[1]} | {a[k].text()} | {b[k].text()} | "
              f"{'yes' if agree(a[k], b[k]) else '**no**'} |")
    n = sum(agree(a[k], b[k]) for k in both)
    print(f"\n{n} of {len(both)} paired ratios agree (each median within the other run's "
          "spread)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
