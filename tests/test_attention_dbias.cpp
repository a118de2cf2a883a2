// SPDX-License-Identifier: Apache-2.0
// The bias gradient dbias (SPEC §3.1): a hand-worked case of the reference,
// the broadcast sums, the views check_grads accepts and refuses, and the
// optimized backend against the reference on every target, every bias shape,
// with softcap and sinks, from the saved state, bitwise the same at 1, 2 and
// 3 threads and at small tile geometries.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "support/tandem_test_support.hpp"
#include "tandem/reference/attention.hpp"
#include "tandem/reference/backend.hpp"
#include "tandem/tandem.hpp"

#ifdef TANDEM_HAVE_OPTIMIZED
#include "tandem/optimized/backend.hpp"
#endif

namespace {

namespace test = tandem::test;
using tandem::AttentionGrads;
using tandem::AttentionParams;
using tandem::AttentionPlan;
using tandem::Layout;
using tandem::MaskKind;
using Vec = std::vector<float>;
using Case = test::AttentionCase<float>;

constexpr float kInf = std::numeric_limits<float>::infinity();

/// A bias call [Bb, Hb, Sq, Sk] with random q, k, v, dout and bias (one key
/// of the first row hidden), softcap c and sinks when asked.
Case bias_case(std::int64_t B, std::int64_t Sq, std::int64_t Sk, std::int64_t H, std::int64_t Hkv,
               std::int64_t D, std::int64_t Bb, std::int64_t Hb, double softcap = 0.0,
               bool sinks = false, unsigned seed = 1) {
  AttentionParams p = test::attention_params(B, Sq, Sk, H, Hkv, D, 0, Layout::bshd, MaskKind::bias);
  p.bias_batch = Bb;
  p.bias_heads = Hb;
  p.softcap = softcap;
  p.sinks = sinks;
  Case c(p);
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.5f, 1.5f);
  for (auto* t : {&c.q, &c.k, &c.v, &c.dout, &c.mask, &c.sinks}) {
    for (float& x : *t) x = dist(gen);
  }
  if (Sk > 1) c.mask[1] = -kInf;
  return c;
}

/// dbias (and dq) of a backend's one-call backward.
Vec dbias_of(const tandem::Backend& be, const Case& c, Vec* dq = nullptr) {
  Vec db(static_cast<std::size_t>(c.plan.mask_size()), 7.0f);
  Vec q_grad(dq != nullptr ? static_cast<std::size_t>(c.plan.dq.extent) : 0);
  AttentionGrads<float> g;
  g.dq = q_grad;
  g.dbias = db;
  be.attention_backward(c.plan, c.inputs(), c.dout, g);
  if (dq != nullptr) *dq = q_grad;
  return db;
}

TEST(AttentionDbiasReference, OneQueryTwoKeysByHand) {
  // s_j = scale·q·k_j + bias_j; p = softmax(s); dp_j = dO·v_j; delta = dO·o;
  // dbias_j = p_j (dp_j − delta)
  Case c = bias_case(1, 1, 2, 1, 1, 1, 1, 1);
  c.q = {1.0f};
  c.k = {0.5f, -1.0f};
  c.v = {2.0f, -3.0f};
  c.dout = {0.25f};
  c.mask = {0.0f, 1.0f};
  const double s0 = 0.5, s1 = -1.0 + 1.0;
  const double p0 = std::exp(s0) / (std::exp(s0) + std::exp(s1)), p1 = 1 - p0;
  const double o = p0 * 2.0 + p1 * -3.0, delta = 0.25 * o;
  const Vec db = dbias_of(tandem::reference::backend(), c);
  EXPECT_NEAR(db[0], p0 * (0.25 * 2.0 - delta), 1e-6);
  EXPECT_NEAR(db[1], p1 * (0.25 * -3.0 - delta), 1e-6);
  EXPECT_NEAR(db[0] + db[1], 0.0, 1e-6);  // each row of ds sums to zero
}

TEST(AttentionDbiasReference, HiddenKeyAndSoftcapTakeNoCapFactor) {
  // the bias enters after the cap: dbias is ds, not ds·(1 − tanh²)
  const Case capped = bias_case(1, 3, 4, 2, 1, 4, 1, 2, 0.7, true);
  const Vec db = dbias_of(tandem::reference::backend(), capped);
  EXPECT_EQ(db[1], 0.0f);  // the hidden key
  std::vector<double> q(capped.q.begin(), capped.q.end()), k(capped.k.begin(), capped.k.end()),
      v(capped.v.begin(), capped.v.end()), dout(capped.dout.begin(), capped.dout.end()),
      sinks(capped.sinks.begin(), capped.sinks.end());
  tandem::AttentionInputs<double> in{q, k, v, capped.mask};
  in.sinks = sinks;
  // a central difference of <dO, O> in one bias element agrees with dbias
  const auto loss = [&](std::int64_t at, double t) {
    std::vector<double> step(capped.mask.size(), 0.0), out(capped.plan.o.extent);
    step[static_cast<std::size_t>(at)] = t;
    tandem::reference::attention_forward<double, double>(capped.plan, in, out, {}, step);
    double l = 0;
    for (std::size_t e = 0; e < out.size(); ++e) l += out[e] * dout[e];
    return l;
  };
  for (std::int64_t at : {0, 2, 5, 13}) {
    const double h = 1e-5, fd = (loss(at, h) - loss(at, -h)) / (2 * h);
    EXPECT_NEAR(db[static_cast<std::size_t>(at)], fd, 1e-5) << "element " << at;
  }
}

TEST(AttentionDbiasReference, BroadcastBiasSumsTheFullGradient) {
  const Case one = bias_case(2, 3, 5, 3, 3, 4, 1, 1, 0.0, false, 5);
  Case full = bias_case(2, 3, 5, 3, 3, 4, 2, 3, 0.0, false, 5);
  full.q = one.q;
  full.k = one.k;
  full.v = one.v;
  full.dout = one.dout;
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t h = 0; h < 3; ++h)
      for (std::int64_t i = 0; i < 3; ++i)
        for (std::int64_t j = 0; j < 5; ++j)
          full.mask[full.plan.mask_row(b, h, i) + j] = one.mask[one.plan.mask_row(b, h, i) + j];
  const tandem::Backend ref = tandem::reference::backend();
  const Vec db1 = dbias_of(ref, one), dbf = dbias_of(ref, full);
  for (std::int64_t i = 0; i < 3; ++i) {
    for (std::int64_t j = 0; j < 5; ++j) {
      double sum = 0;
      for (std::int64_t bh = 0; bh < 6; ++bh) sum += dbf[(bh * 3 + i) * 5 + j];
      EXPECT_NEAR(db1[i * 5 + j], sum, 1e-5) << i << ", " << j;
    }
  }
}

TEST(AttentionDbiasValidation, ViewsOfTheWrongSizeOrPlanAreRefused) {
  const Case c = bias_case(2, 3, 4, 2, 2, 4, 1, 2);
  const tandem::Backend ref = tandem::reference::backend();
  Vec small(static_cast<std::size_t>(c.plan.mask_size() - 1));
  AttentionGrads<float> g;
  g.dbias = small;
  test::expect_error([&] { ref.attention_backward(c.plan, c.inputs(), c.dout, g); }, "dbias.size()",
                     {"must be 24"});
  // a plan without a bias has no dbias
  const Case none(test::attention_params(1, 2, 2, 1, 1, 2));
  Vec db(4);
  AttentionGrads<float> h;
  h.dbias = db;
  test::expect_error([&] { ref.attention_backward(none.plan, none.inputs(), none.dout, h); },
                     "dbias", {"only a bias mask has a gradient (mask is none)"});
  // dbias alone is a valid request
  Vec alone(static_cast<std::size_t>(c.plan.mask_size()));
  g.dbias = alone;
  EXPECT_NO_THROW(ref.attention_backward(c.plan, c.inputs(), c.dout, g));
}

#ifdef TANDEM_HAVE_OPTIMIZED
namespace opt = tandem::optimized;

/// The shapes the optimized tests run: every bias shape, GQA, softcap and
/// sinks, enough queries and keys for several blocks and tiles.
std::vector<Case> optimized_cases() {
  return {bias_case(2, 7, 9, 4, 2, 8, 2, 4, 0.0, false, 1),
          bias_case(2, 7, 9, 4, 2, 8, 1, 1, 0.0, false, 2),
          bias_case(3, 5, 13, 2, 1, 6, 1, 2, 5.0, false, 3),
          bias_case(2, 11, 6, 3, 3, 5, 2, 1, 0.0, true, 4),
          bias_case(1, 1, 70, 2, 2, 16, 1, 2, 2.0, true, 5)};
}

TEST(AttentionDbiasOptimized, AgreesWithTheReferenceOnEveryTarget) {
  const tandem::Backend ref = tandem::reference::backend();
  for (const std::int64_t target : opt::supported_targets()) {
    opt::force_target(target);
    const tandem::Backend be = opt::backend(opt::Options{2});
    for (const Case& c : optimized_cases()) {
      Vec dq, dq_ref;
      const Vec got = dbias_of(be, c, &dq), want = dbias_of(ref, c, &dq_ref);
      EXPECT_TRUE(test::close(got, want, 2e-5, 2e-5))
          << opt::target_name(target) << " " << c.plan.describe();
      EXPECT_TRUE(test::close(dq, dq_ref, 2e-5, 2e-5)) << c.plan.describe();
    }
  }
  opt::force_target(0);
}

TEST(AttentionDbiasOptimized, SavedStateGivesTheOneCallsDbias) {
  const tandem::Backend be = opt::backend(opt::Options{2});
  for (const Case& c : optimized_cases()) {
    Vec out(static_cast<std::size_t>(c.plan.o.extent)), lse(c.plan.lse_size());
    be.attention_forward_lse(c.plan, c.inputs(), out, lse);
    Vec db(static_cast<std::size_t>(c.plan.mask_size()));
    AttentionGrads<float> g;
    g.dbias = db;
    be.attention_backward_saved(c.plan, c.inputs(), {out, lse}, c.dout, g);
    EXPECT_TRUE(test::close(db, dbias_of(be, c), 2e-5, 2e-5)) << c.plan.describe();
  }
}

TEST(AttentionDbiasOptimized, BitwiseTheSameAtAnyThreadCountAndQueryParts) {
  opt::Geometry small;
  small.key_block = 3;
  small.edge_block = 2;
  small.rows_per_tile = 5;
  small.rows_per_tile_banded = 3;
  small.backward_query_parts = 3;
  for (const opt::Geometry& geo : {opt::Geometry{}, small}) {
    for (const Case& c : optimized_cases()) {
      const Vec one = dbias_of(opt::backend(opt::Options{1, geo}), c);
      for (int threads : {2, 3}) {
        EXPECT_TRUE(test::bitwise(one, dbias_of(opt::backend(opt::Options{threads, geo}), c)))
            << threads << " threads, " << c.plan.describe();
      }
    }
  }
}
#endif

}  // namespace
