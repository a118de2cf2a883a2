#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""tandem's performance comparison report.

Runs tandem_bench (one process per benchmark, so one failure cannot take the
rest down and every memory figure starts from a fresh process), the peers
(where .venv-peers/ has them) and tandem_accuracy, then writes
report/report.md, report/report.html, report/*.png and the raw results
under report/raw/.

    make report                 # the default set (about 10 minutes on 2 cores)
    make report-quick           # the quick preset (CI: about 2 minutes)
    bench/report/report.py --build build --preset standard --ops attention_forward,decode \\
        --seqs 1024,2048 --threads 2 --scaling-threads 1,2 --peers torch

Every figure is a ratio within this one run: GFLOP/s and GB/s are divided by
the FMA peak, copy and read bandwidth that tandem_bench's roofline probe
measures just before their op group (it runs at the start, before each op
group and at the end: the report prints the probes' spread and warns when the
start and the end differ by more than 10 %), and speed-ups over peers are
medians of ratios paired round by round: tandem through Python and the peer
timed in alternation in the peer's process (four of them, minutes apart), with the
ratios' 10th and 90th percentiles; a target on such a ratio is decided only when
both lie on one side of it.
"""
import argparse
import json
import os
import sys
import time

from tandem_report import document, plots, targets
from tandem_report.fmt import fmt_dur
from tandem_report.machine import machine_info
from tandem_report.proc import ROOT, cpu_sample, load_avg, log, run_text
from tandem_report.results import Results
from tandem_report.profile import run_profiles
from tandem_report.run import (bench_args, measured_peaks, roofline_flag, run_benchmarks,
                               run_roofline)
from tandem_report.run_extras import run_accuracy, run_python
from tandem_report.run_peers import run_peers

OPS = ("attention_forward, attention_backward, attention_backward_saved, "
       "attention_backward_dq/dk/dv, attention_memory, decode, rope_forward, rope_backward, "
       "axial_rope_forward, axial_rope_backward, swiglu_forward, swiglu_backward, "
       "attention_block, attention_forward_stored, attention_backward_saved_stored, "
       "decode_stored (f32, bf16, f16[, int8, e4m3] in turn), "
       "invariance (the default and the batch-invariant order in turn), attention_features "
       "(packed, paged and flex-written features beside their plain forms), flex_backward, "
       "roofline")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build", help="CMake build directory (default %(default)s)")
    ap.add_argument("--out", default="report", help="output directory (default %(default)s)")
    ap.add_argument("--preset", default="standard", choices=("quick", "standard", "full"))
    ap.add_argument("--ops", help=f"comma-separated ops ({OPS}); default all")
    ap.add_argument("--seqs", help="attention sequence lengths, e.g. 1024,2048,4096")
    ap.add_argument("--dims", help="attention head widths, e.g. 64,128")
    ap.add_argument("--threads", help="threads of the optimized backend (default: every core)")
    ap.add_argument("--scaling-threads",
                    help="thread counts of the scaling runs (default 1,2,4,...,all)")
    ap.add_argument("--backends", help="reference,optimized (default both)")
    ap.add_argument("--min-time", type=float, help="minimum seconds per benchmark")
    ap.add_argument("--peers", help="torch,openvino,onnxruntime,jax,ggml (default) or none")
    ap.add_argument("--peer-budget", type=float,
                    help="seconds for all peers (default 600; quick 75)")
    ap.add_argument("--venv", default=".venv-peers", help="peer environment (default %(default)s)")
    ap.add_argument("--no-accuracy", action="store_true", help="skip tandem_accuracy")
    ap.add_argument("--python-venv", default=".venv",
                    help="environment with the tandem package, for tandem through Python "
                         "(default %(default)s)")
    ap.add_argument("--no-python", action="store_true", help="skip tandem through Python")
    ap.add_argument("--strict", action="store_true",
                    help="exit 1 when a tandem benchmark, the accuracy run or tandem timed "
                         "beside a peer failed (CI); a missing or failing peer never does")
    ap.add_argument("--tuning",
                    help="a tuning file of `tandem tune`: also time the default and tuned "
                         "geometry side by side (report/tuning.md)")
    ap.add_argument("--target",
                    help="a Highway target of this CPU (AVX3, AVX2, SSE4, SCALAR) for tandem in "
                         "every program of the run (TANDEM_TARGET): the AVX2 path on an AVX-512 "
                         "CPU, say; the peers keep their own")
    ap.add_argument("--from-raw", action="store_true",
                    help="only re-render report.md and the plots from OUT/raw/")
    a = ap.parse_args(argv)
    if a.ops and "roofline" not in a.ops.split(","):
        a.ops += ",roofline"  # fractions need the roofline
    return a


def in_root(path):
    return os.path.abspath(path if os.path.isabs(path) else os.path.join(ROOT, path))


def run_all(a, exe, build, raw_dir):
    """Runs every stage's programs: the document raw/run.json keeps, or None."""
    start = time.time()
    plan_text = run_text([exe, *bench_args(a), "--plan"])
    if not plan_text:
        log("report: tandem_bench --plan failed")
        return None
    plan = json.loads(plan_text)
    info = machine_info(plan, build)
    info["load_before"] = load_avg()
    info["cpu_before"] = cpu_sample()
    log(f"report: {info['cpu_model']}, {plan['cores']} cores, optimized target "
        f"{plan['optimized_target']}, preset {a.preset}, load average {info['load_before'][0]:.2f}")

    def elapsed():
        return fmt_dur(time.time() - start)

    log("report: step 1 of 4: tandem's benchmarks")
    bench, context = run_benchmarks(a, exe, plan, raw_dir)
    log(f"report: step 2 of 4: peers (elapsed {elapsed()})")
    peers = run_peers(a, plan, raw_dir)
    log(f"report: step 3 of 4: the roofline again, at the end of the run (elapsed {elapsed()})")
    roof = [s for s in plan["benchmarks"] if s["op"].startswith("roofline")]
    tmp = os.path.join(raw_dir, ".one.json")
    bench.extend(run_roofline(exe, bench_args(a), roof, tmp, "end", 0, len(roof))[0])
    log(f"report: step 4 of 4: accuracy, then tandem through Python (elapsed {elapsed()})")
    accuracy = {"results": []} if a.no_accuracy else run_accuracy(a, build, raw_dir)
    python = run_python(a, plan, raw_dir)
    info["load_after"] = load_avg()
    info["cpu_after"] = cpu_sample()
    info["benchmark_context"] = context
    run = {"preset": a.preset, "plan": plan, "info": info, "bench": bench, "peers": peers,
           "accuracy": accuracy, "python": python}
    # the benchmarks behind missed low-precision targets again, under perf
    res = Results.from_run(run)
    peaks = measured_peaks([r for r in bench if r.get("_when") == "start"])
    args = bench_args(a) + ([roofline_flag(peaks)] if peaks else [])
    run["profiles"] = run_profiles(exe, args, res, targets.evaluate(res), raw_dir)
    run["seconds"] = time.time() - start
    return run


def render(run, out_dir):
    """Plots, targets and the document of raw/run.json's `run`: the Results and Outcomes."""
    res = Results.from_run(run)
    made = plots.draw(res, out_dir)
    outcomes = targets.evaluate(res)
    document.write(res, outcomes, made, out_dir, run["preset"], run["seconds"])
    log("")
    log("Targets on this machine:")
    for o in outcomes:
        log(f"  [{o.status:12s}] {o.target}: {o.measured}")
    log(f"report: wrote {os.path.relpath(os.path.join(out_dir, 'report.md'), ROOT)} "
        f"(and report.html, plots, raw/)")
    return res, outcomes


def problems(a, res, run):
    """What fails a --strict run: a tandem benchmark or the accuracy run failed, or tandem
    failed where it is timed beside a peer (a missing peer never fails it)."""
    out = [f"benchmark {n} failed: {m[:200]}" for n, m in res.errors]
    beside = [r for r in (run.get("peers") or {}).get("results", []) if r.get("tandem_error")]
    if beside:
        out.append(f"tandem beside the peers failed on {len(beside)} measurement(s), e.g. "
                   f"{beside[0]['op']}/{beside[0]['shape']}: {beside[0]['tandem_error'][:200]}")
    acc = res.accuracy
    failed_case = any("error" in r for r in acc.get("results", []))
    if not a.no_accuracy and (acc.get("error") or failed_case):
        out.append("accuracy: " + (acc.get("error") or "a backend failed an accuracy case"))
    if not res.rows and not res.invariance:
        out.append("no benchmark produced a result")
    return out


def run_tuning(a, build, out_dir):
    """The default and a.tuning's geometry side by side (`tandem tune --compare`):
    writes OUT/tuning.md; returns 1 when the comparison could not run."""
    exe = os.path.join(build, "tools", "tandem")
    cmd = [exe, "tune", "--compare", in_root(a.tuning), "--seconds", "40"]
    if a.threads:
        cmd += ["--threads", str(a.threads)]
    text = run_text(cmd)
    if not text:
        log(f"report: {' '.join(cmd)} failed")
        return 1
    with open(os.path.join(out_dir, "tuning.md"), "w") as f:
        f.write("# Default and tuned geometry\n\n" + text)
    log(text)
    log(f"report: wrote {os.path.relpath(os.path.join(out_dir, 'tuning.md'), ROOT)}")
    return 0


def main():
    a = parse_args()
    build, out_dir = in_root(a.build), in_root(a.out)
    raw_dir = os.path.join(out_dir, "raw")
    os.makedirs(raw_dir, exist_ok=True)
    if a.from_raw:
        with open(os.path.join(raw_dir, "run.json")) as f:
            render(json.load(f), out_dir)
        return 0
    if a.target:
        os.environ["TANDEM_TARGET"] = a.target  # read by every tandem in the run's programs
    exe = os.path.join(build, "bench", "tandem_bench")
    if not os.path.exists(exe):
        log(f"report: {exe} is missing; build it with `make report` "
            f"(or cmake --build {a.build} --target tandem_report_programs)")
        return 1
    for old in os.listdir(out_dir):
        if old.endswith(".png") or old in ("report.md", "report.html"):
            os.remove(os.path.join(out_dir, old))
    run = run_all(a, exe, build, raw_dir)
    if run is None:
        return 1
    with open(os.path.join(raw_dir, "run.json"), "w") as f:
        json.dump(run, f, indent=1)
    res, _ = render(run, out_dir)
    found = problems(a, res, run)
    if a.tuning and run_tuning(a, build, out_dir):
        found.append("the tuning comparison failed")
    for p in found:
        log(f"report: {p}")
    return 1 if a.strict and found else 0


if __name__ == "__main__":
    sys.exit(main())
