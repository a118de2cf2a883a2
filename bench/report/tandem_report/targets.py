# SPDX-License-Identifier: Apache-2.0
"""The performance targets: each a small declarative record (what to select, the bound)
whose kind evaluates it against one run's Results. TARGETS lists them in the report's order;
`evaluate` gives an Outcome per target (some kinds give one per shape measured)."""
from dataclasses import dataclass
from typing import Optional

from .analysis import block_split
from .fmt import fms, fnum, fpct
from .paired import MET, MISSED, UNDECIDED, Spread, combine, quantile, verdict
from .profile import describe
from .results import Range, Where, attn, where


@dataclass(frozen=True)
class Outcome:
    target: str
    measured: str  # the figures behind the status, '–' when not measured
    status: str  # met, not met or not measured
    profile: Optional[str] = None  # the benchmark that says where a missed target's time goes


def outcome(target, ok, measured, profile=None):
    """ok: True, False, or None when not measured."""
    return Outcome(target, measured, "not measured" if ok is None else ("met" if ok else "not met"),
                   profile)


def decided(target, status, measured, profile=None):
    """An Outcome of a status from paired.verdict / combine (None: not measured)."""
    return Outcome(target, measured, status or "not measured", profile)


def peer_speedup(row, peers):
    """tandem's speed-up over the fastest of `peers` (PeerMeasurements) on tandem_bench row
    `row`'s shape: the Spread of the paired per-round ratios of the peer whose median is
    lowest; for peers timed alone, the unpaired ratio of the fastest one's time to the C++
    row's (a spread of one value, n = 1)."""
    paired = [s for s in (p.speedup for p in peers) if s is not None]
    if paired:
        return min(paired, key=lambda s: s.median)
    x = min(p.seconds for p in peers) / row.seconds
    return Spread(x, x, x, 1)


def times_shown(row, p):
    """The two times behind a speed-up over one peer: where paired, the medians of the
    rounds the ratios were taken from (tandem through Python beside the peer), else the C++
    row's time and the peer's."""
    if p.tandem_rounds:
        return (f"{fms(quantile(p.tandem_rounds, 0.5))} vs {fms(quantile(p.peer_rounds, 0.5))},"
                f" paired medians")
    return f"{fms(row.seconds)} vs {fms(p.seconds)}"


def shown(s):
    """A speed-up Spread as the report shows it: median (lower–upper bound), or the one
    unpaired ratio."""
    return s.text() if s.n > 1 else f"{s.median:.2f}× (unpaired)"


def bench_of(row):
    """The tandem_bench benchmark a row came from (a stored type's row: its benchmark)."""
    return row.name.split("#")[0]


def listing(pairs, fmt):
    """'shape figure, ...' of (value, shape tag) pairs, by shape tag."""
    return ", ".join(f"{tag} {fmt(x)}" for x, tag in sorted(pairs, key=lambda t: t[1]))


# A fraction's probe kind (Roofline.spread) and the row's figure it divides.
PROBE_OF = {"frac_peak": ("peak", "gflops"), "frac_copy": ("copy", "gbs"),
            "frac_read": ("read", "gbs")}


def fraction_floor(res, r, key):
    """Row r's fraction (field `key`) against the highest probe of its kind and thread count
    in the run, where r's own fraction divides by the probe nearest to it. A probe is a best
    of trials and work beside it only lowers it, so the highest one is the surest limit; a
    target is decided only when both fractions lie on one side of it (fraction_verdict)."""
    f = getattr(r, key)
    kind, figure = PROBE_OF.get(key, (None, None))
    value = getattr(r, figure, None) if figure else None
    top = res.roofline.spread().get((kind, r.threads))
    if not f or not value or not top:
        return f
    return min(f, value / top[1])


def fraction_verdict(res, rows, key, need):
    """met when every row reaches `need` even against the run's highest probe, not met when
    one falls short against its nearest probe, else not decided (the probes straddle it)."""
    near = [getattr(r, key) or 0 for r in rows]
    if any(f < need for f in near):
        return MISSED
    if all((fraction_floor(res, r, key) or 0) >= need for r in rows):
        return MET
    return UNDECIDED


def floor_note(res, r, key):
    """' (NN % of the run's highest probe)' where that differs from r's fraction, else ''."""
    f, lo = getattr(r, key), fraction_floor(res, r, key)
    return f" ({fpct(lo)} of the run's highest probe)" if f and lo and lo < f * 0.98 else ""


@dataclass(frozen=True)
class Fraction:
    """The lowest fraction of the machine's limit (field `key`) of the rows of `ops` that
    `sel` selects is at least `need`. `what` may name {read}, the read bandwidth."""
    name: str
    ops: tuple
    sel: Where
    need: float
    key: str = "frac_peak"
    what: str = "of FMA peak"

    def fraction(self, r):
        return getattr(r, self.key)

    def evaluate(self, res):
        found = [r for op in self.ops for r in res.select(op, self.sel)]
        if not found:
            return [outcome(self.name, None, "–")]
        frac = self.fraction
        worst = min(found, key=lambda r: frac(r) or 0)
        what = self.what.format(read=fnum(res.roofline.read.get(res.main_threads)))
        text = (f"lowest {fpct(frac(worst))}{floor_note(res, worst, self.key)} "
                f"({worst.shape.tag}); "
                + ", ".join(f"{r.shape.tag} {fpct(frac(r))}" for r in found) + f" {what}")
        return [decided(self.name, fraction_verdict(res, found, self.key, self.need), text,
                        bench_of(worst))]


@dataclass(frozen=True)
class Efficiency:
    """One benchmark's fraction of the FMA peak is at least `need`."""
    name: str
    op: str
    sel: Where
    need: float

    def evaluate(self, res):
        r = res.one(self.op, self.sel)
        if not r:
            return [outcome(self.name, None, "–")]
        return [decided(self.name, fraction_verdict(res, [r], "frac_peak", self.need),
                        f"{fpct(r.frac_peak)}{floor_note(res, r, 'frac_peak')} "
                        f"({fnum(r.gflops)} GFLOP/s)")]


@dataclass(frozen=True)
class PeerSpeedup:
    """On every shape `sel` selects, tandem is at least `need` times faster than the
    fastest of `peers` (on their op `peer_op`, default `op`); with `every_shape`, a shape
    without the peer fails the target; with `tags`, only the rows that carry them all."""
    name: str
    op: str
    sel: Optional[Where]
    peers: tuple
    need: float
    every_shape: bool = False
    peer_op: Optional[str] = None
    tags: tuple = ()

    def evaluate(self, res):
        found = [r for r in res.select(self.op, self.sel) if set(self.tags) <= set(r.tags)]
        ratios = []
        pop = self.peer_op or self.op
        for r in found:
            peers = [p for p in (res.peer(pop, r.shape.tag, x) for x in self.peers) if p]
            if peers:
                ratios.append((peer_speedup(r, peers), r.shape.tag))
        if not ratios:
            return [outcome(self.name, None, "–")]
        lo = min(ratios, key=lambda t: t[0].median)
        worst = next(r for r in found if r.shape.tag == lo[1])
        text = f"lowest {shown(lo[0])} ({lo[1]}); " + listing(ratios, shown)
        complete = len(ratios) == len(found)
        status = combine([verdict(x, self.need) for x, _ in ratios])
        if self.every_shape and not complete:
            text += f" ({len(found) - len(ratios)} shape(s) without the peer)"
            status = MISSED
        return [decided(self.name, status, text, bench_of(worst))]


@dataclass(frozen=True)
class PeerAt:
    """tandem's `op` is at least `need` times faster than `peer`'s `peer_op` at one shape."""
    name: str
    op: str
    peer_op: str
    sel: Where
    peer: str
    need: float

    def evaluate(self, res):
        r = res.one(self.op, self.sel)
        p = res.peer(self.peer_op, r.shape.tag, self.peer) if r else None
        if not p:
            return [outcome(self.name, None, "–")]
        sp = peer_speedup(r, [p])
        return [decided(self.name, verdict(sp, self.need),
                        f"{shown(sp)} ({times_shown(r, p)})")]


@dataclass(frozen=True)
class VersusPeers:
    """Measured beside `peers` without a target ratio: an outcome per shape and peer
    measured, met where tandem is faster; none where no peer was measured."""
    op: str
    sel: Optional[Where]
    peers: tuple
    label: str

    def evaluate(self, res):
        out = []
        for r in res.select(self.op, self.sel):
            for peer in self.peers:
                p = res.peer(self.op, r.shape.tag, peer)
                if p:
                    sp = peer_speedup(r, [p])
                    out.append(decided(f"{self.op} {r.shape.tag} vs {self.label} ({peer}): faster",
                                       verdict(sp, 1.0),
                                       f"{shown(sp)} ({times_shown(r, p)})"))
        return out


@dataclass(frozen=True)
class Pick:
    """One benchmark: op, shape, threads (None: the run's main thread count)."""
    op: str
    sel: Where
    threads: Optional[int] = None


@dataclass(frozen=True)
class TimeRatio:
    """The time of `num` ÷ the time of `den` is at most `at_most` (or at least `at_least`)."""
    name: str
    num: Pick
    den: Pick
    at_most: Optional[float] = None
    at_least: Optional[float] = None

    def evaluate(self, res):
        a = res.one(self.num.op, self.num.sel, threads=self.num.threads)
        b = res.one(self.den.op, self.den.sel, threads=self.den.threads)
        if not a or not b:
            return [outcome(self.name, None, "–")]
        ratio = a.seconds / b.seconds
        ok = ratio <= self.at_most if self.at_most is not None else ratio >= self.at_least
        return [outcome(self.name, ok, f"{ratio:.2f}×")]


@dataclass(frozen=True)
class ExtraMemory:
    """One call's extra memory (peak-RSS growth) is at most `limit_mib`."""
    name: str
    op: str
    sel: Where
    limit_mib: float

    def evaluate(self, res):
        r = res.one(self.op, self.sel)
        if not r:
            return [outcome(self.name, None, "–")]
        known = r.extra_mib is not None and r.extra_mib >= 0
        scores = r.shape.num("scores_bytes", 0) / 2**20
        return [outcome(self.name, r.extra_mib <= self.limit_mib if known else None,
                        f"{fnum(r.extra_mib)} MiB (a materialized score matrix: "
                        f"{fnum(scores)} MiB)")]


@dataclass(frozen=True)
class BlockProjections:
    """The attention block's projections (block − its attention) reach `need` of the peak."""
    name: str
    need: float

    def evaluate(self, res):
        blk = block_split(res)
        if not blk:
            return [outcome(self.name, None, "–")]
        return [outcome(self.name, None if blk.proj_frac is None else blk.proj_frac >= self.need,
                        f"projections ≈ {fpct(blk.proj_frac)} (block − its attention), "
                        f"whole block {fpct(blk.block.frac_peak)}")]


def short_op(op):
    return op.replace("_forward", " fwd").replace("_backward", " bwd")


@dataclass(frozen=True)
class Streaming:
    """Every main benchmark of `ops` reaches `need` of the copy bandwidth; met once each of
    `required` was measured."""
    name: str
    ops: tuple
    required: tuple
    need: float

    def evaluate(self, res):
        rows = [r for r in res.select(self.ops) if "main" in r.tags]
        if not rows:
            return [outcome(self.name, None, "–")]
        worst = min(rows, key=lambda r: r.frac_copy)
        ok = all(r.frac_copy >= self.need for r in rows)
        measured_all = set(self.required) <= {r.op for r in rows}
        return [outcome(self.name, False if not ok else (True if measured_all else None),
                        f"lowest {worst.op} {fpct(worst.frac_copy)}; "
                        + ", ".join(f"{short_op(r.op)} {fpct(r.frac_copy)}" for r in rows))]


@dataclass(frozen=True)
class RooflineSteady:
    """Every roofline figure at the end of the run is within `tolerance` of its start."""
    name: str
    tolerance: float

    def evaluate(self, res):
        drift = res.roofline.drift()
        if drift is None:
            return [outcome(self.name, None, "–")]
        return [outcome(self.name, not any(abs(d.change) > self.tolerance for d in drift),
                        "; ".join(f"{d.kind} t={d.threads}: {fnum(d.start)} → {fnum(d.end)} "
                                  f"({d.change:+.0%})" for d in drift))]


def with_hint(outcomes, hint, res):
    """`outcomes`, a missed one's figures followed by where its time goes: the profile of its
    benchmark taken in the run (profile.py), else `hint`."""
    def note(o):
        prof = res.profiles.get(o.profile)
        return (f"where the time goes (perf of every type in {o.profile}): "
                f"{describe(prof, 3)}" if prof
                else hint)
    return [o if o.status != "not met"
            else Outcome(o.target, f"{o.measured}; {note(o)}", o.status, o.profile)
            for o in outcomes]


@dataclass(frozen=True)
class PairedSpeedup:
    """On every shape `sel` selects, the storage type of op `op` (a row split from a `stored`
    benchmark) is at least `need` times the speed of f32, the median of the ratios paired
    within each iteration; a missed target points to `hint`. With `tags`, only the rows
    that carry every one of them."""
    name: str
    op: str
    sel: Where
    need: float
    hint: str = ""
    tags: tuple = ()

    def evaluate(self, res):
        rows = [r for r in res.select(self.op, self.sel) if r.speedup is not None
                and set(self.tags) <= set(r.tags)]
        if not rows:
            return [outcome(self.name, None, "–")]
        worst = min(rows, key=lambda r: r.speedup)
        shown = sorted(rows, key=lambda r: r.shape.tag)
        text = (f"lowest {worst.speedup:.2f}× ({worst.shape.tag}); "
                + ", ".join(f"{r.shape.tag} {r.speedup:.2f}× ({r.speedup_lo:.2f}–"
                            f"{r.speedup_hi:.2f})" for r in shown))
        status = combine([verdict(Spread(r.speedup, r.speedup_lo, r.speedup_hi, 2), self.need)
                          for r in rows])
        return with_hint([decided(self.name, status, text, bench_of(worst))], self.hint, res)


def has_avx512_bf16(res):
    """True when the machine's SIMD flags (machine.py, from /proc/cpuinfo) name avx512_bf16."""
    return "avx512_bf16" in (res.info.get("simd_flags") or "").split()


@dataclass(frozen=True)
class ByCpu:
    """The target `with_bf16` on a CPU with AVX512-BF16 arithmetic, else `without` (each a
    target of a kind above)."""
    with_bf16: object
    without: object

    def evaluate(self, res):
        return (self.with_bf16 if has_avx512_bf16(res) else self.without).evaluate(res)


@dataclass(frozen=True)
class Hinted:
    """Target `target`, a missed outcome followed by where its time goes (`hint`)."""
    target: object
    hint: str

    def evaluate(self, res):
        return with_hint(self.target.evaluate(res), self.hint, res)


# ---- the targets -----------------------------------------------------------------------------

S2048_D128 = attn(S=2048, D=128)
S4096_D128_CAUSAL = attn(S=4096, D=128, causal=True)
DECODE = where(H=32, Hkv=8, Sq=1, D=128, Dv=128, causal=False)
GGML = ("ggml", "ggml_fa_f32", "ggml_fa_f16")
STREAMING_OPS = ("rope_forward", "rope_backward", "rope_forward_qk", "rope_backward_qk",
                 "axial_rope_forward", "axial_rope_backward", "swiglu_forward", "swiglu_backward")


# where a missed low-precision target's time goes: the benchmark to profile and the notes
PROFILE = ("profile: perf record -g build/bench/tandem_bench --benchmark_filter={bench} "
           "(bench/README.md, \"Measurements behind design choices\")")
DECODE_HINT = PROFILE.format(bench="decode_stored")
PREFILL_HINT = PROFILE.format(bench="attention_forward_stored")
BACKWARD_HINT = PROFILE.format(bench="attention_backward_saved_stored")
REPORT_SHAPES = attn(S=Range(1024, 4096), causal=(False, True))
BF16_PEERS = ("torch_sdpa", "openvino_sdpa", "ggml_fa_f16")


def decode_stored(kind, need):
    label = {"bf16": "bf16", "int8": "int8", "e4m3": "fp8 (e4m3)"}[kind]
    return (
        PairedSpeedup(f"decode with {label} K/V (H=32, Hkv=8, D=128): ≥ {need:g}× the f32 "
                      f"decode's speed (paired within one run)", f"decode_{kind}", DECODE, need,
                      DECODE_HINT),
        Hinted(Fraction(f"decode with {label} K/V: ≥ 80 % of the read bandwidth (bytes of K/V "
                        f"as stored{', + scales' if kind == 'int8' else ''})",
                        (f"decode_{kind}",), DECODE, 0.80, key="frac_read",
                        what="of read ({read} GB/s)"), DECODE_HINT),
    )


def prefill_bf16(need, cpu):
    return PairedSpeedup(f"bf16 forward (prefill, S=1024–4096, D=64/128, causal and not) ≥ "
                         f"{need:g}× the f32 forward's speed ({cpu}; paired within one run)",
                         "attention_forward_bf16", REPORT_SHAPES, need, PREFILL_HINT)


def bf16_vs_peers(what, op, peer_op, hint):
    return Hinted(PeerSpeedup(f"{what} in bf16: faster than every peer's bf16 ("
                              + ", ".join(BF16_PEERS) + ") on every shape", op,
                              REPORT_SHAPES if not op.startswith("decode") else DECODE,
                              BF16_PEERS, 1.0, every_shape=True, peer_op=peer_op), hint)


LOW_PRECISION_TARGETS = (
    *decode_stored("bf16", 1.8),
    *decode_stored("int8", 3.0),
    *decode_stored("e4m3", 3.0),
    ByCpu(prefill_bf16(1.6, "this CPU has AVX512-BF16"),
          prefill_bf16(0.9, "this CPU has no AVX512-BF16 arithmetic")),
    bf16_vs_peers("attention forward", "attention_forward_bf16", None, PREFILL_HINT),
    bf16_vs_peers("attention backward (from the saved state)", "attention_backward_saved_bf16",
                  "attention_backward_bf16", BACKWARD_HINT),
    bf16_vs_peers("decode", "decode_bf16", None, DECODE_HINT),
    # ggml's q8_0 K/V beside tandem's int8 (measured, no target ratio)
    VersusPeers("decode_int8", DECODE, ("ggml_fa_q8_0",), "ggml q8_0"),
)


def forward_vs(peers, need):
    label = " / ".join(peers) + (" (the faster of the two)" if len(peers) > 1 else "")
    return PeerSpeedup(f"attention forward, no mask, D=64/128, S=1024–4096: ≥ {need:g}× faster "
                       f"than {label}", "attention_forward", attn(S=Range(1024, 4096)), peers,
                       need, every_shape=True)


def causal_vs_plain(D):
    return TimeRatio(f"causal forward (S=2048, D={D}) ≤ 0.55× the unmasked time",
                     Pick("attention_forward", attn(S=2048, D=D, causal=True)),
                     Pick("attention_forward", attn(S=2048, D=D)), at_most=0.55)


def scaling(op, causal):
    tag = "B1_H8_S2048_D128" + ("_causal" if causal else "")
    sel = attn(S=2048, D=128, causal=causal)
    return TimeRatio(f"{op.replace('attention_', '')} {tag}: 2 threads ≥ 1.8× 1 thread",
                     Pick(op, sel, threads=1), Pick(op, sel, threads=2), at_least=1.8)


TARGETS = (
    Fraction("attention forward, no mask, D=128, S ≥ 2048: ≥ 85 % of FMA peak",
             ("attention_forward",), attn(S=Range(2048), D=128), 0.85),
    Fraction("attention forward, no mask, D=64, S ≥ 2048: ≥ 80 % of FMA peak",
             ("attention_forward",), attn(S=Range(2048), D=64), 0.80),
    forward_vs(("openvino_sdpa",), 1.10),
    forward_vs(("onnxruntime_attention",), 1.25),
    forward_vs(("torch_sdpa",), 2.0),
    forward_vs(("ggml_fa_f32", "ggml_fa_f16"), 2.5),
    Fraction("attention forward, no mask, S=512 (D=64 and 128): ≥ 65 % of FMA peak",
             ("attention_forward",), attn(S=512), 0.65),
    Fraction("attention forward, no mask, S=256 (D=64 and 128): ≥ 50 % of FMA peak",
             ("attention_forward",), attn(S=256), 0.50),
    Fraction("decode (Sq=1, H=32, Hkv=8, D=128, B=1–8, Sk=1k–32k): ≥ 80 % of the read bandwidth",
             ("decode",), DECODE, 0.80, key="frac_read", what="of read ({read} GB/s)"),
    PeerSpeedup("decode: ≥ 2× faster than PyTorch eager", "decode", DECODE, ("torch_eager",), 2.0),
    PeerSpeedup("decode: ≥ 4× faster than PyTorch sdpa", "decode", DECODE, ("torch_sdpa",), 4.0),
    Efficiency("attention backward rerunning the forward (S=2048, D=128; FLOPs = 2.5× forward): "
               "≥ 65 % of FMA peak", "attention_backward", S2048_D128, 0.65),
    Efficiency("attention backward from the saved state (S=2048, D=128; FLOPs = 2.5× forward): "
               "≥ 80 % of FMA peak", "attention_backward_saved", S2048_D128, 0.80),
    Fraction("attention backward, dQ / dK / dV alone (S=2048, D=128): ≥ 55 % of FMA peak",
             ("attention_backward_dq", "attention_backward_dk", "attention_backward_dv"),
             S2048_D128, 0.55),
    BlockProjections("attention block projections (B=8, S=512, E=768, H=12): ≥ 75 % of FMA peak",
                     0.75),
    Streaming("streaming ops (RoPE, axial RoPE, SwiGLU, forward and backward): "
              "≥ 85 % of copy bandwidth", STREAMING_OPS,
              tuple(op for op in STREAMING_OPS if not op.endswith("_qk")), 0.85),
    causal_vs_plain(128),
    causal_vs_plain(64),
    # ggml beside tandem on RoPE, SwiGLU and decode (measured, no target ratio)
    VersusPeers("rope_forward", None, GGML, "ggml"),
    VersusPeers("swiglu_forward", None, GGML, "ggml"),
    VersusPeers("decode", DECODE, GGML, "ggml"),
    # earlier targets, kept
    PeerAt("forward vs PyTorch SDPA at B=1 H=8 S=4096 D=128 causal: ≥ 4× faster",
           "attention_forward", "attention_forward", S4096_D128_CAUSAL, "torch_sdpa", 4.0),
    PeerAt("backward (from the saved state) vs PyTorch SDPA at B=1 H=8 S=4096 D=128 causal: "
           "≥ 2× faster", "attention_backward_saved", "attention_backward", S4096_D128_CAUSAL,
           "torch_sdpa", 2.0),
    ExtraMemory("forward extra memory at S=16384, D=128 ≤ 64 MiB beyond inputs/outputs",
                "attention_forward", attn(S=16384, D=128), 64),
    ExtraMemory("backward extra memory at S=16384, D=128 ≤ 64 MiB beyond inputs/outputs",
                "attention_backward", attn(S=16384, D=128), 64),
    scaling("attention_forward", False),
    scaling("attention_forward", True),
    scaling("attention_backward", False),
    scaling("attention_backward", True),
    # the attention features against their plain equivalents (same run)
    # (bench_features.cpp's paired sides: t_plain / t_feature of the same rounds)
    PairedSpeedup("packed sequences: time per token ≤ 1.10× a dense batch of equal lengths "
                  "(≥ 0.91× its speed, paired)", "attention_features", None, 1 / 1.10,
                  tags=("varlen", "paired")),
    PairedSpeedup("paged decode: ≥ 90 % of the contiguous decode's bandwidth (paired)",
                  "attention_features", None, 0.90, tags=("paged_decode", "paired")),
    # FlexAttention-written masks (bench_flex.cpp), each a native form (SPEC §13.5)
    PairedSpeedup("flex-written causal, window, softcap, ALiBi, document: ≥ 0.85× the native "
                  "path's speed (t_native ÷ t_flex, paired in each round)",
                  "attention_features", None, 0.85, tags=("flex", "paired")),
    PairedSpeedup("flex sliding window 128 at S = 8192: ≥ 0.8× the speed its block density "
                  "predicts (the dense S = 2048 call's time per block × kept blocks, paired)",
                  "attention_features", None, 0.8, tags=("flex", "density")),
    PeerSpeedup("flex forward (each form, tandem.flex_attention from Python): ≥ 1.5× faster "
                "than PyTorch's compiled flex_attention", "attention_features", None,
                ("torch_flex_compiled",), 1.5, every_shape=True, tags=("flex", "feature")),
    # the flex backward beside torch's only CPU backward of it (measured, no target ratio)
    VersusPeers("flex_backward", None, ("torch_sdpa_math",),
                "autograd through SDPA's math path, mask materialized"),
    # low-precision storage (SPEC §10), each type paired with f32 in the same iterations
    *LOW_PRECISION_TARGETS,
    # the roofline itself: the figures above are trustworthy only if it held still
    RooflineSteady("roofline measured at the start and at the end of the run: within 10 % of "
                   "each other", 0.10),
)


def evaluate(res, targets=TARGETS):
    """[Outcome] of every target on Results `res`, in the order of `targets`."""
    return [o for t in targets for o in t.evaluate(res)]
