// SPDX-License-Identifier: Apache-2.0
// Attention properties: agreement, transpose, gradient, layout, semantics.
#include <algorithm>
#include <complex>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>

#include "checks.hpp"

namespace tandem::props {

std::string complex_step_mismatch(const Backend& be, const AttentionCase& c) {
  const AttentionData d = make_data(c);
  const AttentionScales sc = scales(d);
  const Grads g = run_backward(be, d);
  const GradsD gr = reference_backward(d);
  using C = std::complex<double>;
  const double h = 1e-20;
  Rng r(c.seed + 7);
  const char* names[4] = {"q", "k", "v", "sinks"};
  for (int which = 0; which < (d.plan.sinks ? 4 : 3); ++which) {
    std::vector<C> x[4] = {
        std::vector<C>(d.q.begin(), d.q.end()), std::vector<C>(d.k.begin(), d.k.end()),
        std::vector<C>(d.v.begin(), d.v.end()), std::vector<C>(d.sinks.begin(), d.sinks.end())};
    const std::vector<float> u = r.values(x[which].size(), 1.0);
    for (std::size_t i = 0; i < u.size(); ++i) x[which][i] += C(0.0, h * u[i]);
    const std::vector<C> o =
        reference_forward<C, C>(d, std::span<const C>(x[0]), std::span<const C>(x[1]),
                                std::span<const C>(x[2]), std::span<const C>(x[3]));
    double deriv = 0;
    for (std::size_t i = 0; i < o.size(); ++i) deriv += double(d.dout[i]) * o[i].imag() / h;
    const std::vector<float>* gb[4] = {&g.dq, &g.dk, &g.dv, &g.dsinks};
    const std::vector<double>* gd[4] = {&gr.dq, &gr.dk, &gr.dv, &gr.dsinks};
    const double nat[4] = {sc.dq, sc.dk, sc.dv, sc.dsinks};
    double pb = 0, pd = 0, mag = 0;
    for (std::size_t i = 0; i < u.size(); ++i) {
      pb += double((*gb[which])[i]) * u[i];
      pd += (*gd[which])[i] * u[i];
      mag += std::abs((*gd[which])[i] * u[i]);
    }
    const auto say = [&](const char* who, double got, double tol) {
      std::ostringstream os;
      os.precision(9);
      os << who << " <d" << names[which] << ", u> = " << got
         << " but the complex-step derivative is " << deriv << " (tolerance " << tol << ")";
      return os.str();
    };
    const double tol_d = 1e-9 * (mag + nat[which]);
    if (!(std::abs(pd - deriv) <= tol_d)) return say("reference<double>", pd, tol_d);
    const double tol_b = 64 * kEps * (1 + sc.L) * (mag + nat[which]) +
                         double(u.size()) * sc.underflow;  // each |u_i| <= 1
    if (!(std::abs(pb - deriv) <= tol_b)) return say("the backend's", pb, tol_b);
  }
  return {};
}

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

AttentionData draw(AttentionGen g = {}) {
  return make_data(*gen_attention(g));
}

std::string fwd_bwd_same(const std::string& tag, const Backend& be, const AttentionData& a,
                         const AttentionData& b, const AttentionScales& sc) {
  std::string m = attention_same(tag + " out", run_forward(be, a), run_forward(be, b), sc.out, sc);
  if (m.empty()) m = grads_same(tag, run_backward(be, a), run_backward(be, b), sc);
  return m;
}

// ---------------------------------------------------------------- agreement

void agree_forward(const Backend& be) {
  const AttentionData d = draw();
  const AttentionScales sc = scales(d);
  TANDEM_REQUIRE_EMPTY(
      attention_close("out", run_forward(be, d), reference_forward(d), sc.out, sc));
}

void agree_backward(const Backend& be) {
  const AttentionData d = draw();
  TANDEM_REQUIRE_EMPTY(
      grads_close("one-call", run_backward(be, d), reference_backward(d), scales(d)));
}

void agree_backward_separate(const Backend& be) {
  const AttentionData d = draw();
  TANDEM_REQUIRE_EMPTY(
      grads_close("separate", run_backward_separate(be, d), reference_backward(d), scales(d)));
}

/// attention_forward_lse agrees with the reference (out and the log-sum-exp),
/// and attention_backward_saved, fed what that forward saved, agrees with the
/// reference backward. A backend without these entries has nothing to prove.
void agree_saved(const Backend& be) {
  if (!be.attention_forward_lse || !be.attention_backward_saved) return;
  const AttentionData d = draw();
  const AttentionScales sc = scales(d);
  const AttentionPlan& p = d.plan;
  const Saved saved = run_forward_lse(be, d);
  TANDEM_REQUIRE_EMPTY(
      attention_close("forward_lse out",
                      gather<float>(p.o, p.B, p.Sq, p.H, p.Dv, std::span<const float>(saved.out)),
                      reference_forward(d), sc.out, sc));
  // |lse| <= L + log Sk: its rounding scales with that
  const double lse_scale = 1 + sc.L + std::log(double(p.Sk));
  TANDEM_REQUIRE_EMPTY(
      attention_close("lse", to_double(saved.lse), reference_lse(d), lse_scale, sc));
  TANDEM_REQUIRE_EMPTY(
      grads_close("saved-state", run_backward_saved(be, d, saved), reference_backward(d), sc));
}

// ---------------------------------------------------------------- transpose

void one_call_equals_separate(const Backend& be) {
  const AttentionData d = draw();
  TANDEM_REQUIRE_EMPTY(grads_same("one-call vs separate", run_backward(be, d),
                                  run_backward_separate(be, d), scales(d)));
}

// ----------------------------------------------------------------- gradient

void attention_gradient(const Backend& be) {
  TANDEM_REQUIRE_EMPTY(complex_step_mismatch(be, *gen_attention(AttentionGen{}.with_max_dim(17))));
}

// ------------------------------------------------------------------- layout

/// bshd ≡ bhsd ≡ rank 3 ≡ rank 4 from shapes, after transposition.
void layouts_equivalent(const Backend& be) {
  const AttentionCase c = *gen_attention(AttentionGen{}.with_layout(Layout::bshd).no_strides());
  const AttentionData d = make_data(c);
  const AttentionPlan& p = d.plan;
  const AttentionScales sc = scales(d);
  std::optional<Shape> ms;
  if (p.mask == MaskKind::key_padding) ms = Shape{p.B, p.Sk};
  if (p.mask == MaskKind::bias) ms = Shape{p.bias_batch, p.bias_heads, p.Sq, p.Sk};
  AttentionAttrs a;
  a.num_heads = p.H;
  a.mask = p.mask;
  a.window = p.window;
  a.scale = c.params.scale;
  a.softcap = p.softcap;
  AttentionParams pb = c.params;
  pb.layout = Layout::bhsd;
  const AttentionPlan rank3 = AttentionPlan::from_shapes(
      {p.B, p.Sq, p.H * p.D}, {p.B, p.Sk, p.Hkv * p.D}, {p.B, p.Sk, p.Hkv * p.Dv}, ms, a);
  a.layout = tandem::QkvLayout::bhsd;
  const AttentionPlan rank4 = AttentionPlan::from_shapes(
      {p.B, p.H, p.Sq, p.D}, {p.B, p.Hkv, p.Sk, p.D}, {p.B, p.Hkv, p.Sk, p.Dv}, ms, a);
  RC_ASSERT(rank4.layout == Layout::bhsd);
  AttentionData e = d;
  e.plan = AttentionPlan::make(pb);
  TANDEM_REQUIRE_EMPTY(fwd_bwd_same("bhsd vs bshd", be, e, d, sc));
  e.plan = rank3;
  TANDEM_REQUIRE_EMPTY(fwd_bwd_same("rank-3 vs bshd", be, e, d, sc));
  e.plan = rank4;
  TANDEM_REQUIRE_EMPTY(fwd_bwd_same("rank-4 bhsd (from shapes) vs bshd", be, e, d, sc));
}

/// Rows read out of a wider parent (junk NaN in the gaps) ≡ contiguous copies.
void strided_rows(const Backend& be) {
  AttentionCase c = *gen_attention(AttentionGen{}.with_layout(Layout::bshd).no_strides());
  AttentionParams& p = c.params;
  const i64 dv = p.Dv == 0 ? p.D : p.Dv;
  p.q_row_stride = p.H * p.D + *rc::gen::inRange<i64>(1, 6);
  p.k_row_stride = p.Hkv * p.D + *rc::gen::inRange<i64>(0, 6);
  p.v_row_stride = p.Hkv * dv + *rc::gen::inRange<i64>(1, 6);
  const AttentionData d = make_data(c);
  AttentionParams pc = p;
  pc.q_row_stride = pc.k_row_stride = pc.v_row_stride = 0;
  TANDEM_REQUIRE_EMPTY(fwd_bwd_same("strided vs contiguous", be, d, with_plan(d, pc), scales(d)));
}

// ---------------------------------------------------------------- semantics

/// GQA ≡ MHA with every kv head repeated for its group; dK, dV summed over the group.
void gqa_equals_mha(const Backend& be) {
  const AttentionData d = draw();
  const AttentionPlan& p = d.plan;
  const AttentionScales sc = scales(d);
  const i64 G = p.group();
  AttentionParams pm;
  pm.B = p.B;
  pm.Sq = p.Sq;
  pm.Sk = p.Sk;
  pm.H = pm.Hkv = p.H;
  pm.D = p.D;
  pm.Dv = p.Dv;
  pm.layout = p.layout;
  pm.mask = p.mask;
  pm.window = p.window;
  pm.scale = p.scale;
  pm.softcap = p.softcap;
  pm.bias_batch = p.bias_batch;
  pm.bias_heads = p.bias_heads;
  AttentionData m = with_plan(d, pm);
  const auto repeat = [&](const std::vector<float>& t, i64 width) {
    std::vector<float> out(p.B * p.Sk * p.H * width);
    for (i64 b = 0; b < p.B; ++b)
      for (i64 s = 0; s < p.Sk; ++s)
        for (i64 h = 0; h < p.H; ++h)
          for (i64 e = 0; e < width; ++e)
            out[((b * p.Sk + s) * p.H + h) * width + e] =
                t[((b * p.Sk + s) * p.Hkv + h / G) * width + e];
    return out;
  };
  m.k = repeat(d.k, p.D);
  m.v = repeat(d.v, p.Dv);
  TANDEM_REQUIRE_EMPTY(
      attention_same("GQA out vs MHA", run_forward(be, d), run_forward(be, m), sc.out, sc));
  const Grads gg = run_backward(be, d), gm = run_backward(be, m);
  const auto group_sum = [&](const std::vector<float>& t, i64 width) {
    std::vector<double> out(p.B * p.Sk * p.Hkv * width, 0.0);
    for (i64 b = 0; b < p.B; ++b)
      for (i64 s = 0; s < p.Sk; ++s)
        for (i64 h = 0; h < p.H; ++h)
          for (i64 e = 0; e < width; ++e)
            out[((b * p.Sk + s) * p.Hkv + h / G) * width + e] +=
                t[((b * p.Sk + s) * p.H + h) * width + e];
    return out;
  };
  TANDEM_REQUIRE_EMPTY(attention_same("GQA dq vs MHA", gg.dq, gm.dq, sc.dq, sc));
  TANDEM_REQUIRE_EMPTY(attention_close("GQA dk vs MHA summed over the group", gg.dk,
                                       group_sum(gm.dk, p.D), sc.dk * G, sc));
  TANDEM_REQUIRE_EMPTY(attention_close("GQA dv vs MHA summed over the group", gg.dv,
                                       group_sum(gm.dv, p.Dv), sc.dv * G, sc));
}

/// sliding_window(w) with w >= max(Sq, Sk) − 1 ≡ causal. (With Sq > Sk + 1,
/// w = Sk is not enough: query i sits at key position i and sees i − w.. i.)
void wide_window_equals_causal(const Backend& be) {
  const AttentionCase c = *gen_attention(AttentionGen{}.with_mask(MaskKind::causal));
  const AttentionData d = make_data(c);
  AttentionParams pw = c.params;
  pw.mask = MaskKind::sliding_window;
  pw.window = std::max(pw.Sq, pw.Sk) - 1 + *rc::gen::inRange<i64>(0, 4);
  TANDEM_REQUIRE_EMPTY(fwd_bwd_same("window vs causal", be, with_plan(d, pw), d, scales(d)));
}

/// A [1,1,Sq,Sk] bias of 0 on and below the (bottom-right) diagonal and −inf above ≡ causal.
void bias_equals_causal(const Backend& be) {
  const AttentionCase c = *gen_attention(AttentionGen{}.with_mask(MaskKind::causal));
  const AttentionData d = make_data(c);
  AttentionParams pb = c.params;
  pb.mask = MaskKind::bias;
  pb.bias_batch = pb.bias_heads = 1;
  AttentionData e = with_plan(d, pb);
  const i64 Sq = d.plan.Sq, Sk = d.plan.Sk, off = std::max<i64>(Sk - Sq, 0);
  e.mask.assign(Sq * Sk, 0.0f);
  for (i64 i = 0; i < Sq; ++i)
    for (i64 j = 0; j < Sk; ++j) e.mask[i * Sk + j] = j <= off + i ? 0.0f : -kInf;
  TANDEM_REQUIRE_EMPTY(fwd_bwd_same("bias vs causal", be, e, d, scales(d)));
}

/// key_padding ≡ a [B,1,Sq,Sk] bias with −inf on the padded keys.
void key_padding_equals_bias(const Backend& be) {
  const AttentionCase c = *gen_attention(AttentionGen{}.with_mask(MaskKind::key_padding));
  const AttentionData d = make_data(c);
  AttentionParams pb = c.params;
  pb.mask = MaskKind::bias;
  pb.bias_batch = pb.B;
  pb.bias_heads = 1;
  AttentionData e = with_plan(d, pb);
  const i64 B = d.plan.B, Sq = d.plan.Sq, Sk = d.plan.Sk;
  e.mask.assign(B * Sq * Sk, 0.0f);
  for (i64 b = 0; b < B; ++b)
    for (i64 i = 0; i < Sq; ++i)
      for (i64 j = 0; j < Sk; ++j)
        e.mask[(b * Sq + i) * Sk + j] = d.mask[b * Sk + j] != 0 ? 0.0f : -kInf;
  TANDEM_REQUIRE_EMPTY(fwd_bwd_same("bias vs key_padding", be, e, d, scales(d)));
}

/// softcap c >= 1e4·(1 + L) ≡ no softcap.
void huge_softcap_equals_none(const Backend& be) {
  const AttentionCase c = *gen_attention(AttentionGen{}.no_softcap());
  const AttentionData d = make_data(c);
  AttentionParams pc = c.params;
  pc.softcap = 1e4 * (1 + logit_bound(d));
  TANDEM_REQUIRE_EMPTY(fwd_bwd_same("huge softcap vs none", be, with_plan(d, pc), d, scales(d)));
}

/// Permuting keys together with their values and mask columns leaves
/// non-causal attention unchanged (and permutes dK, dV).
void key_permutation(const Backend& be) {
  const MaskKind mk = *rc::gen::element(MaskKind::none, MaskKind::key_padding, MaskKind::bias);
  const AttentionCase c = *gen_attention(AttentionGen{}.with_mask(mk));
  const AttentionData d = make_data(c);
  const AttentionPlan& p = d.plan;
  const AttentionScales sc = scales(d);
  std::vector<i64> perm(p.Sk);
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937_64 g(c.seed + 3);
  std::shuffle(perm.begin(), perm.end(), g);
  AttentionData e = d;
  const auto permute_keys = [&](const std::vector<float>& t, i64 width) {
    std::vector<float> out(t.size());
    for (i64 b = 0; b < p.B; ++b)
      for (i64 j = 0; j < p.Sk; ++j)
        for (i64 e2 = 0; e2 < p.Hkv * width; ++e2)
          out[(b * p.Sk + j) * p.Hkv * width + e2] = t[(b * p.Sk + perm[j]) * p.Hkv * width + e2];
    return out;
  };
  e.k = permute_keys(d.k, p.D);
  e.v = permute_keys(d.v, p.Dv);
  for (std::size_t r = 0; r < d.mask.size() / p.Sk; ++r)
    for (i64 j = 0; j < p.Sk; ++j) e.mask[r * p.Sk + j] = d.mask[r * p.Sk + perm[j]];
  TANDEM_REQUIRE_EMPTY(
      attention_same("out with permuted keys", run_forward(be, e), run_forward(be, d), sc.out, sc));
  const Grads ge = run_backward(be, e), gd = run_backward(be, d);
  TANDEM_REQUIRE_EMPTY(attention_same("dq with permuted keys", ge.dq, gd.dq, sc.dq, sc));
  TANDEM_REQUIRE_EMPTY(
      attention_same("dk with permuted keys", ge.dk, permute_keys(gd.dk, p.D), sc.dk, sc));
  TANDEM_REQUIRE_EMPTY(
      attention_same("dv with permuted keys", ge.dv, permute_keys(gd.dv, p.Dv), sc.dv, sc));
}

/// NaN in k and v of a key never changes the rows that do not see that key,
/// nor the dk and dv of a key that no row sees together with it (dk_j and
/// dv_j sum over the rows of kv head g's query heads that see j). The key is
/// one hidden from some row, or, in every other case, one that some row sees:
/// a visible NaN key makes the lse and rowsum(dO ∘ O) of its rows NaN, which
/// must not reach the keys hidden from those rows (the backward's careful
/// path).
void masked_keys_ignored(const Backend& be) {
  const MaskKind mk = *rc::gen::element(MaskKind::causal, MaskKind::sliding_window,
                                        MaskKind::key_padding, MaskKind::bias);
  const AttentionCase c = *gen_attention(AttentionGen{}.with_mask(mk));
  const AttentionData d = make_data(c);
  const AttentionPlan& p = d.plan;
  // (b, j) hidden from at least one query row; seen by at least one
  std::vector<std::pair<i64, i64>> hidden, seen;
  for (i64 b = 0; b < p.B; ++b)
    for (i64 j = 0; j < p.Sk; ++j) {
      bool some_hidden = false, some_seen = false;
      for (i64 h = 0; h < p.H; ++h)
        for (i64 i = 0; i < p.Sq; ++i) {
          const bool v = visible(p, d.mask, b, h, i, j);
          some_hidden = some_hidden || !v;
          some_seen = some_seen || v;
        }
      if (some_hidden) hidden.emplace_back(b, j);
      if (some_seen) seen.emplace_back(b, j);
    }
  Rng r(c.seed + 5);
  const bool seen_key = hidden.empty() || (!seen.empty() && r.index(2) == 0);
  RC_CLASSIFY(seen_key, "key seen by some row");
  const auto& keys = seen_key ? seen : hidden;
  if (keys.empty()) return;
  const auto [bs, js] = keys[r.index(static_cast<i64>(keys.size()))];
  AttentionData e = d;
  for (i64 g = 0; g < p.Hkv; ++g) {
    for (i64 x = 0; x < p.D; ++x) e.k[((bs * p.Sk + js) * p.Hkv + g) * p.D + x] = junk();
    for (i64 x = 0; x < p.Dv; ++x) e.v[((bs * p.Sk + js) * p.Hkv + g) * p.Dv + x] = junk();
  }
  const auto o1 = run_forward(be, d), o2 = run_forward(be, e);
  const Grads g1 = run_backward(be, d), g2 = run_backward(be, e);
  const AttentionScales sc = scales(d);
  std::vector<float> a, b, ga, gb;
  for (i64 h = 0; h < p.H; ++h)
    for (i64 i = 0; i < p.Sq; ++i) {
      if (visible(p, d.mask, bs, h, i, js)) continue;
      const i64 ro = ((bs * p.Sq + i) * p.H + h) * p.Dv, rq = ((bs * p.Sq + i) * p.H + h) * p.D;
      a.insert(a.end(), o2.begin() + ro, o2.begin() + ro + p.Dv);
      b.insert(b.end(), o1.begin() + ro, o1.begin() + ro + p.Dv);
      ga.insert(ga.end(), g2.dq.begin() + rq, g2.dq.begin() + rq + p.D);
      gb.insert(gb.end(), g1.dq.begin() + rq, g1.dq.begin() + rq + p.D);
    }
  std::vector<float> ka, kb, va, vb;
  const i64 G = p.H / p.Hkv;
  for (i64 g = 0; g < p.Hkv; ++g)
    for (i64 j = 0; j < p.Sk; ++j) {
      bool shared = false;
      for (i64 h = g * G; h < (g + 1) * G && !shared; ++h)
        for (i64 i = 0; i < p.Sq && !shared; ++i)
          shared = visible(p, d.mask, bs, h, i, js) && visible(p, d.mask, bs, h, i, j);
      if (shared) continue;
      const i64 rk = ((bs * p.Sk + j) * p.Hkv + g) * p.D, rv = ((bs * p.Sk + j) * p.Hkv + g) * p.Dv;
      ka.insert(ka.end(), g2.dk.begin() + rk, g2.dk.begin() + rk + p.D);
      kb.insert(kb.end(), g1.dk.begin() + rk, g1.dk.begin() + rk + p.D);
      va.insert(va.end(), g2.dv.begin() + rv, g2.dv.begin() + rv + p.Dv);
      vb.insert(vb.end(), g1.dv.begin() + rv, g1.dv.begin() + rv + p.Dv);
    }
  const std::string key =
      " with key (b=" + std::to_string(bs) + ", j=" + std::to_string(js) + ") set to NaN";
  TANDEM_REQUIRE_EMPTY(attention_same("out of rows not seeing it" + key, a, b, sc.out, sc));
  TANDEM_REQUIRE_EMPTY(attention_same("dq of rows not seeing it" + key, ga, gb, sc.dq, sc));
  TANDEM_REQUIRE_EMPTY(
      attention_same("dk of keys seen by no row with it" + key, ka, kb, sc.dk, sc));
  TANDEM_REQUIRE_EMPTY(
      attention_same("dv of keys seen by no row with it" + key, va, vb, sc.dv, sc));
}

/// A query row with no visible key outputs exactly 0, has dq = 0, nothing is
/// NaN, and its dO contributes nothing to dK and dV.
void fully_masked_rows(const Backend& be) {
  const MaskKind mk =
      *rc::gen::element(MaskKind::key_padding, MaskKind::bias, MaskKind::sliding_window);
  AttentionCase c = *gen_attention(AttentionGen{}.with_mask(mk));
  if (mk == MaskKind::sliding_window) {
    c.params.window = std::min<i64>(c.params.window, 3);
    c.params.Sq = c.params.Sk + c.params.window + 1 + *rc::gen::inRange<i64>(0, 3);
  } else {
    c.masked_rows = true;
  }
  const AttentionData d = make_data(c);
  const AttentionPlan& p = d.plan;
  std::vector<char> empty(p.B * p.Sq * p.H, 1);
  for (i64 b = 0; b < p.B; ++b)
    for (i64 i = 0; i < p.Sq; ++i)
      for (i64 h = 0; h < p.H; ++h)
        for (i64 j = 0; j < p.Sk; ++j)
          if (visible(p, d.mask, b, h, i, j)) empty[(b * p.Sq + i) * p.H + h] = 0;
  RC_ASSERT(std::count(empty.begin(), empty.end(), 1) > 0);
  const auto o = run_forward(be, d);
  const Grads g = run_backward(be, d);
  for (std::size_t r = 0; r < empty.size(); ++r) {
    for (i64 x = 0; x < p.Dv; ++x) {
      const float y = o[r * p.Dv + x];
      if (empty[r] ? y != 0.0f : !std::isfinite(y)) {
        RC_FAIL("out row " + std::to_string(r) + (empty[r] ? " (fully masked)" : "") + " holds " +
                std::to_string(y));
      }
    }
    for (i64 x = 0; x < p.D; ++x) {
      const float y = g.dq[r * p.D + x];
      if (empty[r] ? y != 0.0f : !std::isfinite(y)) {
        RC_FAIL("dq row " + std::to_string(r) + (empty[r] ? " (fully masked)" : "") + " holds " +
                std::to_string(y));
      }
    }
  }
  for (float y : g.dk) RC_ASSERT(std::isfinite(y));
  for (float y : g.dv) RC_ASSERT(std::isfinite(y));
  AttentionData e = d;
  for (std::size_t r = 0; r < empty.size(); ++r)
    if (empty[r])
      for (i64 x = 0; x < p.Dv; ++x) e.dout[r * p.Dv + x] = 1000.0f * (1 + x % 3);
  const Grads ge = run_backward(be, e);
  const AttentionScales sc = scales(d);
  TANDEM_REQUIRE_EMPTY(
      attention_same("dk after changing dO of fully masked rows", ge.dk, g.dk, sc.dk, sc));
  TANDEM_REQUIRE_EMPTY(
      attention_same("dv after changing dO of fully masked rows", ge.dv, g.dv, sc.dv, sc));
}

template <void (*F)(const Backend&)>
std::function<void(const Subject&)> on_backend() {
  return [](const Subject& s) { F(s.backend); };
}

}  // namespace

void register_attention_properties(std::vector<Property>& v) {
  v.push_back({"agree_attention_forward", "agreement", 300, on_backend<agree_forward>()});
  v.push_back({"agree_attention_backward", "agreement", 200, on_backend<agree_backward>()});
  v.push_back({"agree_attention_saved_state", "agreement", 150, on_backend<agree_saved>()});
  v.push_back({"agree_attention_backward_separate", "agreement", 100,
               on_backend<agree_backward_separate>()});
  v.push_back({"attention_one_call_backward_equals_separate", "transpose", 100,
               on_backend<one_call_equals_separate>()});
  v.push_back(
      {"attention_gradient_complex_step", "gradient", 150, on_backend<attention_gradient>()});
  v.push_back({"attention_layouts_equivalent", "layout", 100, on_backend<layouts_equivalent>()});
  v.push_back(
      {"attention_strided_rows_equal_contiguous", "layout", 100, on_backend<strided_rows>()});
  v.push_back({"gqa_equals_repeated_mha", "semantic", 100, on_backend<gqa_equals_mha>()});
  v.push_back(
      {"wide_window_equals_causal", "semantic", 100, on_backend<wide_window_equals_causal>()});
  v.push_back({"bias_upper_inf_equals_causal", "semantic", 100, on_backend<bias_equals_causal>()});
  v.push_back({"key_padding_equals_bias", "semantic", 100, on_backend<key_padding_equals_bias>()});
  v.push_back(
      {"huge_softcap_equals_none", "semantic", 100, on_backend<huge_softcap_equals_none>()});
  v.push_back({"key_permutation_invariance", "semantic", 100, on_backend<key_permutation>()});
  v.push_back({"masked_keys_never_read", "semantic", 150, on_backend<masked_keys_ignored>()});
  v.push_back({"fully_masked_rows_zero", "semantic", 150, on_backend<fully_masked_rows>()});
}

}  // namespace tandem::props
