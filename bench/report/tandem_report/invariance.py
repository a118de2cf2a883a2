# SPDX-License-Identifier: Apache-2.0
"""The report's "Cost of invariance": the optimized attention's batch-invariant order
(Geometry::invariant, SPEC §12) against its default order, paired round by round
(bench/bench_invariance.cpp), each shape's ratio judged against the criterion that
invariance may become the default only if it costs at most 5 % on the report's shapes, and
the ingredients of the invariant order imitated one at a time inside the default one."""
from .fmt import fms
from .paired import MET, MISSED, UNDECIDED, combine

# The most invariance may cost on every shape to become the default: time ratio 1.05.
BOUND = 1.05

# What each kind other than the default changes, in the order of INVARIANCE_KINDS.
KIND_TEXT = {
    "invariant": "`Geometry::invariant = true`",
    "no_edge": "`edge_block = key_block`: no 16-key blocks where the causal edge runs",
    "wide_decode": "`decode_tiles = never`: decode scores as the wide tile's d-ordered FMA "
                   "chains instead of dot products",
    "no_split": "`split_keys_min_chunks = 0`: no split-key decode",
    "chunk1024": "`split_keys_chunk = 1024`: split-key chunks of the invariant order's "
                 "1024 keys",
    "one_part": "`backward_query_parts = 1`: one backward query part per (batch, kv head)",
}

CASE_TEXT = {
    "prefill": "forward, Sq = Sk",
    "decode": "one query per sequence, K and V from memory",
    "paged_decode": "the same over 16-key blocks scattered by a block table",
    "backward": "from the saved out and lse, B·Hkv = 2 (the default splits query parts)",
    "decode_bf16": "bf16 K and V: the default's stored-decode kernel against the invariant "
                   "order's widening to f32",
}


def cost_verdict(s, bound=BOUND):
    """Whether the time-ratio Spread `s` (invariant ÷ default) stays within `bound`: met
    when even its upper quartile does, not met when even its lower quartile exceeds it, else
    not decided; None when not measured."""
    if s is None:
        return None
    if s.hi <= bound:
        return MET
    if s.lo > bound:
        return MISSED
    return UNDECIDED


def ratio_text(s):
    return f"{s.median:.3f}× ({s.lo:.3f}–{s.hi:.3f})"


def ingredients(row):
    """The ratios of the kinds that imitate one ingredient, in one cell."""
    parts = [f"{k} {ratio_text(s)}" for k, s in row.cost.items()
             if k not in ("default", "invariant")]
    return "; ".join(parts) or "–"


def overall(rows):
    """The criterion's status over every row: not met if any shape's is, else not decided
    if any is, else met; None without rows."""
    return combine([cost_verdict(r.cost.get("invariant")) for r in rows])


VERDICT_TEXT = {MET: "✓ within 5 %", MISSED: "✗ **costs more than 5 %**",
                UNDECIDED: "? not decided (quartiles straddle 1.05)", None: "not measured"}

OVERALL_TEXT = {
    MET: "**met**: invariance costs at most 5 % on every shape measured",
    MISSED: "**not met**: invariance costs more than 5 % on at least one shape (even its "
            "lower quartile lies above 1.05)",
    UNDECIDED: "**not decided**: no shape is clearly above 5 %, but on some the quartiles "
               "straddle 1.05",
}


def write_invariance(doc, res, machine):
    """The section: the criterion's verdict, the machine, one row per shape."""
    rows = res.invariance
    doc.h(2, "Cost of invariance")
    if not rows:
        doc.p("Not measured (no `invariance` results in this run).")
        return
    status = overall(rows)
    doc.p("The optimized attention in its default order and in its batch-invariant order "
          "(`Geometry::invariant`, SPEC §12: 64-key blocks at absolute key positions, no "
          "16-key edge blocks, 1024-key chunks merged in order, decode scores as d-ordered "
          "FMA chains, one backward query part, bf16/f16 decode by widening) timed in turn "
          "inside every round of one benchmark; ratio: the median over the rounds of the "
          "invariant call's time ÷ the default call's time in the same round, with its "
          "quartiles (p25–p75). Criterion: invariance may become the default only if it costs "
          "at most 5 % (ratio ≤ 1.05) on the report's shapes; a shape's verdict is decided "
          "only when its quartiles lie on one side of 1.05. "
          f"Measured on {machine}, {res.main_threads} thread(s).")
    doc.p(f"Criterion on this machine: {OVERALL_TEXT[status]} ({len(rows)} shapes).")
    doc.table(["case", "shape", "default", "invariant", "invariant ÷ default (p25–p75)",
               "verdict (≤ 1.05×)", "one ingredient ÷ default (p25–p75)", "rounds"],
              [(r.case, r.shape.tag, fms(r.seconds.get("default")),
                fms(r.seconds.get("invariant")),
                ratio_text(r.cost["invariant"]) if "invariant" in r.cost else "–",
                VERDICT_TEXT[cost_verdict(r.cost.get("invariant"))], ingredients(r),
                r.cost["invariant"].n if "invariant" in r.cost else "–") for r in rows])
    doc.p("Where the cost comes from: each ingredient of the invariant order that a Geometry "
          "field can imitate inside the default order, timed in the same rounds — "
          + "; ".join(f"{k}: {t}" for k, t in KIND_TEXT.items() if k != "invariant")
          + ". The invariant order's merge of 1024-key chunks inside the tiles has no such "
            "imitation: it is part of what the invariant ratio holds beyond the ingredients. "
            "Cases: " + "; ".join(f"{k}: {t}" for k, t in CASE_TEXT.items()) + ".")
