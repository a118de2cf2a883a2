#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""The report's results parser, shape selectors and target evaluator on a recorded run.

quick_run.json is raw/run.json of `report.py --preset quick --peers torch` (2-core Xeon),
cut down to the benchmarks the tests name, with the peers' and tandem through Python's
results on them (the build directory's path shortened). Expected figures are taken here from
the recorded JSON by benchmark name, not through the code under test.

Usage: PYTHONPATH=bench/report test_report.py
"""
import copy
import json
import os
import tempfile
import unittest

from tandem_report import document, targets
from tandem_report.results import ANY, Range, Results, Shape, attn, where

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "quick_run.json")) as f:
    RUN = json.load(f)

FWD = "attention_forward/optimized/"


def raw(name):
    """The recorded tandem_bench result of benchmark `name` (not the roofline's end)."""
    return next(r for r in RUN["bench"] if r["name"] == name and r.get("_when") != "end")


def seconds(r):
    return r["real_time"] * {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}[r["time_unit"]]


def by_target(outcomes):
    return {o.target: o for o in outcomes}


class ResultsTest(unittest.TestCase):
    def setUp(self):
        self.res = Results.from_run(RUN)

    def test_every_result_is_a_row_or_a_roofline_figure(self):
        n_roof = sum(1 for r in RUN["bench"] if r["name"].startswith("roofline"))
        self.assertEqual(len(self.res.rows), len(RUN["bench"]) - n_roof)
        self.assertEqual(self.res.errors, [])
        self.assertEqual(self.res.main_threads, 2)

    def test_shapes_come_from_the_plan_parameters(self):
        r = self.res.with_tag("attention_forward", "B1_H8_S2048_D128_causal")
        self.assertEqual((r.shape.B, r.shape.H, r.shape.S, r.shape.D), (1, 8, 2048, 128))
        self.assertTrue(r.shape.causal and r.shape.plain_heads)
        self.assertAlmostEqual(r.seconds, seconds(raw(FWD + "B1_H8_S2048_D128_causal")))
        d = self.res.select("decode")[0].shape
        self.assertEqual((d.Sq, d.Sk, d.H, d.Hkv, d.S), (1, 4096, 32, 8, None))
        self.assertFalse(d.plain_heads)
        blk = self.res.select("attention_block")[0].shape
        self.assertEqual((blk.B, blk.S, blk.E, blk.H), (2, 512, 768, 12))

    def test_feature_pairs_carry_their_kind_and_causal(self):
        rows = self.res.select("attention_features")
        self.assertEqual(sorted(r.tags[1] for r in rows), ["paged_decode"] * 2 + ["varlen"] * 2)
        self.assertTrue(all(r.shape.causal for r in rows if "varlen" in r.tags))

    def tags(self, sel):
        return sorted(r.shape.tag for r in self.res.select("attention_forward", sel))

    def test_selectors(self):
        tags = self.tags
        self.assertEqual(tags(attn(S=2048, D=128)), ["B1_H8_S2048_D128"])
        self.assertEqual(tags(attn(S=Range(1024), D=(64, 128))),
                         ["B1_H8_S2048_D128", "B1_H8_S2048_D64"])
        self.assertEqual(tags(attn(S=2048, causal=True)),
                         ["B1_H8_S2048_D128_causal", "B1_H8_S2048_D64_causal"])
        self.assertEqual(tags(where(H=12)), ["B2_H12_S512_D64"])
        one = self.res.select("attention_forward", attn(S=2048, D=128), threads=1)
        self.assertEqual([r.name for r in one], [FWD + "B1_H8_S2048_D128/threads:1"])
        self.assertEqual(len(self.res.select("attention_forward", attn(S=2048, D=128),
                                             threads=ANY)), 2)
        # Dv ≠ D or Hkv ≠ H is outside the family, though B, H, S and D match
        p = {"B": 1, "H": 8, "Hkv": 8, "Sq": 2048, "Sk": 2048, "D": 128, "Dv": 64}
        self.assertFalse(attn(S=2048, D=128)(Shape("x", p)))
        self.assertFalse(attn(S=2048, D=128)(Shape("x", dict(p, Dv=128, Hkv=2))))
        self.assertTrue(attn(S=2048, D=128)(Shape("x", dict(p, Dv=128))))

    def test_peers_take_the_shape_of_their_benchmark(self):
        p = self.res.peer("attention_forward", "B1_H8_S2048_D128", "torch_sdpa")
        self.assertEqual((p.shape.S, p.shape.D), (2048, 128))
        want = next(x for x in RUN["peers"]["results"] if x["peer"] == "torch_sdpa"
                    and x["op"] == "attention_forward")
        self.assertEqual(p.seconds, want["seconds"])

    def test_roofline_at_both_ends(self):
        roof = self.res.roofline
        start = raw("roofline_fma/probe/fp32/threads:2")["GFLOP/s"]
        end = next(r for r in RUN["bench"] if r["name"] == "roofline_fma/probe/fp32/threads:2"
                   and r.get("_when") == "end")["GFLOP/s"]
        self.assertEqual((roof.peak[2], roof.end["peak"][2]), (start, end))
        fma2 = next(d for d in roof.drift() if d.kind == "FMA peak" and d.threads == 2)
        self.assertAlmostEqual(fma2.change, end / start - 1)

    def test_a_failed_benchmark_is_an_error_not_a_row(self):
        run = copy.deepcopy(RUN)
        run["bench"].append({"name": "decode/optimized/x", "error_occurred": True,
                             "error_message": "out of memory"})
        res = Results.from_run(run)
        self.assertEqual(res.errors, [("decode/optimized/x", "out of memory")])
        self.assertEqual(len(res.rows), len(self.res.rows))


class TargetsTest(unittest.TestCase):
    D128 = "attention forward, no mask, D=128, S ≥ 2048: ≥ 85 % of FMA peak"
    SDPA = "attention forward, no mask, D=64/128, S=1024–4096: ≥ 2× faster than torch_sdpa"
    CAUSAL = "causal forward (S=2048, D=128) ≤ 0.55× the unmasked time"
    SCALING = "forward B1_H8_S2048_D128: 2 threads ≥ 1.8× 1 thread"

    def evaluate(self, run=RUN):
        return by_target(targets.evaluate(Results.from_run(run)))

    def test_every_target_in_order(self):
        outcomes = targets.evaluate(Results.from_run(RUN))
        names = [o.target for o in outcomes]
        self.assertEqual(names[:2], [self.D128, self.D128.replace("128", "64")
                                     .replace("85", "80")])
        self.assertEqual(names[-1], targets.TARGETS[-1].name)
        self.assertEqual(len(names), len(set(names)))
        self.assertTrue(all(o.status in ("met", "not met", "not measured") for o in outcomes))

    def test_fraction_of_peak(self):
        frac = raw(FWD + "B1_H8_S2048_D128")["frac_peak"]  # the quick preset's only S ≥ 2048
        o = self.evaluate()[self.D128]
        self.assertEqual(o.status, "met" if frac >= 0.85 else "not met")
        self.assertIn(f"B1_H8_S2048_D128 {100 * frac:.0f} %", o.measured)

    def test_fraction_flips_with_the_figure(self):
        for frac, status in ((0.9, "met"), (0.5, "not met")):
            run = copy.deepcopy(RUN)
            raw_of = {r["name"]: r for r in run["bench"]}
            raw_of[FWD + "B1_H8_S2048_D128"]["frac_peak"] = frac
            self.assertEqual(self.evaluate(run)[self.D128].status, status)
        run = copy.deepcopy(RUN)
        run["bench"] = [r for r in run["bench"] if r["name"] != FWD + "B1_H8_S2048_D128"]
        self.assertEqual(self.evaluate(run)[self.D128].status, "not measured")

    def test_speedup_over_a_peer(self):
        peer = {x["shape"]: x["seconds"] for x in RUN["peers"]["results"]
                if x["peer"] == "torch_sdpa" and x["op"] == "attention_forward"}
        ratios = {s: peer[s] / seconds(raw(FWD + s)) for s in peer if s.endswith(("D64", "D128"))
                  and int(s.split("_S")[1].split("_")[0]) >= 1024}
        o = self.evaluate()[self.SDPA]
        lo = min(ratios.values())
        self.assertIn(f"lowest {lo:.2f}×", o.measured)
        # the quick preset runs the peers on one of the shapes only: not met for the others
        n_dense = 2
        complete = len(ratios) == n_dense
        self.assertEqual(o.status, "met" if lo >= 2.0 and complete else "not met")

    def test_time_ratios(self):
        causal = seconds(raw(FWD + "B1_H8_S2048_D128_causal"))
        plain = seconds(raw(FWD + "B1_H8_S2048_D128"))
        one = seconds(raw(FWD + "B1_H8_S2048_D128/threads:1"))
        got = self.evaluate()
        self.assertEqual(got[self.CAUSAL].measured, f"{causal / plain:.2f}×")
        self.assertEqual(got[self.CAUSAL].status, "met" if causal / plain <= 0.55 else "not met")
        self.assertEqual(got[self.SCALING].measured, f"{one / plain:.2f}×")
        self.assertEqual(got[self.SCALING].status, "met" if one / plain >= 1.8 else "not met")

    def test_feature_pairs(self):
        name = "paged decode: ≥ 90 % of the contiguous decode's bandwidth"
        tag = "attention_features/optimized/paged_decode_B1_H32_Hkv8_Sq1_Sk4096_D128/"
        ratio = seconds(raw(tag + "feature")) / seconds(raw(tag + "plain"))
        o = self.evaluate()[name]
        self.assertEqual(o.status, "met" if ratio <= 1 / 0.90 else "not met")
        self.assertIn(f"{1 / ratio:.0%} of contiguous", o.measured)

    def test_shapes_the_quick_preset_leaves_out_are_not_measured(self):
        got = self.evaluate()
        for name in ("attention forward, no mask, S=256 (D=64 and 128): ≥ 50 % of FMA peak",
                     "forward extra memory at S=16384, D=128 ≤ 64 MiB beyond inputs/outputs"):
            self.assertEqual((got[name].status, got[name].measured), ("not measured", "–"))


class DocumentTest(unittest.TestCase):
    def test_report_md_lists_every_outcome(self):
        res = Results.from_run(RUN)
        outcomes = targets.evaluate(res)
        with tempfile.TemporaryDirectory() as out:
            document.write(res, outcomes, {}, out, RUN["preset"], RUN["seconds"])
            with open(os.path.join(out, "report.md")) as f:
                md = f.read()
            self.assertTrue(os.path.exists(os.path.join(out, "report.html")))
        counts = [sum(o.status == s for o in outcomes) for s in ("met", "not met", "not measured")]
        self.assertIn("**{} met, {} not met, {} not measured**".format(*counts), md)
        for o in outcomes:
            self.assertIn(f"| {o.target} | {o.measured} |", md)
        self.assertIn("## tandem through Python", md)
        self.assertIn("| B1_H8_S2048_D64 | 375.07 ms |", md)  # tandem through Python


if __name__ == "__main__":
    unittest.main()
