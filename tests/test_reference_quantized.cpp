// SPDX-License-Identifier: Apache-2.0
// The reference's quantized KV caches (SPEC §10.4): quantize_kv's scales and
// codes on hand-made rows (all-zero rows, ties to even, the ±127 clamp, e4m3
// saturation, one scale per head), its checks, and attention over the codes:
// bitwise the plain attention of the dequantized values where they are values
// of T (power-of-two scales), within float32's rounding of the double
// attention otherwise, and the output o* rounded once.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "support/tandem_test_support.hpp"
#include "tandem/reference/attention.hpp"
#include "tandem/reference/quantized.hpp"
#include "tandem/reference/rounding_bound.hpp"

namespace {

using tandem::AttentionParams;
using tandem::AttentionPlan;
using tandem::bfloat16;
using tandem::float16;
using tandem::float8_e4m3;
using tandem::KvCache;
using tandem::test::attention_params;
namespace ref = tandem::reference;

/// A quantized cache, owned: codes of k and v, their scales.
struct Cache {
  std::vector<std::uint8_t> k, v;
  std::vector<float> k_scale, v_scale;
  explicit Cache(const AttentionPlan& p)
      : k(p.k.extent, 0xAA),
        v(p.v.extent, 0xAA),
        k_scale(p.kv_scale_size(), -1.0f),
        v_scale(p.kv_scale_size(), -1.0f) {}
  tandem::QuantizedKvOut out() { return {k, v, k_scale, v_scale}; }
  [[nodiscard]] tandem::QuantizedKv in() const { return {k, v, k_scale, v_scale}; }
};

template <class T>
std::vector<T> values(const std::vector<double>& x) {
  std::vector<T> y;
  y.reserve(x.size());
  for (const double e : x) y.push_back(T(e));
  return y;
}

/// One batch entry, `rows` keys, Hkv = H = heads, D = Dv = `width`.
AttentionPlan cache_plan(KvCache kind, std::int64_t rows, std::int64_t heads, std::int64_t width) {
  AttentionParams p = attention_params(1, 1, rows, heads, heads, width);
  p.kv_cache = kind;
  return AttentionPlan::make(p);
}

TEST(ReferenceQuantized, Int8ScalesEachRowAndRoundsCodesToEven) {
  // k [1, 3, 1, 4]: σ = max|k_d| ⊘ 127; a zero row has σ = 0 and codes 0
  const AttentionPlan p = cache_plan(KvCache::int8, 3, 1, 4);
  const auto k = values<bfloat16>({127, -63, 1.5, 0.5, 0, 0, 0, 0, -2.5, 254, 3, -1});
  Cache c(p);
  ref::quantize_kv<bfloat16>(p, k, k, c.out());
  EXPECT_EQ(c.k_scale, (std::vector<float>{1.0f, 0.0f, 2.0f}));
  // 1.5 → 2 and 0.5 → 0 (ties to even); −2.5/2 = −1.25 → −1, 3/2 = 1.5 → 2, −1/2 → −0
  const std::vector<std::int8_t> want{127, -63, 2, 0, 0, 0, 0, 0, -1, 127, 2, 0};
  for (std::size_t e = 0; e < want.size(); ++e) {
    EXPECT_EQ(static_cast<std::int8_t>(c.k[e]), want[e]) << e;
    EXPECT_EQ(c.v[e], c.k[e]) << e;
  }
  EXPECT_EQ(c.v_scale, c.k_scale);
}

TEST(ReferenceQuantized, Int8ClampsAtPlusMinus127) {
  // float32 subnormals: m = 190·2^−149, σ = RN_f32(m/127) = 2^−149 (190/127 = 1.496), so
  // m/σ = 190 and the codes clamp to ±127 (never −128)
  const AttentionPlan p = cache_plan(KvCache::int8, 1, 1, 3);
  const std::vector<float> k{190 * 0x1p-149f, -190 * 0x1p-149f, 0x1p-149f};
  Cache c(p);
  ref::quantize_kv<float>(p, k, k, c.out());
  EXPECT_EQ(c.k_scale[0], 0x1p-149f);
  EXPECT_EQ(static_cast<std::int8_t>(c.k[0]), 127);
  EXPECT_EQ(static_cast<std::int8_t>(c.k[1]), -127);
  EXPECT_EQ(static_cast<std::int8_t>(c.k[2]), 1);
}

TEST(ReferenceQuantized, E4m3ScalesEachHeadOverEveryRowAndSaturates) {
  // two heads, two rows: head 0's max is 1 (σ = RN_f32(1/448)), head 1 is all zero
  const AttentionPlan p = cache_plan(KvCache::e4m3, 2, 2, 2);
  // bshd [1, 2 rows, 2 heads, 2]: row 0 head 0, row 0 head 1, row 1 head 0, row 1 head 1
  const auto k = values<float16>({0.5, -1, 0, 0, 0.25, 1, 0, 0});
  Cache c(p);
  ref::quantize_kv<float16>(p, k, k, c.out());
  ASSERT_EQ(c.k_scale.size(), 2u);
  EXPECT_EQ(c.k_scale[0], 1.0f / 448.0f);
  EXPECT_EQ(c.k_scale[1], 0.0f);
  const float s = c.k_scale[0];
  // ±1/σ is 448 within float32's rounding of σ: the largest code, saturated whichever side
  EXPECT_EQ(c.k[1], 0xFE);
  EXPECT_EQ(c.k[5], 0x7E);
  EXPECT_EQ(c.k[0], float8_e4m3(static_cast<double>(0.5f / s)).bits);
  EXPECT_EQ(c.k[4], float8_e4m3(static_cast<double>(0.25f / s)).bits);
  for (const std::size_t zero : {2u, 3u, 6u, 7u}) EXPECT_EQ(c.k[zero], 0) << zero;
  // the codes decode to k within e4m3's relative spacing 2^−3
  EXPECT_NEAR(s * ref::code_value(KvCache::e4m3, c.k[0]), 0.5, 0.5 * 0x1p-4);
}

TEST(ReferenceQuantized, ChecksBeforeWriting) {
  const AttentionPlan p = cache_plan(KvCache::int8, 2, 1, 2);
  Cache c(p);
  const auto k = values<bfloat16>({1, 2, 3, std::nan("")});
  tandem::test::expect_error(
      [&] {
        ref::quantize_kv<bfloat16>(p, k, values<bfloat16>({1, 1, 1, 1}), c.out());
      },
      "k", {"finite"});
  EXPECT_EQ(c.k_scale, (std::vector<float>{-1.0f, -1.0f}));
  EXPECT_EQ(c.k[0], 0xAA);
  const auto ok = values<bfloat16>({1, 2, 3, 4});
  ref::quantize_kv<bfloat16>(p, ok, ok, c.out());
  // plain k and v with a quantized plan, and a quantized plan through the plain entry point
  std::vector<bfloat16> q(p.q.extent, bfloat16(1.0)), out(p.o.extent);
  const tandem::AttentionInputs<bfloat16> with_k{q, ok, {}};
  tandem::test::expect_error(
      [&] { ref::attention_forward_quantized<bfloat16>(p, with_k, c.in(), out); }, "k.size()");
  tandem::test::expect_error(
      [&] {
        ref::attention_forward<bfloat16>(p, {q, ok, ok}, std::span<bfloat16>(out));
      },
      "kv_cache");
  EXPECT_EQ(out[0].bits, 0);
}

/// k, v whose quantized values are values of T: int8 codes c·2^−6 with ±127 in every row
/// (σ = 2^−6), or e4m3 values ·2^−3 with ±448·2^−3 in every head (σ = 2^−3).
std::vector<double> representable(const AttentionPlan& p, const tandem::Strides& view,
                                  std::int64_t width, unsigned seed) {
  std::vector<double> x(view.extent, 0.0);
  const std::vector<float> r = tandem::test::random_values(x.size(), seed, -1.0f, 1.0f);
  const bool int8 = p.kv_cache == KvCache::int8;
  for (std::int64_t b = 0; b < p.kv_batch(); ++b) {
    for (std::int64_t s = 0; s < p.kv_seq(); ++s) {
      for (std::int64_t g = 0; g < p.Hkv; ++g) {
        for (std::int64_t d = 0; d < width; ++d) {
          const std::int64_t at = view.at(b, s, g) + d;
          const double u = r[static_cast<std::size_t>(at)];
          x[at] = int8 ? std::nearbyint(127 * u) * 0x1p-6
                       : static_cast<double>(float8_e4m3(448 * u * u * u)) * 0x1p-3;
          if (d == 0 && (int8 || (b == 0 && s == 0))) x[at] = int8 ? 127 * 0x1p-6 : -56.0;
        }
      }
    }
  }
  return x;
}

/// A decode-and-prefill plan with sinks, softcap, ALiBi and a causal mask, contiguous or paged.
AttentionParams quantized_params(KvCache kind, bool paged, tandem::Rounding r) {
  AttentionParams p = attention_params(2, 3, paged ? 0 : 11, 4, 2, 8, 5, tandem::Layout::bshd,
                                       tandem::MaskKind::causal);
  if (paged) {
    p.num_blocks = 5;
    p.block_size = 4;
    p.max_blocks = 3;
  }
  p.sinks = true;
  p.softcap = 6.0;
  p.alibi = tandem::AlibiKind::per_head;
  p.kv_cache = kind;
  p.rounding = r;
  return p;
}

template <class T>
void expect_quantized_is_plain_on_representable_values(KvCache kind, bool paged,
                                                       tandem::Rounding r) {
  SCOPED_TRACE(std::string(to_string(kind)) + (paged ? " paged " : " ") + std::string(r.name));
  const AttentionPlan qp = AttentionPlan::make(quantized_params(kind, paged, r));
  AttentionParams plain_params = quantized_params(kind, paged, r);
  plain_params.kv_cache = KvCache::plain;
  const AttentionPlan pp = AttentionPlan::make(plain_params);
  const std::vector<T> k = values<T>(representable(qp, qp.k, qp.D, 11));
  const std::vector<T> v = values<T>(representable(qp, qp.v, qp.Dv, 12));
  Cache c(qp);
  ref::quantize_kv<T>(qp, k, v, c.out());
  // the scales are the powers of two the values were made with
  const float sigma = kind == KvCache::int8 ? 0x1p-6f : 0x1p-3f;
  for (std::size_t e = 0; e < c.k_scale.size(); ++e) {
    EXPECT_EQ(c.k_scale[e], sigma) << e;
    EXPECT_EQ(c.v_scale[e], sigma) << e;
  }
  const std::vector<T> q = values<T>([&] {
    std::vector<double> x;
    for (const float e : tandem::test::random_values(qp.q.extent, 13, -2.0f, 2.0f)) x.push_back(e);
    return x;
  }());
  const std::vector<T> sinks = values<T>({0.5, -1.0, 0.25, 2.0});
  const std::vector<float> slopes{0.5f, 0.25f, 0.125f, 0.0625f};
  const std::vector<std::int64_t> table{4, 1, 0, 2, 3, 0}, lens{9, 12};
  tandem::AttentionInputs<T> in{q, {}, {}};
  in.sinks = sinks;
  in.alibi_slopes = slopes;
  if (paged) {
    in.block_table = table;
    in.cache_seqlens = lens;
  }
  std::vector<T> got(qp.o.extent), want(pp.o.extent);
  ref::attention_forward_quantized<T>(qp, in, c.in(), got);
  tandem::AttentionInputs<T> plain = in;
  plain.k = k;
  plain.v = v;
  ref::attention_forward<T>(pp, plain, std::span<T>(want));
  bool some_nonzero = false;
  for (std::size_t e = 0; e < got.size(); ++e) {
    EXPECT_EQ(got[e].bits, want[e].bits) << e;
    some_nonzero = some_nonzero || static_cast<double>(got[e]) != 0.0;
  }
  EXPECT_TRUE(some_nonzero);
}

TEST(ReferenceQuantized, RepresentableCachesGiveThePlainAttentionsBits) {
  for (const KvCache kind : {KvCache::int8, KvCache::e4m3}) {
    for (const bool paged : {false, true}) {
      for (const tandem::Rounding& r : tandem::kRoundingProfiles) {
        expect_quantized_is_plain_on_representable_values<bfloat16>(kind, paged, r);
        expect_quantized_is_plain_on_representable_values<float16>(kind, paged, r);
      }
    }
  }
}

TEST(ReferenceQuantized, Float32IsTheDoubleAttentionOfTheDequantizedValuesRoundedOnce) {
  for (const KvCache kind : {KvCache::int8, KvCache::e4m3}) {
    const AttentionPlan qp =
        AttentionPlan::make(quantized_params(kind, false, tandem::kRoundingPytorch));
    AttentionParams plain_params = quantized_params(kind, false, tandem::kRoundingPytorch);
    plain_params.kv_cache = KvCache::plain;
    const AttentionPlan pp = AttentionPlan::make(plain_params);
    const std::vector<float> k = tandem::test::random_values(qp.k.extent, 21, -3.0f, 3.0f);
    const std::vector<float> v = tandem::test::random_values(qp.v.extent, 22, -1.0f, 1.0f);
    const std::vector<float> q = tandem::test::random_values(qp.q.extent, 23, -1.0f, 1.0f);
    const std::vector<float> sinks{0.5f, -1.0f, 0.25f, 2.0f}, slopes{0.5f, 0.25f, 0.125f, 0.0625f};
    Cache c(qp);
    ref::quantize_kv<float>(qp, k, v, c.out());
    // k_jd = σ_j·c_jd and v alike, exact in double
    std::vector<double> kd(k.size()), vd(v.size()), qd(q.begin(), q.end());
    std::vector<double> sd(sinks.begin(), sinks.end());
    for (std::int64_t b = 0; b < qp.B; ++b) {
      for (std::int64_t s = 0; s < qp.Sk; ++s) {
        for (std::int64_t g = 0; g < qp.Hkv; ++g) {
          for (std::int64_t d = 0; d < qp.D; ++d) {
            const std::int64_t at = qp.k.at(b, s, g) + d;
            kd[at] = c.k_scale[qp.kv_scale_at(b, s, g)] * ref::code_value(kind, c.k[at]);
          }
          for (std::int64_t d = 0; d < qp.Dv; ++d) {
            const std::int64_t at = qp.v.at(b, s, g) + d;
            vd[at] = c.v_scale[qp.kv_scale_at(b, s, g)] * ref::code_value(kind, c.v[at]);
          }
        }
      }
    }
    tandem::AttentionInputs<float> in{q, {}, {}};
    in.sinks = sinks;
    in.alibi_slopes = slopes;
    std::vector<float> got(qp.o.extent);
    ref::attention_forward_quantized<float>(qp, in, c.in(), got);
    tandem::AttentionInputs<double> din{qd, kd, vd};
    din.sinks = sd;
    din.alibi_slopes = slopes;
    std::vector<double> want(pp.o.extent);
    ref::attention_forward<double>(pp, din, std::span<double>(want));
    for (std::size_t e = 0; e < got.size(); ++e) {
      EXPECT_NEAR(got[e], want[e], std::fabs(want[e]) * 0x1p-23 + 1e-30) << e;
    }
    // and the bound's o* is that double attention, the output o* rounded once
    const ref::RoundingBound bound =
        ref::attention_forward_quantized_rounding<float>(qp, in, c.in(), 1e-6);
    for (std::size_t e = 0; e < got.size(); ++e) {
      EXPECT_NEAR(bound.unrounded[e], want[e], std::fabs(want[e]) * 1e-14) << e;
      EXPECT_EQ(got[e], static_cast<float>(bound.unrounded[e])) << e;
      EXPECT_EQ(bound.flip[e], 0.0) << e;
    }
  }
}

TEST(ReferenceQuantized, Bf16OutputIsTheBoundsOStarRoundedOnce) {
  const AttentionPlan qp =
      AttentionPlan::make(quantized_params(KvCache::int8, true, tandem::kRoundingPytorch));
  const std::vector<float> k = tandem::test::random_values(qp.k.extent, 31, -3.0f, 3.0f);
  const std::vector<float> v = tandem::test::random_values(qp.v.extent, 32, -1.0f, 1.0f);
  std::vector<bfloat16> kb, vb, qb;
  for (const float e : k) kb.emplace_back(e);
  for (const float e : v) vb.emplace_back(e);
  for (const float e : tandem::test::random_values(qp.q.extent, 33, -1.0f, 1.0f))
    qb.emplace_back(e);
  const auto sinks = values<bfloat16>({0.5, -1.0, 0.25, 2.0});
  const std::vector<float> slopes{0.5f, 0.25f, 0.125f, 0.0625f};
  const std::vector<std::int64_t> table{4, 1, 0, 2, 3, 0}, lens{9, 12};
  Cache c(qp);
  ref::quantize_kv<bfloat16>(qp, kb, vb, c.out());
  tandem::AttentionInputs<bfloat16> in{qb, {}, {}};
  in.sinks = sinks;
  in.alibi_slopes = slopes;
  in.block_table = table;
  in.cache_seqlens = lens;
  std::vector<bfloat16> got(qp.o.extent);
  ref::attention_forward_quantized<bfloat16>(qp, in, c.in(), got);
  const ref::RoundingBound bound =
      ref::attention_forward_quantized_rounding<bfloat16>(qp, in, c.in(), 1e-3);
  double flips = 0;
  for (std::size_t e = 0; e < got.size(); ++e) {
    EXPECT_EQ(got[e].bits, bfloat16(bound.unrounded[e]).bits) << e;
    flips += bound.flip[e];
  }
  EXPECT_GT(flips, 0.0);  // at rel_delta 1e−3 some of the 2·3·4 rows' weights are ambiguous
}

}  // namespace
