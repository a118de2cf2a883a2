// SPDX-License-Identifier: Apache-2.0
// The optimized backend's attention over stored K and V (SPEC §10.2, §10.4):
// quantize_kv bitwise against the scalar definition, the quantized forward
// and the bf16/f16 decode against the float32 optimized attention of the
// same values within a bound derived below, and every result bitwise the
// same for any thread count; on every Highway target.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "support/tandem_test_support.hpp"
#include "tandem/optimized/backend.hpp"
#include "tandem/optimized/decode.hpp"

namespace tandem::test {
namespace {

/// n values x·2^e, x uniform in [−1, 1), e uniform in [lo_exp, hi_exp]: many
/// binades, so that codes of every size and rounding ties occur.
std::vector<float> spread_values(std::size_t n, unsigned seed, int lo_exp = -12, int hi_exp = 6) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> x(-1.0f, 1.0f);
  std::uniform_int_distribution<int> e(lo_exp, hi_exp);
  std::vector<float> v(n);
  for (float& y : v) y = std::ldexp(x(gen), e(gen));
  return v;
}

/// SPEC §10.4's codes and scales, element by element (the definition the
/// optimized quantize_kv must give bitwise).
struct Quantized {
  std::vector<std::uint8_t> codes;
  std::vector<float> scales;
};

Quantized define_quantize(const AttentionPlan& p, const std::vector<float>& x, const Strides& at,
                          std::int64_t width) {
  Quantized q{std::vector<std::uint8_t>(x.size(), 0), std::vector<float>(p.kv_scale_size(), 0)};
  const auto code = [&](float y, float sigma) -> std::uint8_t {
    if (sigma == 0.0f) return 0;
    const float r = y / sigma;
    if (p.kv_cache == KvCache::int8) {
      const float c = std::clamp(std::nearbyint(r), -127.0f, 127.0f);
      return static_cast<std::uint8_t>(static_cast<std::int8_t>(c));
    }
    return float8_e4m3(static_cast<double>(r)).bits;
  };
  for (std::int64_t g = 0; g < p.Hkv; ++g) {
    float head_max = 0.0f;
    for (std::int64_t b = 0; b < p.kv_batch(); ++b) {
      for (std::int64_t s = 0; s < p.kv_seq(); ++s) {
        float row_max = 0.0f;
        for (std::int64_t d = 0; d < width; ++d)
          row_max = std::max(row_max, std::fabs(x[at.at(b, s, g) + d]));
        head_max = std::max(head_max, row_max);
        if (p.kv_cache == KvCache::int8) q.scales[p.kv_scale_at(b, s, g)] = row_max / 127.0f;
      }
    }
    if (p.kv_cache == KvCache::e4m3) q.scales[g] = head_max / 448.0f;
    for (std::int64_t b = 0; b < p.kv_batch(); ++b) {
      for (std::int64_t s = 0; s < p.kv_seq(); ++s) {
        const float sigma = q.scales[p.kv_scale_at(b, s, g)];
        for (std::int64_t d = 0; d < width; ++d) {
          q.codes[at.at(b, s, g) + d] = code(x[at.at(b, s, g) + d], sigma);
        }
      }
    }
  }
  return q;
}

/// σ·c as double (exact) for every element of a quantized tensor.
std::vector<double> dequantized(const AttentionPlan& p, const Quantized& q, const Strides& at,
                                std::int64_t width) {
  std::vector<double> y(q.codes.size(), 0.0);
  for (std::int64_t b = 0; b < p.kv_batch(); ++b) {
    for (std::int64_t s = 0; s < p.kv_seq(); ++s) {
      for (std::int64_t g = 0; g < p.Hkv; ++g) {
        const double sigma = q.scales[p.kv_scale_at(b, s, g)];
        for (std::int64_t d = 0; d < width; ++d) {
          const std::uint8_t c = q.codes[at.at(b, s, g) + d];
          const double v = p.kv_cache == KvCache::int8
                               ? static_cast<double>(static_cast<std::int8_t>(c))
                               : static_cast<double>(float8_e4m3::from_bits(c));
          y[at.at(b, s, g) + d] = sigma * v;
        }
      }
    }
  }
  return y;
}

/// The decode shapes the tests run: GQA, features one at a time, a paged
/// cache, Dv != D, rows not whole vectors wide.
std::vector<AttentionParams> decode_shapes() {
  std::vector<AttentionParams> v;
  v.push_back(attention_params(2, 1, 77, 8, 2, 32));
  v.push_back(attention_params(1, 2, 130, 4, 1, 20, 12, Layout::bhsd, MaskKind::causal));
  v.push_back(attention_params(1, 3, 90, 6, 3, 16, 0, Layout::bshd, MaskKind::sliding_window, 21));
  v.push_back(attention_params(2, 1, 64, 4, 4, 16, 0, Layout::bshd, MaskKind::key_padding));
  AttentionParams bias = attention_params(1, 2, 50, 4, 2, 16, 24, Layout::bshd, MaskKind::bias);
  bias.bias_heads = 4;
  v.push_back(bias);
  AttentionParams cap = attention_params(1, 1, 100, 8, 2, 16);
  cap.softcap = 3.0;
  cap.sinks = true;
  v.push_back(cap);
  AttentionParams alibi = attention_params(2, 1, 70, 4, 2, 16, 0, Layout::bshd, MaskKind::causal);
  alibi.alibi = AlibiKind::per_head;
  v.push_back(alibi);
  AttentionParams paged = attention_params(3, 1, 0, 4, 2, 16);
  paged.num_blocks = 9;
  paged.block_size = 16;
  paged.max_blocks = 3;
  v.push_back(paged);
  return v;
}

/// Fills the feature inputs of a case: a key padding mask that hides every
/// third key, a bias with some −inf, sinks, slopes, a block table.
template <class T>
void fill_features(AttentionCase<T>& c, unsigned seed) {
  const AttentionPlan& p = c.plan;
  std::mt19937 gen(seed);
  if (p.mask == MaskKind::key_padding) {
    for (std::size_t i = 0; i < c.mask.size(); ++i) c.mask[i] = i % 3 == 1 ? 0.0f : 1.0f;
  }
  if (p.mask == MaskKind::bias) {
    c.mask = random_values<float>(c.mask.size(), seed + 1, -2.0f, 2.0f);
    for (std::size_t i = 0; i < c.mask.size(); i += 7) c.mask[i] = -INFINITY;
  }
  if (p.sinks) c.sinks = stored<T>(random_values<float>(p.H, seed + 2, -1.0f, 2.0f));
  if (p.alibi != AlibiKind::none)
    c.slopes = random_values<float>(p.slopes_size(), seed + 3, 0.0f, 0.5f);
  if (p.paged()) {
    c.table.resize(p.B * p.max_blocks);
    for (std::size_t i = 0; i < c.table.size(); ++i)
      c.table[i] = static_cast<std::int32_t>((i * 5 + 2) % p.num_blocks);
    c.lens = {static_cast<std::int32_t>(p.max_blocks * p.block_size), 17, 40};
  }
}

/// A float32 case holding the same q, features and (given) k, v values.
AttentionCase<float> f32_case(AttentionParams params, const std::vector<float>& q,
                              const std::vector<float>& k, const std::vector<float>& v) {
  params.kv_cache = KvCache::plain;
  params.rounding = kRoundingPytorch;
  AttentionCase<float> c(params);
  c.q = q;
  c.k = k;
  c.v = v;
  return c;
}

template <class T>
void copy_features(const AttentionCase<T>& from, AttentionCase<float>& to) {
  to.mask = from.mask;
  to.slopes = from.slopes;
  to.table = from.table;
  to.lens = from.lens;
  to.sinks = widened(from.sinks);
}

/// The bound on |o − o32| for one output element of row (n, h, i): the
/// output's rounding u_T·|o32|; the weights' rounding to T (pytorch) u_T per
/// weight, at most u_T·max|v| in o; the scores' float32 sums on both sides
/// (D terms of the dot product, relative 2D·2^−24 of Σ|q||k| each) moving
/// every probability by at most twice that relative, hence o by
/// 2·δs·max|v|; exp2's polynomial (1.8e-7 relative, both sides) and the sums
/// over Sk keys of the weights and of P·V (2·Sk·2^−24 relative).
struct Bound {
  double u_T = 0, max_v = 0, max_qk = 0;
  std::int64_t D = 0, Sk = 0;
  bool rounds = false;
  double at(double o32) const {
    const double ds = 2.0 * static_cast<double>(D) * std::ldexp(1.0, -24) * max_qk * 1.4427;
    return u_T * std::fabs(o32) + (rounds ? u_T * max_v : 0.0) + 2.0 * ds * max_v +
           (4e-7 + 4.0 * static_cast<double>(Sk) * std::ldexp(1.0, -24)) * max_v + 1e-30;
  }
};

template <class T>
void expect_within(const std::vector<T>& got, const std::vector<float>& want, const Bound& bound) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = static_cast<double>(got[i]);
    ASSERT_LE(std::fabs(g - want[i]), bound.at(want[i]))
        << "element " << i << ": " << g << " vs " << want[i];
  }
}

/// Options whose split-key chunk is small (16 keys), so that every test shape
/// merges several chunks, on `threads` threads.
optimized::Options split_options(int threads, std::int64_t chunk = 16) {
  optimized::Options o;
  o.threads = threads;
  o.geometry.split_keys_chunk = chunk;
  return o;
}

template <class T>
void check_quantize_kv(KvCache kind) {
  for (AttentionParams params : decode_shapes()) {
    params.kv_cache = kind;
    AttentionCase<T> c(params);
    const AttentionPlan& p = c.plan;
    SCOPED_TRACE(p.describe());
    std::vector<float> k32 = widened(stored<T>(spread_values(c.k.size(), 11)));
    // row 0 of kv head 0: σ = 1 (max 127 or 448), then ties of both roundings
    const bool int8 = kind == KvCache::int8;
    const std::vector<float> ties = {
        int8 ? 127.0f : 448.0f, 2.5f,           -3.5f, 0.5f, 1.0625f, -1.1875f,
        0x1p-9f * 2.5f,         -0x1p-9f * 1.5f};
    std::copy(ties.begin(), ties.end(), k32.begin() + p.k.at(0, 0, 0));
    std::vector<float> v32 = widened(stored<T>(spread_values(c.v.size(), 12)));
    if (!v32.empty())
      std::fill(v32.begin(), v32.begin() + std::min<std::size_t>(v32.size(), p.Dv), 0.0f);
    const Quantized kq = define_quantize(p, k32, p.k, p.D), vq = define_quantize(p, v32, p.v, p.Dv);
    const std::vector<T> k = stored<T>(k32), v = stored<T>(v32);
    for (const int threads : {1, 3}) {
      std::vector<std::uint8_t> kc(k.size(), 0xAB), vc(v.size(), 0xAB);
      std::vector<float> ks(p.kv_scale_size(), -1.0f), vs(p.kv_scale_size(), -1.0f);
      optimized::Options o;
      o.threads = threads;
      optimized::backend(o).kernels<T>().quantize_kv(p, k, v, QuantizedKvOut{kc, vc, ks, vs});
      EXPECT_EQ(kc, kq.codes);
      EXPECT_EQ(vc, vq.codes);
      EXPECT_TRUE(bitwise_equal(ks, kq.scales));
      EXPECT_TRUE(bitwise_equal(vs, vq.scales));
    }
  }
}

TEST(OptimizedQuantizeKv, Int8AndE4m3AreTheDefinitionBitwise) {
  for_each_target([] {
    for (const KvCache kind : {KvCache::int8, KvCache::e4m3}) {
      check_quantize_kv<float>(kind);
      check_quantize_kv<bfloat16>(kind);
      check_quantize_kv<float16>(kind);
    }
  });
}

/// The quantized forward of one shape against the float32 optimized
/// attention of the dequantized values; bitwise the same for 1, 2, 5
/// threads with small chunks and with the default ones.
template <class T>
void check_quantized_forward(AttentionParams params, KvCache kind, const Rounding& rounding) {
  params.kv_cache = kind;
  params.rounding = rounding;
  AttentionCase<T> c(params);
  const AttentionPlan& p = c.plan;
  SCOPED_TRACE(p.describe() + " rounding=" + std::string(rounding.name));
  fill_features(c, 5);
  c.q = stored<T>(random_values<float>(c.q.size(), 21, -2.0f, 2.0f));
  const std::vector<float> k32 = random_values<float>(c.k.size(), 22);
  const std::vector<float> v32 = random_values<float>(c.v.size(), 23, -3.0f, 3.0f);
  const Quantized kq = define_quantize(p, k32, p.k, p.D), vq = define_quantize(p, v32, p.v, p.Dv);
  const std::vector<double> kd = dequantized(p, kq, p.k, p.D), vd = dequantized(p, vq, p.v, p.Dv);
  std::vector<float> kf(kd.begin(), kd.end()), vf(vd.begin(), vd.end());
  AttentionCase<float> f = f32_case(params, widened(c.q), kf, vf);
  copy_features(c, f);
  std::vector<float> want(f.plan.o.extent);
  optimized::backend().attention_forward(f.plan, f.inputs(), want);

  const QuantizedKv kv{kq.codes, vq.codes, kq.scales, vq.scales};
  AttentionInputs<T> in = c.inputs();
  in.k = {};
  in.v = {};
  std::vector<T> first;
  for (const optimized::Options& o :
       {split_options(1), split_options(2), split_options(5), optimized::Options{}}) {
    std::vector<T> out(p.o.extent);
    optimized::backend(o).kernels<T>().attention_forward_quantized(p, in, kv, out);
    Bound bound{storage_traits<T>::unit_roundoff,          0, 0, p.D, p.Sk + 1,
                is_low_precision_v<T> && rounding.operands};
    for (const double x : vd) bound.max_v = std::max(bound.max_v, std::fabs(x));
    double max_q = 0, max_k = 0;
    for (const T& x : c.q) max_q = std::max(max_q, std::fabs(static_cast<double>(x)));
    for (const double x : kd) max_k = std::max(max_k, std::fabs(x));
    bound.max_qk = static_cast<double>(p.D) * max_q * max_k * p.scale;
    if (p.softcap > 0) bound.max_qk = std::max(bound.max_qk, 1.0);
    expect_within(out, want, bound);
    if (first.empty()) {
      first = out;
    } else if (o.geometry.split_keys_chunk != 0) {
      EXPECT_TRUE(same_bits(out, first)) << "threads " << o.threads;
    }
  }
}

TEST(OptimizedQuantizedForward, AgreesWithFloat32OnTheDequantizedValues) {
  for_each_target([] {
    for (const AttentionParams& params : decode_shapes()) {
      for (const KvCache kind : {KvCache::int8, KvCache::e4m3}) {
        check_quantized_forward<float>(params, kind, kRoundingPytorch);
        check_quantized_forward<bfloat16>(params, kind, kRoundingPytorch);
        check_quantized_forward<float16>(params, kind, kRoundingExact);
      }
    }
  });
}

TEST(OptimizedQuantizedForward, LongerQueryBlocksTakeTheSamePath) {
  // 40 queries of 2 heads per kv head: several tasks' rows per sequence
  AttentionParams p = attention_params(1, 40, 60, 4, 2, 16, 0, Layout::bshd, MaskKind::causal);
  check_quantized_forward<bfloat16>(p, KvCache::int8, kRoundingPytorch);
}

/// The bf16/f16 decode against the float32 optimized attention of the same
/// (widened) values, with lse, and bitwise across thread counts.
template <class T>
void check_decode_stored(const AttentionParams& params, const Rounding& rounding) {
  AttentionParams pr = params;
  pr.rounding = rounding;
  AttentionCase<T> c(pr);
  const AttentionPlan& p = c.plan;
  SCOPED_TRACE(p.describe() + " rounding=" + std::string(rounding.name));
  fill_features(c, 9);
  c.q = stored<T>(random_values<float>(c.q.size(), 31, -2.0f, 2.0f));
  c.k = stored<T>(random_values<float>(c.k.size(), 32));
  c.v = stored<T>(random_values<float>(c.v.size(), 33, -3.0f, 3.0f));
  AttentionCase<float> f = f32_case(params, widened(c.q), widened(c.k), widened(c.v));
  copy_features(c, f);
  std::vector<float> want(f.plan.o.extent), want_lse(f.plan.lse_size());
  optimized::backend().attention_forward_lse(f.plan, f.inputs(), want, want_lse);
  std::vector<T> first;
  for (const int threads : {1, 4}) {
    std::vector<T> out(p.o.extent);
    std::vector<float> lse(p.lse_size());
    ASSERT_TRUE(
        optimized::attention_decode_stored<T>(p, c.inputs(), out, lse, split_options(threads)));
    Bound bound{storage_traits<T>::unit_roundoff, 0, 0, p.D, p.Sk + 1, rounding.operands};
    for (const float x : f.v) bound.max_v = std::max<double>(bound.max_v, std::fabs(x));
    bound.max_qk = static_cast<double>(p.D) * 2.0 * p.scale;
    if (p.softcap > 0) bound.max_qk = std::max(bound.max_qk, 1.0);
    expect_within(out, want, bound);
    for (std::size_t i = 0; i < lse.size(); ++i) {
      if (std::isinf(want_lse[i])) {
        EXPECT_EQ(lse[i], want_lse[i]);
      } else {
        EXPECT_NEAR(lse[i], want_lse[i], 1e-5 * (1 + std::fabs(want_lse[i]))) << i;
      }
    }
    if (first.empty()) {
      first = out;
    } else {
      EXPECT_TRUE(same_bits(out, first)) << "threads " << threads;
    }
  }
}

TEST(OptimizedDecodeStored, Bf16AndF16AgreeWithFloat32) {
  for_each_target([] {
    for (const AttentionParams& params : decode_shapes()) {
      check_decode_stored<bfloat16>(params, kRoundingPytorch);
      check_decode_stored<float16>(params, kRoundingPytorch);
      check_decode_stored<bfloat16>(params, kRoundingExact);
    }
  });
}

TEST(OptimizedDecodeStored, DeclinesCallsThatAreNotDecodeSteps) {
  AttentionCase<bfloat16> c(attention_params(1, 64, 64, 4, 4, 16));
  std::vector<bfloat16> out(c.plan.o.extent, bfloat16(7.0));
  EXPECT_FALSE(optimized::attention_decode_stored<bfloat16>(c.plan, c.inputs(), out, {},
                                                            optimized::Options{}));
  for (const bfloat16& x : out) EXPECT_EQ(static_cast<double>(x), 7.0);
}

TEST(OptimizedQuantizedForward, RejectsBadScalesAndGgmlBeforeWriting) {
  AttentionParams params = attention_params(1, 1, 8, 2, 1, 16);
  params.kv_cache = KvCache::int8;
  AttentionCase<float> c(params);
  std::vector<std::uint8_t> codes(c.k.size(), 1);
  std::vector<float> scales(c.plan.kv_scale_size(), 1.0f), bad = scales;
  bad[3] = -1.0f;
  AttentionInputs<float> in = c.inputs();
  in.k = {};
  in.v = {};
  std::vector<float> out(c.plan.o.extent, sentinel());
  const Backend b = optimized::backend();
  expect_error(
      [&] {
        b.attention_forward_quantized(c.plan, in, {codes, codes, bad, scales}, out);
      },
      "k_scale");
  EXPECT_TRUE(untouched(out));
  params.rounding = kRoundingGgml;
  AttentionCase<bfloat16> g(params);
  AttentionInputs<bfloat16> gin = g.inputs();
  gin.k = {};
  gin.v = {};
  std::vector<bfloat16> gout(g.plan.o.extent);
  expect_error(
      [&] {
        b.bf16.attention_forward_quantized(g.plan, gin, {codes, codes, scales, scales}, gout);
      },
      "rounding");
}

}  // namespace
}  // namespace tandem::test
