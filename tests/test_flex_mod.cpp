// SPDX-License-Identifier: Apache-2.0
// The mod language of SPEC §13: the builder's type rules, check_mod's
// interval checks at their edges, the reference interpreter's integer
// semantics, and differentiate() against complex-step derivatives.
#include <gtest/gtest.h>

#include <cmath>
#include <complex>
#include <random>

#include "support/tandem_test_support.hpp"
#include "tandem/flex_mod.hpp"
#include "tandem/reference/flex_mod.hpp"

namespace tandem {
namespace {

using test::expect_error;
using C = std::complex<double>;

TEST(FlexModBuilder, MixedArithmeticPromotesTheIntegerAndRendersInfix) {
  ModProgram m;
  const ModValue s = m.score();
  m.set_result(s + (m.q_idx() - m.kv_idx()));
  EXPECT_EQ(m.render(m.result()), "(score + to_real((q_idx - kv_idx)))");
  EXPECT_EQ(m.node(m.result()).type, ModType::real);
}

TEST(FlexModBuilder, AnIdenticalNodeIsMadeOnce) {
  ModProgram m;
  const ModValue a = m.q_idx() - m.kv_idx();
  const ModValue b = m.q_idx() - m.kv_idx();
  EXPECT_EQ(a.id, b.id);
  EXPECT_EQ(m.nodes().size(), 3U);
}

TEST(FlexModBuilder, IllTypedOperationsAreErrorsNamingTheOperation) {
  ModProgram m;
  expect_error([&] { m.apply(ModOp::floor_div, m.score(), m.score()); }, "mod",
               {"floor_div", "real and real", "wants integers"});
  expect_error([&] { m.apply(ModOp::add, m.score(), m.q_idx() < m.kv_idx()); }, "mod",
               {"add", "real and boolean"});
  expect_error([&] { m.apply(ModOp::exp, m.q_idx()); }, "mod", {"exp", "wants a real"});
  expect_error([&] { m.apply(ModOp::where, m.score(), m.score(), m.score()); }, "mod",
               {"where", "boolean condition"});
  expect_error([&] { m.apply(ModOp::add, 0, 7); }, "mod.add", {"earlier node"});
  const std::int32_t t = m.capture({"bias", {4, 4}, ModType::real});
  expect_error([&] { m.load(t, {m.h()}); }, "mod.load", {"bias", "earlier node"});
  expect_error([&] { m.load(t, {m.h(), m.score()}); }, "mod.load", {"must be an integer"});
  expect_error([&] { m.capture({"ids", {3}, ModType::integer, 5, 2}); }, "ids.lo", {"<= hi"});
  expect_error([&] { m.capture({"x", {3, 0}, ModType::real}); }, "x.shape", {">= 1"});
  expect_error([&] { m.real(std::nan("")); }, "mod", {"NaN"});
}

TEST(FlexModCheck, RolesFixTheResultTypeAndWhatAMaskReads) {
  const ModDomain d{1, 2, 8, 8};
  ModProgram mask;
  mask.set_result(mask.score() > mask.real(0.0));
  expect_error([&] { check_mod(mask, ModRole::mask_mod, d, "mask_mod"); }, "mask_mod",
               {"must not read score"});
  ModProgram score;
  score.set_result(score.q_idx() >= score.kv_idx());
  expect_error([&] { check_mod(score, ModRole::score_mod, d, "score_mod"); }, "score_mod",
               {"must return a real score"});
  expect_error(
      [&] {
        check_mod(score, ModRole::mask_mod, ModDomain{1, 1, 0, 8}, "mask_mod");
      },
      "mask_mod", {"Sq and Sk >= 1"});
  EXPECT_NO_THROW(check_mod(score, ModRole::mask_mod, d, "mask_mod"));
}

/// score + bias[h, q_idx − kv_idx + offset] with bias [H, width].
ModProgram relative_bias(std::int64_t H, std::int64_t width, std::int64_t offset) {
  ModProgram m;
  const auto t = m.capture({"bias", {H, width}, ModType::real});
  m.set_result(m.score() + m.load(t, {m.h(), m.q_idx() - m.kv_idx() + m.integer(offset)}));
  return m;
}

TEST(FlexModCheck, AnIndexIsCheckedAtItsEdgeAndOnePast) {
  const ModDomain d{2, 4, 6, 9};  // q − kv takes [−8, 5]
  EXPECT_NO_THROW(check_mod(relative_bias(4, 14, 8), ModRole::score_mod, d, "score_mod"));
  expect_error([&] { check_mod(relative_bias(4, 13, 8), ModRole::score_mod, d, "score_mod"); },
               "score_mod", {"bias[h, ((q_idx - kv_idx) + 8)]", "[0, 13]", "extent 13"});
  expect_error([&] { check_mod(relative_bias(4, 14, 7), ModRole::score_mod, d, "score_mod"); },
               "score_mod", {"[-1, 12]"});
  expect_error([&] { check_mod(relative_bias(3, 14, 8), ModRole::score_mod, d, "score_mod"); },
               "score_mod", {"index 0 (h) takes [0, 3]", "extent 3"});
}

TEST(FlexModCheck, ClampedIndicesAreBoundedByTheirClamp) {
  for (const std::int64_t extent : {16, 17}) {
    ModProgram m;
    const auto t = m.capture({"rel", {extent}, ModType::real});
    const ModValue r =
        m.apply(ModOp::minimum, m.apply(ModOp::maximum, m.q_idx() - m.kv_idx(), m.integer(-8)),
                m.integer(8));
    m.set_result(m.score() + m.load(t, {r + m.integer(8)}));
    const auto check = [&] { check_mod(m, ModRole::score_mod, {1, 1, 4096, 4096}, "score_mod"); };
    if (extent == 17) {
      EXPECT_NO_THROW(check());
    } else {
      expect_error(check, "score_mod", {"[0, 16]"});
    }
  }
}

TEST(FlexModCheck, IntegerTensorsAreBoundedByTheirDeclaredValues) {
  for (const std::int64_t hi : {3, 4}) {
    ModProgram m;
    const auto doc = m.capture({"doc", {9}, ModType::integer, 0, hi});
    const auto w = m.capture({"weight", {4}, ModType::real});
    m.set_result(m.score() * m.load(w, {m.load(doc, {m.kv_idx()})}));
    const auto check = [&] { check_mod(m, ModRole::score_mod, {1, 1, 9, 9}, "score_mod"); };
    if (hi == 3) {
      EXPECT_NO_THROW(check());
    } else {
      expect_error(check, "score_mod", {"weight[doc[kv_idx]]", "[0, 4]"});
    }
  }
}

TEST(FlexModCheck, DivisorsThatCanBeZeroAndOverflowsAreErrors) {
  const ModDomain d{1, 1, 128, 128};
  ModProgram by_kv;
  by_kv.set_result(by_kv.apply(ModOp::floor_div, by_kv.q_idx(), by_kv.kv_idx()) ==
                   by_kv.integer(0));
  expect_error([&] { check_mod(by_kv, ModRole::mask_mod, d, "mask_mod"); }, "mask_mod",
               {"divides by kv_idx", "[0, 127]"});
  ModProgram by_kv1;
  by_kv1.set_result(by_kv1.apply(ModOp::mod, by_kv1.q_idx(), by_kv1.kv_idx() + by_kv1.integer(1)) ==
                    by_kv1.integer(0));
  EXPECT_NO_THROW(check_mod(by_kv1, ModRole::mask_mod, d, "mask_mod"));
  ModProgram big;
  big.set_result(big.q_idx() * big.integer(std::int64_t{1} << 62) > big.integer(0));
  expect_error([&] { check_mod(big, ModRole::mask_mod, d, "mask_mod"); }, "mask_mod",
               {"overflow int64"});
}

TEST(FlexModCheck, FloorDivisionRangesAreTight) {
  ModProgram m;
  const ModValue blk = m.apply(ModOp::floor_div, m.q_idx() - m.kv_idx(), m.integer(64));
  const ModValue rem = m.apply(ModOp::mod, m.q_idx() - m.kv_idx(), m.integer(64));
  m.set_result(blk == rem);
  const auto r = check_mod(m, ModRole::mask_mod, {1, 1, 128, 200}, "mask_mod");
  EXPECT_EQ(r[static_cast<std::size_t>(blk.id)].lo, -4);  // (0 − 199) // 64
  EXPECT_EQ(r[static_cast<std::size_t>(blk.id)].hi, 1);   // 127 // 64
  EXPECT_EQ(r[static_cast<std::size_t>(rem.id)].lo, 0);
  EXPECT_EQ(r[static_cast<std::size_t>(rem.id)].hi, 63);
}

/// The value of `p`'s node `id` at a point, in S.
template <class S>
reference::ModValueAt<S> value_at(const ModProgram& p, std::int32_t id,
                                  const reference::ModTensorsOf<S>& t,
                                  const reference::ModPoint<S>& x) {
  std::vector<reference::ModValueAt<S>> val;
  reference::evaluate_mod(p, t, x, val);
  return val[static_cast<std::size_t>(id)];
}

TEST(FlexModEvaluate, IntegerDivisionAndRemainderRoundTowardMinusInfinity) {
  const std::int64_t cases[][4] = {{-7, 2, -4, 1}, {7, -2, -4, -1}, {7, 2, 3, 1}, {-8, 2, -4, 0}};
  for (const auto& c : cases) {
    ModProgram m;
    const ModValue q = m.apply(ModOp::floor_div, m.integer(c[0]), m.integer(c[1]));
    const ModValue r = m.apply(ModOp::mod, m.integer(c[0]), m.integer(c[1]));
    m.set_result(q);
    const reference::ModTensorsOf<double> none;
    EXPECT_EQ(value_at<double>(m, q.id, none, {}).integer, c[2]) << c[0] << " // " << c[1];
    EXPECT_EQ(value_at<double>(m, r.id, none, {}).integer, c[3]) << c[0] << " % " << c[1];
  }
}

/// score_mods whose gradients are checked: each reads score and the real
/// tensor "t" `[3, 5]` (values drawn per case).
std::vector<ModProgram> score_mods() {
  std::vector<ModProgram> mods;
  const auto make = [&](auto body) {
    ModProgram m;
    const auto t = m.capture({"t", {3, 5}, ModType::real});
    m.set_result(body(m, t));
    mods.push_back(std::move(m));
  };
  const auto rel = [](ModProgram& m) {  // clamp(q − kv, −2, 2) + 2
    return m.apply(ModOp::minimum, m.apply(ModOp::maximum, m.q_idx() - m.kv_idx(), m.integer(-2)),
                   m.integer(2)) +
           m.integer(2);
  };
  make([&](ModProgram& m, std::int32_t t) {  // softcap by t: c·tanh(s/c)
    const ModValue c = m.apply(ModOp::exp, m.load(t, {m.h(), m.integer(0)}));
    return c * m.apply(ModOp::tanh, m.score() / c);
  });
  make([&](ModProgram& m, std::int32_t t) {  // ALiBi with learned slopes
    return m.score() -
           m.load(t, {m.h(), m.integer(1)}) * m.apply(ModOp::abs, m.q_idx() - m.kv_idx());
  });
  make([&](ModProgram& m, std::int32_t t) {  // a clamped relative bias, read twice
    const ModValue b = m.load(t, {m.h(), rel(m)});
    return m.score() * b + b * b;
  });
  make([&](ModProgram& m, std::int32_t t) {  // softplus, sigmoid gate, log
    const ModValue x = m.score() * m.load(t, {m.h(), m.integer(3)});
    return m.apply(ModOp::log, m.real(1.0) + m.apply(ModOp::exp, x)) *
           m.apply(ModOp::sigmoid, m.load(t, {m.integer(2), rel(m)}) - m.score());
  });
  make([&](ModProgram& m, std::int32_t t) {  // where, maximum and division
    const ModValue b = m.load(t, {m.h(), m.integer(4)});
    const ModValue kept = m.apply(ModOp::maximum, m.score(), b) / (m.real(2.0) + b * b);
    return m.apply(ModOp::where, m.q_idx() >= m.kv_idx(), kept, -m.score());
  });
  return mods;
}

TEST(FlexModDifferentiate, TheGradientAgreesWithComplexSteps) {
  std::mt19937_64 rng(20261202);
  std::uniform_real_distribution<double> u(-1.5, 1.5);
  const double eps = 1e-30;
  int mod_index = 0;
  for (const ModProgram& f : score_mods()) {
    SCOPED_TRACE("mod " + std::to_string(mod_index++) + ": " + f.render(f.result()));
    ASSERT_NO_THROW(check_mod(f, ModRole::score_mod, {2, 3, 6, 6}, "score_mod"));
    const ModGradient g = differentiate(f);
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<double> t(15);
      for (auto& e : t) e = u(rng);
      const reference::ModPoint<double> x{u(rng), trial % 2, trial % 3, trial % 6, (trial * 7) % 6};
      reference::ModTensorsOf<double> tt{{t}, {Indices{}}};
      std::vector<reference::ModValueAt<double>> val;
      reference::evaluate_mod(g.program, tt, x, val);
      const auto d = [&](std::int32_t id) { return id < 0 ? 0.0 : val[std::size_t(id)].real; };
      // ∂f/∂score
      std::vector<C> tc(t.begin(), t.end());
      reference::ModTensorsOf<C> tz{{tc}, {Indices{}}};
      const reference::ModPoint<C> xs{C(x.score, eps), x.b, x.h, x.q, x.kv};
      const double ds = value_at<C>(f, f.result(), tz, xs).real.imag() / eps;
      EXPECT_NEAR(d(g.d_score), ds, 1e-12 * (1 + std::abs(ds)));
      // ∂f/∂t[e] = the sum of the loads that read element e
      std::vector<double> dt(15, 0.0);
      for (const auto& load : g.loads) {
        dt[std::size_t(reference::mod_offset(g.program, g.program.node(load.node), val))] +=
            d(load.d);
      }
      for (std::size_t e = 0; e < t.size(); ++e) {
        std::vector<C> te(t.begin(), t.end());
        te[e] += C(0, eps);
        reference::ModTensorsOf<C> ze{{te}, {Indices{}}};
        const reference::ModPoint<C> xe{C(x.score), x.b, x.h, x.q, x.kv};
        const double want = value_at<C>(f, f.result(), ze, xe).real.imag() / eps;
        EXPECT_NEAR(dt[e], want, 1e-12 * (1 + std::abs(want))) << "element " << e;
      }
    }
  }
}

TEST(FlexModDifferentiate, AModThatIgnoresTheScoreHasNoScoreDerivative) {
  ModProgram f;
  f.set_result(f.apply(ModOp::to_real, f.q_idx() - f.kv_idx()));
  const ModGradient g = differentiate(f);
  EXPECT_EQ(g.d_score, -1);
  EXPECT_TRUE(g.loads.empty());
  ModProgram bad;
  bad.set_result(bad.q_idx() < bad.kv_idx());
  expect_error([&] { differentiate(bad); }, "score_mod", {"must return a real"});
}

}  // namespace
}  // namespace tandem
