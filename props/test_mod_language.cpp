// SPDX-License-Identifier: Apache-2.0
// Properties of the mod language (SPEC §13) over random well-typed programs
// (mod_gen.hpp): the builder's type rules are the spec's table; the ranges
// check_mod derives hold every value a program takes over its domain (so an
// accepted index never leaves its tensor); differentiate() agrees with
// complex-step derivatives of the reference interpreter, for the score and
// every element of a captured tensor. Each property rejects its broken
// fixture: ranges one too narrow for %, a gradient that drops the mod's
// derivative, and one that adds a tensor's gradient one element off.
#include <gtest/gtest.h>
#include <rapidcheck.h>

#include <cmath>
#include <complex>
#include <functional>
#include <optional>

#include "mod_gen.hpp"
#include "support.hpp"
#include "tandem/reference/flex_mod.hpp"

namespace tandem::props {
namespace {

using C = std::complex<double>;

// ------------------------------------------------------------ type rules

/// SPEC §13.1's table, written out here: the result type of op on operands
/// of types x, y, z, or nothing when the op refuses them.
std::optional<ModType> spec_type(ModOp op, ModType x, ModType y, ModType z) {
  using T = ModType;
  const bool numeric2 = x == y && x != T::boolean;
  switch (op) {
    case ModOp::add:
    case ModOp::sub:
    case ModOp::mul:
    case ModOp::minimum:
    case ModOp::maximum:
      return numeric2 ? std::optional(x) : std::nullopt;
    case ModOp::div:
      return x == T::real && y == T::real ? std::optional(T::real) : std::nullopt;
    case ModOp::floor_div:
    case ModOp::mod:
      return x == T::integer && y == T::integer ? std::optional(T::integer) : std::nullopt;
    case ModOp::neg:
    case ModOp::abs:
      return x != T::boolean ? std::optional(x) : std::nullopt;
    case ModOp::exp:
    case ModOp::log:
    case ModOp::tanh:
    case ModOp::sigmoid:
      return x == T::real ? std::optional(T::real) : std::nullopt;
    case ModOp::to_real:
      return x != T::real ? std::optional(T::real) : std::nullopt;
    case ModOp::lt:
    case ModOp::le:
    case ModOp::gt:
    case ModOp::ge:
      return numeric2 ? std::optional(T::boolean) : std::nullopt;
    case ModOp::eq:
    case ModOp::ne:
      return x == y ? std::optional(T::boolean) : std::nullopt;
    case ModOp::logical_and:
    case ModOp::logical_or:
      return x == T::boolean && y == T::boolean ? std::optional(T::boolean) : std::nullopt;
    case ModOp::logical_not:
      return x == T::boolean ? std::optional(T::boolean) : std::nullopt;
    case ModOp::where:
      return x == T::boolean && y == z ? std::optional(y) : std::nullopt;
    default:
      return std::nullopt;
  }
}

void type_rules_case() {
  const auto op = static_cast<ModOp>(*rc::gen::inRange(7, 32));  // every operation, no leaves
  const int arity = op == ModOp::where ? 3
                    : (op == ModOp::neg || op == ModOp::abs || op == ModOp::exp ||
                       op == ModOp::log || op == ModOp::tanh || op == ModOp::sigmoid ||
                       op == ModOp::to_real || op == ModOp::logical_not)
                        ? 1
                        : 2;
  ModProgram m;
  const std::int32_t of_type[] = {m.real(1.5).id, m.integer(3).id, m.boolean(true).id};
  ModType t[3] = {ModType::real, ModType::real, ModType::real};
  std::int32_t a[3] = {-1, -1, -1};
  for (int i = 0; i < arity; ++i) {
    const int k = *rc::gen::inRange(0, 3);
    t[i] = static_cast<ModType>(k);
    a[i] = of_type[k];
  }
  RC_TAG(to_string(op));
  const auto want = spec_type(op, t[0], t[1], t[2]);
  ModNode n;
  n.op = op;
  n.arg = {a[0], a[1], a[2]};
  std::optional<ModType> got;
  try {
    got = m.node(m.add(n)).type;
  } catch (const Error&) {
  }
  RC_ASSERT(got == want);
}

// ------------------------------------------------------------ ranges

/// The ranges a plan's check derives for c's program (nothing when it
/// refuses the program); the broken fixture narrows every `%` by one.
using RangesOf =
    std::function<std::optional<std::vector<ModRange>>(const ModProgram&, const ModCase&)>;

std::optional<std::vector<ModRange>> check_ranges(const ModProgram& m, const ModCase& c) {
  try {
    return check_mod(m, c.role, c.domain, "mod");
  } catch (const Error&) {
    return std::nullopt;
  }
}

std::optional<std::vector<ModRange>> ranges_mod_too_narrow(const ModProgram& m, const ModCase& c) {
  auto r = check_ranges(m, c);
  if (!r) return r;
  for (std::size_t id = 0; id < m.nodes().size(); ++id) {
    if (m.nodes()[id].op == ModOp::mod && (*r)[id].hi > (*r)[id].lo) --(*r)[id].hi;
  }
  return r;
}

/// Captured values for c's tensors: t real `[H, 8]`, ids in [0, kModIdsHi].
template <class S>
struct CaseTensors {
  std::vector<S> t;
  std::vector<std::int64_t> ids;
  explicit CaseTensors(const ModCase& c) {
    const auto tv = *rc::gen::container<std::vector<int>>(
        static_cast<std::size_t>(c.domain.H * kModTableWidth), rc::gen::inRange(-8, 9));
    for (const int v : tv) t.push_back(S(0.25 * v));
    const auto iv = *rc::gen::container<std::vector<int>>(static_cast<std::size_t>(c.domain.Sk),
                                                          rc::gen::inRange(0, int(kModIdsHi) + 1));
    for (const int v : iv) ids.push_back(v);
  }
  reference::ModTensorsOf<S> views() const { return {{t, {}}, {Indices{}, ids}}; }
};

void ranges_case(const RangesOf& ranges_of) {
  const ModRole role = *rc::gen::element(ModRole::score_mod, ModRole::mask_mod);
  const ModCase c = *gen_mod_case(role);
  const ModProgram m = build_mod(c);
  const auto ranges = ranges_of(m, c);
  RC_TAG(ranges ? "accepted" : "refused");
  if (!ranges) return;
  const CaseTensors<double> tensors(c);
  std::vector<reference::ModValueAt<double>> val;
  const ModDomain& d = c.domain;
  for (std::int64_t b = 0; b < d.B; ++b) {
    for (std::int64_t h = 0; h < d.H; ++h) {
      for (std::int64_t i = 0; i < d.Sq; ++i) {
        for (std::int64_t j = 0; j < d.Sk; ++j) {
          reference::evaluate_mod(m, tensors.views(), {0.75, b, h, i, j}, val);
          for (std::size_t id = 0; id < val.size(); ++id) {
            if (m.nodes()[id].type == ModType::real) continue;
            const auto v = val[id].integer;
            const ModRange r = (*ranges)[id];
            if (!(r.lo <= v && v <= r.hi))
              RC_FAIL(describe(c) + "\nnode %" + std::to_string(id) + " = " +
                      m.render(static_cast<std::int32_t>(id)) + " takes " + std::to_string(v) +
                      " at (b, h, q, kv) = (" + std::to_string(b) + ", " + std::to_string(h) +
                      ", " + std::to_string(i) + ", " + std::to_string(j) + "), outside [" +
                      std::to_string(r.lo) + ", " + std::to_string(r.hi) + "]");
          }
        }
      }
    }
  }
}

// ------------------------------------------------------------ the derivative

/// How a backend uses a ModGradient; the broken fixtures misuse it.
enum class GradientUse { correct, drops_mod_derivative, tensor_index_off_by_one };

void gradient_case(GradientUse use) {
  const ModCase c = *gen_mod_case(ModRole::score_mod);
  const ModProgram f = build_mod(c);
  RC_PRE(check_ranges(f, c).has_value());
  const ModGradient g = differentiate(f);
  const CaseTensors<double> tensors(c);
  const std::vector<C> tc(tensors.t.begin(), tensors.t.end());
  const double eps = 1e-30;
  const reference::ModPoint<double> x{*rc::gen::inRange(-12, 13) * 0.25 + 0.1,
                                      *rc::gen::inRange<std::int64_t>(0, c.domain.B),
                                      *rc::gen::inRange<std::int64_t>(0, c.domain.H),
                                      *rc::gen::inRange<std::int64_t>(0, c.domain.Sq),
                                      *rc::gen::inRange<std::int64_t>(0, c.domain.Sk)};
  std::vector<reference::ModValueAt<double>> val;
  reference::evaluate_mod(g.program, tensors.views(), x, val);
  const auto d = [&](std::int32_t id) { return id < 0 ? 0.0 : val[std::size_t(id)].real; };
  const auto step = [&](const std::vector<C>& t, C score) {
    std::vector<reference::ModValueAt<C>> v;
    const reference::ModTensorsOf<C> views{{t, {}}, {Indices{}, tensors.ids}};
    reference::evaluate_mod(f, views, {score, x.b, x.h, x.q, x.kv}, v);
    return v[std::size_t(f.result())].real.imag() / eps;
  };
  const auto near = [](double got, double want) {
    return std::isfinite(want) && std::abs(got - want) <= 1e-9 * (1 + std::abs(want));
  };
  // ∂f/∂score
  const double ds = step(tc, C(x.score, eps));
  RC_PRE(std::isfinite(ds));
  const double got_ds = use == GradientUse::drops_mod_derivative ? 1.0 : d(g.d_score);
  if (!(near(got_ds, ds)))
    RC_FAIL(describe(c) + "\nd/dscore " + std::to_string(got_ds) + ", complex step " +
            std::to_string(ds));
  // ∂f/∂t[e], summed over the loads that read e
  std::vector<double> dt(tensors.t.size(), 0.0);
  for (const auto& load : g.loads) {
    auto e = reference::mod_offset(g.program, g.program.node(load.node), val);
    if (use == GradientUse::tensor_index_off_by_one) e = (e + 1) % std::int64_t(dt.size());
    dt[std::size_t(e)] += d(load.d);
  }
  for (std::size_t e = 0; e < dt.size(); ++e) {
    std::vector<C> te = tc;
    te[e] += C(0, eps);
    const double want = step(te, C(x.score));
    if (!(near(dt[e], want)))
      RC_FAIL(describe(c) + "\nd/dt[" + std::to_string(e) + "] " + std::to_string(dt[e]) +
              ", complex step " + std::to_string(want));
  }
}

TEST(ModLanguage, TypeRulesFollowTheSpecTable) {
  const std::string m = run_semantic("mod_type_rules_follow_spec", 400, type_rules_case, false);
  EXPECT_TRUE(m.empty()) << m;
}

TEST(ModLanguage, RangesHoldEveryValue) {
  const std::string m = run_semantic(
      "mod_ranges_hold_every_value", 300, [] { ranges_case(check_ranges); }, false);
  EXPECT_TRUE(m.empty()) << m;
}

TEST(ModLanguage, GradientAgreesWithComplexSteps) {
  const std::string m = run_semantic(
      "mod_gradient_agrees_with_complex_steps", 300, [] { gradient_case(GradientUse::correct); },
      false);
  EXPECT_TRUE(m.empty()) << m;
}

// The broken fixtures: each property must reject its one.
TEST(ModLanguage, RangesPropertyRejectsARemainderRangeOneTooNarrow) {
  const std::string m = run_semantic(
      "mod_ranges_hold_every_value", 600, [] { ranges_case(ranges_mod_too_narrow); }, true);
  EXPECT_NE(m.find("outside ["), std::string::npos) << m;
}

TEST(ModLanguage, GradientPropertyRejectsADroppedModDerivative) {
  const std::string m = run_semantic(
      "mod_gradient_agrees_with_complex_steps", 300,
      [] { gradient_case(GradientUse::drops_mod_derivative); }, true);
  EXPECT_NE(m.find("d/dscore"), std::string::npos) << m;
}

TEST(ModLanguage, GradientPropertyRejectsATensorGradientOneElementOff) {
  const std::string m = run_semantic(
      "mod_gradient_agrees_with_complex_steps", 300,
      [] { gradient_case(GradientUse::tensor_index_off_by_one); }, true);
  EXPECT_NE(m.find("d/dt["), std::string::npos) << m;
}

}  // namespace
}  // namespace tandem::props
