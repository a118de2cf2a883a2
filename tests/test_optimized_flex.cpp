// SPDX-License-Identifier: Apache-2.0
// The optimized FlexAttention (SPEC §13.4) against the reference: forward
// (out, lse) and backward (dq, dk, dv and the captured tensors' gradients)
// for causal, sliding-window, ALiBi (captured slopes), softcap, document
// (an integer tensor) and a mixed mod, each without and with a block mask
// made by reference::create_block_mask; GQA, Dv != D, Sq != Sk, lengths
// that are not multiples of the blocks, a fully masked row; on every
// Highway target, with 1, 2 and 3 threads bitwise equal. The tolerance is
// SPEC §13.5's bound, computed from the case's sizes and magnitudes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "support/tandem_test_support.hpp"
#include "tandem/flex_plan.hpp"
#include "tandem/optimized/backend.hpp"
#include "tandem/reference/backend.hpp"
#include "tandem/reference/flex.hpp"
#include "tandem/reference/flex_bound.hpp"

namespace tandem {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

/// One mod of the tests: sizes and mods, the captured tensors' data, and
/// the constants of SPEC §13.5's bound that depend on the mod: L ≥ |∂t/∂s|,
/// L_T ≥ |∂t/∂T[e]|, and tau ≥ |every real value the score_mod computes|
/// beyond |s| itself.
struct ModCase {
  ModCase(std::string n, FlexParams p) : name(std::move(n)), params(std::move(p)) {}
  std::string name;
  FlexParams params;
  std::vector<std::vector<float>> score_real, mask_real;       // one per tensor (or empty)
  std::vector<std::vector<std::int32_t>> score_int, mask_int;  // one per tensor (or empty)
  double L = 1.0, L_T = 1.0, tau = 0.0;
  std::int64_t q_block = 16, kv_block = 32;  // of the created block mask
};

FlexParams sizes(std::int64_t B, std::int64_t H, std::int64_t Hkv, std::int64_t Sq, std::int64_t Sk,
                 std::int64_t D, std::int64_t Dv) {
  FlexParams p;
  p.B = B, p.H = H, p.Hkv = Hkv, p.Sq = Sq, p.Sk = Sk, p.D = D, p.Dv = Dv;
  return p;
}

/// The views of one program's tensors.
ModCaptures<float> captures(const ModProgram& p, const std::vector<std::vector<float>>& real,
                            const std::vector<std::vector<std::int32_t>>& integer) {
  ModCaptures<float> c;
  for (std::size_t t = 0; t < p.tensors().size(); ++t) {
    const bool is_real = p.tensors()[t].type == ModType::real;
    c.real.push_back(is_real ? std::span<const float>(real[t]) : std::span<const float>());
    c.integer.push_back(is_real ? Indices{} : Indices(integer[t]));
  }
  return c;
}

/// Every output of one forward and one backward.
struct Results {
  std::vector<float> out, lse, dq, dk, dv;
  std::vector<std::vector<float>> dT;  // one per score_mod tensor (empty for integer ones)
};

Results run(const Kernels<float>& k, const FlexPlan& plan, const FlexInputs<float>& in,
            const std::vector<float>& dout) {
  Results r;
  r.out.assign(static_cast<std::size_t>(plan.out_size()), 7.0f);
  r.lse.assign(static_cast<std::size_t>(plan.lse_size()), 7.0f);
  k.flex_forward(plan, in, r.out, r.lse);
  r.dq.assign(in.q.size(), 7.0f);
  r.dk.assign(in.k.size(), 7.0f);
  r.dv.assign(in.v.size(), 7.0f);
  FlexGrads<float> g{r.dq, r.dk, r.dv, {}};
  for (const ModTensor& t : plan.params().score_mod.tensors()) {
    r.dT.emplace_back(t.type == ModType::real ? static_cast<std::size_t>(t.size()) : 0, 7.0f);
  }
  for (auto& t : r.dT) g.d_score_tensors.emplace_back(t);
  k.flex_backward(plan, in, dout, g);
  return r;
}

/// SPEC §13.5's bounds on |optimized − reference| for each output (dT per
/// element of each tensor): reference/flex_bound.hpp with the constants the
/// case states.
reference::FlexBounds bounds(const ModCase& m, const FlexPlan& plan, const FlexInputs<float>& in,
                             const std::vector<float>& dout) {
  const std::span<const float> d(dout);
  const reference::FlexMeasured x = reference::flex_measure<float>(plan, in, d);
  return reference::flex_bounds<float>(plan, in, d, x, {m.L, m.L_T, m.tau});
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, double tol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t e = 0; e < got.size(); ++e) {
    if (want[e] == -kInf) {
      ASSERT_EQ(got[e], -kInf) << what << " at " << e;
      continue;
    }
    ASSERT_LE(std::abs(static_cast<double>(got[e]) - want[e]), tol)
        << what << " at " << e << ": got " << got[e] << ", want " << want[e];
  }
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want,
                  const std::vector<double>& tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  ASSERT_EQ(tol.size(), want.size()) << what;
  for (std::size_t e = 0; e < got.size(); ++e) {
    ASSERT_LE(std::abs(static_cast<double>(got[e]) - want[e]), tol[e])
        << what << " at " << e << ": got " << got[e] << ", want " << want[e];
  }
}

void expect_bitwise(const Results& a, const Results& b, int threads) {
  const std::string t = " with " + std::to_string(threads) + " threads";
  EXPECT_EQ(a.out, b.out) << "out" << t;
  EXPECT_EQ(a.lse, b.lse) << "lse" << t;
  EXPECT_EQ(a.dq, b.dq) << "dq" << t;
  EXPECT_EQ(a.dk, b.dk) << "dk" << t;
  EXPECT_EQ(a.dv, b.dv) << "dv" << t;
  EXPECT_EQ(a.dT, b.dT) << "d_score_tensors" << t;
}

/// Case `m`, without and with a block mask: optimized against the reference
/// within SPEC §13.5's bounds on every target; 2 and 3 threads give the
/// bits of 1.
void check(const ModCase& m) {
  for (const bool blocked : {false, true}) {
    SCOPED_TRACE(m.name + (blocked ? ", block mask" : ", no block mask"));
    FlexParams p = m.params;
    const FlexPlan plain = FlexPlan::make(p);
    FlexInputs<float> in;
    const auto q = test::random_values<float>(static_cast<std::size_t>(plain.q_size()), 31);
    const auto k = test::random_values<float>(static_cast<std::size_t>(plain.k_size()), 32);
    const auto v = test::random_values<float>(static_cast<std::size_t>(plain.v_size()), 33);
    const auto dout = test::random_values<float>(static_cast<std::size_t>(plain.out_size()), 34);
    in.q = q, in.k = k, in.v = v;
    in.score_tensors = captures(p.score_mod, m.score_real, m.score_int);
    in.mask_tensors = captures(p.mask_mod, m.mask_real, m.mask_int);
    FlexBlockMask bm;
    if (blocked) {
      bm = reference::create_block_mask<float>(plain, in.mask_tensors, m.q_block, m.kv_block);
      p.block_mask = bm.shape;
      in.block_mask = bm.data();
    }
    const FlexPlan plan = FlexPlan::make(p);
    const Results want = run(reference::backend(), plan, in, dout);
    const reference::FlexBounds tol = bounds(m, plan, in, dout);
    // the constants flex_measure finds (what the property suite uses for
    // random mods) within the ones the case states
    const reference::FlexMeasured x = reference::flex_measure<float>(plan, in, dout);
    const double sigma = plan.scale() * static_cast<double>(p.D) *
                         reference::flex_max_abs<float>(q) * reference::flex_max_abs<float>(k);
    EXPECT_LE(x.mod.L, m.L);
    EXPECT_LE(x.mod.L_T, m.L_T);
    EXPECT_LE(x.mod.tau, std::max(sigma, m.tau));
    test::for_each_target([&] {
      const Results got = run(optimized::backend(optimized::Options(1)), plan, in, dout);
      expect_close(got.out, want.out, tol.out, "out");
      expect_close(got.lse, want.lse, tol.lse, "lse");
      expect_close(got.dq, want.dq, tol.dq, "dq");
      expect_close(got.dk, want.dk, tol.dk, "dk");
      expect_close(got.dv, want.dv, tol.dv, "dv");
      for (std::size_t t = 0; t < want.dT.size(); ++t) {
        expect_close(got.dT[t], want.dT[t], tol.dT[t],
                     "d_score_tensors[" + std::to_string(t) + "]");
      }
      for (const int threads : {2, 3}) {
        expect_bitwise(got, run(optimized::backend(optimized::Options(threads)), plan, in, dout),
                       threads);
      }
    });
  }
}

/// x rounded to T, and back (exactly).
template <class T>
std::vector<T> narrow(const std::vector<float>& x) {
  return {x.begin(), x.end()};
}
template <class T>
std::vector<float> widen(const std::vector<T>& x) {
  std::vector<float> w(x.size());
  for (std::size_t e = 0; e < x.size(); ++e) w[e] = static_cast<float>(x[e]);
  return w;
}

/// One forward and backward at storage type T, its results widened.
template <class T>
Results run_stored(const Kernels<T>& k, const FlexPlan& plan, const FlexInputs<T>& in,
                   const std::vector<T>& dout) {
  std::vector<T> out(static_cast<std::size_t>(plan.out_size())), dq(in.q.size()), dk(in.k.size()),
      dv(in.v.size());
  Results r;
  r.lse.assign(static_cast<std::size_t>(plan.lse_size()), 7.0f);
  k.flex_forward(plan, in, out, r.lse);
  std::vector<std::vector<T>> dT;
  for (const ModTensor& t : plan.params().score_mod.tensors()) {
    dT.emplace_back(t.type == ModType::real ? static_cast<std::size_t>(t.size()) : 0);
  }
  FlexGrads<T> g{dq, dk, dv, {}};
  for (auto& t : dT) g.d_score_tensors.emplace_back(t);
  k.flex_backward(plan, in, dout, g);
  r.out = widen(out), r.dq = widen(dq), r.dk = widen(dk), r.dv = widen(dv);
  for (const auto& t : dT) r.dT.push_back(widen(t));
  return r;
}

/// SPEC §13.5's bound `tol` on the float results, then each rounded to T
/// (p bits of precision) once on either side: |RN(a) − RN(b)| ≤ |a − b| +
/// 2^−p (|a| + |b|), plus T's smallest subnormal step.
std::vector<double> rounded(const std::vector<float>& want, double tol, int p, double tiny) {
  std::vector<double> t(want.size());
  const double half_ulp = std::ldexp(1.0, -p);
  for (std::size_t e = 0; e < t.size(); ++e) {
    t[e] = tol * (1 + half_ulp) + 2 * half_ulp * std::abs(static_cast<double>(want[e])) + tiny;
  }
  return t;
}

/// Case `m` with a block mask at storage type T (bf16: p = 8, f16: p = 11):
/// q, k, v, dout and the captured real tensors are T's values; the
/// optimized results against the reference's at T.
template <class T>
void check_stored(const ModCase& m, int p_bits, double tiny) {
  FlexParams p = m.params;
  const FlexPlan plain = FlexPlan::make(p);
  const auto q = widen(narrow<T>(test::random_values<float>(plain.q_size(), 41)));
  const auto k = widen(narrow<T>(test::random_values<float>(plain.k_size(), 42)));
  const auto v = widen(narrow<T>(test::random_values<float>(plain.v_size(), 43)));
  const auto dout = widen(narrow<T>(test::random_values<float>(plain.out_size(), 44)));
  std::vector<std::vector<float>> real;
  for (const auto& t : m.score_real) real.push_back(widen(narrow<T>(t)));
  FlexInputs<float> in{q,
                       k,
                       v,
                       captures(p.score_mod, real, m.score_int),
                       captures(p.mask_mod, m.mask_real, m.mask_int),
                       {}};
  const FlexBlockMask bm =
      reference::create_block_mask<float>(plain, in.mask_tensors, m.q_block, m.kv_block);
  p.block_mask = bm.shape;
  in.block_mask = bm.data();
  const FlexPlan plan = FlexPlan::make(p);
  const auto qt = narrow<T>(q), kt = narrow<T>(k), vt = narrow<T>(v), dt = narrow<T>(dout);
  std::vector<std::vector<T>> real_t;
  for (const auto& t : real) real_t.push_back(narrow<T>(t));
  ModCaptures<T> sc{{}, in.score_tensors.integer};
  for (std::size_t t = 0; t < real_t.size(); ++t) sc.real.emplace_back(real_t[t]);
  ModCaptures<T> mc{std::vector<std::span<const T>>(in.mask_tensors.real.size()),
                    in.mask_tensors.integer};
  const FlexInputs<T> in_t{qt, kt, vt, sc, mc, in.block_mask};
  const Results want = run_stored<T>(reference::backend().kernels<T>(), plan, in_t, dt);
  const reference::FlexBounds tol = bounds(m, plan, in, dout);
  test::for_each_target([&] {
    const Results got =
        run_stored<T>(optimized::backend(optimized::Options(2)).kernels<T>(), plan, in_t, dt);
    expect_close(got.out, want.out, rounded(want.out, tol.out, p_bits, tiny), "out");
    expect_close(got.lse, want.lse, tol.lse, "lse");
    expect_close(got.dq, want.dq, rounded(want.dq, tol.dq, p_bits, tiny), "dq");
    expect_close(got.dk, want.dk, rounded(want.dk, tol.dk, p_bits, tiny), "dk");
    expect_close(got.dv, want.dv, rounded(want.dv, tol.dv, p_bits, tiny), "dv");
    for (std::size_t t = 0; t < want.dT.size(); ++t) {
      if (want.dT[t].empty()) continue;
      double worst = 0;
      for (const double b : tol.dT[t]) worst = std::max(worst, b);
      expect_close(got.dT[t], want.dT[t], rounded(want.dT[t], worst, p_bits, tiny), "dT");
    }
  });
}

// causal, bottom-right (kv_idx <= q_idx + Sk − Sq), GQA, Dv != D, Sq != Sk
TEST(OptimizedFlex, Causal) {
  ModCase m{"causal", sizes(2, 4, 2, 37, 45, 16, 12)};
  ModProgram& mm = m.params.mask_mod;
  mm.set_result(mm.kv_idx() <= mm.q_idx() + mm.integer(45 - 37));
  check(m);
  // a native form (SPEC §13.5): the native kernels at bf16 and f16 (rounding exact)
  m.name = "causal, bf16";
  check_stored<bfloat16>(m, 8, 0x1p-133);
  m.name = "causal, f16";
  check_stored<float16>(m, 11, 0x1p-24);
}

// sliding window of 9 keys: 0 <= q_idx − kv_idx <= 8
TEST(OptimizedFlex, SlidingWindow) {
  ModCase m{"window", sizes(1, 2, 1, 41, 41, 8, 8)};
  ModProgram& mm = m.params.mask_mod;
  const ModValue d = mm.q_idx() - mm.kv_idx();
  mm.set_result(d >= mm.integer(0) && d <= mm.integer(8));
  m.q_block = m.kv_block = 8;
  check(m);
}

// ALiBi: t = s − slopes[h]·|q_idx − kv_idx|, the slopes captured (their
// gradient: −|q_idx − kv_idx|, so L_T = Sk; |slope·dist| <= Sk)
TEST(OptimizedFlex, AlibiWithCapturedSlopes) {
  ModCase m{"alibi", sizes(1, 4, 2, 23, 30, 8, 6)};
  ModProgram& s = m.params.score_mod;
  const auto slopes = s.capture({"slopes", {4}, ModType::real, 0, 0});
  s.set_result(s.score() - s.load(slopes, {s.h()}) * s.apply(ModOp::abs, s.q_idx() - s.kv_idx()));
  m.score_real = {alibi_standard_slopes(4)};
  m.score_int = {{}};
  m.L_T = 30, m.tau = 30;
  check(m);
  m.params.mask_mod.set_result(m.params.mask_mod.kv_idx() <=
                               m.params.mask_mod.q_idx() + m.params.mask_mod.integer(7));
  m.name = "causal alibi, bf16";
  check_stored<bfloat16>(m, 8, 0x1p-133);
  m.name = "causal alibi, f16";
  check_stored<float16>(m, 11, 0x1p-24);
}

// softcap 2: t = 2·tanh(s / 2), scale 2 (|s| up to 2·D)
TEST(OptimizedFlex, Softcap) {
  ModCase m{"softcap", sizes(1, 2, 2, 19, 26, 8, 8)};
  m.params.scale = 2.0;
  ModProgram& s = m.params.score_mod;
  s.set_result(s.real(2.0) * s.apply(ModOp::tanh, s.score() / s.real(2.0)));
  check(m);
  m.name = "softcap, bf16";  // a native form, no mask
  check_stored<bfloat16>(m, 8, 0x1p-133);
}

// a document mask: doc[q_idx] == doc[kv_idx], causal, doc an int32 tensor;
// query 0 of document 0 is hidden altogether by kv_idx > 0 (a fully masked row)
TEST(OptimizedFlex, DocumentMaskWithAFullyMaskedRow) {
  ModCase m{"document", sizes(2, 2, 1, 33, 33, 8, 8)};
  ModProgram& mm = m.params.mask_mod;
  const auto doc = mm.capture({"doc", {33}, ModType::integer, 0, 3});
  mm.set_result(mm.load(doc, {mm.q_idx()}) == mm.load(doc, {mm.kv_idx()}) &&
                mm.kv_idx() <= mm.q_idx() && mm.kv_idx() > mm.integer(0));
  std::vector<std::int32_t> ids(33);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>(i * 4 / 33);
  m.mask_int = {ids};
  m.mask_real = {{}};
  m.q_block = m.kv_block = 8;
  check(m);
}

// a mixed mod: where, minimum, maximum, floor_div, mod, a clamped relative
// bias shared by the heads and batch entries, read twice (its gradient: 0 or
// 1 per read; |bias| < 1, so tau ≈ 2 + |s|)
TEST(OptimizedFlex, MixedWhereMinMaxFloorDivMod) {
  ModCase m{"mixed", sizes(4, 3, 3, 61, 35, 8, 5)};
  ModProgram& s = m.params.score_mod;
  const auto rel = s.capture({"rel", {17}, ModType::real, 0, 0});
  const ModValue d =
      s.apply(ModOp::minimum, s.apply(ModOp::maximum, s.q_idx() - s.kv_idx(), s.integer(-8)),
              s.integer(8)) +
      s.integer(8);
  const ModValue bias = s.load(rel, {d});
  const ModValue odd =
      s.apply(ModOp::mod, s.apply(ModOp::floor_div, s.kv_idx() - s.q_idx(), s.integer(3)),
              s.integer(2)) == s.integer(1);
  s.set_result(s.apply(ModOp::where, odd, s.apply(ModOp::maximum, s.score(), bias),
                       s.apply(ModOp::minimum, s.score() + bias, s.real(1.5))) +
               bias * s.real(0.5));
  m.score_real = {test::random_values<float>(17, 35)};
  m.score_int = {{}};
  ModProgram& mm = m.params.mask_mod;
  mm.set_result(mm.apply(ModOp::mod, mm.q_idx() + mm.kv_idx(), mm.integer(5)) != mm.integer(0));
  m.L_T = 1.5, m.tau = 4;
  check(m);
}

// SPEC §13.4: a visible t that is NaN or +inf makes its row's out and lse
// NaN in both backends; the other rows, and a hidden +inf, are untouched.
TEST(OptimizedFlex, ANanOrInfiniteScoreMakesItsRowNaN) {
  for (const bool nan : {true, false}) {
    FlexParams p = sizes(1, 2, 1, 3, 70, 4, 4);  // two chunks of keys and more
    ModProgram& s = p.score_mod;
    // log(−1 − |s|) is NaN; the constant +inf is allowed (SPEC §13.1)
    const ModValue bad =
        nan ? s.apply(ModOp::log, s.real(-1.0) - s.apply(ModOp::abs, s.score())) : s.real(kInf);
    s.set_result(
        s.apply(ModOp::where, s.q_idx() == s.integer(1) && s.kv_idx() == s.integer(65), bad,
                s.apply(ModOp::where, s.kv_idx() == s.integer(69), s.real(kInf), s.score())));
    ModProgram& m = p.mask_mod;
    m.set_result(m.kv_idx() != m.integer(69));  // the second +inf is hidden
    const FlexPlan plan = FlexPlan::make(p);
    const std::vector<float> q = test::random_values<float>(std::size_t(plan.q_size()), 1),
                             k = test::random_values<float>(std::size_t(plan.k_size()), 2),
                             v = test::random_values<float>(std::size_t(plan.v_size()), 3);
    const FlexInputs<float> in{q, k, v, {}, {}, {}};
    const auto expect_row_1_nan = [&](const Kernels<float>& be) {
      std::vector<float> out(std::size_t(plan.out_size()), 7.0f), lse(std::size_t(plan.lse_size()));
      be.flex_forward(plan, in, out, lse);
      for (std::int64_t h = 0; h < 2; ++h) {
        for (std::int64_t i = 0; i < 3; ++i) {
          const float l = lse[std::size_t(h * 3 + i)];
          EXPECT_EQ(std::isnan(l), i == 1) << "lse of row " << i << ", head " << h;
          for (std::int64_t e = 0; e < 4; ++e) {
            const float o = out[std::size_t((h * 3 + i) * 4 + e)];
            EXPECT_EQ(std::isnan(o), i == 1) << "out of row " << i << ", head " << h;
          }
        }
      }
    };
    SCOPED_TRACE(nan ? "NaN" : "+inf");
    expect_row_1_nan(reference::backend().kernels<float>());
    test::for_each_target(
        [&] { expect_row_1_nan(optimized::backend(optimized::Options(1)).kernels<float>()); });
  }
}

}  // namespace
}  // namespace tandem
