# SPDX-License-Identifier: Apache-2.0
"""Writes report.md and report.html: the run's header and warnings, the targets, the
machine, the roofline, the features, tandem through Python, the low-precision storage, the
cost of invariance, the results per op, the plots, the errors against the reference, what
failed and how it was measured."""
import os

from .analysis import feature_pairs, run_noise
from .paired import paired_ratios, visits_spread
from .proc import others_busy
from .doc import Doc
from .fmt import fms, fmt_dur, fnum, fpct, fratio
from .invariance import write_invariance
from .op_tables import write_op_tables
from .profile import describe

STATUS = {"met": "✓ met", "not met": "✗ **not met**",
          "not decided": "? not decided (spread straddles the target)",
          "not measured": "not measured"}


def write(res, outcomes, made, out_dir, preset, run_seconds):
    """Writes out_dir/report.md and report.html from Results `res`, the targets' Outcomes
    and the plots `made` ({key: file name})."""
    doc = Doc()
    write_header(doc, res, preset, run_seconds)
    write_summary(doc, outcomes, preset)
    write_machine(doc, res)
    write_roofline(doc, res)
    write_peers_note(doc, res.peers_doc)
    write_features(doc, res)
    write_python(doc, res)
    write_low_precision(doc, res)
    write_invariance(doc, res, machine_line(res.info))
    write_op_tables(doc, res)
    write_plots(doc, made)
    write_accuracy(doc, res.accuracy)
    write_failures(doc, res)
    write_method(doc)
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write(doc.markdown())
    with open(os.path.join(out_dir, "report.html"), "w") as f:
        f.write(doc.html())


def write_header(doc, res, preset, run_seconds):
    """The title, the run's date, commit and preset, and warnings on a busy machine and on a
    roofline that moved."""
    info = res.info
    doc.h(1, "tandem performance report")
    local = " (with local changes)" if info.get("git_dirty") else ""
    doc.p(f"{info.get('date')} · commit `{info.get('git_commit')}`{local}"
          f" · preset `{preset}` · {res.main_threads} thread(s) · run took {fmt_dur(run_seconds)}")
    write_noise(doc, res)
    cores = info.get("cores") or 1
    others = others_busy(info.get("cpu_before"), info.get("cpu_after"), cores)
    if others is not None and others > 0.25:
        doc.p(f"**Warning: the machine was busy**: work other than this run kept {others:.0%} "
              f"of the {cores} cores busy on average (/proc/stat's busy time less the run's "
              "own processes'), so figures are low and noisy; paired ratios less so than "
              "single figures. Re-run on a quiet machine for numbers to quote.")
    moved = [d for d in res.roofline.drift() or [] if abs(d.change) > 0.10]
    if moved:
        doc.p("**Warning: the roofline moved during the run** ("
              + "; ".join(f"{d.kind} with {d.threads} thread(s): {fnum(d.start)} at the start, "
                          f"{fnum(d.end)} at the end ({d.change:+.0%})" for d in moved)
              + "): the machine's capacity changed under the measurements, so fractions of it "
                "are uncertain by as much. Re-run on a quiet machine for numbers to quote.")


def write_noise(doc, res):
    """One line: how much repeated measurements of the same benchmark varied in this run, and
    how far the roofline probes spread."""
    noise = run_noise(res)
    parts = []
    if noise:
        parts.append(f"repeated rounds of the same benchmark spread by {noise.median:.1%} "
                     f"(interquartile range ÷ median; median over {noise.n} benchmarks, "
                     f"quartiles {noise.lo:.1%}–{noise.hi:.1%})")
    for (kind, t), (lo, hi, n) in sorted(res.roofline.spread().items()):
        if t == res.main_threads and n > 1:
            parts.append(f"{n} {kind} probes {fnum(lo)}–{fnum(hi)} ({hi / lo - 1:+.0%})")
    if parts:
        doc.p("**Noise in this run:** " + "; ".join(parts) + ".")


def write_summary(doc, outcomes, preset):
    doc.h(2, "Summary: targets on this machine")
    count = {s: sum(1 for o in outcomes if o.status == s) for s in STATUS}
    quick = count["not measured"] and preset == "quick"
    doc.p(f"**{count['met']} met, {count['not met']} not met, {count['not decided']} not "
          f"decided, {count['not measured']} not measured** in this run"
          + (" (the quick preset leaves out the large shapes; `make report` measures them)"
             if quick else "")
          + ". Fractions are of the FMA peak and copy bandwidth measured just before each "
            "op group; a target on one is met only when it also holds against the run's "
            "highest probe of that limit (work beside a probe only lowers it), not met when "
            "it fails against the nearest, else not decided. A speed-up over a peer is the median of ratios paired round by round "
            "(tandem through Python and the peer alternating in the peer's process; "
            + ("all rounds in one process" if preset == "quick" else
               "rounds taken in four visits, four processes minutes apart")
            + "), with its 10th–90th "
            "percentiles; a target on it is met or not met only when they lie on one side "
            "of it.")
    doc.table(["target", "measured", "status"],
              [(o.target, o.measured, STATUS[o.status]) for o in outcomes])


def cpu_line(info):
    mhz = f", max {info['CPU max MHz']} MHz" if info.get("CPU max MHz") else ""
    guest = f", {info['Hypervisor vendor']} guest" if info.get("Hypervisor vendor") else ""
    return (f"{info.get('cpu_model')} (family {info.get('CPU family', '?')}, model "
            f"{info.get('Model', '?')}; {info.get('cores')} cores available{mhz}{guest})")


def forced_note(info):
    """How the target was chosen, where TANDEM_TARGET (report.py --target) chose it."""
    forced = info.get("forced_target")
    return (f" (forced by TANDEM_TARGET={forced}, of {info.get('supported_targets') or '?'}; "
            "the peers keep their own)") if forced else ""


def machine_line(info):
    """The CPU, its SIMD flags and the Highway target of the optimized backend, in a line."""
    return (f"{cpu_line(info)}, SIMD {info.get('simd_flags') or '?'}, Highway target "
            f"{info.get('optimized_target')}{forced_note(info)}")


def write_machine(doc, res):
    info = res.info
    la0, la1 = info.get("load_before"), info.get("load_after")
    peers = (res.peers_doc.get("versions") or {}).items()
    doc.h(2, "Machine")
    doc.table(["", ""], [
        ("CPU", cpu_line(info)),
        ("caches", f"L2 {info.get('L2 cache', '?')}, L3 {info.get('L3 cache', '?')}"),
        ("memory", f"{info.get('memory_gib', '?')} GiB"),
        ("SIMD", info.get("simd_flags") or "?"),
        ("Highway target chosen", f"optimized backend: **{info.get('optimized_target')}**"
                                  f"{forced_note(info)}; roofline probe: "
                                  f"{info.get('roofline_target')}"),
        ("compiler", info.get("compiler")),
        ("libraries", f"Highway {info.get('highway')}, Google Benchmark "
                      f"{info.get('google_benchmark')}, libgomp {info.get('openmp')}, Python "
                      f"{info.get('python')}, numpy {info.get('numpy')}, matplotlib "
                      f"{info.get('matplotlib')}"),
        ("peers", ", ".join(f"{k} {v}" for k, v in peers if v) or "none"),
        ("kernel", info.get("kernel")),
        ("load average", f"{la0[0]:.2f} before, {la1[0]:.2f} after" if la0 and la1 else "?"),
    ])


def write_roofline(doc, res):
    roof = res.roofline
    doc.h(2, "Roofline measured in this run")
    doc.p("FMA peak: 12 independent fp32 FMA chains per thread with the Highway target dynamic "
          "dispatch picks, best of three trials; each thread's FLOPs are divided by its own CPU "
          "time, so the peak is what the cores can do even if other processes share them (the "
          "wall-clock figure beside it drops when they do). Copy: two arrays of 256 MiB or "
          "twice the last-level cache, whichever is larger, bytes read + written, best of eight "
          "passes (wall clock). Read: one such array summed. All three again at the end of the "
          "run (last column).")
    spread = roof.spread()

    def span(kind, t):
        lo, hi, n = spread.get((kind, t), (None, None, 0))
        return f"{fnum(lo)}–{fnum(hi)} ({n})" if n else "–"
    doc.table(["threads", "FMA peak (GFLOP/s)", "FMA, wall clock", "copy (GB/s)", "read (GB/s)",
               "at the end: FMA, copy, read", "every probe: FMA, copy, read (count)"],
              [(t, fnum(roof.peak.get(t)), fnum(roof.peak_wall.get(t)), fnum(roof.copy.get(t)),
                fnum(roof.read.get(t)),
                ", ".join(fnum(roof.end[k].get(t)) for k in ("peak", "copy", "read")),
                "; ".join(span(k, t) for k in ("peak", "copy", "read")))
               for t in sorted(set(roof.peak) | set(roof.copy))])
    doc.p("The probes run at the start, again before each op group and at the end; each "
          "group's fractions divide by the probe run just before it (the last column gives "
          "the range over all of them).")


def write_peers_note(doc, pd):
    """Where the peers came from, or which were not measured and why."""
    missing = pd.get("missing") or []
    if pd.get("note"):
        doc.p(f"Peers: {pd['note']}.")
    if pd.get("tandem_paired"):
        doc.p(f"tandem {pd['tandem_paired']} (its Python package) was timed beside each peer "
              f"in {pd.get('rounds')} alternating rounds, in the peer's process, on forward "
              "attention and decode: those speed-ups are paired.")
    elif pd.get("results"):
        doc.p("The peers were timed alone (no tandem package for the peers' Python, see "
              "`--python-venv`): their speed-ups compare figures taken minutes apart and are "
              "marked unpaired.")
    if pd.get("disabled"):
        doc.p("Peers were not measured (`--peers none`).")
    elif missing:
        doc.p(f"**Peers not measured: {', '.join(missing)}** — "
              + ("no peer environment exists; " if pd.get("no_venv")
                 else "not installed in `.venv-peers/`; ")
              + "create it with `make peers` (a `python3 -m venv` + pip install from PyPI; "
                "torch's Linux wheel brings several GiB of CUDA libraries) and run the report "
                "again.")


def feature_rate(r, by_bytes):
    return f"{fnum(r.gbs)} GB/s" if by_bytes else f"{fnum(r.gflops)} GFLOP/s"


def write_features(doc, res):
    """Each attention feature's time beside the same call without it."""
    pairs = feature_pairs(res)
    doc.h(2, "Attention features against plain attention")
    if not pairs:
        doc.p("Not measured (no `attention_features` results in this run).")
        return
    doc.p("Each pair measured in this run by the optimized backend: packed sequences "
          "(`cu_seqlens`) against a dense batch of the same sequences (the same tokens and "
          "FLOPs); a paged decode step (16-key blocks scattered over a pool by a block table) "
          "against the same step over contiguous caches (bytes of K and V per second, caches "
          "cycled so that K and V come from memory); ALiBi (the standard slopes) and sinks "
          "against the same shape without them. Ratio: the feature's time ÷ the plain call's.")
    rows = []
    for tag, (f, p) in sorted(pairs.items()):
        by_bytes = bool(f.gbs)
        rows.append((tag, fms(f.seconds), fms(p.seconds), f"{f.seconds / p.seconds:.2f}×",
                     feature_rate(f, by_bytes), feature_rate(p, by_bytes)))
    doc.table(["comparison", "with the feature", "plain", "ratio", "rate (feature)",
               "rate (plain)"], rows)


def write_python(doc, res):
    """tandem called from Python (tandem.torch.scaled_dot_product_attention)
    beside PyTorch's SDPA, and beside the same kernel measured in C++."""
    py = res.python
    doc.h(2, "tandem through Python")
    if py.get("disabled"):
        doc.p("Not measured (`--no-python`).")
        return
    if py.get("missing") or py.get("error"):
        doc.p("Not measured: " + (py.get("error") or "no `.venv/` with the tandem package; "
                                                     "`make test` creates it."))
        return
    write_python_overhead(doc, py)
    write_python_attention(doc, res, py)


def micro(seconds):
    return f"{seconds * 1e6:.1f} µs"


def write_python_overhead(doc, py):
    ov = py["overhead"]
    doc.p(f"In `.venv/` (tandem {py['versions']['tandem']}, torch {py['versions']['torch']}), "
          f"{py.get('threads')} thread(s). Per-call costs on a [1, 1, 1, 8] problem with one "
          "thread, where the kernel's work is negligible.")
    kernel = ov.get("kernel_call_s")
    if kernel is not None:
        doc.p(f"**Binding overhead: {(ov['torch_sdpa_tandem_s'] - kernel) * 1e6:.1f} µs per "
              "call** (`tandem.torch.scaled_dot_product_attention` minus the kernel call alone, "
              "which still pays the optimized backend's own fixed cost per call).")
    doc.table(["call", "time per call"], [
        ("`tandem.torch.scaled_dot_product_attention` (torch tensors)",
         micro(ov["torch_sdpa_tandem_s"])),
        ("the kernel call alone (plan made and addresses taken beforehand)",
         micro(kernel) if kernel is not None else "–"),
        ("`tandem.attention` (NumPy arrays)", micro(ov["numpy_attention_s"])),
        ("`tandem._ext.attention_forward` (the extension's DLPack entry, Params prepared)",
         micro(ov["extension_call_s"])),
        ("`torch.nn.functional.scaled_dot_product_attention`, for scale",
         micro(ov["torch_sdpa_torch_s"])),
    ])


def python_row(res, r):
    """One shape's row of the Python table: the paired ratios where python_bench timed the
    calls in alternating rounds, else the single figures' ratios."""
    cpp = res.with_tag("attention_forward", r["shape"])
    t_py, t_torch = r["tandem_python_s"], r["torch_sdpa_s"]
    ours, torch_r, kernel = (r.get(k) for k in ("tandem_python_rounds_s", "torch_sdpa_rounds_s",
                                                "kernel_rounds_s"))
    visits = r.get("visit_rounds")
    if ours and torch_r:
        vs_torch = visits_spread(paired_ratios(torch_r, ours), visits).text()
    else:
        vs_torch = fratio(t_torch / t_py)
    if ours and kernel:
        s = visits_spread([x - 1 for x in paired_ratios(ours, kernel)], visits)
        vs_cpp = f"{s.median:+.1%} ({s.lo:+.1%} to {s.hi:+.1%})"
    elif cpp:
        vs_cpp = f"{(t_py / cpp.seconds - 1) * 100:+.1f} % (unpaired, tandem_bench)"
    else:
        vs_cpp = "–"
    return (r["shape"], fms(t_py), fms(cpp.seconds) if cpp else "–", vs_cpp, fms(t_torch),
            vs_torch, r.get("rounds", "–"))


def write_python_attention(doc, res, py):
    rows = [python_row(res, r) for r in py.get("results", [])]
    doc.p("Forward attention, float32 [B, H, S, D] tensors: tandem called through "
          "`tandem.torch.scaled_dot_product_attention`, PyTorch's "
          "`F.scaled_dot_product_attention` and (without a mask) the optimized kernel's C++ "
          "entry alone (plan made and addresses taken beforehand), timed in alternating rounds "
          "in the same Python process" + (
              f" (the rounds in {py['visits']} visits, processes one after another)"
              if py.get("visits", 1) > 1 else "") +
          "; the same kernel in `tandem_bench` (this run) for scale. "
          "Python vs C++: tandem through Python ÷ the C++ entry in the same round, − 1; "
          "×torch: torch's time ÷ tandem's in the same round. Each: the median of the rounds' "
          "ratios (" + ("10th–90th percentiles" if py.get("visits", 1) > 1 else "quartiles")
          + ").")
    doc.table(["shape", "tandem via Python", "tandem_bench (C++)", "Python vs C++",
               "torch SDPA", "×torch (paired)", "rounds"], rows)


PLOT_CAPTIONS = {
    "attention_forward": "Attention forward, GFLOP/s against sequence length, tandem and each "
                         "peer.",
    "attention_backward": "Attention backward (dQ, dK, dV), GFLOP/s against sequence length.",
    "roofline": "Fraction of this machine's limits per op (attention at S=2048).",
    "scaling": "Speed-up from 1 thread to all.",
    "memory": "Extra memory of one call against sequence length, against a materialized score "
              "matrix.",
    "accuracy": "Error against the reference run in double, per op and backend.",
}


def write_plots(doc, made):
    doc.h(2, "Plots")
    for key, caption in PLOT_CAPTIONS.items():
        if key in made:
            doc.h(3, caption)
            doc.img(made[key], caption)


def accuracy_row(r):
    """(op, shape, backend, rel, max abs) of the worst output of one accuracy case."""
    if "outputs" not in r:
        return (r["op"], r["shape"], r["backend"], "failed: " + r.get("error", "")[:80], "–")
    name, o = max(r["outputs"].items(), key=lambda kv: kv[1].get("rel_max") or 0)
    return (r["op"], r["shape"], r["backend"],
            f"{o['rel_max']:.2e} ({name})" if o.get("rel_max") is not None else "non-finite",
            f"{o['max_abs']:.2e}" if o.get("max_abs") is not None else "–")


def write_accuracy(doc, accuracy):
    acc = accuracy.get("results", [])
    if acc:
        doc.h(2, "Error against the reference in double")
        doc.p("Same float32 inputs; exact = the reference templated at double (the attention "
              "block: the float reference, which keeps every intermediate in double). rel = max "
              "|got − exact| / max |exact| (worst output of the op).")
        doc.table(["op", "shape", "backend", "rel", "max abs"], [accuracy_row(r) for r in acc])
    elif accuracy.get("error"):
        doc.p(f"Accuracy not measured: {accuracy['error']}")


def write_low_precision(doc, res):
    """The low-precision entries in brief: each stored type's paired speed-up over f32 per
    op and shape, which bf16 peers ran, and the profiles of missed targets."""
    rows = [r for r in res.rows if r.speedup is not None and not r.op.endswith("_f32")]
    if not rows:
        return
    doc.h(2, "Low-precision storage (bf16, f16, int8, e4m3)")
    doc.p("Each benchmark runs f32 and the low-precision types of the same call in turn inside "
          "every iteration; ×f32 is the median over the iterations of the f32 call's time ÷ "
          "this type's time in the same iteration (p25–p75 beside it). Decode's fraction is of "
          "the read bandwidth, counting the bytes of K and V in their stored type (+ int8's "
          "scales); prefill's and the backward's, of the FMA peak (the f32 op's FLOPs). "
          "This CPU " + ("has" if "avx512_bf16" in (res.info.get("simd_flags") or "").split()
                         else "has no") + " AVX512-BF16 arithmetic (/proc/cpuinfo).")
    doc.table(["op", "shape", "time", "×f32 (p25–p75)", "fraction"],
              [[r.op, r.shape.tag, fms(r.seconds),
                f"{fratio(r.speedup)} ({r.speedup_lo:.2f}–{r.speedup_hi:.2f})",
                fpct(r.frac_read if r.frac_read is not None else r.frac_peak)]
               for r in rows])
    lp = sorted({p.peer for p in res.peer_rows if p.op.endswith(("_bf16", "_int8"))})
    lp_errors = [p for p in res.peer_errors if p.op.endswith(("_bf16", "_int8"))]
    failed = [p for p in lp_errors if not p.error.startswith("skipped")]
    skipped = len(lp_errors) - len(failed)
    doc.p("Low-precision peers measured: " + (", ".join(lp) if lp else "none") + "."
          + ("" if not failed else " Not measured: " + "; ".join(
              f"{p.peer} {p.op}: {p.error[:200]}" for p in failed) + ".")
          + ("" if not skipped else f" {skipped} low-precision peer task(s) skipped once the "
             "peer time budget was spent (`--peer-budget`)."))
    for name, prof in res.profiles.items():
        doc.p(f"Where the time goes in `{name}` (perf record of the benchmark, every storage "
              f"type it times together; share of its samples): "
              f"{describe(prof)}.")


def write_failures(doc, res):
    if not res.errors and not res.peer_errors:
        return
    doc.h(2, "What failed or was skipped")
    doc.ul([f"`{n}`: {m[:300]}" for n, m in res.errors]
           + [f"peer {p.peer} {p.op} {p.shape} t={p.threads}: {p.error[:300]}"
              for p in res.peer_errors])


METHOD = [
    "tandem_bench (Google Benchmark) runs each benchmark in its own process, wall-clock time, "
    "buffers allocated, filled and first-touched once before timing and reused across "
    "iterations; a warm-up call precedes the timed ones.",
    "Extra memory: the growth of the peak RSS (reset through /proc/self/clear_refs) during the "
    "first call of a fresh process, after the inputs and outputs are resident.",
    "Decode reads K and V from memory: the benchmark cycles through enough caches (512 MiB "
    "together) that none stays in the last-level cache between its calls.",
    "Peers run in `.venv-peers/` with their CPU affinity and thread settings restricted to the "
    "same thread count, each library in its own process, on the same shapes (in each library's "
    "natural layout). Torch's backward is autograd's backward alone (the forward graph is built "
    "once and kept), so torch is not charged for the forward that tandem's backward recomputes; "
    "JAX's jitted vjp includes its forward.",
    "Speed-ups over peers on forward attention and decode are paired: in each peer's process "
    "tandem's Python package (`tandem.attention` on the same NumPy inputs) and the peer are "
    "timed in alternating rounds (the order swapped every other round), and the speed-up is "
    "the median of the rounds' ratios with their 10th and 90th percentiles, so that a change "
    "of the machine's capacity between rounds cancels. The rounds are taken in four visits, "
    "each a process of its own, each after every peer's previous one: a peer's speed moves "
    "between processes (thread placement, allocation) and over minutes by more than within "
    "one process, and the percentiles of rounds from four processes then hold that move "
    "(their quartiles did not: two runs' medians fell outside each other's quartiles for "
    "most ratios). Without the tandem package (no `.venv/`) the peers are "
    "timed alone and the ratio to tandem_bench's figure is marked unpaired. The Python table "
    "pairs the same way, its rounds in as many visits of python_bench.py.",
    "A machine is called busy when work other than the report's own processes kept more than "
    "a quarter of its cores busy (/proc/stat's busy time less the CPU time of the report and "
    "the programs it ran).",
    "ggml (ggml-python's bindings to ggml's CPU backend) is measured beside the other peers: "
    "ggml_flash_attn_ext with f32 and with f16 K and V (prefill and decode), ggml_rope_ext and "
    "ggml_swiglu.",
    "Low precision: tandem's bf16 and f16 attention (forward, backward from the saved state) "
    "and its decode over bf16, f16, int8 and e4m3 K/V are timed in turn with f32 inside each "
    "iteration of one benchmark. Peers in bf16: PyTorch SDPA on bf16 tensors (forward, "
    "autograd backward, decode), OpenVINO SDPA with INFERENCE_PRECISION_HINT bf16 (only where "
    "OpenVINO lists BF16 among the CPU's OPTIMIZATION_CAPABILITIES), ggml_flash_attn_ext with "
    "f16 K/V (the same bytes as bf16) and, beside tandem's int8 decode, with q8_0 K/V (int8 "
    "codes and an f16 scale per 32 values, 34 bytes per 32).",
    "Cost of invariance: each benchmark times the optimized attention with the default "
    "Geometry and with `Geometry::invariant` (and the default with one ingredient of the "
    "invariant order imitated) in turn inside every round, the kind that starts a round "
    "rotating; at least 7 rounds (more rounds run after Google Benchmark's loop when a round "
    "takes seconds); decode cycles through caches that together exceed the last-level cache.",
    "The roofline is measured at the start of the run, again before each op group (once "
    "some seconds have passed since the last probes; the group's fractions divide by the probe "
    "just before it) and at its end.",
]

REPRODUCE = ("make peers          # once: the peer environment (.venv-peers/)\n"
             "make report         # the default set, report/report.md\n"
             "make report-quick   # the quick preset (CI)\n"
             "make report OPS=attention_forward,decode SEQS=1024,4096 THREADS=1 PEERS=torch")


def write_method(doc):
    doc.h(2, "How this was measured")
    doc.ul(METHOD)
    doc.p("Reproduce:")
    doc.code(REPRODUCE)
