# SPDX-License-Identifier: Apache-2.0
"""Runs the peers (bench/peers/peers.py in .venv-peers/) on the plan's benchmarks tagged
`peer`; a missing environment or library is reported, never a failure."""
import json
import os
import subprocess

from .proc import ROOT, log, run_text

ALL_PEERS = "torch,openvino,onnxruntime,jax,ggml"
# The one attention shape the quick preset measures the peers on.
QUICK_ATTENTION = {"B": 1, "H": 8, "Hkv": 8, "Sq": 2048, "Sk": 2048, "D": 128, "Dv": 128,
                   "causal": 0}


def is_quick_attention(b):
    return all(b["params"].get(k) == v for k, v in QUICK_ATTENTION.items())


# Ops whose peer compiles per shape (torch.compile of flex_attention: 5–30 s each on 2 cores)
# or builds a materialized graph: measured after every other op, so that the peer budget
# they spend never leaves the others unmeasured.
LAST_OPS = ("attention_features", "flex_backward")


def peer_plan(plan, preset):
    """The benchmarks the peers measure: every `peer` tag; in the quick preset
    only attention at S = 2048, D = 128 without mask at the main thread count
    and the first shape of every other op; LAST_OPS last."""
    out = []
    seen_ops = set()
    for b in plan["benchmarks"]:
        if "peer" not in b["tags"]:
            continue
        if preset == "quick":
            if b["threads"] != plan["threads"] or b["op"] in seen_ops:
                continue
            if b["op"] in ("attention_forward", "attention_backward") \
                    and not is_quick_attention(b):
                continue
        seen_ops.add(b["op"])
        out.append(b)
    out.sort(key=lambda b: b["op"] in LAST_OPS)  # stable: the plan's order otherwise
    return dict(plan, benchmarks=out)


def peer_python(a, wanted):
    """(The peers' Python, a note or None), or (None, the result to report) when there is
    no peer environment."""
    venv_py = os.path.join(ROOT, a.venv, "bin", "python")
    if os.path.exists(venv_py):
        return venv_py, None
    # Debian's python3-torch (older) where that is what is installed.
    if "torch" in wanted and run_text(["/usr/bin/python3", "-c", "import torch"]) is not None:
        note = "no .venv-peers/: peers from the system Python (Debian packages)"
        log(f"report: {note}")
        return "/usr/bin/python3", note
    log(f"report: no peer environment ({a.venv}/); create it with `make peers`")
    return None, {"missing": wanted, "versions": {}, "results": [], "no_venv": True}


# Alternating rounds of tandem and each peer (peers.py --rounds) per preset, taken in how
# many worker processes per peer (--visits: the quick preset's budget holds one), and the
# peers' time budget in seconds.
ROUNDS = {"quick": 5, "standard": 9, "full": 11}
VISITS = {"quick": 1, "standard": 4, "full": 4}
BUDGET = {"quick": 75, "standard": 600, "full": 600}


def tandem_path(a, raw_dir):
    """A directory holding only the tandem package of the Python package environment (a
    link to it), for the peers' Python to import tandem and time it beside each peer in the
    same process; None where that environment has no tandem."""
    venv_py = os.path.join(ROOT, a.python_venv, "bin", "python")
    if a.no_python or not os.path.exists(venv_py):
        return None
    pkg = run_text([venv_py, "-c", "import os, tandem; print(os.path.dirname(tandem.__file__))"])
    if not pkg:
        return None
    path = os.path.join(raw_dir, ".tandem-path")
    os.makedirs(path, exist_ok=True)
    link = os.path.join(path, "tandem")
    if os.path.lexists(link):
        os.remove(link)
    os.symlink(pkg, link)
    return path


def run_peers(a, plan, raw_dir):
    """The peers' results document (raw/peers.json), with what is missing."""
    peers_out = os.path.join(raw_dir, "peers.json")
    wanted = [p for p in (a.peers or ALL_PEERS).split(",") if p and p != "none"]
    if not wanted:
        return {"missing": [], "versions": {}, "results": [], "disabled": True}
    venv_py, note = peer_python(a, wanted)
    if venv_py is None:
        return note
    pp = peer_plan(plan, a.preset)
    plan_file = os.path.join(raw_dir, "peer-plan.json")
    with open(plan_file, "w") as f:
        json.dump(pp, f)
    budget = a.peer_budget or BUDGET[a.preset]
    log(f"report: peers on {len(pp['benchmarks'])} shape(s), at most {budget:.0f} s")
    cmd = [venv_py, os.path.join(ROOT, "bench", "peers", "peers.py"), "--plan", plan_file,
           "--out", peers_out, "--peers", ",".join(wanted),
           "--min-time", str(a.min_time or (0.05 if a.preset == "quick" else 0.3)),
           "--budget", str(budget), "--rounds", str(ROUNDS[a.preset]),
           "--visits", str(VISITS[a.preset])]
    env = dict(os.environ)
    path = tandem_path(a, raw_dir)
    if path:
        env["PYTHONPATH"] = path + os.pathsep + env.get("PYTHONPATH", "")
        log("report: tandem through Python is timed beside each peer, in alternating rounds")
    else:
        log("report: no tandem package for the peers' Python: peers timed alone, unpaired")
    try:
        subprocess.run(cmd, timeout=budget + 600, env=env)
    except subprocess.TimeoutExpired:
        log("report: the peer run overran its budget and was stopped")
    try:
        with open(peers_out) as f:
            doc = json.load(f)
        if note:
            doc["note"] = note
        return doc
    except (OSError, json.JSONDecodeError):
        return {"missing": wanted, "versions": {}, "results": [], "failed": True}
