// SPDX-License-Identifier: Apache-2.0
// FlexAttention in the reference (SPEC §13.4): the plan's checks (each
// naming its parameter, nothing written), a worked example by hand, the flex
// forms of the native features against the native reference, block masks
// made by create_block_mask and checked by validate_block_mask, and the
// backward against complex steps through q, k, v and a captured tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <complex>
#include <limits>

#include "support/tandem_test_support.hpp"
#include "tandem/attention_plan.hpp"
#include "tandem/flex_plan.hpp"
#include "tandem/reference/attention.hpp"
#include "tandem/reference/flex.hpp"

namespace tandem {
namespace {

using test::expect_error;
using C = std::complex<double>;
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kSentinel = 12345.5;

FlexParams flex_params(std::int64_t B, std::int64_t H, std::int64_t Hkv, std::int64_t Sq,
                       std::int64_t Sk, std::int64_t D, std::int64_t Dv = 0) {
  FlexParams p;
  p.B = B;
  p.H = H;
  p.Hkv = Hkv;
  p.Sq = Sq;
  p.Sk = Sk;
  p.D = D;
  p.Dv = Dv;
  return p;
}

/// q, k, v of a flex plan, random in [−1, 1), and its outputs.
struct FlexCase {
  FlexPlan plan;
  std::vector<double> q, k, v, out, lse;
  explicit FlexCase(const FlexParams& p, unsigned seed = 7)
      : plan(FlexPlan::make(p)),
        q(test::random_values<double>(static_cast<std::size_t>(plan.q_size()), seed)),
        k(test::random_values<double>(static_cast<std::size_t>(plan.k_size()), seed + 1)),
        v(test::random_values<double>(static_cast<std::size_t>(plan.v_size()), seed + 2)),
        out(static_cast<std::size_t>(plan.out_size()), kSentinel),
        lse(static_cast<std::size_t>(plan.lse_size()), kSentinel) {}
  [[nodiscard]] FlexInputs<double> inputs() const { return {q, k, v, {}, {}, {}}; }
  void forward(const FlexInputs<double>& in) {
    reference::flex_forward<double>(plan, in, out, lse);
  }
};

/// The native reference's out for the same q, k, v (bhsd), with `edit` setting features.
template <class Edit>
std::vector<double> native_out(const FlexCase& f, MaskKind mask, Edit edit) {
  const FlexParams& p = f.plan.params();
  AttentionParams a =
      test::attention_params(p.B, p.Sq, p.Sk, p.H, p.Hkv, p.D, p.Dv, Layout::bhsd, mask);
  edit(a);
  test::AttentionCase<double> c(a);
  c.q = f.q;
  c.k = f.k;
  c.v = f.v;
  edit(c);
  std::vector<double> out(static_cast<std::size_t>(c.plan.o.extent));
  reference::attention_forward<double>(c.plan, c.inputs(), out);
  return out;
}

void expect_near_all(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t e = 0; e < got.size(); ++e) ASSERT_NEAR(got[e], want[e], 1e-12) << "at " << e;
}

TEST(FlexPlan, RejectsBadSizesAndBlockMaskShapesNamingTheParameter) {
  expect_error([] { FlexPlan::make(flex_params(1, 6, 4, 8, 8, 4)); }, "Hkv", {"must divide H = 6"});
  FlexParams p = flex_params(2, 2, 2, 8, 10, 4);
  p.block_mask = FlexBlockMaskShape{4, 4, 1, 3, 0, 0, false};
  expect_error([&] { FlexPlan::make(p); }, "block_mask.H", {"must be 1 or H = 2"});
  p.block_mask = FlexBlockMaskShape{4, 4, 1, 1, 4, 0, false};
  expect_error([&] { FlexPlan::make(p); }, "block_mask.width", {"1…3"});
  p.scale = -1.0;
  p.block_mask.reset();
  expect_error([&] { FlexPlan::make(p); }, "scale", {"finite and > 0"});
}

TEST(FlexPlan, RejectsBadBlockMaskIndicesAndTensorValuesWritingNothing) {
  FlexParams p = flex_params(1, 1, 1, 8, 8, 4);
  ModProgram& m = p.mask_mod;
  const auto ids = m.capture({"ids", {8}, ModType::integer, 0, 3});
  m.set_result(m.load(ids, {m.q_idx()}) == m.load(ids, {m.kv_idx()}));
  p.block_mask = FlexBlockMaskShape{4, 4, 1, 1, 2, 2, true};
  FlexCase f(p);
  std::vector<std::int32_t> doc{0, 0, 1, 1, 2, 2, 3, 3}, num{1, 1}, idx{0, 0, 1, 0};
  std::vector<std::int32_t> fnum{0, 1}, fidx{0, 0, 1, 0};
  FlexInputs<double> in = f.inputs();
  in.mask_tensors.real = {{}};
  in.mask_tensors.integer = {doc};
  in.block_mask = {num, idx, fnum, fidx};
  const auto expect = [&](const std::string& parameter, std::initializer_list<std::string> msg) {
    expect_error([&] { f.forward(in); }, parameter, msg);
    for (const double x : f.out) ASSERT_EQ(x, kSentinel);
  };
  expect("block_mask.full_kv_indices", {"[2] = 1", "also a partial block"});
  fidx = {0, 0, 0, 0};  // query block 1: kv block 0 full, kv block 1 partial
  idx = {0, 0, 2, 0};
  expect("block_mask.kv_indices", {"[2] = 2", "0…1"});
  idx = {0, 0, 1, 0};
  num = {3, 1};
  expect("block_mask.kv_num_blocks", {"[0] = 3", "0…2"});
  num = {1, 1};
  doc[5] = 4;
  expect("mask_mod tensor ids", {"[5] = 4", "[0, 3]"});
  doc[5] = 2;
  f.forward(in);
  EXPECT_NE(f.out[0], kSentinel);
}

// A worked example: one query, two keys, D = 1, scale 1, score_mod 2·score:
// t = (2, −2), p = (e², e⁻²)/(e² + e⁻²), o = 2 p₀ + 4 p₁.
TEST(FlexReference, WorkedExampleByHand) {
  FlexParams p = flex_params(1, 1, 1, 1, 2, 1);
  p.scale = 1.0;
  p.score_mod.set_result(p.score_mod.score() * p.score_mod.real(2.0));
  FlexCase f(p);
  f.q = {1.0};
  f.k = {1.0, -1.0};
  f.v = {2.0, 4.0};
  f.forward(f.inputs());
  const double p0 = std::exp(2.0) / (std::exp(2.0) + std::exp(-2.0));
  EXPECT_NEAR(f.out[0], 2 * p0 + 4 * (1 - p0), 1e-15);
  EXPECT_NEAR(f.lse[0], std::log(std::exp(2.0) + std::exp(-2.0)), 1e-15);
}

TEST(FlexReference, AFullyMaskedRowGivesZeroAndMinusInfinity) {
  FlexParams p = flex_params(1, 2, 1, 3, 4, 2);
  ModProgram& m = p.mask_mod;
  m.set_result(m.q_idx() != m.integer(1));
  FlexCase f(p);
  f.forward(f.inputs());
  for (std::int64_t h = 0; h < 2; ++h) {
    EXPECT_EQ(f.lse[static_cast<std::size_t>(h * 3 + 1)], -kInf);
    for (std::int64_t e = 0; e < 2; ++e) {
      EXPECT_EQ(f.out[static_cast<std::size_t>((h * 3 + 1) * 2 + e)], 0.0);
    }
    EXPECT_TRUE(std::isfinite(f.lse[static_cast<std::size_t>(h * 3)]));
  }
}

// causal (bottom-right, as the native mask): kv_idx <= q_idx + Sk − Sq
TEST(FlexReference, CausalModEqualsTheNativeCausalMask) {
  FlexParams p = flex_params(2, 4, 2, 9, 13, 8, 5);
  ModProgram& m = p.mask_mod;
  m.set_result(m.kv_idx() <= m.q_idx() + m.integer(13 - 9));
  FlexCase f(p);
  f.forward(f.inputs());
  expect_near_all(f.out, native_out(f, MaskKind::causal, [](auto&) {}));
}

// sliding window w: a − w <= kv_idx <= a, a = q_idx + Sk − Sq
TEST(FlexReference, WindowModEqualsTheNativeSlidingWindow) {
  FlexParams p = flex_params(1, 2, 2, 11, 11, 4);
  ModProgram& m = p.mask_mod;
  const ModValue d = m.q_idx() - m.kv_idx();
  m.set_result(d >= m.integer(0) && d <= m.integer(3));
  FlexCase f(p);
  f.forward(f.inputs());
  expect_near_all(f.out, native_out(f, MaskKind::sliding_window, [](auto& x) {
                    if constexpr (std::is_same_v<std::decay_t<decltype(x)>, AttentionParams>) {
                      x.window = 3;
                    }
                  }));
}

// softcap c: t = c·tanh(s / c)
TEST(FlexReference, SoftcapModEqualsTheNativeSoftcap) {
  FlexParams p = flex_params(1, 2, 1, 6, 7, 4);
  p.scale = 3.0;
  ModProgram& m = p.score_mod;
  m.set_result(m.real(1.5) * m.apply(ModOp::tanh, m.score() / m.real(1.5)));
  FlexCase f(p);
  f.forward(f.inputs());
  expect_near_all(f.out, native_out(f, MaskKind::none, [](auto& x) {
                    if constexpr (std::is_same_v<std::decay_t<decltype(x)>, AttentionParams>) {
                      x.softcap = 1.5;
                      x.scale = 3.0;
                    }
                  }));
}

// ALiBi: t = s − slopes[h]·|q_idx + Sk − Sq − kv_idx|, slopes captured
TEST(FlexReference, AlibiModEqualsTheNativeAlibi) {
  FlexParams p = flex_params(1, 4, 2, 5, 8, 4);
  ModProgram& m = p.score_mod;
  const auto slopes = m.capture({"slopes", {4}, ModType::real, 0, 0});
  const ModValue dist = m.apply(ModOp::abs, m.q_idx() + m.integer(3) - m.kv_idx());
  m.set_result(m.score() - m.load(slopes, {m.h()}) * dist);
  FlexCase f(p);
  const std::vector<float> s32 = alibi_standard_slopes(4);
  const std::vector<double> s64(s32.begin(), s32.end());
  FlexInputs<double> in = f.inputs();
  in.score_tensors = {{s64}, {Indices{}}};
  f.forward(in);
  expect_near_all(f.out, native_out(f, MaskKind::none, [&](auto& x) {
                    if constexpr (std::is_same_v<std::decay_t<decltype(x)>, AttentionParams>) {
                      x.alibi = AlibiKind::per_head;
                    } else {
                      x.slopes = s32;
                    }
                  }));
}

// A document mask equals packed sequences: doc[q_idx] == doc[kv_idx], causal in each.
TEST(FlexReference, DocumentMaskEqualsPackedSequences) {
  FlexParams p = flex_params(1, 1, 1, 10, 10, 4);
  ModProgram& m = p.mask_mod;
  const auto doc = m.capture({"doc", {10}, ModType::integer, 0, 2});
  m.set_result(m.load(doc, {m.q_idx()}) == m.load(doc, {m.kv_idx()}) && m.kv_idx() <= m.q_idx());
  FlexCase f(p);
  const std::vector<std::int32_t> ids{0, 0, 0, 1, 1, 1, 1, 2, 2, 2};
  FlexInputs<double> in = f.inputs();
  in.mask_tensors = {{{}}, {ids}};
  f.forward(in);
  expect_near_all(f.out, native_out(f, MaskKind::causal, [](auto& x) {
                    if constexpr (std::is_same_v<std::decay_t<decltype(x)>, AttentionParams>) {
                      x.layout = Layout::bshd;  // H = 1: bshd and bhsd hold the same order
                      x.num_seqs = 3;
                    } else {
                      x.cu_q = x.cu_k = {0, 3, 7, 10};
                    }
                  }));
}

TEST(FlexBlockMask, CreatedFromCausalGivesFullAndPartialBlocksAndTheSameOutput) {
  FlexParams p = flex_params(1, 2, 2, 10, 10, 4);
  ModProgram& m = p.mask_mod;
  m.set_result(m.kv_idx() <= m.q_idx());
  FlexCase plain(p);
  plain.forward(plain.inputs());
  const FlexBlockMask bm = reference::create_block_mask<double>(plain.plan, {}, 4, 4, true, true);
  // query block 2 (rows 8, 9): kv blocks 0 and 1 full, 2 partial
  EXPECT_EQ(bm.full_kv_num_blocks, (std::vector<std::int32_t>{0, 1, 2}));
  EXPECT_EQ(bm.kv_num_blocks, (std::vector<std::int32_t>{1, 1, 1}));
  EXPECT_EQ(bm.kv_indices[2 * 3], 2);
  p.block_mask = bm.shape;
  FlexCase blocked(p);
  FlexInputs<double> in = blocked.inputs();
  in.block_mask = bm.data();
  blocked.forward(in);
  EXPECT_EQ(blocked.out, plain.out);
  EXPECT_FALSE(reference::validate_block_mask(blocked.plan, in).has_value());
  // a partial diagonal block marked full is named by validate_block_mask
  FlexBlockMask wrong = bm;
  wrong.kv_num_blocks[1] = 0;
  wrong.full_kv_num_blocks[1] = 2;
  wrong.full_kv_indices[1 * 3 + 1] = 1;
  in.block_mask = wrong.data();
  const auto why = reference::validate_block_mask(blocked.plan, in);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("q block 1, kv block 1) of (b 0, h 0) is marked full, but mask_mod hides "
                      "(b 0, h 0, q_idx 4, kv_idx 5)"),
            std::string::npos)
      << *why;
}

// The backward against complex steps: L = Σ W ∘ out, ∂L/∂x ≈ Im L(x + iε) / ε.
TEST(FlexReference, BackwardAgreesWithComplexStepsThroughACapturedTensor) {
  FlexParams p = flex_params(1, 2, 1, 5, 6, 3, 2);
  ModProgram& sm = p.score_mod;
  const auto rel = sm.capture({"rel", {2, 11}, ModType::real, 0, 0});
  sm.set_result(sm.apply(ModOp::tanh, sm.score()) +
                sm.load(rel, {sm.h(), sm.q_idx() - sm.kv_idx() + sm.integer(5)}));
  ModProgram& mm = p.mask_mod;
  mm.set_result(mm.kv_idx() <= mm.q_idx() + mm.integer(1));
  FlexCase f(p);
  std::vector<double> t = test::random_values<double>(22, 11);
  const std::vector<double> W = test::random_values<double>(f.out.size(), 12);
  std::vector<double> dq(f.q.size()), dk(f.k.size()), dv(f.v.size()), dt(t.size());
  FlexInputs<double> in = f.inputs();
  in.score_tensors = {{t}, {Indices{}}};
  reference::flex_backward<double>(f.plan, in, W, {dq, dk, dv, {dt}});
  // L(x + iε e) for one perturbed element of one input
  const auto loss = [&](int which, std::size_t e) {
    std::vector<C> q(f.q.begin(), f.q.end()), k(f.k.begin(), f.k.end());
    std::vector<C> v(f.v.begin(), f.v.end()), tc(t.begin(), t.end());
    std::vector<C>* x[] = {&q, &k, &v, &tc};
    (*x[which])[e] += C(0, 1e-20);
    FlexInputs<C> ci{q, k, v, {{tc}, {Indices{}}}, {}, {}};
    std::vector<C> out(f.out.size());
    reference::flex_forward<C>(f.plan, ci, out);
    C l{};
    for (std::size_t o = 0; o < out.size(); ++o) l += W[o] * out[o];
    return l.imag() / 1e-20;
  };
  const std::vector<double>* grads[] = {&dq, &dk, &dv, &dt};
  for (int which = 0; which < 4; ++which) {
    for (std::size_t e = 0; e < grads[which]->size(); ++e) {
      ASSERT_NEAR((*grads[which])[e], loss(which, e), 1e-12) << "input " << which << " at " << e;
    }
  }
}

}  // namespace
}  // namespace tandem
