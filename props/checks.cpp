// SPDX-License-Identifier: Apache-2.0
#include "checks.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace tandem::props {
namespace {
double max_row_norm(const std::vector<float>& t, i64 width) {
  double m = 0;
  for (std::size_t r = 0; r < t.size() / static_cast<std::size_t>(width); ++r) {
    double s = 0;
    for (i64 e = 0; e < width; ++e) s += double(t[r * width + e]) * t[r * width + e];
    m = std::max(m, std::sqrt(s));
  }
  return m;
}
}  // namespace

AttentionScales scales(const AttentionData& d) {
  const AttentionPlan& p = d.plan;
  AttentionScales s;
  s.L = logit_bound(d);
  const double nq = max_row_norm(d.q, p.D), nk = max_row_norm(d.k, p.D),
               nv = max_row_norm(d.v, p.Dv), ndo = max_row_norm(d.dout, p.Dv);
  // dk and dv sum over every query row (of every head in the group) that sees
  // key j, so their scale grows with the largest column sum Σ_i p_ij. With
  // dO = 1 the backward's dv[j,:] is exactly that column sum.
  AttentionData ones = d;
  std::fill(ones.dout.begin(), ones.dout.end(), 1.0f);
  // (a paged cache has no backward, and no gradient to scale)
  const double colsum = p.paged() ? 1.0 : std::max(1.0, max_abs(reference_backward(ones).dv));
  s.out = max_abs(to_double(d.v));
  s.dq = std::abs(p.scale) * ndo * nv * nk;
  s.dk = std::abs(p.scale) * ndo * nv * nq * colsum;
  s.dv = ndo * colsum;
  s.dsinks = ndo * nv * double(p.B * p.Sq);
  // |ds_ij| = p_ij·|dp_ij − delta_i| <= 2‖dO_i‖·max‖v‖, summed over the broadcast axes
  s.dbias = 2 * ndo * nv * double((p.B / p.bias_batch) * (p.H / p.bias_heads));
  // the longest chains: Σ over keys (out, dq), over the G·Sq rows of a kv
  // head (dk, dv), over d (scores, dP); a few products per term
  s.underflow = 4 * double(p.group() * p.Sq + p.Sk + p.D + p.Dv) * 0x1p-150;
  return s;
}

std::string attention_close(const std::string& what, std::span<const double> got,
                            std::span<const double> exp, double nat, const AttentionScales& sc) {
  const double M = std::max(max_abs(exp), nat);
  const double r = 64 * kEps * (1 + sc.L);
  return mismatch(what, got, exp, r * M + sc.underflow, r);
}

std::string attention_close(const std::string& what, const std::vector<float>& got,
                            const std::vector<double>& exp, double nat, const AttentionScales& sc) {
  const auto g = to_double(got);
  return attention_close(what, std::span<const double>(g), std::span<const double>(exp), nat, sc);
}

std::string attention_same(const std::string& what, const std::vector<float>& a,
                           const std::vector<float>& b, double nat, const AttentionScales& sc) {
  return attention_close(what, a, to_double(b), nat, sc);
}

GradsD to_double(const Grads& g) {
  return {props::to_double(g.dq), props::to_double(g.dk), props::to_double(g.dv),
          props::to_double(g.dsinks), props::to_double(g.dbias)};
}

std::string grads_close(const std::string& tag, const Grads& got, const GradsD& exp,
                        const AttentionScales& sc) {
  std::string m;
  const auto one = [&](const char* name, const std::vector<float>& g, const std::vector<double>& e,
                       double nat) {
    if (m.empty() && !g.empty()) m = attention_close(tag + " " + name, g, e, nat, sc);
  };
  one("dq", got.dq, exp.dq, sc.dq);
  one("dk", got.dk, exp.dk, sc.dk);
  one("dv", got.dv, exp.dv, sc.dv);
  one("dsinks", got.dsinks, exp.dsinks, sc.dsinks);
  if (!exp.dbias.empty()) one("dbias", got.dbias, exp.dbias, sc.dbias);
  return m;
}

std::string grads_same(const std::string& tag, const Grads& a, const Grads& b,
                       const AttentionScales& sc) {
  return grads_close(tag, a, to_double(b), sc);
}

std::string rope_close(const std::string& what, const std::vector<float>& got,
                       const std::vector<double>& exp, double xmax) {
  const auto g = to_double(got);
  return mismatch(what, g, exp, 32 * kEps * xmax, 32 * kEps);
}

std::string swiglu_close(const std::string& what, const std::vector<float>& got,
                         const std::vector<double>& exp) {
  const auto g = to_double(got);
  return mismatch(what, g, exp, 32 * kEps * max_abs(exp), 64 * kEps);
}

std::string block_close(const std::string& what, const std::vector<float>& got,
                        const std::vector<double>& exp) {
  const auto g = to_double(got);
  return mismatch(what, g, exp, 512 * kEps * std::max(max_abs(exp), 1.0), 512 * kEps);
}

bool visible(const AttentionPlan& p, std::span<const float> mask, i64 b, i64 h, i64 i, i64 j) {
  const i64 a = std::max<i64>(p.Sk - p.Sq, 0) + i;
  switch (p.mask) {
    case MaskKind::none:
      return true;
    case MaskKind::causal:
      return j <= a;
    case MaskKind::sliding_window:
      return j <= a && j >= a - p.window;
    case MaskKind::key_padding:
      return mask[b * p.Sk + j] != 0.0f;
    case MaskKind::bias: {
      const i64 bb = p.bias_batch == 1 ? 0 : b, hb = p.bias_heads == 1 ? 0 : h;
      return mask[((bb * p.bias_heads + hb) * p.Sq + i) * p.Sk + j] !=
             -std::numeric_limits<float>::infinity();
    }
  }
  return false;
}

}  // namespace tandem::props
