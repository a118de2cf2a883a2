# SPDX-License-Identifier: Apache-2.0
"""The report's data, typed: tandem_bench's measurements, the peers' and the roofline, read
from raw/run.json. Every measurement's shape is the parameters that tandem_bench's plan gives
its benchmark (B, H, Hkv, Sq, Sk, D, Dv, causal, S, E, flop, ...), never parsed from its name;
look-ups select shapes by those parameters (`where`, `attn`)."""
import math
from dataclasses import dataclass, field
from typing import NamedTuple, Optional

from .paired import PEER_SPAN, Spread, paired_ratios, spread

TIME_UNIT = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}

# The ops whose shapes are tandem_bench's AttnShape (bench/bench_common.hpp).
ATTENTION_OPS = ("attention_forward", "attention_backward", "attention_backward_saved",
                 "attention_backward_dq", "attention_backward_dk", "attention_backward_dv")

ROOFLINE_KIND = {"roofline_fma": "peak", "roofline_copy": "copy", "roofline_read": "read"}

# The storage types a benchmark tagged `stored` times in turn inside each iteration
# (bench_paired.hpp), in the order of the report's tables; f32 is the one the others are
# paired with. bf16_dot: the bf16 forward with the AVX512-BF16 products switched on (off by
# default; timed only where the CPU has them).
STORED_KINDS = ("f32", "bf16", "f16", "bf16_dot", "int8", "e4m3")


# ---- shapes ------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Shape:
    """One benchmark's shape: its tag (the name's shape part, e.g. B1_H8_S2048_D128_causal,
    shown in tables and joining other programs' results) and tandem_bench's parameters."""
    tag: str
    params: dict = field(default_factory=dict)

    def num(self, name, default=None):
        """Parameter `name` as tandem_bench wrote it (a float), or `default`."""
        return self.params.get(name, default)

    def _int(self, name):
        v = self.params.get(name)
        return None if v is None else int(v)

    B = property(lambda self: self._int("B"))
    H = property(lambda self: self._int("H"))
    Hkv = property(lambda self: self._int("Hkv"))
    Sq = property(lambda self: self._int("Sq"))
    Sk = property(lambda self: self._int("Sk"))
    D = property(lambda self: self._int("D"))
    Dv = property(lambda self: self._int("Dv"))
    E = property(lambda self: self._int("E"))

    @property
    def S(self):
        """The sequence length: the parameter S, or Sq where Sq = Sk (else None)."""
        if "S" in self.params:
            return self._int("S")
        return self.Sq if self.Sq is not None and self.Sq == self.Sk else None

    @property
    def causal(self):
        return bool(self.params.get("causal", 0))

    @property
    def plain_heads(self):
        """Every query head has K and V heads of its own, V as wide as K (Hkv = H, Dv = D)."""
        return self.Hkv is not None and self.Hkv == self.H and self.Dv == self.D


@dataclass(frozen=True)
class Range:
    """Values from lo to hi, both included (a shape selector's field)."""
    lo: float = -math.inf
    hi: float = math.inf

    def __contains__(self, value):
        return value is not None and self.lo <= value <= self.hi


ANY = Range()


@dataclass(frozen=True)
class Where:
    """A shape selector: (Shape attribute, wanted) pairs; wanted is a value, a tuple of
    values or a Range."""
    fields: tuple

    def __call__(self, shape):
        return all(accepts(want, getattr(shape, name)) for name, want in self.fields)


def accepts(want, got):
    return got in want if isinstance(want, (Range, tuple)) else got == want


def where(**fields):
    return Where(tuple(fields.items()))


def attn(S=ANY, D=(64, 128), causal=False, B=1, H=8):
    """The report's attention family: B = 1, H = 8 heads with K and V heads of their own
    (Hkv = H), Sq = Sk = S, Dv = D."""
    return where(B=B, H=H, S=S, D=D, causal=causal, plain_heads=True)


# ---- measurements --------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Measurement:
    """One tandem_bench result (Google Benchmark's JSON) and its plan entry."""
    name: str
    op: str
    backend: str
    shape: Shape
    threads: int
    tags: tuple
    seconds: float  # mean wall time of one call
    gflops: Optional[float] = None
    gbs: Optional[float] = None
    frac_peak: Optional[float] = None  # of the FMA peak at the same thread count
    frac_copy: Optional[float] = None  # of the copy bandwidth
    frac_read: Optional[float] = None  # of the read bandwidth (ops that only read)
    extra_mib: Optional[float] = None  # peak-RSS growth of the first call; < 0: unknown
    iterations: Optional[int] = None
    gflops_wall: Optional[float] = None  # the FMA probe by the wall clock
    when: Optional[str] = None  # roofline probes: "start" or "end" of the run
    # rows split from a `stored` benchmark: the median over its iterations of f32's time ÷
    # this type's time in the same iteration, and that ratio's quartiles
    speedup: Optional[float] = None
    speedup_lo: Optional[float] = None
    speedup_hi: Optional[float] = None

    @staticmethod
    def parse(r):
        """The Measurement of result `r` (its plan entry under "_spec")."""
        s = r.get("_spec", {})
        return Measurement(
            name=r["name"], op=s.get("op"), backend=s.get("backend"),
            shape=Shape(s.get("shape"), s.get("params", {})),
            threads=s.get("threads", int(r.get("threads", 1))), tags=tuple(s.get("tags", [])),
            seconds=r["real_time"] * TIME_UNIT[r.get("time_unit", "ns")],
            gflops=r.get("GFLOP/s"), gbs=r.get("GB/s"), frac_peak=r.get("frac_peak"),
            frac_copy=r.get("frac_copy"), frac_read=r.get("frac_read"),
            extra_mib=r.get("extra_MiB"), iterations=r.get("iterations"),
            gflops_wall=r.get("GFLOP/s_wall"), when=r.get("_when"),
            # a benchmark that times two calls in turn (bench_flex.cpp's paired sides)
            speedup=r.get("median_speedup"), speedup_lo=r.get("speedup_p25"),
            speedup_hi=r.get("speedup_p75"))


@dataclass(frozen=True, eq=False)
class PeerMeasurement:
    """One peer's time on a planned benchmark (bench/peers/peers.py's results)."""
    peer: str
    op: str
    shape: Shape
    threads: int
    seconds: float
    gflops: Optional[float] = None
    gbs: Optional[float] = None
    extra_mib: Optional[float] = None
    note: Optional[str] = None
    # timed in alternation with tandem through Python in the same process: seconds per call
    # of each in every round (peers.py's measure_paired); empty when timed alone
    peer_rounds: tuple = ()
    tandem_rounds: tuple = ()

    @property
    def speedup(self):
        """tandem's speed-up over this peer, the Spread of the per-round ratios (the peer's
        time ÷ tandem's in the same round) between the percentiles PEER_SPAN, or None when
        not timed in alternation."""
        if not self.tandem_rounds:
            return None
        return spread(paired_ratios(self.peer_rounds, self.tandem_rounds), PEER_SPAN)


@dataclass(frozen=True)
class PeerFailure:
    peer: Optional[str]
    op: str
    shape: str
    threads: Optional[int]
    error: str


class Drift(NamedTuple):
    kind: str  # FMA peak, copy or read
    threads: int
    start: float
    end: float
    change: float  # end / start − 1


@dataclass
class Roofline:
    """The machine's limits measured in the run: {threads: figure} at its start (every
    fraction divides by them) and, in `end`, the same at its end."""
    peak: dict = field(default_factory=dict)  # FMA GFLOP/s by each thread's CPU time
    peak_wall: dict = field(default_factory=dict)  # the same by the wall clock
    copy: dict = field(default_factory=dict)  # GB/s read + written
    read: dict = field(default_factory=dict)  # GB/s read
    end: dict = field(default_factory=lambda: {"peak": {}, "copy": {}, "read": {}})
    # every probe of the run, in order: (when: start, before <op>, end; kind; threads; value)
    points: list = field(default_factory=list)

    def add(self, m):
        kind = ROOFLINE_KIND[m.op]
        value = m.gflops if kind == "peak" else m.gbs
        self.points.append((m.when, kind, m.threads, value))
        if m.when not in (None, "start", "end"):
            return  # a probe before an op group: its fractions were divided by it
        if m.when == "end":
            self.end[kind][m.threads] = value
            return
        getattr(self, kind)[m.threads] = value
        if kind == "peak":
            self.peak_wall[m.threads] = m.gflops_wall

    def spread(self):
        """{(kind, threads): (lowest, highest, probes)} over every probe of the run."""
        out = {}
        for _, kind, t, v in self.points:
            if v:
                lo, hi, n = out.get((kind, t), (v, v, 0))
                out[(kind, t)] = (min(lo, v), max(hi, v), n + 1)
        return out

    def drift(self):
        """[Drift] of every figure measured at both ends of the run, or None when the end was
        not measured."""
        out = []
        for kind, key in (("FMA peak", "peak"), ("copy", "copy"), ("read", "read")):
            start, end = getattr(self, key), self.end[key]
            for t in sorted(set(start) & set(end)):
                if start[t] and end[t]:
                    out.append(Drift(kind, t, start[t], end[t], end[t] / start[t] - 1))
        return out or None


# The kinds a benchmark tagged `invariance` times in turn inside each round
# (bench_invariance.cpp), in the order of the report's table: the default order (the
# baseline), the invariant order, and the default order with one ingredient of the
# invariant one imitated by a Geometry field.
INVARIANCE_KINDS = ("default", "invariant", "no_edge", "wide_decode", "no_split", "chunk1024",
                    "one_part")


@dataclass(frozen=True, eq=False)
class InvarianceRow:
    """One `invariance` benchmark: its case (prefill, decode, paged_decode, backward,
    decode_bf16), shape and, for every kind it timed, the median time of one call (s) and
    the Spread of the per-round ratio of that kind's time to the default's."""
    name: str
    case: str
    shape: Shape
    threads: int
    seconds: dict  # {kind: median seconds of one call}
    cost: dict  # {kind: Spread of t_kind / t_default over the rounds}

    @staticmethod
    def parse(r):
        s = r.get("_spec", {})
        tags = s.get("tags", [])
        case = next((t for t in tags if t != "invariance"), "?")
        n = int(r.get("paired_iterations", 0))
        seconds, cost = {}, {}
        for k in INVARIANCE_KINDS:
            if f"{k}_cost_median" not in r:
                continue
            seconds[k] = r[f"{k}_median_ms"] * 1e-3
            cost[k] = Spread(r[f"{k}_cost_median"], r[f"{k}_cost_p25"], r[f"{k}_cost_p75"], n)
        return InvarianceRow(name=r["name"], case=case,
                             shape=Shape(s.get("shape"), s.get("params", {})),
                             threads=s.get("threads", 1), seconds=seconds, cost=cost)


# ---- the run -------------------------------------------------------------------------------


def stored_op(op, kind):
    """The op of storage type `kind`'s row split from stored benchmark op `op`:
    decode_stored → decode_bf16, attention_forward_stored → attention_forward_bf16."""
    return op.removesuffix("_stored") + "_" + kind


def split_stored(r):
    """The Measurement of every storage type timed in stored benchmark result `r`: each with
    its own mean time, rate and fraction, and its paired speed-up over f32."""
    s = r.get("_spec", {})
    params = s.get("params", {})
    rows = []
    for kind in STORED_KINDS:
        if f"{kind}_ms" not in r:
            continue
        decode = f"{kind}_GB/s" in r
        p = dict(params, bytes=params[f"bytes_{kind}"]) if f"bytes_{kind}" in params else params
        rows.append(Measurement(
            name=f"{r['name']}#{kind}", op=stored_op(s.get("op", ""), kind),
            backend=s.get("backend"), shape=Shape(s.get("shape"), p),
            threads=s.get("threads", int(r.get("threads", 1))),
            tags=tuple(s.get("tags", [])) + (kind,), seconds=r[f"{kind}_ms"] * 1e-3,
            gflops=None if decode else r.get(f"{kind}_GFLOP/s"),
            gbs=r.get(f"{kind}_GB/s"), frac_peak=r.get(f"{kind}_frac_peak"),
            frac_read=r.get(f"{kind}_frac_read"), iterations=r.get("iterations"),
            speedup=r.get(f"{kind}_median_speedup"), speedup_lo=r.get(f"{kind}_speedup_p25"),
            speedup_hi=r.get(f"{kind}_speedup_p75")))
    return rows


def parse_peer(p, spec):
    """The PeerMeasurement of peers.py's record `p` on planned benchmark `spec` (or None)."""
    return PeerMeasurement(
        peer=p["peer"], op=p["op"], shape=Shape(p.get("shape"), spec["params"] if spec else {}),
        threads=p["threads"], seconds=p["seconds"], gflops=p.get("GFLOP/s"),
        gbs=p.get("GB/s"), extra_mib=p.get("extra_MiB"), note=p.get("note"),
        peer_rounds=tuple(p.get("peer_rounds_s", ())),
        tandem_rounds=tuple(p.get("tandem_rounds_s", ())))


def parse_peer_failure(p):
    return PeerFailure(peer=p.get("peer"), op=p.get("op", ""), shape=p.get("shape", ""),
                       threads=p.get("threads"), error=p["error"])


@dataclass
class Results:
    """Everything one run measured (raw/run.json), and look-ups by op, shape and threads.
    Look-ups default to the optimized backend at the run's main thread count."""
    rows: list  # Measurement of every tandem op (not the roofline), in the run's order
    errors: list  # (benchmark name, message) of every benchmark that failed
    roofline: Roofline
    peer_rows: list  # PeerMeasurement
    peer_errors: list  # PeerFailure
    peers_doc: dict  # peers.py's document: versions, missing, note, disabled, no_venv
    accuracy: dict  # tandem_accuracy's document
    info: dict  # the machine (machine.py)
    plan: dict  # tandem_bench --plan
    python: dict  # bench/python/python_bench.py's document
    profiles: dict = field(default_factory=dict)  # {benchmark: profile.py's profile}
    invariance: list = field(default_factory=list)  # InvarianceRow, in the run's order

    @staticmethod
    def parse(bench, peers, accuracy, info, plan, python=None, profiles=None):
        rows, errors, roofline, invariance = [], [], Roofline(), []
        for r in bench:
            if r.get("error_occurred"):
                errors.append((r.get("name"), r.get("error_message", "")))
            elif r.get("run_type", "iteration") == "iteration":
                m = Measurement.parse(r)
                if m.op in ROOFLINE_KIND:
                    roofline.add(m)
                elif "stored" in m.tags:
                    rows.extend(split_stored(r))
                elif "invariance" in m.tags:
                    invariance.append(InvarianceRow.parse(r))
                else:
                    rows.append(m)
        by_name = {s["name"]: s for s in plan.get("benchmarks", [])}
        by_shape = {(s["op"], s["shape"]): s for s in reversed(plan.get("benchmarks", []))}
        records = peers.get("results", [])
        peer_rows = [parse_peer(p, by_name.get(p.get("tandem_name"))
                                or by_shape.get((p.get("op"), p.get("shape"))))
                     for p in records if "seconds" in p]
        peer_errors = [parse_peer_failure(p) for p in records if "error" in p]
        return Results(rows, errors, roofline, peer_rows, peer_errors, peers, accuracy, info,
                       plan, python or {}, profiles or {}, invariance)

    @staticmethod
    def from_run(run):
        """The Results of raw/run.json's document."""
        return Results.parse(run["bench"], run["peers"], run["accuracy"], run["info"],
                             run["plan"], run.get("python"), run.get("profiles"))

    @property
    def main_threads(self):
        return self.plan.get("threads")

    def _threads(self, threads):
        return self.main_threads if threads is None else threads

    def select(self, op, sel=None, backend="optimized", threads=None):
        """The rows of op `op` (a name, a tuple, None: any) whose shape `sel` accepts (None:
        any), of `backend` at `threads` (None: the main thread count; a Range: any of those)."""
        threads = self._threads(threads)
        ops = op if isinstance(op, tuple) or op is None else (op,)
        return [r for r in self.rows if (ops is None or r.op in ops)
                and r.backend == backend and accepts(threads, r.threads)
                and (sel is None or sel(r.shape))]

    def one(self, op, sel, backend="optimized", threads=None):
        """The first row `select` gives, or None."""
        found = self.select(op, sel, backend, threads)
        return found[0] if found else None

    def with_tag(self, op, tag, backend="optimized", threads=None):
        """The row of op `op` on the shape tagged `tag` (a name other programs give it)."""
        return self.one(op, lambda shape: shape.tag == tag, backend, threads)

    def peer(self, op, tag, peer, threads=None):
        """Peer `peer`'s measurement of op `op` on the shape tagged `tag`, or None."""
        threads = self._threads(threads)
        for p in self.peer_rows:
            if p.op == op and p.shape.tag == tag and p.peer == peer and p.threads == threads:
                return p
        return None

    def peer_select(self, op, peer, sel, threads=None):
        threads = self._threads(threads)
        return [p for p in self.peer_rows if p.op == op and p.peer == peer
                and accepts(threads, p.threads) and sel(p.shape)]

    def peer_names(self, op=None):
        """The peers measured (on op `op`), in the order they first appear."""
        names = []
        for p in self.peer_rows:
            if (op is None or p.op == op) and p.peer not in names:
                names.append(p.peer)
        return names
