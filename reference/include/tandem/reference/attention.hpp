// SPDX-License-Identifier: Apache-2.0
/// @file reference/attention.hpp
/// @brief Reference scaled dot-product attention, forward and backward
///        (SPEC §2–3), written as one explicit loop per index so that every
///        line can be checked against the formulas.
///
/// Shapes, shown in `bshd` (`bhsd` swaps S and H; the plan's Strides place
/// every element, so the loops never look at the layout):
/// q `[B,Sq,H,D]`, k `[B,Sk,Hkv,D]`, v `[B,Sk,Hkv,Dv]`, out and dout
/// `[B,Sq,H,Dv]`; dq, dk, dv have the shapes of q, k, v and are contiguous.
///
/// Forward, for batch b, query head h (kv_head = h / (H/Hkv)) and query i,
/// over the keys j visible to query i (SPEC §2 table):
///
///     pass 1   x_ij = scale * <q_i, k_j>
///              s_ij = c * tanh(x_ij / c)            softcap c > 0 (else s_ij = x_ij)
///              s_ij = s_ij + bias_ij                mask kind bias only
///     pass 2   m_i  = max_j s_ij                    (cancels in p; keeps exp finite)
///     pass 3   l_i  = sum_j exp(s_ij - m_i)
///     pass 4   p_ij = exp(s_ij - m_i) / l_i
///     pass 5   o_i  = sum_j p_ij * v_j
///
/// (SPEC writes s for the score at every step; x names the score before the
/// cap so that the backward can refer to it.) Backward of the loss <dO, O>:
///
///     pass 1   dp_ij   = <dO_i, v_j>
///     pass 2   delta_i = <dO_i, o_i>                (rowsum(dO ∘ O))
///     pass 3   ds_ij   = p_ij * (dp_ij - delta_i)
///     pass 4   dx_ij   = ds_ij * (1 - tanh²(x_ij / c))   (ds_ij when c = 0)
///     pass 5   dq_i    = scale * sum_j dx_ij * k_j
///              dk_j    = scale * sum_{h in group} sum_i dx_ij * q_i
///              dv_j    = sum_{h in group} sum_i p_ij * dO_i
///
/// A query with no visible key outputs 0 and contributes nothing to any
/// gradient. Hidden keys are excluded from every sum: there is no "large
/// negative score" anywhere, so a hidden key's k and v are never read.
///
/// Templated on the scalar type T (float, double, std::complex<double>);
/// every sum runs in Acc (double for float). Comparisons (the running
/// maximum) look at the real part, so a complex-step derivative rides along
/// in the imaginary part.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "tandem/attention.hpp"
#include "tandem/reference/scalar.hpp"

namespace tandem::reference {

/// Whether key j is visible to query i of batch b and query head h (SPEC §2):
/// with `a = q_offset + i`, `q_offset = max(Sk − Sq, 0)` (bottom-right):
/// none: always; causal: j <= a; sliding_window(w): a − w <= j <= a;
/// key_padding: keep[b, j] != 0; bias: bias_ij != −inf.
/// `mask` is the keep mask `[B, Sk]` or the bias `[Bb, Hb, Sq, Sk]` (float).
inline bool key_visible(const AttentionPlan& plan, std::span<const float> mask, std::int64_t b,
                        std::int64_t h, std::int64_t i, std::int64_t j) {
  const std::int64_t q_offset = plan.q_offset();
  const std::int64_t a = q_offset + i;  // the key position that query i sits at
  switch (plan.mask) {
    case MaskKind::none:
      return true;
    case MaskKind::causal:
      return j <= a;
    case MaskKind::sliding_window:
      return a - plan.window <= j && j <= a;
    case MaskKind::key_padding:
      return mask[plan.mask_row(b, h, i) + j] != 0.0f;
    case MaskKind::bias:
      return mask[plan.mask_row(b, h, i) + j] != -std::numeric_limits<float>::infinity();
  }
  return false;
}

/// The softmax row of one query (b, h, i): everything the forward knows
/// about it before pass 5, and what the backward needs again. Vectors have
/// Sk entries; entries of hidden keys are 0 and are never used.
template <class Acc>
struct AttentionRow {
  std::vector<bool> visible;  ///< key j visible to query i (SPEC §2 table)
  std::vector<Acc> p;         ///< p_ij, the probabilities over the visible keys
  std::vector<Acc> cap_tanh;  ///< tanh(x_ij / c), x_ij = scale·<q_i,k_j> (softcap c > 0 only)
  std::vector<Acc> s;         ///< s_ij, the final scores (after cap and bias)
  Acc lse = Acc(0);  ///< lse_i = m_i + log l_i, so p_ij = exp(s_ij − lse_i); −inf: no key
  std::int64_t n_visible = 0;  ///< number of visible keys; 0 means o_i = 0 and no gradient
};

/// Forward passes 1–4 for query i of batch b, head h:
/// `x_ij = scale·<q_i,k_j>`, `s_ij = c·tanh(x_ij/c)` (c > 0; else x_ij), `s_ij += bias_ij`,
/// then `p_ij = exp(s_ij − m_i) / sum_j' exp(s_ij' − m_i)` over visible keys,
/// q_i `[D]`, k_j `[D]` read through plan.q / plan.k. Inputs must be checked.
template <class T, class Acc = accumulator_t<T>>
AttentionRow<Acc> attention_row(const AttentionPlan& plan, const AttentionInputs<T>& in,
                                std::int64_t b, std::int64_t h, std::int64_t i) {
  using Real = decltype(real_part(std::declval<Acc>()));
  const std::int64_t kv_head = plan.kv_head(h);
  const Acc scale = static_cast<Acc>(plan.scale);
  const Acc c = static_cast<Acc>(plan.softcap);

  AttentionRow<Acc> row;
  row.visible.assign(plan.Sk, false);
  row.p.assign(plan.Sk, Acc(0));
  row.cap_tanh.assign(plan.Sk, Acc(0));
  std::vector<Acc> s(plan.Sk, Acc(0));
  row.lse = Acc(-std::numeric_limits<Real>::infinity());

  // pass 1: the score of every visible key
  //   x_ij = scale * <q_i, k_j>
  //   s_ij = c * tanh(x_ij / c)        (softcap c > 0; otherwise s_ij = x_ij)
  //   s_ij = s_ij + bias_ij            (mask kind bias only)
  for (std::int64_t j = 0; j < plan.Sk; ++j) {
    row.visible[j] = key_visible(plan, in.mask, b, h, i, j);
    if (!row.visible[j]) continue;  // hidden keys are excluded, not scored
    ++row.n_visible;
    Acc dot = Acc(0);
    for (std::int64_t d = 0; d < plan.D; ++d) {
      dot += static_cast<Acc>(in.q[plan.q.at(b, i, h) + d]) *
             static_cast<Acc>(in.k[plan.k.at(b, j, kv_head) + d]);
    }
    const Acc x_ij = scale * dot;
    Acc s_ij = x_ij;
    if (plan.softcap > 0) {
      row.cap_tanh[j] = std::tanh(x_ij / c);
      s_ij = c * row.cap_tanh[j];
    }
    if (plan.mask == MaskKind::bias) {
      s_ij = s_ij + static_cast<Acc>(in.mask[plan.mask_row(b, h, i) + j]);
    }
    s[j] = s_ij;
  }
  row.s = s;
  // A query with no visible key: every p_ij stays 0, so o_i = 0.
  if (row.n_visible == 0) return row;

  // pass 2: m_i = max_j s_ij over the visible keys (compared by real part)
  Real m_i = -std::numeric_limits<Real>::infinity();
  for (std::int64_t j = 0; j < plan.Sk; ++j) {
    if (row.visible[j] && real_part(s[j]) > m_i) m_i = real_part(s[j]);
  }

  // pass 3: l_i = sum_j exp(s_ij - m_i) over the visible keys
  Acc l_i = Acc(0);
  for (std::int64_t j = 0; j < plan.Sk; ++j) {
    if (row.visible[j]) l_i += std::exp(s[j] - m_i);
  }

  // the log-sum-exp lse_i = m_i + log l_i, what a forward saves for its backward
  row.lse = m_i + std::log(l_i);

  // pass 4: p_ij = exp(s_ij - m_i) / l_i
  for (std::int64_t j = 0; j < plan.Sk; ++j) {
    if (row.visible[j]) row.p[j] = std::exp(s[j] - m_i) / l_i;
  }
  return row;
}

/// Forward pass 5 for query i of batch b, head h: `o_i = sum_j p_ij v_j` over
/// the visible keys, v_j `[Dv]` read through plan.v at kv head h/(H/Hkv).
/// Returns o_i `[Dv]` in Acc (all 0 when no key is visible).
template <class T, class Acc = accumulator_t<T>>
std::vector<Acc> attention_output_row(const AttentionPlan& plan, const AttentionInputs<T>& in,
                                      const AttentionRow<Acc>& row, std::int64_t b,
                                      std::int64_t h) {
  const std::int64_t kv_head = plan.kv_head(h);
  std::vector<Acc> o_i(plan.Dv, Acc(0));
  // pass 5: o_i = sum_j p_ij * v_j
  for (std::int64_t d = 0; d < plan.Dv; ++d) {
    for (std::int64_t j = 0; j < plan.Sk; ++j) {
      if (!row.visible[j]) continue;
      o_i[d] += row.p[j] * static_cast<Acc>(in.v[plan.v.at(b, j, kv_head) + d]);
    }
  }
  return o_i;
}

/// The softmax row of query i rebuilt from a saved log-sum-exp: the scores of
/// attention_row (pass 1), then `p_ij = exp(s_ij − lse_i)` in place of the
/// forward's passes 2–4. lse_i is read from saved.lse `[B,H,Sq]`.
template <class T, class Acc = accumulator_t<T>>
AttentionRow<Acc> attention_row_saved(const AttentionPlan& plan, const AttentionInputs<T>& in,
                                      const AttentionSaved<T>& saved, std::int64_t b,
                                      std::int64_t h, std::int64_t i) {
  AttentionRow<Acc> row = attention_row<T, Acc>(plan, in, b, h, i);
  const Acc lse_i = static_cast<Acc>(saved.lse[plan.lse_at(b, h, i)]);
  // p_ij = exp(s_ij - lse_i)   (the forward's p_ij = exp(s_ij - m_i) / l_i)
  for (std::int64_t j = 0; j < plan.Sk; ++j) {
    if (row.visible[j]) row.p[j] = std::exp(row.s[j] - lse_i);
  }
  return row;
}

/// Backward passes 1–4 for query i of batch b, head h: the gradient of the
/// loss <dO, O> with respect to the score before the cap, x_ij = scale·<q_i,k_j>:
/// `dx_ij = p_ij (<dO_i, v_j> − <dO_i, o_i>) · (1 − tanh²(x_ij/c))`
/// (the last factor only when softcap c > 0). Returns dx_i `[Sk]` (0 for
/// hidden keys). dO_i `[Dv]` is read through plan.o; o_i is recomputed, or
/// read from saved->out when given. Views must be checked.
template <class T, class Acc = accumulator_t<T>>
std::vector<Acc> attention_score_grad_row(const AttentionPlan& plan, const AttentionInputs<T>& in,
                                          std::span<const T> dout, const AttentionRow<Acc>& row,
                                          std::int64_t b, std::int64_t h, std::int64_t i,
                                          const AttentionSaved<T>* saved = nullptr) {
  const std::int64_t kv_head = plan.kv_head(h);
  // o_i: forward pass 5 again, or the forward's saved output row
  std::vector<Acc> o_i(plan.Dv, Acc(0));
  if (saved == nullptr) o_i = attention_output_row<T, Acc>(plan, in, row, b, h);
  for (std::int64_t d = 0; saved != nullptr && d < plan.Dv; ++d) {
    o_i[d] = static_cast<Acc>(saved->out[plan.o.at(b, i, h) + d]);
  }

  // pass 1: dp_ij = <dO_i, v_j>
  //   forward: o_i = sum_j p_ij * v_j
  std::vector<Acc> dp(plan.Sk, Acc(0));
  for (std::int64_t j = 0; j < plan.Sk; ++j) {
    if (!row.visible[j]) continue;
    for (std::int64_t d = 0; d < plan.Dv; ++d) {
      dp[j] += static_cast<Acc>(dout[plan.o.at(b, i, h) + d]) *
               static_cast<Acc>(in.v[plan.v.at(b, j, kv_head) + d]);
    }
  }

  // pass 2: delta_i = <dO_i, o_i>  (rowsum(dO ∘ O), equal to sum_j p_ij dp_ij)
  Acc delta_i = Acc(0);
  for (std::int64_t d = 0; d < plan.Dv; ++d) {
    delta_i += static_cast<Acc>(dout[plan.o.at(b, i, h) + d]) * o_i[d];
  }

  // pass 3: ds_ij = p_ij * (dp_ij - delta_i)
  //   forward: p_ij = exp(s_ij - m_i) / l_i
  // (ds_ij is also the gradient of the score before the bias: d/ds of
  //   forward: s_ij = s_ij + bias_ij
  // is 1, and the bias itself gets no gradient.)
  std::vector<Acc> ds(plan.Sk, Acc(0));
  for (std::int64_t j = 0; j < plan.Sk; ++j) {
    if (row.visible[j]) ds[j] = row.p[j] * (dp[j] - delta_i);
  }

  // pass 4: dx_ij = ds_ij * (1 - tanh²(x_ij / c))   (softcap c > 0)
  //         dx_ij = ds_ij                            (no softcap: s_ij = x_ij)
  //   forward: s_ij = c * tanh(x_ij / c)
  std::vector<Acc> dx(plan.Sk, Acc(0));
  for (std::int64_t j = 0; j < plan.Sk; ++j) {
    if (!row.visible[j]) continue;
    if (plan.softcap > 0) {
      dx[j] = ds[j] * (Acc(1) - row.cap_tanh[j] * row.cap_tanh[j]);
    } else {
      dx[j] = ds[j];
    }
  }
  return dx;
}

/// Attention forward (SPEC §2): for every b, h, i,
/// `o_i = sum_{visible j} softmax_j(cap(scale·<q_i,k_j>) + bias_ij) · v_j`,
/// 0 for a query with no visible key. q `[B,Sq,H,D]`, k `[B,Sk,Hkv,D]`,
/// v `[B,Sk,Hkv,Dv]` (through plan.q/k/v, row strides allowed), out
/// `[B,Sq,H,Dv]` contiguous in q's layout (plan.o); when lse `[B,H,Sq]` is
/// given it receives `lse_i = m_i + log l_i` (see AttentionSaved). Throws
/// tandem::Error before writing anything when a view does not fit the plan.
template <class T, class Acc = accumulator_t<T>>
void attention_forward(const AttentionPlan& plan, const AttentionInputs<T>& in, std::span<T> out,
                       std::span<T> lse = {}) {
  check_inputs(plan, in);
  require_size(out.size(), plan.o.extent, "out");
  if (!lse.empty()) require_size(lse.size(), plan.lse_size(), "lse");

  for (std::int64_t b = 0; b < plan.B; ++b) {
    for (std::int64_t h = 0; h < plan.H; ++h) {
      for (std::int64_t i = 0; i < plan.Sq; ++i) {
        // passes 1–4: p_ij = softmax_j(s_ij) over the visible keys
        const AttentionRow<Acc> row = attention_row<T, Acc>(plan, in, b, h, i);
        // pass 5: o_i = sum_j p_ij * v_j
        const std::vector<Acc> o_i = attention_output_row<T, Acc>(plan, in, row, b, h);
        for (std::int64_t d = 0; d < plan.Dv; ++d) {
          out[plan.o.at(b, i, h) + d] = static_cast<T>(o_i[d]);
        }
        // lse_i, kept for a backward from the saved state (attention_backward_saved)
        if (!lse.empty()) lse[plan.lse_at(b, h, i)] = static_cast<T>(row.lse);
      }
    }
  }
}

/// dQ alone (SPEC §3): `dq_i = scale · sum_j dx_ij k_j`, with dx the score
/// gradient of attention_score_grad_row. dout `[B,Sq,H,Dv]` (plan.o), dq
/// `[B,Sq,H,D]` contiguous (plan.dq). Throws tandem::Error before writing.
template <class T, class Acc = accumulator_t<T>>
void attention_backward_dq(const AttentionPlan& plan, const AttentionInputs<T>& in,
                           std::span<const T> dout, std::span<T> dq) {
  check_inputs(plan, in);
  require_size(dout.size(), plan.o.extent, "dout");
  require_size(dq.size(), plan.dq.extent, "dq");
  const Acc scale = static_cast<Acc>(plan.scale);

  for (std::int64_t b = 0; b < plan.B; ++b) {
    for (std::int64_t h = 0; h < plan.H; ++h) {
      const std::int64_t kv_head = plan.kv_head(h);
      for (std::int64_t i = 0; i < plan.Sq; ++i) {
        // forward passes 1–4 again: p_ij
        const AttentionRow<Acc> row = attention_row<T, Acc>(plan, in, b, h, i);
        // backward passes 1–4: dx_ij
        const std::vector<Acc> dx = attention_score_grad_row<T, Acc>(plan, in, dout, row, b, h, i);
        // pass 5: dq_i = scale * sum_j dx_ij * k_j
        //   forward: x_ij = scale * <q_i, k_j>
        for (std::int64_t d = 0; d < plan.D; ++d) {
          Acc dq_id = Acc(0);
          for (std::int64_t j = 0; j < plan.Sk; ++j) {
            if (!row.visible[j]) continue;
            dq_id += dx[j] * static_cast<Acc>(in.k[plan.k.at(b, j, kv_head) + d]);
          }
          dq[plan.dq.at(b, i, h) + d] = static_cast<T>(scale * dq_id);
        }
      }
    }
  }
}

/// dK alone (SPEC §3): `dk_j = scale · sum_{h reading kv head g} sum_i dx_ij q_i`
/// — GQA sums over the H/Hkv query heads that share k_j. dout `[B,Sq,H,Dv]`
/// (plan.o), dk `[B,Sk,Hkv,D]` contiguous (plan.dk). Throws tandem::Error
/// before writing.
template <class T, class Acc = accumulator_t<T>>
void attention_backward_dk(const AttentionPlan& plan, const AttentionInputs<T>& in,
                           std::span<const T> dout, std::span<T> dk) {
  check_inputs(plan, in);
  require_size(dout.size(), plan.o.extent, "dout");
  require_size(dk.size(), plan.dk.extent, "dk");
  const Acc scale = static_cast<Acc>(plan.scale);

  // dk_j sums over queries and query heads: accumulate in Acc, round once.
  std::vector<Acc> dk_sum(dk.size(), Acc(0));
  for (std::int64_t b = 0; b < plan.B; ++b) {
    for (std::int64_t h = 0; h < plan.H; ++h) {
      const std::int64_t kv_head = plan.kv_head(h);
      for (std::int64_t i = 0; i < plan.Sq; ++i) {
        // forward passes 1–4 again: p_ij
        const AttentionRow<Acc> row = attention_row<T, Acc>(plan, in, b, h, i);
        // backward passes 1–4: dx_ij
        const std::vector<Acc> dx = attention_score_grad_row<T, Acc>(plan, in, dout, row, b, h, i);
        // pass 5: dk_j += scale * dx_ij * q_i   (into kv head g = kv_head(h))
        //   forward: x_ij = scale * <q_i, k_j>
        for (std::int64_t j = 0; j < plan.Sk; ++j) {
          if (!row.visible[j]) continue;
          for (std::int64_t d = 0; d < plan.D; ++d) {
            dk_sum[plan.dk.at(b, j, kv_head) + d] +=
                scale * dx[j] * static_cast<Acc>(in.q[plan.q.at(b, i, h) + d]);
          }
        }
      }
    }
  }
  for (std::size_t n = 0; n < dk.size(); ++n) dk[n] = static_cast<T>(dk_sum[n]);
}

/// dV alone (SPEC §3): `dv_j = sum_{h reading kv head g} sum_i p_ij dO_i`
/// — GQA sums over the H/Hkv query heads that share v_j. dout `[B,Sq,H,Dv]`
/// (plan.o), dv `[B,Sk,Hkv,Dv]` contiguous (plan.dv). Throws tandem::Error
/// before writing.
template <class T, class Acc = accumulator_t<T>>
void attention_backward_dv(const AttentionPlan& plan, const AttentionInputs<T>& in,
                           std::span<const T> dout, std::span<T> dv) {
  check_inputs(plan, in);
  require_size(dout.size(), plan.o.extent, "dout");
  require_size(dv.size(), plan.dv.extent, "dv");

  // dv_j sums over queries and query heads: accumulate in Acc, round once.
  std::vector<Acc> dv_sum(dv.size(), Acc(0));
  for (std::int64_t b = 0; b < plan.B; ++b) {
    for (std::int64_t h = 0; h < plan.H; ++h) {
      const std::int64_t kv_head = plan.kv_head(h);
      for (std::int64_t i = 0; i < plan.Sq; ++i) {
        // forward passes 1–4 again: p_ij
        const AttentionRow<Acc> row = attention_row<T, Acc>(plan, in, b, h, i);
        // pass 5: dv_j += p_ij * dO_i   (into kv head g = kv_head(h))
        //   forward: o_i = sum_j p_ij * v_j
        for (std::int64_t j = 0; j < plan.Sk; ++j) {
          if (!row.visible[j]) continue;
          for (std::int64_t d = 0; d < plan.Dv; ++d) {
            dv_sum[plan.dv.at(b, j, kv_head) + d] +=
                row.p[j] * static_cast<Acc>(dout[plan.o.at(b, i, h) + d]);
          }
        }
      }
    }
  }
  for (std::size_t n = 0; n < dv.size(); ++n) dv[n] = static_cast<T>(dv_sum[n]);
}

/// dQ, dK and dV in one pass over the queries (SPEC §3): with P the
/// probabilities and dx the score gradient,
/// `dq_i = scale · sum_j dx_ij k_j`, `dk_j = scale · sum_{h,i} dx_ij q_i`,
/// `dv_j = sum_{h,i} p_ij dO_i` (h over the query heads sharing kv head g).
/// dout `[B,Sq,H,Dv]` (plan.o); grads.dq `[B,Sq,H,D]`, grads.dk `[B,Sk,Hkv,D]`,
/// grads.dv `[B,Sk,Hkv,Dv]`, contiguous: any non-empty subset of them, an
/// empty view is neither computed nor written. With `saved`
/// (the forward's out and lse) P and delta come from it instead of a second
/// forward; see attention_backward_saved. Throws tandem::Error before
/// writing anything.
template <class T, class Acc = accumulator_t<T>>
void attention_backward(const AttentionPlan& plan, const AttentionInputs<T>& in,
                        std::span<const T> dout, const AttentionGrads<T>& grads,
                        const AttentionSaved<T>* saved = nullptr) {
  check_inputs(plan, in);
  require_size(dout.size(), plan.o.extent, "dout");
  check_grads(plan, grads);
  if (saved != nullptr) check_saved(plan, *saved);
  const Acc scale = static_cast<Acc>(plan.scale);

  // dk_j and dv_j sum over queries and query heads: accumulate in Acc.
  std::vector<Acc> dk_sum(grads.dk.size(), Acc(0));
  std::vector<Acc> dv_sum(grads.dv.size(), Acc(0));
  for (std::int64_t b = 0; b < plan.B; ++b) {
    for (std::int64_t h = 0; h < plan.H; ++h) {
      const std::int64_t kv_head = plan.kv_head(h);
      for (std::int64_t i = 0; i < plan.Sq; ++i) {
        // forward passes 1–4 again: p_ij (or from the saved lse_i)
        const AttentionRow<Acc> row = saved == nullptr
                                          ? attention_row<T, Acc>(plan, in, b, h, i)
                                          : attention_row_saved<T, Acc>(plan, in, *saved, b, h, i);
        // backward passes 1–4: dx_ij (delta_i from the saved o_i when given)
        const std::vector<Acc> dx =
            attention_score_grad_row<T, Acc>(plan, in, dout, row, b, h, i, saved);

        // pass 5a: dq_i = scale * sum_j dx_ij * k_j
        //   forward: x_ij = scale * <q_i, k_j>
        for (std::int64_t d = 0; !grads.dq.empty() && d < plan.D; ++d) {
          Acc dq_id = Acc(0);
          for (std::int64_t j = 0; j < plan.Sk; ++j) {
            if (!row.visible[j]) continue;
            dq_id += dx[j] * static_cast<Acc>(in.k[plan.k.at(b, j, kv_head) + d]);
          }
          grads.dq[plan.dq.at(b, i, h) + d] = static_cast<T>(scale * dq_id);
        }

        // pass 5b: dk_j += scale * dx_ij * q_i   (into kv head g = kv_head(h))
        //   forward: x_ij = scale * <q_i, k_j>
        for (std::int64_t j = 0; !grads.dk.empty() && j < plan.Sk; ++j) {
          if (!row.visible[j]) continue;
          for (std::int64_t d = 0; d < plan.D; ++d) {
            dk_sum[plan.dk.at(b, j, kv_head) + d] +=
                scale * dx[j] * static_cast<Acc>(in.q[plan.q.at(b, i, h) + d]);
          }
        }

        // pass 5c: dv_j += p_ij * dO_i   (into kv head g = kv_head(h))
        //   forward: o_i = sum_j p_ij * v_j
        for (std::int64_t j = 0; !grads.dv.empty() && j < plan.Sk; ++j) {
          if (!row.visible[j]) continue;
          for (std::int64_t d = 0; d < plan.Dv; ++d) {
            dv_sum[plan.dv.at(b, j, kv_head) + d] +=
                row.p[j] * static_cast<Acc>(dout[plan.o.at(b, i, h) + d]);
          }
        }
      }
    }
  }
  for (std::size_t n = 0; n < grads.dk.size(); ++n) grads.dk[n] = static_cast<T>(dk_sum[n]);
  for (std::size_t n = 0; n < grads.dv.size(); ++n) grads.dv[n] = static_cast<T>(dv_sum[n]);
}

/// Attention forward that also saves the log-sum-exp for the backward:
/// out as attention_forward, lse `[B,H,Sq]` (contiguous, plan.lse_at)
/// `lse_i = m_i + log sum_j exp(s_ij − m_i)`, −inf for a query with no visible key.
template <class T, class Acc = accumulator_t<T>>
void attention_forward_lse(const AttentionPlan& plan, const AttentionInputs<T>& in,
                           std::span<T> out, std::span<T> lse) {
  require_size(lse.size(), plan.lse_size(), "lse");
  attention_forward<T, Acc>(plan, in, out, lse);
}

/// dQ, dK and dV from the forward's saved state (AttentionSaved: out and lse):
/// the formulas of attention_backward with `p_ij = exp(s_ij − lse_i)` and
/// `delta_i = <dO_i, out_i>` read from what the forward kept. A fast backend
/// thereby skips the forward's softmax and pass 5; this reference takes the
/// scores s_ij from attention_row (whose own p it overwrites) for clarity.
/// Given the forward's own out and lse it equals attention_backward up to
/// rounding. Throws tandem::Error before writing anything.
template <class T, class Acc = accumulator_t<T>>
void attention_backward_saved(const AttentionPlan& plan, const AttentionInputs<T>& in,
                              const AttentionSaved<T>& saved, std::span<const T> dout,
                              const AttentionGrads<T>& grads) {
  attention_backward<T, Acc>(plan, in, dout, grads, &saved);
}

}  // namespace tandem::reference
