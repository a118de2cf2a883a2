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
measures at the start of the same run (and again at its end: the report warns
when the two differ by more than 10 %), and speed-ups compare measurements
taken minutes apart on the same machine.
"""
import argparse
import datetime
import html
import json
import math
import os
import platform
import re
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

# ---------------------------------------------------------------------------
# Small helpers


def log(msg):
    print(msg, flush=True)


def fmt_dur(s):
    s = int(round(s))
    return f"{s // 60}:{s % 60:02d}"


def run_text(cmd, **kw):
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, **kw)
        return out.stdout.strip() if out.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def dpkg_version(pkg):
    return run_text(["dpkg-query", "-W", "-f=${Version}", pkg])


def load_avg():
    try:
        return os.getloadavg()
    except OSError:
        return None


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
    return "–" if x is None else f"{100 * x:.0f} %"


def fratio(x):
    return "–" if x is None else f"{x:.2f}×"


def fms(seconds):
    if seconds is None:
        return "–"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} µs"


# ---------------------------------------------------------------------------
# Machine description


def machine_info(plan, build):
    info = {}
    cpu = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info["cpu_model"] = cpu or platform.processor() or "unknown"
    info["cores"] = plan.get("cores")
    lscpu = run_text(["lscpu"]) or ""
    for key in ("L2 cache", "L3 cache", "Hypervisor vendor", "Thread(s) per core", "CPU family", "Model",
                "CPU max MHz"):
        m = re.search(rf"^{re.escape(key)}:\s*(.+)$", lscpu, re.M)
        if m:
            info[key] = m.group(1).strip()
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = line
                    break
    except OSError:
        pass
    info["simd_flags"] = " ".join(x for x in ("avx512f", "avx512bw", "avx512vl", "avx512_bf16",
                                              "avx2", "fma", "sse4_2", "neon", "sve")
                                  if re.search(rf"\b{x}\b", flags))
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
        info["memory_gib"] = round(kb / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    info["kernel"] = platform.release()
    info["optimized_target"] = plan.get("optimized_target")
    info["roofline_target"] = plan.get("roofline_target")
    info["compiler"] = plan.get("compiler")
    info["highway"] = plan.get("highway_version")
    info["tandem"] = plan.get("tandem_version")
    info["google_benchmark"] = dpkg_version("libbenchmark-dev")
    info["openmp"] = dpkg_version("libgomp1")
    info["python"] = platform.python_version()
    try:
        import numpy
        info["numpy"] = numpy.__version__
    except ImportError:
        pass
    try:
        import matplotlib
        info["matplotlib"] = matplotlib.__version__
    except ImportError:
        pass
    info["git_commit"] = run_text(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"])
    dirty = run_text(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"])
    info["git_dirty"] = bool(dirty)
    info["date"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    info["build"] = build
    return info


# ---------------------------------------------------------------------------
# Running tandem_bench


def bench_args(a):
    args = [f"--preset={a.preset}"]
    # the options passed through to tandem_bench when given
    for name in ("ops", "seqs", "dims", "threads", "scaling_threads", "backends", "min_time"):
        value = getattr(a, name)
        if value:
            args.append(f"--{name}={value}")
    return args


def name_filter(name):
    return "^" + re.escape(name).replace("\\/", "/") + "(/min_time:[0-9.]+)?/real_time$"


def run_one(exe, args, name, out_json, timeout):
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
        why = f"tandem_bench exited with {rc}: {tail.strip()}" if rc != 0 else "tandem_bench produced no result"
        results = [{"name": name, "error_occurred": True, "error_message": why}]
    return results, context, dt


class Eta:
    """Remaining-time estimate from each benchmark's work and the rates seen so far."""

    def __init__(self, specs, min_time, peaks):
        self.min_time = min_time
        self.peaks = peaks
        self.rate = {}  # (op kind, backend) -> measured GFLOP/s or GB/s
        self.specs = specs
        self.scale = 1.0
        self.spent_est = 0.0
        self.spent = 0.0

    def guess(self, s):
        p = s["params"]
        if s["op"].startswith("roofline"):
            return 3.0
        by_flop = "flop" in p and s["op"] != "decode"
        work = p.get("flop") if by_flop else p.get("bytes", 0)
        rate = self.rate.get((s["op"], s["backend"], s["threads"]))
        if rate is None:
            peak, copy = self.peaks.get(s["threads"], (100.0, 10.0, None))[:2]
            if s["backend"] == "reference":
                rate = 0.5e9 if by_flop else 1e9
            else:
                rate = (0.3 * peak if by_flop else 0.5 * copy) * 1e9
        call = (work or 0) / rate
        setup = 0.4 + 1e-9 * 4 * (p.get("io_bytes", 0) or 0)
        if "memory" in s["tags"]:
            return setup + call  # one timed call
        # process start and buffer set-up, the warm-up call, then min_time worth of calls
        return setup + call + max(self.min_time, call)

    def learn(self, s, result, seconds_taken, estimated):
        if result and not result.get("error_occurred"):
            key = (s["op"], s["backend"], s["threads"])
            by_flop = "flop" in s["params"] and s["op"] != "decode"
            rate = result.get("GFLOP/s") if by_flop else result.get("GB/s")
            if rate:
                # larger shapes run faster: keep the best rate seen for this op
                self.rate[key] = max(self.rate.get(key, 0.0), rate * 1e9)
        self.spent += seconds_taken
        self.spent_est += estimated
        if self.spent_est > 0:
            self.scale = min(3.0, max(0.5, self.spent / self.spent_est))

    def remaining(self, rest):
        return self.scale * sum(self.guess(s) for s in rest)


def run_benchmarks(a, exe, plan, raw_dir):
    args = bench_args(a)
    specs = plan["benchmarks"]
    roof = [s for s in specs if s["op"].startswith("roofline")]
    rest = [s for s in specs if not s["op"].startswith("roofline")]
    results, context = [], {}
    start = time.time()
    total = len(specs)
    log(f"report: {total} benchmarks to run ({len(roof)} roofline probes first)")
    tmp = os.path.join(raw_dir, ".one.json")
    # Roofline first: its peaks are handed to every later process.
    got, context = run_roofline(exe, args, roof, tmp, "start", 0, total)
    results.extend(got)
    peaks = {}
    for r in got:
        t, op = r["_spec"]["threads"], r["_spec"]["op"]
        g, c, rd = peaks.get(t, (None, None, None))
        g = r.get("GFLOP/s", g) if op == "roofline_fma" else g
        c = r.get("GB/s", c) if op == "roofline_copy" else c
        rd = r.get("GB/s", rd) if op == "roofline_read" else rd
        peaks[t] = (g, c, rd)
    complete = {t: v for t, v in peaks.items() if v[0] and v[1]}
    if complete:
        args = args + ["--roofline=" + ",".join(
            f"{t}:{g:.6g}:{c:.6g}" + (f":{rd:.6g}" if rd else "") for t, (g, c, rd) in sorted(complete.items()))]
    eta = Eta(rest, a.min_time or {"quick": 0.05, "standard": 0.3, "full": 0.5}[a.preset], complete)
    for i, s in enumerate(rest):
        est = eta.guess(s)
        left = eta.remaining(rest[i:])
        log(f"[{len(roof) + i + 1:3d}/{total}] {s['name']}  "
            f"(elapsed {fmt_dur(time.time() - start)}, about {fmt_dur(left)} left)")
        got, ctx, dt = run_one(exe, args, s["name"], tmp, max(180.0, 20 * est))
        context = context or ctx
        for r in got:
            r["_spec"] = s
            results.append(r)
            if r.get("error_occurred"):
                log(f"      failed: {r.get('error_message', '')[:200]}")
            elif "real_time" in r:
                unit = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}[r.get("time_unit", "ns")]
                if "GFLOP/s" in r and s["op"] != "decode":
                    rate = f"{fnum(r['GFLOP/s'])} GFLOP/s = {fpct(r.get('frac_peak'))} of peak"
                else:
                    rate = f"{fnum(r.get('GB/s'))} GB/s = {fpct(r.get('frac_copy'))} of copy"
                mem = f", +{fnum(r['extra_MiB'])} MiB" if r.get("extra_MiB", -1) >= 0 else ""
                log(f"      {fms(r['real_time'] * unit)}, {rate}{mem}")
        eta.learn(s, got[0] if got else None, dt, est)
    log(f"report: benchmarks done in {fmt_dur(time.time() - start)}")
    return results, context


def run_roofline(exe, args, roof, tmp, when, done, total):
    """Runs the roofline probes, each result tagged with `when` (start, end)."""
    results, context = [], {}
    for i, s in enumerate(roof):
        log(f"[{done + i + 1:3d}/{total}] {s['name']} ({when} of the run)")
        got, ctx, _ = run_one(exe, args, s["name"], tmp, 300)
        context = context or ctx
        for r in got:
            r["_spec"] = s
            r["_when"] = when
            results.append(r)
            if r.get("error_occurred"):
                log(f"      failed: {r.get('error_message', '')[:200]}")
            elif "GFLOP/s" in r:
                log(f"      {fnum(r['GFLOP/s'])} GFLOP/s ({fnum(r.get('GFLOP/s_wall'))} by the wall clock)")
            elif "GB/s" in r:
                log(f"      {fnum(r['GB/s'])} GB/s")
    return results, context


# ---------------------------------------------------------------------------
# Peers and accuracy


def peer_plan(plan, preset):
    """The benchmarks the peers measure: every `peer` tag; in the quick preset
    only attention at S = 2048, D = 128 without mask at the main thread count
    and the first shape of every other op."""
    out = []
    seen_ops = set()
    for b in plan["benchmarks"]:
        if "peer" not in b["tags"]:
            continue
        if preset == "quick":
            if b["threads"] != plan["threads"] or b["op"] in seen_ops:
                continue
            if b["op"] in ("attention_forward", "attention_backward") and b["shape"] != "B1_H8_S2048_D128":
                continue
        seen_ops.add(b["op"])
        out.append(b)
    return dict(plan, benchmarks=out)


def run_peers(a, plan, raw_dir):
    venv_py = os.path.join(ROOT, a.venv, "bin", "python")
    peers_out = os.path.join(raw_dir, "peers.json")
    wanted = [p for p in (a.peers or "torch,openvino,onnxruntime,jax,ggml").split(",") if p and p != "none"]
    if not wanted:
        return {"missing": [], "versions": {}, "results": [], "disabled": True}
    system_note = None
    if not os.path.exists(venv_py):
        # Debian's python3-torch (older) where that is what is installed.
        if "torch" in wanted and run_text(["/usr/bin/python3", "-c", "import torch"]) is not None:
            venv_py = "/usr/bin/python3"
            system_note = "no .venv-peers/: peers from the system Python (Debian packages)"
            log(f"report: {system_note}")
        else:
            log(f"report: no peer environment ({a.venv}/); create it with `make peers`")
            return {"missing": wanted, "versions": {}, "results": [], "no_venv": True}
    pp = peer_plan(plan, a.preset)
    plan_file = os.path.join(raw_dir, "peer-plan.json")
    with open(plan_file, "w") as f:
        json.dump(pp, f)
    n = len(pp["benchmarks"])
    budget = a.peer_budget or (75 if a.preset == "quick" else 420)
    log(f"report: peers on {n} shape(s), at most {budget:.0f} s")
    cmd = [venv_py, os.path.join(ROOT, "bench", "peers", "peers.py"), "--plan", plan_file,
           "--out", peers_out, "--peers", ",".join(wanted),
           "--min-time", str(a.min_time or (0.05 if a.preset == "quick" else 0.3)),
           "--budget", str(budget)]
    try:
        subprocess.run(cmd, timeout=budget + 600)
    except subprocess.TimeoutExpired:
        log("report: the peer run overran its budget and was stopped")
    try:
        with open(peers_out) as f:
            doc = json.load(f)
        if system_note:
            doc["note"] = system_note
        return doc
    except (OSError, json.JSONDecodeError):
        return {"missing": wanted, "versions": {}, "results": [], "failed": True}


def run_accuracy(a, build, raw_dir):
    exe = os.path.join(build, "bench", "tandem_accuracy")
    out = os.path.join(raw_dir, "accuracy.json")
    if not os.path.exists(exe):
        return {"results": [], "error": f"{exe} not built"}
    log("report: errors against the reference in double (tandem_accuracy)")
    cmd = [exe, f"--out={out}"]
    if a.preset == "quick":
        cmd.append("--quick")
    if a.threads:
        cmd.append(f"--threads={a.threads}")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            return {"results": [], "error": proc.stderr[-400:]}
        with open(out) as f:
            return json.load(f)
    except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError) as e:
        return {"results": [], "error": str(e)}


def run_python(a, plan, raw_dir):
    """tandem through Python (bench/python/python_bench.py) in the package's
    environment (.venv/, made by `make test`): the binding overhead and
    forward attention beside torch's SDPA at the attention shapes with S >= 1024
    (in the quick preset, the first one)."""
    venv_py = os.path.join(ROOT, a.python_venv, "bin", "python")
    if a.no_python:
        return {"disabled": True}
    if not os.path.exists(venv_py) or run_text([venv_py, "-c", "import tandem.torch"]) is None:
        log(f"report: no Python package environment ({a.python_venv}/ with tandem); `make test` creates it")
        return {"missing": True}
    shapes = []
    for b in plan["benchmarks"]:
        if b["op"] == "attention_forward" and "peer" in b["tags"] and b["threads"] == plan["threads"] \
                and int(b["params"].get("Sq", 0)) >= 1024 and b["shape"] not in shapes:
            shapes.append(b["shape"])
    if a.preset == "quick":
        shapes = shapes[:1]
    out = os.path.join(raw_dir, "python.json")
    log(f"report: tandem through Python on {len(shapes)} shape(s)")
    cmd = [venv_py, os.path.join(ROOT, "bench", "python", "python_bench.py"), "--shapes", ",".join(shapes),
           "--threads", str(plan["threads"]), "--min-time", str(a.min_time or (0.3 if a.preset == "quick" else 1.0)),
           "--out", out]
    try:
        subprocess.run(cmd, timeout=900)
        with open(out) as f:
            return json.load(f)
    except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError) as e:
        return {"error": str(e)}


# ---------------------------------------------------------------------------
# Analysis


class Data:
    def __init__(self, bench, peers, accuracy, info, plan, python=None):
        self.info, self.plan, self.accuracy = info, plan, accuracy
        self.python = python or {}
        self.peers_doc = peers
        self.rows = []  # tandem results
        self.errors = []
        self.peak = {}  # threads -> GFLOP/s, measured at the start of the run
        self.copy = {}  # threads -> GB/s
        self.read = {}
        self.peak_wall = {}
        self.end = {"peak": {}, "copy": {}, "read": {}}  # the same at the end of the run
        for r in bench:
            s = r.get("_spec", {})
            if r.get("error_occurred"):
                self.errors.append((r.get("name"), r.get("error_message", "")))
                continue
            if r.get("run_type", "iteration") != "iteration":
                continue
            unit = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}[r.get("time_unit", "ns")]
            row = {"name": r["name"], "op": s.get("op"), "backend": s.get("backend"),
                   "shape": s.get("shape"), "threads": s.get("threads", int(r.get("threads", 1))),
                   "params": s.get("params", {}), "tags": s.get("tags", []),
                   "seconds": r["real_time"] * unit,
                   "gflops": r.get("GFLOP/s"), "gbs": r.get("GB/s"),
                   "frac_peak": r.get("frac_peak"), "frac_copy": r.get("frac_copy"),
                   "frac_read": r.get("frac_read"),
                   "extra_mib": r.get("extra_MiB"), "iterations": r.get("iterations"),
                   "gflops_wall": r.get("GFLOP/s_wall")}
            if row["op"].startswith("roofline") and r.get("_when") == "end":
                kind = {"roofline_fma": "peak", "roofline_copy": "copy", "roofline_read": "read"}[row["op"]]
                self.end[kind][row["threads"]] = row["gflops"] if kind == "peak" else row["gbs"]
            elif row["op"] == "roofline_fma":
                self.peak[row["threads"]] = row["gflops"]
                self.peak_wall[row["threads"]] = row["gflops_wall"]
            elif row["op"] == "roofline_copy":
                self.copy[row["threads"]] = row["gbs"]
            elif row["op"] == "roofline_read":
                self.read[row["threads"]] = row["gbs"]
            else:
                self.rows.append(row)
        self.peer_rows = [p for p in peers.get("results", []) if "seconds" in p]
        self.peer_errors = [p for p in peers.get("results", []) if "error" in p]
        self.main_threads = plan.get("threads")

    def find(self, op, shape, backend="optimized", threads=None):
        threads = self.main_threads if threads is None else threads
        for r in self.rows:
            if r["op"] == op and r["shape"] == shape and r["backend"] == backend and r["threads"] == threads:
                return r
        return None

    def find_any_threads(self, op, shape, backend="reference"):
        for r in self.rows:
            if r["op"] == op and r["shape"] == shape and r["backend"] == backend:
                return r
        return None

    def peer(self, op, shape, peer, threads=None):
        threads = self.main_threads if threads is None else threads
        for p in self.peer_rows:
            if p["op"] == op and p["shape"] == shape and p["peer"] == peer and p["threads"] == threads:
                return p
        return None

    def roofline_drift(self):
        """[(kind, threads, start, end, end/start − 1)] for every roofline figure
        measured at both ends of the run, or None when the end was not measured."""
        out = []
        for kind, start in (("FMA peak", self.peak), ("copy", self.copy), ("read", self.read)):
            end = self.end[{"FMA peak": "peak", "copy": "copy", "read": "read"}[kind]]
            for t in sorted(set(start) & set(end)):
                if start[t] and end[t]:
                    out.append((kind, t, start[t], end[t], end[t] / start[t] - 1))
        return out or None

    def peer_names(self, op=None):
        names = []
        for p in self.peer_rows:
            if (op is None or p["op"] == op) and p["peer"] not in names:
                names.append(p["peer"])
        return names


# ---------------------------------------------------------------------------
# Targets


def evaluate_targets(d):
    """[(target, measured text, status)] with status met / not met / not measured."""
    T = []
    mt = d.main_threads

    def add(name, ok, measured):
        T.append((name, measured, "not measured" if ok is None else ("met" if ok else "not met")))

    def rows(op, pattern):
        return [r for r in d.rows if r["op"] == op and r["backend"] == "optimized" and r["threads"] == mt
                and re.fullmatch(pattern, r["shape"])]

    def worst_frac(name, need, found, key="frac_peak", what="of FMA peak"):
        if not found:
            add(name, None, "–")
            return
        w = min(found, key=lambda r: r[key] or 0)
        add(name, all((r[key] or 0) >= need for r in found),
            f"lowest {fpct(w[key])} ({w['shape']}); " + ", ".join(f"{r['shape']} {fpct(r[key])}" for r in found)
            + f" {what}")

    def seq(r):
        return int(r["params"].get("Sq", 0))

    # Dense forward against the FMA peak, S >= 2048.
    for D, need in ((128, 0.85), (64, 0.80)):
        found = [r for r in rows("attention_forward", rf"B1_H8_S\d+_D{D}") if seq(r) >= 2048]
        worst_frac(f"attention forward, no mask, D={D}, S ≥ 2048: ≥ {need * 100:.0f} % of FMA peak", need, found)
    # Dense forward against the peers on every report shape.
    dense = [r for r in rows("attention_forward", r"B1_H8_S\d+_D(64|128)") if 1024 <= seq(r) <= 4096]
    for peers, need in ((("openvino_sdpa",), 1.10), (("onnxruntime_attention",), 1.25), (("torch_sdpa",), 2.0),
                        (("ggml_fa_f32", "ggml_fa_f16"), 2.5)):
        ratios = []
        for r in dense:
            times = [p["seconds"] for p in (d.peer("attention_forward", r["shape"], x) for x in peers) if p]
            if times:
                ratios.append((min(times) / r["seconds"], r["shape"]))
        label = " / ".join(peers)
        what = (f"attention forward, no mask, D=64/128, S=1024–4096: ≥ {need:g}× faster than {label}"
                + (" (the faster of the two)" if len(peers) > 1 else ""))
        if not ratios:
            add(what, None, "–")
        else:
            lo = min(ratios)
            add(what, lo[0] >= need and len(ratios) == len(dense),
                f"lowest {lo[0]:.2f}× ({lo[1]}); " + ", ".join(f"{sh} {x:.2f}×" for x, sh in sorted(ratios, key=lambda t: t[1]))
                + ("" if len(ratios) == len(dense) else f" ({len(dense) - len(ratios)} shape(s) without the peer)"))
    # Short sequences.
    for S, need in ((512, 0.65), (256, 0.50)):
        worst_frac(f"attention forward, no mask, S={S} (D=64 and 128): ≥ {need * 100:.0f} % of FMA peak", need,
                   rows("attention_forward", rf"B1_H8_S{S}_D(64|128)"))
    # Decode against the read bandwidth and the peers.
    dec = rows("decode", r"B\d+_H32_Hkv8_Sq1_Sk\d+_D128")
    worst_frac("decode (Sq=1, H=32, Hkv=8, D=128, B=1–8, Sk=1k–32k): ≥ 80 % of the read bandwidth", 0.80, dec,
               key="frac_read", what=f"of read ({fnum(d.read.get(mt))} GB/s)")
    for peer, need in (("torch_eager", 2.0), ("torch_sdpa", 4.0)):
        ratios = [(p["seconds"] / r["seconds"], r["shape"]) for r in dec for p in [d.peer("decode", r["shape"], peer)] if p]
        name = f"decode: ≥ {need:g}× faster than PyTorch {peer.split('_')[1]}"
        if not ratios:
            add(name, None, "–")
        else:
            lo = min(ratios)
            add(name, lo[0] >= need, f"lowest {lo[0]:.2f}× ({lo[1]}); "
                + ", ".join(f"{sh} {x:.2f}×" for x, sh in sorted(ratios, key=lambda t: t[1])))
    # Backward.
    for op, label, need in (("attention_backward", "rerunning the forward", 0.65),
                            ("attention_backward_saved", "from the saved state", 0.80)):
        r = d.find(op, "B1_H8_S2048_D128")
        add(f"attention backward {label} (S=2048, D=128; FLOPs = 2.5× forward): ≥ {need * 100:.0f} % of FMA peak",
            None if not r else r["frac_peak"] >= need,
            "–" if not r else f"{fpct(r['frac_peak'])} ({fnum(r['gflops'])} GFLOP/s)")
    one = [x for x in (d.find(f"attention_backward_{g}", "B1_H8_S2048_D128") for g in ("dq", "dk", "dv")) if x]
    worst_frac("attention backward, dQ / dK / dV alone (S=2048, D=128): ≥ 55 % of FMA peak", 0.55, one)
    # Block, streaming, causal.
    blk = block_split(d)
    add("attention block projections (B=8, S=512, E=768, H=12): ≥ 75 % of FMA peak",
        None if not blk or blk.get("proj_frac") is None else blk["proj_frac"] >= 0.75,
        "–" if not blk else (f"projections ≈ {fpct(blk.get('proj_frac'))} (block − its attention), "
                             f"whole block {fpct(blk['block']['frac_peak'])}"))
    streaming = [r for r in d.rows if r["backend"] == "optimized" and "main" in r["tags"]
                 and r["op"].split("_")[0] in ("rope", "axial", "swiglu") and r["threads"] == mt]
    all_ops = {f"{o}_{x}" for o in ("rope", "axial_rope", "swiglu") for x in ("forward", "backward")}
    if streaming:
        worst = min(streaming, key=lambda r: r["frac_copy"])
        ok = all(r["frac_copy"] >= 0.85 for r in streaming)
        add("streaming ops (RoPE, axial RoPE, SwiGLU, forward and backward): ≥ 85 % of copy bandwidth",
            False if not ok else (True if all_ops <= {r["op"] for r in streaming} else None),
            f"lowest {worst['op']} {fpct(worst['frac_copy'])}; " +
            ", ".join(f"{r['op'].replace('_forward', ' fwd').replace('_backward', ' bwd')} {fpct(r['frac_copy'])}"
                      for r in streaming))
    else:
        add("streaming ops ≥ 85 % of copy bandwidth", None, "–")
    for D in (128, 64):
        a, c = d.find("attention_forward", f"B1_H8_S2048_D{D}"), d.find("attention_forward", f"B1_H8_S2048_D{D}_causal")
        ratio = c["seconds"] / a["seconds"] if a and c else None
        add(f"causal forward (S=2048, D={D}) ≤ 0.55× the unmasked time",
            None if ratio is None else ratio <= 0.55, "–" if ratio is None else f"{ratio:.2f}×")
    # ggml beside tandem on RoPE, SwiGLU and decode (measured, no target ratio).
    for op in ("rope_forward", "swiglu_forward", "decode"):
        for r in (rows(op, r".*") if op != "decode" else dec):
            for peer in ("ggml", "ggml_fa_f32", "ggml_fa_f16"):
                p = d.peer(op, r["shape"], peer)
                if p:
                    add(f"{op} {r['shape']} vs ggml ({peer}): faster", p["seconds"] >= r["seconds"],
                        f"{p['seconds'] / r['seconds']:.2f}× ({fms(r['seconds'])} vs {fms(p['seconds'])})")
    # Earlier targets, kept.
    for op, need in (("attention_forward", 4.0), ("attention_backward", 2.0)):
        shape = "B1_H8_S4096_D128_causal"
        p = d.peer(op, shape, "torch_sdpa")
        r = d.find("attention_backward_saved" if op == "attention_backward" else op, shape)
        sp = p["seconds"] / r["seconds"] if r and p else None
        what = "forward" if op == "attention_forward" else "backward (from the saved state)"
        add(f"{what} vs PyTorch SDPA at B=1 H=8 S=4096 D=128 causal: ≥ {need:g}× faster",
            None if sp is None else sp >= need,
            "–" if sp is None else f"{sp:.2f}× ({fms(r['seconds'])} vs {fms(p['seconds'])})")
    for op in ("attention_forward", "attention_backward"):
        r = d.find(op, "B1_H8_S16384_D128")
        add(f"{op.replace('attention_', '')} extra memory at S=16384, D=128 ≤ 64 MiB beyond inputs/outputs",
            None if not r or r["extra_mib"] is None or r["extra_mib"] < 0 else r["extra_mib"] <= 64,
            "–" if not r else f"{fnum(r['extra_mib'])} MiB (a materialized score matrix: "
                              f"{fnum(r['params'].get('scores_bytes', 0) / 2**20)} MiB)")
    for op in ("attention_forward", "attention_backward"):
        for shape in ("B1_H8_S2048_D128", "B1_H8_S2048_D128_causal"):
            one, two = d.find(op, shape, threads=1), d.find(op, shape, threads=2)
            sp = one["seconds"] / two["seconds"] if one and two else None
            add(f"{op.replace('attention_', '')} {shape}: 2 threads ≥ 1.8× 1 thread",
                None if sp is None else sp >= 1.8, "–" if sp is None else f"{sp:.2f}×")
    # The attention features against their plain equivalents (same run).
    pairs = feature_pairs(d)
    for what, label, need in (("varlen", "packed sequences: time per token ≤ 1.10× a dense batch of equal lengths",
                               1.10),
                              ("paged_decode", "paged decode: ≥ 90 % of the contiguous decode's bandwidth", 1 / 0.90)):
        found = [(sh, f, p) for sh, (f, p) in pairs.items() if sh.startswith(what)]
        if not found:
            add(label, None, "–")
            continue
        ratios = [(f["seconds"] / p["seconds"], sh) for sh, f, p in found]
        worst = max(ratios)
        shown = (lambda x: f"{1 / x:.0%} of contiguous") if what == "paged_decode" else (lambda x: f"{x:.2f}×")
        add(label, worst[0] <= need, f"worst {shown(worst[0])} ({worst[1]}); "
            + ", ".join(f"{sh} {shown(x)}" for x, sh in sorted(ratios, key=lambda t: t[1])))
    # The roofline itself: the figures above are trustworthy only if it held still.
    drift = d.roofline_drift()
    add("roofline measured at the start and at the end of the run: within 10 % of each other",
        None if drift is None else not any(abs(x[4]) > 0.10 for x in drift),
        "–" if drift is None else "; ".join(f"{k} t={t}: {fnum(a)} → {fnum(b)} ({x:+.0%})" for k, t, a, b, x in drift))
    return T


def block_split(d):
    blk = None
    for r in d.rows:
        if r["op"] == "attention_block" and r["backend"] == "optimized" and "main" in r["tags"] and r["threads"] == d.main_threads:
            blk = r
    if not blk:
        return None
    p = blk["params"]
    attn_shape = f"B{int(p['B'])}_H{int(p['H'])}_S{int(p['S'])}_D{int(p['D'])}"
    attn = d.find("attention_forward", attn_shape)
    out = {"block": blk, "attn": attn}
    if attn and blk["seconds"] > attn["seconds"]:
        t = blk["seconds"] - attn["seconds"]
        out["proj_gflops"] = p["proj_flop"] / t / 1e9
        peak = d.peak.get(d.main_threads)
        out["proj_frac"] = out["proj_gflops"] / peak if peak else None
    return out


# ---------------------------------------------------------------------------
# Plots


def plots(d, out_dir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    made = {}
    mt = d.main_threads
    colors = {"optimized": "C0", "optimized_saved": "C8", "reference": "C7", "torch_sdpa": "C1", "torch_eager": "C2",
              "openvino_sdpa": "C3", "onnxruntime_attention": "C4", "jax_dpa": "C5", "torch_mha": "C6",
              "ggml_fa_f32": "C9", "ggml_fa_f16": "k"}
    markers = {"optimized": "o", "optimized_saved": "*", "torch_sdpa": "s", "torch_eager": "^", "openvino_sdpa": "D",
               "onnxruntime_attention": "v", "jax_dpa": "P", "ggml_fa_f32": "X", "ggml_fa_f16": "x"}

    def series(op, D, causal, who):
        pts = []
        suffix = "_causal" if causal else ""
        ours = who in ("optimized", "optimized_saved")
        if who == "optimized_saved":
            op = "attention_backward_saved"
        for r in d.rows if ours else d.peer_rows:
            if r["op"] != op or r["threads"] != mt:
                continue
            if ours and r["backend"] != "optimized":
                continue
            if not ours and r["peer"] != who:
                continue
            m = re.fullmatch(rf"B1_H8_S(\d+)_D{D}{suffix}", r["shape"])
            if m:
                g = r.get("gflops") if ours else r.get("GFLOP/s")
                pts.append((int(m.group(1)), g))
        return sorted(pts)

    # 1. GFLOP/s against sequence length.
    for op in ("attention_forward", "attention_backward"):
        fig, axes = plt.subplots(2, 2, figsize=(11, 8), sharex=True)
        any_pts = False
        for i, D in enumerate((64, 128)):
            for j, causal in enumerate((False, True)):
                ax = axes[i][j]
                saved = ["optimized_saved"] if op == "attention_backward" else []
                for who in ["optimized"] + saved + d.peer_names(op):
                    pts = series(op, D, causal, who)
                    if pts:
                        any_pts = True
                        label = {"optimized": "tandem optimized",
                                 "optimized_saved": "tandem optimized, from the saved state"}.get(who, who)
                        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=markers.get(who, "x"),
                                color=colors.get(who), label=label)
                if d.peak.get(mt):
                    ax.axhline(d.peak[mt], color="k", ls="--", lw=0.8, label=f"FMA peak ({mt} threads)")
                ax.set_xscale("log", base=2)
                ax.set_title(f"D = {D}, {'causal' if causal else 'no mask'}")
                ax.set_ylim(bottom=0)
                ax.grid(alpha=0.3)
                if i == 1:
                    ax.set_xlabel("sequence length S (B=1, H=8)")
                if j == 0:
                    ax.set_ylabel("GFLOP/s")
        if any_pts:
            handles, labels = [], []
            for ax in axes.flat:
                for h, l in zip(*ax.get_legend_handles_labels()):
                    if l not in labels:
                        handles.append(h)
                        labels.append(l)
            fig.legend(handles, labels, loc="lower center", ncol=4)
            fig.suptitle(f"{op.replace('_', ' ')}: GFLOP/s against sequence length, {mt} threads"
                         + (" (backward = 2.5× forward FLOPs)" if op == "attention_backward" else ""))
            fig.tight_layout(rect=(0, 0.07, 1, 0.96))
            fn = f"{op}_gflops_vs_seq.png"
            fig.savefig(os.path.join(out_dir, fn), dpi=110)
            made[op] = fn
        plt.close(fig)

    # 2. Fraction of the roofline per op.
    bars = []
    for r in d.rows:
        if r["backend"] != "optimized" or r["threads"] != mt:
            continue
        if not ("main" in r["tags"] or "memory" in r["tags"]):
            continue
        frac = r["frac_peak"] if r["frac_copy"] is None else r["frac_copy"]
        if frac is None:
            continue
        if r["op"].startswith("attention_") and r["op"] != "attention_block":
            if not re.fullmatch(r"B1_H8_S2048_D(64|128)(_causal)?", r["shape"]):
                continue
        bars.append((f"{r['op']}\n{r['shape']}", frac, r["frac_copy"] is not None))
    if bars:
        fig, ax = plt.subplots(figsize=(11, max(4, 0.38 * len(bars) + 1)))
        y = list(range(len(bars)))
        ax.barh(y, [b[1] for b in bars], color=["C1" if b[2] else "C0" for b in bars])
        ax.set_yticks(y)
        ax.set_yticklabels([b[0].replace("\n", "  ") for b in bars], fontsize=8)
        ax.invert_yaxis()
        ax.axvline(1.0, color="k", lw=0.8)
        for yy, b in zip(y, bars):
            ax.text(b[1] + 0.01, yy, f"{b[1]:.0%}", va="center", fontsize=8)
        ax.set_xlabel("fraction of this machine's limit (blue: of FMA peak; orange: of copy bandwidth)")
        ax.set_title(f"tandem optimized against the roofline measured in this run ({mt} threads)")
        ax.set_xlim(0, max(1.1, max(b[1] for b in bars) + 0.1))
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "roofline_fraction.png"), dpi=110)
        made["roofline"] = "roofline_fraction.png"
        plt.close(fig)

    # 3. Thread scaling.
    fig, ax = plt.subplots(figsize=(8, 5.5))
    any_pts = False
    for op in ("attention_forward", "attention_backward"):
        for shape in ("B1_H8_S2048_D128", "B1_H8_S2048_D128_causal"):
            pts = sorted((r["threads"], r["seconds"]) for r in d.rows
                         if r["op"] == op and r["shape"] == shape and r["backend"] == "optimized")
            if len(pts) >= 2 and pts[0][0] == 1:
                any_pts = True
                ax.plot([p[0] for p in pts], [pts[0][1] / p[1] for p in pts], marker="o",
                        label=f"tandem {op.replace('attention_', '')} {shape.replace('B1_H8_S2048_D128', 'S2048 D128').replace('_', ' ')}")
            for peer in d.peer_names(op):
                pp = sorted((p["threads"], p["seconds"]) for p in d.peer_rows
                            if p["op"] == op and p["shape"] == shape and p["peer"] == peer)
                if len(pp) >= 2 and pp[0][0] == 1 and "causal" not in shape:
                    ax.plot([p[0] for p in pp], [pp[0][1] / p[1] for p in pp], marker="x", ls=":",
                            label=f"{peer} {op.replace('attention_', '')} {shape.replace('B1_H8_S2048_D128', 'S2048 D128').replace('_', ' ')}")
    if any_pts:
        top = max(d.plan.get("scaling_threads", [1, 2]) + [mt])
        ax.plot([1, top], [1, top], color="k", ls="--", lw=0.8, label="ideal")
        ax.set_xticks(sorted({r["threads"] for r in d.rows if r["op"].startswith("attention_")}))
        ax.set_xlabel("threads")
        ax.set_ylabel("speed-up over 1 thread")
        ax.set_title("Thread scaling, attention at B=1 H=8 S=2048 D=128")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "scaling.png"), dpi=110)
        made["scaling"] = "scaling.png"
    plt.close(fig)

    # 4. Extra memory against sequence length.
    fig, ax = plt.subplots(figsize=(8, 5.5))
    any_pts = False
    for op, mk, col in (("attention_forward", "o", "C0"), ("attention_backward", "s", "C9")):
        pts = sorted((int(r["params"]["Sq"]), r["extra_mib"]) for r in d.rows
                     if r["op"] == op and r["backend"] == "optimized" and r["threads"] == mt
                     and r["extra_mib"] is not None and r["extra_mib"] >= 0
                     and re.fullmatch(r"B1_H8_S\d+_D128", r["shape"]))
        if pts:
            any_pts = True
            ax.plot([p[0] for p in pts], [max(p[1], 1e-2) for p in pts], marker=mk, color=col,
                    label=f"tandem {op.replace('attention_', '')} (measured peak-RSS growth)")
    peer_pts = sorted((int(re.search(r"_S(\d+)_", p["shape"]).group(1)), p["extra_MiB"]) for p in d.peer_rows
                      if p["op"] == "attention_forward" and p.get("extra_MiB") is not None
                      and p["peer"] == "torch_eager" and p["threads"] == mt
                      and re.fullmatch(r"B1_H8_S\d+_D128", p["shape"]))
    if peer_pts:
        ax.plot([p[0] for p in peer_pts], [max(p[1], 1e-2) for p in peer_pts], marker="^", color="C2",
                label="torch eager forward (measured)")
    sdpa_pts = sorted((int(re.search(r"_S(\d+)_", p["shape"]).group(1)), p["extra_MiB"]) for p in d.peer_rows
                      if p["op"] == "attention_forward" and p.get("extra_MiB") is not None
                      and p["peer"] == "torch_sdpa" and p["threads"] == mt
                      and re.fullmatch(r"B1_H8_S\d+_D128", p["shape"]))
    if sdpa_pts:
        ax.plot([p[0] for p in sdpa_pts], [max(p[1], 1e-2) for p in sdpa_pts], marker="s", color="C1",
                label="torch SDPA forward (measured)")
    if any_pts:
        xs = sorted({int(r["params"]["Sq"]) for r in d.rows if r["op"].startswith("attention_")
                     and re.fullmatch(r"B1_H8_S\d+_D128", r["shape"])})
        ax.plot(xs, [8 * s * s * 4 / 2**20 for s in xs], "k--", lw=0.9,
                label="materialized scores, all heads: B·H·S²·4 bytes")
        ax.plot(xs, [s * s * 4 / 2**20 for s in xs], "k:", lw=0.9, label="one head's scores: S²·4 bytes")
        ax.axhline(64, color="C3", lw=0.8, label="target: 64 MiB")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length S (B=1, H=8, D=128, no mask)")
        ax.set_ylabel("extra memory beyond inputs and outputs (MiB)")
        ax.set_title("Memory a call needs")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "memory.png"), dpi=110)
        made["memory"] = "memory.png"
    plt.close(fig)

    # 5. Error against reference<double>.
    acc = [r for r in d.accuracy.get("results", []) if "outputs" in r]
    if acc:
        labels, vals = [], {}
        for r in acc:
            label = f"{r['op']} {r['shape']}"
            if label not in labels:
                labels.append(label)
            worst = max((o["rel_max"] for o in r["outputs"].values() if o.get("rel_max") is not None),
                        default=None)
            vals[(label, r["backend"])] = worst
        backends = sorted({r["backend"] for r in acc}, key=lambda b: (b != "reference", b))
        fig, ax = plt.subplots(figsize=(11, max(4, 0.3 * len(labels) + 1.5)))
        h = 0.8 / max(1, len(backends))
        floor = 1e-12
        for k, be in enumerate(backends):
            ys = [i + k * h for i in range(len(labels))]
            xs = [max(vals.get((l, be)) or floor, floor) for l in labels]
            ax.barh(ys, xs, height=h, label=be, color=colors.get(be, f"C{k}"))
            for yy, l in zip(ys, labels):
                v = vals.get((l, be))
                if v is not None and v < floor:
                    ax.text(floor * 1.5, yy, "0 (exact is this backend's own output)" if v == 0 else "< 1e-12",
                            va="center", fontsize=6)
        ax.set_xlim(left=floor)
        ax.set_yticks([i + 0.4 - h / 2 for i in range(len(labels))])
        ax.set_yticklabels(labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.axvline(2.0 ** -24, color="k", ls=":", lw=0.8, label="float32 unit roundoff 2⁻²⁴")
        ax.set_xlabel("max |got − exact| / max |exact|   (exact = reference in double)")
        ax.set_title("Error against the reference run in double")
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.09), ncol=3)
        ax.grid(alpha=0.3, axis="x")
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "accuracy.png"), dpi=110)
        made["accuracy"] = "accuracy.png"
        plt.close(fig)
    return made


# ---------------------------------------------------------------------------
# Report text


class Doc:
    """Blocks rendered to both Markdown and HTML."""

    def __init__(self):
        self.blocks = []

    def h(self, level, text):
        self.blocks.append(("h", level, text))

    def p(self, text):
        self.blocks.append(("p", text))

    def ul(self, items):
        self.blocks.append(("ul", items))

    def table(self, head, rows):
        self.blocks.append(("table", head, rows))

    def img(self, path, alt):
        self.blocks.append(("img", path, alt))

    def code(self, text):
        self.blocks.append(("code", text))

    def markdown(self):
        out = []
        for b in self.blocks:
            if b[0] == "h":
                out.append("#" * b[1] + " " + b[2])
            elif b[0] == "p":
                out.append(b[1])
            elif b[0] == "ul":
                out.append("\n".join(f"- {i}" for i in b[1]))
            elif b[0] == "table":
                out.append("| " + " | ".join(b[1]) + " |")
                out[-1] += "\n|" + "|".join("---" for _ in b[1]) + "|"
                for r in b[2]:
                    out[-1] += "\n| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |"
            elif b[0] == "img":
                out.append(f"![{b[2]}]({b[1]})")
            elif b[0] == "code":
                out.append("```\n" + b[1] + "\n```")
        return "\n\n".join(out) + "\n"

    def html(self):
        def inline(t):
            t = html.escape(t)
            t = re.sub(r"`([^`]+)`", r"<code>\1</code>", t)
            t = re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", t)
            return t
        out = ["<!doctype html><html><head><meta charset='utf-8'><title>tandem performance report</title>",
               "<style>body{font-family:sans-serif;max-width:1150px;margin:2em auto;padding:0 1em}"
               "table{border-collapse:collapse;margin:1em 0;font-size:90%}td,th{border:1px solid #ccc;"
               "padding:3px 7px;text-align:left}th{background:#f0f0f0}img{max-width:100%}"
               "code,pre{background:#f6f6f6}</style></head><body>"]
        for b in self.blocks:
            if b[0] == "h":
                out.append(f"<h{b[1]}>{inline(b[2])}</h{b[1]}>")
            elif b[0] == "p":
                out.append(f"<p>{inline(b[1])}</p>")
            elif b[0] == "ul":
                out.append("<ul>" + "".join(f"<li>{inline(i)}</li>" for i in b[1]) + "</ul>")
            elif b[0] == "table":
                out.append("<table><tr>" + "".join(f"<th>{inline(h)}</th>" for h in b[1]) + "</tr>" +
                           "".join("<tr>" + "".join(f"<td>{inline(str(c))}</td>" for c in r) + "</tr>"
                                   for r in b[2]) + "</table>")
            elif b[0] == "img":
                out.append(f"<p><img src='{html.escape(b[1])}' alt='{html.escape(b[2])}'></p>")
            elif b[0] == "code":
                out.append(f"<pre>{html.escape(b[1])}</pre>")
        out.append("</body></html>")
        return "\n".join(out)


# tandem's backward from the forward's saved state is compared with the
# peers' backward (which also starts from what their forward kept)
PEER_OP = {"attention_backward_saved": "attention_backward"}

OP_ORDER = ["attention_forward", "attention_backward", "attention_backward_saved", "attention_backward_dq", "attention_backward_dk",
            "attention_backward_dv", "decode", "rope_forward", "rope_backward", "axial_rope_forward",
            "axial_rope_backward", "swiglu_forward", "swiglu_backward", "attention_block"]


def feature_pairs(d):
    """{shape: (feature row, plain row)} of the attention_features benchmarks
    (optimized backend, the report's thread count)."""
    out = {}
    for r in d.rows:
        if r["op"] != "attention_features" or r["backend"] != "optimized" or r["threads"] != d.main_threads:
            continue
        side = 0 if "feature" in r["tags"] else 1
        out.setdefault(r["shape"], [None, None])[side] = r
    return {sh: tuple(v) for sh, v in out.items() if v[0] and v[1]}


def write_features_section(doc, d):
    """Each attention feature's time beside the same call without it."""
    pairs = feature_pairs(d)
    doc.h(2, "Attention features against plain attention")
    if not pairs:
        doc.p("Not measured (no `attention_features` results in this run).")
        return
    doc.p("Each pair measured in this run by the optimized backend: packed sequences (`cu_seqlens`) against a "
          "dense batch of the same sequences (the same tokens and FLOPs); a paged decode step (16-key blocks "
          "scattered over a pool by a block table) against the same step over contiguous caches (bytes of K and V "
          "per second, caches cycled so that K and V come from memory); ALiBi (the standard slopes) and sinks "
          "against the same shape without them. Ratio: the feature's time ÷ the plain call's.")
    rows = []
    for sh, (f, p) in sorted(pairs.items()):
        rate = (lambda r: f"{fnum(r['gbs'])} GB/s") if f.get("gbs") else (lambda r: f"{fnum(r['gflops'])} GFLOP/s")
        rows.append((sh, fms(f["seconds"]), fms(p["seconds"]), f"{f['seconds'] / p['seconds']:.2f}×",
                     rate(f), rate(p)))
    doc.table(["comparison", "with the feature", "plain", "ratio", "rate (feature)", "rate (plain)"], rows)


def write_python_section(doc, d):
    """tandem called from Python (tandem.torch.scaled_dot_product_attention)
    beside PyTorch's SDPA, and beside the same kernel measured in C++."""
    py = d.python
    doc.h(2, "tandem through Python")
    if py.get("disabled"):
        doc.p("Not measured (`--no-python`).")
        return
    if py.get("missing") or py.get("error"):
        doc.p("Not measured: " + (py.get("error") or "no `.venv/` with the tandem package; `make test` creates it."))
        return
    ov = py["overhead"]
    doc.p(f"In `.venv/` (tandem {py['versions']['tandem']}, torch {py['versions']['torch']}), "
          f"{py.get('threads')} thread(s). Per-call costs on a [1, 1, 1, 8] problem with one thread, where the "
          "kernel's work is negligible.")
    kernel = ov.get("kernel_call_s")
    if kernel is not None:
        doc.p(f"**Binding overhead: {(ov['torch_sdpa_tandem_s'] - kernel) * 1e6:.1f} µs per call** "
              "(`tandem.torch.scaled_dot_product_attention` minus the kernel call alone, which still pays the "
              "optimized backend's own fixed cost per call).")
    doc.table(["call", "time per call"], [
        ("`tandem.torch.scaled_dot_product_attention` (torch tensors)", f"{ov['torch_sdpa_tandem_s'] * 1e6:.1f} µs"),
        ("the kernel call alone (plan made and addresses taken beforehand)",
         f"{kernel * 1e6:.1f} µs" if kernel is not None else "–"),
        ("`tandem.attention` (NumPy arrays)", f"{ov['numpy_attention_s'] * 1e6:.1f} µs"),
        ("`tandem._ext.attention_forward` (the extension's DLPack entry, Params prepared)",
         f"{ov['extension_call_s'] * 1e6:.1f} µs"),
        ("`torch.nn.functional.scaled_dot_product_attention`, for scale", f"{ov['torch_sdpa_torch_s'] * 1e6:.1f} µs"),
    ])
    rows = []
    for r in py.get("results", []):
        cpp = d.find("attention_forward", r["shape"])
        t_py, t_torch = r["tandem_python_s"], r["torch_sdpa_s"]
        rows.append((r["shape"], fms(t_py), fms(cpp["seconds"]) if cpp else "–",
                     f"{(t_py / cpp['seconds'] - 1) * 100:+.1f} %" if cpp else "–", fms(t_torch),
                     fratio(t_torch / t_py), fratio(t_torch / cpp["seconds"]) if cpp else "–"))
    doc.p("Forward attention, float32 [B, H, S, D] tensors: tandem called through "
          "`tandem.torch.scaled_dot_product_attention`, the same kernel measured in C++ (`tandem_bench`, this "
          "run), and PyTorch's `F.scaled_dot_product_attention` in the same Python process. ×torch: torch's time "
          "÷ tandem's, through Python and in C++ (the C++ ratio uses the same torch time).")
    doc.table(["shape", "tandem via Python", "tandem in C++", "Python vs C++", "torch SDPA", "×torch (Python)",
               "×torch (C++)"], rows)


def write_report(d, made, out_dir, a, run_seconds):
    doc = Doc()
    info = d.info
    mt = d.main_threads
    doc.h(1, "tandem performance report")
    doc.p(f"{info.get('date')} · commit `{info.get('git_commit')}`{' (with local changes)' if info.get('git_dirty') else ''}"
          f" · preset `{a.preset}` · {mt} thread(s) · run took {fmt_dur(run_seconds)}")
    la0, la1 = info.get("load_before"), info.get("load_after")
    cores = info.get("cores") or 1
    if la0 and la1 and max(la0[0], la1[0]) > 0.5 * cores:
        doc.p(f"**Warning: the machine was busy** (1-minute load average {la0[0]:.1f} before, {la1[0]:.1f} after, "
              f"on {cores} cores): other work shared the cores, so figures are low and noisy; ratios within "
              f"the run are affected too. Re-run on a quiet machine for numbers to quote.")

    drift = d.roofline_drift()
    moved = [x for x in drift or [] if abs(x[4]) > 0.10]
    if moved:
        doc.p("**Warning: the roofline moved during the run** ("
              + "; ".join(f"{k} with {t} thread(s): {fnum(s0)} at the start, {fnum(s1)} at the end ({x:+.0%})"
                          for k, t, s0, s1, x in moved)
              + "): the machine's capacity changed under the measurements, so fractions of it are uncertain by "
                "as much. Re-run on a quiet machine for numbers to quote.")

    doc.h(2, "Summary: targets on this machine")
    targets = evaluate_targets(d)
    met = sum(1 for t in targets if t[2] == "met")
    notm = sum(1 for t in targets if t[2] == "not met")
    nm = sum(1 for t in targets if t[2] == "not measured")
    doc.p(f"**{met} met, {notm} not met, {nm} not measured** in this run"
          + (" (the quick preset leaves out the large shapes; `make report` measures them)" if nm and a.preset == "quick" else "")
          + ". Fractions are of the FMA peak and copy bandwidth measured at the start of this run.")
    doc.table(["target", "measured", "status"],
              [(t[0], t[1], {"met": "✓ met", "not met": "✗ **not met**", "not measured": "not measured"}[t[2]])
               for t in targets])

    doc.h(2, "Machine")
    doc.table(["", ""], [
        ("CPU", f"{info.get('cpu_model')} (family {info.get('CPU family', '?')}, model {info.get('Model', '?')}; "
                f"{info.get('cores')} cores available"
                f"{', max ' + info['CPU max MHz'] + ' MHz' if info.get('CPU max MHz') else ''}"
                f"{', ' + info['Hypervisor vendor'] + ' guest' if info.get('Hypervisor vendor') else ''})"),
        ("caches", f"L2 {info.get('L2 cache', '?')}, L3 {info.get('L3 cache', '?')}"),
        ("memory", f"{info.get('memory_gib', '?')} GiB"),
        ("SIMD", info.get("simd_flags") or "?"),
        ("Highway target chosen", f"optimized backend: **{info.get('optimized_target')}**; roofline probe: {info.get('roofline_target')}"),
        ("compiler", info.get("compiler")),
        ("libraries", f"Highway {info.get('highway')}, Google Benchmark {info.get('google_benchmark')}, "
                      f"libgomp {info.get('openmp')}, Python {info.get('python')}, numpy {info.get('numpy')}, "
                      f"matplotlib {info.get('matplotlib')}"),
        ("peers", ", ".join(f"{k} {v}" for k, v in (d.peers_doc.get("versions") or {}).items() if v) or "none"),
        ("kernel", info.get("kernel")),
        ("load average", f"{la0[0]:.2f} before, {la1[0]:.2f} after" if la0 and la1 else "?"),
    ])

    doc.h(2, "Roofline measured in this run")
    doc.p("FMA peak: 12 independent fp32 FMA chains per thread with the Highway target dynamic dispatch "
          "picks, best of three trials; each thread's FLOPs are divided by its own CPU time, so the peak is "
          "what the cores can do even if other processes share them (the wall-clock figure beside it drops "
          "when they do). Copy: two arrays of 256 MiB or twice the last-level cache, whichever is larger, bytes "
          "read + written, best of eight passes (wall clock). Read: one such array summed. All three again at the "
          "end of the run (last column).")
    doc.table(["threads", "FMA peak (GFLOP/s)", "FMA, wall clock", "copy (GB/s)", "read (GB/s)",
               "at the end: FMA, copy, read"],
              [(t, fnum(d.peak.get(t)), fnum(d.peak_wall.get(t)), fnum(d.copy.get(t)), fnum(d.read.get(t)),
                ", ".join(fnum(d.end[k].get(t)) for k in ("peak", "copy", "read")))
               for t in sorted(set(d.peak) | set(d.copy))])

    # Missing peers.
    pd = d.peers_doc
    missing = pd.get("missing") or []
    if pd.get("note"):
        doc.p(f"Peers: {pd['note']}.")
    if pd.get("disabled"):
        doc.p("Peers were not measured (`--peers none`).")
    elif missing:
        doc.p(f"**Peers not measured: {', '.join(missing)}** — "
              + ("no peer environment exists; " if pd.get("no_venv") else "not installed in `.venv-peers/`; ")
              + "create it with `make peers` (a `python3 -m venv` + pip install from PyPI; torch's Linux wheel brings "
                "several GiB of CUDA libraries) and run the report again.")

    write_features_section(doc, d)
    write_python_section(doc, d)

    doc.h(2, "Results per op")
    doc.p("Time is the mean wall time of one call. Fraction: of the FMA peak (GFLOP/s ops), of the read "
          "bandwidth (decode, which only reads) or of the copy bandwidth (other GB/s ops) at the same thread count. ×ref: the reference's time ÷ this time (same shape; "
          "the reference is measured at small shapes only and is single-threaded). ×peer: the peer's time ÷ "
          "tandem's time on the same shape and thread count (> 1: tandem is faster). Attention FLOPs: "
          "2·D + 2·Dv per visible (query, key) pair and head (causal counts only the visible pairs); "
          "backward = 2.5× forward. Streaming ops: bytes read + written. A fraction above 100 % means "
          "the data sat in cache (small shapes) or the limit was measured low (a busy machine).")
    peers_all = d.peer_names()
    for op in OP_ORDER + sorted({r["op"] for r in d.rows} - set(OP_ORDER)):
        rows = [r for r in d.rows if r["op"] == op]
        if not rows:
            continue
        pop = PEER_OP.get(op, op)
        peers = [p for p in peers_all if any(x["op"] == pop for x in d.peer_rows if x["peer"] == p)]
        doc.h(3, op)
        rate_col = "GB/s" if rows[0]["gbs"] is not None else "GFLOP/s"
        head = ["backend", "shape", "threads", "time", rate_col, "fraction", "×ref"] + [f"×{p}" for p in peers]
        if op in ("attention_forward", "attention_backward", "attention_backward_saved"):
            head.append("extra MiB")
        body = []
        for r in sorted(rows, key=lambda r: (r["backend"] != "optimized", "small" in r["tags"],
                                            r["threads"] != mt, r["params"].get("D", 0),
                                            r["params"].get("causal", 0), r["params"].get("Sq", 0), r["shape"])):
            ref = d.find_any_threads(op, r["shape"], "reference") if r["backend"] != "reference" else None
            rate = r["gbs"] if rate_col == "GB/s" else r["gflops"]
            frac = (r["frac_read"] if r.get("frac_read") is not None else r["frac_copy"]) if rate_col == "GB/s" \
                else r["frac_peak"]
            line = [r["backend"], r["shape"], r["threads"], fms(r["seconds"]), fnum(rate), fpct(frac),
                    fratio(ref["seconds"] / r["seconds"]) if ref else "–"]
            for p in peers:
                pr = d.peer(pop, r["shape"], p, r["threads"]) if r["backend"] == "optimized" else None
                line.append(fratio(pr["seconds"] / r["seconds"]) if pr else "–")
            if op in ("attention_forward", "attention_backward", "attention_backward_saved"):
                line.append(fnum(r["extra_mib"]) if r["extra_mib"] is not None and r["extra_mib"] >= 0 else "–")
            body.append(line)
        doc.table(head, body)
        prs = [p for p in d.peer_rows if p["op"] == op]
        if prs:
            notes = sorted({f"{p['peer']}: {p['note']}" for p in prs if p.get("note")})
            doc.p("Peer figures: " + "; ".join(
                f"{p['peer']} {p['shape']} t={p['threads']}: {fms(p['seconds'])}"
                + (f" ({fnum(p.get('GFLOP/s'))} GFLOP/s)" if p.get("GFLOP/s") and op != "decode"
                   else (f" ({fnum(p.get('GB/s'))} GB/s)" if p.get("GB/s") else ""))
                for p in prs) + ("." if not notes else ". Notes: " + "; ".join(notes) + "."))
        if op == "attention_block":
            blk = block_split(d)
            if blk and blk.get("proj_gflops"):
                doc.p(f"Block split: its attention alone (attention_forward/{blk['attn']['shape']}) takes "
                      f"{fms(blk['attn']['seconds'])} of the block's {fms(blk['block']['seconds'])}; the rest, "
                      f"{fms(blk['block']['seconds'] - blk['attn']['seconds'])}, is the projections (and the bias adds): "
                      f"{fnum(blk['proj_gflops'])} GFLOP/s = {fpct(blk.get('proj_frac'))} of peak.")

    doc.h(2, "Plots")
    captions = {
        "attention_forward": "Attention forward, GFLOP/s against sequence length, tandem and each peer.",
        "attention_backward": "Attention backward (dQ, dK, dV), GFLOP/s against sequence length.",
        "roofline": "Fraction of this machine's limits per op (attention at S=2048).",
        "scaling": "Speed-up from 1 thread to all.",
        "memory": "Extra memory of one call against sequence length, against a materialized score matrix.",
        "accuracy": "Error against the reference run in double, per op and backend.",
    }
    for key in ("attention_forward", "attention_backward", "roofline", "scaling", "memory", "accuracy"):
        if key in made:
            doc.h(3, captions[key])
            doc.img(made[key], captions[key])

    # Accuracy table.
    acc = d.accuracy.get("results", [])
    if acc:
        doc.h(2, "Error against the reference in double")
        doc.p("Same float32 inputs; exact = the reference templated at double (the attention block: the float "
              "reference, which keeps every intermediate in double). rel = max |got − exact| / max |exact| "
              "(worst output of the op).")
        body = []
        for r in acc:
            if "outputs" not in r:
                body.append((r["op"], r["shape"], r["backend"], "failed: " + r.get("error", "")[:80], "–"))
                continue
            worst = max(r["outputs"].items(), key=lambda kv: kv[1].get("rel_max") or 0)
            o = worst[1]
            body.append((r["op"], r["shape"], r["backend"],
                         f"{o['rel_max']:.2e} ({worst[0]})" if o.get("rel_max") is not None else "non-finite",
                         f"{o['max_abs']:.2e}" if o.get("max_abs") is not None else "–"))
        doc.table(["op", "shape", "backend", "rel", "max abs"], body)
    elif d.accuracy.get("error"):
        doc.p(f"Accuracy not measured: {d.accuracy['error']}")

    if d.errors or d.peer_errors:
        doc.h(2, "What failed or was skipped")
        doc.ul([f"`{n}`: {m[:300]}" for n, m in d.errors] +
               [f"peer {p.get('peer')} {p.get('op', '')} {p.get('shape', '')} t={p.get('threads')}: {p['error'][:300]}"
                for p in d.peer_errors])

    doc.h(2, "How this was measured")
    doc.ul([
        "tandem_bench (Google Benchmark) runs each benchmark in its own process, wall-clock time, buffers "
        "allocated, filled and first-touched once before timing and reused across iterations; a warm-up call "
        "precedes the timed ones.",
        "Extra memory: the growth of the peak RSS (reset through /proc/self/clear_refs) during the first call "
        "of a fresh process, after the inputs and outputs are resident.",
        "Decode reads K and V from memory: the benchmark cycles through enough caches (512 MiB together) that "
        "none stays in the last-level cache between its calls.",
        "Peers run in `.venv-peers/` with their CPU affinity and thread settings restricted to the same thread "
        "count, each library in its own process, on the same shapes (in each library's natural layout). Torch's "
        "backward is autograd's backward alone (the forward graph is built once and kept), so torch is not "
        "charged for the forward that tandem's backward recomputes; JAX's jitted vjp includes its forward.",
        "ggml (ggml-python's bindings to ggml's CPU backend) is measured beside the other peers: "
        "ggml_flash_attn_ext with f32 and with f16 K and V (prefill and decode), ggml_rope_ext and ggml_swiglu.",
        "The roofline is measured at the start of the run (every fraction divides by it) and again at its end.",
    ])
    doc.p("Reproduce:")
    doc.code("make peers          # once: the peer environment (.venv-peers/)\n"
             "make report         # the default set, report/report.md\n"
             "make report-quick   # the quick preset (CI)\n"
             "make report OPS=attention_forward,decode SEQS=1024,4096 THREADS=1 PEERS=torch")
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write(doc.markdown())
    with open(os.path.join(out_dir, "report.html"), "w") as f:
        f.write(doc.html())
    return targets


# ---------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build", help="CMake build directory (default %(default)s)")
    ap.add_argument("--out", default="report", help="output directory (default %(default)s)")
    ap.add_argument("--preset", default="standard", choices=("quick", "standard", "full"))
    ap.add_argument("--ops", help="comma-separated ops (attention_forward, attention_backward, attention_backward_saved, "
                                  "attention_backward_dq/dk/dv, attention_memory, decode, rope_forward, "
                                  "rope_backward, axial_rope_forward, axial_rope_backward, swiglu_forward, "
                                  "swiglu_backward, attention_block, roofline); default all")
    ap.add_argument("--seqs", help="attention sequence lengths, e.g. 1024,2048,4096")
    ap.add_argument("--dims", help="attention head widths, e.g. 64,128")
    ap.add_argument("--threads", help="threads of the optimized backend (default: every core)")
    ap.add_argument("--scaling-threads", help="thread counts of the scaling runs (default 1,2,4,...,all)")
    ap.add_argument("--backends", help="reference,optimized (default both)")
    ap.add_argument("--min-time", type=float, help="minimum seconds per benchmark")
    ap.add_argument("--peers", help="torch,openvino,onnxruntime,jax,ggml (default) or none")
    ap.add_argument("--peer-budget", type=float, help="seconds for all peers (default 420; quick 90)")
    ap.add_argument("--venv", default=".venv-peers", help="peer environment (default %(default)s)")
    ap.add_argument("--no-accuracy", action="store_true", help="skip tandem_accuracy")
    ap.add_argument("--python-venv", default=".venv",
                    help="environment with the tandem package, for tandem through Python (default %(default)s)")
    ap.add_argument("--no-python", action="store_true", help="skip tandem through Python")
    ap.add_argument("--strict", action="store_true",
                    help="exit 1 when a tandem benchmark or the accuracy run failed (CI); peers never fail a run")
    ap.add_argument("--from-raw", action="store_true",
                    help="only re-render report.md and the plots from OUT/raw/")
    a = ap.parse_args()
    if a.ops and "roofline" not in a.ops.split(","):
        a.ops += ",roofline"  # fractions need the roofline
    build = os.path.abspath(os.path.join(ROOT, a.build) if not os.path.isabs(a.build) else a.build)
    out_dir = os.path.abspath(os.path.join(ROOT, a.out) if not os.path.isabs(a.out) else a.out)
    raw_dir = os.path.join(out_dir, "raw")
    os.makedirs(raw_dir, exist_ok=True)

    if a.from_raw:
        with open(os.path.join(raw_dir, "run.json")) as f:
            run = json.load(f)
        a.preset = run["preset"]
        d = Data(run["bench"], run["peers"], run["accuracy"], run["info"], run["plan"], run.get("python"))
        made = plots(d, out_dir)
        targets = write_report(d, made, out_dir, a, run["seconds"])
        print_summary(targets, out_dir)
        return 0

    exe = os.path.join(build, "bench", "tandem_bench")
    if not os.path.exists(exe):
        log(f"report: {exe} is missing; build it with `make report` (or cmake --build {a.build} --target tandem_report_programs)")
        return 1
    for old in os.listdir(out_dir):
        if old.endswith(".png") or old in ("report.md", "report.html"):
            os.remove(os.path.join(out_dir, old))
    start = time.time()
    plan_text = run_text([exe, *bench_args(a), "--plan"])
    if not plan_text:
        log("report: tandem_bench --plan failed")
        return 1
    plan = json.loads(plan_text)
    info = machine_info(plan, build)
    info["load_before"] = load_avg()
    log(f"report: {info['cpu_model']}, {plan['cores']} cores, optimized target {plan['optimized_target']}, "
        f"preset {a.preset}, load average {info['load_before'][0]:.2f}")
    log("report: step 1 of 4: tandem's benchmarks")
    bench, context = run_benchmarks(a, exe, plan, raw_dir)
    log(f"report: step 2 of 4: peers (elapsed {fmt_dur(time.time() - start)})")
    peers = run_peers(a, plan, raw_dir)
    log(f"report: step 3 of 4: the roofline again, at the end of the run (elapsed {fmt_dur(time.time() - start)})")
    roof = [s for s in plan["benchmarks"] if s["op"].startswith("roofline")]
    end, _ = run_roofline(exe, bench_args(a), roof, os.path.join(raw_dir, ".one.json"), "end", 0, len(roof))
    bench.extend(end)
    log(f"report: step 4 of 4: accuracy, then tandem through Python (elapsed {fmt_dur(time.time() - start)})")
    accuracy = {"results": []} if a.no_accuracy else run_accuracy(a, build, raw_dir)
    python = run_python(a, plan, raw_dir)
    info["load_after"] = load_avg()
    info["benchmark_context"] = context
    seconds = time.time() - start
    with open(os.path.join(raw_dir, "run.json"), "w") as f:
        json.dump({"preset": a.preset, "plan": plan, "info": info, "bench": bench, "peers": peers,
                   "accuracy": accuracy, "python": python, "seconds": seconds}, f, indent=1)
    d = Data(bench, peers, accuracy, info, plan, python)
    made = plots(d, out_dir)
    targets = write_report(d, made, out_dir, a, seconds)
    print_summary(targets, out_dir)
    problems = [f"benchmark {n} failed: {m[:200]}" for n, m in d.errors]
    if not a.no_accuracy and (accuracy.get("error") or any("error" in r for r in accuracy.get("results", []))):
        problems.append("accuracy: " + (accuracy.get("error") or "a backend failed an accuracy case"))
    if not d.rows:
        problems.append("no benchmark produced a result")
    for p in problems:
        log(f"report: {p}")
    return 1 if a.strict and problems else 0


def print_summary(targets, out_dir):
    log("")
    log("Targets on this machine:")
    for name, measured, status in targets:
        log(f"  [{status:12s}] {name}: {measured}")
    log(f"report: wrote {os.path.relpath(os.path.join(out_dir, 'report.md'), ROOT)} "
        f"(and report.html, plots, raw/)")


if __name__ == "__main__":
    sys.exit(main())
