// SPDX-License-Identifier: Apache-2.0
// The reference in bf16 and f16 storage (SPEC §10.2): hand-computed calls
// of one query, one head, D = Dv = 1 and scale 1, where each rounding point
// changes the answer — the weights RN_T(e_ij) (pytorch against exact), the
// output accumulator after every key (ggml), RN_T(p_ij) before dV and
// RN_T(dx_ij) before dQ, dK — and the rules around them: lse in float32,
// profiles that do not touch float32, a backward from the stored forward,
// the agreement bound's flip slack, and the error against exact arithmetic.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "support/tandem_test_support.hpp"
#include "tandem/reference/attention.hpp"
#include "tandem/reference/backend.hpp"
#include "tandem/reference/rope.hpp"
#include "tandem/reference/rounding_bound.hpp"
#include "tandem/reference/swiglu.hpp"

namespace {

using tandem::AttentionParams;
using tandem::bfloat16;
using tandem::float16;
using tandem::Rounding;
using tandem::test::attention_params;
namespace ref = tandem::reference;

template <class T>
using Case = tandem::test::AttentionCase<T>;

/// One query against keys k_j with values v_j, D = Dv = 1, q = 1, scale 1:
/// the scores are the keys themselves.
template <class T>
Case<T> one_query(const std::vector<double>& k, const std::vector<double>& v, Rounding r,
                  double dout = 0.0) {
  AttentionParams p = attention_params(1, 1, static_cast<std::int64_t>(k.size()), 1, 1, 1);
  p.scale = 1.0;
  p.rounding = r;
  Case<T> c(p, T(dout));
  c.q = {T(1.0)};
  for (std::size_t j = 0; j < k.size(); ++j) {
    c.k[j] = T(k[j]);
    c.v[j] = T(v[j]);
  }
  return c;
}

template <class T>
double forward(const Case<T>& c) {
  std::vector<T> out(1);
  ref::attention_forward<T>(c.plan, c.inputs(), std::span<T>(out));
  return static_cast<double>(out[0]);
}

TEST(ReferenceLowPrecision, TheWeightsRoundingSeparatesPytorchFromExact) {
  // s = (0, −1): μ = 0, e = (1, e^−1), l = 1 + e^−1; RN_bf16(e^−1) = 188·2^−9 (e^−1 = 188.35·2^−9)
  //   pytorch: RN(188·2^−9 / (1 + e^−1)) = RN(137.44·2^−9) = 137/512
  //   exact:   RN(e^−1 / (1 + e^−1))     = RN(137.70·2^−9) = 138/512
  const std::vector<double> k{0.0, -1.0}, v{0.0, 1.0};
  EXPECT_EQ(forward(one_query<bfloat16>(k, v, tandem::kRoundingPytorch)), 137.0 / 512);
  EXPECT_EQ(forward(one_query<bfloat16>(k, v, tandem::kRoundingExact)), 138.0 / 512);
  EXPECT_EQ(forward(one_query<bfloat16>(k, v, tandem::kRoundingGgml)), 137.0 / 512);
  // f16 at s = (0, −2): RN_f16(e^−2) = 1109·2^−13 against e^−2 = 1108.6·2^−13
  const std::vector<double> k2{0.0, -2.0};
  EXPECT_EQ(forward(one_query<float16>(k2, v, tandem::kRoundingPytorch)), 977.0 / 8192);
  EXPECT_EQ(forward(one_query<float16>(k2, v, tandem::kRoundingExact)), 1953.0 / 16384);
}

TEST(ReferenceLowPrecision, GgmlRoundsTheOutputAccumulatorAfterEveryKey) {
  // equal scores: every w = 1, l = 3; v = (1, 1.5·2^−9, 1.5·2^−9)
  //   pytorch, exact: RN((1 + 3·2^−9) / 3) = RN(171.67·2^−9) = 172/512
  //   ggml: a = RN(1 + 1.5·2^−9) = 1 twice over (half an ulp of 1 is 2^−8), RN(1/3) = 171/512
  const std::vector<double> k{0.0, 0.0, 0.0}, v{1.0, 0x1.8p-9, 0x1.8p-9};
  EXPECT_EQ(forward(one_query<bfloat16>(k, v, tandem::kRoundingPytorch)), 172.0 / 512);
  EXPECT_EQ(forward(one_query<bfloat16>(k, v, tandem::kRoundingExact)), 172.0 / 512);
  EXPECT_EQ(forward(one_query<bfloat16>(k, v, tandem::kRoundingGgml)), 171.0 / 512);
  // f16: v = (1, 1.5·2^−12, 1.5·2^−12): 683/2048 against ggml's 1365/4096
  const std::vector<double> v16{1.0, 0x1.8p-12, 0x1.8p-12};
  EXPECT_EQ(forward(one_query<float16>(k, v16, tandem::kRoundingPytorch)), 683.0 / 2048);
  EXPECT_EQ(forward(one_query<float16>(k, v16, tandem::kRoundingGgml)), 1365.0 / 4096);
}

TEST(ReferenceLowPrecision, LseIsFloat32FromTheWholeExponent) {
  // s = (3, 2): m = 3, μ = ⌈3·log2 e⌉ = 5, lse = 5·ln 2 + ln(2^(3 log2 e − 5) + 2^(2 log2 e − 5))
  auto c = one_query<bfloat16>({3.0, 2.0}, {1.0, -1.0}, tandem::kRoundingPytorch);
  std::vector<bfloat16> out(1);
  std::vector<float> lse(1);
  ref::attention_forward_lse<bfloat16>(c.plan, c.inputs(), out, lse);
  EXPECT_EQ(lse[0], static_cast<float>(std::log(std::exp(3.0) + std::exp(2.0))));
  EXPECT_EQ(lse[0], 3.3132617473602295f);
}

TEST(ReferenceLowPrecision, TheBackwardRoundsPBeforeDvAndDxBeforeDqDk) {
  // s = (0, −1), v = (0, 1), as the forward case above; p_j = exp(s_j − lse), lse in float32.
  const std::vector<double> k{0.0, -1.0}, v{0.0, 1.0};
  const auto grads = [&](Rounding r, double dout) {
    auto c = one_query<bfloat16>(k, v, r, dout);
    std::vector<bfloat16> dq(1), dk(2), dv(2);
    ref::attention_backward<bfloat16>(c.plan, c.inputs(), c.dout, {dq, dk, dv});
    std::vector<double> g;
    for (const auto* x : {&dq, &dk, &dv}) {
      for (const bfloat16 e : *x) g.push_back(static_cast<double>(e));
    }
    return g;  // dq, dk_0, dk_1, dv_0, dv_1
  };
  // dO = 1.75: dv_1 = RN(1.75·RN(p_1)) = 121/256 against RN(1.75·p_1) = 241/512
  EXPECT_EQ(grads(tandem::kRoundingPytorch, 1.75)[4], 121.0 / 256);
  EXPECT_EQ(grads(tandem::kRoundingExact, 1.75)[4], 241.0 / 512);
  // dO = 1: dq = RN(Σ_j RN(dx_j)·k_j) = −101/512 against −201/1024; dk_j = RN(RN(dx_j)·q)
  const std::vector<double> pytorch = grads(tandem::kRoundingPytorch, 1.0);
  const std::vector<double> exact = grads(tandem::kRoundingExact, 1.0);
  EXPECT_EQ(pytorch[0], -101.0 / 512);
  EXPECT_EQ(exact[0], -201.0 / 1024);
  EXPECT_EQ(pytorch[1], -25.0 / 128);
  EXPECT_EQ(exact[1], -101.0 / 512);
  EXPECT_EQ(pytorch[2], 101.0 / 512);
  EXPECT_EQ(exact[2], 201.0 / 1024);
}

/// Causal GQA attention with sinks, softcap and ALiBi.
AttentionParams featured_params(Rounding r) {
  AttentionParams p =
      attention_params(2, 5, 9, 4, 2, 8, 6, tandem::Layout::bshd, tandem::MaskKind::causal);
  p.sinks = true;
  p.softcap = 4.0;
  p.alibi = tandem::AlibiKind::per_head;
  p.rounding = r;
  return p;
}

/// A random case of featured_params in storage type T.
template <class T>
Case<T> featured_case(Rounding r) {
  Case<T> c(featured_params(r));
  const auto fill = [](std::vector<T>& x, unsigned seed, float scale) {
    const std::vector<float> u = tandem::test::random_values(x.size(), seed, -scale, scale);
    for (std::size_t e = 0; e < x.size(); ++e) x[e] = T(u[e]);
  };
  fill(c.q, 1, 2.0f);
  fill(c.k, 2, 2.0f);
  fill(c.v, 3, 1.0f);
  fill(c.dout, 4, 1.0f);
  fill(c.sinks, 5, 1.0f);
  c.slopes = {0.5f, 0.25f, 0.125f, 0.0625f};
  return c;
}

/// The same case with the stored values read into double.
template <class T>
Case<double> as_double(const Case<T>& c, Rounding r) {
  Case<double> d(featured_params(r));
  const auto widen = [](const std::vector<T>& x) {
    std::vector<double> y;
    y.reserve(x.size());
    for (const T& e : x) y.push_back(static_cast<double>(e));
    return y;
  };
  d.q = widen(c.q);
  d.k = widen(c.k);
  d.v = widen(c.v);
  d.dout = widen(c.dout);
  d.sinks = widen(c.sinks);
  d.mask = c.mask;
  d.slopes = c.slopes;
  return d;
}

template <class T>
void expect_within_exact_bound() {
  // SPEC §10.5: with pytorch's profile |o − o_exact| <= u·|o| + u·Σ_j p_ij |v_j| (+ float32's
  // own, here double's: nothing), and Σ_j p_ij |v_j| <= max |v| <= 1.
  const double u = tandem::storage_traits<T>::unit_roundoff;
  const Case<T> c = featured_case<T>(tandem::kRoundingPytorch);
  const Case<double> d = as_double(c, tandem::kRoundingPytorch);
  std::vector<T> out(c.plan.o.extent);
  std::vector<double> exact(c.plan.o.extent);
  ref::attention_forward<T>(c.plan, c.inputs(), std::span<T>(out));
  ref::attention_forward<double>(d.plan, d.inputs(), std::span<double>(exact));
  double worst = 0;
  for (std::size_t e = 0; e < out.size(); ++e) {
    const double o = static_cast<double>(out[e]);
    EXPECT_LE(std::fabs(o - exact[e]), u * std::fabs(o) + u * 1.0) << e;
    worst = std::max(worst, std::fabs(o - exact[e]));
  }
  EXPECT_GT(worst, 0.0);  // the rounding happened
}

TEST(ReferenceLowPrecision, TheErrorAgainstExactArithmeticIsWithinSpecBound) {
  expect_within_exact_bound<bfloat16>();
  expect_within_exact_bound<float16>();
}

TEST(ReferenceLowPrecision, TheBackwardReadsTheStoredForward) {
  // without a saved state the backward rounds as if it had one: lse in float32, out in T
  const Case<bfloat16> c = featured_case<bfloat16>(tandem::kRoundingPytorch);
  const tandem::AttentionPlan& p = c.plan;
  std::vector<bfloat16> out(p.o.extent);
  std::vector<float> lse(p.lse_size());
  ref::attention_forward_lse<bfloat16>(p, c.inputs(), out, lse);
  const auto run = [&](const tandem::AttentionSaved<bfloat16>* saved) {
    std::vector<bfloat16> dq(p.dq.extent), dk(p.dk.extent), dv(p.dv.extent), ds(p.H);
    const tandem::AttentionGrads<bfloat16> g{dq, dk, dv, ds};
    if (saved != nullptr) {
      ref::attention_backward_saved<bfloat16>(p, c.inputs(), *saved, c.dout, g);
    } else {
      ref::attention_backward<bfloat16>(p, c.inputs(), c.dout, g);
    }
    std::vector<std::uint16_t> bits;
    for (const auto* x : {&dq, &dk, &dv, &ds}) {
      for (const bfloat16 e : *x) bits.push_back(e.bits);
    }
    return bits;
  };
  const tandem::AttentionSaved<bfloat16> saved{out, lse};
  const std::vector<std::uint16_t> a = run(nullptr), b = run(&saved);
  EXPECT_EQ(a, b);
  EXPECT_NE(std::count(a.begin(), a.end(), std::uint16_t(0)), static_cast<long>(a.size()));
}

TEST(ReferenceLowPrecision, ProfilesDoNotTouchFloat32) {
  std::vector<std::vector<float>> outs;
  for (const Rounding& r : tandem::kRoundingProfiles) {
    const Case<float> c = featured_case<float>(r);
    std::vector<float> out(c.plan.o.extent);
    ref::attention_forward<float>(c.plan, c.inputs(), std::span<float>(out));
    outs.push_back(out);
  }
  EXPECT_TRUE(tandem::test::bitwise_equal(outs[0], outs[1]));
  EXPECT_TRUE(tandem::test::bitwise_equal(outs[0], outs[2]));
}

TEST(ReferenceLowPrecision, TheBackendOffersBf16AndF16) {
  const tandem::Backend b = ref::backend();
  const Case<bfloat16> c = featured_case<bfloat16>(tandem::kRoundingPytorch);
  std::vector<bfloat16> via_backend(c.plan.o.extent), direct(c.plan.o.extent);
  b.kernels<bfloat16>().attention_forward(c.plan, c.inputs(), via_backend);
  ref::attention_forward<bfloat16>(c.plan, c.inputs(), std::span<bfloat16>(direct));
  for (std::size_t e = 0; e < direct.size(); ++e) EXPECT_EQ(via_backend[e].bits, direct[e].bits);
  EXPECT_TRUE(static_cast<bool>(b.f16.attention_backward));
}

TEST(ReferenceLowPrecision, TheFlipSlackCountsTheAmbiguousWeights) {
  // s = (0, −1): e_1 = e^−1 = 188.354·2^−9 lies 0.146·2^−9 (relative 7.7e−4) from the
  // rounding boundary 188.5·2^−9; e_0 = 1 is a value of bf16 and never ambiguous.
  const auto c = one_query<bfloat16>({0.0, -1.0}, {0.0, 1.0}, tandem::kRoundingPytorch);
  const double l = 1.0 + std::exp(-1.0);
  const ref::RoundingBound wide =
      ref::attention_forward_rounding<bfloat16>(c.plan, c.inputs(), 1e-2);
  EXPECT_DOUBLE_EQ(wide.unrounded[0], 188.0 / 512 / l);
  EXPECT_DOUBLE_EQ(wide.flip[0], 0x1p-9 * 1.0 / l);  // ulp_bf16(e^−1)·|v_1| / l
  const ref::RoundingBound narrow =
      ref::attention_forward_rounding<bfloat16>(c.plan, c.inputs(), 1e-4);
  EXPECT_EQ(narrow.flip[0], 0.0);
  // the exact profile rounds no weight: no slack, o* the exact quotient
  const auto e = one_query<bfloat16>({0.0, -1.0}, {0.0, 1.0}, tandem::kRoundingExact);
  const ref::RoundingBound exact = ref::attention_forward_rounding<bfloat16>(e.plan, e.inputs(), 1);
  EXPECT_EQ(exact.flip[0], 0.0);
  EXPECT_DOUBLE_EQ(exact.unrounded[0], std::exp(-1.0) / l);
  // the output is o* rounded once
  EXPECT_EQ(forward(c), static_cast<double>(bfloat16(wide.unrounded[0])));
}

TEST(ReferenceLowPrecision, F16WeightsBelowTheNormalRangeAreAmbiguous) {
  // s = (0, −12): e_1 = e^−12 ≈ 6.1e−6 < 2^−14: one f16 subnormal ulp 2^−24 of slack
  const auto c = one_query<float16>({0.0, -12.0}, {0.0, 2.0}, tandem::kRoundingPytorch);
  const ref::RoundingBound b = ref::attention_forward_rounding<float16>(c.plan, c.inputs(), 0.0);
  EXPECT_DOUBLE_EQ(b.flip[0], 0x1p-24 * 2.0 / (1.0 + std::exp(-12.0)));
}

TEST(ReferenceLowPrecision, TheBackwardGradientsAreTheirBoundsRoundedOnce) {
  for (const Rounding& r : {tandem::kRoundingPytorch, tandem::kRoundingExact}) {
    const Case<bfloat16> c = featured_case<bfloat16>(r);
    const tandem::AttentionPlan& p = c.plan;
    std::vector<bfloat16> dq(p.dq.extent), dk(p.dk.extent), dv(p.dv.extent);
    ref::attention_backward<bfloat16>(p, c.inputs(), c.dout, {dq, dk, dv});
    const ref::BackwardRoundingBound b =
        ref::attention_backward_rounding<bfloat16>(p, c.inputs(), c.dout, 1e-2);
    double flips = 0;
    for (const auto& [got, bound] : {std::pair{&dq, &b.dq}, {&dk, &b.dk}, {&dv, &b.dv}}) {
      ASSERT_EQ(got->size(), bound->unrounded.size());
      for (std::size_t e = 0; e < got->size(); ++e) {
        EXPECT_EQ((*got)[e].bits, bfloat16(bound->unrounded[e]).bits) << r.name << " " << e;
        flips += bound->flip[e];
      }
    }
    // pytorch rounds p and dx, some of them near a boundary at rel_delta 1e−2; exact rounds none
    if (r == tandem::kRoundingPytorch) {
      EXPECT_GT(flips, 0.0);
    } else {
      EXPECT_EQ(flips, 0.0);
    }
  }
}

/// x's values in T, and the same values in double.
template <class T>
std::pair<std::vector<T>, std::vector<double>> stored(std::size_t n, unsigned seed, float lo,
                                                      float hi) {
  std::vector<T> t;
  std::vector<double> d;
  t.reserve(n);
  d.reserve(n);
  for (const float e : tandem::test::random_values(n, seed, lo, hi)) {
    t.emplace_back(e);
    d.push_back(static_cast<double>(t.back()));
  }
  return {t, d};
}

/// Every element of `got` is RN_T of the element of `exact`.
template <class T>
void expect_rounded_once(const std::vector<T>& got, const std::vector<double>& exact) {
  ASSERT_EQ(got.size(), exact.size());
  int inexact = 0;
  for (std::size_t e = 0; e < got.size(); ++e) {
    EXPECT_EQ(got[e].bits, T(exact[e]).bits) << e;
    inexact += static_cast<double>(got[e]) != exact[e] ? 1 : 0;
  }
  EXPECT_GT(inexact, 0);  // the results are not all values of T: the rounding is seen
}

template <class T>
void expect_swiglu_rope_round_once() {
  // SwiGLU: RN_T(silu(g)·u) and its backward, from the double computation on the stored values
  const tandem::SwigluPlan sp = tandem::SwigluPlan::from_shapes({3, 8}, true);
  const auto [x, xd] = stored<T>(sp.in_size(), 41, -3.0f, 3.0f);
  const auto [dy, dyd] = stored<T>(sp.out_size(), 42, -1.0f, 1.0f);
  std::vector<T> y(sp.out_size()), dx(sp.in_size());
  std::vector<double> yd(sp.out_size()), dxd(sp.in_size());
  ref::swiglu_forward<T>(sp, x, std::span<T>(y));
  ref::swiglu_forward<double>(sp, xd, std::span<double>(yd));
  expect_rounded_once(y, yd);
  ref::swiglu_backward<T>(sp, x, dy, std::span<T>(dx));
  ref::swiglu_backward<double>(sp, xd, dyd, std::span<double>(dxd));
  expect_rounded_once(dx, dxd);
  // RoPE: RN_T(x_1·c − x_2·s) with the tables in T
  tandem::RopeParams rp;
  rp.seq = 2;
  rp.width = 16;
  rp.head_dim = 8;
  rp.n_rot = 8;
  rp.table_rows = 2;
  const tandem::RopePlan plan = tandem::RopePlan::make(rp);
  const auto [rx, rxd] = stored<T>(plan.out_size(), 43, -2.0f, 2.0f);
  const auto [c, cd] = stored<T>(2 * 4, 44, -1.0f, 1.0f);
  const auto [sn, snd] = stored<T>(2 * 4, 45, -1.0f, 1.0f);
  std::vector<T> ry(plan.out_size());
  std::vector<double> ryd(plan.out_size());
  ref::rope_forward<T>(plan, rx, tandem::RopeTables<T>{c, sn}, std::span<T>(ry));
  ref::rope_forward<double>(plan, rxd, tandem::RopeTables<double>{cd, snd}, std::span<double>(ryd));
  expect_rounded_once(ry, ryd);
}

TEST(ReferenceLowPrecision, SwigluAndRopeRoundEachOutputOnce) {
  expect_swiglu_rope_round_once<bfloat16>();
  expect_swiglu_rope_round_once<float16>();
}

}  // namespace
