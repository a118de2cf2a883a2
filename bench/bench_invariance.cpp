// SPDX-License-Identifier: Apache-2.0
// The cost of batch-invariant inference (optimized::Geometry::invariant,
// SPEC §12): on the report's shapes, the optimized attention in its default
// order and in the invariant order timed in turn inside every round of one
// benchmark (PairedTimes), so that the ratio invariant ÷ default of each
// round comes from the same moments of the same run. Op `invariance`, tag
// `invariance` and the case as a second tag:
//  - prefill: the forward, Sq = Sk = S, dense and causal (H = Hkv = 8, as
//    bench_attention.cpp);
//  - decode: one query per sequence against GQA caches of Sk keys (H = 32,
//    Hkv = 8, D = 128), cycled so that K and V come from memory;
//  - paged_decode: the same over a cache of 16-key blocks scattered over a
//    pool by block tables;
//  - backward: the backward from the forward's saved out and lse, with few
//    (batch, kv head) pairs (B = 1, Hkv = 2), where the default splits each
//    pair's query blocks into parts whose dK/dV partials it adds;
//  - decode_bf16: bf16 K and V, where the default reads them in place (the
//    stored-decode kernel) and the invariant order widens them to f32 and
//    runs the float tiles.
//
// Beside the two, kinds that switch on one ingredient of the invariant order
// inside the default one, where a Geometry field can imitate it, so that each
// one's share of the cost shows: `no_edge` (edge_block = key_block: no 16-key
// blocks on a causal edge), `wide_decode` (decode_tiles = never: scores as
// the wide tile's d-ordered FMA chains), `no_split` (split_keys_min_chunks =
// 0: no split-key decode), `chunk1024` (split_keys_chunk = 1024, the
// invariant order's chunks) and `one_part` (backward_query_parts = 1). The
// invariant order's in-tile merge of 1024-key chunks has no such imitation:
// it is what the invariant ratio holds beyond the ingredients.
//
// Counters per kind k (PairedTimes, kind 0 = default): `<k>_median_ms`, and
// over the rounds i, with t_k,i the time of kind k in round i, the ratio
// r_i = t_k,i / t_default,i: `<k>_cost_median`, `<k>_cost_p25`,
// `<k>_cost_p75`. A benchmark whose timed loop reached its minimum time
// (the one Google Benchmark reports) runs more rounds after the loop until
// it has at least PairedTimes::kMinRounds, so that a shape of seconds a call still has a
// spread.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <exception>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "bench_paired.hpp"

#ifdef TANDEM_HAVE_OPTIMIZED
#include "tandem/optimized/backend.hpp"

namespace tandem::bench {
namespace {

/// One kind of a benchmark: a name and the geometry of its backend.
struct Kind {
  std::string name;
  optimized::Geometry geometry;
};

Kind default_kind() {
  return {"default", {}};
}

Kind invariant_kind() {
  Kind k{"invariant", {}};
  k.geometry.invariant = true;
  return k;
}

/// The default order with edge blocks as long as the key blocks.
Kind no_edge_kind() {
  Kind k{"no_edge", {}};
  k.geometry.edge_block = k.geometry.key_block;
  return k;
}

/// The default order with every tile wide (decode steps too).
Kind wide_decode_kind() {
  Kind k{"wide_decode", {}};
  k.geometry.decode_tiles = optimized::DecodeTiles::never;
  return k;
}

/// The default order without split-key decode.
Kind no_split_kind() {
  Kind k{"no_split", {}};
  k.geometry.split_keys_min_chunks = 0;
  return k;
}

/// The default order with split-key chunks of kInvariantChunk keys.
Kind chunk1024_kind() {
  Kind k{"chunk1024", {}};
  k.geometry.split_keys_chunk = optimized::kInvariantChunk;
  return k;
}

/// The default order with one backward query part.
Kind one_part_kind() {
  Kind k{"one_part", {}};
  k.geometry.backward_query_parts = 1;
  return k;
}

/// The cases, each with its own buffers.
enum class Case { prefill, decode, paged_decode, backward, decode_bf16 };

const char* case_name(Case c) {
  switch (c) {
    case Case::prefill:
      return "prefill";
    case Case::decode:
      return "decode";
    case Case::paged_decode:
      return "paged_decode";
    case Case::backward:
      return "backward";
    case Case::decode_bf16:
      return "decode_bf16";
  }
  return "?";
}

/// The kinds a case times: default, invariant, then the ingredients that
/// can change its time (edge blocks only under a causal mask).
std::vector<Kind> kinds_of(Case c, bool causal) {
  std::vector<Kind> k = {default_kind(), invariant_kind()};
  if ((c == Case::prefill || c == Case::backward) && causal) k.push_back(no_edge_kind());
  if (c == Case::decode || c == Case::paged_decode) {
    k.push_back(wide_decode_kind());
    k.push_back(no_split_kind());
    k.push_back(chunk1024_kind());
  }
  if (c == Case::backward) k.push_back(one_part_kind());
  return k;
}

/// Bytes of K and V of one decode cache of `s` stored in `width` bytes.
double kv_bytes(const AttnShape& s, double width) {
  return width * static_cast<double>(s.B * s.Sk * s.Hkv) * static_cast<double>(s.D + s.Dv);
}

/// Caches enough for beyond_cache_bytes() of K and V in all (half in the
/// quick preset), at least two below it, as the decode benchmark cycles.
std::size_t cache_count(double cache_bytes) {
  const double all =
      static_cast<double>(beyond_cache_bytes()) * (config().preset == Preset::quick ? 0.5 : 1.0);
  return static_cast<std::size_t>(
      std::max(cache_bytes >= all ? 1.0 : 2.0, std::ceil(all / cache_bytes)));
}

std::vector<bfloat16> to_bf16(const std::vector<float>& x) {
  std::vector<bfloat16> y;
  y.reserve(x.size());
  for (const float v : x) y.emplace_back(v);
  return y;
}

/// The buffers of one benchmark and its call by one backend.
struct InvarianceFixture {
  Case kase;
  AttentionPlan plan;
  std::vector<float> q, out, dout, dq, dk, dv, lse;
  std::vector<std::vector<float>> k, v;  ///< one per cache, or the paged pool
  std::vector<bfloat16> q_bf16, out_bf16;
  std::vector<std::vector<bfloat16>> k_bf16, v_bf16;
  std::vector<std::vector<std::int32_t>> tables;  ///< paged: one per cache
  std::vector<std::int32_t> lens;
  std::size_t caches = 1, next = 0;

  InvarianceFixture(Case c, const AttnShape& s, std::int64_t block_size, const Backend& be)
      : kase(c) {
    AttentionParams p = s.params();
    const bool decode = c == Case::decode || c == Case::paged_decode || c == Case::decode_bf16;
    caches = decode ? cache_count(kv_bytes(s, c == Case::decode_bf16 ? 2.0 : 4.0)) : 1;
    // paged: each sequence's Sk keys in Sk / block_size blocks, B sequences a cache
    const std::int64_t per_seq = block_size > 0 ? s.Sk / block_size : 0, per_cache = s.B * per_seq;
    if (block_size > 0) {
      p.Sk = 0;
      p.num_blocks = per_cache * static_cast<std::int64_t>(caches);
      p.block_size = block_size;
      p.max_blocks = per_seq;
    }
    plan = AttentionPlan::make(p);
    q = random_buffer(static_cast<std::size_t>(plan.q.extent), 1);
    out = zero_buffer(static_cast<std::size_t>(plan.o.extent));
    const std::size_t pools = block_size > 0 ? 1 : caches;
    for (std::size_t i = 0; i < pools; ++i) {
      k.push_back(random_buffer(static_cast<std::size_t>(plan.k.extent), 100 + 2 * i));
      v.push_back(random_buffer(static_cast<std::size_t>(plan.v.extent), 101 + 2 * i));
    }
    if (c == Case::decode_bf16) {
      q_bf16 = to_bf16(q);
      out_bf16 = to_bf16(out);
      for (std::size_t i = 0; i < caches; ++i) {
        k_bf16.push_back(to_bf16(k[i]));
        v_bf16.push_back(to_bf16(v[i]));
      }
      k.clear();
      v.clear();
    }
    if (block_size > 0) {
      tables = shuffled_block_tables(caches, per_cache);
      lens.assign(static_cast<std::size_t>(s.B), static_cast<std::int32_t>(s.Sk));
    }
    if (c == Case::backward) {
      dout = random_buffer(static_cast<std::size_t>(plan.o.extent), 4);
      dq = zero_buffer(static_cast<std::size_t>(plan.dq.extent));
      dk = zero_buffer(static_cast<std::size_t>(plan.dk.extent));
      dv = zero_buffer(static_cast<std::size_t>(plan.dv.extent));
      lse = zero_buffer(static_cast<std::size_t>(plan.lse_size()));
      // the training step's forward, once, by the default order (the saved
      // state's last bits do not change the backward's work)
      be.attention_forward_lse(plan, inputs(0), out, lse);
    }
  }

  /// The float inputs of cache c.
  [[nodiscard]] AttentionInputs<float> inputs(std::size_t c) const {
    if (tables.empty()) return {q, k[c], v[c], {}};
    AttentionInputs<float> in{q, k[0], v[0], {}};
    in.block_table = tables[c];
    in.cache_seqlens = lens;
    return in;
  }

  /// One call by `be` (a decode on the next cache).
  void call(const Backend& be) {
    const std::size_t c = next;
    next = (next + 1) % caches;
    switch (kase) {
      case Case::prefill:
      case Case::decode:
      case Case::paged_decode:
        be.attention_forward(plan, inputs(c), out);
        break;
      case Case::backward:
        be.attention_backward_saved(plan, inputs(0), {out, lse}, dout, {dq, dk, dv});
        break;
      case Case::decode_bf16:
        be.bf16.attention_forward(plan, {q_bf16, k_bf16[c], v_bf16[c], {}}, out_bf16);
        break;
    }
  }
};

/// The shape tag of case `c` on `s` (paged: with its block size).
std::string case_tag(Case c, const AttnShape& s, std::int64_t block_size) {
  std::string tag = std::string(case_name(c)) + "_" + s.tag();
  if (block_size > 0) tag += "_block" + std::to_string(block_size);
  return tag;
}

/// Sets the counters of every kind: its median time and the quartiles of
/// its per-round ratio to the default's time.
void set_cost_counters(benchmark::State& st, const PairedTimes& times) {
  const std::vector<double>& base = times.seconds(0);
  for (std::size_t k = 0; k < times.kinds().size(); ++k) {
    const std::vector<double>& t = times.seconds(k);
    std::vector<double> ratio;
    for (std::size_t i = 0; i < t.size() && i < base.size(); ++i)
      if (base[i] > 0) ratio.push_back(t[i] / base[i]);
    const std::string& name = times.kinds()[k];
    st.counters[name + "_median_ms"] = PairedTimes::quantile(t, 0.5) * 1e3;
    st.counters[name + "_cost_median"] = PairedTimes::quantile(ratio, 0.5);
    st.counters[name + "_cost_p25"] = PairedTimes::quantile(ratio, 0.25);
    st.counters[name + "_cost_p75"] = PairedTimes::quantile(ratio, 0.75);
  }
  st.counters["paired_iterations"] = static_cast<double>(times.rounds());
}

void add_invariance(Case c, const AttnShape& shape, int threads, std::int64_t block_size = 0) {
  Spec s;
  s.op = "invariance";
  s.backend = "optimized";
  s.shape = case_tag(c, shape, block_size);
  s.threads = threads;
  s.name = s.op + "/" + s.backend + "/" + s.shape;
  s.tags = {"invariance", case_name(c)};
  shape.describe(s);
  s.params["block_size"] = static_cast<double>(block_size);
  const std::vector<Kind> kinds = kinds_of(c, shape.causal);
  std::vector<std::string> names;
  auto backends = std::make_shared<std::vector<Backend>>();
  for (const Kind& k : kinds) {
    names.push_back(k.name);
    s.params["kind_" + k.name] = 1.0;
    backends->push_back(optimized::backend(optimized::Options{threads, k.geometry}));
  }
  const std::string key = s.name;
  const double min_time = std::max(1.0, default_min_time());
  add(
      s,
      [c, shape, block_size, backends, names, key, min_time](benchmark::State& st) {
        InvarianceFixture* fx = nullptr;
        try {
          fx = &cached_fixture<InvarianceFixture>(key, [&] {
            return std::make_unique<InvarianceFixture>(c, shape, block_size, backends->front());
          });
          for (const Backend& be : *backends) fx->call(be);  // warm-up
        } catch (const std::exception& e) {
          st.SkipWithError(e.what());
          return;
        }
        InvarianceFixture& f = *fx;
        PairedTimes times(names);
        const auto run = [&](std::size_t k) { f.call((*backends)[k]); };
        times.time_iterations(st, run, min_time);
        set_cost_counters(st, times);
      },
      min_time);
}

AttnShape prefill_shape(std::int64_t S, std::int64_t D, bool causal) {
  AttnShape a;
  a.Sq = a.Sk = S;
  a.D = a.Dv = D;
  a.causal = causal;
  return a;
}

AttnShape backward_shape(std::int64_t S, bool causal) {
  AttnShape a = prefill_shape(S, 128, causal);
  a.Hkv = 2;  // 2 (batch, kv head) pairs < backward_min_tasks: the default splits query parts
  return a;
}

}  // namespace

void register_invariance() {
  if (!op_selected("invariance")) return;
  const Config& c = config();
  const bool quick = c.preset == Preset::quick;
  const std::vector<std::int64_t> dims = !c.dims.empty() ? c.dims
                                         : quick         ? std::vector<std::int64_t>{128}
                                                         : std::vector<std::int64_t>{64, 128};
  const std::vector<std::int64_t> seqs = !c.seqs.empty() ? c.seqs
                                         : quick         ? std::vector<std::int64_t>{1024}
                                                 : std::vector<std::int64_t>{1024, 2048, 4096};
  for (const bool causal : {false, true}) {
    if (quick && !causal) continue;
    for (const std::int64_t D : dims)
      for (const std::int64_t S : seqs)
        add_invariance(Case::prefill, prefill_shape(S, D, causal), c.threads);
  }
  const std::vector<std::int64_t> batches =
      quick ? std::vector<std::int64_t>{1} : std::vector<std::int64_t>{1, 8};
  const std::vector<std::int64_t> keys =
      quick ? std::vector<std::int64_t>{4096} : std::vector<std::int64_t>{4096, 16384};
  for (const std::int64_t B : batches)
    for (const std::int64_t Sk : keys)
      add_invariance(Case::decode, AttnShape::decode_step(B, Sk), c.threads);
  for (const std::int64_t B : batches)
    add_invariance(Case::paged_decode, AttnShape::decode_step(B, 4096), c.threads, 16);
  const std::vector<std::int64_t> bwd_seqs =
      quick ? std::vector<std::int64_t>{512} : std::vector<std::int64_t>{1024, 2048};
  for (const bool causal : {false, true}) {
    if (quick && !causal) continue;
    for (const std::int64_t S : bwd_seqs)
      add_invariance(Case::backward, backward_shape(S, causal), c.threads);
  }
  for (const std::int64_t Sk : keys)
    add_invariance(Case::decode_bf16, AttnShape::decode_step(1, Sk), c.threads);
}

}  // namespace tandem::bench
#else
namespace tandem::bench {
void register_invariance() {}
}  // namespace tandem::bench
#endif
