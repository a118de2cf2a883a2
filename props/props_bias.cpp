// SPDX-License-Identifier: Apache-2.0
// Properties of the bias gradient dbias (SPEC §3): agreement with the
// reference, the complex-step derivative of the reference with respect to
// the bias, a broadcast bias's gradient as the full gradient summed over its
// broadcast axes, and identical bits at every thread count.
#include <complex>
#include <sstream>

#include "checks.hpp"

namespace tandem::props {
namespace {

/// A dense case with a bias mask, sinks and ALiBi sometimes (when the
/// subject has them), any bias shape [1|B, 1|H, Sq, Sk].
AttentionCase draw_bias_case(const Subject& s, int max_dim = 33) {
  AttentionGen g = AttentionGen{}.with_mask(MaskKind::bias).with_max_dim(max_dim);
  if (s.attention_features) {
    g = g.with(&AttentionGen::sinks, Draw::sometimes).with(&AttentionGen::alibi, Draw::sometimes);
  }
  return *gen_attention(g);
}

/// dbias alone or beside a random subset of the other gradients.
Want draw_want() {
  Want w;
  w.dq = *rc::gen::arbitrary<bool>();
  w.dk = *rc::gen::arbitrary<bool>();
  w.dv = *rc::gen::arbitrary<bool>();
  w.dsinks = *rc::gen::arbitrary<bool>();
  w.dbias = true;
  return w;
}

// ---------------------------------------------------------------- agreement

/// dbias (and whatever else is asked for) of the one-call backward and of
/// the saved-state backward against reference<double>.
void agree_dbias(const Subject& s) {
  const AttentionData d = make_data(draw_bias_case(s));
  const AttentionScales sc = scales(d);
  const Want want = draw_want();
  const GradsD exp = reference_backward(d);
  TANDEM_REQUIRE_EMPTY(grads_close("one-call", run_backward(s.backend, d, want), exp, sc));
  if (!s.backend.attention_forward_lse || !s.backend.attention_backward_saved) return;
  const Saved saved = run_forward_lse(s.backend, d);
  TANDEM_REQUIRE_EMPTY(
      grads_close("saved-state", run_backward_saved(s.backend, d, saved, want), exp, sc));
}

// ----------------------------------------------------------------- gradient

/// <dbias, u> of the backend and of reference<double> against the
/// complex-step derivative d/dt <dO, O(bias + t·u)> of
/// reference<complex<double>> (u uniform in [−1, 1] over the bias).
void dbias_complex_step(const Subject& s) {
  const AttentionCase c = draw_bias_case(s, 17);
  const AttentionData d = make_data(c);
  const AttentionScales sc = scales(d);
  Want only;
  only.dq = only.dk = only.dv = only.dsinks = false;
  only.dbias = true;
  const Grads g = run_backward(s.backend, d, only);
  const GradsD gr = reference_backward(d);
  using C = std::complex<double>;
  const double h = 1e-20;
  Rng r(c.seed + 11);
  const std::vector<float> u = r.values(d.mask.size(), 1.0);
  std::vector<C> step(u.size());
  for (std::size_t e = 0; e < u.size(); ++e) step[e] = C(0.0, h * u[e]);
  const std::vector<C> q(d.q.begin(), d.q.end()), k(d.k.begin(), d.k.end()),
      v(d.v.begin(), d.v.end()), sinks(d.sinks.begin(), d.sinks.end());
  using CS = std::span<const C>;
  const std::vector<C> o = reference_forward<C, C>(d, CS(q), CS(k), CS(v), CS(sinks), CS(step));
  double deriv = 0;
  for (std::size_t e = 0; e < o.size(); ++e) deriv += double(d.dout[e]) * o[e].imag() / h;
  double pb = 0, pd = 0, mag = 0;
  for (std::size_t e = 0; e < u.size(); ++e) {
    pb += double(g.dbias[e]) * u[e];
    pd += gr.dbias[e] * u[e];
    mag += std::abs(gr.dbias[e] * u[e]);
  }
  const auto say = [&](const char* who, double got, double tol) {
    std::ostringstream os;
    os.precision(9);
    os << who << " <dbias, u> = " << got << " but the complex-step derivative is " << deriv
       << " (tolerance " << tol << ")";
    return os.str();
  };
  const double tol_d = 1e-9 * (mag + sc.dbias);
  if (!(std::abs(pd - deriv) <= tol_d)) RC_FAIL(say("reference<double>", pd, tol_d));
  const double tol_b = 64 * kEps * (1 + sc.L) * (mag + sc.dbias) + double(u.size()) * sc.underflow;
  if (!(std::abs(pb - deriv) <= tol_b)) RC_FAIL(say("the backend's", pb, tol_b));
}

// ----------------------------------------------------------------- semantic

/// A broadcast bias [Bb, Hb, Sq, Sk] (Bb = 1 or Hb = 1) and the same bias
/// repeated to [B, H, Sq, Sk] give the same attention, so the broadcast
/// bias's dbias is the full one's summed over b (Bb = 1) and h (Hb = 1).
void dbias_broadcast_equals_summed(const Subject& s) {
  const AttentionCase c = draw_bias_case(s);
  AttentionData d = make_data(c);
  if (d.plan.bias_batch == d.plan.B && d.plan.bias_heads == d.plan.H) {
    // a full bias drawn: broadcast its first [Sq, Sk] over every (b, h) instead
    AttentionParams one = c.params;
    one.bias_batch = one.bias_heads = 1;
    d = with_plan(d, one);
    d.mask.resize(static_cast<std::size_t>(d.plan.mask_size()));
  }
  const AttentionPlan& p = d.plan;
  AttentionParams full = c.params;
  full.bias_batch = p.B;
  full.bias_heads = p.H;
  AttentionData e = with_plan(d, full);
  e.mask.assign(static_cast<std::size_t>(e.plan.mask_size()), 0.0f);
  for (i64 b = 0; b < p.B; ++b) {
    for (i64 h = 0; h < p.H; ++h) {
      for (i64 i = 0; i < p.Sq; ++i) {
        std::copy_n(d.mask.begin() + p.mask_row(b, h, i), p.Sk,
                    e.mask.begin() + e.plan.mask_row(b, h, i));
      }
    }
  }
  Want only;
  only.dq = only.dk = only.dv = only.dsinks = false;
  only.dbias = true;
  const std::vector<float> broadcast = run_backward(s.backend, d, only).dbias;
  const std::vector<float> each = run_backward(s.backend, e, only).dbias;
  // Σ over the (b, h) that share each element of the broadcast bias, in double
  std::vector<double> summed(broadcast.size(), 0.0);
  for (i64 b = 0; b < p.B; ++b) {
    for (i64 h = 0; h < p.H; ++h) {
      for (i64 i = 0; i < p.Sq; ++i) {
        for (i64 j = 0; j < p.Sk; ++j) {
          summed[p.mask_row(b, h, i) + j] += each[e.plan.mask_row(b, h, i) + j];
        }
      }
    }
  }
  RC_TAG(p.bias_batch == 1 ? "Bb = 1" : "Bb = B", p.bias_heads == 1 ? "Hb = 1" : "Hb = H");
  TANDEM_REQUIRE_EMPTY(attention_close(
      "broadcast dbias vs the full dbias summed", std::span<const double>(to_double(broadcast)),
      std::span<const double>(summed), scales(d).dbias, scales(d)));
}

// -------------------------------------------------------------- determinism

/// dbias (beside a random subset of the other gradients) has identical bits
/// on a repeated call and on every thread variant, one-call and saved-state.
void dbias_deterministic(const Subject& s) {
  const AttentionData d = make_data(draw_bias_case(s));
  const Want want = draw_want();
  const auto replay = [&](const Backend& be) {
    Outputs r;
    const Grads g = run_backward(be, d, want);
    r.push_back(g.dbias);
    if (be.attention_forward_lse && be.attention_backward_saved) {
      r.push_back(run_backward_saved(be, d, run_forward_lse(be, d), want).dbias);
    }
    return r;
  };
  TANDEM_REQUIRE_EMPTY(same_bits_on_every_run(s, replay, "a backward with dbias"));
}

}  // namespace

void register_bias_properties(std::vector<Property>& v) {
  v.push_back({"agree_attention_dbias", "agreement", 200, agree_dbias});
  v.push_back({"attention_dbias_complex_step", "gradient", 150, dbias_complex_step});
  v.push_back({"dbias_broadcast_equals_summed", "semantic", 100, dbias_broadcast_equals_summed});
  v.push_back({"attention_dbias_deterministic", "determinism", 100, dbias_deterministic});
}

}  // namespace tandem::props
