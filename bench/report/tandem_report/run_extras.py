# SPDX-License-Identifier: Apache-2.0
"""Runs tandem_accuracy (every backend's error against the reference in double) and
tandem through Python (bench/python/python_bench.py in the package's environment)."""
import json
import os
import subprocess

from .proc import ROOT, log, run_text
from .run_peers import VISITS


def run_accuracy(a, build, raw_dir):
    """tandem_accuracy's results document (raw/accuracy.json), or an error."""
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


def python_shapes(plan, preset):
    """The attention shapes tagged `peer` with S >= 1024 at the main thread count (in the
    quick preset, the first one)."""
    shapes = []
    for b in plan["benchmarks"]:
        if b["op"] == "attention_forward" and "peer" in b["tags"] \
                and b["threads"] == plan["threads"] and int(b["params"].get("Sq", 0)) >= 1024 \
                and b["shape"] not in shapes:
            shapes.append(b["shape"])
    return shapes[:1] if preset == "quick" else shapes


def run_python(a, plan, raw_dir):
    """tandem through Python (bench/python/python_bench.py) in the package's
    environment (.venv/, made by `make test`): the binding overhead and
    forward attention beside torch's SDPA at the attention shapes with S >= 1024
    (in the quick preset, the first one)."""
    venv_py = os.path.join(ROOT, a.python_venv, "bin", "python")
    if a.no_python:
        return {"disabled": True}
    if not os.path.exists(venv_py) or run_text([venv_py, "-c", "import tandem.torch"]) is None:
        log(f"report: no Python package environment ({a.python_venv}/ with tandem); "
            "`make test` creates it")
        return {"missing": True}
    shapes = python_shapes(plan, a.preset)
    out = os.path.join(raw_dir, "python.json")
    log(f"report: tandem through Python on {len(shapes)} shape(s)")
    min_time = a.min_time or (0.3 if a.preset == "quick" else 1.0)
    cmd = [venv_py, os.path.join(ROOT, "bench", "python", "python_bench.py"),
           "--shapes", ",".join(shapes), "--threads", str(plan["threads"]),
           "--min-time", str(min_time), "--rounds", str(5 if a.preset == "quick" else 9),
           "--visits", str(VISITS[a.preset]), "--out", out]
    try:
        subprocess.run(cmd, timeout=900)
        with open(out) as f:
            return json.load(f)
    except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError) as e:
        return {"error": str(e)}
