// SPDX-License-Identifier: Apache-2.0
// The attention features against their plain equivalents, each pair measured
// in the same run (op attention_features, tags `feature` and `plain`, the same
// shape tag, and the comparison's kind as a tag: `varlen`, `alibi`, `sinks`,
// `bias`, `dbias`, `dbias_1head` or `paged_decode`; the report's features
// table divides one by the other). The comparisons the report holds to a
// target (varlen, paged_decode) also have side `paired`: both calls timed in
// turn inside every round of one benchmark, for ratios of the same moments:
//  - packed sequences: n equal sequences packed (cu_seqlens) against a dense
//    batch B = n of the same length, forward and backward: the cost per
//    token (same tokens, same FLOPs);
//  - a paged decode step: a cache of 16-key blocks scattered over a pool
//    through a block table, against the same decode step over a contiguous
//    cache: bytes of K and V per second (both cycle through enough caches to
//    read K and V from memory);
//  - ALiBi (the standard slopes), sinks and an additive bias `[1, H, Sq, Sk]`
//    (a learned relative-position bias) against plain attention, forward and
//    backward (with sinks, dsinks too);
//  - the backward with a bias `[1, H, Sq, Sk]` or `[1, 1, Sq, Sk]` asking for
//    dbias too against the same backward without it (SPEC §3.1).
#include <algorithm>
#include <cstdint>
#include <exception>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "bench_paired.hpp"

namespace tandem::bench {
namespace {

/// One side of a comparison: a dense shape (D = Dv) and the feature it
/// turns on.
struct FeatureShape : AttnShape {
  bool packed = false;          ///< the B sequences packed as one batch entry
  bool sinks = false;           ///< a sink per head
  bool alibi = false;           ///< the standard ALiBi slopes
  bool bias = false;            ///< an additive bias `[1, H, Sq, Sk]` (mask kind bias, B = 1)
  bool bias_one_head = false;   ///< the bias `[1, 1, Sq, Sk]` instead, shared by the heads
  bool dbias = false;           ///< the backward computes dbias too
  std::int64_t block_size = 0;  ///< a paged cache of blocks of this many keys

  /// The dense shape's parameters with the feature turned on.
  [[nodiscard]] AttentionParams params() const {
    AttentionParams p = AttnShape::params();
    if (packed) {
      p.B = 1;
      p.num_seqs = B;
      p.Sq = B * Sq;
      p.Sk = B * Sk;
    }
    p.sinks = sinks;
    p.alibi = alibi ? AlibiKind::per_head : AlibiKind::none;
    if (bias) {
      p.mask = MaskKind::bias;
      p.bias_heads = bias_one_head ? 1 : H;
    }
    return p;
  }
  /// Bytes of K and V one call reads.
  [[nodiscard]] double kv_bytes() const {
    return 4.0 * static_cast<double>(B * Sk * Hkv * (D + Dv));
  }
};

/// The inputs and outputs of one attention call of a FeatureShape (a packed
/// call's cu_seqlens, sinks, ALiBi slopes).
struct CallFixture {
  AttentionPlan plan;
  std::vector<float> q, k, v, out, dout, dq, dk, dv, sinks, slopes, dsinks, bias, dbias;
  std::vector<std::int32_t> cu;

  CallFixture(const FeatureShape& s, bool backward) : plan(AttentionPlan::make(s.params())) {
    q = random_buffer(static_cast<std::size_t>(plan.q.extent), 1);
    k = random_buffer(static_cast<std::size_t>(plan.k.extent), 2);
    v = random_buffer(static_cast<std::size_t>(plan.v.extent), 3);
    out = zero_buffer(static_cast<std::size_t>(plan.o.extent));
    if (s.sinks) sinks = random_buffer(static_cast<std::size_t>(plan.H), 5);
    if (s.alibi) slopes = alibi_standard_slopes(plan.H);
    if (s.bias) bias = random_buffer(static_cast<std::size_t>(plan.mask_size()), 6);
    for (std::int64_t n = 0; s.packed && n <= s.B; ++n)
      cu.push_back(static_cast<std::int32_t>(n * s.Sq));
    if (backward) {
      dout = random_buffer(static_cast<std::size_t>(plan.o.extent), 4);
      dq = zero_buffer(static_cast<std::size_t>(plan.dq.extent));
      dk = zero_buffer(static_cast<std::size_t>(plan.dk.extent));
      dv = zero_buffer(static_cast<std::size_t>(plan.dv.extent));
      dsinks = zero_buffer(sinks.size());
      if (s.dbias) dbias = zero_buffer(bias.size());
    }
  }
  [[nodiscard]] AttentionInputs<float> inputs() const {
    AttentionInputs<float> in{q, k, v, bias};
    in.sinks = sinks;
    in.alibi_slopes = slopes;
    in.cu_seqlens_q = cu;
    in.cu_seqlens_k = cu;
    return in;
  }
};

/// Several decode caches, together far larger than the last-level cache,
/// visited in turn (as in the decode benchmark): contiguous, or (block_size
/// > 0) blocks of one shared pool, each cache's blocks scattered over it by
/// its own block table.
struct DecodeCaches {
  AttentionPlan plan;
  std::vector<float> q, out;
  std::vector<std::vector<float>> k, v;  ///< one per cache, or the pool
  std::vector<std::vector<std::int32_t>> tables;
  std::vector<std::int32_t> lens;
  std::size_t next = 0, caches = 0;

  DecodeCaches(const FeatureShape& s, std::size_t n) : caches(n) {
    AttentionParams p = s.params();
    const std::int64_t per_cache = s.block_size > 0 ? s.Sk / s.block_size : 0;
    if (s.block_size > 0) {
      p.Sk = 0;
      p.num_blocks = per_cache * static_cast<std::int64_t>(n);
      p.block_size = s.block_size;
      p.max_blocks = per_cache;
    }
    plan = AttentionPlan::make(p);
    q = random_buffer(static_cast<std::size_t>(plan.q.extent), 11);
    out = zero_buffer(static_cast<std::size_t>(plan.o.extent));
    const std::size_t pools = s.block_size > 0 ? 1 : n;
    for (std::size_t c = 0; c < pools; ++c) {
      k.push_back(random_buffer(static_cast<std::size_t>(plan.k.extent), 100 + 2 * c));
      v.push_back(random_buffer(static_cast<std::size_t>(plan.v.extent), 101 + 2 * c));
    }
    if (s.block_size == 0) return;
    tables = shuffled_block_tables(n, per_cache);
    lens.assign(static_cast<std::size_t>(s.B), static_cast<std::int32_t>(s.Sk));
  }
  /// The inputs of cache c.
  [[nodiscard]] AttentionInputs<float> inputs(std::size_t c) const {
    if (tables.empty()) return {q, k[c], v[c], {}};
    AttentionInputs<float> in{q, k[0], v[0], {}};
    in.block_table = tables[c];
    in.cache_seqlens = lens;
    return in;
  }
};

/// The spec of one side of comparison `what` (e.g. "varlen_forward") of kind
/// `kind` (e.g. "varlen", one of its tags), with the dense shape's parameters
/// (B, H, Hkv, Sq, Sk, D, Dv, causal; a packed call packs those B sequences).
/// `side` is `feature`, `plain` or `paired` (both, add_paired).
Spec feature_spec(const std::string& kind, const std::string& what, const BackendUnderTest& bu,
                  const FeatureShape& s, const std::string& side) {
  Spec spec;
  spec.op = "attention_features";
  spec.backend = bu.name;
  spec.shape = what + "_" + s.tag();
  spec.threads = bu.threads;
  spec.name = spec.op + "/" + spec.backend + "/" + spec.shape + "/" + side;
  spec.tags = {"features", kind, side};
  s.describe(spec);
  return spec;
}

const char* side(bool feature) {
  return feature ? "feature" : "plain";
}

/// One call of f: its forward, or its backward (dq, dk, dv, and dsinks,
/// dbias where it has them).
void run_call(const Backend& be, CallFixture& f, bool backward) {
  if (backward) {
    be.attention_backward(f.plan, f.inputs(), f.dout, {f.dq, f.dk, f.dv, f.dsinks, f.dbias});
  } else {
    be.attention_forward(f.plan, f.inputs(), f.out);
  }
}

/// One decode step of f, over its next cache.
void run_step(const Backend& be, DecodeCaches& f) {
  const std::size_t c = f.next;
  f.next = (f.next + 1) % f.caches;
  be.attention_forward(f.plan, f.inputs(c), f.out);
}

/// The plain and the feature side of a comparison, cached as one fixture.
template <class Fixture>
struct SidePair {
  Fixture plain, feature;
};

/// Registers comparison `what` (kind `kind`) with its plain call and its
/// feature call timed in turn inside every round of one benchmark (side
/// `paired`, PairedTimes kinds plain then feature): its counters
/// `median_speedup`, `speedup_p25`, `speedup_p75` are the median and
/// quartiles of t_plain / t_feature over the rounds, the feature's speed
/// against the plain call's from the same moments. `make(shape)` builds one
/// side's fixture, `run(backend, fixture)` makes one call of it.
template <class Fixture, class Make, class Run>
void add_paired(const std::string& kind, const std::string& what, const BackendUnderTest& bu,
                const FeatureShape& feature, const FeatureShape& plain, Make make, Run run) {
  auto be = std::make_shared<Backend>(bu.make());
  add_paired_benchmark<SidePair<Fixture>>(
      feature_spec(kind, what, bu, feature, "paired"), {"plain", "feature"},
      [feature, plain, make] {
        return SidePair<Fixture>{make(plain), make(feature)};
      },
      [be, run](SidePair<Fixture>& x, std::size_t k) { run(*be, k == 0 ? x.plain : x.feature); },
      [](benchmark::State& st, const PairedTimes& times, const SidePair<Fixture>&) {
        times.set_speedup_counters(st, 1);
      });
}

/// Registers the forward (or backward: dq, dk, dv, and dsinks with sinks) of
/// `s` as one side of comparison `kind`_forward (or `kind`_backward).
void add_call(const std::string& kind, const BackendUnderTest& bu, const FeatureShape& s,
              bool feature, bool backward) {
  Spec spec =
      feature_spec(kind, kind + (backward ? "_backward" : "_forward"), bu, s, side(feature));
  const double flops = (backward ? 2.5 : 1.0) * s.forward_flops();
  spec.params["flop"] = flops;
  const std::string key = spec.name;
  const int threads = bu.threads;
  auto be = std::make_shared<Backend>(bu.make());
  add(spec, [be, s, backward, flops, threads, key](benchmark::State& st) {
    CallFixture* fx = nullptr;
    try {
      fx = &cached_fixture<CallFixture>(key,
                                        [&] { return std::make_unique<CallFixture>(s, backward); });
    } catch (const std::exception& e) {
      st.SkipWithError(e.what());
      return;
    }
    run_call(*be, *fx, backward);  // warm-up
    const auto loop_start = std::chrono::steady_clock::now();
    for (auto _ : st) {
      run_call(*be, *fx, backward);
      benchmark::ClobberMemory();
    }
    set_flop_counters(st, flops, threads, seconds_since(loop_start));
  });
}

/// Registers a decode step over `caches` caches of `s` (paged when
/// s.block_size > 0) as one side of comparison `kind`.
void add_decode_step(const std::string& kind, const BackendUnderTest& bu, const FeatureShape& s,
                     std::size_t caches) {
  Spec spec = feature_spec(kind, kind, bu, s, side(s.block_size > 0));
  const double bytes = s.kv_bytes();
  spec.params["bytes"] = bytes;
  spec.params["block_size"] = static_cast<double>(s.block_size);
  const std::string key = spec.name;
  const int threads = bu.threads;
  auto be = std::make_shared<Backend>(bu.make());
  add(spec, [be, s, caches, bytes, threads, key](benchmark::State& st) {
    DecodeCaches* fx = nullptr;
    try {
      fx = &cached_fixture<DecodeCaches>(key,
                                         [&] { return std::make_unique<DecodeCaches>(s, caches); });
      for (std::size_t c = 0; c < caches; ++c) {  // warm-up: every cache once
        be->attention_forward(fx->plan, fx->inputs(c), fx->out);
      }
    } catch (const std::exception& e) {
      st.SkipWithError(e.what());
      return;
    }
    const auto loop_start = std::chrono::steady_clock::now();
    for (auto _ : st) {
      run_step(*be, *fx);
      benchmark::ClobberMemory();
    }
    set_byte_counters(st, bytes, threads, seconds_since(loop_start));
  });
}

}  // namespace

void register_features() {
  if (!op_selected("attention_features")) return;
  const Config& c = config();
  const bool quick = c.preset == Preset::quick;
  for (const auto& bu : backends_at(c.threads, false)) {
    // packed sequences: n equal sequences against a batch of n
    FeatureShape dense;
    dense.B = 4;
    dense.Sq = dense.Sk = quick ? 256 : 1024;
    dense.causal = true;
    FeatureShape packed = dense;
    packed.packed = true;
    for (const bool backward : {false, true}) {
      if (quick && backward) continue;
      add_call("varlen", bu, packed, true, backward);
      add_call("varlen", bu, dense, false, backward);
      add_paired<CallFixture>(
          "varlen", std::string("varlen_") + (backward ? "backward" : "forward"), bu, packed, dense,
          [backward](const FeatureShape& s) { return CallFixture(s, backward); },
          [backward](const Backend& be, CallFixture& f) { run_call(be, f, backward); });
    }
    // ALiBi, sinks and a bias against plain attention
    FeatureShape plain;
    plain.Sq = plain.Sk = quick ? 512 : 2048;
    for (const bool backward : {false, true}) {
      if (quick && backward) continue;
      FeatureShape s = plain;
      if (backward) s.Sq = s.Sk = 1024;
      FeatureShape alibi = s, sinks = s, bias = s;
      alibi.alibi = true;
      sinks.sinks = true;
      bias.bias = true;
      add_call("alibi", bu, alibi, true, backward);
      add_call("alibi", bu, s, false, backward);
      add_call("sinks", bu, sinks, true, backward);
      add_call("sinks", bu, s, false, backward);
      add_call("bias", bu, bias, true, backward);
      add_call("bias", bu, s, false, backward);
      if (!backward) continue;
      // dbias asked for, against the same bias's backward without it
      for (const bool one_head : {false, true}) {
        FeatureShape without = bias;
        without.bias_one_head = one_head;
        FeatureShape with = without;
        with.dbias = true;
        const std::string kind = one_head ? "dbias_1head" : "dbias";
        add_call(kind, bu, with, true, true);
        add_call(kind, bu, without, false, true);
      }
    }
    // a decode step: one query against a 4096-token GQA cache, paged in
    // blocks of 16 keys or contiguous; 256 (quick) or 512 MiB of caches
    FeatureShape step;
    step.H = 32;
    step.Hkv = 8;
    step.Sq = 1;
    step.Sk = 4096;
    const auto caches = static_cast<std::size_t>(
        std::max(2.0, (quick ? 256.0 : 512.0) * 1048576.0 / step.kv_bytes()));
    FeatureShape paged = step;
    paged.block_size = 16;
    add_decode_step("paged_decode", bu, paged, caches);
    add_decode_step("paged_decode", bu, step, caches);
    add_paired<DecodeCaches>(
        "paged_decode", "paged_decode", bu, paged, step,
        [caches](const FeatureShape& s) { return DecodeCaches(s, caches); }, run_step);
  }
}

}  // namespace tandem::bench
