# SPDX-License-Identifier: Apache-2.0
"""The machine the report ran on: CPU, caches, memory, SIMD flags, versions, commit."""
import datetime
import os
import platform
import re

from .proc import ROOT, run_text

LSCPU_KEYS = ("L2 cache", "L3 cache", "Hypervisor vendor", "Thread(s) per core", "CPU family",
              "Model", "CPU max MHz")
# What the CPU has, whether or not a tandem path uses it (none uses avx512_fp16 or AMX yet).
SIMD_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_fp16", "amx_bf16", "avx2",
              "fma", "sse4_2", "neon", "sve")


def cpuinfo_line(prefix):
    """The first line of /proc/cpuinfo starting with `prefix`, or ''."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(prefix):
                    return line
    except OSError:
        pass
    return ""


def dpkg_version(pkg):
    return run_text(["dpkg-query", "-W", "-f=${Version}", pkg])


def memory_gib():
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
        return round(kb / 2**20, 1)
    except (OSError, ValueError, IndexError):
        return None


def cpu_info(plan):
    """CPU model, cores, lscpu's cache and frequency lines, the SIMD flags, memory, kernel."""
    model = cpuinfo_line("model name")
    info = {"cpu_model": (model.split(":", 1)[1].strip() if model else None)
            or platform.processor() or "unknown",
            "cores": plan.get("cores")}
    lscpu = run_text(["lscpu"]) or ""
    for key in LSCPU_KEYS:
        m = re.search(rf"^{re.escape(key)}:\s*(.+)$", lscpu, re.M)
        if m:
            info[key] = m.group(1).strip()
    flags = cpuinfo_line("flags")
    info["simd_flags"] = " ".join(x for x in SIMD_FLAGS if re.search(rf"\b{x}\b", flags))
    gib = memory_gib()
    if gib is not None:
        info["memory_gib"] = gib
    info["kernel"] = platform.release()
    return info


def versions(plan):
    """tandem_bench's targets and build, the libraries, Python and its optional modules."""
    info = {"optimized_target": plan.get("optimized_target"),
            "forced_target": os.environ.get("TANDEM_TARGET") or None,
            "supported_targets": plan.get("optimized_supported_targets"),
            "roofline_target": plan.get("roofline_target"), "compiler": plan.get("compiler"),
            "highway": plan.get("highway_version"), "tandem": plan.get("tandem_version"),
            "google_benchmark": dpkg_version("libbenchmark-dev"),
            "openmp": dpkg_version("libgomp1"),
            "python": platform.python_version()}
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
    return info


def machine_info(plan, build):
    """Everything the report's Machine table shows, with the commit and the date."""
    info = {**cpu_info(plan), **versions(plan)}
    info["git_commit"] = run_text(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"])
    dirty = run_text(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"])
    info["git_dirty"] = bool(dirty)
    now = datetime.datetime.now(datetime.timezone.utc)
    info["date"] = now.strftime("%Y-%m-%d %H:%M UTC")
    info["build"] = build
    return info
