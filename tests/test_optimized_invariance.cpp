// SPDX-License-Identifier: Apache-2.0
// The optimized attention with Geometry::invariant (SPEC §12), on shapes of
// real models: a query row's out and lse are bitwise the same as a decode
// step, as a chunk of a chunked prefill and in the whole prefill; alone and
// in a packed batch; over a paged cache and contiguous keys; at other
// geometries and thread counts; and a sequence's gradients alone and
// packed. Every Highway target this CPU supports. Without invariance the
// decode step of the first case differs from its prefill row (the check can
// fail). The property suite draws such cases at random (props_invariance).
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "support/tandem_test_support.hpp"
#include "tandem/tandem.hpp"

#ifdef TANDEM_HAVE_OPTIMIZED
#include "tandem/optimized/backend.hpp"

namespace {

namespace opt = tandem::optimized;
namespace test = tandem::test;
using tandem::AttentionParams;
using tandem::Backend;
using tandem::Layout;
using tandem::MaskKind;
using i64 = std::int64_t;
using Vec = std::vector<float>;

/// A model's attention shape: heads, kv heads, head width, mask.
struct Model {
  std::string name;
  i64 H, Hkv, D;
  MaskKind mask = MaskKind::causal;
  i64 window = 0;
  bool sinks = false;
  double softcap = 0.0;
};

std::vector<Model> models() {
  return {{"llama3_gqa", 8, 2, 64},
          {"mistral_window", 4, 1, 32, MaskKind::sliding_window, 300},
          {"gpt_oss_sinks", 4, 2, 64, MaskKind::causal, 0, true},
          {"gemma2_softcap", 4, 4, 32, MaskKind::causal, 0, false, 20.0}};
}

/// One sequence's q `[Sq, H, D]`, k and v `[Sk, Hkv, D]` (bshd rows).
struct Seq {
  i64 Sq = 0, Sk = 0;
  Vec q, k, v;
};

Seq random_seq(const Model& m, i64 Sq, i64 Sk, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  Seq s{Sq, Sk, Vec(Sq * m.H * m.D), Vec(Sk * m.Hkv * m.D), Vec(Sk * m.Hkv * m.D)};
  for (Vec* x : {&s.q, &s.k, &s.v}) {
    for (float& e : *x) e = n(rng);
  }
  return s;
}

AttentionParams params(const Model& m, i64 B, i64 Sq, i64 Sk) {
  AttentionParams p =
      test::attention_params(B, Sq, Sk, m.H, m.Hkv, m.D, 0, Layout::bshd, m.mask, m.window);
  p.sinks = m.sinks;
  p.softcap = m.softcap;
  return p;
}

Vec sinks_of(const Model& m) {
  Vec s;
  for (i64 h = 0; m.sinks && h < m.H; ++h) s.push_back(0.25f * static_cast<float>(h) - 0.5f);
  return s;
}

/// out `[Sq, H, D]` and lse `[H, Sq]` of one call.
struct Rows {
  Vec out, lse;
};

/// The rows of q rows [i0, i0 + n) of `s` against its first `keys` keys.
Rows run_part(const Backend& b, const Model& m, const Seq& s, i64 i0, i64 n, i64 keys) {
  const tandem::AttentionPlan plan = tandem::AttentionPlan::make(params(m, 1, n, keys));
  const Vec q(s.q.begin() + i0 * m.H * m.D, s.q.begin() + (i0 + n) * m.H * m.D);
  const Vec k(s.k.begin(), s.k.begin() + keys * m.Hkv * m.D);
  const Vec v(s.v.begin(), s.v.begin() + keys * m.Hkv * m.D);
  const Vec sinks = sinks_of(m), mask;
  tandem::AttentionInputs<float> in{q, k, v, mask};
  in.sinks = sinks;
  Rows r{Vec(plan.o.extent), Vec(plan.lse_size())};
  b.attention_forward_lse(plan, in, r.out, r.lse);
  return r;
}

/// Whether row i of `whole` (Sq rows) has the bits of row i − i0 of `part`
/// (n rows): out and lse of every head.
testing::AssertionResult same_row(const Model& m, const Rows& whole, i64 Sq, i64 i,
                                  const Rows& part, i64 n, i64 i0) {
  const i64 w = m.H * m.D;
  const Vec a(whole.out.begin() + i * w, whole.out.begin() + (i + 1) * w);
  const Vec b(part.out.begin() + (i - i0) * w, part.out.begin() + (i - i0 + 1) * w);
  if (!test::same_bits(a, b))
    return testing::AssertionFailure() << "out of row " << i << " differs";
  for (i64 h = 0; h < m.H; ++h) {
    if (!test::same_bits(Vec{whole.lse[h * Sq + i]}, Vec{part.lse[h * n + i - i0]}))
      return testing::AssertionFailure() << "lse of row " << i << " head " << h << " differs";
  }
  return testing::AssertionSuccess();
}

opt::Options invariant_options(int threads = 0, opt::Geometry g = {}) {
  g.invariant = true;
  opt::Options o(threads, g);
  o.tuning_from_environment = false;
  return o;
}

/// Prefill rows against decode steps and a chunk, across 64-key blocks
/// and 1024-key chunks.
void check_decode_and_chunks(const Backend& b, const Model& m) {
  constexpr i64 S = 1100;
  const Seq s = random_seq(m, S, S, 7);
  const Rows whole = run_part(b, m, s, 0, S, S);
  for (const i64 t : {0, 1, 16, 63, 64, 65, 300, 1023, 1024, 1025, 1099}) {
    EXPECT_TRUE(same_row(m, whole, S, t, run_part(b, m, s, t, 1, t + 1), 1, t)) << "step " << t;
  }
  for (const i64 i0 : {1017, 1093}) {  // 7 rows against the cache up to them
    const Rows chunk = run_part(b, m, s, i0, 7, i0 + 7);
    for (i64 i = i0; i < i0 + 7; ++i) EXPECT_TRUE(same_row(m, whole, S, i, chunk, 7, i0));
  }
}

TEST(OptimizedInvariance, DecodeStepsAndChunksHaveThePrefillBits) {
  test::for_each_target([] {
    const Backend b = opt::backend(invariant_options());
    for (const Model& m : models()) {
      SCOPED_TRACE(m.name);
      check_decode_and_chunks(b, m);
    }
  });
}

/// The decode steps of a sliding-window cache that keeps only the last
/// window + 1 keys, called with key_origin the position of its first key,
/// have the bits of the whole prefill's rows (whose window hides the keys
/// the cache dropped), across 64-key blocks and 1024-key chunks; without
/// key_origin a step whose cache starts inside a block differs.
TEST(OptimizedInvariance, ASlidingWindowCacheFromItsKeyOriginHasThePrefillBits) {
  test::for_each_target([] {
    const Backend b = opt::backend(invariant_options());
    const Model m{"mistral_window", 4, 1, 32, MaskKind::sliding_window, 300};
    constexpr i64 S = 1400;
    const Seq s = random_seq(m, S, S, 11);
    const Rows whole = run_part(b, m, s, 0, S, S);
    bool some_differ = false;
    for (const i64 t : {301, 364, 365, 700, 1023, 1024, 1025, 1324, 1399}) {
      const i64 first = t - m.window;  // the cache: keys [first, t], window + 1 of them
      const tandem::AttentionPlan plan =
          tandem::AttentionPlan::make(params(m, 1, 1, t + 1 - first));
      const Vec q(s.q.begin() + t * m.H * m.D, s.q.begin() + (t + 1) * m.H * m.D);
      const Vec k(s.k.begin() + first * m.Hkv * m.D, s.k.begin() + (t + 1) * m.Hkv * m.D);
      const Vec v(s.v.begin() + first * m.Hkv * m.D, s.v.begin() + (t + 1) * m.Hkv * m.D);
      const std::vector<std::int64_t> origin{first};
      tandem::AttentionInputs<float> in{q, k, v, {}};
      Rows step{Vec(plan.o.extent), Vec(plan.lse_size())};
      Rows blind = step;
      b.attention_forward_lse(plan, in, blind.out, blind.lse);
      in.key_origin = origin;
      b.attention_forward_lse(plan, in, step.out, step.lse);
      EXPECT_TRUE(same_row(m, whole, S, t, step, 1, t)) << "step " << t;
      some_differ = some_differ || !same_row(m, whole, S, t, blind, 1, t);
    }
    EXPECT_TRUE(some_differ) << "no step needed key_origin: the test cannot fail";
  });
}

TEST(OptimizedInvariance, KeyOriginIsCheckedBeforeAnythingIsWritten) {
  const Backend b = opt::backend(invariant_options());
  const Model m{"two", 2, 1, 8};
  const Seq s = random_seq(m, 3, 5, 3);
  const tandem::AttentionPlan plan = tandem::AttentionPlan::make(params(m, 1, 3, 5));
  const Vec sentinel(plan.o.extent, 7.0f);
  for (const std::vector<std::int64_t>& origin :
       {std::vector<std::int64_t>{-1}, std::vector<std::int64_t>{0, 0},
        std::vector<std::int64_t>{tandem::kMaxKeyOrigin + 1}}) {
    tandem::AttentionInputs<float> in{s.q, s.k, s.v, {}};
    in.key_origin = origin;
    Vec out = sentinel;
    EXPECT_THROW(
        try { b.attention_forward(plan, in, out); } catch (const tandem::Error& e) {
          EXPECT_EQ(e.parameter(), origin.size() == 1 ? "key_origin" : "key_origin.size()");
          throw;
        },
        tandem::Error);
    EXPECT_EQ(out, sentinel);
  }
}

/// The invariant order computes the same function: within float rounding
/// of the default order (both agree with the reference, SPEC §2).
TEST(OptimizedInvariance, AgreesWithTheDefaultOrder) {
  test::for_each_target([] {
    opt::Options o;
    o.tuning_from_environment = false;
    const Backend fast = opt::backend(o), inv = opt::backend(invariant_options());
    for (const Model& m : models()) {
      SCOPED_TRACE(m.name);
      const Seq s = random_seq(m, 1100, 1100, 9);
      for (const auto& [i0, n] : {std::pair<i64, i64>{0, 1100}, {1099, 1}}) {
        const Rows a = run_part(fast, m, s, i0, n, i0 + n), b = run_part(inv, m, s, i0, n, i0 + n);
        for (std::size_t x = 0; x < a.out.size(); ++x) {
          ASSERT_NEAR(a.out[x], b.out[x], 1e-5f) << "element " << x << " of rows " << i0;
        }
        for (std::size_t x = 0; x < a.lse.size(); ++x) ASSERT_NEAR(a.lse[x], b.lse[x], 1e-5f);
      }
    }
  });
}

/// The same through the bf16 forward (widened to float; the stored-decode
/// kernel is not taken).
TEST(OptimizedInvariance, Bf16DecodeStepHasThePrefillBits) {
  test::for_each_target([] {
    const Backend b = opt::backend(invariant_options());
    const Model m = models()[0];
    constexpr i64 S = 1030;
    const Seq s = random_seq(m, S, S, 13);
    const auto bf = [](const Vec& x, i64 from, i64 n) {
      std::vector<tandem::bfloat16> y;
      for (i64 i = from; i < from + n; ++i) y.push_back(tandem::bfloat16(x[i]));
      return y;
    };
    const i64 w = m.H * m.D, kw = m.Hkv * m.D;
    const auto run = [&](i64 i0, i64 n) {
      const tandem::AttentionPlan plan = tandem::AttentionPlan::make(params(m, 1, n, i0 + n));
      const auto q = bf(s.q, i0 * w, n * w), k = bf(s.k, 0, (i0 + n) * kw),
                 v = bf(s.v, 0, (i0 + n) * kw);
      const Vec mask;
      tandem::AttentionInputs<tandem::bfloat16> in{q, k, v, mask};
      std::vector<tandem::bfloat16> out(plan.o.extent);
      Vec lse(plan.lse_size());
      b.bf16.attention_forward_lse(plan, in, out, lse);
      Vec o;
      for (const tandem::bfloat16 x : out) o.push_back(static_cast<float>(x));
      return Rows{o, lse};
    };
    const Rows whole = run(0, S);
    for (const i64 t : {5, 1024, 1029}) EXPECT_TRUE(same_row(m, whole, S, t, run(t, 1), 1, t));
  });
}

TEST(OptimizedInvariance, OtherGeometriesAndThreadsKeepTheBits) {
  const Model m = models()[0];
  const Seq s = random_seq(m, 1100, 1100, 11);
  const Backend base = opt::backend(invariant_options(1));
  const Rows whole = run_part(base, m, s, 0, 1100, 1100);
  const Rows step = run_part(base, m, s, 1099, 1, 1100);
  std::vector<opt::Geometry> geos(5);
  geos[0].rows_per_tile = geos[0].rows_per_tile_banded = 5;
  geos[1].decode_tiles = opt::DecodeTiles::never;
  geos[2].decode_tiles = opt::DecodeTiles::always;
  geos[3].key_block = 8;
  geos[3].edge_block = 3;
  geos[4].split_keys_min_chunks = 1;  // split-key decode from one chunk
  geos[4].split_keys_contiguous_heads = 1000;
  for (const int threads : {1, 2, 3}) {
    for (const opt::Geometry& g : geos) {
      const Backend b = opt::backend(invariant_options(threads, g));
      EXPECT_TRUE(test::same_bits(whole.out, run_part(b, m, s, 0, 1100, 1100).out));
      EXPECT_TRUE(same_row(m, whole, 1100, 1099, run_part(b, m, s, 1099, 1, 1100), 1, 1099));
      EXPECT_TRUE(same_row(m, whole, 1100, 1099, step, 1, 1099));
    }
  }
}

TEST(OptimizedInvariance, WithoutItADecodeStepDiffersFromItsPrefillRow) {
  const Model m = models()[0];
  const Seq s = random_seq(m, 17, 17, 3);
  opt::Options o(1);
  o.tuning_from_environment = false;
  const Backend b = opt::backend(o);
  const Rows whole = run_part(b, m, s, 0, 17, 17);
  EXPECT_FALSE(same_row(m, whole, 17, 16, run_part(b, m, s, 16, 1, 17), 1, 16));
}

/// Three sequences packed into one call (cu_seqlens) against each alone.
TEST(OptimizedInvariance, PackedSequencesHaveTheirOwnBits) {
  test::for_each_target([] {
    const Backend b = opt::backend(invariant_options());
    const Model m = models()[2];
    const std::vector<i64> lens = {70, 1030, 5};
    std::vector<Seq> seqs;
    Vec q, k, v;
    std::vector<std::int32_t> cu = {0};
    for (std::size_t n = 0; n < lens.size(); ++n) {
      seqs.push_back(random_seq(m, lens[n], lens[n], 20 + static_cast<std::uint32_t>(n)));
      q.insert(q.end(), seqs.back().q.begin(), seqs.back().q.end());
      k.insert(k.end(), seqs.back().k.begin(), seqs.back().k.end());
      v.insert(v.end(), seqs.back().v.begin(), seqs.back().v.end());
      cu.push_back(cu.back() + static_cast<std::int32_t>(lens[n]));
    }
    AttentionParams p = params(m, 1, cu.back(), cu.back());
    p.num_seqs = static_cast<i64>(lens.size());
    const tandem::AttentionPlan plan = tandem::AttentionPlan::make(p);
    const Vec sinks = sinks_of(m), mask;
    tandem::AttentionInputs<float> in{q, k, v, mask};
    in.sinks = sinks;
    in.cu_seqlens_q = cu;
    in.cu_seqlens_k = cu;
    Rows packed{Vec(plan.o.extent), Vec(plan.lse_size())};
    b.attention_forward_lse(plan, in, packed.out, packed.lse);
    for (std::size_t n = 0; n < lens.size(); ++n) {
      const Rows alone = run_part(b, m, seqs[n], 0, lens[n], lens[n]);
      for (i64 i = 0; i < lens[n]; i += 13) {
        EXPECT_TRUE(same_row(m, packed, cu.back(), cu[n] + i, alone, lens[n], cu[n]));
      }
    }
  });
}

/// dq, dk, dv of a sequence packed with others (cu_seqlens) against the
/// sequence alone: with one (sequence, kv head) task each, the backward of
/// the lone sequence would otherwise split its query blocks into parts.
TEST(OptimizedInvariance, BackwardOfAPackedSequenceHasItsOwnBits) {
  test::for_each_target([] {
    const Backend b = opt::backend(invariant_options());
    const Model m{"qwen_gqa_small", 4, 1, 32};
    const std::vector<i64> lens = {300, 45};
    std::vector<Seq> seqs;
    Vec q, k, v, dout;
    std::vector<std::int32_t> cu = {0};
    std::mt19937 rng(4);
    std::normal_distribution<float> n01(0.0f, 1.0f);
    for (std::size_t n = 0; n < lens.size(); ++n) {
      seqs.push_back(random_seq(m, lens[n], lens[n], 40 + static_cast<std::uint32_t>(n)));
      q.insert(q.end(), seqs.back().q.begin(), seqs.back().q.end());
      k.insert(k.end(), seqs.back().k.begin(), seqs.back().k.end());
      v.insert(v.end(), seqs.back().v.begin(), seqs.back().v.end());
      cu.push_back(cu.back() + static_cast<std::int32_t>(lens[n]));
    }
    for (i64 x = 0; x < cu.back() * m.H * m.D; ++x) dout.push_back(n01(rng));
    struct Grads {
      Vec dq, dk, dv;
    };
    const auto backward = [&](const AttentionParams& p, const Vec& qq, const Vec& kk, const Vec& vv,
                              const Vec& dd, const std::vector<std::int32_t>& cus) {
      const tandem::AttentionPlan plan = tandem::AttentionPlan::make(p);
      const Vec mask;
      tandem::AttentionInputs<float> in{qq, kk, vv, mask};
      in.cu_seqlens_q = cus;
      in.cu_seqlens_k = cus;
      Grads g{Vec(plan.q.extent), Vec(plan.k.extent), Vec(plan.v.extent)};
      b.attention_backward(plan, in, dd, {g.dq, g.dk, g.dv});
      return g;
    };
    AttentionParams p = params(m, 1, cu.back(), cu.back());
    p.num_seqs = static_cast<i64>(lens.size());
    const Grads packed = backward(p, q, k, v, dout, cu);
    const i64 qw = m.H * m.D, kw = m.Hkv * m.D;
    for (std::size_t n = 0; n < lens.size(); ++n) {
      const Vec d(dout.begin() + cu[n] * qw, dout.begin() + cu[n + 1] * qw);
      const Grads alone =
          backward(params(m, 1, lens[n], lens[n]), seqs[n].q, seqs[n].k, seqs[n].v, d, {});
      const auto part = [&](const Vec& x, i64 w) {
        return Vec(x.begin() + cu[n] * w, x.begin() + cu[n + 1] * w);
      };
      EXPECT_TRUE(test::same_bits(part(packed.dq, qw), alone.dq)) << "dq of sequence " << n;
      EXPECT_TRUE(test::same_bits(part(packed.dk, kw), alone.dk)) << "dk of sequence " << n;
      EXPECT_TRUE(test::same_bits(part(packed.dv, kw), alone.dv)) << "dv of sequence " << n;
    }
  });
}

/// A decode step over a paged cache (blocks of 16 keys, shuffled) against
/// the same keys contiguous.
TEST(OptimizedInvariance, PagedCacheHasTheContiguousBits) {
  test::for_each_target([] {
    const Backend b = opt::backend(invariant_options());
    const Model m = models()[0];
    constexpr i64 keys = 1050, bs = 16, blocks = (keys + bs - 1) / bs;
    const Seq s = random_seq(m, 1, keys, 5);
    std::vector<std::int32_t> table(blocks);
    for (i64 i = 0; i < blocks; ++i) table[i] = static_cast<std::int32_t>((i * 37) % blocks);
    const i64 row = m.Hkv * m.D;
    Vec k(blocks * bs * row, 0.0f), v(blocks * bs * row, 0.0f);
    for (i64 j = 0; j < keys; ++j) {
      const i64 at = (table[j / bs] * bs + j % bs) * row;
      std::copy_n(s.k.begin() + j * row, row, k.begin() + at);
      std::copy_n(s.v.begin() + j * row, row, v.begin() + at);
    }
    AttentionParams p = params(m, 1, 1, 0);
    p.num_blocks = blocks;
    p.block_size = bs;
    p.max_blocks = blocks;
    const tandem::AttentionPlan plan = tandem::AttentionPlan::make(p);
    const std::vector<std::int32_t> lens = {static_cast<std::int32_t>(keys)};
    const Vec mask;
    tandem::AttentionInputs<float> in{s.q, k, v, mask};
    in.block_table = table;
    in.cache_seqlens = lens;
    Rows paged{Vec(plan.o.extent), Vec(plan.lse_size())};
    b.attention_forward_lse(plan, in, paged.out, paged.lse);
    EXPECT_TRUE(same_row(m, run_part(b, m, s, 0, 1, keys), 1, 0, paged, 1, 0));
  });
}

}  // namespace
#endif  // TANDEM_HAVE_OPTIMIZED
