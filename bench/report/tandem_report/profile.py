# SPDX-License-Identifier: Apache-2.0
"""Where the time of a missed target goes: `perf record` of the benchmark behind it (the
outcome's `profile`), run again alone after the measurements, and the functions that took
the most samples. Only for the benchmarks of several storage types (tagged stored), whose
targets the low-precision kernels are still being tuned against."""
import os
import re
import subprocess

from .proc import log
from .run import name_filter

# Symbols of the benchmark's own set-up (filling its inputs), not of the kernels measured.
SETUP = re.compile(r"tandem::bench::|mersenne_twister|uniform_(int|real)_distribution|"
                   r"generate_canonical")
# "  41.20%  tandem_bench  [.] symbol" of `perf report --sort dso,symbol` (a call-graph
# recording adds "-  -" columns after it)
LINE = re.compile(r"^\s*([0-9.]+)%\s+(\S+)\s+\[[.k]\]\s+(.+?)(?:\s+-\s+-)?\s*$")


def short_symbol(sym):
    """A symbol without namespaces' noise and template arguments, with the storage types
    its arguments named: 'N_AVX3::Decode [bf16]'."""
    kinds = [k for k, pat in (("bf16", r"kBf16|bfloat16"), ("f16", r"kF16|(?<!b)float16"),
                              ("e4m3", r"e4m3"), ("int8", r"int8"))
             if re.search(pat, sym, re.IGNORECASE)]
    s = sym.replace("(anonymous namespace)::", "")
    while True:
        t = re.sub(r"<[^<>]*>", "", s)
        if t == s:
            break
        s = t
    s = re.sub(r"^tandem::(optimized::)?", "", s)
    return s + (f" [{', '.join(kinds)}]" if kinds else "")


def parse_report(text, top=6):
    """{'symbols': [(percent, short symbol)], 'setup': percent} of `perf report --stdio
    --sort dso,symbol`; a function without a symbol counts as its library."""
    shares, setup = {}, 0.0
    for line in text.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        pct, dso, sym = float(m.group(1)), m.group(2), m.group(3)
        if SETUP.search(sym):
            setup += pct
            continue
        name = f"{dso} (no symbols)" if sym.startswith("0x") else short_symbol(sym)
        shares[name] = shares.get(name, 0.0) + pct
    best = sorted(shares.items(), key=lambda kv: -kv[1])[:top]
    return {"symbols": [(round(p, 2), name) for name, p in best], "setup": round(setup, 2)}


def profile_one(exe, args, name, raw_dir):
    """The profile of benchmark `name` run alone under perf (or its error)."""
    data = os.path.join(raw_dir, ".perf.data")
    cmd = ["perf", "record", "-q", "-F", "499", "-o", data, "--", exe, *args,
           f"--benchmark_filter={name_filter(name)}"]
    try:
        rec = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if rec.returncode != 0 or not os.path.exists(data):
            return {"error": f"perf record exited with {rec.returncode}: "
                             f"{(rec.stderr or '').strip()[-200:]}"}
        rep = subprocess.run(["perf", "report", "-i", data, "--stdio", "--no-children",
                              "--sort", "dso,symbol"], capture_output=True, text=True, timeout=300)
        if rep.returncode != 0:
            return {"error": f"perf report exited with {rep.returncode}"}
        return parse_report(rep.stdout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"error": f"perf: {e}"}
    finally:
        if os.path.exists(data):
            os.remove(data)


def run_profiles(exe, args, res, outcomes, raw_dir):
    """{benchmark name: profile} of every stored benchmark behind a missed target."""
    stored = {s["name"] for s in res.plan.get("benchmarks", []) if "stored" in s["tags"]}
    names = []
    for o in outcomes:
        if o.status == "not met" and o.profile in stored and o.profile not in names:
            names.append(o.profile)
    profiles = {}
    for i, name in enumerate(names):
        log(f"report: profile {i + 1}/{len(names)} of a missed target: {name} under perf")
        profiles[name] = profile_one(exe, args, name, raw_dir)
    return profiles


def describe(profile, top=None):
    """One line of a profile: its (`top`) functions' shares of the samples."""
    if "error" in profile:
        return f"no profile ({profile['error']})"
    top = ", ".join(f"{p:.0f} % {s}" for p, s in profile["symbols"][:top])
    return f"{top} (input set-up {profile['setup']:.0f} %)"
