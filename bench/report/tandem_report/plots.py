# SPDX-License-Identifier: Apache-2.0
"""The report's figures (PNG, matplotlib's Agg backend): GFLOP/s against sequence length,
the fraction of the roofline per op, thread scaling, extra memory and the error against the
reference in double. matplotlib is imported here alone: without it the report has no plots."""
import os

from .proc import log
from .results import ANY, ATTENTION_OPS, attn

COLORS = {"optimized": "C0", "optimized_saved": "C8", "reference": "C7", "torch_sdpa": "C1",
          "torch_eager": "C2", "openvino_sdpa": "C3", "onnxruntime_attention": "C4",
          "jax_dpa": "C5", "torch_mha": "C6", "ggml_fa_f32": "C9", "ggml_fa_f16": "k"}
MARKERS = {"optimized": "o", "optimized_saved": "*", "torch_sdpa": "s", "torch_eager": "^",
           "openvino_sdpa": "D", "onnxruntime_attention": "v", "jax_dpa": "P", "ggml_fa_f32": "X",
           "ggml_fa_f16": "x"}
LABELS = {"optimized": "tandem optimized",
          "optimized_saved": "tandem optimized, from the saved state"}


def draw(res, out_dir):
    """Writes every plot there is data for into out_dir: {key: file name}."""
    try:
        import matplotlib
    except ImportError:
        log("report: no matplotlib (python3-matplotlib): the report has no plots")
        return {}
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    made = {}
    for op in ("attention_forward", "attention_backward"):
        gflops_vs_seq(plt, res, op, out_dir, made)
    for plot in (roofline_fraction, thread_scaling, extra_memory, accuracy):
        plot(plt, res, out_dir, made)
    return made


def save(plt, fig, out_dir, made, key, name):
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, name), dpi=110)
    made[key] = name
    plt.close(fig)


def seq_series(res, op, D, causal, who):
    """[(S, GFLOP/s)] of tandem (who: optimized, optimized_saved) or of a peer on the
    attention family at head width D."""
    sel = attn(D=D, causal=causal)
    if who == "optimized_saved":
        op = "attention_backward_saved"
    found = (res.select(op, sel) if who in ("optimized", "optimized_saved")
             else res.peer_select(op, who, sel))
    return sorted((r.shape.S, r.gflops) for r in found)


def seq_panel(ax, res, op, D, causal):
    """One panel of GFLOP/s against S; True when it has points."""
    mt = res.main_threads
    saved = ["optimized_saved"] if op == "attention_backward" else []
    any_pts = False
    for who in ["optimized"] + saved + res.peer_names(op):
        pts = seq_series(res, op, D, causal, who)
        if pts:
            any_pts = True
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=MARKERS.get(who, "x"),
                    color=COLORS.get(who), label=LABELS.get(who, who))
    if res.roofline.peak.get(mt):
        ax.axhline(res.roofline.peak[mt], color="k", ls="--", lw=0.8,
                   label=f"FMA peak ({mt} threads)")
    ax.set_xscale("log", base=2)
    ax.set_title(f"D = {D}, {'causal' if causal else 'no mask'}")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    return any_pts


def gflops_vs_seq(plt, res, op, out_dir, made):
    """GFLOP/s against sequence length: D = 64 and 128, without mask and causal."""
    fig, axes = plt.subplots(2, 2, figsize=(11, 8), sharex=True)
    any_pts = False
    for i, D in enumerate((64, 128)):
        for j, causal in enumerate((False, True)):
            any_pts |= seq_panel(axes[i][j], res, op, D, causal)
            if i == 1:
                axes[i][j].set_xlabel("sequence length S (B=1, H=8)")
            if j == 0:
                axes[i][j].set_ylabel("GFLOP/s")
    if not any_pts:
        plt.close(fig)
        return
    handles, labels = [], []
    for ax in axes.flat:
        for h, label in zip(*ax.get_legend_handles_labels()):
            if label not in labels:
                handles.append(h)
                labels.append(label)
    fig.legend(handles, labels, loc="lower center", ncol=4)
    fig.suptitle(f"{op.replace('_', ' ')}: GFLOP/s against sequence length, "
                 f"{res.main_threads} threads"
                 + (" (backward = 2.5× forward FLOPs)" if op == "attention_backward" else ""))
    fig.tight_layout(rect=(0, 0.07, 1, 0.96))
    fn = f"{op}_gflops_vs_seq.png"
    fig.savefig(os.path.join(out_dir, fn), dpi=110)
    made[op] = fn
    plt.close(fig)


def roofline_bars(res):
    """[(label, fraction, of copy)] of the main and memory benchmarks (attention at S=2048)."""
    bars = []
    at_2048 = attn(S=2048, causal=(False, True))
    for r in res.select(None):
        if not ("main" in r.tags or "memory" in r.tags):
            continue
        frac = r.frac_peak if r.frac_copy is None else r.frac_copy
        if frac is None or (r.op in ATTENTION_OPS and not at_2048(r.shape)):
            continue
        bars.append((f"{r.op}\n{r.shape.tag}", frac, r.frac_copy is not None))
    return bars


def roofline_fraction(plt, res, out_dir, made):
    bars = roofline_bars(res)
    if not bars:
        return
    fig, ax = plt.subplots(figsize=(11, max(4, 0.38 * len(bars) + 1)))
    y = list(range(len(bars)))
    ax.barh(y, [b[1] for b in bars], color=["C1" if b[2] else "C0" for b in bars])
    ax.set_yticks(y)
    ax.set_yticklabels([b[0].replace("\n", "  ") for b in bars], fontsize=8)
    ax.invert_yaxis()
    ax.axvline(1.0, color="k", lw=0.8)
    for yy, b in zip(y, bars):
        ax.text(b[1] + 0.01, yy, f"{b[1]:.0%}", va="center", fontsize=8)
    ax.set_xlabel("fraction of this machine's limit (blue: of FMA peak; orange: of copy "
                  "bandwidth)")
    ax.set_title(f"tandem optimized against the roofline measured in this run "
                 f"({res.main_threads} threads)")
    ax.set_xlim(0, max(1.1, max(b[1] for b in bars) + 0.1))
    save(plt, fig, out_dir, made, "roofline", "roofline_fraction.png")


def scaling_label(who, op, causal):
    return f"{who} {op.replace('attention_', '')} S2048 D128" + (" causal" if causal else "")


def thread_scaling(plt, res, out_dir, made):
    """Speed-up over one thread of attention at B=1 H=8 S=2048 D=128, tandem and peers."""
    fig, ax = plt.subplots(figsize=(8, 5.5))
    any_pts = False
    for op in ("attention_forward", "attention_backward"):
        for causal in (False, True):
            sel = attn(S=2048, D=128, causal=causal)
            pts = sorted((r.threads, r.seconds) for r in res.select(op, sel, threads=ANY))
            if len(pts) >= 2 and pts[0][0] == 1:
                any_pts = True
                ax.plot([p[0] for p in pts], [pts[0][1] / p[1] for p in pts], marker="o",
                        label=scaling_label("tandem", op, causal))
            for peer in res.peer_names(op):
                pp = sorted((p.threads, p.seconds)
                            for p in res.peer_select(op, peer, sel, threads=ANY))
                if len(pp) >= 2 and pp[0][0] == 1 and not causal:
                    ax.plot([p[0] for p in pp], [pp[0][1] / p[1] for p in pp], marker="x",
                            ls=":", label=scaling_label(peer, op, causal))
    if not any_pts:
        plt.close(fig)
        return
    top = max(res.plan.get("scaling_threads", [1, 2]) + [res.main_threads])
    ax.plot([1, top], [1, top], color="k", ls="--", lw=0.8, label="ideal")
    ax.set_xticks(sorted({r.threads for r in res.rows if r.op in ATTENTION_OPS}))
    ax.set_xlabel("threads")
    ax.set_ylabel("speed-up over 1 thread")
    ax.set_title("Thread scaling, attention at B=1 H=8 S=2048 D=128")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    save(plt, fig, out_dir, made, "scaling", "scaling.png")


def memory_points(res):
    """[(marker, color, label, [(S, MiB)])] of tandem's and torch's measured extra memory."""
    d128 = attn(D=128)
    out = []
    for op, mk, col in (("attention_forward", "o", "C0"), ("attention_backward", "s", "C9")):
        pts = sorted((r.shape.S, r.extra_mib) for r in res.select(op, d128)
                     if r.extra_mib is not None and r.extra_mib >= 0)
        out.append((mk, col, f"tandem {op.replace('attention_', '')} (measured peak-RSS growth)",
                    pts))
    for peer, mk, col, name in (("torch_eager", "^", "C2", "torch eager"),
                                ("torch_sdpa", "s", "C1", "torch SDPA")):
        pts = sorted((p.shape.S, p.extra_mib) for p in res.peer_select("attention_forward", peer,
                                                                        d128)
                     if p.extra_mib is not None)
        out.append((mk, col, f"{name} forward (measured)", pts))
    return out


def extra_memory(plt, res, out_dir, made):
    """Extra memory of one call against S, beside a materialized score matrix."""
    fig, ax = plt.subplots(figsize=(8, 5.5))
    series = memory_points(res)
    for mk, col, label, pts in series:
        if pts:
            ax.plot([p[0] for p in pts], [max(p[1], 1e-2) for p in pts], marker=mk, color=col,
                    label=label)
    if not any(pts for _, _, _, pts in series[:2]):  # tandem's own
        plt.close(fig)
        return
    xs = sorted({r.shape.S for r in res.rows if r.op in ATTENTION_OPS and attn(D=128)(r.shape)})
    ax.plot(xs, [8 * s * s * 4 / 2**20 for s in xs], "k--", lw=0.9,
            label="materialized scores, all heads: B·H·S²·4 bytes")
    ax.plot(xs, [s * s * 4 / 2**20 for s in xs], "k:", lw=0.9,
            label="one head's scores: S²·4 bytes")
    ax.axhline(64, color="C3", lw=0.8, label="target: 64 MiB")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length S (B=1, H=8, D=128, no mask)")
    ax.set_ylabel("extra memory beyond inputs and outputs (MiB)")
    ax.set_title("Memory a call needs")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    save(plt, fig, out_dir, made, "memory", "memory.png")


def accuracy_values(acc):
    """(case labels, {(label, backend): worst relative error}, backends)."""
    labels, vals = [], {}
    for r in acc:
        label = f"{r['op']} {r['shape']}"
        if label not in labels:
            labels.append(label)
        vals[(label, r["backend"])] = max(
            (o["rel_max"] for o in r["outputs"].values() if o.get("rel_max") is not None),
            default=None)
    backends = sorted({r["backend"] for r in acc}, key=lambda b: (b != "reference", b))
    return labels, vals, backends


def accuracy(plt, res, out_dir, made):
    """Each case's worst relative error per backend, on a log scale from 1e-12."""
    acc = [r for r in res.accuracy.get("results", []) if "outputs" in r]
    if not acc:
        return
    labels, vals, backends = accuracy_values(acc)
    fig, ax = plt.subplots(figsize=(11, max(4, 0.3 * len(labels) + 1.5)))
    h = 0.8 / max(1, len(backends))
    floor = 1e-12
    for k, be in enumerate(backends):
        ys = [i + k * h for i in range(len(labels))]
        xs = [max(vals.get((label, be)) or floor, floor) for label in labels]
        ax.barh(ys, xs, height=h, label=be, color=COLORS.get(be, f"C{k}"))
        for yy, label in zip(ys, labels):
            v = vals.get((label, be))
            if v is not None and v < floor:
                ax.text(floor * 1.5, yy, "0 (exact is this backend's own output)" if v == 0
                        else "< 1e-12", va="center", fontsize=6)
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
    save(plt, fig, out_dir, made, "accuracy", "accuracy.png")
