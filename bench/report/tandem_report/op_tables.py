# SPDX-License-Identifier: Apache-2.0
"""The report's "Results per op": a table per op (time, rate, fraction of the machine's
limit, speed-up over the reference and over each peer), the peers' own figures, and for
the attention block the split of its time."""
from .analysis import block_split
from .fmt import fms, fnum, fpct, fratio
from .results import ANY, STORED_KINDS, stored_op

# Each op stored in f32, bf16, f16 (int8, e4m3) right after its float32 table.
OP_ORDER = ["attention_forward", *(stored_op("attention_forward", k) for k in STORED_KINDS),
            "attention_backward", "attention_backward_saved",
            *(stored_op("attention_backward_saved", k) for k in STORED_KINDS),
            "attention_backward_dq", "attention_backward_dk", "attention_backward_dv", "decode",
            *(stored_op("decode", k) for k in STORED_KINDS), "rope_forward", "rope_backward",
            "axial_rope_forward", "axial_rope_backward",
            "swiglu_forward", "swiglu_backward", "attention_block"]

# tandem's backward from the forward's saved state is compared with the
# peers' backward (which also starts from what their forward kept)
PEER_OP = {"attention_backward_saved": "attention_backward",
           **{stored_op("attention_backward_saved", k): stored_op("attention_backward", k)
              for k in STORED_KINDS}}

# The ops whose table has an "extra MiB" column.
MEMORY_OPS = ("attention_forward", "attention_backward", "attention_backward_saved")

INTRO = (
    "Time is the mean wall time of one call. Fraction: of the FMA peak (GFLOP/s ops), of the "
    "read bandwidth (decode, which only reads) or of the copy bandwidth (other GB/s ops) at the "
    "same thread count. ×ref: the reference's time ÷ this time (same shape; the reference is "
    "measured at small shapes only and is single-threaded). ×peer: the peer's time ÷ tandem's "
    "time on the same shape and thread count (> 1: tandem is faster). Attention FLOPs: "
    "2·D + 2·Dv per visible (query, key) pair and head (causal counts only the visible pairs); "
    "backward = 2.5× forward. Streaming ops: bytes read + written. A fraction above 100 % means "
    "the data sat in cache (small shapes) or the limit was measured low (a busy machine). "
    "Ops ending in _f32, _bf16, _f16, _int8, _e4m3: the op with that storage type, every type "
    "timed in turn within each iteration of one benchmark; ×f32: the median over those "
    "iterations of the f32 call's time ÷ this call's time, with its quartiles (p25–p75); "
    "decode's GB/s counts the bytes of K and V in their stored type (+ int8's scales).")


def write_op_tables(doc, res):
    doc.h(2, "Results per op")
    doc.p(INTRO)
    for op in OP_ORDER + sorted({r.op for r in res.rows} - set(OP_ORDER)):
        rows = [r for r in res.rows if r.op == op]
        if rows:
            write_op(doc, res, op, rows)


def order(res, r):
    """The table's order: optimized first, the report's shapes before the small ones, the
    main thread count first, then by D, causal, Sq and tag."""
    s = r.shape
    return (r.backend != "optimized", "small" in r.tags, r.threads != res.main_threads,
            s.num("D", 0), s.num("causal", 0), s.num("Sq", 0), s.tag)


def write_op(doc, res, op, rows):
    """The table of op `op`, the peers' figures and, for the block, its split."""
    pop = PEER_OP.get(op, op)
    peers = [p for p in res.peer_names() if any(x.op == pop for x in res.peer_rows if x.peer == p)]
    doc.h(3, op)
    rate_col = "GB/s" if rows[0].gbs is not None else "GFLOP/s"
    paired = any(r.speedup is not None for r in rows)
    head = ["backend", "shape", "threads", "time", rate_col, "fraction"]
    head += ["×f32 (p25–p75)"] if paired else ["×ref"]
    head += [f"×{p}" for p in peers] + (["extra MiB"] if op in MEMORY_OPS else [])
    doc.table(head, [op_row(res, r, rate_col, pop, peers)
                     for r in sorted(rows, key=lambda r: order(res, r))])
    # (a stored type's peers ran the op the peers have, e.g. attention_backward_bf16)
    write_peer_figures(doc, res, pop if paired else op)
    if op == "attention_block":
        write_block_split(doc, res)


def op_row(res, r, rate_col, pop, peers):
    """One line of an op's table."""
    ref = res.with_tag(r.op, r.shape.tag, "reference", threads=ANY) \
        if r.backend != "reference" else None
    if rate_col == "GB/s":
        rate, frac = r.gbs, (r.frac_read if r.frac_read is not None else r.frac_copy)
    else:
        rate, frac = r.gflops, r.frac_peak
    line = [r.backend, r.shape.tag, r.threads, fms(r.seconds), fnum(rate), fpct(frac)]
    if r.speedup is not None:
        line.append(f"{fratio(r.speedup)} ({r.speedup_lo:.2f}–{r.speedup_hi:.2f})")
    else:
        line.append(fratio(ref.seconds / r.seconds) if ref else "–")
    for p in peers:
        pr = res.peer(pop, r.shape.tag, p, r.threads) if r.backend == "optimized" else None
        line.append(fratio(pr.seconds / r.seconds) if pr else "–")
    if r.op in MEMORY_OPS:
        known = r.extra_mib is not None and r.extra_mib >= 0
        line.append(fnum(r.extra_mib) if known else "–")
    return line


def peer_rate(p, op):
    if p.gflops and not op.startswith("decode"):
        return f" ({fnum(p.gflops)} GFLOP/s)"
    return f" ({fnum(p.gbs)} GB/s)" if p.gbs else ""


def write_peer_figures(doc, res, op):
    """The peers' own times on op `op`, with their notes."""
    prs = [p for p in res.peer_rows if p.op == op]
    if not prs:
        return
    notes = sorted({f"{p.peer}: {p.note}" for p in prs if p.note})
    doc.p("Peer figures: " + "; ".join(
        f"{p.peer} {p.shape.tag} t={p.threads}: {fms(p.seconds)}" + peer_rate(p, op) for p in prs)
        + ("." if not notes else ". Notes: " + "; ".join(notes) + "."))


def write_block_split(doc, res):
    blk = block_split(res)
    if not blk or not blk.proj_gflops:
        return
    block, attn = blk.block.seconds, blk.attn.seconds
    doc.p(f"Block split: its attention alone (attention_forward/{blk.attn.shape.tag}) takes "
          f"{fms(attn)} of the block's {fms(block)}; the rest, {fms(block - attn)}, is the "
          f"projections (and the bias adds): {fnum(blk.proj_gflops)} GFLOP/s = "
          f"{fpct(blk.proj_frac)} of peak.")
