# SPDX-License-Identifier: Apache-2.0
"""The time left of a run: each benchmark's work (from its plan entry) divided by the rate
seen so far for its op, or a guess from the roofline before any was seen."""


def by_flop(spec):
    """True when the benchmark's rate is GFLOP/s (decode, which also counts FLOPs, is GB/s)."""
    return "flop" in spec["params"] and not spec["op"].startswith("decode")


# A benchmark tagged `stored` times this many storage types per iteration
# (bench_low_precision.cpp, bench_decode_stored.cpp); decode_stored runs at least 4 s.
STORED_TYPES = {"decode_stored": 5}
STORED_MIN_TIME = {"decode_stored": 4.0}


class Eta:
    """Remaining-time estimate from each benchmark's work and the rates seen so far."""

    def __init__(self, specs, min_time, peaks):
        self.min_time = min_time
        self.peaks = peaks
        self.rate = {}  # (op kind, backend) -> measured GFLOP/s or GB/s
        self.specs = specs
        self.scale = 1.0
        self.spent_est = 0.0
        self.spent = 0.0

    def guess(self, s):
        """Seconds benchmark `s` should take, its process start included."""
        p = s["params"]
        if s["op"].startswith("roofline"):
            return 3.0
        flop = by_flop(s)
        work = p.get("flop") if flop else p.get("bytes", p.get("bytes_f32", 0))
        stored = "stored" in s["tags"]
        if stored:  # every storage type in turn, each about as long as f32
            work *= STORED_TYPES.get(s["op"], 3)
        if "invariance" in s["tags"]:  # every kind in turn, at least 7 rounds
            work *= 7 * max(1, sum(1 for k in p if k.startswith("kind_")))
        rate = self.rate.get((s["op"], s["backend"], s["threads"]))
        if rate is None:
            peak, copy = self.peaks.get(s["threads"], (100.0, 10.0, None))[:2]
            if s["backend"] == "reference":
                rate = 0.5e9 if flop else 1e9
            else:
                rate = (0.3 * peak if flop else 0.5 * copy) * 1e9
        call = (work or 0) / rate
        setup = 0.4 + 1e-9 * 4 * (p.get("io_bytes", 0) or 0)
        if "memory" in s["tags"]:
            return setup + call  # one timed call
        # process start and buffer set-up, the warm-up call, then min_time worth of calls
        min_time = max(self.min_time, STORED_MIN_TIME.get(s["op"], 0.0) if stored else 0.0)
        return setup + call + max(min_time, call)

    def learn(self, s, result, seconds_taken, estimated):
        """Takes in the rate of `result` (the first result of `s`) and the time it took."""
        if result and not result.get("error_occurred"):
            key = (s["op"], s["backend"], s["threads"])
            rate = result.get("GFLOP/s") if by_flop(s) else result.get("GB/s")
            if rate:
                # larger shapes run faster: keep the best rate seen for this op
                self.rate[key] = max(self.rate.get(key, 0.0), rate * 1e9)
        self.spent += seconds_taken
        self.spent_est += estimated
        if self.spent_est > 0:
            self.scale = min(3.0, max(0.5, self.spent / self.spent_est))

    def remaining(self, rest):
        return self.scale * sum(self.guess(s) for s in rest)
