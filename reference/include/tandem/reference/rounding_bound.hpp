// SPDX-License-Identifier: Apache-2.0
/// @file reference/rounding_bound.hpp
/// @brief What a backend computing in float32 may differ from the reference
///        by at T's rounding points (SPEC §10.5): the reference's output
///        before its final rounding, and the slack of the weights that
///        float32 arithmetic may round the other way.
///
/// The reference computes e_ij = 2^(x_ij − μ_i) in double; a float32 kernel
/// computes it with a relative error of at most rel_delta (the caller's
/// bound, from its exp2 and its float32 scores). Where the exact e_ij lies
/// within rel_delta·e_ij (plus float32's absolute subnormal error 2^−149) of a
/// rounding boundary of T, the kernel may round it to the neighbouring value
/// of T, one ulp_T(e_ij) away, and key j is ambiguous. For each element d of
/// o_i:
///
///     unrounded_id = o*_id, the reference's o_i before RN_T (attention_output_row_from)
///     flip_id      = Σ_{ambiguous j} ulp_T(e_ij) · |v_jd| / l_i
///
/// For float16 every key with e_ij below f16's normal range (2^−14) counts as
/// ambiguous: an online softmax rounds it at another spacing (SPEC §10.2),
/// within one subnormal ulp (2^−24). Only the weights' rounding is covered:
/// with the `exact` profile, or float and double storage, flip is 0; the
/// accumulator of the `ggml` profile is not covered (no backend but the
/// reference implements it, SPEC §10.2).
///
/// attention_backward_rounding gives the same for dq, dk and dv: each
/// gradient before its rounding, and the slack of the operands RN_T(p_ij)
/// and RN_T(dx_ij) that float32 may round the other way.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "tandem/attention.hpp"
#include "tandem/reference/attention.hpp"
#include "tandem/reference/quantized.hpp"
#include "tandem/storage.hpp"

namespace tandem::reference {

/// The output before its final rounding and the rounding-flip slack, per
/// element of `out` [plan.o.extent] (0 at no query's element).
struct RoundingBound {
  std::vector<double> unrounded;  ///< o*: the reference's output before RN_T
  std::vector<double> flip;       ///< the slack of the ambiguous weights (file comment)
};

/// ulp_T(x): the spacing of T's values at x >= 0 (its subnormal spacing
/// below the normal range); 0 for float and double, which round nothing in
/// between.
template <class T>
double ulp_of(double x) {
  if constexpr (std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>) {
    const tandem::detail::Format& f =
        std::is_same_v<T, bfloat16> ? tandem::detail::kBf16 : tandem::detail::kF16;
    const int e = x > 0 ? std::max(std::ilogb(x), f.min_exp) : f.min_exp;
    return std::ldexp(1.0, e - f.fraction);
  } else {
    return 0.0;
  }
}

/// True when a value within `slack` of x may round to another value of T
/// than x does (a rounding boundary of T lies within slack of x); false for
/// float and double.
template <class T>
bool rounding_ambiguous(double x, double slack) {
  if constexpr (!is_low_precision_v<T>) {
    return false;
  } else {
    return round_as<T>(x - slack) != round_as<T>(x + slack);
  }
}

/// True when RN_T(e) may differ for a value within rel_delta·e + 2^−149 of e
/// (a rounding boundary of T lies between), or, for float16, when e lies
/// below f16's normal range (file comment).
template <class T>
bool weight_ambiguous(double e, double rel_delta) {
  if (std::is_same_v<T, float16> && e < 0x1p-14) return e > 0;
  return rounding_ambiguous<T>(e, rel_delta * e + 0x1p-149);
}

namespace detail {

/// Adds query i's o* and flip to `bound` at out offset `at`: flip_d =
/// Σ_{ambiguous j} ulp_T(e_ij)·|value(key j, d)| / l_i.
template <class T, class Value>
void add_rounding_bound(const AttentionPlan& plan, const AttentionSeq& seq,
                        const AttentionRow<double>& row, const std::vector<double>& o_star,
                        const Value& value, double rel_delta, std::int64_t at,
                        RoundingBound& bound) {
  for (std::int64_t d = 0; d < plan.Dv; ++d) {
    bound.unrounded[at + d] = o_star[d];
    if (!is_low_precision_v<T> || !plan.rounding.operands || row.e.empty()) continue;
    double flip_d = 0.0;
    for (std::int64_t j = 0; j < seq.Sk; ++j) {
      if (!row.visible[j] || !weight_ambiguous<T>(row.e[j], rel_delta)) continue;
      flip_d += ulp_of<T>(row.e[j]) * std::fabs(value(seq.key_row(j), d)) / row.l;
    }
    bound.flip[at + d] = flip_d;
  }
}

/// The forward bound over every query row of every sequence and head:
/// row_of(seq, h, i) is the reference's row i (e_ij, l_i, visible keys),
/// o_star_of(seq, row, h) its output before RN_T, and v_jd(key, g, d) the
/// value element that weighs in its flip (kv head g).
template <class T, class RowOf, class OStarOf, class ValueOf>
RoundingBound forward_rounding(const AttentionPlan& plan, const AttentionInputs<T>& in,
                               const RowOf& row_of, const OStarOf& o_star_of, const ValueOf& v_jd,
                               double rel_delta) {
  const auto size = static_cast<std::size_t>(plan.o.extent);
  RoundingBound bound{std::vector<double>(size, 0.0), std::vector<double>(size, 0.0)};
  for (std::int64_t n = 0; n < plan.sequences(); ++n) {
    const AttentionSeq seq = plan.sequence(in, n);
    for (std::int64_t h = 0; h < plan.H; ++h) {
      const std::int64_t g = plan.kv_head(h);
      const auto value = [&](const KeyRow& key, std::int64_t d) { return v_jd(key, g, d); };
      for (std::int64_t i = 0; i < seq.Sq; ++i) {
        const AttentionRow<double> row = row_of(seq, h, i);
        const std::vector<double> o_star = o_star_of(seq, row, h);
        add_rounding_bound<T>(plan, seq, row, o_star, value, rel_delta,
                              plan.o.at(seq.b, seq.q_row(i), h), bound);
      }
    }
  }
  return bound;
}

}  // namespace detail

/// The agreement bound of attention_forward (SPEC §10.5, file comment):
/// o* and flip `[plan.o.extent]` for the reference at storage T (sums in
/// double) and plan.rounding. Throws tandem::Error when the inputs do not
/// fit the plan.
template <class T>
RoundingBound attention_forward_rounding(const AttentionPlan& plan, const AttentionInputs<T>& in,
                                         double rel_delta) {
  check_inputs(plan, in);
  return detail::forward_rounding<T>(
      plan, in,
      [&](const AttentionSeq& seq, std::int64_t h, std::int64_t i) {
        return attention_row<T, double>(plan, in, seq, h, i);
      },
      [&](const AttentionSeq& seq, const AttentionRow<double>& row, std::int64_t h) {
        return attention_output_row<T, double>(plan, in, seq, row, h);
      },
      [&](const KeyRow& key, std::int64_t g, std::int64_t d) {
        return static_cast<double>(in.v[plan.v.at(key.batch, key.seq, g) + d]);
      },
      rel_delta);
}

/// The agreement bound of attention_forward_quantized (SPEC §10.4, §10.5):
/// as attention_forward_rounding with |v_jd| = σ^v_j·|c^v_jd|. Throws
/// tandem::Error when the inputs do not fit the plan.
template <class T>
RoundingBound attention_forward_quantized_rounding(const AttentionPlan& plan,
                                                   const AttentionInputs<T>& in,
                                                   const QuantizedKv& kv, double rel_delta) {
  check_inputs(plan, in, kv);
  return detail::forward_rounding<T>(
      plan, in,
      [&](const AttentionSeq& seq, std::int64_t h, std::int64_t i) {
        return attention_row_quantized<T, double>(plan, in, kv, seq, h, i);
      },
      [&](const AttentionSeq& seq, const AttentionRow<double>& row, std::int64_t h) {
        return attention_output_row_quantized<T, double>(plan, kv, seq, row, h);
      },
      [&](const KeyRow& key, std::int64_t g, std::int64_t d) {
        return static_cast<double>(kv.v_scale[plan.kv_scale_at(key.batch, key.seq, g)]) *
               code_value(plan.kv_cache, kv.v[plan.v.at(key.batch, key.seq, g) + d]);
      },
      rel_delta);
}

/// The agreement bounds of the three gradients of attention_backward
/// (SPEC §10.2, §10.5): each gradient's value before its final rounding and
/// the slack of the operands that float32 arithmetic may round the other way.
struct BackwardRoundingBound {
  RoundingBound dq;  ///< `[plan.dq.extent]`
  RoundingBound dk;  ///< `[plan.dk.extent]`
  RoundingBound dv;  ///< `[plan.dv.extent]`
};

/// The agreement bound of attention_backward at storage T (sums in double)
/// and plan.rounding, from the stored forward (lse in float32, O in T):
///
///     dq*_i = scale·Σ_j x_ij·k_j,  dk*_j = scale·Σ_{h,i} x_ij·q_i,  dv*_j = Σ_{h,i} y_ij·dO_i
///
/// with x = RN_T(dx_ij), y = RN_T(p_ij) (plan.rounding.operands; else dx, p),
/// and flip the same sums of `ulp_T(dx_ij)·|k_j|`, `ulp_T(dx_ij)·|q_i|`,
/// `ulp_T(p_ij)·|dO_i|` over the ambiguous operands only: p_ij when a value
/// within `rel_delta·p_ij + 2^−149` rounds otherwise, dx_ij when a value
/// within `rel_delta·(|ds_ij| + 2·p_ij·|delta_i|) + 2^−149` does (the scale of
/// float32's error in `p_ij·(dp_ij − delta_i)`: |p·dp| <= |ds| + p·|delta|).
/// dsinks and dbias are not bounded here: they round once, but read the
/// stored O_i, whose elements a float32 kernel may round the other way; SPEC
/// §10.5 gives their bound (props/lowp.cpp checks both). Throws tandem::Error
/// when the inputs do not fit the plan or the plan is paged.
template <class T>
BackwardRoundingBound attention_backward_rounding(const AttentionPlan& plan,
                                                  const AttentionInputs<T>& in,
                                                  std::span<const T> dout, double rel_delta) {
  check_inputs(plan, in);
  require_size(dout.size(), plan.o.extent, "dout");
  require(!plan.paged(), "block_table", std::string("(a paged cache)"),
          "has no backward: attention backward takes contiguous or packed k and v");
  const auto zeros = [](std::int64_t n) {
    return RoundingBound{std::vector<double>(static_cast<std::size_t>(n), 0.0),
                         std::vector<double>(static_cast<std::size_t>(n), 0.0)};
  };
  BackwardRoundingBound r{zeros(plan.dq.extent), zeros(plan.dk.extent), zeros(plan.dv.extent)};
  // the stored forward the backward reads
  std::vector<T> out(static_cast<std::size_t>(plan.o.extent));
  std::vector<stat_t<T>> lse(static_cast<std::size_t>(plan.lse_size()));
  attention_forward<T, double>(plan, in, out, lse);
  const AttentionSaved<T> saved{out, lse};
  const double scale = plan.scale;
  const bool operands = is_low_precision_v<T> && plan.rounding.operands;
  for (std::int64_t n = 0; n < plan.sequences(); ++n) {
    const AttentionSeq seq = plan.sequence(in, n);
    for (std::int64_t h = 0; h < plan.H; ++h) {
      const std::int64_t g = plan.kv_head(h);
      for (std::int64_t i = 0; i < seq.Sq; ++i) {
        const AttentionRow<double> row = attention_row_saved<T, double>(plan, in, saved, seq, h, i);
        const ScoreGrad<double> sg =
            attention_score_grad_row<T, double>(plan, in, dout, seq, row, h, i, &saved);
        const std::int64_t q_at = plan.q.at(seq.b, seq.q_row(i), h);
        const std::int64_t o_at = plan.o.at(seq.b, seq.q_row(i), h);
        const std::int64_t dq_at = plan.dq.at(seq.b, seq.q_row(i), h);
        for (std::int64_t j = 0; j < seq.Sk; ++j) {
          if (!row.visible[j]) continue;
          const KeyRow key = seq.key_row(j);
          const double p = row.p[j], dx = sg.dx[j];
          const double x = operands ? round_as<T>(dx) : dx, y = operands ? round_as<T>(p) : p;
          const double dx_slack = rel_delta * (std::fabs(sg.ds[j]) + 2 * p * std::fabs(sg.delta));
          const double ux = operands && rounding_ambiguous<T>(dx, dx_slack + 0x1p-149)
                                ? ulp_of<T>(std::fabs(dx))
                                : 0.0;
          const double uy =
              operands && rounding_ambiguous<T>(p, rel_delta * p + 0x1p-149) ? ulp_of<T>(p) : 0.0;
          for (std::int64_t d = 0; d < plan.D; ++d) {
            const auto k_jd = static_cast<double>(in.k[plan.k.at(key.batch, key.seq, g) + d]);
            const auto q_id = static_cast<double>(in.q[q_at + d]);
            const std::int64_t dk_at = plan.dk.at(key.batch, key.seq, g) + d;
            r.dq.unrounded[dq_at + d] += scale * x * k_jd;
            r.dq.flip[dq_at + d] += scale * ux * std::fabs(k_jd);
            r.dk.unrounded[dk_at] += scale * x * q_id;
            r.dk.flip[dk_at] += scale * ux * std::fabs(q_id);
          }
          for (std::int64_t d = 0; d < plan.Dv; ++d) {
            const auto do_id = static_cast<double>(dout[o_at + d]);
            const std::int64_t dv_at = plan.dv.at(key.batch, key.seq, g) + d;
            r.dv.unrounded[dv_at] += y * do_id;
            r.dv.flip[dv_at] += uy * std::fabs(do_id);
          }
        }
      }
    }
  }
  return r;
}

}  // namespace tandem::reference
