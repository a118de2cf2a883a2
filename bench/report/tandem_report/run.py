# SPDX-License-Identifier: Apache-2.0
"""Runs tandem_bench: the roofline probes first (their peaks are handed to every later
process), then every planned benchmark in a process of its own, so one failure cannot take
the rest down and every memory figure starts from a fresh process; prints progress."""
import json
import os
import re
import subprocess
import time

from .eta import Eta
from .fmt import fms, fmt_dur, fnum, fpct
from .proc import log
from .results import INVARIANCE_KINDS, STORED_KINDS, TIME_UNIT

# Minimum seconds per benchmark of each preset (when --min-time is not given).
MIN_TIME = {"quick": 0.05, "standard": 0.3, "full": 0.5}


# The roofline probes run again before an op group (op_group) once this many seconds have
# passed since they last ran (each round of probes takes several seconds).
PROBE_GAP = {"quick": 20.0, "standard": 45.0, "full": 60.0}


def op_group(op):
    """The op group the roofline is measured again before: attention_forward(_stored) and
    attention_backward(_saved, _dq, ...) apart, rope_forward and rope_backward together."""
    words = op.split("_")
    return "_".join(words[:2]) if words[0] in ("attention", "axial") else words[0]


def bench_args(a):
    """tandem_bench's flags for the report's options."""
    args = [f"--preset={a.preset}"]
    # the options passed through to tandem_bench when given
    for name in ("ops", "seqs", "dims", "threads", "scaling_threads", "backends", "min_time"):
        value = getattr(a, name)
        if value:
            args.append(f"--{name}={value}")
    return args


def name_filter(name):
    """A --benchmark_filter that selects the benchmark registered as `name` alone."""
    return "^" + re.escape(name).replace("\\/", "/") + "(/min_time:[0-9.]+)?/real_time$"


def run_one(exe, args, name, out_json, timeout):
    """Runs benchmark `name` alone: (its results, Google Benchmark's context, seconds)."""
    cmd = [exe, *args, f"--benchmark_filter={name_filter(name)}",
           f"--benchmark_out={out_json}", "--benchmark_out_format=json"]
    t0 = time.time()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        rc, tail = proc.returncode, (proc.stderr or "")[-400:]
    except subprocess.TimeoutExpired:
        rc, tail = "timeout", f"stopped after {timeout:.0f} s"
    dt = time.time() - t0
    results, context = [], {}
    if os.path.exists(out_json):
        try:
            with open(out_json) as f:
                doc = json.load(f)
            results = doc.get("benchmarks", [])
            context = doc.get("context", {})
        except (OSError, json.JSONDecodeError):
            pass
        os.remove(out_json)
    if not results:
        why = (f"tandem_bench exited with {rc}: {tail.strip()}" if rc != 0
               else "tandem_bench produced no result")
        results = [{"name": name, "error_occurred": True, "error_message": why}]
    return results, context, dt


def log_result(r, spec):
    """The progress line of one benchmark's result."""
    if r.get("error_occurred"):
        log(f"      failed: {r.get('error_message', '')[:200]}")
    elif "real_time" in r:
        unit = TIME_UNIT[r.get("time_unit", "ns")]
        if "invariance" in spec["tags"]:
            kinds = [k for k in INVARIANCE_KINDS[1:] if f"{k}_cost_median" in r]
            rate = "÷ default (median of paired ratios): " + ", ".join(
                f"{k} {r[k + '_cost_median']:.3f}×" for k in kinds)
        elif "stored" in spec["tags"]:
            kinds = [k for k in STORED_KINDS if f"{k}_median_speedup" in r]
            rate = "vs f32 (median of paired ratios): " + ", ".join(
                f"{k} {r[k + '_median_speedup']:.2f}×" for k in kinds[1:])
        elif "median_speedup" in r:  # two calls in turn (bench_paired.hpp)
            rate = (f"paired ratio {r['median_speedup']:.2f}× ({r['speedup_p25']:.2f}–"
                    f"{r['speedup_p75']:.2f}) over {int(r.get('paired_iterations', 0))} rounds")
        elif "GFLOP/s" in r and not spec["op"].startswith("decode"):
            rate = f"{fnum(r['GFLOP/s'])} GFLOP/s = {fpct(r.get('frac_peak'))} of peak"
        else:
            rate = f"{fnum(r.get('GB/s'))} GB/s = {fpct(r.get('frac_copy'))} of copy"
        mem = f", +{fnum(r['extra_MiB'])} MiB" if r.get("extra_MiB", -1) >= 0 else ""
        log(f"      {fms(r['real_time'] * unit)}, {rate}{mem}")


def run_roofline(exe, args, roof, tmp, when, done, total):
    """Runs the roofline probes, each result tagged with `when` (start, end)."""
    results, context = [], {}
    for i, s in enumerate(roof):
        label = f"{when} of the run" if when in ("start", "end") else when
        log(f"[{done + i + 1:3d}/{total}] {s['name']} ({label})")
        got, ctx, _ = run_one(exe, args, s["name"], tmp, 300)
        context = context or ctx
        for r in got:
            r["_spec"] = s
            r["_when"] = when
            results.append(r)
            if r.get("error_occurred"):
                log(f"      failed: {r.get('error_message', '')[:200]}")
            elif "GFLOP/s" in r:
                log(f"      {fnum(r['GFLOP/s'])} GFLOP/s "
                    f"({fnum(r.get('GFLOP/s_wall'))} by the wall clock)")
            elif "GB/s" in r:
                log(f"      {fnum(r['GB/s'])} GB/s")
    return results, context


def measured_peaks(roofline_results):
    """{threads: (FMA GFLOP/s, copy GB/s, read GB/s)} of the probes that gave both the FMA
    peak and the copy bandwidth."""
    peaks = {}
    for r in roofline_results:
        t, op = r["_spec"]["threads"], r["_spec"]["op"]
        g, c, rd = peaks.get(t, (None, None, None))
        g = r.get("GFLOP/s", g) if op == "roofline_fma" else g
        c = r.get("GB/s", c) if op == "roofline_copy" else c
        rd = r.get("GB/s", rd) if op == "roofline_read" else rd
        peaks[t] = (g, c, rd)
    return {t: v for t, v in peaks.items() if v[0] and v[1]}


def roofline_flag(peaks):
    """tandem_bench's --roofline flag handing it `peaks` (no probe in later processes)."""
    return "--roofline=" + ",".join(f"{t}:{g:.6g}:{c:.6g}" + (f":{rd:.6g}" if rd else "")
                                    for t, (g, c, rd) in sorted(peaks.items()))


def run_benchmarks(a, exe, plan, raw_dir):
    """Every planned benchmark, the roofline first: (results, Google Benchmark's context)."""
    args = bench_args(a)
    specs = plan["benchmarks"]
    roof = [s for s in specs if s["op"].startswith("roofline")]
    rest = [s for s in specs if not s["op"].startswith("roofline")]
    start, total = time.time(), len(specs)
    log(f"report: {total} benchmarks to run ({len(roof)} roofline probes first)")
    tmp = os.path.join(raw_dir, ".one.json")
    results, context = run_roofline(exe, args, roof, tmp, "start", 0, total)
    peaks = measured_peaks(results)
    if peaks:
        args = args + [roofline_flag(peaks)]
    eta = Eta(rest, a.min_time or MIN_TIME[a.preset], peaks)
    group, probed = None, time.time()
    for i, s in enumerate(rest):
        if op_group(s["op"]) != group and group is not None \
                and time.time() - probed >= PROBE_GAP[a.preset]:
            # the roofline again before a new op group (PROBE_GAP after the last probes):
            # the group's fractions divide by it
            again, _ = run_roofline(exe, bench_args(a), roof, tmp, f"before {s['op']}",
                                    len(roof) + i, total)
            results.extend(again)
            peaks = measured_peaks(again) or peaks
            args = bench_args(a) + ([roofline_flag(peaks)] if peaks else [])
            probed = time.time()
        group = op_group(s["op"])
        est = eta.guess(s)
        log(f"[{len(roof) + i + 1:3d}/{total}] {s['name']}  (elapsed "
            f"{fmt_dur(time.time() - start)}, about {fmt_dur(eta.remaining(rest[i:]))} left)")
        got, ctx, dt = run_one(exe, args, s["name"], tmp, max(180.0, 20 * est))
        context = context or ctx
        for r in got:
            r["_spec"] = s
            results.append(r)
            log_result(r, s)
        eta.learn(s, got[0] if got else None, dt, est)
    log(f"report: benchmarks done in {fmt_dur(time.time() - start)}")
    return results, context
