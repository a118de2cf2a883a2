# SPDX-License-Identifier: Apache-2.0
"""The report's progress log and the small subprocess helpers its stages share."""
import os
import subprocess
import time

# The repository's root (bench/report/tandem_report/ is three levels below it).
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def log(msg):
    print(msg, flush=True)


def run_text(cmd, **kw):
    """The stripped standard output of `cmd`, or None when it fails or takes over a minute."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, **kw)
        return out.stdout.strip() if out.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def load_avg():
    """The (1, 5, 15)-minute load averages, or None where unknown."""
    try:
        return os.getloadavg()
    except OSError:
        return None


def busy_ticks(fields):
    """Busy clock ticks of one /proc/stat cpu line's counters (user ... steal, less idle and
    iowait)."""
    ticks = [int(x) for x in fields[:8]]
    return sum(ticks) - ticks[3] - (ticks[4] if len(ticks) > 4 else 0)


def cpu_sample():
    """(wall seconds, busy CPU seconds of the cores this process may run on, from /proc/stat;
    CPU seconds of this process and every child it has waited for), or None where /proc/stat
    is unreadable."""
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    busy = 0
    try:
        with open("/proc/stat") as f:
            for line in f:
                name, *fields = line.split()
                if name.startswith("cpu") and name[3:].isdigit() \
                        and (cpus is None or int(name[3:]) in cpus):
                    busy += busy_ticks(fields)
    except (OSError, ValueError):
        return None
    t = os.times()
    own = t.user + t.system + t.children_user + t.children_system
    return (time.time(), busy / os.sysconf("SC_CLK_TCK"), own)


def others_busy(before, after, cores):
    """The share of `cores` that work other than this run kept busy between two cpu_samples:
    (the machine's busy CPU seconds − this run's own) ÷ (wall seconds × cores); None where a
    sample is missing. The run's own load (its benchmarks, peers, Python) is left out."""
    if not before or not after or not cores or after[0] <= before[0]:
        return None
    machine = after[1] - before[1]
    own = after[2] - before[2]
    return max(0.0, machine - own) / ((after[0] - before[0]) * cores)
