// SPDX-License-Identifier: Apache-2.0
// The optimized attention forward and backward against the reference backend
// on every Highway target this CPU runs (scalar fallback included): bshd,
// bhsd and row-strided (fused QKV) inputs, Sq < Sk, Sq > Sk, Sq = 1, MHA, GQA
// and MQA, Dv != D, odd sizes and sizes around the lane counts and block
// sizes, every mask kind (window 0 and window >= Sk, fully masked rows, bias
// broadcast), scale and softcap. Threads 1, 2 and 3 must give bitwise
// identical results, nothing may be written past an output, the elements
// between strided rows must never be read (they hold NaN), and a row with no
// visible key must give 0 (and log-sum-exp −inf), never NaN, and NaN or inf
// in k or v of a hidden key (causal, sliding window, bias, key padding) must
// not reach the rows or gradients it is hidden from.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "support/tandem_test_support.hpp"
#include "tandem/reference/backend.hpp"
#include "tandem/tandem.hpp"

#ifdef TANDEM_HAVE_OPTIMIZED
#include "tandem/optimized/backend.hpp"

namespace {

namespace opt = tandem::optimized;
namespace test = tandem::test;
using tandem::AttentionGrads;
using tandem::AttentionInputs;
using tandem::AttentionParams;
using tandem::AttentionPlan;
using tandem::Layout;
using tandem::MaskKind;
using test::bitwise_equal;
using test::close;
using test::Guarded;
using Vec = std::vector<float>;

constexpr float kInf = std::numeric_limits<float>::infinity();

/// A strided tensor: the elements the plan places get values in [-2, 2],
/// every other element of the view (gaps between strided rows) is NaN, so a
/// kernel that reads them poisons its output.
Vec strided_tensor(const tandem::Strides& st, std::int64_t B, std::int64_t S, std::int64_t heads,
                   std::int64_t width, std::mt19937& gen) {
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  Vec v(static_cast<std::size_t>(st.extent), std::numeric_limits<float>::quiet_NaN());
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t s = 0; s < S; ++s)
      for (std::int64_t h = 0; h < heads; ++h)
        for (std::int64_t x = 0; x < width; ++x)
          v[static_cast<std::size_t>(st.at(b, s, h) + x)] = dist(gen);
  return v;
}

/// log Σ_{visible j} exp(s_ij) in double, straight from SPEC §2 (−inf for a
/// row with no visible key): checks the lse output of attention_forward.
std::vector<double> naive_lse(const AttentionPlan& p, const AttentionInputs<float>& in) {
  std::vector<double> lse(static_cast<std::size_t>(p.B * p.H * p.Sq));
  const std::int64_t off = p.q_offset();
  for (std::int64_t b = 0; b < p.B; ++b)
    for (std::int64_t h = 0; h < p.H; ++h)
      for (std::int64_t i = 0; i < p.Sq; ++i) {
        std::vector<double> s;
        for (std::int64_t j = 0; j < p.Sk; ++j) {
          const std::int64_t a = off + i;
          if (p.mask == MaskKind::causal && j > a) continue;
          if (p.mask == MaskKind::sliding_window && (j > a || j < a - p.window)) continue;
          if (p.mask == MaskKind::key_padding &&
              in.mask[static_cast<std::size_t>(p.mask_row(b, h, i) + j)] == 0.0f)
            continue;
          double x = 0;
          for (std::int64_t d = 0; d < p.D; ++d) {
            x += static_cast<double>(in.q[static_cast<std::size_t>(p.q.at(b, i, h) + d)]) *
                 in.k[static_cast<std::size_t>(p.k.at(b, j, p.kv_head(h)) + d)];
          }
          x *= p.scale;
          if (p.softcap > 0) x = p.softcap * std::tanh(x / p.softcap);
          if (p.mask == MaskKind::bias) {
            const float bias = in.mask[static_cast<std::size_t>(p.mask_row(b, h, i) + j)];
            if (bias == -kInf) continue;
            x += bias;
          }
          s.push_back(x);
        }
        double r = -std::numeric_limits<double>::infinity();
        if (!s.empty()) {
          const double m = *std::max_element(s.begin(), s.end());
          double l = 0;
          for (double x : s) l += std::exp(x - m);
          r = m + std::log(l);
        }
        lse[static_cast<std::size_t>((b * p.H + h) * p.Sq + i)] = r;
      }
  return lse;
}

struct Case {
  std::string name;
  AttentionParams params;
};

/// Failure messages show the case by name, not as bytes.
[[maybe_unused]] void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name;
}

/// attention_params, under a short name for the case tables.
constexpr auto P = [](auto... args) { return test::attention_params(args...); };

std::vector<Case> cases() {
  using enum MaskKind;
  std::vector<Case> c;
  c.push_back({"bshd_gqa_sq_lt_sk", P(2, 5, 7, 4, 2, 8)});
  c.push_back({"bhsd_mqa_sq_gt_sk_causal_dv3", P(1, 7, 5, 3, 1, 5, 3, Layout::bhsd, causal)});
  {
    AttentionParams p = P(2, 17, 17, 2, 2, 16, 0, Layout::bshd, causal);
    p.q_row_stride = 3 * 2 * 16 + 5;  // q, k, v out of one fused row
    p.k_row_stride = 3 * 2 * 16 + 5;
    p.v_row_stride = 3 * 2 * 16 + 5;
    c.push_back({"fused_row_strides_causal", p});
  }
  {
    AttentionParams p = P(1, 9, 70, 4, 2, 7, 9, Layout::bshd, none);
    p.k_row_stride = 2 * 7 + 1;
    c.push_back({"k_row_stride_only", p});
  }
  c.push_back({"decode_sq1_gqa_causal", P(1, 1, 70, 8, 2, 16, 0, Layout::bshd, causal)});
  c.push_back(
      {"decode_sq1_bhsd_window", P(2, 1, 130, 4, 4, 9, 0, Layout::bhsd, sliding_window, 40)});
  c.push_back({"window_0", P(1, 20, 20, 2, 1, 3, 0, Layout::bshd, sliding_window, 0)});
  c.push_back({"window_ge_sk", P(1, 9, 13, 2, 2, 4, 0, Layout::bhsd, sliding_window, 100)});
  c.push_back({"window_int64_max", P(1, 9, 70, 2, 1, 4, 0, Layout::bshd, sliding_window,
                                     std::numeric_limits<std::int64_t>::max())});
  c.push_back(
      {"window_5_block_crossing", P(1, 70, 150, 2, 1, 17, 0, Layout::bshd, sliding_window, 5)});
  c.push_back(
      {"window_fully_masked_rows", P(1, 10, 4, 2, 2, 5, 0, Layout::bshd, sliding_window, 2)});
  c.push_back({"causal_around_blocks", P(1, 65, 129, 2, 2, 16, 15, Layout::bhsd, causal)});
  c.push_back({"causal_sq_gt_sk", P(2, 66, 20, 3, 3, 4, 0, Layout::bshd, causal)});
  c.push_back({"key_padding", P(3, 6, 67, 2, 1, 8, 0, Layout::bshd, key_padding)});
  c.push_back({"bias_broadcast_both", P(2, 5, 9, 4, 2, 6, 0, Layout::bhsd, bias)});
  {
    AttentionParams p = P(2, 5, 9, 4, 2, 6, 5, Layout::bshd, bias);
    p.bias_batch = 2;
    p.bias_heads = 4;
    c.push_back({"bias_full", p});
  }
  {
    AttentionParams p = P(2, 4, 70, 2, 2, 3, 0, Layout::bshd, bias);
    p.bias_heads = 2;
    c.push_back({"bias_heads_only", p});
  }
  {
    AttentionParams p = P(1, 65, 130, 6, 3, 33, 17, Layout::bshd, causal);
    p.scale = 0.3;
    p.softcap = 5.0;
    c.push_back({"softcap_scale_gqa", p});
  }
  {
    AttentionParams p = P(1, 12, 12, 2, 1, 16, 0, Layout::bhsd, bias);
    p.softcap = 2.0;
    c.push_back({"softcap_bias", p});
  }
  for (std::int64_t D : {1, 15, 16, 17}) {
    c.push_back({"lanes_D" + std::to_string(D), P(1, 63, 64, 1, 1, D, 0, Layout::bshd, none)});
  }
  c.push_back({"S_64_65", P(1, 64, 65, 1, 1, 8)});
  c.push_back({"wide_D260_Dv130", P(1, 5, 9, 2, 1, 260, 130)});
  c.push_back({"group16", P(1, 9, 33, 16, 1, 8, 0, Layout::bhsd, causal)});
  c.push_back({"group128", P(1, 3, 5, 128, 1, 4)});
  c.push_back({"group3_odd", P(2, 23, 31, 3, 1, 11, 0, Layout::bshd, key_padding)});
  // Few (batch, kv head) pairs: the backward splits each one's query blocks
  // into parts (7 and 3 here) whose dK/dV partials are added in order.
  c.push_back({"bwd_query_parts_gqa_causal", P(1, 300, 300, 4, 1, 16, 0, Layout::bshd, causal)});
  c.push_back(
      {"bwd_query_parts_window_dv", P(2, 200, 230, 2, 1, 8, 5, Layout::bhsd, sliding_window, 60)});
  // the last query block holds one vector of rows or less (the call stays wide)
  c.push_back({"last_block_one_vector", P(1, 385, 400, 1, 1, 16)});
  // Decode steps with long caches: the keys are split into chunks (their size
  // set by the shape: 128, 256 or 512 keys here) whose partial results are
  // merged; Sk is not a multiple of the chunk. bhsd splits only with few
  // (batch, kv head) pairs.
  c.push_back({"decode_split_gqa", P(1, 1, 1000, 32, 8, 128)});
  c.push_back({"decode_split_causal_dv", P(2, 1, 1300, 16, 4, 64, 48, Layout::bshd, causal)});
  c.push_back({"decode_split_mha_window_packed",
               P(1, 1, 1100, 2, 2, 100, 0, Layout::bhsd, sliding_window, 300)});
  c.push_back({"decode_split_key_padding", P(3, 1, 1500, 8, 4, 64, 0, Layout::bshd, key_padding)});
  {
    AttentionParams p = P(2, 1, 600, 8, 8, 64, 0, Layout::bshd, bias);
    p.bias_batch = 2;
    p.bias_heads = 8;
    p.scale = 0.2;
    p.softcap = 4.0;
    c.push_back({"decode_split_bias_softcap", p});
  }
  c.push_back({"decode_split_sq2_causal", P(1, 2, 1100, 16, 4, 64, 0, Layout::bshd, causal)});
  {
    AttentionParams p = P(1, 1, 700, 8, 8, 64);
    p.q_row_stride = 3 * 8 * 64 + 5;  // q, k, v out of one fused row
    p.k_row_stride = 3 * 8 * 64 + 5;
    p.v_row_stride = 3 * 8 * 64 + 5;
    c.push_back({"decode_split_fused_rows", p});
  }
  return c;
}

/// The inputs of one case, with the mask drawn for its kind: key_padding
/// keeps ~70% of the keys and hides every key of the last batch; bias is
/// random with ~20% −inf and one query row entirely −inf.
struct Data {
  AttentionPlan plan;
  Vec q, k, v, mask, dout;
  AttentionInputs<float> in() const { return {q, k, v, mask}; }

  explicit Data(const AttentionParams& params, std::uint32_t seed)
      : plan(AttentionPlan::make(params)) {
    std::mt19937 gen(seed);
    q = strided_tensor(plan.q, plan.B, plan.Sq, plan.H, plan.D, gen);
    k = strided_tensor(plan.k, plan.B, plan.Sk, plan.Hkv, plan.D, gen);
    v = strided_tensor(plan.v, plan.B, plan.Sk, plan.Hkv, plan.Dv, gen);
    dout = strided_tensor(plan.o, plan.B, plan.Sq, plan.H, plan.Dv, gen);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    mask.resize(static_cast<std::size_t>(plan.mask_size()));
    if (plan.mask == MaskKind::key_padding) {
      for (std::size_t i = 0; i < mask.size(); ++i) mask[i] = u(gen) < 0.7f ? 1.0f : 0.0f;
      for (std::int64_t j = 0; j < plan.Sk; ++j)
        mask[static_cast<std::size_t>((plan.B - 1) * plan.Sk + j)] = 0.0f;
    } else if (plan.mask == MaskKind::bias) {
      for (float& x : mask) x = u(gen) < 0.2f ? -kInf : 4.0f * u(gen) - 2.0f;
      for (std::int64_t j = 0; j < plan.Sk; ++j)
        mask[static_cast<std::size_t>(plan.Sk + j)] = -kInf;
    }
  }
};

struct Forward {
  Vec out, lse;
};

Forward run_forward(const Data& data, int threads) {
  Guarded out(data.plan.o.extent), lse(data.plan.B * data.plan.H * data.plan.Sq);
  opt::backend(opt::Options{threads})
      .attention_forward_lse(data.plan, data.in(), out.view(), lse.view());
  EXPECT_EQ(out.guard_damage(), "") << "forward, out";
  EXPECT_EQ(lse.guard_damage(), "") << "forward, lse";
  return {out.values(), lse.values()};
}

struct Grads {
  Vec dq, dk, dv;
};

/// Backward with the gradients selected by which (bits dq = 1, dk = 2, dv = 4),
/// from the forward's saved out and lse when `saved` is given.
Grads run_backward(const Data& data, int threads, int which,
                   const tandem::AttentionSaved<float>* saved = nullptr) {
  const AttentionPlan& p = data.plan;
  Guarded dq(p.dq.extent), dk(p.dk.extent), dv(p.dv.extent);
  AttentionGrads<float> g;
  if (which & 1) g.dq = dq.view();
  if (which & 2) g.dk = dk.view();
  if (which & 4) g.dv = dv.view();
  const tandem::Backend b = opt::backend(opt::Options{threads});
  if (saved != nullptr) {
    b.attention_backward_saved(p, data.in(), *saved, data.dout, g);
  } else {
    b.attention_backward(p, data.in(), data.dout, g);
  }
  EXPECT_TRUE(dq.guards_intact() && dk.guards_intact() && dv.guards_intact())
      << "backward wrote outside a gradient";
  Grads r;
  if (which & 1) r.dq = dq.values();
  if (which & 2) r.dk = dk.values();
  if (which & 4) r.dv = dv.values();
  // A gradient that was not asked for is never written.
  EXPECT_TRUE((which & 1) != 0 || dq.untouched());
  EXPECT_TRUE((which & 2) != 0 || dk.untouched());
  EXPECT_TRUE((which & 4) != 0 || dv.untouched());
  return r;
}

class OptimizedAttention : public ::testing::TestWithParam<Case> {
 protected:
  void TearDown() override { opt::force_target(0); }
};

TEST_P(OptimizedAttention, MatchesReferenceOnEveryTargetAndThreadCount) {
  const Data data(GetParam().params, 1234);
  const AttentionPlan& p = data.plan;
  const tandem::Backend ref = tandem::reference::backend();

  Vec want_out(static_cast<std::size_t>(p.o.extent));
  ref.attention_forward(p, data.in(), want_out);
  Vec want_dq(static_cast<std::size_t>(p.dq.extent)),
      want_dk(static_cast<std::size_t>(p.dk.extent)),
      want_dv(static_cast<std::size_t>(p.dv.extent));
  ref.attention_backward(p, data.in(), data.dout, {want_dq, want_dk, want_dv});
  const std::vector<double> want_lse = naive_lse(p, data.in());

  test::for_each_target([&] {
    SCOPED_TRACE(p.describe());
    const Forward f1 = run_forward(data, 1);
    EXPECT_TRUE(close(f1.out, want_out, 5e-5, 1e-5)) << "out";
    for (std::size_t x = 0; x < want_lse.size(); ++x) {
      if (std::isinf(want_lse[x])) {
        EXPECT_EQ(f1.lse[x], -kInf) << "lse of a fully masked row, at " << x;
      } else {
        EXPECT_NEAR(f1.lse[x], want_lse[x], 1e-5 + 1e-5 * std::abs(want_lse[x])) << "lse at " << x;
      }
    }
    const Grads all = run_backward(data, 1, 7);
    EXPECT_TRUE(close(all.dq, want_dq, 1e-4, 2e-5)) << "dq";
    EXPECT_TRUE(close(all.dk, want_dk, 1e-4, 2e-5)) << "dk";
    EXPECT_TRUE(close(all.dv, want_dv, 1e-4, 2e-5)) << "dv";
    // Each gradient alone is the same computation: bitwise equal to "all".
    EXPECT_TRUE(bitwise_equal(run_backward(data, 1, 1).dq, all.dq)) << "dq alone";
    EXPECT_TRUE(bitwise_equal(run_backward(data, 1, 2).dk, all.dk)) << "dk alone";
    EXPECT_TRUE(bitwise_equal(run_backward(data, 1, 4).dv, all.dv)) << "dv alone";
    const Grads dkdv = run_backward(data, 1, 6);
    EXPECT_TRUE(bitwise_equal(dkdv.dk, all.dk) && bitwise_equal(dkdv.dv, all.dv)) << "dk+dv";
    // From the forward's saved out and lse: the same gradients to rounding.
    const tandem::AttentionSaved<float> saved{f1.out, f1.lse};
    const Grads from_saved = run_backward(data, 1, 7, &saved);
    EXPECT_TRUE(close(from_saved.dq, want_dq, 1e-4, 2e-5)) << "dq from saved";
    EXPECT_TRUE(close(from_saved.dk, want_dk, 1e-4, 2e-5)) << "dk from saved";
    EXPECT_TRUE(close(from_saved.dv, want_dv, 1e-4, 2e-5)) << "dv from saved";
    for (const int threads : {2, 3}) {
      SCOPED_TRACE("threads " + std::to_string(threads));
      const Forward f = run_forward(data, threads);
      EXPECT_TRUE(bitwise_equal(f.out, f1.out)) << "out differs from 1 thread";
      EXPECT_TRUE(bitwise_equal(f.lse, f1.lse)) << "lse differs from 1 thread";
      const Grads g = run_backward(data, threads, 7);
      EXPECT_TRUE(bitwise_equal(g.dq, all.dq)) << "dq differs from 1 thread";
      EXPECT_TRUE(bitwise_equal(g.dk, all.dk)) << "dk differs from 1 thread";
      EXPECT_TRUE(bitwise_equal(g.dv, all.dv)) << "dv differs from 1 thread";
      const Grads gs = run_backward(data, threads, 7, &saved);
      EXPECT_TRUE(bitwise_equal(gs.dq, from_saved.dq) && bitwise_equal(gs.dk, from_saved.dk) &&
                  bitwise_equal(gs.dv, from_saved.dv))
          << "gradients from saved differ from 1 thread";
    }
    // Runs repeat bitwise.
    EXPECT_TRUE(bitwise_equal(run_forward(data, 2).out, f1.out)) << "second run";
  });
}

INSTANTIATE_TEST_SUITE_P(Cases, OptimizedAttention, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& pi) { return pi.param.name; });

/// Rows with no visible key: output 0 and lse −inf, gradients 0 for them.
TEST(OptimizedAttentionMasked, FullyMaskedRowsGiveZeroNeverNaN) {
  AttentionParams params = P(2, 3, 70, 2, 1, 8, 0, Layout::bshd, MaskKind::key_padding);
  Data data(params, 7);
  std::fill(data.mask.begin() + 70, data.mask.end(), 0.0f);  // batch 1 sees nothing
  const AttentionPlan& p = data.plan;
  test::for_each_target([&] {
    const Forward f = run_forward(data, 2);
    const Grads g = run_backward(data, 2, 7);
    for (std::int64_t i = 0; i < p.Sq; ++i)
      for (std::int64_t h = 0; h < p.H; ++h) {
        for (std::int64_t d = 0; d < p.Dv; ++d)
          EXPECT_EQ(f.out[static_cast<std::size_t>(p.o.at(1, i, h) + d)], 0.0f);
        for (std::int64_t d = 0; d < p.D; ++d)
          EXPECT_EQ(g.dq[static_cast<std::size_t>(p.dq.at(1, i, h) + d)], 0.0f);
        EXPECT_EQ(f.lse[static_cast<std::size_t>((p.H + h) * p.Sq + i)], -kInf);
      }
    for (std::int64_t j = 0; j < p.Sk; ++j) {
      for (std::int64_t d = 0; d < p.D; ++d)
        EXPECT_EQ(g.dk[static_cast<std::size_t>(p.dk.at(1, j, 0) + d)], 0.0f);
      for (std::int64_t d = 0; d < p.Dv; ++d)
        EXPECT_EQ(g.dv[static_cast<std::size_t>(p.dv.at(1, j, 0) + d)], 0.0f);
    }
    for (float x : f.out) EXPECT_FALSE(std::isnan(x));
  });
}

/// A padding key (keep = 0) is never used: NaN in its k and v rows must not
/// reach the output or any gradient (the reference never reads them).
TEST(OptimizedAttentionMasked, PaddingKeysAreNeverUsed) {
  for (const std::int64_t D : {16, 7}) {  // rows read in place, and packed
    AttentionParams params = P(2, 1, 70, 4, 1, D, 0, Layout::bshd, MaskKind::key_padding);
    if (D == 7) params.Sq = 9;
    Data data(params, 5);
    const AttentionPlan& p = data.plan;
    for (std::int64_t b = 0; b < p.B; ++b)
      for (std::int64_t j = 0; j < p.Sk; ++j) {
        if (data.mask[static_cast<std::size_t>(b * p.Sk + j)] != 0.0f) continue;
        for (std::int64_t x = 0; x < p.D; ++x) {
          data.k[static_cast<std::size_t>(p.k.at(b, j, 0) + x)] =
              std::numeric_limits<float>::quiet_NaN();
        }
        for (std::int64_t x = 0; x < p.Dv; ++x) {
          data.v[static_cast<std::size_t>(p.v.at(b, j, 0) + x)] =
              std::numeric_limits<float>::quiet_NaN();
        }
      }
    const tandem::Backend ref = tandem::reference::backend();
    Vec want_out(static_cast<std::size_t>(p.o.extent));
    ref.attention_forward(p, data.in(), want_out);
    Vec want_dq(static_cast<std::size_t>(p.dq.extent)),
        want_dk(static_cast<std::size_t>(p.dk.extent)),
        want_dv(static_cast<std::size_t>(p.dv.extent));
    ref.attention_backward(p, data.in(), data.dout, {want_dq, want_dk, want_dv});
    test::for_each_target([&] {
      SCOPED_TRACE("D=" + std::to_string(D));
      EXPECT_TRUE(close(run_forward(data, 2).out, want_out, 5e-5, 1e-5)) << "out";
      const Grads g = run_backward(data, 2, 7);
      EXPECT_TRUE(close(g.dq, want_dq, 1e-4, 2e-5)) << "dq";
      EXPECT_TRUE(close(g.dk, want_dk, 1e-4, 2e-5)) << "dk";
      EXPECT_TRUE(close(g.dv, want_dv, 1e-4, 2e-5)) << "dv";
    });
  }
}

/// As close() where the reference is finite; where it is not (a row that
/// sees a key holding NaN or inf), got must not be finite either.
::testing::AssertionResult close_or_nonfinite(const Vec& got, const Vec& want, double rtol,
                                              double atol) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "size differs";
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double g = got[i], w = want[i];
    const bool ok = std::isfinite(w)
                        ? std::isfinite(g) && std::abs(g - w) <= atol + rtol * std::abs(w)
                        : !std::isfinite(g);
    if (!ok) {
      if (bad == 0) first = i;
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << want.size() << " elements differ; first at " << first << ": got "
         << got[first] << ", want " << want[first];
}

std::size_t count_finite(const Vec& x) {
  return static_cast<std::size_t>(
      std::count_if(x.begin(), x.end(), [](float y) { return std::isfinite(y); }));
}

/// A key that causal, sliding-window or bias masks hide from some query rows
/// and show to others, with NaN, +inf or −inf in its k or its v: the rows it
/// is hidden from must come out as the reference gives them (finite: the
/// reference never reads a hidden key), forward and every gradient, on every
/// target, and rows that see it must not turn finite. Wide tiles, decode
/// tiles, rows read in place and packed, softcap.
TEST(OptimizedAttentionMasked, HiddenKeysWithNaNOrInfAreNeverRead) {
  using enum MaskKind;
  struct Poisoned {
    std::string name;
    AttentionParams params;
    std::vector<std::int64_t> keys;  ///< keys given non-finite k or v
  };
  std::vector<Poisoned> cases;
  cases.push_back({"causal_wide", P(1, 70, 70, 4, 2, 16, 0, Layout::bshd, causal), {25, 40, 69}});
  cases.push_back(
      {"causal_sq_lt_sk_packed", P(2, 33, 80, 2, 1, 7, 9, Layout::bhsd, causal), {50, 63, 79}});
  cases.push_back({"causal_decode", P(1, 2, 70, 4, 2, 16, 0, Layout::bshd, causal), {69}});
  cases.push_back({"causal_decode_packed", P(1, 2, 70, 4, 2, 9, 5, Layout::bshd, causal), {69}});
  cases.push_back(
      {"window_wide", P(1, 70, 150, 2, 1, 17, 0, Layout::bshd, sliding_window, 5), {82, 100, 140}});
  cases.push_back(
      {"window_gqa", P(2, 40, 40, 6, 2, 16, 8, Layout::bhsd, sliding_window, 9), {3, 20, 39}});
  {
    AttentionParams p = P(2, 20, 70, 4, 2, 8, 0, Layout::bhsd, bias);
    p.bias_batch = 2;
    p.bias_heads = 4;
    cases.push_back({"bias_wide", p, {3, 30, 66}});
  }
  {
    AttentionParams p = P(1, 1, 70, 8, 2, 16, 0, Layout::bshd, bias);
    p.bias_heads = 8;
    cases.push_back({"bias_decode", p, {10, 64}});
  }
  {
    AttentionParams p = P(1, 12, 40, 2, 1, 16, 0, Layout::bhsd, bias);
    p.softcap = 2.0;
    cases.push_back({"bias_softcap", p, {5, 39}});
  }
  {
    AttentionParams p = P(1, 30, 30, 2, 2, 12, 0, Layout::bshd, causal);
    p.softcap = 3.0;
    cases.push_back({"causal_softcap", p, {17}});
  }
  // decode steps with long caches (split into key chunks)
  cases.push_back({"window_decode_split",
                   P(1, 2, 1100, 2, 2, 100, 0, Layout::bhsd, sliding_window, 300),
                   {100, 798}});
  cases.push_back(
      {"causal_decode_split", P(1, 2, 1100, 16, 4, 64, 0, Layout::bshd, causal), {1099}});
  {
    AttentionParams p = P(1, 1, 600, 8, 8, 64, 0, Layout::bshd, bias);
    p.bias_heads = 8;
    cases.push_back({"bias_decode_split", p, {10, 300, 599}});
  }
  const tandem::Backend ref = tandem::reference::backend();
  for (const Poisoned& pc : cases) {
    for (const float bad : {std::numeric_limits<float>::quiet_NaN(), kInf, -kInf}) {
      for (const bool in_v : {false, true}) {
        Data data(pc.params, 21);
        const AttentionPlan& p = data.plan;
        if (p.mask == bias) {
          // the poisoned keys: hidden where (b + h + i) is even, seen elsewhere
          for (std::int64_t b = 0; b < p.B; ++b)
            for (std::int64_t h = 0; h < p.H; ++h)
              for (std::int64_t i = 0; i < p.Sq; ++i)
                for (const std::int64_t j : pc.keys) {
                  data.mask[static_cast<std::size_t>(p.mask_row(b, h, i) + j)] =
                      (b + h + i) % 2 == 0 ? -kInf : 0.5f;
                }
        }
        for (std::int64_t b = 0; b < p.B; ++b)
          for (std::int64_t g = 0; g < p.Hkv; ++g)
            for (const std::int64_t j : pc.keys) {
              if (in_v) {
                for (std::int64_t x = 0; x < p.Dv; ++x)
                  data.v[static_cast<std::size_t>(p.v.at(b, j, g) + x)] = bad;
              } else {
                for (std::int64_t x = 0; x < p.D; ++x)
                  data.k[static_cast<std::size_t>(p.k.at(b, j, g) + x)] = bad;
              }
            }
        Vec want_out(static_cast<std::size_t>(p.o.extent));
        ref.attention_forward(p, data.in(), want_out);
        Vec want_dq(static_cast<std::size_t>(p.dq.extent)),
            want_dk(static_cast<std::size_t>(p.dk.extent)),
            want_dv(static_cast<std::size_t>(p.dv.extent));
        ref.attention_backward(p, data.in(), data.dout, {want_dq, want_dk, want_dv});
        const std::string what = pc.name + (in_v ? ", v = " : ", k = ") + std::to_string(bad);
        // The case means something: some rows never see a poisoned key
        // (finite in the reference), and some see one (not finite there).
        ASSERT_GT(count_finite(want_out), 0u) << what;
        ASSERT_GT(count_finite(want_dq), 0u) << what;
        if (!(in_v || bad == -kInf)) {
          ASSERT_LT(count_finite(want_out), want_out.size()) << what;
        }
        test::for_each_target([&] {
          SCOPED_TRACE(what);
          const Forward f = run_forward(data, 1);
          EXPECT_TRUE(close_or_nonfinite(f.out, want_out, 5e-5, 1e-5)) << "out";
          EXPECT_TRUE(bitwise_equal(run_forward(data, 3).out, f.out)) << "out, 3 threads";
          const Grads all = run_backward(data, 1, 7);
          EXPECT_TRUE(close_or_nonfinite(all.dq, want_dq, 1e-4, 2e-5)) << "dq";
          EXPECT_TRUE(close_or_nonfinite(all.dk, want_dk, 1e-4, 2e-5)) << "dk";
          EXPECT_TRUE(close_or_nonfinite(all.dv, want_dv, 1e-4, 2e-5)) << "dv";
          const Grads all3 = run_backward(data, 3, 7);
          EXPECT_TRUE(bitwise_equal(all3.dq, all.dq) && bitwise_equal(all3.dk, all.dk) &&
                      bitwise_equal(all3.dv, all.dv))
              << "gradients, 3 threads";
          // each gradient alone (the careful path depends on which are asked for)
          const Vec dq = run_backward(data, 1, 1).dq;
          const Vec dk = run_backward(data, 1, 2).dk;
          const Vec dv = run_backward(data, 1, 4).dv;
          EXPECT_TRUE(close_or_nonfinite(dq, want_dq, 1e-4, 2e-5)) << "dq alone";
          EXPECT_TRUE(close_or_nonfinite(dk, want_dk, 1e-4, 2e-5)) << "dk alone";
          EXPECT_TRUE(close_or_nonfinite(dv, want_dv, 1e-4, 2e-5)) << "dv alone";
        });
      }
    }
  }
}

/// A query row whose q or dO holds NaN or ±inf: the keys hidden from that row
/// must get nothing from it (the reference never pairs them), so their dk
/// and dv stay as the reference gives them (finite), while the keys the row
/// sees turn non-finite there too; every target, each gradient alone too.
TEST(OptimizedAttentionMasked, NonFiniteQueryRowsReachOnlyTheKeysTheySee) {
  using enum MaskKind;
  struct Poisoned {
    std::string name;
    AttentionParams params;
    std::vector<std::int64_t> queries;  ///< query rows given non-finite q or dO (head 0)
  };
  std::vector<Poisoned> cases;
  cases.push_back({"causal_wide", P(1, 70, 70, 4, 2, 16, 0, Layout::bshd, causal), {3, 40}});
  cases.push_back({"causal_sq_lt_sk", P(2, 33, 80, 2, 1, 7, 9, Layout::bhsd, causal), {0, 20}});
  cases.push_back(
      {"window_gqa", P(2, 40, 40, 6, 2, 16, 8, Layout::bhsd, sliding_window, 9), {5, 30}});
  {
    AttentionParams p = P(1, 20, 70, 4, 2, 8, 0, Layout::bhsd, bias);
    p.bias_heads = 4;
    cases.push_back({"bias_wide", p, {2, 11}});
  }
  {
    AttentionParams p = P(1, 30, 30, 2, 2, 12, 0, Layout::bshd, causal);
    p.softcap = 3.0;
    cases.push_back({"causal_softcap", p, {1, 17}});
  }
  const tandem::Backend ref = tandem::reference::backend();
  for (const Poisoned& pc : cases) {
    for (const float bad : {std::numeric_limits<float>::quiet_NaN(), kInf}) {
      for (const bool in_dout : {false, true}) {
        Data data(pc.params, 23);
        const AttentionPlan& p = data.plan;
        if (p.mask == bias) {
          // row i sees every key but those with (i + j) % 3 == 0
          for (std::int64_t h = 0; h < p.H; ++h)
            for (std::int64_t i = 0; i < p.Sq; ++i)
              for (std::int64_t j = 0; j < p.Sk; ++j)
                data.mask[static_cast<std::size_t>(p.mask_row(0, h, i) + j)] =
                    (i + j) % 3 == 0 ? -kInf : 0.25f;
        }
        for (std::int64_t b = 0; b < p.B; ++b)
          for (const std::int64_t i : pc.queries) {
            if (in_dout) {
              for (std::int64_t x = 0; x < p.Dv; ++x)
                data.dout[static_cast<std::size_t>(p.o.at(b, i, 0) + x)] = bad;
            } else {
              for (std::int64_t x = 0; x < p.D; ++x)
                data.q[static_cast<std::size_t>(p.q.at(b, i, 0) + x)] = bad;
            }
          }
        Vec want_dq(static_cast<std::size_t>(p.dq.extent)),
            want_dk(static_cast<std::size_t>(p.dk.extent)),
            want_dv(static_cast<std::size_t>(p.dv.extent));
        ref.attention_backward(p, data.in(), data.dout, {want_dq, want_dk, want_dv});
        const std::string what = pc.name + (in_dout ? ", dO = " : ", q = ") + std::to_string(bad);
        // The case means something: some keys are hidden from every poisoned
        // row (finite dk, dv in the reference), and some are seen.
        ASSERT_GT(count_finite(want_dk), 0u) << what;
        ASSERT_GT(count_finite(want_dv), 0u) << what;
        test::for_each_target([&] {
          SCOPED_TRACE(what);
          const Grads all = run_backward(data, 1, 7);
          EXPECT_TRUE(close_or_nonfinite(all.dq, want_dq, 1e-4, 2e-5)) << "dq";
          EXPECT_TRUE(close_or_nonfinite(all.dk, want_dk, 1e-4, 2e-5)) << "dk";
          EXPECT_TRUE(close_or_nonfinite(all.dv, want_dv, 1e-4, 2e-5)) << "dv";
          EXPECT_TRUE(close_or_nonfinite(run_backward(data, 1, 2).dk, want_dk, 1e-4, 2e-5))
              << "dk alone";
          EXPECT_TRUE(close_or_nonfinite(run_backward(data, 1, 4).dv, want_dv, 1e-4, 2e-5))
              << "dv alone";
        });
      }
    }
  }
}

/// Bad views are errors naming the parameter, and nothing is written.
TEST(OptimizedAttentionValidation, BadViewsThrowBeforeWriting) {
  const Data data(P(1, 4, 6, 2, 1, 8), 3);
  const AttentionPlan& p = data.plan;
  const tandem::Backend b = opt::backend(opt::Options{2});
  Vec out(static_cast<std::size_t>(p.o.extent), 5.0f),
      lse(static_cast<std::size_t>(p.H * p.Sq), 5.0f);
  const auto expect_param = [](auto&& call, const std::string& name) {
    test::expect_error(call, name);
  };
  Vec short_out(out.size() - 1, 5.0f);
  expect_param([&] { b.attention_forward(p, data.in(), short_out); }, "out.size()");
  Vec short_lse(lse.size() + 1, 5.0f);
  expect_param([&] { b.attention_forward_lse(p, data.in(), out, short_lse); }, "lse.size()");
  expect_param([&] { b.attention_forward_lse(p, data.in(), out, {}); }, "lse.size()");
  AttentionInputs<float> bad = data.in();
  bad.k = bad.k.first(bad.k.size() - 1);
  expect_param([&] { b.attention_forward_lse(p, bad, out, lse); }, "k.size()");
  for (float x : out) EXPECT_EQ(x, 5.0f);
  for (float x : lse) EXPECT_EQ(x, 5.0f);

  Vec dq(static_cast<std::size_t>(p.dq.extent), 5.0f),
      dk(static_cast<std::size_t>(p.dk.extent) + 1, 5.0f);
  expect_param([&] { b.attention_backward(p, data.in(), data.dout, {dq, dk, {}}); }, "dk.size()");
  expect_param(
      [&] {
        b.attention_backward(p, data.in(), std::span<const float>(data.dout).first(3),
                             {dq, {}, {}});
      },
      "dout.size()");
  expect_param([&] { b.attention_backward(p, data.in(), data.dout, {}); }, "grads");
  expect_param([&] { b.attention_backward_dk(p, data.in(), data.dout, dk); }, "dk.size()");
  expect_param([&] { b.attention_backward_dq(p, data.in(), data.dout, {}); }, "dq.size()");
  Vec dk_full(static_cast<std::size_t>(p.dk.extent), 5.0f);
  const tandem::AttentionSaved<float> short_saved{out, std::span<const float>(lse).first(3)};
  expect_param(
      [&] {
        b.attention_backward_saved(p, data.in(), short_saved, data.dout, {dq, dk_full, {}});
      },
      "lse.size()");
  for (float x : dq) EXPECT_EQ(x, 5.0f);
  for (float x : dk) EXPECT_EQ(x, 5.0f);
  for (float x : dk_full) EXPECT_EQ(x, 5.0f);
  EXPECT_THROW(opt::backend(opt::Options{-1}), tandem::Error);
}

/// The separate dq, dk and dv entry points give bitwise what the one-call
/// backward gives for each gradient.
TEST(OptimizedAttentionBackend, SeparateGradientsMatchTheOneCall) {
  AttentionParams params = P(2, 9, 11, 4, 2, 8, 6, Layout::bshd, MaskKind::causal);
  const Data data(params, 11);
  const AttentionPlan& p = data.plan;
  const tandem::Backend b = opt::backend(opt::Options{2});
  const Grads all = run_backward(data, 2, 7);
  Vec dq(all.dq.size()), dk(all.dk.size()), dv(all.dv.size());
  b.attention_backward_dq(p, data.in(), data.dout, dq);
  b.attention_backward_dk(p, data.in(), data.dout, dk);
  b.attention_backward_dv(p, data.in(), data.dout, dv);
  EXPECT_TRUE(bitwise_equal(dq, all.dq));
  EXPECT_TRUE(bitwise_equal(dk, all.dk));
  EXPECT_TRUE(bitwise_equal(dv, all.dv));
  // the forward alone gives the forward_lse's out
  Vec out(static_cast<std::size_t>(p.o.extent));
  b.attention_forward(p, data.in(), out);
  EXPECT_TRUE(bitwise_equal(out, run_forward(data, 2).out));
}

}  // namespace

#else
TEST(OptimizedAttention, NotBuilt) {
  GTEST_SKIP() << "built without the optimized backend";
}
#endif
