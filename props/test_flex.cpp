// SPDX-License-Identifier: Apache-2.0
// Properties of FlexAttention (SPEC §13.4) over random shapes and random
// well-typed mods (mod_gen.hpp):
//  - the flex forms of the native features (causal, sliding window, softcap,
//    ALiBi, an additive bias, prefix-LM as a bias, a document mask as packed
//    sequences) give the native reference's output;
//  - the backward of a subject (dq, dk, dv and a captured tensor's gradient)
//    agrees with complex-step directional derivatives of the reference
//    forward, through random score_mods, mask_mods and block masks;
//  - a block mask made by create_block_mask agrees with its mask_mod: the
//    subject's output with it equals the output of mask_mod alone, and
//    validate_block_mask finds nothing.
// Each property rejects its broken fixture: a subject that scales after the
// mod, one that trusts a wrong full block, one that drops the mod's
// derivative, and one that adds a captured tensor's gradient one element off.
#include <gtest/gtest.h>
#include <rapidcheck.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <functional>
#include <limits>
#include <string>

#include "mod_gen.hpp"
#include "support.hpp"
#include "tandem/attention_plan.hpp"
#include "tandem/reference/attention.hpp"
#include "tandem/reference/flex.hpp"
#include "tandem/reference/kernels.hpp"

namespace tandem::props {
namespace {

using C = std::complex<double>;

/// A FlexAttention implementation at double: the flex entries of a Kernels<double>.
struct FlexSubject {
  std::function<void(const FlexPlan&, const FlexInputs<double>&, std::span<double>,
                     std::span<double>)>
      forward;
  std::function<void(const FlexPlan&, const FlexInputs<double>&, std::span<const double>,
                     const FlexGrads<double>&)>
      backward;
};

FlexSubject reference_subject() {
  const Kernels<double> k = reference::kernels<double>();
  return {k.flex_forward, k.flex_backward};
}

/// n values k/4, k in [−8, 8] (exact in binary: shrinks to small numbers).
std::vector<double> quarters(std::size_t n) {
  const auto v = *rc::gen::container<std::vector<int>>(n, rc::gen::inRange(-8, 9));
  std::vector<double> x(v.size());
  for (std::size_t e = 0; e < v.size(); ++e) x[e] = 0.25 * v[e];
  return x;
}

/// x_e + jitter_e, a small offset of no simple ratio to the quarters, so
/// that scores miss the kinks of abs, minimum and maximum (where the
/// derivative of SPEC §13.3 is one of two one-sided ones).
std::vector<double> jittered(std::vector<double> x) {
  for (std::size_t e = 0; e < x.size(); ++e) x[e] += 0.0123 * std::sqrt(2.0 + double(e % 7));
  return x;
}

/// Random q, k, v for a plan (q and k jittered).
struct FlexData {
  std::vector<double> q, k, v;
  explicit FlexData(const FlexPlan& p)
      : q(jittered(quarters(std::size_t(p.q_size())))),
        k(jittered(quarters(std::size_t(p.k_size())))),
        v(quarters(std::size_t(p.v_size()))) {}
};

// ------------------------------------------------------------ native forms

/// Which native feature a drawn case writes as a mod.
enum class Native { causal, window, softcap, alibi, bias, prefix_lm, document };

std::vector<double> forward(const FlexSubject& s, const FlexPlan& plan,
                            const FlexInputs<double>& in) {
  std::vector<double> out(std::size_t(plan.out_size()));
  s.forward(plan, in, out, {});
  return out;
}

void native_forms_case(const FlexSubject& subject) {
  const Native f = *rc::gen::element(Native::causal, Native::window, Native::softcap, Native::alibi,
                                     Native::bias, Native::prefix_lm, Native::document);
  const bool packed = f == Native::document;
  FlexParams p;
  p.B = packed ? 1 : *rc::gen::inRange(1, 3);
  p.Hkv = packed ? 1 : *rc::gen::inRange(1, 3);
  p.H = p.Hkv * (packed ? 1 : *rc::gen::inRange(1, 3));
  p.Sq = *rc::gen::inRange(1, 12);
  p.Sk = packed ? p.Sq : *rc::gen::inRange(1, 12);
  p.D = *rc::gen::inRange(1, 6);
  p.Dv = *rc::gen::inRange(1, 6);
  // the native masks align bottom-right only when Sk >= Sq (SPEC §2); ALiBi's distance always
  const std::int64_t shift = std::max<std::int64_t>(p.Sk - p.Sq, 0), w = *rc::gen::inRange(0, 5);
  const double cap = 0.5 * *rc::gen::inRange(1, 8);
  const std::int64_t prefix = *rc::gen::inRange<std::int64_t>(0, p.Sk + 1);
  const std::vector<std::int64_t> cuts = {0, p.Sq / 3, (2 * p.Sq) / 3, p.Sq};
  RC_TAG(int(f));
  ModProgram& m = p.mask_mod;
  ModProgram& sm = p.score_mod;
  const ModValue a = m.q_idx() + m.integer(shift);  // the query's bottom-right position
  std::int32_t slopes_t = -1, bias_t = -1, doc_t = -1;
  switch (f) {
    case Native::causal:
      m.set_result(m.kv_idx() <= a);
      break;
    case Native::window:
      m.set_result(a - m.kv_idx() >= m.integer(0) && a - m.kv_idx() <= m.integer(w));
      break;
    case Native::softcap:
      sm.set_result(sm.real(cap) * sm.apply(ModOp::tanh, sm.score() / sm.real(cap)));
      break;
    case Native::alibi:
      slopes_t = sm.capture({"slopes", {p.H}, ModType::real, 0, 0});
      sm.set_result(sm.score() -
                    sm.load(slopes_t, {sm.h()}) *
                        sm.apply(ModOp::abs, sm.q_idx() + sm.integer(p.Sk - p.Sq) - sm.kv_idx()));
      break;
    case Native::bias:
      bias_t = sm.capture({"bias", {p.B, p.H, p.Sq, p.Sk}, ModType::real, 0, 0});
      sm.set_result(sm.score() + sm.load(bias_t, {sm.b(), sm.h(), sm.q_idx(), sm.kv_idx()}));
      break;
    case Native::prefix_lm:
      m.set_result(m.kv_idx() < m.integer(prefix) || m.kv_idx() <= a);
      break;
    case Native::document:
      doc_t = m.capture({"doc", {p.Sq}, ModType::integer, 0, 2});
      m.set_result(m.load(doc_t, {m.q_idx()}) == m.load(doc_t, {m.kv_idx()}) &&
                   m.kv_idx() <= m.q_idx());
      break;
  }
  if (m.result() < 0) m = ModProgram{};
  const FlexPlan plan = FlexPlan::make(p);
  const FlexData x(plan);
  // the native call: bhsd (bshd for packed sequences, where H = 1)
  AttentionParams a_p;
  a_p.B = p.B;
  a_p.Sq = p.Sq;
  a_p.Sk = p.Sk;
  a_p.H = p.H;
  a_p.Hkv = p.Hkv;
  a_p.D = p.D;
  a_p.Dv = p.Dv;
  a_p.layout = packed ? Layout::bshd : Layout::bhsd;
  const std::vector<double> slopes = quarters(std::size_t(p.H));
  std::vector<double> bias = quarters(std::size_t(p.B * p.H * p.Sq * p.Sk));
  std::vector<float> slopes32(slopes.begin(), slopes.end()), mask;
  std::vector<std::int32_t> cu(cuts.begin(), cuts.end()), doc(std::size_t(p.Sq));
  for (std::size_t n = 0; n + 1 < cu.size(); ++n) {
    for (auto i = cu[n]; i < cu[n + 1]; ++i) doc[std::size_t(i)] = std::int32_t(n);
  }
  FlexInputs<double> in{x.q, x.k, x.v, {}, {}, {}};
  switch (f) {
    case Native::causal:
      a_p.mask = MaskKind::causal;
      break;
    case Native::window:
      a_p.mask = MaskKind::sliding_window;
      a_p.window = w;
      break;
    case Native::softcap:
      a_p.softcap = cap;
      break;
    case Native::alibi:
      a_p.alibi = AlibiKind::per_head;
      in.score_tensors = {{slopes}, {Indices{}}};
      break;
    case Native::bias:
      a_p.mask = MaskKind::bias;
      a_p.bias_batch = p.B;
      a_p.bias_heads = p.H;
      mask.assign(bias.begin(), bias.end());
      in.score_tensors = {{bias}, {Indices{}}};
      break;
    case Native::prefix_lm:  // as a bias: 0 where visible, −inf where hidden
      a_p.mask = MaskKind::bias;
      for (std::int64_t i = 0; i < p.Sq; ++i) {
        for (std::int64_t j = 0; j < p.Sk; ++j) {
          mask.push_back(j < prefix || j <= i + shift ? 0.0f
                                                      : -std::numeric_limits<float>::infinity());
        }
      }
      break;
    case Native::document:
      a_p.mask = MaskKind::causal;
      a_p.num_seqs = 3;
      in.mask_tensors = {{{}}, {doc}};
      break;
  }
  const AttentionPlan native = AttentionPlan::make(a_p);
  AttentionInputs<double> n_in{x.q, x.k, x.v, mask};
  if (f == Native::alibi) n_in.alibi_slopes = slopes32;
  if (packed) n_in.cu_seqlens_q = n_in.cu_seqlens_k = cu;
  std::vector<double> want(std::size_t(native.o.extent));
  reference::attention_forward<double>(native, n_in, want);
  const std::vector<double> got = forward(subject, plan, in);
  const double err = max_err(got, want);
  if (!(err <= 1e-12 * (1 + max_abs(x.v))))
    RC_FAIL("flex form " + std::to_string(int(f)) + " differs from the native path by " +
            std::to_string(err));
}

// ------------------------------------------------------------ gradients

/// A random call with a drawn score_mod, mask_mod and (maybe) block mask.
struct FlexCallCase {
  ModCase score, mask;
  FlexPlan plan;
  std::vector<double> t;          // the captured real tensor "t" `[H, 8]`
  std::vector<std::int64_t> ids;  // the captured integer tensor "ids" `[Sk]`
  FlexBlockMask blocks;
  std::int64_t D = 1, Dv = 1, Hkv = 1;

  FlexCallCase() {
    score = *gen_mod_case(ModRole::score_mod, 12);
    mask = *gen_mod_case(ModRole::mask_mod, 8);
    mask.domain = score.domain;
    FlexParams p;
    p.B = score.domain.B;
    p.H = score.domain.H;
    p.Hkv = Hkv = *rc::gen::element<std::int64_t>(1, p.H);
    p.Sq = score.domain.Sq;
    p.Sk = score.domain.Sk;
    p.D = D = *rc::gen::inRange(1, 4);
    p.Dv = Dv = *rc::gen::inRange(1, 4);
    p.score_mod = with_learned_bias(build_mod(score));
    if (*rc::gen::arbitrary<bool>()) p.mask_mod = build_mod(mask);
    try {
      plan = FlexPlan::make(p);
    } catch (const Error&) {
      RC_DISCARD("a drawn mod that check_mod refuses");
    }
    t = quarters(std::size_t(p.H * kModTableWidth));
    const auto iv = *rc::gen::container<std::vector<int>>(std::size_t(p.Sk),
                                                          rc::gen::inRange(0, int(kModIdsHi) + 1));
    ids.assign(iv.begin(), iv.end());
    if (*rc::gen::arbitrary<bool>()) {
      blocks = reference::create_block_mask<double>(plan, mask_views(), *rc::gen::inRange(1, 5),
                                                    *rc::gen::inRange(1, 5));
      p.block_mask = blocks.shape;
      plan = FlexPlan::make(p);
    }
  }
  [[nodiscard]] ModCaptures<double> mask_views() const {
    return plan.params().mask_mod.empty() ? ModCaptures<double>{}
                                          : ModCaptures<double>{{t, {}}, {Indices{}, ids}};
  }
  [[nodiscard]] FlexInputs<double> inputs(const FlexData& x) const {
    return {x.q, x.k, x.v, {{t, {}}, {Indices{}, ids}}, mask_views(), blocks.data()};
  }
  [[nodiscard]] std::string describe() const {
    return "score_mod " + props::describe(score) +
           (plan.params().mask_mod.empty() ? "" : "\nmask_mod " + props::describe(mask)) +
           (plan.params().block_mask ? "\nwith a block mask" : "");
  }
};

/// Im L(x + iε d) / ε for L = Σ W ∘ out: the directional derivative along d
/// of input `which` (0 q, 1 k, 2 v, 3 t), by the reference forward in complex.
double complex_step(const FlexCallCase& c, const FlexData& x, const std::vector<double>& W,
                    int which, const std::vector<double>& d) {
  const double eps = 1e-30;
  const auto lift = [&](const std::vector<double>& v, int me) {
    std::vector<C> z(v.begin(), v.end());
    if (me == which) {
      for (std::size_t e = 0; e < z.size(); ++e) z[e] += C(0, eps * d[e]);
    }
    return z;
  };
  const std::vector<C> q = lift(x.q, 0), k = lift(x.k, 1), v = lift(x.v, 2), t = lift(c.t, 3);
  const bool masked = !c.plan.params().mask_mod.empty();
  const std::vector<C> tm(c.t.begin(), c.t.end());
  const ModCaptures<C> mask =
      masked ? ModCaptures<C>{{tm, {}}, {Indices{}, c.ids}} : ModCaptures<C>{};
  const FlexInputs<C> in{q, k, v, {{t, {}}, {Indices{}, c.ids}}, mask, c.blocks.data()};
  std::vector<C> out(W.size());
  reference::flex_forward<C>(c.plan, in, out);
  C l{};
  for (std::size_t e = 0; e < out.size(); ++e) l += W[e] * out[e];
  return l.imag() / eps;
}

void gradient_case(const FlexSubject& s) {
  const FlexCallCase c;
  const FlexData x(c.plan);
  const std::vector<double> W = quarters(std::size_t(c.plan.out_size()));
  std::vector<double> dq(x.q.size()), dk(x.k.size()), dv(x.v.size()), dt(c.t.size());
  s.backward(c.plan, c.inputs(x), W, {dq, dk, dv, {dt, {}}});
  const char* names[] = {"dq", "dk", "dv", "dt"};
  const std::vector<double>* grads[] = {&dq, &dk, &dv, &dt};
  for (int which = 0; which < 4; ++which) {
    const std::vector<double> d = quarters(grads[which]->size());
    const double want = complex_step(c, x, W, which, d);
    RC_PRE(std::isfinite(want));
    double got = 0, scale = 1;
    for (std::size_t e = 0; e < d.size(); ++e) {
      got += d[e] * (*grads[which])[e];
      scale += std::abs(d[e] * (*grads[which])[e]);
    }
    if (!(std::abs(got - want) <= 1e-9 * scale))
      RC_FAIL(c.describe() + "\n" + names[which] + " · d = " + std::to_string(got) +
              ", complex step " + std::to_string(want));
  }
}

// ------------------------------------------------------------ block masks

void block_mask_case(const FlexSubject& s) {
  FlexCallCase c;
  FlexParams p = c.plan.params();
  RC_PRE(!p.mask_mod.empty());
  p.block_mask.reset();
  const FlexPlan alone = FlexPlan::make(p);
  const ModProgram& m = p.mask_mod;
  const bool per_b = m.reads(ModOp::batch, m.result()), per_h = m.reads(ModOp::head, m.result());
  const FlexBlockMask blocks = reference::create_block_mask<double>(
      alone, c.mask_views(), *rc::gen::inRange(1, 5), *rc::gen::inRange(1, 5),
      !per_b && *rc::gen::arbitrary<bool>(), !per_h && *rc::gen::arbitrary<bool>());
  p.block_mask = blocks.shape;
  c.plan = FlexPlan::make(p);
  c.blocks = blocks;
  const FlexData x(c.plan);
  FlexInputs<double> in = c.inputs(x);
  if (const auto why = reference::validate_block_mask(c.plan, in))
    RC_FAIL(c.describe() + "\ncreate_block_mask disagrees with mask_mod: " + *why);
  FlexInputs<double> plain = in;
  plain.block_mask = {};
  const std::vector<double> want = forward(reference_subject(), alone, plain);
  const std::vector<double> got = forward(s, c.plan, in);
  for (std::size_t e = 0; e < got.size(); ++e) {
    if (!(got[e] == want[e]))
      RC_FAIL(c.describe() + "\nwith the block mask out[" + std::to_string(e) +
              "] = " + std::to_string(got[e]) + ", mask_mod alone " + std::to_string(want[e]));
  }
}

// ------------------------------------------------------------ broken fixtures

/// Trusts a wrong full block: its forward promotes each query block's first
/// partial kv block to full (the block's mask_mod is not evaluated).
FlexSubject trusts_wrong_full_block() {
  FlexSubject s = reference_subject();
  s.forward = [](const FlexPlan& plan, const FlexInputs<double>& in, std::span<double> out,
                 std::span<double> lse) {
    FlexParams p = plan.params();
    FlexBlockMask b;
    b.shape = *p.block_mask;
    b.shape.has_full = true;
    b.shape.full_width = b.shape.width;
    const auto rows = in.block_mask.kv_num_blocks.size(), w = std::size_t(b.shape.width);
    b.kv_num_blocks.assign(rows, 0);
    b.kv_indices.assign(rows * w, 0);
    b.full_kv_num_blocks.assign(rows, 0);
    b.full_kv_indices.assign(rows * w, 0);
    for (std::size_t r = 0; r < rows; ++r) {
      const auto& m = in.block_mask;
      auto add = [&](bool full, std::int64_t kb) {
        auto& n = full ? b.full_kv_num_blocks[r] : b.kv_num_blocks[r];
        (full ? b.full_kv_indices : b.kv_indices)[r * w + std::size_t(n++)] = std::int32_t(kb);
      };
      for (std::int64_t e = 0; e < m.kv_num_blocks[r]; ++e) add(e == 0, m.kv_indices[r * w + e]);
      if (!m.full_kv_num_blocks.empty()) {
        for (std::int64_t e = 0; e < m.full_kv_num_blocks[r]; ++e) {
          add(true, m.full_kv_indices[r * std::size_t(p.block_mask->full_width) + e]);
        }
      }
    }
    p.block_mask = b.shape;
    FlexInputs<double> wrong = in;
    wrong.block_mask = b.data();
    reference::flex_forward<double>(FlexPlan::make(p), wrong, out, lse);
  };
  return s;
}

/// Scales after the mod: t = scale·score_mod(<q, k>) instead of
/// score_mod(scale·<q, k>).
FlexSubject scales_after_the_mod() {
  FlexSubject s = reference_subject();
  s.forward = [](const FlexPlan& plan, const FlexInputs<double>& in, std::span<double> out,
                 std::span<double> lse) {
    FlexParams p = plan.params();
    p.scale = 1.0;
    if (!p.score_mod.empty()) {
      ModProgram& f = p.score_mod;
      f.set_result(ModValue{&f, f.result()} * f.real(plan.scale()));
    } else {
      p.score_mod.set_result(p.score_mod.score() * p.score_mod.real(plan.scale()));
    }
    reference::flex_forward<double>(FlexPlan::make(p), in, out, lse);
  };
  return s;
}

/// A backward fed a wrong derivative program: ∂t/∂s = 1 (the mod's
/// derivative dropped), or each captured-tensor load one element on.
FlexSubject wrong_derivative(bool drop_d_score) {
  FlexSubject s = reference_subject();
  s.backward = [drop_d_score](const FlexPlan& plan, const FlexInputs<double>& in,
                              std::span<const double> dout, const FlexGrads<double>& g) {
    ModGradient df = plan.score_grad();
    if (drop_d_score) {
      df.d_score = df.program.real(1.0).id;
    } else {
      for (auto& l : df.loads) {
        ModNode n = df.program.node(l.node);
        const auto& shape = df.program.tensors()[std::size_t(n.tensor)].shape;
        const ModValue last{&df.program, n.index[shape.size() - 1]};
        const ModValue on = df.program.apply(ModOp::mod, last + df.program.integer(1),
                                             df.program.integer(shape.back()));
        n.index[shape.size() - 1] = on.id;
        l.node = df.program.add(n);
      }
    }
    reference::flex_backward_by<double>(plan, df, in, dout, g);
  };
  return s;
}

// ------------------------------------------------------------ runs

TEST(FlexProperties, FlexFormsEqualTheNativeFeatures) {
  const std::string m = run_semantic(
      "flex_forms_equal_native_features", 300, [] { native_forms_case(reference_subject()); },
      false);
  EXPECT_TRUE(m.empty()) << m;
}

TEST(FlexProperties, BackwardAgreesWithComplexSteps) {
  const std::string m = run_semantic(
      "flex_backward_agrees_with_complex_steps", 150, [] { gradient_case(reference_subject()); },
      false);
  EXPECT_TRUE(m.empty()) << m;
}

TEST(FlexProperties, CreatedBlockMasksAgreeWithTheirMaskMod) {
  const std::string m = run_semantic(
      "flex_block_masks_agree_with_mask_mod", 150, [] { block_mask_case(reference_subject()); },
      false);
  EXPECT_TRUE(m.empty()) << m;
}

// The broken fixtures: each property must reject its one.
TEST(FlexProperties, NativeFormsPropertyRejectsASubjectScalingAfterTheMod) {
  const std::string m = run_semantic(
      "flex_forms_equal_native_features", 300, [] { native_forms_case(scales_after_the_mod()); },
      true);
  EXPECT_NE(m.find("differs from the native path"), std::string::npos) << m;
}

TEST(FlexProperties, BlockMaskPropertyRejectsASubjectTrustingAWrongFullBlock) {
  const std::string m = run_semantic(
      "flex_block_masks_agree_with_mask_mod", 300,
      [] { block_mask_case(trusts_wrong_full_block()); }, true);
  EXPECT_NE(m.find("with the block mask out["), std::string::npos) << m;
}

TEST(FlexProperties, GradientPropertyRejectsADroppedModDerivative) {
  const std::string m = run_semantic(
      "flex_backward_agrees_with_complex_steps", 300, [] { gradient_case(wrong_derivative(true)); },
      true);
  EXPECT_NE(m.find("complex step"), std::string::npos) << m;
}

TEST(FlexProperties, GradientPropertyRejectsATensorGradientOneElementOff) {
  const std::string m = run_semantic(
      "flex_backward_agrees_with_complex_steps", 300,
      [] { gradient_case(wrong_derivative(false)); }, true);
  EXPECT_NE(m.find("dt · d"), std::string::npos) << m;
}

}  // namespace
}  // namespace tandem::props
