// SPDX-License-Identifier: Apache-2.0
// The optimized attention backward at bf16 and f16 storage (SPEC §10.2)
// against the float optimized backward on the same values widened to float32,
// on every Highway target this CPU runs, with every feature of the float
// backward: GQA, Dv ≠ D, masks (causal, sliding window, key padding, bias
// with dbias in place and broadcast), softcap, sinks and dsinks, ALiBi,
// packed sequences, row strides, both layouts, query parts.
//
// The bound (from SPEC §10.5, per element, u = T's unit roundoff, η = the
// absolute error of T's subnormal range, 2^−25 for f16): the two runs share
// every float32 step but the rounding points of §10.2, so they differ by
//  - the one rounding of each gradient, u·|g| + η;
//  - pytorch profile: RN_T(p_ij) before dV, at most u·Σ_i p_ij |dO_i| + η·Σ_i |dO_i|
//    (Σ_i p_ij |dO_i| is the float dV of |dO|), and RN_T(dx_ij) before dQ and
//    dK, at most u·Σ|dx_ij| scale·max|k| (max|q|) + η per term, where
//    Σ_j |dx_ij| <= 2·max|v|·‖dO_i‖₁ and Σ_i |dx_ij| <= 2·max|v|·Σ_d dV(|dO|)_jd;
//  - the backward without saved state: δ_i = <dO_i, RN_T(O_i)> against the
//    float backward's <dO_i, O_i>, at most (u·max|v| + η)·‖dO_i‖₁, reaching dq, dk
//    (through p_ij·Δδ_i), dbias and dsinks;
//  - float32 rounding of the sums whose terms changed: (n·2^−23) times the
//    same magnitudes, n the longest sum.
// With the exact profile and the saved state nothing is rounded before the
// stores, so dq, dk and dv are the float backward's rounded once, bit for bit.
// The bound above is norm-wise (it admits a pytorch dV summed in T); the
// pytorch profile's dV is also checked against its emulation in double,
// within half an ulp_T and the ambiguous weights of SPEC §10.5, which does not.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <type_traits>
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
using tandem::AttentionSaved;
using tandem::bfloat16;
using tandem::float16;
using tandem::Layout;
using tandem::MaskKind;
using Vec = std::vector<float>;

constexpr float kInf = std::numeric_limits<float>::infinity();

/// The bits no kernel writes: a NaN of both bf16 and f16.
constexpr std::uint16_t kSentinel = 0x7FA5;

template <class T>
T sentinel() {
  return T::from_bits(kSentinel);
}

/// A gradient of T with kGuard sentinels either side: the view is n long.
template <class T>
class GuardedT {
 public:
  static constexpr std::size_t kGuard = 16;
  explicit GuardedT(std::int64_t n)
      : n_(static_cast<std::size_t>(n)), buf_(n_ + 2 * kGuard, sentinel<T>()) {}
  std::span<T> view() { return {buf_.data() + kGuard, n_}; }
  std::vector<T> values() const {
    return {buf_.begin() + kGuard, buf_.begin() + static_cast<std::ptrdiff_t>(kGuard + n_)};
  }
  bool guards_intact() const {
    for (std::size_t i = 0; i < kGuard; ++i) {
      if (buf_[i].bits != kSentinel || buf_[kGuard + n_ + i].bits != kSentinel) return false;
    }
    return true;
  }
  bool untouched() const {
    return std::all_of(buf_.begin(), buf_.end(), [](T x) { return x.bits == kSentinel; });
  }

 private:
  std::size_t n_;
  std::vector<T> buf_;
};

struct Case {
  std::string name;
  AttentionParams params;
  std::vector<std::int32_t> cu_q = {}, cu_k = {}, used = {};  ///< packed sequences
};

AttentionParams P(std::int64_t B, std::int64_t Sq, std::int64_t Sk, std::int64_t H,
                  std::int64_t Hkv, std::int64_t D, std::int64_t Dv = 0,
                  Layout layout = Layout::bshd, MaskKind mask = MaskKind::none,
                  std::int64_t window = 0) {
  return test::attention_params(B, Sq, Sk, H, Hkv, D, Dv, layout, mask, window);
}

std::vector<Case> cases() {
  std::vector<Case> c;
  c.push_back({"gqa_causal_dv", P(2, 37, 45, 4, 2, 16, 8, Layout::bshd, MaskKind::causal)});
  c.push_back(
      {"key_padding_bhsd_odd_d", P(2, 20, 33, 3, 1, 17, 0, Layout::bhsd, MaskKind::key_padding)});
  {
    AttentionParams p = P(2, 9, 21, 2, 1, 8, 12, Layout::bshd, MaskKind::bias);
    p.softcap = 3.0;
    c.push_back({"bias_broadcast_softcap", p});
  }
  {
    AttentionParams p = P(2, 11, 14, 2, 2, 8, 0, Layout::bhsd, MaskKind::bias);
    p.bias_batch = 2;
    p.bias_heads = 2;
    p.scale = 0.7;
    c.push_back({"bias_in_place", p});
  }
  {
    AttentionParams p = P(1, 30, 40, 4, 2, 16, 0, Layout::bshd, MaskKind::sliding_window, 9);
    p.sinks = true;
    p.alibi = tandem::AlibiKind::per_head;
    c.push_back({"window_sinks_alibi", p});
  }
  {
    AttentionParams p = P(1, 23, 30, 2, 1, 8, 0, Layout::bshd, MaskKind::causal);
    p.num_seqs = 3;
    p.sinks = true;
    c.push_back({"packed_sinks", p, {0, 10, 10, 23}, {0, 12, 17, 30}, {12, 5, 9}});
  }
  {
    AttentionParams p = P(2, 13, 13, 4, 2, 16);
    p.q_row_stride = 4 * 16 + 3;
    p.k_row_stride = 2 * 16 + 5;
    p.v_row_stride = 2 * 16 + 1;
    c.push_back({"row_strides", p});
  }
  // few (batch, kv head) pairs: query parts with dK/dV partials
  c.push_back({"query_parts_causal", P(1, 300, 300, 4, 1, 16, 0, Layout::bshd, MaskKind::causal)});
  return c;
}

/// The inputs of one case, drawn in float32 and rounded to T; `wide` the same
/// values as float32 for the float backward.
template <class T>
struct Data {
  AttentionPlan plan;
  std::vector<T> q, k, v, dout, sinks;
  Vec mask, slopes;
  std::vector<std::int32_t> cu_q, cu_k, used;
  Vec wq, wk, wv, wdout, wsinks;

  Data(const Case& c, tandem::Rounding rounding, std::uint32_t seed)
      : cu_q(c.cu_q), cu_k(c.cu_k), used(c.used) {
    AttentionParams params = c.params;
    params.rounding = rounding;
    plan = AttentionPlan::make(params);
    std::mt19937 gen(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f), u01(0.0f, 1.0f);
    const auto draw = [&](std::int64_t n) {
      Vec x(static_cast<std::size_t>(n));
      for (float& e : x) e = u(gen);
      return x;
    };
    q = test::stored<T>(draw(plan.q.extent));
    k = test::stored<T>(draw(plan.k.extent));
    v = test::stored<T>(draw(plan.v.extent));
    dout = test::stored<T>(draw(plan.o.extent));
    sinks = test::stored<T>(draw(plan.sinks ? plan.H : 0));
    mask.resize(static_cast<std::size_t>(plan.mask_size()));
    if (plan.mask == MaskKind::key_padding) {
      for (float& x : mask) x = u01(gen) < 0.7f ? 1.0f : 0.0f;
    } else if (plan.mask == MaskKind::bias) {
      for (float& x : mask) x = u01(gen) < 0.15f ? -kInf : 2.0f * u(gen);
    }
    slopes.resize(static_cast<std::size_t>(plan.slopes_size()));
    for (float& x : slopes) x = 0.25f * u01(gen);
    wq = test::widened(q);
    wk = test::widened(k);
    wv = test::widened(v);
    wdout = test::widened(dout);
    wsinks = test::widened(sinks);
  }
  template <class U>
  AttentionInputs<U> packed(AttentionInputs<U> in) const {
    in.mask = mask;
    in.alibi_slopes = slopes;
    in.cu_seqlens_q = cu_q;
    in.cu_seqlens_k = cu_k;
    in.seqused_k = used;
    return in;
  }
  AttentionInputs<T> in() const {
    AttentionInputs<T> in{q, k, v};
    in.sinks = sinks;
    return packed(in);
  }
  AttentionInputs<float> wide() const {
    AttentionInputs<float> in{wq, wk, wv};
    in.sinks = wsinks;
    return packed(in);
  }
};

/// A forward's saved state at T (out rounded to T from the float forward on
/// the widened inputs, lse float32), and the same out widened.
template <class T>
struct SavedState {
  std::vector<T> out;
  Vec lse, wout;
  SavedState(const Data<T>& d, const tandem::Backend& b) {
    Vec o(static_cast<std::size_t>(d.plan.o.extent));
    lse.resize(static_cast<std::size_t>(d.plan.lse_size()));
    b.attention_forward_lse(d.plan, d.wide(), o, lse);
    out = test::stored<T>(o);
    wout = test::widened(out);
  }
  /// The saved state of the T forward of `k` itself (its out and lse).
  SavedState(const Data<T>& d, const tandem::Kernels<T>& k)
      : out(static_cast<std::size_t>(d.plan.o.extent)),
        lse(static_cast<std::size_t>(d.plan.lse_size())) {
    k.attention_forward_lse(d.plan, d.in(), out, lse);
    wout = test::widened(out);
  }
  AttentionSaved<T> saved() const { return {out, lse}; }
  AttentionSaved<float> wide() const { return {wout, lse}; }
};

template <class T>
tandem::Kernels<T> kernels_of(const tandem::Backend& b) {
  if constexpr (std::is_same_v<T, bfloat16>) {
    return b.bf16;
  } else {
    return b.f16;
  }
}

/// Every gradient the plan has, of element type U.
template <class U>
struct AllGrads {
  std::vector<U> dq, dk, dv, dsinks, dbias;
};

/// The T backward with every gradient (guards checked), from `saved` when given.
template <class T>
AllGrads<T> run_t(const Data<T>& d, const tandem::Backend& b, const SavedState<T>* saved) {
  const AttentionPlan& p = d.plan;
  GuardedT<T> dq(p.dq.extent), dk(p.dk.extent), dv(p.dv.extent), ds(p.sinks ? p.H : 0),
      db(p.mask == MaskKind::bias ? p.mask_size() : 0);
  AttentionGrads<T> g{dq.view(), dk.view(), dv.view(), ds.view(), db.view()};
  const tandem::Kernels<T> k = kernels_of<T>(b);
  if (saved != nullptr) {
    k.attention_backward_saved(p, d.in(), saved->saved(), d.dout, g);
  } else {
    k.attention_backward(p, d.in(), d.dout, g);
  }
  EXPECT_TRUE(dq.guards_intact() && dk.guards_intact() && dv.guards_intact() &&
              ds.guards_intact() && db.guards_intact())
      << "backward wrote outside a gradient";
  return {dq.values(), dk.values(), dv.values(), ds.values(), db.values()};
}

/// The float backward on the widened inputs (dout replaced by `dout`).
template <class T>
AllGrads<float> run_f(const Data<T>& d, const tandem::Backend& b, const SavedState<T>* saved,
                      const Vec& dout) {
  const AttentionPlan& p = d.plan;
  AllGrads<float> r{Vec(p.dq.extent), Vec(p.dk.extent), Vec(p.dv.extent), Vec(p.sinks ? p.H : 0),
                    Vec(p.mask == MaskKind::bias ? p.mask_size() : 0)};
  AttentionGrads<float> g{r.dq, r.dk, r.dv, r.dsinks, r.dbias};
  if (saved != nullptr) {
    b.attention_backward_saved(p, d.wide(), saved->wide(), dout, g);
  } else {
    b.attention_backward(p, d.wide(), dout, g);
  }
  return r;
}

/// SPEC §10.5's bound of the file's comment, per element, for one call.
template <class T>
struct Bound {
  double u = tandem::storage_traits<T>::unit_roundoff;
  double eta = std::is_same_v<T, float16> ? 0x1p-25 : 0x1p-130;
  double op = 1.0;     ///< 1 when the operands are rounded (pytorch), else 0
  double rerun = 1.0;  ///< 1 without the saved state (δ from a rounded O), else 0
  double gamma = 0.0;  ///< float32 slack per unit of magnitude
  double Mq = 0.0, Mk = 0.0, Mv = 0.0, MdO = 0.0, scale = 1.0;
  double dd_coef = 0.0;  ///< Δδ_i <= dd_coef·‖dO_i‖₁

  Bound(const Data<T>& d, bool rounded, bool saved) {
    const AttentionPlan& p = d.plan;
    op = rounded ? 1.0 : 0.0;
    rerun = saved ? 0.0 : 1.0;
    gamma = static_cast<double>(p.Sq + p.Sk + p.D + p.Dv + 16) * 0x1p-22;
    Mq = test::max_abs(d.wq);
    Mk = test::max_abs(d.wk);
    Mv = test::max_abs(d.wv);
    MdO = test::max_abs(d.wdout);
    scale = p.scale;
    dd_coef = rerun * (u * Mv + eta);
  }
  double grad(double g) const { return 1.01 * u * std::fabs(g) + eta; }
};

/// ‖dO_i‖₁ of the row of (batch b, query row i, head h).
double row_l1(const AttentionPlan& p, const Vec& dout, std::int64_t b, std::int64_t i,
              std::int64_t h) {
  double s = 0.0;
  for (std::int64_t x = 0; x < p.Dv; ++x) s += std::fabs(dout[p.o.at(b, i, h) + x]);
  return s;
}

template <class T>
void expect_within(const char* what, const std::vector<T>& got, const Vec& want,
                   const std::vector<double>& bound) {
  ASSERT_EQ(got.size(), want.size()) << what;
  std::size_t bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = static_cast<double>(got[i]), w = want[i];
    if (!(std::fabs(g - w) <= bound[i]) && bad++ < 5) {
      ADD_FAILURE() << what << "[" << i << "] = " << g << ", float " << w << ", |diff| "
                    << std::fabs(g - w) << " > bound " << bound[i];
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": elements beyond the bound";
}

/// The T backward against the float backward on the widened inputs (both
/// with `options`), within the bound of the file's comment.
template <class T>
void check_against_float(const Case& c, tandem::Rounding rounding, bool use_saved,
                         const opt::Options& options = opt::Options()) {
  const Data<T> d(c, rounding, 77);
  const AttentionPlan& p = d.plan;
  const tandem::Backend b = opt::backend(options);
  const SavedState<T> state(d, b);
  const SavedState<T>* saved = use_saved ? &state : nullptr;
  const AllGrads<T> got = run_t(d, b, saved);
  const AllGrads<float> want = run_f(d, b, saved, d.wdout);
  Vec abs_dout = d.wdout;
  for (float& x : abs_dout) x = std::fabs(x);
  const Vec dv_abs = run_f(d, b, saved, abs_dout).dv;  // Σ_i p_ij |dO_i|
  const Bound<T> bd(d, rounding.operands, use_saved);
  const std::int64_t G = p.group();
  // per (batch, key row, kv head): A_j = Σ_i p_ij ‖dO_i‖₁ = Σ_d dV(|dO|)_jd
  std::vector<double> bq(want.dq.size()), bk(want.dk.size()), bv(want.dv.size());
  double max_l1 = 0.0, max_dd_rows = 0.0;
  std::vector<double> dd_head(static_cast<std::size_t>(p.H), 0.0);
  for (std::int64_t bb = 0; bb < p.B; ++bb) {
    for (std::int64_t i = 0; i < p.Sq; ++i) {
      for (std::int64_t h = 0; h < p.H; ++h) {
        const double l1 = row_l1(p, d.wdout, bb, i, h);
        max_l1 = std::max(max_l1, l1);
        dd_head[static_cast<std::size_t>(h)] += bd.dd_coef * l1;
        const double mag = bd.scale * bd.Mk * 2.0 * bd.Mv * l1;
        for (std::int64_t x = 0; x < p.D; ++x) {
          const auto at = static_cast<std::size_t>(p.dq.at(bb, i, h) + x);
          bq[at] = bd.grad(want.dq[at]) +
                   bd.op * (bd.u * mag + bd.scale * bd.Mk * bd.eta * static_cast<double>(p.Sk)) +
                   bd.scale * bd.Mk * bd.dd_coef * l1 + bd.gamma * (std::fabs(want.dq[at]) + mag);
        }
      }
    }
  }
  max_dd_rows = bd.dd_coef * max_l1;
  const double rows = static_cast<double>(p.Sq * G);
  for (std::int64_t bb = 0; bb < p.B; ++bb) {
    for (std::int64_t j = 0; j < p.Sk; ++j) {
      for (std::int64_t g = 0; g < p.Hkv; ++g) {
        double A = 0.0;
        for (std::int64_t x = 0; x < p.Dv; ++x) A += dv_abs[p.dv.at(bb, j, g) + x];
        const double mag = bd.scale * bd.Mq * 2.0 * bd.Mv * A;
        for (std::int64_t x = 0; x < p.D; ++x) {
          const auto at = static_cast<std::size_t>(p.dk.at(bb, j, g) + x);
          bk[at] = bd.grad(want.dk[at]) + bd.op * (bd.u * mag + bd.scale * bd.Mq * bd.eta * rows) +
                   bd.scale * bd.Mq * bd.dd_coef * A + bd.gamma * (std::fabs(want.dk[at]) + mag);
        }
        for (std::int64_t x = 0; x < p.Dv; ++x) {
          const auto at = static_cast<std::size_t>(p.dv.at(bb, j, g) + x);
          bv[at] = bd.grad(want.dv[at]) + bd.op * (bd.u * dv_abs[at] + bd.eta * rows * bd.MdO) +
                   bd.gamma * (std::fabs(want.dv[at]) + dv_abs[at]);
        }
      }
    }
  }
  expect_within("dq", got.dq, want.dq, bq);
  expect_within("dk", got.dk, want.dk, bk);
  expect_within("dv", got.dv, want.dv, bv);
  // reference::backend()'s T backward (SPEC §10.2's rounding points, sums in
  // double) lies within the same bound of the float backward (its own
  // float32 differences are smaller; without the saved state its O_i takes
  // RN_T(e_ij), at most u·max|v| per element more in δ_i, inside dd_coef
  // again): within twice the bound of this backward.
  const AllGrads<T> ref = run_t(d, tandem::reference::backend(), saved);
  const auto twice = [](std::vector<double> x) {
    for (double& e : x) e *= 2.0;
    return x;
  };
  expect_within("dq against the reference", got.dq, test::widened(ref.dq), twice(bq));
  expect_within("dk against the reference", got.dk, test::widened(ref.dk), twice(bk));
  expect_within("dv against the reference", got.dv, test::widened(ref.dv), twice(bv));
  if (p.sinks) {
    std::vector<double> bs(want.dsinks.size());
    for (std::size_t h = 0; h < bs.size(); ++h) {
      bs[h] = bd.grad(want.dsinks[h]) + 0x1p-24 * std::fabs(want.dsinks[h]) + dd_head[h] +
              bd.gamma * static_cast<double>(p.B * p.Sq) * bd.Mv * max_l1;
    }
    expect_within("dsinks", got.dsinks, want.dsinks, bs);
  }
  if (p.mask == MaskKind::bias) {
    const std::int64_t summed_rows = (p.B / p.bias_batch) * (p.H / p.bias_heads);
    const auto summed = static_cast<double>(summed_rows);
    std::vector<double> bb(want.dbias.size());
    for (std::size_t x = 0; x < bb.size(); ++x) {
      bb[x] = bd.grad(want.dbias[x]) + 0x1p-24 * std::fabs(want.dbias[x]) +
              summed * (max_dd_rows + bd.gamma * 2.0 * bd.Mv * max_l1);
    }
    expect_within("dbias", got.dbias, want.dbias, bb);
  }
  // exact profile, saved state: nothing rounded before the stores, so the
  // gradients are the float backward's rounded once, bit for bit
  if (!rounding.operands && use_saved) {
    const auto same = [](const char* what, const std::vector<T>& g, const Vec& w) {
      const std::vector<T> r = test::stored<T>(w);
      std::size_t bad = 0;
      for (std::size_t i = 0; i < g.size(); ++i) bad += g[i].bits != r[i].bits ? 1 : 0;
      EXPECT_EQ(bad, 0u) << what << ": elements that are not RN_T(float backward)";
    };
    same("dq", got.dq, want.dq);
    same("dk", got.dk, want.dk);
    same("dv", got.dv, want.dv);
  }
}

class LowPrecisionBackward : public ::testing::TestWithParam<Case> {
 protected:
  void TearDown() override { opt::force_target(0); }
};

TEST_P(LowPrecisionBackward, AgreesWithTheFloatBackwardWithinTheBound) {
  test::for_each_target([&] {
    for (const tandem::Rounding r : {tandem::kRoundingPytorch, tandem::kRoundingExact}) {
      for (const bool saved : {true, false}) {
        SCOPED_TRACE(std::string(r.name) + (saved ? ", saved state" : ", rerun"));
        {
          SCOPED_TRACE("bf16");
          check_against_float<bfloat16>(GetParam(), r, saved);
        }
        {
          SCOPED_TRACE("f16");
          check_against_float<float16>(GetParam(), r, saved);
        }
      }
    }
  });
}

// Blocks of 8 keys and tiles of 16 rows, three query parts: the sums run
// over many key blocks, tiles and partials, each summed in float32 and the
// gradient rounded once (the exact profile's bits say so).
TEST_P(LowPrecisionBackward, SmallBlocksKeepTheBoundAndTheExactProfilesBits) {
  opt::Geometry geo;
  geo.key_block = 8;
  geo.edge_block = 8;
  geo.rows_per_tile = 16;
  geo.rows_per_tile_banded = 16;
  geo.backward_query_parts = 3;
  const opt::Options options(0, geo);
  for (const tandem::Rounding r : {tandem::kRoundingPytorch, tandem::kRoundingExact}) {
    for (const bool saved : {true, false}) {
      SCOPED_TRACE(std::string(r.name) + (saved ? ", saved state" : ", rerun"));
      check_against_float<bfloat16>(GetParam(), r, saved, options);
      check_against_float<float16>(GetParam(), r, saved, options);
    }
  }
}

/// ulp_T(x): the spacing of T's values at |x| (subnormal spacing below the
/// normal range).
template <class T>
double ulp(double x) {
  constexpr int kFraction = std::is_same_v<T, float16> ? 10 : 7;
  constexpr int kMinExp = std::is_same_v<T, float16> ? -14 : -126;
  const int e = x == 0.0 ? kMinExp : std::max(std::ilogb(x), kMinExp);
  return std::ldexp(1.0, e - kFraction);
}

/// dV of the pytorch profile emulated in double from SPEC §10.2 (no mask, no
/// softcap; P from the saved lse): dv*_j = Σ_i RN_T(p_ij)·dO_i, and the T
/// backward within ulp_T(dv*)/2, float32 summation, and ulp_T(p_ij)·|dO_i|
/// for each p_ij so near a rounding boundary of T that the kernel's float32
/// exp may round it the other way (SPEC §10.5's ambiguous keys). A dV
/// accumulated in T, or rounded one more time, is outside it.
template <class T>
void check_dv_emulated() {
  opt::Geometry geo;
  geo.key_block = 8;
  geo.edge_block = 8;
  geo.rows_per_tile = 16;
  const Case c{"emulated", P(1, 64, 96, 2, 1, 16)};
  const Data<T> d(c, tandem::kRoundingPytorch, 21);
  const AttentionPlan& p = d.plan;
  const tandem::Backend b = opt::backend(opt::Options(1, geo));
  const SavedState<T> state(d, b);
  const AllGrads<T> got = run_t(d, b, &state);
  std::size_t bad = 0;
  for (std::int64_t j = 0; j < p.Sk; ++j) {
    for (std::int64_t x = 0; x < p.Dv; ++x) {
      double want = 0.0, abs_sum = 0.0, ambiguous = 0.0;
      for (std::int64_t h = 0; h < p.H; ++h) {
        for (std::int64_t i = 0; i < p.Sq; ++i) {
          double dot = 0.0;
          for (std::int64_t y = 0; y < p.D; ++y) {
            dot += static_cast<double>(d.wq[p.q.at(0, i, h) + y]) * d.wk[p.k.at(0, j, 0) + y];
          }
          const double pij = std::exp(p.scale * dot - state.lse[p.lse_at(0, h, i)]);
          const double w = static_cast<double>(T(pij));
          const double dO = d.wdout[p.o.at(0, i, h) + x];
          want += w * dO;
          abs_sum += std::fabs(w * dO);
          if (T(pij * (1 + 1e-6)).bits != T(pij * (1 - 1e-6)).bits) {
            ambiguous += ulp<T>(pij) * std::fabs(dO);
          }
        }
      }
      const double eps = static_cast<double>(p.H * p.Sq) * 0x1p-23 * abs_sum;
      const double bound = 0.5 * ulp<T>(std::fabs(want) + eps) + eps + ambiguous;
      const double g = static_cast<double>(got.dv[p.dv.at(0, j, 0) + x]);
      if (!(std::fabs(g - want) <= bound) && bad++ < 5) {
        ADD_FAILURE() << "dv[" << j << "][" << x << "] = " << g << ", emulated " << want
                      << ", |diff| " << std::fabs(g - want) << " > " << bound;
      }
    }
  }
  EXPECT_EQ(bad, 0u) << "dv elements beyond the emulation's bound";
}

TEST(LowPrecisionBackwardEmulated, PytorchProfilesDvRoundsPOnceAndTheSumOnce) {
  check_dv_emulated<bfloat16>();
  check_dv_emulated<float16>();
}

template <class T>
void check_thread_counts(const Case& c) {
  const Data<T> d(c, tandem::kRoundingPytorch, 5);
  const SavedState<T> state(d, opt::backend());
  for (const SavedState<T>* saved : {&state, static_cast<const SavedState<T>*>(nullptr)}) {
    const AllGrads<T> one = run_t(d, opt::backend(opt::Options{1}), saved);
    for (const int threads : {2, 3, 5}) {
      const AllGrads<T> g = run_t(d, opt::backend(opt::Options{threads}), saved);
      EXPECT_TRUE(test::same_bits(g.dq, one.dq) && test::same_bits(g.dk, one.dk) &&
                  test::same_bits(g.dv, one.dv) && test::same_bits(g.dsinks, one.dsinks) &&
                  test::same_bits(g.dbias, one.dbias))
          << threads << " threads, " << (saved != nullptr ? "saved" : "rerun");
    }
  }
}

TEST_P(LowPrecisionBackward, BitwiseIdenticalForAnyThreadCount) {
  check_thread_counts<bfloat16>(GetParam());
  check_thread_counts<float16>(GetParam());
}

/// Without a saved state the backward is the forward at T followed by the
/// saved path on its out and lse (SPEC §10.2): every gradient has the bits
/// of the backward given the optimized T forward's own out and lse, on
/// every target and with both profiles (the inputs widened once for both
/// halves must not change a bit).
template <class T>
void check_rerun_is_the_saved_path(const Case& c) {
  for (const tandem::Rounding& rounding : {tandem::kRoundingPytorch, tandem::kRoundingExact}) {
    SCOPED_TRACE(std::string(rounding.name));
    const Data<T> d(c, rounding, 6);
    test::for_each_target([&] {
      const tandem::Backend b = opt::backend();
      const SavedState<T> state(d, kernels_of<T>(b));
      const AllGrads<T> rerun = run_t<T>(d, b, nullptr), saved = run_t(d, b, &state);
      EXPECT_TRUE(test::same_bits(rerun.dq, saved.dq) && test::same_bits(rerun.dk, saved.dk) &&
                  test::same_bits(rerun.dv, saved.dv) &&
                  test::same_bits(rerun.dsinks, saved.dsinks) &&
                  test::same_bits(rerun.dbias, saved.dbias));
    });
  }
}

TEST_P(LowPrecisionBackward, WithoutSavedStateIsTheSavedPathOnItsOwnForward) {
  check_rerun_is_the_saved_path<bfloat16>(GetParam());
  check_rerun_is_the_saved_path<float16>(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Cases, LowPrecisionBackward, ::testing::ValuesIn(cases()),
                         [](const auto& param) { return param.param.name; });

/// Each gradient alone (the _dq, _dk, _dv entry points and subsets of the
/// one call) is the all-gradients call's, bit for bit; the views not asked
/// for are never written.
template <class T>
void check_subsets() {
  const Case c = cases()[0];
  const Data<T> d(c, tandem::kRoundingPytorch, 9);
  const AttentionPlan& p = d.plan;
  const tandem::Kernels<T> k = kernels_of<T>(opt::backend());
  const AllGrads<T> all = run_t<T>(d, opt::backend(), nullptr);
  const std::int64_t extents[3] = {p.dq.extent, p.dk.extent, p.dv.extent};
  const std::vector<T>* wants[3] = {&all.dq, &all.dk, &all.dv};
  const typename tandem::Kernels<T>::OneGradient* ones[3] = {
      &k.attention_backward_dq, &k.attention_backward_dk, &k.attention_backward_dv};
  for (int which = 0; which < 3; ++which) {
    GuardedT<T> alone(extents[which]);
    (*ones[which])(p, d.in(), d.dout, alone.view());
    EXPECT_TRUE(alone.guards_intact());
    EXPECT_TRUE(test::same_bits(alone.values(), *wants[which])) << "gradient " << which << " alone";
    // the same through attention_backward with only this view
    GuardedT<T> g0(extents[0]), g1(extents[1]), g2(extents[2]);
    GuardedT<T>* gs[3] = {&g0, &g1, &g2};
    AttentionGrads<T> g;
    std::span<T>* views[3] = {&g.dq, &g.dk, &g.dv};
    *views[which] = gs[which]->view();
    k.attention_backward(p, d.in(), d.dout, g);
    for (int other = 0; other < 3; ++other) {
      if (other == which) {
        EXPECT_TRUE(test::same_bits(gs[other]->values(), *wants[which])) << "subset " << which;
      } else {
        EXPECT_TRUE(gs[other]->untouched()) << "gradient " << other << " written, not asked for";
      }
    }
  }
}

TEST(LowPrecisionBackwardViews, OneGradientAloneIsTheFullCallsAndTheOthersAreNotWritten) {
  check_subsets<bfloat16>();
  check_subsets<float16>();
}

template <class T>
void check_ggml_rejected() {
  const Data<T> d(cases()[0], tandem::kRoundingGgml, 3);
  const AttentionPlan& p = d.plan;
  const tandem::Kernels<T> k = kernels_of<T>(opt::backend());
  const SavedState<T> state(d, opt::backend());
  GuardedT<T> dq(p.dq.extent), dk(p.dk.extent), dv(p.dv.extent);
  const AttentionGrads<T> g{dq.view(), dk.view(), dv.view()};
  test::expect_error([&] { k.attention_backward(p, d.in(), d.dout, g); }, "rounding", {"ggml"});
  test::expect_error([&] { k.attention_backward_saved(p, d.in(), state.saved(), d.dout, g); },
                     "rounding", {"ggml"});
  test::expect_error([&] { k.attention_backward_dq(p, d.in(), d.dout, dq.view()); }, "rounding",
                     {"ggml"});
  test::expect_error([&] { k.attention_backward_dv(p, d.in(), d.dout, dv.view()); }, "rounding",
                     {"ggml"});
  EXPECT_TRUE(dq.untouched() && dk.untouched() && dv.untouched());
}

TEST(LowPrecisionBackwardViews, GgmlProfileIsRejectedBeforeAnythingIsWritten) {
  check_ggml_rejected<bfloat16>();
  check_ggml_rejected<float16>();
}

template <class T>
void check_bad_views() {
  const Data<T> d(cases()[0], tandem::kRoundingPytorch, 4);
  const AttentionPlan& p = d.plan;
  const tandem::Kernels<T> k = kernels_of<T>(opt::backend());
  GuardedT<T> dq(p.dq.extent);
  AttentionGrads<T> g;
  g.dq = dq.view();
  AttentionInputs<T> in = d.in();
  in.q = in.q.subspan(1);
  test::expect_error([&] { k.attention_backward(p, in, d.dout, g); }, "q.size()");
  const std::span<const T> short_dout = std::span<const T>(d.dout).subspan(1);
  test::expect_error([&] { k.attention_backward(p, d.in(), short_dout, g); }, "dout.size()");
  EXPECT_TRUE(dq.untouched());
}

TEST(LowPrecisionBackwardViews, BadViewsThrowBeforeWriting) {
  check_bad_views<bfloat16>();
  check_bad_views<float16>();
}

}  // namespace

#else
TEST(LowPrecisionBackward, NotBuilt) {
  GTEST_SKIP() << "optimized backend not built";
}
#endif
