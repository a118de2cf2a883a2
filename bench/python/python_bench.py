# SPDX-License-Identifier: Apache-2.0
"""tandem called from Python, beside PyTorch's SDPA (bench/report runs it
with the .venv/ interpreter that `make test` creates).

Measures, in one process:
  - the binding overhead per call: tandem.torch.scaled_dot_product_attention
    on a [1, 1, 1, 8] problem with one thread, where the kernel's own work is
    a few dozen FLOPs, minus the kernel call alone (the extension's
    entry with the plan made and the addresses taken beforehand, which
    still pays the backend's fixed cost per call); the same for the layers
    in between (tandem.attention on NumPy, the extension's DLPack entry);
  - forward attention at the report's large shapes: tandem through
    tandem.torch.scaled_dot_product_attention, torch's own
    F.scaled_dot_product_attention and (without a mask) the optimized
    kernel's C++ entry alone, on [B, H, S, D] float32 tensors with the same
    thread count, timed in alternating rounds so that each ratio is paired
    within a round.

With --visits V the rounds are taken in V worker processes run one after
another, each with its share of the rounds and of --min-time (the overhead in
the first only), and merged round by round (merge_visits): one process is one
draw of the machine, and the merged spread holds the move between draws.

    usage: python_bench.py --shapes B1_H8_S2048_D128,B1_H8_S1024_D64_causal
                           --threads N --min-time S [--visits V] --out result.json
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F

import tandem
import tandem.torch as tt
from tandem import _ext

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from alternate import alternate, visit_rounds  # noqa: E402 - bench/alternate.py


def per_call(fn, min_time, repeats=5):
    """Median over `repeats` runs of the mean seconds per call, each run
    calling fn for at least min_time / repeats seconds."""
    fn()
    n, t0 = 1, time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-7)
    n = max(1, int(min_time / repeats / one))
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        runs.append((time.perf_counter() - t0) / n)
    return statistics.median(runs)


def kernel_call(q, k, v, causal):
    """The optimized forward's C++ entry alone on contiguous [B, H, S, D] tensors (plan made
    and addresses taken beforehand: no Python layer in between), or None with a mask."""
    if causal:
        return None
    B, H, S, D = q.shape
    p = _ext.AttentionParams()
    p.B, p.H, p.Hkv, p.Sq, p.Sk, p.D, p.Dv = B, H, H, S, S, D, D
    p.layout = _ext.Layout.bhsd
    plan = _ext.AttentionPlan.make(p)
    out = torch.empty(B, H, S, D)
    a, b, c, o = q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr()

    def call():
        _ext.attention_forward_contiguous("optimized", plan, a, b, c, o, _ext.Dtype.float32)
        return out  # keeps the output alive while its address is in use
    return call


def overhead(min_time):
    """Seconds per call on a [1, 1, 1, 8] problem, one thread, for each layer."""
    tandem.set_threads(1)
    torch.set_num_threads(1)
    q = torch.randn(1, 1, 1, 8)
    qn = q.numpy()
    p = _ext.AttentionParams()
    p.B = p.Sq = p.Sk = p.H = 1
    p.D = 8
    p.layout = _ext.Layout.bhsd
    out = np.empty((1, 1, 1, 8), np.float32)
    inputs = {"q": qn, "k": qn, "v": qn}
    plan = _ext.AttentionPlan.make(p)
    a, o = qn.__array_interface__["data"][0], out.__array_interface__["data"][0]
    result = {
        "kernel_call_s": per_call(lambda: _ext.attention_forward_contiguous("optimized", plan, a, a,
                                                                            a, o, False), min_time),
        "extension_call_s": per_call(lambda: _ext.attention_forward("optimized", p, inputs, out,
                                                                    None), min_time),
        "numpy_attention_s": per_call(lambda: tandem.attention(qn, qn, qn, layout="bhsd"),
                                      min_time),
        "torch_sdpa_tandem_s": per_call(lambda: tt.scaled_dot_product_attention(q, q, q),
                                        min_time),
        "torch_sdpa_torch_s": per_call(lambda: F.scaled_dot_product_attention(q, q, q), min_time),
    }
    tandem.set_threads(0)
    return result


def shape_of(name):
    m = re.fullmatch(r"B(\d+)_H(\d+)_S(\d+)_D(\d+)(_causal)?", name)
    if not m:
        raise SystemExit(f"python_bench: shape {name!r} is not B<b>_H<h>_S<s>_D<d>[_causal]")
    B, H, S, D = (int(x) for x in m.groups()[:4])
    return B, H, S, D, bool(m.group(5))


ROUNDS = ("tandem_python_rounds_s", "torch_sdpa_rounds_s", "kernel_rounds_s")


def merge_visits(docs):
    """One document of the visits' documents: the first's overhead and versions, each
    shape's rounds concatenated in visit order (visit_rounds: how many each gave) and its
    medians taken again over them."""
    doc = dict(docs[0], visits=len(docs), results=[])
    for first in docs[0]["results"]:
        same = [r for d in docs for r in d["results"] if r["shape"] == first["shape"]]
        m = dict(first, visit_rounds=[r["rounds"] for r in same],
                 rounds=sum(r["rounds"] for r in same))
        for key in ROUNDS:
            m[key] = [x for r in same for x in r[key]] if first[key] else None
        m["tandem_python_s"] = statistics.median(m["tandem_python_rounds_s"])
        m["torch_sdpa_s"] = statistics.median(m["torch_sdpa_rounds_s"])
        doc["results"].append(m)
    return doc


def run_visits(a, argv):
    """Runs this script once per visit (visit_rounds of a.rounds) and writes the merged
    document to a.out; a visit that fails fails the run."""
    split = visit_rounds(a.rounds, a.visits)
    docs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, rounds in enumerate(split):
            out = os.path.join(tmp, f"visit{i}.json")
            cmd = [sys.executable, os.path.abspath(__file__), *argv, "--visits", "1",
                   "--rounds", str(rounds), "--share", str(rounds / sum(split)), "--out", out]
            print(f"python_bench: visit {i + 1} of {len(split)} ({rounds} rounds)", flush=True)
            subprocess.run(cmd + (["--no-overhead"] if i else []), check=True)
            with open(out) as f:
                docs.append(json.load(f))
    with open(a.out, "w") as f:
        json.dump(merge_visits(docs), f, indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="B1_H8_S2048_D128")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--min-time", type=float, default=0.5)
    ap.add_argument("--rounds", type=int, default=7,
                    help="alternating rounds of tandem, torch and the kernel call alone")
    ap.add_argument("--visits", type=int, default=1, choices=range(1, 65), metavar="V",
                    help="worker processes the rounds are split over, one after another")
    # a visit's share of --min-time, and whether it leaves the overhead to the first visit
    ap.add_argument("--share", type=float, default=1.0, help=argparse.SUPPRESS)
    ap.add_argument("--no-overhead", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    if len(visit_rounds(a.rounds, a.visits)) > 1:
        run_visits(a, ["--shapes", a.shapes, "--threads", str(a.threads),
                       "--min-time", str(a.min_time)])
        return
    doc = {"versions": {"tandem": tandem.__version__, "torch": torch.__version__,
                        "numpy": np.__version__},
           "simd_target": tandem.simd_target(),
           "overhead": None if a.no_overhead else overhead(max(a.min_time, 0.2)),
           "results": []}
    tandem.set_threads(a.threads)
    if a.threads:
        torch.set_num_threads(a.threads)
    doc["threads"] = torch.get_num_threads()
    for name in [s for s in a.shapes.split(",") if s]:
        B, H, S, D, causal = shape_of(name)
        torch.manual_seed(0)
        q, k, v = (torch.randn(B, H, S, D) for _ in range(3))
        fns = [lambda: tt.scaled_dot_product_attention(q, k, v, is_causal=causal),
               lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)]
        kernel = kernel_call(q, k, v, causal)
        times = alternate(fns + ([kernel] if kernel else []), a.min_time * a.share, a.rounds)
        ours, theirs = statistics.median(times[0]), statistics.median(times[1])
        doc["results"].append({"shape": name, "tandem_python_s": ours, "torch_sdpa_s": theirs,
                               "rounds": a.rounds, "tandem_python_rounds_s": times[0],
                               "torch_sdpa_rounds_s": times[1],
                               "kernel_rounds_s": times[2] if kernel else None})
        print(f"python_bench: {name}: tandem {ours * 1e3:.2f} ms, torch SDPA {theirs * 1e3:.2f} ms"
              f" (medians of {a.rounds} alternating rounds)", flush=True)
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
