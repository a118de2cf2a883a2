// SPDX-License-Identifier: Apache-2.0
// Hand-worked examples of the reference attention (SPEC §2–3). Every
// expected value is derived in the comments next to it; the last tests
// check the backward against finite differences (T = double) and against
// complex-step derivatives (T = std::complex<double>).
#include <gtest/gtest.h>

#include <cmath>
#include <complex>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "support/tandem_test_support.hpp"
#include "tandem/attention.hpp"
#include "tandem/reference/attention.hpp"
#include "tandem/reference/backend.hpp"

namespace {

using tandem::AttentionGrads;
using tandem::AttentionInputs;
using tandem::AttentionParams;
using tandem::AttentionPlan;
using tandem::Layout;
using tandem::MaskKind;
using tandem::Strides;

const double kLn2 = std::log(2.0);
const double kLn3 = std::log(3.0);
const double kE = std::exp(1.0);
const float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

// The inputs of one attention call, held in T, with the plan that shapes them.
template <class T>
using Problem = tandem::test::AttentionCase<T>;

// x[(b, s, h, d)] through the strides st.
template <class T>
T& at(std::vector<T>& x, const Strides& st, std::int64_t b, std::int64_t s, std::int64_t h,
      std::int64_t d) {
  return x[st.at(b, s, h) + d];
}

// A fixed, reproducible value in [-1, 1] for element n of stream `seed`.
double noise(std::uint64_t seed, std::uint64_t n) {
  std::uint64_t x = (seed + 1) * 0x9E3779B97F4A7C15ull ^ (n + 1) * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  return static_cast<double>(x % 2000001) / 1000000.0 - 1.0;
}

// Fills q, k, v, dout with noise (gaps of strided rows included) and makes
// an interesting mask: keep = 1, 0, 1, 0, ... in every batch but the last,
// which is fully padded when B > 1; or a bias in [-1, 1] with every fifth
// element -inf.
void fill(Problem<double>& pr, std::uint64_t seed) {
  for (std::size_t n = 0; n < pr.q.size(); ++n) pr.q[n] = noise(seed, n);
  for (std::size_t n = 0; n < pr.k.size(); ++n) pr.k[n] = noise(seed + 1, n);
  for (std::size_t n = 0; n < pr.v.size(); ++n) pr.v[n] = noise(seed + 2, n);
  for (std::size_t n = 0; n < pr.dout.size(); ++n) pr.dout[n] = noise(seed + 3, n);
  for (std::size_t n = 0; n < pr.mask.size(); ++n) {
    if (pr.plan.mask == MaskKind::key_padding) {
      const std::int64_t b = static_cast<std::int64_t>(n) / pr.plan.Sk;
      const bool padded_batch = pr.plan.B > 1 && b == pr.plan.B - 1;
      pr.mask[n] = padded_batch || n % 2 == 1 ? 0.0f : 1.0f;
    } else {
      pr.mask[n] = n % 5 == 3 ? -kInf : static_cast<float>(noise(seed + 4, n));
    }
  }
}

// The same problem in another scalar type.
template <class T>
Problem<T> convert(const Problem<double>& pr, const AttentionParams& p) {
  Problem<T> out(p);
  for (std::size_t n = 0; n < pr.q.size(); ++n) out.q[n] = static_cast<T>(pr.q[n]);
  for (std::size_t n = 0; n < pr.k.size(); ++n) out.k[n] = static_cast<T>(pr.k[n]);
  for (std::size_t n = 0; n < pr.v.size(); ++n) out.v[n] = static_cast<T>(pr.v[n]);
  for (std::size_t n = 0; n < pr.dout.size(); ++n) out.dout[n] = static_cast<T>(pr.dout[n]);
  out.mask = pr.mask;
  return out;
}

template <class T>
std::vector<T> forward(const Problem<T>& pr) {
  std::vector<T> out(pr.plan.o.extent, T(0));
  tandem::reference::attention_forward<T>(pr.plan, pr.inputs(), out);
  return out;
}

template <class T>
struct Grads {
  std::vector<T> dq, dk, dv;
};

template <class T>
Grads<T> backward(const Problem<T>& pr) {
  Grads<T> g{std::vector<T>(pr.plan.dq.extent, T(0)), std::vector<T>(pr.plan.dk.extent, T(0)),
             std::vector<T>(pr.plan.dv.extent, T(0))};
  tandem::reference::attention_backward<T>(pr.plan, pr.inputs(), pr.dout,
                                           AttentionGrads<T>{g.dq, g.dk, g.dv});
  return g;
}

// The float32 reference backend, the way every client calls it.
std::vector<float> forward_f32(const Problem<float>& pr) {
  std::vector<float> out(pr.plan.o.extent, 0.0f);
  tandem::reference::backend().attention_forward(pr.plan, pr.inputs(), out);
  return out;
}

Grads<float> backward_f32(const Problem<float>& pr) {
  Grads<float> g{std::vector<float>(pr.plan.dq.extent), std::vector<float>(pr.plan.dk.extent),
                 std::vector<float>(pr.plan.dv.extent)};
  tandem::reference::backend().attention_backward(pr.plan, pr.inputs(), pr.dout,
                                                  AttentionGrads<float>{g.dq, g.dk, g.dv});
  return g;
}

AttentionParams one_head(std::int64_t Sq, std::int64_t Sk, std::int64_t D = 1) {
  AttentionParams p;
  p.Sq = Sq;
  p.Sk = Sk;
  p.H = 1;
  p.D = D;
  return p;
}

// ---------------------------------------------------------------------------
// Forward

TEST(AttentionReference, TwoKeysWithAKnownSoftmax) {
  // D = 1, so scale = 1/sqrt(1) = 1. q = 1, k = (0, ln 3):
  //   s = (0, ln 3), exp(s) = (1, 3), p = (1/4, 3/4).
  // v = (4, 8): o = 4/4 + 3*8/4 = 1 + 6 = 7.
  Problem<float> pr(one_head(1, 2));
  pr.q = {1.0f};
  pr.k = {0.0f, static_cast<float>(kLn3)};
  pr.v = {4.0f, 8.0f};
  const std::vector<float> out = forward_f32(pr);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_NEAR(out[0], 7.0f, 1e-5f);
}

TEST(AttentionReference, ValueWidthDiffersFromHeadWidth) {
  // D = 1, Dv = 3. Same p = (1/4, 3/4) as above.
  // v_0 = (4, 0, 1), v_1 = (8, 4, -1):
  //   o = (1 + 6, 0 + 3, 1/4 - 3/4) = (7, 3, -0.5).
  AttentionParams p = one_head(1, 2);
  p.Dv = 3;
  Problem<float> pr(p);
  pr.q = {1.0f};
  pr.k = {0.0f, static_cast<float>(kLn3)};
  pr.v = {4.0f, 0.0f, 1.0f, 8.0f, 4.0f, -1.0f};
  const std::vector<float> out = forward_f32(pr);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_NEAR(out[0], 7.0f, 1e-5f);
  EXPECT_NEAR(out[1], 3.0f, 1e-5f);
  EXPECT_NEAR(out[2], -0.5f, 1e-6f);
}

TEST(AttentionReference, CustomScale) {
  // D = 2, scale = 0.5 (the default would be 1/sqrt(2)).
  // q = (1, 1), k_0 = (0, 0), k_1 = (ln 3, ln 3): <q, k_1> = 2 ln 3,
  //   s = 0.5 * (0, 2 ln 3) = (0, ln 3), p = (1/4, 3/4); v = (4, 8): o = 7.
  AttentionParams p = one_head(1, 2, 2);
  p.Dv = 1;
  p.scale = 0.5;
  Problem<float> pr(p);
  const float l3 = static_cast<float>(kLn3);
  pr.q = {1.0f, 1.0f};
  pr.k = {0.0f, 0.0f, l3, l3};
  pr.v = {4.0f, 8.0f};
  EXPECT_NEAR(forward_f32(pr)[0], 7.0f, 1e-5f);
}

TEST(AttentionReference, SoftcapAtAKnownTanh) {
  // c = 2 and q = 1, k = (0, ln 3): x = (0, ln 3).
  // ln 3 / 2 = atanh(1/2) (atanh(y) = ln((1+y)/(1-y))/2 = ln(3)/2), so
  //   s = 2 * tanh(x / 2) = (0, 2 * 1/2) = (0, 1), p = (1, e) / (1 + e).
  // v = (0, 1): o = e / (1 + e) = 0.7310585786… (3/4 without the cap).
  AttentionParams p = one_head(1, 2);
  p.softcap = 2.0;
  Problem<float> pr(p);
  pr.q = {1.0f};
  pr.k = {0.0f, static_cast<float>(kLn3)};
  pr.v = {0.0f, 1.0f};
  EXPECT_NEAR(forward_f32(pr)[0], kE / (1.0 + kE), 1e-6);
}

TEST(AttentionReference, FullyPaddedRowIsZeroWithZeroGradients) {
  // B = 2, Sq = 1, Sk = 2, D = 1, key_padding keep = [[1, 0], [0, 0]].
  // Batch 0 sees key 0 only: p = (1), o = v_0 = 4, even though the padded
  // key 1 holds NaN (hidden keys are never read).
  // Batch 1 sees no key: o = 0 exactly, and it adds nothing to any gradient.
  AttentionParams p = one_head(1, 2);
  p.B = 2;
  p.mask = MaskKind::key_padding;
  Problem<float> pr(p);
  pr.mask = {1.0f, 0.0f, 0.0f, 0.0f};
  pr.q = {1.0f, 2.0f};
  pr.k = {0.5f, kNaN, 1.0f, 2.0f};
  pr.v = {4.0f, kNaN, 5.0f, 6.0f};
  pr.dout = {1.0f, 1.0f};
  const std::vector<float> out = forward_f32(pr);
  EXPECT_NEAR(out[0], 4.0f, 1e-6f);
  EXPECT_EQ(out[1], 0.0f);

  const Grads<float> g = backward_f32(pr);
  // Batch 0, one visible key: p = 1 whatever the score, so dq_0 = dk_0 = 0
  // (ds = p (dp - delta) = 1 * (4 - 4) = 0) and dv_0 = p * dO = 1.
  EXPECT_EQ(g.dq[0], 0.0f);
  EXPECT_EQ(g.dk[0], 0.0f);
  EXPECT_NEAR(g.dv[0], 1.0f, 1e-6f);
  // The padded key of batch 0 and everything of batch 1: exactly 0, no NaN.
  EXPECT_EQ(g.dk[1], 0.0f);
  EXPECT_EQ(g.dv[1], 0.0f);
  EXPECT_EQ(g.dq[1], 0.0f);
  EXPECT_EQ(g.dk[2], 0.0f);
  EXPECT_EQ(g.dk[3], 0.0f);
  EXPECT_EQ(g.dv[2], 0.0f);
  EXPECT_EQ(g.dv[3], 0.0f);
}

TEST(AttentionReference, CausalDecodeStepSeesEveryKey) {
  // Sq = 1, Sk = 5: q_offset = 5 - 1 = 4, so query 0 sits at a = 4 and sees
  // keys 0..4 (bottom-right). q = 0 makes every score 0, p = 1/5 each:
  //   o = (1 + 2 + 3 + 4 + 5) / 5 = 3.
  // (Top-left alignment would see key 0 only and give 1.)
  AttentionParams p = one_head(1, 5);
  p.mask = MaskKind::causal;
  Problem<float> pr(p);
  pr.q = {0.0f};
  pr.k = {0.3f, -0.2f, 0.9f, 0.1f, 0.4f};
  pr.v = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f};
  EXPECT_NEAR(forward_f32(pr)[0], 3.0f, 1e-6f);
}

TEST(AttentionReference, CausalSquare) {
  // Sq = Sk = 3, q_i = 1, k = (0, ln 2, ln 3): exp(s_ij) = (1, 2, 3) for
  // the keys j <= i. v = (6, 12, 18).
  //   o_0 = 6
  //   o_1 = (1*6 + 2*12) / (1 + 2)         = 30 / 3 = 10
  //   o_2 = (1*6 + 2*12 + 3*18) / (1+2+3)  = 84 / 6 = 14
  AttentionParams p = one_head(3, 3);
  p.mask = MaskKind::causal;
  Problem<float> pr(p);
  pr.q = {1.0f, 1.0f, 1.0f};
  pr.k = {0.0f, static_cast<float>(kLn2), static_cast<float>(kLn3)};
  pr.v = {6.0f, 12.0f, 18.0f};
  const std::vector<float> out = forward_f32(pr);
  EXPECT_NEAR(out[0], 6.0f, 1e-5f);
  EXPECT_NEAR(out[1], 10.0f, 1e-5f);
  EXPECT_NEAR(out[2], 14.0f, 1e-5f);
}

TEST(AttentionReference, CausalWithMoreQueriesThanKeys) {
  // Sq = 3, Sk = 2: q_offset = max(2 - 3, 0) = 0, so query i sees j <= i.
  // Same k = (0, ln 2), v = (6, 12) as above:
  //   o_0 = 6, o_1 = o_2 = (6 + 24) / 3 = 10.
  AttentionParams p = one_head(3, 2);
  p.mask = MaskKind::causal;
  Problem<float> pr(p);
  pr.q = {1.0f, 1.0f, 1.0f};
  pr.k = {0.0f, static_cast<float>(kLn2)};
  pr.v = {6.0f, 12.0f};
  const std::vector<float> out = forward_f32(pr);
  EXPECT_NEAR(out[0], 6.0f, 1e-5f);
  EXPECT_NEAR(out[1], 10.0f, 1e-5f);
  EXPECT_NEAR(out[2], 10.0f, 1e-5f);
}

TEST(AttentionReference, SlidingWindowZeroSeesOnlyItself) {
  // w = 0: a - 0 <= j <= a, so query i sees key i alone: o_i = v_i.
  AttentionParams p = one_head(3, 3);
  p.mask = MaskKind::sliding_window;
  p.window = 0;
  Problem<float> pr(p);
  pr.q = {1.0f, -2.0f, 0.5f};
  pr.k = {0.0f, static_cast<float>(kLn2), static_cast<float>(kLn3)};
  pr.v = {6.0f, 12.0f, 18.0f};
  const std::vector<float> out = forward_f32(pr);
  EXPECT_NEAR(out[0], 6.0f, 1e-6f);
  EXPECT_NEAR(out[1], 12.0f, 1e-6f);
  EXPECT_NEAR(out[2], 18.0f, 1e-6f);
}

TEST(AttentionReference, SlidingWindowOne) {
  // w = 1: query i sees keys i-1 and i. q_i = 1, k = (0, ln 2, ln 3),
  // exp(s) = (1, 2, 3), v = (6, 12, 18):
  //   o_0 = 6
  //   o_1 = (1*6 + 2*12) / 3  = 10
  //   o_2 = (2*12 + 3*18) / 5 = 78 / 5 = 15.6   (key 0 is out of the window)
  AttentionParams p = one_head(3, 3);
  p.mask = MaskKind::sliding_window;
  p.window = 1;
  Problem<float> pr(p);
  pr.q = {1.0f, 1.0f, 1.0f};
  pr.k = {0.0f, static_cast<float>(kLn2), static_cast<float>(kLn3)};
  pr.v = {6.0f, 12.0f, 18.0f};
  const std::vector<float> out = forward_f32(pr);
  EXPECT_NEAR(out[0], 6.0f, 1e-5f);
  EXPECT_NEAR(out[1], 10.0f, 1e-5f);
  EXPECT_NEAR(out[2], 15.6f, 1e-5f);
}

TEST(AttentionReference, SlidingWindowIsBottomRightAligned) {
  // Sq = 1, Sk = 4, w = 1: a = q_offset + 0 = 3, keys 2 and 3 are visible.
  // k = (0, 0, ln 2, ln 3), q = 1: exp(s_2), exp(s_3) = 2, 3.
  // v = (100, 100, 12, 18): o = (2*12 + 3*18) / 5 = 15.6.
  AttentionParams p = one_head(1, 4);
  p.mask = MaskKind::sliding_window;
  p.window = 1;
  Problem<float> pr(p);
  pr.q = {1.0f};
  pr.k = {0.0f, 0.0f, static_cast<float>(kLn2), static_cast<float>(kLn3)};
  pr.v = {100.0f, 100.0f, 12.0f, 18.0f};
  EXPECT_NEAR(forward_f32(pr)[0], 15.6f, 1e-5f);
}

TEST(AttentionReference, GroupedQueryHeadsReadContiguousGroups) {
  // H = 4, Hkv = 2: heads 0, 1 read kv head 0, heads 2, 3 read kv head 1
  // (h / (H/Hkv), never h mod Hkv). Sq = 1, Sk = 2, D = 1, every q = 1.
  //   kv 0: k = (0, ln 3), v = (4, 8): p = (1/4, 3/4), o = 1 + 6 = 7
  //   kv 1: k = (ln 3, 0), v = (4, 8): p = (3/4, 1/4), o = 3 + 2 = 5
  // Expected o = (7, 7, 5, 5); h mod 2 would give (7, 5, 7, 5).
  AttentionParams p = one_head(1, 2);
  p.H = 4;
  p.Hkv = 2;
  Problem<float> pr(p);
  const float l3 = static_cast<float>(kLn3);
  for (std::int64_t h = 0; h < 4; ++h) at(pr.q, pr.plan.q, 0, 0, h, 0) = 1.0f;
  at(pr.k, pr.plan.k, 0, 0, 0, 0) = 0.0f;
  at(pr.k, pr.plan.k, 0, 1, 0, 0) = l3;
  at(pr.k, pr.plan.k, 0, 0, 1, 0) = l3;
  at(pr.k, pr.plan.k, 0, 1, 1, 0) = 0.0f;
  for (std::int64_t g = 0; g < 2; ++g) {
    at(pr.v, pr.plan.v, 0, 0, g, 0) = 4.0f;
    at(pr.v, pr.plan.v, 0, 1, g, 0) = 8.0f;
  }
  std::vector<float> out = forward_f32(pr);
  const float expected[4] = {7.0f, 7.0f, 5.0f, 5.0f};
  for (std::int64_t h = 0; h < 4; ++h) {
    EXPECT_NEAR(at(out, pr.plan.o, 0, 0, h, 0), expected[h], 1e-5f) << "head " << h;
  }
}

TEST(AttentionReference, BiasBroadcastOverBatchAndHeads) {
  // B = 2, H = 2, Sq = 1, Sk = 2, D = 1, q = 0: every dot product is 0, so
  // p = softmax(bias). v = (4, 8) for both kv heads.
  //   bias (0, ln 3)  -> p = (1/4, 3/4) -> o = 7
  //   bias (ln 3, 0)  -> p = (3/4, 1/4) -> o = 5
  //   bias (0, 0)     -> p = (1/2, 1/2) -> o = 6
  //   bias (-inf, 0)  -> key 0 hidden   -> o = 8
  AttentionParams p = one_head(1, 2);
  p.B = 2;
  p.H = 2;
  p.mask = MaskKind::bias;
  const float l3 = static_cast<float>(kLn3);
  const auto set_v = [](Problem<float>& pr) {
    for (std::int64_t b = 0; b < 2; ++b) {
      for (std::int64_t g = 0; g < 2; ++g) {
        at(pr.v, pr.plan.v, b, 0, g, 0) = 4.0f;
        at(pr.v, pr.plan.v, b, 1, g, 0) = 8.0f;
      }
    }
  };
  {
    // [1, 1, Sq, Sk]: one bias row for every (b, h): o = 7 everywhere.
    Problem<float> pr(p);
    ASSERT_EQ(pr.mask.size(), 2u);
    pr.mask = {0.0f, l3};
    set_v(pr);
    for (float o : forward_f32(pr)) EXPECT_NEAR(o, 7.0f, 1e-5f);
  }
  {
    // [B, H, Sq, Sk]: a row per (b, h).
    AttentionParams full = p;
    full.bias_batch = 2;
    full.bias_heads = 2;
    Problem<float> pr(full);
    ASSERT_EQ(pr.mask.size(), 8u);
    pr.mask = {0.0f, l3, l3, 0.0f, 0.0f, 0.0f, -kInf, 0.0f};
    set_v(pr);
    std::vector<float> out = forward_f32(pr);
    EXPECT_NEAR(at(out, pr.plan.o, 0, 0, 0, 0), 7.0f, 1e-5f);
    EXPECT_NEAR(at(out, pr.plan.o, 0, 0, 1, 0), 5.0f, 1e-5f);
    EXPECT_NEAR(at(out, pr.plan.o, 1, 0, 0, 0), 6.0f, 1e-5f);
    EXPECT_NEAR(at(out, pr.plan.o, 1, 0, 1, 0), 8.0f, 1e-5f);
  }
  {
    // [B, 1, Sq, Sk]: batch 0 (0, ln 3) -> 7, batch 1 (ln 3, 0) -> 5, both heads.
    AttentionParams per_batch = p;
    per_batch.bias_batch = 2;
    Problem<float> pr(per_batch);
    ASSERT_EQ(pr.mask.size(), 4u);
    pr.mask = {0.0f, l3, l3, 0.0f};
    set_v(pr);
    std::vector<float> out = forward_f32(pr);
    for (std::int64_t h = 0; h < 2; ++h) {
      EXPECT_NEAR(at(out, pr.plan.o, 0, 0, h, 0), 7.0f, 1e-5f);
      EXPECT_NEAR(at(out, pr.plan.o, 1, 0, h, 0), 5.0f, 1e-5f);
    }
  }
}

TEST(AttentionReference, MinusInfinityBiasHidesAKey) {
  // Sk = 3, q = 1, k = (0, 0, 0), bias = (0, -inf, ln 3): key 1 is hidden,
  // even though its value is NaN; p = (1/4, -, 3/4). v = (4, NaN, 8): o = 7.
  // A row whose bias is all -inf sees no key: o = 0.
  AttentionParams p = one_head(2, 3);
  p.mask = MaskKind::bias;
  Problem<float> pr(p);
  pr.q = {1.0f, 1.0f};
  pr.mask = {0.0f, -kInf, static_cast<float>(kLn3), -kInf, -kInf, -kInf};
  pr.v = {4.0f, kNaN, 8.0f};
  pr.dout = {1.0f, 1.0f};
  const std::vector<float> out = forward_f32(pr);
  EXPECT_NEAR(out[0], 7.0f, 1e-5f);
  EXPECT_EQ(out[1], 0.0f);
  // dv = sum_i p_ij dO_i: (1/4, 0, 3/4) from query 0, nothing from query 1.
  const Grads<float> g = backward_f32(pr);
  EXPECT_NEAR(g.dv[0], 0.25f, 1e-6f);
  EXPECT_EQ(g.dv[1], 0.0f);
  EXPECT_NEAR(g.dv[2], 0.75f, 1e-6f);
  EXPECT_EQ(g.dq[1], 0.0f);
}

// The same logical problem in bshd and bhsd, with the bhsd tensors filled
// element by element through the plans' strides.
TEST(AttentionReference, LayoutsGiveTheSameNumbers) {
  AttentionParams p;
  p.B = 2;
  p.Sq = 3;
  p.Sk = 4;
  p.H = 4;
  p.Hkv = 2;
  p.D = 3;
  p.Dv = 2;
  p.mask = MaskKind::causal;
  p.softcap = 1.5;
  Problem<double> a(p);
  fill(a, 11);
  AttentionParams pb = p;
  pb.layout = Layout::bhsd;
  Problem<double> b(pb);
  const auto copy = [](const std::vector<double>& from, const Strides& sf, std::vector<double>& to,
                       const Strides& st, std::int64_t B, std::int64_t S, std::int64_t heads,
                       std::int64_t width) {
    for (std::int64_t bi = 0; bi < B; ++bi)
      for (std::int64_t s = 0; s < S; ++s)
        for (std::int64_t h = 0; h < heads; ++h)
          for (std::int64_t d = 0; d < width; ++d)
            to[st.at(bi, s, h) + d] = from[sf.at(bi, s, h) + d];
  };
  const AttentionPlan& P = a.plan;
  copy(a.q, P.q, b.q, b.plan.q, P.B, P.Sq, P.H, P.D);
  copy(a.k, P.k, b.k, b.plan.k, P.B, P.Sk, P.Hkv, P.D);
  copy(a.v, P.v, b.v, b.plan.v, P.B, P.Sk, P.Hkv, P.Dv);
  copy(a.dout, P.o, b.dout, b.plan.o, P.B, P.Sq, P.H, P.Dv);
  ASSERT_NE(P.q.seq, b.plan.q.seq);  // the layouts really differ

  const std::vector<double> oa = forward(a), ob = forward(b);
  const Grads<double> ga = backward(a), gb = backward(b);
  const auto expect_same = [](const std::vector<double>& x, const Strides& sx,
                              const std::vector<double>& y, const Strides& sy, std::int64_t B,
                              std::int64_t S, std::int64_t heads, std::int64_t width,
                              const char* what) {
    for (std::int64_t bi = 0; bi < B; ++bi)
      for (std::int64_t s = 0; s < S; ++s)
        for (std::int64_t h = 0; h < heads; ++h)
          for (std::int64_t d = 0; d < width; ++d)
            EXPECT_NEAR(x[sx.at(bi, s, h) + d], y[sy.at(bi, s, h) + d], 1e-14)
                << what << " at " << bi << "," << s << "," << h << "," << d;
  };
  expect_same(oa, P.o, ob, b.plan.o, P.B, P.Sq, P.H, P.Dv, "out");
  expect_same(ga.dq, P.dq, gb.dq, b.plan.dq, P.B, P.Sq, P.H, P.D, "dq");
  expect_same(ga.dk, P.dk, gb.dk, b.plan.dk, P.B, P.Sk, P.Hkv, P.D, "dk");
  expect_same(ga.dv, P.dv, gb.dv, b.plan.dv, P.B, P.Sk, P.Hkv, P.Dv, "dv");
}

// q, k, v read out of wider rows (as from a fused QKV projection) whose
// gaps hold NaN: nothing in a gap is ever read, so the numbers equal the
// contiguous ones exactly.
TEST(AttentionReference, RowStridesSkipJunkInTheGaps) {
  AttentionParams p;
  p.B = 2;
  p.Sq = 3;
  p.Sk = 5;
  p.H = 2;
  p.Hkv = 1;
  p.D = 2;
  p.Dv = 3;
  p.mask = MaskKind::key_padding;
  Problem<double> dense(p);
  fill(dense, 21);
  AttentionParams ps = p;
  ps.q_row_stride = 2 * 2 + 3;
  ps.k_row_stride = 1 * 2 + 1;
  ps.v_row_stride = 1 * 3 + 4;
  Problem<float> strided(ps);
  for (float& x : strided.q) x = kNaN;
  for (float& x : strided.k) x = kNaN;
  for (float& x : strided.v) x = kNaN;
  const AttentionPlan& P = dense.plan;
  for (std::int64_t b = 0; b < P.B; ++b) {
    for (std::int64_t s = 0; s < P.Sq; ++s)
      for (std::int64_t h = 0; h < P.H; ++h)
        for (std::int64_t d = 0; d < P.D; ++d)
          at(strided.q, strided.plan.q, b, s, h, d) =
              static_cast<float>(at(dense.q, P.q, b, s, h, d));
    for (std::int64_t s = 0; s < P.Sk; ++s)
      for (std::int64_t g = 0; g < P.Hkv; ++g) {
        for (std::int64_t d = 0; d < P.D; ++d)
          at(strided.k, strided.plan.k, b, s, g, d) =
              static_cast<float>(at(dense.k, P.k, b, s, g, d));
        for (std::int64_t d = 0; d < P.Dv; ++d)
          at(strided.v, strided.plan.v, b, s, g, d) =
              static_cast<float>(at(dense.v, P.v, b, s, g, d));
      }
  }
  for (std::size_t n = 0; n < dense.dout.size(); ++n)
    strided.dout[n] = static_cast<float>(dense.dout[n]);
  strided.mask = dense.mask;
  ASSERT_GT(strided.q.size(), dense.q.size());

  const Problem<float> contiguous = convert<float>(dense, p);
  EXPECT_EQ(forward_f32(strided), forward_f32(contiguous));
  const Grads<float> gs = backward_f32(strided), gc = backward_f32(contiguous);
  EXPECT_EQ(gs.dq, gc.dq);
  EXPECT_EQ(gs.dk, gc.dk);
  EXPECT_EQ(gs.dv, gc.dv);
  for (float x : gs.dq) EXPECT_TRUE(std::isfinite(x));
}

TEST(AttentionReference, NonFiniteInputsAreDataNotErrors) {
  // A NaN in q_0 makes row 0 NaN (IEEE), and nothing else: query 1 reads
  // q_1 only. Sq = 2, Sk = 2, D = 1, k = (0, ln 3), v = (4, 8), q_1 = 1: o_1 = 7.
  Problem<float> pr(one_head(2, 2));
  pr.q = {kNaN, 1.0f};
  pr.k = {0.0f, static_cast<float>(kLn3)};
  pr.v = {4.0f, 8.0f};
  const std::vector<float> out = forward_f32(pr);
  EXPECT_TRUE(std::isnan(out[0]));
  EXPECT_NEAR(out[1], 7.0f, 1e-5f);
}

// ---------------------------------------------------------------------------
// Backward

TEST(AttentionReference, BackwardByHand) {
  // Sq = 1, Sk = 2, D = 1 (scale 1). q = 1, k = (0, ln 3), v = (4, 8), dO = 1.
  //   p = (1/4, 3/4), o = 7
  //   dp_j    = dO * v_j            = (4, 8)
  //   delta   = dO * o              = 7
  //   ds_j    = p_j (dp_j - delta)  = (1/4 * -3, 3/4 * 1) = (-3/4, 3/4)
  //   dq      = sum_j ds_j k_j      = 3/4 ln 3
  //   dk_j    = ds_j q              = (-3/4, 3/4)
  //   dv_j    = p_j dO              = (1/4, 3/4)
  Problem<float> pr(one_head(1, 2));
  pr.q = {1.0f};
  pr.k = {0.0f, static_cast<float>(kLn3)};
  pr.v = {4.0f, 8.0f};
  pr.dout = {1.0f};
  const Grads<float> g = backward_f32(pr);
  EXPECT_NEAR(g.dq[0], 0.75 * kLn3, 1e-6);
  EXPECT_NEAR(g.dk[0], -0.75f, 1e-6f);
  EXPECT_NEAR(g.dk[1], 0.75f, 1e-6f);
  EXPECT_NEAR(g.dv[0], 0.25f, 1e-6f);
  EXPECT_NEAR(g.dv[1], 0.75f, 1e-6f);
}

TEST(AttentionReference, BackwardComputesAnySubsetOfTheGradients) {
  // Each non-empty subset of {dq, dk, dv} gives exactly the gradients of the
  // full call; the views not asked for stay untouched.
  AttentionParams p = one_head(3, 4, 2);
  p.H = 2;
  p.Hkv = 1;
  p.mask = MaskKind::causal;
  Problem<double> pr(p);
  fill(pr, 17);
  const Grads<double> all = backward(pr);
  for (int which = 1; which < 8; ++which) {
    SCOPED_TRACE("subset " + std::to_string(which));
    Grads<double> g{std::vector<double>(all.dq.size(), 7.0),
                    std::vector<double>(all.dk.size(), 7.0),
                    std::vector<double>(all.dv.size(), 7.0)};
    AttentionGrads<double> views;
    if (which & 1) views.dq = g.dq;
    if (which & 2) views.dk = g.dk;
    if (which & 4) views.dv = g.dv;
    tandem::reference::attention_backward<double>(pr.plan, pr.inputs(), pr.dout, views);
    EXPECT_EQ(g.dq, (which & 1) ? all.dq : std::vector<double>(all.dq.size(), 7.0));
    EXPECT_EQ(g.dk, (which & 2) ? all.dk : std::vector<double>(all.dk.size(), 7.0));
    EXPECT_EQ(g.dv, (which & 4) ? all.dv : std::vector<double>(all.dv.size(), 7.0));
  }
}

TEST(AttentionReference, SavedLogSumExpAndBackwardFromIt) {
  // The problem of BackwardByHand: s = (0, ln 3), so lse = log(1 + 3) = ln 4,
  // p_j = exp(s_j - lse) = (1/4, 3/4). Batch 1 has its keys padded: lse = -inf.
  AttentionParams p = one_head(1, 2);
  p.B = 2;
  p.mask = MaskKind::key_padding;
  Problem<float> pr(p);
  pr.mask = {1.0f, 1.0f, 0.0f, 0.0f};
  pr.q = {1.0f, 1.0f};
  pr.k = {0.0f, static_cast<float>(kLn3), 0.0f, 0.0f};
  pr.v = {4.0f, 8.0f, 1.0f, 1.0f};
  pr.dout = {1.0f, 1.0f};
  const tandem::Backend ref = tandem::reference::backend();
  std::vector<float> out(2), lse(2);
  ref.attention_forward_lse(pr.plan, pr.inputs(), out, lse);
  EXPECT_NEAR(out[0], 7.0f, 1e-5f);
  EXPECT_NEAR(lse[0], std::log(4.0), 1e-6);
  EXPECT_EQ(out[1], 0.0f);
  EXPECT_EQ(lse[1], -kInf);
  // From the saved state: the numbers of BackwardByHand, zeros for batch 1.
  Grads<float> g{std::vector<float>(2), std::vector<float>(4), std::vector<float>(4)};
  ref.attention_backward_saved(pr.plan, pr.inputs(), {out, lse}, pr.dout, {g.dq, g.dk, g.dv});
  EXPECT_NEAR(g.dq[0], 0.75 * kLn3, 1e-6);
  EXPECT_NEAR(g.dk[0], -0.75f, 1e-6f);
  EXPECT_NEAR(g.dk[1], 0.75f, 1e-6f);
  EXPECT_NEAR(g.dv[0], 0.25f, 1e-6f);
  EXPECT_NEAR(g.dv[1], 0.75f, 1e-6f);
  EXPECT_EQ(g.dq[1], 0.0f);
  for (int j = 2; j < 4; ++j) EXPECT_EQ(g.dk[j] + g.dv[j], 0.0f);
  // The saved state is what the backward uses: a lse off by ln 2 halves p,
  // hence dv (dv_j = p_j dO).
  std::vector<float> lse_off = lse;
  lse_off[0] += static_cast<float>(std::log(2.0));
  ref.attention_backward_saved(pr.plan, pr.inputs(), {out, lse_off}, pr.dout, {g.dq, g.dk, g.dv});
  EXPECT_NEAR(g.dv[0], 0.125f, 1e-6f);
  EXPECT_NEAR(g.dv[1], 0.375f, 1e-6f);
  // A saved state of the wrong size is an error, and nothing is written.
  std::fill(g.dq.begin(), g.dq.end(), 5.0f);
  try {
    ref.attention_backward_saved(pr.plan, pr.inputs(), {out, std::span<const float>(lse).first(1)},
                                 pr.dout, {g.dq, g.dk, g.dv});
    ADD_FAILURE() << "no error for a short lse";
  } catch (const tandem::Error& e) {
    EXPECT_EQ(e.parameter(), "lse.size()") << e.what();
  }
  EXPECT_EQ(g.dq[0], 5.0f);
}

TEST(AttentionReference, BackwardByHandWithSoftcapAndScale) {
  // D = 1, scale = 2, softcap c = 2. q = 1/2, k = (0, ln 3), v = (0, 1), dO = 1.
  //   x = scale * q * k = (0, ln 3), x / c = (0, ln(3)/2) = (0, atanh(1/2))
  //   s = c tanh(x / c) = (0, 1), p = (1, e)/(1 + e) =: (1 - σ, σ), o = σ
  //   dp = (0, 1), delta = σ
  //   ds = (p_0 (0 - σ), p_1 (1 - σ)) = (-σ(1-σ), σ(1-σ))
  //   dx = ds * (1 - tanh²(x/c)) = ds * (1, 1 - 1/4) = (-σ(1-σ), 3/4 σ(1-σ))
  //   dq   = scale * sum_j dx_j k_j = 2 * 3/4 σ(1-σ) ln 3
  //   dk_j = scale * dx_j q         = dx_j
  //   dv_j = p_j dO                 = (1 - σ, σ)
  AttentionParams p = one_head(1, 2);
  p.scale = 2.0;
  p.softcap = 2.0;
  Problem<float> pr(p);
  pr.q = {0.5f};
  pr.k = {0.0f, static_cast<float>(kLn3)};
  pr.v = {0.0f, 1.0f};
  pr.dout = {1.0f};
  const double sigma = kE / (1.0 + kE);
  const double w = sigma * (1.0 - sigma);
  EXPECT_NEAR(forward_f32(pr)[0], sigma, 1e-6);
  const Grads<float> g = backward_f32(pr);
  EXPECT_NEAR(g.dq[0], 2.0 * 0.75 * w * kLn3, 1e-6);
  EXPECT_NEAR(g.dk[0], -w, 1e-6);
  EXPECT_NEAR(g.dk[1], 0.75 * w, 1e-6);
  EXPECT_NEAR(g.dv[0], 1.0 - sigma, 1e-6);
  EXPECT_NEAR(g.dv[1], sigma, 1e-6);
}

TEST(AttentionReference, GroupedQueryHeadsSumIntoTheirKvHead) {
  // H = 2, Hkv = 1, Sq = 1, Sk = 1: one key, so p = 1 for both heads and
  // dv = sum over the two heads of p * dO_h = 2 + 3 = 5.
  AttentionParams p = one_head(1, 1);
  p.H = 2;
  p.Hkv = 1;
  Problem<float> pr(p);
  pr.q = {0.3f, -0.7f};
  pr.k = {1.1f};
  pr.v = {2.0f};
  pr.dout = {2.0f, 3.0f};
  EXPECT_NEAR(backward_f32(pr).dv[0], 5.0f, 1e-6f);
}

// The configurations the derivative checks below run on.
std::vector<AttentionParams> derivative_configs() {
  std::vector<AttentionParams> all;
  {
    // GQA, causal with Sk > Sq, softcap, bshd.
    AttentionParams p;
    p.B = 2;
    p.Sq = 3;
    p.Sk = 5;
    p.H = 4;
    p.Hkv = 2;
    p.D = 3;
    p.mask = MaskKind::causal;
    p.softcap = 0.8;
    all.push_back(p);
  }
  {
    // Bias [1, H, Sq, Sk] with some -inf, Dv != D, custom scale, bhsd, MQA.
    AttentionParams p;
    p.Sq = 4;
    p.Sk = 3;
    p.H = 2;
    p.Hkv = 1;
    p.D = 2;
    p.Dv = 3;
    p.layout = Layout::bhsd;
    p.mask = MaskKind::bias;
    p.bias_heads = 2;
    p.scale = 0.9;
    all.push_back(p);
  }
  {
    // Sliding window, key padding is covered by the strided test; here a
    // window with row strides and a softcap.
    AttentionParams p;
    p.Sq = 4;
    p.Sk = 6;
    p.H = 2;
    p.D = 2;
    p.mask = MaskKind::sliding_window;
    p.window = 2;
    p.softcap = 1.2;
    p.q_row_stride = 6;
    p.k_row_stride = 5;
    all.push_back(p);
  }
  {
    // Key padding with a fully padded batch row, Dv != D.
    AttentionParams p;
    p.B = 2;
    p.Sq = 2;
    p.Sk = 4;
    p.H = 1;
    p.D = 3;
    p.Dv = 2;
    p.mask = MaskKind::key_padding;
    all.push_back(p);
  }
  return all;
}

// L = <dO, attention(q, k, v)>.
template <class T>
T loss(const Problem<T>& pr) {
  const std::vector<T> out = forward(pr);
  T sum = T(0);
  for (std::size_t n = 0; n < out.size(); ++n) sum += pr.dout[n] * out[n];
  return sum;
}

// Calls f(index in the input, index in its gradient) for every element of
// one input tensor.
template <class F>
void each_element(const AttentionPlan& P, char which, F f) {
  const bool is_q = which == 'q';
  const std::int64_t S = is_q ? P.Sq : P.Sk;
  const std::int64_t heads = is_q ? P.H : P.Hkv;
  const std::int64_t width = which == 'v' ? P.Dv : P.D;
  const Strides& in = which == 'q' ? P.q : which == 'k' ? P.k : P.v;
  const Strides& grad = which == 'q' ? P.dq : which == 'k' ? P.dk : P.dv;
  for (std::int64_t b = 0; b < P.B; ++b)
    for (std::int64_t s = 0; s < S; ++s)
      for (std::int64_t h = 0; h < heads; ++h)
        for (std::int64_t d = 0; d < width; ++d) f(in.at(b, s, h) + d, grad.at(b, s, h) + d);
}

TEST(AttentionReference, BackwardMatchesFiniteDifferencesInDouble) {
  std::uint64_t seed = 100;
  for (const AttentionParams& p : derivative_configs()) {
    Problem<double> pr(p);
    fill(pr, seed += 10);
    const Grads<double> g = backward(pr);
    const double eps = 1e-6;
    for (char which : {'q', 'k', 'v'}) {
      std::vector<double>& x = which == 'q' ? pr.q : which == 'k' ? pr.k : pr.v;
      const std::vector<double>& dx = which == 'q' ? g.dq : which == 'k' ? g.dk : g.dv;
      each_element(pr.plan, which, [&](std::int64_t n, std::int64_t m) {
        const double x0 = x[n];
        x[n] = x0 + eps;
        const double up = loss(pr);
        x[n] = x0 - eps;
        const double down = loss(pr);
        x[n] = x0;
        // central difference: error O(eps²) plus rounding O(1e-16 / eps)
        EXPECT_NEAR(dx[m], (up - down) / (2 * eps), 1e-8)
            << which << "[" << n << "] for " << pr.plan.describe();
      });
    }
  }
}

TEST(AttentionReference, SingleGradientsEqualTheOnePassBackward) {
  std::uint64_t seed = 300;
  for (const AttentionParams& p : derivative_configs()) {
    Problem<double> pd(p);
    fill(pd, seed += 10);
    const Problem<float> pr = convert<float>(pd, p);
    const Grads<float> all = backward_f32(pr);
    std::vector<float> dq(all.dq.size(), kNaN), dk(all.dk.size(), kNaN), dv(all.dv.size(), kNaN);
    const tandem::Backend ref = tandem::reference::backend();
    ref.attention_backward_dq(pr.plan, pr.inputs(), pr.dout, dq);
    ref.attention_backward_dk(pr.plan, pr.inputs(), pr.dout, dk);
    ref.attention_backward_dv(pr.plan, pr.inputs(), pr.dout, dv);
    EXPECT_EQ(dq, all.dq) << pr.plan.describe();
    EXPECT_EQ(dk, all.dk) << pr.plan.describe();
    EXPECT_EQ(dv, all.dv) << pr.plan.describe();
  }
}

TEST(AttentionReference, FloatReferenceAgreesWithDouble) {
  std::uint64_t seed = 500;
  for (const AttentionParams& p : derivative_configs()) {
    Problem<double> pd(p);
    fill(pd, seed += 10);
    const Problem<float> pf = convert<float>(pd, p);
    const std::vector<double> od = forward(pd);
    const std::vector<float> of = forward_f32(pf);
    // inputs rounded to float (rel. 6e-8) and one final rounding: well
    // within 1e-5 for values of order 1
    for (std::size_t n = 0; n < od.size(); ++n) EXPECT_NEAR(of[n], od[n], 1e-5);
    const Grads<double> gd = backward(pd);
    const Grads<float> gf = backward_f32(pf);
    for (std::size_t n = 0; n < gd.dq.size(); ++n) EXPECT_NEAR(gf.dq[n], gd.dq[n], 1e-5);
    for (std::size_t n = 0; n < gd.dk.size(); ++n) EXPECT_NEAR(gf.dk[n], gd.dk[n], 1e-5);
    for (std::size_t n = 0; n < gd.dv.size(); ++n) EXPECT_NEAR(gf.dv[n], gd.dv[n], 1e-5);
  }
}

// Complex step: for L analytic, Im L(x + i·h·u) / h = <dL/dx, u> up to
// O(h²) — with h = 1e-20 that is exact to rounding, no cancellation.
TEST(AttentionReference, ComplexStepEqualsTheBackward) {
  using C = std::complex<double>;
  std::uint64_t seed = 700;
  for (const AttentionParams& p : derivative_configs()) {
    Problem<double> pd(p);
    fill(pd, seed += 10);
    const Grads<double> g = backward(pd);
    for (char which : {'q', 'k', 'v'}) {
      Problem<C> pc = convert<C>(pd, p);
      std::vector<C>& x = which == 'q' ? pc.q : which == 'k' ? pc.k : pc.v;
      const std::vector<double>& dx = which == 'q' ? g.dq : which == 'k' ? g.dk : g.dv;
      const double h = 1e-20;
      double expected = 0.0;  // <dL/dx, u>
      std::uint64_t n_u = 0;
      each_element(pd.plan, which, [&](std::int64_t n, std::int64_t m) {
        const double u = noise(seed + 5, n_u++);
        x[n] += C(0.0, h * u);
        expected += dx[m] * u;
      });
      const double got = loss(pc).imag() / h;
      EXPECT_NEAR(got, expected, 1e-12 * (1.0 + std::abs(expected)))
          << which << " for " << pd.plan.describe();
    }
  }
}

TEST(AttentionReference, SinglePrecisionAccumulatorIsCloseToDouble) {
  // reference<float, float> (sums in float) is the single-precision
  // baseline; on small problems it stays within 1e-5 of the double sums.
  std::uint64_t seed = 900;
  for (const AttentionParams& p : {derivative_configs()[0], derivative_configs()[1]}) {
    Problem<double> pd(p);
    fill(pd, seed += 10);
    const Problem<float> pf = convert<float>(pd, p);
    std::vector<float> out(pf.plan.o.extent);
    tandem::reference::attention_forward<float, float>(pf.plan, pf.inputs(), out);
    const std::vector<double> od = forward(pd);
    for (std::size_t n = 0; n < od.size(); ++n) EXPECT_NEAR(out[n], od[n], 1e-5);
    Grads<float> g{std::vector<float>(pf.plan.dq.extent), std::vector<float>(pf.plan.dk.extent),
                   std::vector<float>(pf.plan.dv.extent)};
    tandem::reference::attention_backward<float, float>(pf.plan, pf.inputs(), pf.dout,
                                                        AttentionGrads<float>{g.dq, g.dk, g.dv});
    const Grads<double> gd = backward(pd);
    for (std::size_t n = 0; n < gd.dk.size(); ++n) EXPECT_NEAR(g.dk[n], gd.dk[n], 1e-5);
  }
}

}  // namespace
