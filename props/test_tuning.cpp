// SPDX-License-Identifier: Apache-2.0
// A tuning changes speed, never bits (SPEC §11): over random tunings drawn
// from the tuner's space (optimized::tuning_space) and random calls, the
// optimized backend with the tuning writes the bits it writes without one:
// forward (prefill and decode; float, bf16, f16), forward with lse,
// backward, at every supported target. Two broken spaces (a field placed
// where it reorders float operations) must be rejected by the same property.
#include <gtest/gtest.h>
#include <rapidcheck.h>

#include <functional>
#include <memory>

#include "cases.hpp"
#include "lowp.hpp"
#include "support.hpp"
#include "tandem/optimized/backend.hpp"
#include "tandem/optimized/tuning.hpp"

namespace tandem::props {
namespace {

using optimized::ShapeKind;

/// The values a space offers for rows_per_tile of calls of kind `kind`.
using Space = std::function<std::vector<i64>(ShapeKind)>;

/// The tuner's own space.
std::vector<i64> tuner_space(ShapeKind kind) {
  return optimized::tuning_space(kind).rows_per_tile;
}
/// Broken: tiles of fewer than 64 rows, where a prefill tile can become a
/// decode tile (one vector of rows) and so change algorithm.
std::vector<i64> space_small_tiles(ShapeKind kind) {
  return kind == ShapeKind::prefill ? std::vector<i64>{1, 2, 3, 5, 8, 12, 17, 33}
                                    : tuner_space(kind);
}
/// Broken: rows_per_tile for the backward too, whose dK/dV sums over tiles.
std::vector<i64> space_backward_tiles(ShapeKind kind) {
  return kind == ShapeKind::prefill || kind == ShapeKind::backward
             ? optimized::tuning_space(ShapeKind::prefill).rows_per_tile
             : tuner_space(kind);
}

/// A dense call long enough to take several tiles of 64 to 1024 rows.
rc::Gen<AttentionCase> gen_long() {
  return rc::gen::exec([] {
    AttentionCase c;
    AttentionParams& p = c.params;
    p.B = *rc::gen::inRange<i64>(1, 3);
    p.Hkv = *rc::gen::inRange<i64>(1, 3);
    p.H = p.Hkv * *rc::gen::element<i64>(1, 2, 4);
    p.Sq = *rc::gen::inRange<i64>(1, 700);
    p.Sk = *rc::gen::inRange<i64>(1, 160);
    p.D = *rc::gen::element<i64>(8, 16, 33, 64);
    p.Dv = *rc::gen::element(p.D, i64{16});
    p.layout = *rc::gen::element(Layout::bshd, Layout::bhsd);
    p.mask = *rc::gen::element(MaskKind::none, MaskKind::none, MaskKind::causal,
                               MaskKind::sliding_window, MaskKind::key_padding);
    if (p.mask == MaskKind::sliding_window) p.window = *rc::gen::inRange<i64>(0, 100);
    if (*rc::gen::inRange(0, 4) == 0) p.softcap = 5.0;
    c.seed = *rc::gen::inRange<std::uint64_t>(0, 1u << 30);
    return c;
  });
}

/// A tuning of this CPU with a random value from `space` for every class of
/// `d`'s forward and backward calls (or none, for a class drawn out).
std::shared_ptr<const optimized::Tuning> gen_tuning(const Space& space, const AttentionPlan& plan) {
  auto t = std::make_shared<optimized::Tuning>();
  t->cpu = optimized::current_cpu();
  for (bool backward : {false, true}) {
    const optimized::ShapeClass cls = optimized::shape_class(plan, backward);
    const std::vector<i64> values = space(cls.kind);
    if (values.empty()) continue;
    optimized::TunedFields f;
    f.rows_per_tile = *rc::gen::elementOf(values);
    t->classes.push_back({cls, f});
  }
  return t;
}

/// The optimized backend at the default geometry, with `tuning` (null: none).
Backend backend_with(std::shared_ptr<const optimized::Tuning> tuning, int threads) {
  optimized::Options o(threads);
  o.tuning = std::move(tuning);
  o.tuning_from_environment = false;
  return optimized::backend(o);
}

/// Empty when the forward of `d` stored in T (SPEC §10: its default rounding
/// profile) gives the same bits on `a` and `b`, else what differs.
template <class T>
std::string same_bits_stored(const Backend& a, const Backend& b, const AttentionData& d,
                             const std::string& what) {
  const AttentionData ds = stored_as<T>(d);
  const std::vector<double> x = run_forward_t<T>(a.kernels<T>(), ds);
  const std::vector<double> y = run_forward_t<T>(b.kernels<T>(), ds);
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (std::bit_cast<std::uint64_t>(x[i]) != std::bit_cast<std::uint64_t>(y[i])) {
      return what + " out[" + std::to_string(i) + "] differs";
    }
  }
  return {};
}

/// Empty when forward (float, bf16, f16), forward with lse and backward (not
/// offered for a paged cache) of `d` give the same bits on `a` and `b`, else
/// what differs.
std::string same_bits_all(const Backend& a, const Backend& b, const AttentionData& d) {
  std::string m = bit_mismatch("out", run_forward(a, d), run_forward(b, d));
  if (!m.empty()) return m;
  m = same_bits_stored<bfloat16>(a, b, d, "bf16");
  if (m.empty()) m = same_bits_stored<float16>(a, b, d, "f16");
  if (!m.empty()) return m;
  const Saved sa = run_forward_lse(a, d), sb = run_forward_lse(b, d);
  m = bit_mismatch("lse", sa.lse, sb.lse);
  if (!m.empty() || d.plan.paged()) return m;
  const Grads ga = run_backward(a, d), gb = run_backward(b, d);
  for (const auto& [name, x, y] :
       {std::tuple{"dq", &ga.dq, &gb.dq}, std::tuple{"dk", &ga.dk, &gb.dk},
        std::tuple{"dv", &ga.dv, &gb.dv}}) {
    m = bit_mismatch(name, *x, *y);
    if (!m.empty()) return m;
  }
  return {};
}

/// Dispatch restricted to one target while it lives.
struct ForcedTarget {
  explicit ForcedTarget(std::int64_t target) { optimized::force_target(target); }
  ~ForcedTarget() { optimized::force_target(0); }
  ForcedTarget(const ForcedTarget&) = delete;
  ForcedTarget& operator=(const ForcedTarget&) = delete;
};

/// One case: a call (features sometimes, or a long dense one), a target, a
/// thread count and a tuning from `space` for the call's classes.
void tuned_case(const Space& space) {
  const AttentionCase c = *rc::gen::weightedOneOf<AttentionCase>(
      {{1, gen_attention(AttentionGen{}.with_features())}, {2, gen_long()}});
  const AttentionData d = make_data(c);
  const std::int64_t target = *rc::gen::elementOf(optimized::supported_targets());
  const auto tuning = gen_tuning(space, d.plan);
  const int threads = *rc::gen::inRange(1, 4);
  RC_TAG(optimized::target_name(target));
  const ForcedTarget forced(target);
  TANDEM_REQUIRE_EMPTY(
      same_bits_all(backend_with(nullptr, threads), backend_with(tuning, threads), d));
}

/// The property over `space` for `cases` cases: empty when it holds, else
/// the failure (`quiet`: a fixed seed, no shrinking, nothing printed).
std::string tuned_bits_unchanged(const Space& space, int cases, bool quiet) {
  const Property p{"tuned_geometry_keeps_bits", "determinism", cases,
                   [space](const Subject&) { tuned_case(space); }};
  Subject s;
  s.name = "optimized_tuned";
  return run_property(p, s, case_count(p), quiet,
                      quiet ? std::optional<std::uint64_t>(7) : std::nullopt);
}

TEST(Tuning, TunedGeometryKeepsEveryBit) {
  const std::string m = tuned_bits_unchanged(tuner_space, 120, false);
  EXPECT_TRUE(m.empty()) << m;
}

// The broken spaces fail by bits that differ (not by an error of the call).
TEST(Tuning, PropertyRejectsTilesBelowSixtyFourRows) {
  const std::string m = tuned_bits_unchanged(space_small_tiles, 300, true);
  EXPECT_NE(m.find("] differs"), std::string::npos) << m;
}

TEST(Tuning, PropertyRejectsTiledBackward) {
  const std::string m = tuned_bits_unchanged(space_backward_tiles, 300, true);
  EXPECT_NE(m.find("] differs"), std::string::npos) << m;
}

}  // namespace
}  // namespace tandem::props
