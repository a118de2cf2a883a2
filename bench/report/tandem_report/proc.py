# SPDX-License-Identifier: Apache-2.0
"""The report's progress log and the small subprocess helpers its stages share."""
import os
import subprocess

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
