# SPDX-License-Identifier: Apache-2.0
"""tandem's performance report, by stage (bench/report/report.py calls them in order):

- run, run_peers, run_extras: run tandem_bench (the roofline probes first), the peers,
  tandem_accuracy and tandem through Python, printing progress (eta: the time left);
- results: typed records of what they wrote (raw/run.json), the shapes taken from the
  parameters tandem_bench's plan gives every benchmark, and look-ups by shape;
- analysis: figures derived from several results (the block's projections, feature pairs);
- targets: the performance targets, each a small declarative record, and their evaluation;
- plots: the figures (matplotlib, imported there alone);
- invariance: the cost of the batch-invariant order, its verdict against the 5 % criterion;
- document, op_tables, doc: the report's text, written as Markdown and HTML.

Only the standard library is needed outside plots (Debian's /usr/bin/python3 runs it).
"""
