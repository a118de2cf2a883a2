// SPDX-License-Identifier: Apache-2.0
// The attention block (SPEC §7) on cases whose parts can be checked by hand:
// identity projections (the block is then plain attention on x), two heads of
// width 1, the key-padding mask, a zero output projection, RoPE by 0° and 90°,
// and a composition of the reference parts with separate q, k, v buffers;
// then bf16 and f16 storage (SPEC §10.2): the reference rounds at the four
// points and inside its attention, values exact in T come out exact on every
// backend and target, and the optimized block's bits do not depend on the
// thread count.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "support/tandem_test_support.hpp"
#include "tandem/attention_block.hpp"
#include "tandem/reference/attention.hpp"
#include "tandem/reference/attention_block.hpp"
#include "tandem/reference/backend.hpp"
#include "tandem/reference/rope.hpp"

namespace {

using tandem::bfloat16;
using tandem::float16;

using tandem::AttentionBlockInputs;
using tandem::AttentionBlockPlan;
using tandem::Shape;

/// Everything one block call needs; empty optional vectors mean "absent".
struct Block {
  std::int64_t B = 1, S = 0, E = 0, H = 1;
  std::vector<float> x, w_qkv, b_qkv, w_out, b_out, keep, cos, sin;
  std::int64_t R = 0, T = 0;  ///< table shape when cos/sin are given

  AttentionBlockPlan plan() const {
    const auto opt = [](bool given, Shape s) {
      return given ? std::optional<Shape>(s) : std::nullopt;
    };
    return AttentionBlockPlan::from_shapes(
        {B, S, E}, {3 * E, E}, opt(!b_qkv.empty(), {3 * E}), {E, E}, opt(!b_out.empty(), {E}),
        opt(!keep.empty(), {B, S}), opt(!cos.empty(), {R, T}), opt(!sin.empty(), {R, T}), H);
  }
  std::vector<float> run() const {
    std::vector<float> out(static_cast<std::size_t>(B * S * E));
    const AttentionBlockInputs<float> in{x, w_qkv, b_qkv, w_out, b_out, keep, cos, sin};
    tandem::reference::backend().attention_block(plan(), in, out);
    return out;
  }
};

/// [I; I; I]: q = k = v = x.
std::vector<float> identity_qkv(std::int64_t E) {
  std::vector<float> w(static_cast<std::size_t>(3 * E * E), 0.0f);
  for (std::int64_t part = 0; part < 3; ++part) {
    for (std::int64_t e = 0; e < E; ++e) w[(part * E + e) * E + e] = 1.0f;
  }
  return w;
}

std::vector<float> identity(std::int64_t E) {
  std::vector<float> w(static_cast<std::size_t>(E * E), 0.0f);
  for (std::int64_t e = 0; e < E; ++e) w[e * E + e] = 1.0f;
  return w;
}

using tandem::test::random_values;

void expect_near(const std::vector<float>& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << i;
}

TEST(AttentionBlock, IdentityProjectionsGivePlainAttentionOnX) {
  // E = D = 2, H = 1, S = 2, x = [[1, 0], [0, 1]], q = k = v = x, out = a.
  // scale = 1/sqrt(2); q0·k0 = 1, q0·k1 = 0, so with e = exp(1/sqrt(2)):
  //   out0 = (e·[1, 0] + 1·[0, 1]) / (e + 1) = [e/(e+1), 1/(e+1)]
  //   out1 = (1·[1, 0] + e·[0, 1]) / (e + 1) = [1/(e+1), e/(e+1)]
  Block blk;
  blk.S = 2;
  blk.E = 2;
  blk.x = {1, 0, 0, 1};
  blk.w_qkv = identity_qkv(2);
  blk.w_out = identity(2);
  const double e = std::exp(1.0 / std::sqrt(2.0));
  const std::vector<float> out = blk.run();
  expect_near(out, {e / (e + 1), 1 / (e + 1), 1 / (e + 1), e / (e + 1)}, 1e-6);
  // The same as the reference attention on q = k = v = x.
  const std::vector<double> xd(blk.x.begin(), blk.x.end());
  std::vector<double> att(4);
  tandem::AttentionAttrs aa;
  aa.num_heads = 1;
  const tandem::AttentionPlan plain =
      tandem::AttentionPlan::from_shapes({1, 2, 2}, {1, 2, 2}, {1, 2, 2}, std::nullopt, aa);
  tandem::reference::attention_forward<double>(plain, {xd, xd, xd, {}}, std::span<double>(att));
  expect_near(out, att, 1e-6);
}

TEST(AttentionBlock, TwoHeadsOfWidthOneWithBiases) {
  // E = 2, H = 2, D = 1 (scale 1): head 0 is dim 0, head 1 is dim 1.
  // x = [[1, 2], [3, 0]]; q = k = x, v = x + b_v with b_v = [100, 200];
  // w_out swaps the two dims, b_out = [10, 20]: out_s = [a1_s + 10, a0_s + 20].
  //   head 0: q = k = [1, 3], v = [101, 103]
  //     s = 0: scores (1, 3)  → a = 101 + 2·e³/(e + e³) = 101 + 2e²/(1 + e²)
  //     s = 1: scores (3, 9)  → a = 101 + 2e⁶/(1 + e⁶)
  //   head 1: q = k = [2, 0], v = [202, 200]
  //     s = 0: scores (4, 0)  → a = 200 + 2e⁴/(1 + e⁴)
  //     s = 1: scores (0, 0)  → a = (202 + 200)/2 = 201
  Block blk;
  blk.S = 2;
  blk.E = 2;
  blk.H = 2;
  blk.x = {1, 2, 3, 0};
  blk.w_qkv = identity_qkv(2);
  blk.b_qkv = {0, 0, 0, 0, 100, 200};
  blk.w_out = {0, 1, 1, 0};
  blk.b_out = {10, 20};
  const double e2 = std::exp(2.0), e4 = std::exp(4.0), e6 = std::exp(6.0);
  expect_near(blk.run(),
              {210 + 2 * e4 / (1 + e4), 121 + 2 * e2 / (1 + e2), 211, 121 + 2 * e6 / (1 + e6)},
              1e-4);
}

TEST(AttentionBlock, ZeroOutputProjectionGivesTheOutputBias) {
  // w_out = 0: out[b, s, o] = b_out[o] + Σ_e a·0 = b_out[o], whatever x is.
  Block blk;
  blk.B = 2;
  blk.S = 3;
  blk.E = 4;
  blk.H = 2;
  blk.x = random_values(24, 1);
  blk.w_qkv = random_values(48, 2);
  blk.b_qkv = random_values(12, 3);
  blk.w_out.assign(16, 0.0f);
  blk.b_out = {0.5f, -1.0f, 2.0f, 3.0f};
  const std::vector<float> out = blk.run();
  for (std::size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i], blk.b_out[i % 4]) << i;
}

TEST(AttentionBlock, KeepMaskHidesPaddedKeys) {
  // Identity projections, E = 2, H = 1, B = 2, S = 3.
  //   b = 0, keep [1, 0, 0]: every query sees key 0 only → every row = v_0 = [1, 2]
  //   b = 1, keep [0, 0, 1]: every query sees key 2 only → every row = v_2 = [11, 12]
  Block blk;
  blk.B = 2;
  blk.S = 3;
  blk.E = 2;
  blk.x = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  blk.w_qkv = identity_qkv(2);
  blk.w_out = identity(2);
  blk.keep = {1, 0, 0, 0, 0, 1};
  expect_near(blk.run(), {1, 2, 1, 2, 1, 2, 11, 12, 11, 12, 11, 12}, 1e-6);
  // A batch with no visible key has attention output 0 (SPEC §2): out = b_out.
  blk.keep = {0, 0, 0, 0, 0, 1};
  blk.b_out = {-3, 4};
  expect_near(blk.run(), {-3, 4, -3, 4, -3, 4, 8, 16, 8, 16, 8, 16}, 1e-6);
}

TEST(AttentionBlock, RopeByZeroDegreesIsNoRope) {
  // cos = 1, sin = 0: y[i] = x[i]·1 − x[i+m]·0 = x[i] exactly, so the block
  // with tables equals the block without, bit for bit. The table has R = 4 > S
  // rows (position rows) and T = 2 = D/2 columns.
  Block blk;
  blk.B = 2;
  blk.S = 3;
  blk.E = 8;
  blk.H = 2;
  blk.x = random_values(48, 4);
  blk.w_qkv = random_values(192, 5);
  blk.b_qkv = random_values(24, 6);
  blk.w_out = random_values(64, 7);
  const std::vector<float> plain = blk.run();
  blk.R = 4;
  blk.T = 2;
  blk.cos.assign(8, 1.0f);
  blk.sin.assign(8, 0.0f);
  ASSERT_TRUE(blk.plan().has_rope);
  const std::vector<float> roped = blk.run();
  for (std::size_t i = 0; i < plain.size(); ++i) EXPECT_EQ(roped[i], plain[i]) << i;
}

TEST(AttentionBlock, RopeByNinetyDegreesTurnsQAndKButNotV) {
  // E = D = 2, H = 1, S = 2, identity projections, x = [[1, 0], [0, 1]].
  // Table row 0 is 0°, row 1 is 90° (NeoX, m = 1, pair (0, 1)):
  //   q0 = k0 = [1, 0];  q1 = k1 = [0·0 − 1·1, 1·0 + 0·1] = [−1, 0];  v = x.
  // With c = 1/sqrt(2): token 0 scores (q0·k0, q0·k1)·c = (c, −c),
  // token 1 scores (−c, c):
  //   out0 = [e^c, e^−c] / (e^c + e^−c),  out1 = [e^−c, e^c] / (e^c + e^−c)
  Block blk;
  blk.S = 2;
  blk.E = 2;
  blk.x = {1, 0, 0, 1};
  blk.w_qkv = identity_qkv(2);
  blk.w_out = identity(2);
  blk.R = 2;
  blk.T = 1;
  blk.cos = {1, 0};
  blk.sin = {0, 1};
  const double c = 1.0 / std::sqrt(2.0), ep = std::exp(c), em = std::exp(-c);
  expect_near(blk.run(), {ep / (ep + em), em / (ep + em), em / (ep + em), ep / (ep + em)}, 1e-6);
}

TEST(AttentionBlock, AttentionInputsAreQkvColumnsOrTheirRotations) {
  // qkv [B=1, S=2, 3E = 6] holding its own index; E = 2, one head.
  tandem::AttentionBlockParams bp;
  bp.seq = 2;
  bp.embed = 2;
  bp.heads = 1;
  std::vector<float> qkv(6 * 2);
  for (std::size_t i = 0; i < qkv.size(); ++i) qkv[i] = static_cast<float>(i);
  const std::vector<float> keep;
  const auto no_rope = [](const tandem::RopePlan&, std::span<const float>, std::span<float>) {
    ADD_FAILURE() << "rope called without tables";
  };
  // Without tables q, k and v are read in place at columns 0, E and 2E (row stride 3E).
  const AttentionBlockPlan plain = AttentionBlockPlan::make(bp);
  const tandem::AttentionInputs<float> in =
      tandem::block_attention_inputs<float>(plain, qkv, keep, {}, {}, no_rope);
  EXPECT_EQ(in.q.data(), qkv.data());
  EXPECT_EQ(in.k.data(), qkv.data() + 2);
  EXPECT_EQ(in.v.data(), qkv.data() + 4);
  EXPECT_EQ(in.v.size(), static_cast<std::size_t>(plain.attention.v.extent));

  // With tables rope runs on q's columns, then k's, into q_rot and k_rot.
  bp.rope = true;
  bp.table_rows = 2;
  bp.table_stride = 1;
  const AttentionBlockPlan roped = AttentionBlockPlan::make(bp);
  std::vector<float> q_rot(4), k_rot(4);
  std::vector<float> firsts;
  const tandem::AttentionInputs<float> rot = tandem::block_attention_inputs<float>(
      roped, qkv, keep, q_rot, k_rot,
      [&](const tandem::RopePlan&, std::span<const float> src, std::span<float> dst) {
        firsts.push_back(src[0]);
        dst[0] = -1;
      });
  EXPECT_EQ(firsts, (std::vector<float>{0, 2}));
  EXPECT_EQ(rot.q.data(), q_rot.data());
  EXPECT_EQ(rot.k.data(), k_rot.data());
  EXPECT_EQ(rot.v.data(), qkv.data() + 4);
  EXPECT_EQ(q_rot[0], -1);

  // A rotated buffer of the wrong size is rejected before rope runs.
  std::vector<float> short_rot(3);
  EXPECT_THROW(tandem::block_attention_inputs<float>(roped, qkv, keep, short_rot, k_rot, no_rope),
               tandem::Error);
}

TEST(AttentionBlock, EqualsItsPartsComposedOnSeparateBuffers) {
  // The block reads q, k and v out of one [B, S, 3E] buffer with row stride 3E;
  // here the parts run on separate contiguous q, k, v buffers instead:
  //   q = x W_qᵀ + b_q (loops), q ← rope(q), same for k; v = x W_vᵀ + b_v;
  //   a = attention(q, k, v, keep); out = a W_outᵀ + b_out.
  Block blk;
  blk.B = 2;
  blk.S = 3;
  blk.E = 8;
  blk.H = 2;
  const std::int64_t B = 2, S = 3, E = 8, D = 4;
  blk.x = random_values(48, 11);
  blk.w_qkv = random_values(192, 12);
  blk.b_qkv = random_values(24, 13);
  blk.w_out = random_values(64, 14);
  blk.b_out = random_values(8, 15);
  blk.keep = {1, 1, 0, 0, 1, 1};
  blk.R = 3;
  blk.T = 2;
  blk.cos = random_values(6, 16);
  blk.sin = random_values(6, 17);
  const std::vector<float> out = blk.run();

  // Projections: part 0 = q, 1 = k, 2 = v (rows part·E .. part·E + E − 1 of w_qkv).
  std::vector<std::vector<double>> proj(3, std::vector<double>(B * S * E));
  for (std::int64_t part = 0; part < 3; ++part) {
    for (std::int64_t t = 0; t < B * S; ++t) {
      for (std::int64_t o = 0; o < E; ++o) {
        double acc = blk.b_qkv[part * E + o];
        for (std::int64_t e = 0; e < E; ++e) {
          acc += double{blk.x[t * E + e]} * double{blk.w_qkv[(part * E + o) * E + e]};
        }
        proj[part][t * E + o] = acc;
      }
    }
  }
  tandem::RopeParams rp;
  rp.batch = B;
  rp.seq = S;
  rp.width = E;
  rp.head_dim = D;
  rp.table_rows = 3;
  const tandem::RopePlan rope = tandem::RopePlan::make(rp);
  const std::vector<double> cos(blk.cos.begin(), blk.cos.end()),
      sin(blk.sin.begin(), blk.sin.end());
  std::vector<double> q(B * S * E), k(B * S * E);
  tandem::reference::rope_forward<double>(rope, proj[0], {cos, sin}, std::span<double>(q));
  tandem::reference::rope_forward<double>(rope, proj[1], {cos, sin}, std::span<double>(k));
  tandem::AttentionAttrs aa;
  aa.num_heads = 2;
  aa.mask = tandem::MaskKind::key_padding;
  const tandem::AttentionPlan att_plan =
      tandem::AttentionPlan::from_shapes({B, S, E}, {B, S, E}, {B, S, E}, Shape{B, S}, aa);
  std::vector<double> a(B * S * E);
  tandem::reference::attention_forward<double>(att_plan, {q, k, proj[2], blk.keep},
                                               std::span<double>(a));
  std::vector<double> want(B * S * E);
  for (std::int64_t t = 0; t < B * S; ++t) {
    for (std::int64_t o = 0; o < E; ++o) {
      double acc = blk.b_out[o];
      for (std::int64_t e = 0; e < E; ++e) acc += a[t * E + e] * double{blk.w_out[o * E + e]};
      want[t * E + o] = acc;
    }
  }
  expect_near(out, want, 1e-5);
}

// ------------------------------------------------------------ bf16 and f16

template <class T>
std::vector<T> as_t(const std::vector<float>& v) {
  std::vector<T> r;
  r.reserve(v.size());
  for (float f : v) r.push_back(T(static_cast<double>(f)));
  return r;
}

template <class T>
std::vector<float> widen(const std::vector<T>& v) {
  std::vector<float> r;
  r.reserve(v.size());
  for (const T& t : v) r.push_back(static_cast<float>(t));
  return r;
}

/// blk's inputs stored in T (the keep mask stays float32), run by `kernels`.
template <class T>
std::vector<T> run_t(const Block& blk, const tandem::Kernels<T>& kernels,
                     tandem::Rounding rounding = tandem::kRoundingPytorch) {
  const std::vector<T> x = as_t<T>(blk.x), wq = as_t<T>(blk.w_qkv), bq = as_t<T>(blk.b_qkv),
                       wo = as_t<T>(blk.w_out), bo = as_t<T>(blk.b_out), c = as_t<T>(blk.cos),
                       s = as_t<T>(blk.sin);
  tandem::AttentionBlockPlan plan = blk.plan();
  plan.attention.rounding = rounding;
  std::vector<T> out(static_cast<std::size_t>(blk.B * blk.S * blk.E));
  kernels.attention_block(plan, {x, wq, bq, wo, bo, blk.keep, c, s}, out);
  return out;
}

/// A block with every optional input, E = 8, H = 2, B = 2, S = 3.
Block full_block(unsigned seed) {
  Block blk;
  blk.B = 2;
  blk.S = 3;
  blk.E = 8;
  blk.H = 2;
  blk.x = random_values(48, seed);
  blk.w_qkv = random_values(192, seed + 1);
  blk.b_qkv = random_values(24, seed + 2);
  blk.w_out = random_values(64, seed + 3);
  blk.b_out = random_values(8, seed + 4);
  blk.keep = {1, 1, 0, 0, 1, 1};
  blk.R = 3;
  blk.T = 2;
  blk.cos = random_values(6, seed + 5);
  blk.sin = random_values(6, seed + 6);
  return blk;
}

template <class T>
class AttentionBlockStored : public ::testing::Test {};
using StorageTypes = ::testing::Types<bfloat16, float16>;
TYPED_TEST_SUITE(AttentionBlockStored, StorageTypes);

TYPED_TEST(AttentionBlockStored, ReferenceRoundsQkvRopeAttentionAndOut) {
  // SPEC §10.2, on separate q, k, v buffers: q = RN_T(x W_qᵀ + b_q) (sum in double),
  // q ← rope<T>(q), k likewise, v = RN_T(x W_vᵀ + b_v); a = attention<T>(q, k, v, keep)
  // at the profile; out = RN_T(a W_outᵀ + b_out). Bitwise: the reference rounds there only.
  using T = TypeParam;
  const Block blk = full_block(40);
  const std::int64_t B = 2, S = 3, E = 8, D = 4;
  const std::vector<T> x = as_t<T>(blk.x), wq = as_t<T>(blk.w_qkv), bq = as_t<T>(blk.b_qkv),
                       wo = as_t<T>(blk.w_out), bo = as_t<T>(blk.b_out), c = as_t<T>(blk.cos),
                       s = as_t<T>(blk.sin);
  std::vector<std::vector<T>> proj(3, std::vector<T>(B * S * E));
  for (std::int64_t part = 0; part < 3; ++part) {
    for (std::int64_t t = 0; t < B * S; ++t) {
      for (std::int64_t o = 0; o < E; ++o) {
        double acc = static_cast<double>(bq[part * E + o]);
        for (std::int64_t e = 0; e < E; ++e) {
          acc +=
              static_cast<double>(x[t * E + e]) * static_cast<double>(wq[(part * E + o) * E + e]);
        }
        proj[part][t * E + o] = T(acc);
      }
    }
  }
  tandem::RopeParams rp;
  rp.batch = B;
  rp.seq = S;
  rp.width = E;
  rp.head_dim = D;
  rp.table_rows = 3;
  const tandem::RopePlan rope = tandem::RopePlan::make(rp);
  std::vector<T> q(B * S * E), k(B * S * E);
  tandem::reference::rope_forward<T>(rope, proj[0], {c, s}, std::span<T>(q));
  tandem::reference::rope_forward<T>(rope, proj[1], {c, s}, std::span<T>(k));
  for (const tandem::Rounding& profile : {tandem::kRoundingPytorch, tandem::kRoundingExact}) {
    SCOPED_TRACE(std::string(profile.name));
    tandem::AttentionAttrs aa;
    aa.num_heads = 2;
    aa.mask = tandem::MaskKind::key_padding;
    tandem::AttentionPlan att_plan =
        tandem::AttentionPlan::from_shapes({B, S, E}, {B, S, E}, {B, S, E}, Shape{B, S}, aa);
    att_plan.rounding = profile;
    std::vector<T> a(B * S * E);
    tandem::reference::attention_forward<T>(att_plan, {q, k, proj[2], blk.keep}, std::span<T>(a));
    std::vector<T> want(B * S * E);
    for (std::int64_t t = 0; t < B * S; ++t) {
      for (std::int64_t o = 0; o < E; ++o) {
        double acc = static_cast<double>(bo[o]);
        for (std::int64_t e = 0; e < E; ++e) {
          acc += static_cast<double>(a[t * E + e]) * static_cast<double>(wo[o * E + e]);
        }
        want[t * E + o] = T(acc);
      }
    }
    const std::vector<T> got = run_t<T>(blk, tandem::reference::backend().kernels<T>(), profile);
    for (std::size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i].bits, want[i].bits) << i;
  }
}

/// The backends offering the block at T (the optimized one on every target).
template <class T>
void for_each_backend(const std::function<void(const tandem::Kernels<T>&)>& body) {
  {
    SCOPED_TRACE("reference");
    body(tandem::reference::backend().kernels<T>());
  }
#ifdef TANDEM_HAVE_OPTIMIZED
  tandem::test::for_each_target([&] { body(tandem::optimized::backend().kernels<T>()); });
#endif
}

TYPED_TEST(AttentionBlockStored, ExactValuesComeOutExact) {
  // The keep-mask case of the float tests (identity projections, every query
  // sees one key, so out = that key's v): every value is a small integer,
  // exact in T, and so is each rounding point's result under the exact
  // profile (pytorch's RN_T(e)/e, within u_T of 1, may move v by an ulp of f16).
  using T = TypeParam;
  Block blk;
  blk.B = 2;
  blk.S = 3;
  blk.E = 2;
  blk.x = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  blk.w_qkv = identity_qkv(2);
  blk.w_out = identity(2);
  blk.keep = {1, 0, 0, 0, 0, 1};
  blk.b_out = {-3, 4};
  for_each_backend<T>([&](const tandem::Kernels<T>& k) {
    ASSERT_TRUE(static_cast<bool>(k.attention_block));
    const std::vector<T> out = run_t<T>(blk, k, tandem::kRoundingExact);
    expect_near(widen(out), {-2, 6, -2, 6, -2, 6, 8, 16, 8, 16, 8, 16}, 0);
  });
}

TYPED_TEST(AttentionBlockStored, ZeroOutputProjectionGivesTheOutputBiasExactly) {
  using T = TypeParam;
  Block blk = full_block(60);
  blk.w_out.assign(64, 0.0f);
  for_each_backend<T>([&](const tandem::Kernels<T>& k) {
    const std::vector<T> out = run_t<T>(blk, k);
    for (std::size_t i = 0; i < out.size(); ++i) {
      EXPECT_EQ(out[i].bits, T(static_cast<double>(blk.b_out[i % 8])).bits) << i;
    }
  });
}

TYPED_TEST(AttentionBlockStored, ViewsAreCheckedBeforeAnyWrite) {
  using T = TypeParam;
  const Block blk = full_block(70);
  const std::vector<T> x = as_t<T>(blk.x), wq = as_t<T>(blk.w_qkv), bq = as_t<T>(blk.b_qkv),
                       wo = as_t<T>(blk.w_out), bo = as_t<T>(blk.b_out), c = as_t<T>(blk.cos);
  const tandem::AttentionBlockPlan plan = blk.plan();
  for_each_backend<T>([&](const tandem::Kernels<T>& k) {
    std::vector<T> out(48, T(7.0));
    const std::span<const T> short_sin(c.data(), c.size() - 1);
    tandem::test::expect_error(
        [&] {
          k.attention_block(plan, {x, wq, bq, wo, bo, blk.keep, c, short_sin}, out);
        },
        "sin.size()");
    for (const T& o : out) EXPECT_EQ(o.bits, T(7.0).bits);
  });
}

#ifdef TANDEM_HAVE_OPTIMIZED
TYPED_TEST(AttentionBlockStored, OptimizedBitsDoNotDependOnTheThreadCount) {
  // Large enough for several row blocks of the projections (kBlockM = 64 rows).
  using T = TypeParam;
  Block blk;
  blk.B = 3;
  blk.S = 50;
  blk.E = 32;
  blk.H = 4;
  blk.x = random_values(3 * 50 * 32, 80);
  blk.w_qkv = random_values(3 * 32 * 32, 81);
  blk.b_qkv = random_values(96, 82);
  blk.w_out = random_values(32 * 32, 83);
  blk.b_out = random_values(32, 84);
  blk.R = 50;
  blk.T = 4;
  blk.cos = random_values(200, 85);
  blk.sin = random_values(200, 86);
  const std::vector<T> one =
      run_t<T>(blk, tandem::optimized::backend(tandem::optimized::Options(1)).kernels<T>());
  for (const int threads : {2, 3}) {
    const std::vector<T> many =
        run_t<T>(blk, tandem::optimized::backend(tandem::optimized::Options(threads)).kernels<T>());
    for (std::size_t i = 0; i < one.size(); ++i) {
      ASSERT_EQ(one[i].bits, many[i].bits) << i << " with " << threads << " threads";
    }
  }
}
#endif

}  // namespace
