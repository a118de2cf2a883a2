# SPDX-License-Identifier: Apache-2.0
"""Figures the report derives from several measurements of one run."""
from dataclasses import dataclass
from typing import Optional

from .paired import relative_spread, spread
from .results import Measurement, where


@dataclass(frozen=True)
class BlockSplit:
    """The attention block's time split into its attention and the rest (the projections
    and the bias adds): block − attention_forward on the block's own attention shape."""
    block: Measurement
    attn: Optional[Measurement]
    proj_gflops: Optional[float] = None  # the projections' FLOPs ÷ (block − attention)
    proj_frac: Optional[float] = None  # of the FMA peak


def block_split(res):
    """The BlockSplit of the (last) attention_block main benchmark, or None."""
    blocks = [r for r in res.select("attention_block") if "main" in r.tags]
    if not blocks:
        return None
    blk = blocks[-1]
    s = blk.shape
    attn = res.one("attention_forward",
                   where(B=s.B, H=s.H, S=s.S, D=s.D, causal=False, plain_heads=True))
    if not attn or blk.seconds <= attn.seconds:
        return BlockSplit(blk, attn)
    proj_gflops = s.num("proj_flop") / (blk.seconds - attn.seconds) / 1e9
    peak = res.roofline.peak.get(res.main_threads)
    return BlockSplit(blk, attn, proj_gflops, proj_gflops / peak if peak else None)


def feature_pairs(res):
    """{shape tag: (feature row, plain row)} of the attention_features benchmarks
    (optimized backend, the report's thread count), in the order they ran."""
    out = {}
    for r in res.select("attention_features"):
        if "feature" not in r.tags and "plain" not in r.tags:  # paired: both calls in one
            continue
        side = 0 if "feature" in r.tags else 1
        out.setdefault(r.shape.tag, [None, None])[side] = r
    return {tag: tuple(v) for tag, v in out.items() if v[0] and v[1]}


def run_noise(res):
    """The run's noise: the Spread over every benchmark timed in repeated rounds (tandem
    beside each peer, tandem through Python) of its relative spread ((75th − 25th
    percentile) ÷ median of its rounds), or None when nothing was timed in rounds."""
    series = [p.tandem_rounds for p in res.peer_rows if p.tandem_rounds]
    series += [p.peer_rounds for p in res.peer_rows if p.peer_rounds]
    for r in res.python.get("results", []):
        series += [r.get(k) for k in ("tandem_python_rounds_s", "torch_sdpa_rounds_s",
                                      "kernel_rounds_s") if r.get(k)]
    return spread([relative_spread(x) for x in series])
