// SPDX-License-Identifier: Apache-2.0
// FlexAttention (SPEC §13.4) on a subject's float backend, over random
// shapes (GQA, Dv != D, Sq != Sk, lengths across the optimized kernel's
// query tiles of 16 rows and key chunks of 64) and random well-typed mods
// (mod_gen.hpp), without and with a block mask from create_block_mask:
//  - agree_flex_forward: out and lse against the reference in double;
//  - agree_flex_backward: dq, dk, dv and the captured tensor's gradient;
//  - flex_threads_bitwise: the same bits on a repeated call and at every
//    thread variant.
// and over the calls the optimized backend runs on its native kernels
// (SPEC §13.5: a band mask_mod written in one of many ways, no score_mod or
// a softcap, a block mask that agrees with the band or is made to disagree):
//  - agree_flex_native_forward, agree_flex_native_backward.
// The tolerance is SPEC §13.5's bound (reference/flex_bound.hpp) with the
// mod's constants L, L_T and tau measured from the reference at every
// visible point. A subject without the flex entry points is skipped.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "mod_gen.hpp"
#include "support.hpp"
#include "tandem/reference/flex.hpp"
#include "tandem/reference/flex_bound.hpp"
#include "tandem/reference/kernels.hpp"

namespace tandem::props {
namespace {

/// What a FlexFloatCase draws: random programs, or the forms the optimized
/// backend runs natively (flex_native.hpp).
/// programs: drawn mod programs; native: the native features written as
/// mods (SPEC §13.5); nonfinite: a drawn program whose score_mod gives NaN,
/// +inf or −inf at one drawn (q_idx, kv_idx) (SPEC §13.4's rows).
enum class Mods : std::uint8_t { programs, native, nonfinite };

/// A band kv_idx − q_idx ∈ [c − w, c] (w < 0: no lower bound) built into
/// mask_mod m, written in one of several equivalent ways, sometimes with a
/// clause that holds everywhere.
ModValue band_mask(ModProgram& m, i64 c, i64 w, i64 Sk) {
  const ModValue q = m.q_idx(), kv = m.kv_idx();
  const auto n = [&m](i64 x) { return m.integer(x); };
  ModValue upper;
  switch (*rc::gen::inRange(0, 4)) {
    case 0:
      upper = kv <= q + n(c);
      break;
    case 1:
      upper = q - kv >= n(-c);
      break;
    case 2:
      upper = !(kv > q + n(c));
      break;
    default:
      upper = kv - q < n(c + 1);
      break;
  }
  ModValue r = upper;
  if (w >= 0) {
    ModValue lower;
    switch (*rc::gen::inRange(0, 3)) {
      case 0:
        lower = kv >= q + n(c - w);
        break;
      case 1:
        lower = q - kv <= n(w - c);
        break;
      default:
        lower = !(q > kv + n(w - c));
        break;
    }
    r = *rc::gen::arbitrary<bool>() ? (r && lower) : (lower && r);
  }
  switch (*rc::gen::inRange(0, 4)) {
    case 0:
      r = r && kv >= n(0);
      break;
    case 1:
      r = r && (kv < n(Sk) || q < n(0));
      break;
    case 2:
      r = r || kv < n(-1);
      break;
    default:
      break;
  }
  return r;
}

/// No score_mod, the score itself, a softcap c·tanh(score / c), one that is
/// not a softcap (two constants), ALiBi over slopes `[H]` captured as its
/// one tensor (tandem's form, torch's, or either with the distance one key
/// off, which is not ALiBi). Sets `alibi` when the program reads the slopes.
ModProgram native_score_mod(i64 H, i64 shift, bool& alibi) {
  ModProgram f;
  // 0 none, 1 score, 2 softcap, 3 not a softcap, 4 ALiBi, 5 torch's ALiBi, 6 and 7 off by one
  const int kind = *rc::gen::weightedOneOf<int>({{1, rc::gen::just(0)},
                                                 {1, rc::gen::just(1)},
                                                 {2, rc::gen::just(2)},
                                                 {1, rc::gen::just(3)},
                                                 {2, rc::gen::just(4)},
                                                 {2, rc::gen::just(5)},
                                                 {1, rc::gen::just(6)},
                                                 {2, rc::gen::just(7)}});
  alibi = kind >= 4;
  if (kind == 0) return f;
  const ModValue s = f.score();
  if (alibi) {
    const ModValue m = f.load(f.capture({"slopes", {H}, ModType::real, 0, 0}), {f.h()});
    const ModValue q = f.q_idx(), kv = f.kv_idx();
    if (kind == 4 || kind == 7) {  // score − m·abs(q_idx − kv_idx + shift), or one key off
      const i64 off = shift + (kind == 7 ? 1 : 0);
      const ModValue d =
          *rc::gen::arbitrary<bool>() ? q - kv + f.integer(off) : kv - q - f.integer(off);
      f.set_result(s - m * f.apply(ModOp::abs, d));
    } else {  // torch's score + m·(kv_idx − q_idx), or one key off
      f.set_result(s + m * (kv - q + f.integer(kind == 5 ? 0 : 1)));
    }
    return f;
  }
  const double c = *rc::gen::element(0.5, 2.0, 5.0, 30.0);
  if (kind == 1) {
    f.set_result(s);
  } else {
    const ModValue cap = f.real(kind == 2 ? c : 2 * c);
    f.set_result(cap * f.apply(ModOp::tanh, s / f.real(c)));
  }
  return f;
}

/// Makes block mask `m` of a call with Sq queries disagree with its
/// mask_mod in one query block: one of its partial blocks (one wholly at or
/// below the diagonal when it has some: a block a band keeps whole, partial
/// only by another clause, such as a document mask) hidden, or made full.
void spoil(FlexBlockMask& m, i64 Sq) {
  const FlexBlockMaskShape& s = m.shape;
  const std::size_t rows = m.kv_num_blocks.size();
  const std::size_t row = std::size_t(*rc::gen::inRange<i64>(0, i64(rows)));
  std::int32_t& n = m.kv_num_blocks[row];
  if (n == 0) return;
  std::int32_t* partial = m.kv_indices.data() + row * std::size_t(s.width);
  const i64 nq = (Sq + s.q_block - 1) / s.q_block, i0 = i64(row) % nq * s.q_block;
  std::vector<std::int32_t> below;
  for (std::int32_t c = 0; c < n; ++c) {
    if ((partial[c] + 1) * s.kv_block - 1 <= i0) below.push_back(c);
  }
  const std::int32_t pick = below.empty() || *rc::gen::inRange(0, 4) == 0
                                ? *rc::gen::inRange<std::int32_t>(0, n)
                                : *rc::gen::elementOf(below);
  std::swap(partial[pick], partial[n - 1]);  // the chosen block last, then dropped
  const std::int32_t kb = partial[n - 1];
  --n;
  if (!s.has_full || *rc::gen::inRange(0, 4) == 0) return;
  std::int32_t& f = m.full_kv_num_blocks[row];
  if (f < s.full_width) m.full_kv_indices[row * std::size_t(s.full_width) + std::size_t(f++)] = kb;
}

/// A random float call: sizes, a score_mod (and maybe mask_mod and block
/// mask), q, k, v, dO and, for drawn programs, the captured tensors "t"
/// `[H, 8]` and "ids" `[Sk]`.
struct FlexFloatCase {
  Mods mods = Mods::programs;
  ModCase score, mask;
  FlexPlan plan;
  std::vector<float> q, k, v, dout, t;
  std::vector<std::int64_t> ids;
  FlexBlockMask blocks;
  std::string native;  ///< the native form's description
  /// nonfinite: the plan before the score_mod was given its value at one
  /// point, and that value's description
  std::optional<FlexPlan> finite;
  std::string special;
  bool want_dT = true;  ///< the backward asks for the captured tensor's gradient

  explicit FlexFloatCase(Mods drawn = Mods::programs) : mods(drawn) {
    FlexParams p;
    p.B = *rc::gen::inRange<i64>(1, 3);
    p.Hkv = *rc::gen::inRange<i64>(1, 3);
    p.H = p.Hkv * *rc::gen::inRange<i64>(1, 4);
    p.Sq = *rc::gen::inRange<i64>(1, 35);
    p.Sk = *rc::gen::weightedOneOf<i64>(
        {{3, rc::gen::inRange<i64>(1, 20)}, {1, rc::gen::inRange<i64>(60, 70)}});
    if (mods == Mods::native && *rc::gen::arbitrary<bool>()) {
      p.Sq = *rc::gen::inRange<i64>(60, 140);  // across the native tiles
      p.Sk = *rc::gen::inRange<i64>(60, 200);
    }
    p.D = *rc::gen::inRange<i64>(1, 18);
    p.Dv = *rc::gen::inRange<i64>(1, 18);
    if (mods == Mods::native) {
      draw_native(p);
    } else {
      draw_programs(p);
      if (mods == Mods::nonfinite) draw_special(p);
    }
    Rng rng(*rc::gen::inRange<std::uint64_t>(0, 1u << 30));
    q = rng.values(std::size_t(plan.q_size()), 1.0);
    k = rng.values(std::size_t(plan.k_size()), 1.0);
    v = rng.values(std::size_t(plan.v_size()), 1.0);
    dout = rng.values(std::size_t(plan.out_size()), 1.0);
    if (mods != Mods::native) {
      t = rng.values(std::size_t(p.H * kModTableWidth), 1.0);
      for (i64 j = 0; j < p.Sk; ++j) ids.push_back(rng.index(kModIdsHi + 1));
    }
    if (*rc::gen::inRange(0, 4) < (ids.empty() || mods != Mods::native ? 2 : 3)) {
      const ModProgram& m = p.mask_mod;
      const bool per_b = m.empty() || m.reads(ModOp::batch, m.result());
      const bool per_h = m.empty() || m.reads(ModOp::head, m.result());
      const auto size = mods != Mods::native ? rc::gen::element<i64>(1, 2, 3, 5, 8, 16, 17, 32, 64)
                                             : rc::gen::element<i64>(2, 3, 5, 8, 16, 17, 32);
      const i64 qb = *size, kb = *size;
      blocks = reference::create_block_mask<float>(plan, mask_views(), qb, kb,
                                                   !per_b && *rc::gen::arbitrary<bool>(),
                                                   !per_h && *rc::gen::arbitrary<bool>());
      if (mods == Mods::native && *rc::gen::arbitrary<bool>()) spoil(blocks, p.Sq);
      p.block_mask = blocks.shape;
      plan = FlexPlan::make(p);
      if (finite) {
        FlexParams f = finite->params();
        f.block_mask = p.block_mask;
        finite = FlexPlan::make(f);
      }
    }
  }
  void draw_programs(FlexParams& p) {
    score = *gen_mod_case(ModRole::score_mod, 10);
    mask = *gen_mod_case(ModRole::mask_mod, 6);
    score.domain = {p.B, p.H, p.Sq, p.Sk};
    mask.domain = score.domain;
    p.score_mod = with_learned_bias(build_mod(score));
    if (*rc::gen::arbitrary<bool>()) p.mask_mod = build_mod(mask);
    try {
      plan = FlexPlan::make(p);
    } catch (const Error&) {
      RC_DISCARD("a drawn mod that check_mod refuses");
    }
  }
  /// score_mod(s, …) replaced by where(q_idx == i && kv_idx == j, x, score_mod(s, …)),
  /// x one of NaN, +inf or −inf written through the operations that give them.
  void draw_special(FlexParams& p) {
    finite = plan;
    ModProgram& g = p.score_mod;
    const ModValue before{&g, g.result()};
    const i64 i = *rc::gen::inRange<i64>(0, p.Sq), j = *rc::gen::inRange<i64>(0, p.Sk);
    constexpr double kInf = std::numeric_limits<double>::infinity();
    const ModValue nan = g.apply(ModOp::log, g.real(-1.0) - g.apply(ModOp::abs, g.score()));
    const int kind = *rc::gen::inRange(0, 7);
    const ModValue x = kind == 0   ? nan
                       : kind == 1 ? g.apply(ModOp::exp, nan)
                       : kind == 2 ? g.real(kInf)
                       : kind == 3 ? g.apply(ModOp::log, g.real(kInf))
                       : kind == 4 ? g.real(-kInf)
                       : kind == 5 ? g.apply(ModOp::log, g.real(0.0))
                                   : g.apply(ModOp::tanh, nan);
    constexpr const char* what[] = {
        "log(-1 - |score|) (NaN)", "exp(NaN)", "+inf", "log(+inf)", "-inf",
        "log(0) (-inf)",           "tanh(NaN)"};
    special = std::string(what[kind]) + " at q_idx " + std::to_string(i) + ", kv_idx " +
              std::to_string(j);
    const ModValue hit = g.q_idx() == g.integer(i) && g.kv_idx() == g.integer(j);
    g.set_result(g.apply(ModOp::where, hit, x, before));
    plan = FlexPlan::make(p);
  }
  void draw_native(FlexParams& p) {
    const bool docs = *rc::gen::inRange(0, 3) == 0;
    if (docs) p.Sq = *rc::gen::inRange<i64>(40, 141);      // several documents and blocks
    if (docs || *rc::gen::arbitrary<bool>()) p.Sk = p.Sq;  // Sq = Sk often: torch's ALiBi
    const i64 o = std::max<i64>(p.Sk - p.Sq, 0);
    const i64 c = *rc::gen::weightedOneOf<i64>(
        {{4, rc::gen::just(o)}, {1, rc::gen::inRange<i64>(o - 2, o + 3)}});
    // narrow windows often: a misread bound shows at w = 0
    const i64 w = *rc::gen::weightedOneOf<i64>({{2, rc::gen::just<i64>(-1)},
                                                {2, rc::gen::just<i64>(0)},
                                                {1, rc::gen::inRange<i64>(1, 4)},
                                                {1, rc::gen::inRange<i64>(4, 40)}});
    bool alibi = false;
    p.score_mod = native_score_mod(p.H, p.Sk - p.Sq, alibi);
    if (alibi) {
      for (i64 h = 0; h < p.H; ++h) t.push_back(float(*rc::gen::inRange(1, 9)) / 8.0f);
      want_dT = *rc::gen::arbitrary<bool>();  // without it the backward runs natively too
    }
    if (docs || *rc::gen::inRange(0, 5) != 0) {
      ModProgram& m = p.mask_mod;
      ModValue r = band_mask(m, c, w, p.Sk);
      if (docs) r = document_mask(m, r, p.Sk);
      m.set_result(r);
    }
    plan = FlexPlan::make(p);
    native = "mask_mod " +
             (p.mask_mod.empty() ? std::string("none") : p.mask_mod.render(p.mask_mod.result())) +
             "\nscore_mod " +
             (p.score_mod.empty() ? std::string("none") : p.score_mod.render(p.score_mod.result()));
  }
  /// `band` joined by a document mask doc[q_idx] == doc[kv_idx] in m (doc
  /// `[Sk]` in runs of L keys, or alternating runs: not documents).
  ModValue document_mask(ModProgram& m, ModValue band, i64 Sk) {
    const i64 L = *rc::gen::inRange<i64>(1, 24);
    const bool alternate = *rc::gen::inRange(0, 5) == 0;
    for (i64 j = 0; j < Sk; ++j) ids.push_back(alternate ? (j / L) % 2 : j / L);
    const std::int32_t doc = m.capture({"doc", {Sk}, ModType::integer, 0, Sk});
    const ModValue x = m.load(doc, {m.q_idx()}), y = m.load(doc, {m.kv_idx()});
    const ModValue same = *rc::gen::arbitrary<bool>() ? x == y : y == x;
    return *rc::gen::arbitrary<bool>() ? (same && band) : (band && same);
  }
  [[nodiscard]] ModCaptures<float> tensors() const {
    if (t.empty()) return {};
    if (mods == Mods::native) return {{t}, {Indices{}}};  // the ALiBi slopes
    return {{t, {}}, {Indices{}, ids}};
  }
  [[nodiscard]] ModCaptures<float> mask_views() const {
    if (mods == Mods::native) {
      return ids.empty() ? ModCaptures<float>{} : ModCaptures<float>{{{}}, {Indices{ids}}};
    }
    return plan.params().mask_mod.empty() ? ModCaptures<float>{} : tensors();
  }
  [[nodiscard]] FlexInputs<float> inputs() const {
    return {q, k, v, tensors(), mask_views(), blocks.data()};
  }
  [[nodiscard]] std::string describe() const {
    const FlexParams& p = plan.params();
    const std::string mods_text =
        mods == Mods::native
            ? "\n" + native
            : "\nscore_mod " + props::describe(score) +
                  (p.mask_mod.empty() ? "" : "\nmask_mod " + props::describe(mask));
    return (special.empty() ? "" : "score_mod's value " + special + " in\n") +
           "B=" + std::to_string(p.B) + " H=" + std::to_string(p.H) +
           " Hkv=" + std::to_string(p.Hkv) + " Sq=" + std::to_string(p.Sq) +
           " Sk=" + std::to_string(p.Sk) + " D=" + std::to_string(p.D) +
           " Dv=" + std::to_string(p.Dv) + mods_text +
           (p.block_mask ? "\nwith a block mask of " + std::to_string(p.block_mask->q_block) +
                               " x " + std::to_string(p.block_mask->kv_block)
                         : "");
  }
};

/// out, lse, dq, dk, dv and dt of one forward and backward, in float.
Outputs run_flex(const Backend& be, const FlexFloatCase& c, bool backward) {
  const FlexInputs<float> in = c.inputs();
  Outputs r(backward ? 6 : 2);
  r[0].assign(std::size_t(c.plan.out_size()), sentinel());
  r[1].assign(std::size_t(c.plan.lse_size()), sentinel());
  be.flex_forward(c.plan, in, r[0], r[1]);
  if (!backward) return r;
  r[2].assign(c.q.size(), sentinel());
  r[3].assign(c.k.size(), sentinel());
  r[4].assign(c.v.size(), sentinel());
  r[5].assign(c.t.size(), sentinel());
  FlexGrads<float> g{r[2], r[3], r[4], {}};
  if (!c.t.empty() && c.want_dT)
    g.d_score_tensors = c.tensors().real.size() == 2 ? std::vector<std::span<float>>{r[5], {}}
                                                     : std::vector<std::span<float>>{r[5]};
  be.flex_backward(c.plan, in, c.dout, g);
  return r;
}

/// out, lse, dq, dk, dv and dt by the reference in double.
std::vector<std::vector<double>> run_reference(const FlexFloatCase& c) {
  const FlexInputs<float> in = c.inputs();
  const reference::FlexWidened<float, double> w(in);
  std::vector<std::vector<double>> r(6);
  r[0].resize(std::size_t(c.plan.out_size()));
  r[1].resize(std::size_t(c.plan.lse_size()));
  reference::flex_forward<double>(c.plan, w.in, r[0], r[1]);
  r[2].resize(c.q.size());
  r[3].resize(c.k.size());
  r[4].resize(c.v.size());
  r[5].resize(c.t.size());
  const std::vector<double> dout(c.dout.begin(), c.dout.end());
  FlexGrads<double> g{r[2], r[3], r[4], {}};
  if (!c.t.empty())
    g.d_score_tensors = c.tensors().real.size() == 2 ? std::vector<std::span<double>>{r[5], {}}
                                                     : std::vector<std::span<double>>{r[5]};
  reference::flex_backward<double>(c.plan, w.in, dout, g);
  return r;
}

/// Empty when |got − want| <= tol[e] everywhere (±inf only where want is,
/// NaN only where want is NaN).
std::string flex_close(const std::string& what, const std::vector<float>& got,
                       const std::vector<double>& want, const std::vector<double>& tol) {
  for (std::size_t e = 0; e < want.size(); ++e) {
    const double g = got[e], w = want[e];
    const bool ok = std::isnan(w)   ? std::isnan(g)
                    : std::isinf(w) ? g == w
                                    : std::abs(g - w) <= tol[e];
    if (!ok) {
      return what + "[" + std::to_string(e) + "] = " + std::to_string(g) + ", reference " +
             std::to_string(w) + ", bound " + std::to_string(tol[e]);
    }
  }
  return {};
}

std::vector<double> uniform(std::size_t n, double tol) {
  return std::vector<double>(n, tol);
}

/// SPEC §13.5's bounds for case c, from its sizes and measured magnitudes.
reference::FlexBounds bounds_of(const FlexFloatCase& c) {
  const FlexInputs<float> in = c.inputs();
  const std::span<const float> dout(c.dout);
  const reference::FlexMeasured x = reference::flex_measure<float>(c.plan, in, dout);
  return reference::flex_bounds<float>(c.plan, in, dout, x, x.mod);
}

/// out and lse of `got` within `b` of the reference's `want`.
void require_forward_close(const std::string& tag, const Outputs& got,
                           const std::vector<std::vector<double>>& want,
                           const reference::FlexBounds& b) {
  TANDEM_REQUIRE_EMPTY(flex_close(tag + "out", got[0], want[0], uniform(want[0].size(), b.out)));
  TANDEM_REQUIRE_EMPTY(flex_close(tag + "lse", got[1], want[1], uniform(want[1].size(), b.lse)));
}

/// The forward, or the forward and the backward, against the reference.
void agree_flex(const Subject& s, bool backward, Mods mods) {
  if (!s.backend.flex_forward || !s.backend.flex_backward) return;
  const FlexFloatCase c(mods);
  const Outputs got = run_flex(s.backend, c, backward);
  const std::vector<std::vector<double>> want = run_reference(c);
  const reference::FlexBounds b = bounds_of(c);
  const std::string tag = c.describe() + "\n";
  require_forward_close(tag, got, want, b);
  if (!backward) return;
  TANDEM_REQUIRE_EMPTY(flex_close(tag + "dq", got[2], want[2], uniform(want[2].size(), b.dq)));
  TANDEM_REQUIRE_EMPTY(flex_close(tag + "dk", got[3], want[3], uniform(want[3].size(), b.dk)));
  TANDEM_REQUIRE_EMPTY(flex_close(tag + "dv", got[4], want[4], uniform(want[4].size(), b.dv)));
  if (!c.t.empty() && c.want_dT) {
    TANDEM_REQUIRE_EMPTY(flex_close(tag + "d_score_tensors[0]", got[5], want[5], b.dT[0]));
  }
}

/// A score_mod that gives NaN, +inf or −inf at one point (SPEC §13.4): its
/// row's out and lse are NaN where the value is NaN or +inf, the rest as
/// the reference's, within the bound of the program without that point
/// (the one value changed is not finite, so it cannot be measured; a −inf
/// only hides a key).
void agree_flex_nonfinite(const Subject& s) {
  if (!s.backend.flex_forward) return;
  const FlexFloatCase c(Mods::nonfinite);
  FlexFloatCase finite = c;
  finite.plan = *c.finite;
  require_forward_close(c.describe() + "\n", run_flex(s.backend, c, false), run_reference(c),
                        bounds_of(finite));
}

/// x as T vectors (x holds T's values, so exactly).
template <class T>
std::vector<T> as_stored(const std::vector<float>& x) {
  std::vector<T> y;
  y.reserve(x.size());
  for (const float e : x) y.push_back(T(static_cast<double>(e)));
  return y;
}

/// The drawn case at storage type T (p bits, least subnormal `tiny`), its
/// inputs rounded to T: out, dq, dk, dv and the captured tensor's gradient
/// against the reference's at T within SPEC §13.5's b·(1 + 2⁻ᵖ) + 2¹⁻ᵖ·|x|
/// + tiny (both sides round once from their float or exact result), lse
/// within the float bound.
template <class T>
void agree_flex_stored_at(const Subject& s, Mods mods, int p, double tiny) {
  const Kernels<T>& kt = s.backend.kernels<T>();
  if (!kt.flex_forward || !kt.flex_backward) return;
  FlexFloatCase c(mods);
  for (std::vector<float>* x : {&c.q, &c.k, &c.v, &c.dout, &c.t}) {
    for (float& e : *x) e = static_cast<float>(T(static_cast<double>(e)));
  }
  const FlexInputs<float> wide = c.inputs();
  const std::vector<T> q = as_stored<T>(c.q), k = as_stored<T>(c.k), v = as_stored<T>(c.v),
                       dout = as_stored<T>(c.dout), t = as_stored<T>(c.t);
  const auto stored = [&t](const ModCaptures<float>& m) {  // each real tensor is "t"
    ModCaptures<T> r{{}, m.integer};
    for (const auto& x : m.real) r.real.push_back(x.empty() ? std::span<const T>() : t);
    return r;
  };
  const FlexInputs<T> in{
      q, k, v, stored(wide.score_tensors), stored(wide.mask_tensors), wide.block_mask};
  const auto run = [&](const Kernels<T>& be) {
    std::vector<std::vector<T>> r{std::vector<T>(std::size_t(c.plan.out_size())),
                                  std::vector<T>(q.size()), std::vector<T>(k.size()),
                                  std::vector<T>(v.size()), std::vector<T>(t.size())};
    std::vector<float> lse(std::size_t(c.plan.lse_size()));
    be.flex_forward(c.plan, in, r[0], lse);
    FlexGrads<T> g{r[1], r[2], r[3], {}};
    if (!t.empty() && c.want_dT) {
      g.d_score_tensors = std::vector<std::span<T>>(in.score_tensors.real.size());
      g.d_score_tensors[0] = r[4];
    }
    be.flex_backward(c.plan, in, dout, g);
    return std::pair{r, lse};
  };
  // Plain references, not structured bindings: clang 14 (the sanitizer
  // builds) cannot capture a binding in a lambda.
  const auto got_run = run(kt);
  const auto want_run = run(reference::kernels<T>());
  const auto& got = got_run.first;
  const auto& got_lse = got_run.second;
  const auto& want = want_run.first;
  const auto& want_lse = want_run.second;
  const reference::FlexMeasured x = reference::flex_measure<float>(c.plan, wide, c.dout);
  const reference::FlexBounds b = reference::flex_bounds<float>(c.plan, wide, c.dout, x, x.mod);
  const auto check = [&](const char* what, std::size_t i, double bound) {
    for (std::size_t e = 0; e < want[i].size(); ++e) {
      const double g = static_cast<double>(got[i][e]), w = static_cast<double>(want[i][e]);
      const double tol = bound * (1 + std::ldexp(1.0, -p)) + std::ldexp(std::abs(w), 1 - p) + tiny;
      if (!(std::abs(g - w) <= tol || (std::isinf(w) && g == w))) {
        RC_FAIL(c.describe() + "\n" + what + "[" + std::to_string(e) + "] = " + std::to_string(g) +
                ", reference " + std::to_string(w) + ", bound " + std::to_string(tol));
      }
    }
  };
  check("out", 0, b.out);
  // lse: the float bound, and the reference's rounding of its exact lse to float
  std::vector<double> lse_tol;
  for (const float w : want_lse) lse_tol.push_back(b.lse + std::ldexp(std::abs(w), -24));
  TANDEM_REQUIRE_EMPTY(flex_close(c.describe() + "\nlse", got_lse,
                                  std::vector<double>(want_lse.begin(), want_lse.end()), lse_tol));
  check("dq", 1, b.dq), check("dk", 2, b.dk), check("dv", 3, b.dv);
  if (!t.empty() && c.want_dT) {
    check("d_score_tensors[0]", 4, *std::max_element(b.dT[0].begin(), b.dT[0].end()));
  }
}

/// agree_flex_stored_at at bf16 or f16 (drawn), over drawn programs or native forms.
void agree_flex_stored(const Subject& s) {
  const Mods mods = *rc::gen::arbitrary<bool>() ? Mods::native : Mods::programs;
  if (*rc::gen::arbitrary<bool>()) {
    agree_flex_stored_at<bfloat16>(s, mods, 8, 0x1p-133);
  } else {
    agree_flex_stored_at<float16>(s, mods, 11, 0x1p-24);
  }
}

/// Repeated calls and every thread variant give the same bits.
void threads_bitwise(const Subject& s) {
  if (!s.backend.flex_forward || !s.backend.flex_backward) return;
  const FlexFloatCase c;
  const auto replay = [&c](const Backend& be) { return run_flex(be, c, true); };
  TANDEM_REQUIRE_EMPTY(same_bits_on_every_run(s, replay, "flex " + c.describe()));
}

}  // namespace

void register_flex_properties(std::vector<Property>& v) {
  // the flex kernels take no Geometry: not run on the attention-only subjects
  v.push_back({"agree_flex_forward", "agreement", 150,
               [](const Subject& s) { agree_flex(s, false, Mods::programs); }, false, false});
  v.push_back({"agree_flex_backward", "agreement", 150,
               [](const Subject& s) { agree_flex(s, true, Mods::programs); }, false, false});
  v.push_back({"agree_flex_native_forward", "agreement", 100,
               [](const Subject& s) { agree_flex(s, false, Mods::native); }, false, false});
  v.push_back({"agree_flex_native_backward", "agreement", 100,
               [](const Subject& s) { agree_flex(s, true, Mods::native); }, false, false});
  v.push_back({"agree_flex_stored", "agreement", 60, agree_flex_stored, false, false});
  v.push_back({"agree_flex_nonfinite", "agreement", 80, agree_flex_nonfinite, false, false});
  v.push_back({"flex_threads_bitwise", "determinism", 60, threads_bitwise, false, false});
}

}  // namespace tandem::props
