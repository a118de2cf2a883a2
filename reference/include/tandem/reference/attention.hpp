// SPDX-License-Identifier: Apache-2.0
/// @file reference/attention.hpp
/// @brief Reference scaled dot-product attention, forward and backward
///        (SPEC §2–3, §2.7–2.10), written as one explicit loop per index so that
///        every line can be checked against the formulas.
///
/// Shapes, shown in `bshd` (`bhsd` swaps S and H; the plan's Strides place
/// every element, so the loops never look at the layout):
/// q `[B,Sq,H,D]`, k `[B,Sk,Hkv,D]`, v `[B,Sk,Hkv,Dv]`, out and dout
/// `[B,Sq,H,Dv]`; dq, dk, dv have the shapes of q, k, v and are contiguous.
/// The loops run over sequences: a batch entry, a packed sequence (SPEC §2.9)
/// or a row of a paged cache (SPEC §2.10). AttentionPlan::sequence says where
/// sequence n's Sq queries and Sk keys live; i and j below are local to it.
///
/// Forward, for sequence n, query head h (kv_head = h / (H/Hkv)) and query i,
/// over the keys j visible to query i (SPEC §2 table):
///
///     pass 1   x_ij = scale * <q_i, k_j>
///              s_ij = c * tanh(x_ij / c)            softcap c > 0 (else s_ij = x_ij)
///              s_ij = s_ij - m_h * abs(i + Sk - Sq - j)   ALiBi slope m_h only
///              s_ij = s_ij + bias_ij                mask kind bias only
///     pass 2   m_i  = max(sink_h, max_j s_ij)       (cancels in p; keeps exp finite)
///     pass 3   l_i  = exp(sink_h - m_i) + sum_j exp(s_ij - m_i)
///     pass 4   p_ij = exp(s_ij - m_i) / l_i
///     pass 5   o_i  = sum_j p_ij * v_j
///
/// where the sink terms are present only with sinks (SPEC §2.7): the sink is
/// one more logit in the denominator with no value, p_sink,i = exp(sink_h −
/// m_i) / l_i. (SPEC writes s for the score at every step; x names the score
/// before the cap so that the backward can refer to it.) Backward of the
/// loss <dO, O>:
///
///     pass 1   dp_ij   = <dO_i, v_j>
///     pass 2   delta_i = <dO_i, o_i>                (rowsum(dO ∘ O))
///     pass 3   ds_ij   = p_ij * (dp_ij - delta_i)
///     pass 4   dx_ij   = ds_ij * (1 - tanh²(x_ij / c))   (ds_ij when c = 0)
///     pass 5   dq_i    = scale * sum_j dx_ij * k_j
///              dk_j    = scale * sum_{h in group} sum_i dx_ij * q_i
///              dv_j    = sum_{h in group} sum_i p_ij * dO_i
///     pass 6   dsink_h = - sum_{n,i} p_sink,i * delta_i     (sinks only)
///     pass 7   dbias_ij = sum_{b if Bb = 1} sum_{h if Hb = 1} ds_ij   (bias only)
///
/// ALiBi and the bias are added to the score after the cap, so the gradient
/// of either is ds_ij itself: the slopes are constants and get none, the
/// bias gets ds_ij summed over its broadcast axes. A query with no visible key outputs 0 and
/// contributes nothing to any gradient. Hidden keys are excluded from every
/// sum: there is no "large negative score" anywhere, so a hidden key's k and
/// v are never read.
///
/// Templated on the scalar type T (float, double, std::complex<double>, and
/// the storage types bfloat16, float16); every sum runs in Acc (double for
/// float, bf16 and f16). Comparisons (the running maximum) look at the real
/// part, so a complex-step derivative rides along in the imaginary part.
///
/// Storage in bf16 or f16 (SPEC §10.2) reads every stored value exactly and
/// rounds at the profile's points (plan.rounding) and nowhere else, each
/// marked `round_as<T>(…)` (an identity for float, double and complex, whose
/// results these rounding points leave bit for bit unchanged):
///
///     forward    μ_i = ⌈m_i·log2 e⌉, e_ij = 2^(s_ij·log2 e − μ_i), l_i unrounded
///                w_ij = RN_T(e_ij)                      (operands; else e_ij)
///                a_i = Σ_j w_ij v_j, in T after every key (output_accumulator)
///                o_i = RN_T(a_i / l_i),  lse_i = RN_f32(μ_i·ln 2 + ln l_i)
///     backward   p_ij = exp(s_ij − lse_i), delta_i = <dO_i, O_i> from the stored lse and O
///                dv_j = RN_T(Σ RN_T(p_ij)·dO_i), dq_i, dk_j from RN_T(dx_ij) (operands)
///                dsinks, dbias: their sums rounded once
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <numbers>
#include <span>
#include <utility>
#include <vector>

#include "tandem/attention.hpp"
#include "tandem/reference/scalar.hpp"
#include "tandem/storage.hpp"

namespace tandem::reference {

/// Whether key j of sequence `seq` is visible to its query i, head h (SPEC §2):
/// with `a = q_offset + i`, `q_offset = max(Sk − Sq, 0)` (bottom-right, per
/// sequence): none: always; causal: j <= a; sliding_window(w): a − w <= j <= a;
/// key_padding: keep[b, j] != 0; bias: bias_ij != −inf.
/// `mask` is the keep mask `[B, Sk]` or the bias `[Bb, Hb, Sq, Sk]` (float).
inline bool key_visible(const AttentionPlan& plan, const AttentionSeq& seq,
                        std::span<const float> mask, std::int64_t h, std::int64_t i,
                        std::int64_t j) {
  const std::int64_t q_offset = seq.q_offset();
  const std::int64_t a = q_offset + i;  // the key position that query i sits at
  switch (plan.mask) {
    case MaskKind::none:
      return true;
    case MaskKind::causal:
      return j <= a;
    case MaskKind::sliding_window:
      return a - plan.window <= j && j <= a;
    case MaskKind::key_padding:
      return mask[plan.mask_row(seq.b, h, i) + j] != 0.0f;
    case MaskKind::bias:
      return mask[plan.mask_row(seq.b, h, i) + j] != -std::numeric_limits<float>::infinity();
  }
  return false;
}

/// The softmax row of one query (sequence, h, i): everything the forward
/// knows about it before pass 5, and what the backward needs again. Vectors
/// have Sk entries (the sequence's keys); entries of hidden keys are 0 and
/// are never used.
template <class Acc>
struct AttentionRow {
  std::vector<bool> visible;  ///< key j visible to query i (SPEC §2 table)
  std::vector<Acc> p;         ///< p_ij, the probabilities over the visible keys
  std::vector<Acc> cap_tanh;  ///< tanh(x_ij / c), x_ij = scale·<q_i,k_j> (softcap c > 0 only)
  std::vector<Acc> s;         ///< s_ij, the final scores (after cap, ALiBi and bias)
  /// lse_i = m_i + log l_i, so p_ij = exp(s_ij − lse_i); −inf: no key and no sink
  Acc lse = Acc(0);
  Acc p_sink = Acc(0);         ///< p_sink,i = exp(sink_h − lse_i) (sinks only; else 0)
  std::int64_t n_visible = 0;  ///< number of visible keys; 0 means o_i = 0 and no gradient
  ///@{
  /// Low-precision storage only (SPEC §10.2): the whole exponent μ_i = ⌈m_i·log2 e⌉, the
  /// unrounded weights e_ij = 2^(s_ij·log2 e − μ_i) `[Sk]` and l_i = 2^(sink_h·log2 e − μ_i) +
  /// Σ_j e_ij, so that p_ij = e_ij / l_i. Empty (0) for float, double and complex.
  Acc mu = Acc(0);
  std::vector<Acc> e;
  Acc l = Acc(0);
  ///@}
};

/// Forward passes 3–4 of a low-precision call (SPEC §10.2), in base 2 from a
/// whole exponent so that the weights' bits do not depend on where the
/// maximum is found (`RN_T(2^k·x) = 2^k·RN_T(x)` for normal values):
/// `μ_i = ⌈m_i·log2 e⌉`, `e_ij = 2^(s_ij·log2 e − μ_i)`,
/// `l_i = 2^(sink_h·log2 e − μ_i) + Σ_j e_ij` (the sink with sinks only),
/// `lse_i = μ_i·ln 2 + ln l_i`, `p_ij = e_ij / l_i`. Nothing here is rounded
/// to T: the weights are rounded where they are used (attention_output_row_from).
template <class Acc>
void attention_softmax_base2(bool sinks, const Acc& sink_h, const Acc& m_i,
                             AttentionRow<Acc>& row) {
  const Acc log2e = std::numbers::log2e_v<Acc>;
  const auto Sk = static_cast<std::int64_t>(row.s.size());
  // μ_i = ⌈m_i · log2 e⌉, an integer
  row.mu = std::ceil(m_i * log2e);

  // pass 3: e_ij = 2^(s_ij·log2 e − μ_i),  l_i = 2^(sink_h·log2 e − μ_i) + Σ_j e_ij
  row.e.assign(Sk, Acc(0));
  row.l = sinks ? std::exp2(sink_h * log2e - row.mu) : Acc(0);
  for (std::int64_t j = 0; j < Sk; ++j) {
    if (!row.visible[j]) continue;
    row.e[j] = std::exp2(row.s[j] * log2e - row.mu);
    row.l += row.e[j];
  }

  // lse_i = μ_i·ln 2 + ln l_i, what a forward saves (rounded to float32 when stored)
  row.lse = row.mu * std::numbers::ln2_v<Acc> + std::log(row.l);

  // pass 4: p_ij = e_ij / l_i, and the sink's share p_sink,i = 2^(sink_h·log2 e − μ_i) / l_i
  for (std::int64_t j = 0; j < Sk; ++j) {
    if (row.visible[j]) row.p[j] = row.e[j] / row.l;
  }
  if (sinks) row.p_sink = std::exp2(sink_h * log2e - row.mu) / row.l;
}

/// Forward passes 1–4 for query i of sequence `seq`, head h, with the keys'
/// dot products given: `key_dot(key)` is `<q_i, k_j>` for key j at KeyRow
/// `key` (plain k, or a quantized cache's σ^k_j·<q_i, c^k_j>, SPEC §10.4).
/// Then `x_ij = scale·key_dot`, `s_ij = c·tanh(x_ij/c)` (c > 0; else x_ij),
/// `s_ij −= m_h·abs(i + Sk − Sq − j)` (ALiBi), `s_ij += bias_ij`, and
/// `p_ij = exp(s_ij − m_i) / (exp(sink_h − m_i) + sum_k exp(s_ik − m_i))`
/// over visible keys j, k (the sink term with sinks only). For a
/// low-precision T the softmax runs in base 2 from a whole exponent μ_i
/// (SPEC §10.2), keeping e_ij and l_i for the rounded weights; see
/// attention_softmax_base2. `bias_step`, when given, is added to the bias
/// `[Bb, Hb, Sq, Sk]` at scalar T (a complex step's `t·u`, so that its
/// derivative reaches the bias). Inputs must be checked.
template <class T, class Acc, class KeyDot>
AttentionRow<Acc> attention_row_from(const AttentionPlan& plan, const AttentionInputs<T>& in,
                                     const AttentionSeq& seq, std::int64_t h, std::int64_t i,
                                     const KeyDot& key_dot, std::span<const T> bias_step = {}) {
  using Real = decltype(real_part(std::declval<Acc>()));
  const Acc scale = static_cast<Acc>(plan.scale);
  const Acc c = static_cast<Acc>(plan.softcap);
  const std::int64_t Sk = seq.Sk;

  AttentionRow<Acc> row;
  row.visible.assign(Sk, false);
  row.p.assign(Sk, Acc(0));
  row.cap_tanh.assign(Sk, Acc(0));
  std::vector<Acc> s(Sk, Acc(0));
  row.lse = Acc(-std::numeric_limits<Real>::infinity());

  // pass 1: the score of every visible key
  //   x_ij = scale * <q_i, k_j>
  //   s_ij = c * tanh(x_ij / c)                 (softcap c > 0; otherwise s_ij = x_ij)
  //   s_ij = s_ij - m_h * |i + Sk - Sq - j|     (ALiBi only)
  //   s_ij = s_ij + bias_ij                     (mask kind bias only)
  // (no score is rounded to T, whatever the profile: SPEC §10.2)
  for (std::int64_t j = 0; j < Sk; ++j) {
    row.visible[j] = key_visible(plan, seq, in.mask, h, i, j);
    if (!row.visible[j]) continue;  // hidden keys are excluded, not scored
    ++row.n_visible;
    const Acc x_ij = scale * key_dot(seq.key_row(j));
    Acc s_ij = x_ij;
    if (plan.softcap > 0) {
      row.cap_tanh[j] = std::tanh(x_ij / c);
      s_ij = c * row.cap_tanh[j];
    }
    if (plan.alibi != AlibiKind::none) {
      const Acc m_h = static_cast<Acc>(in.alibi_slopes[plan.slope_at(seq.n, h)]);
      const auto distance = static_cast<Real>(std::llabs(i + seq.alibi_shift() - j));
      s_ij = s_ij - m_h * distance;
    }
    if (plan.mask == MaskKind::bias) {
      s_ij = s_ij + static_cast<Acc>(in.mask[plan.mask_row(seq.b, h, i) + j]);
      // (the complex step's t·u_ij, when given, rides on the bias)
      if (!bias_step.empty()) {
        s_ij = s_ij + static_cast<Acc>(bias_step[plan.mask_row(seq.b, h, i) + j]);
      }
    }
    s[j] = s_ij;
  }
  row.s = s;
  // A query with no visible key and no sink: every p_ij stays 0, so o_i = 0.
  if (row.n_visible == 0 && !plan.sinks) return row;
  const Acc sink_h = plan.sinks ? static_cast<Acc>(in.sinks[h]) : Acc(0);

  // pass 2: m_i = max(sink_h, max_j s_ij) over the visible keys (compared by real part)
  Real m_i = plan.sinks ? real_part(sink_h) : -std::numeric_limits<Real>::infinity();
  for (std::int64_t j = 0; j < Sk; ++j) {
    if (row.visible[j] && real_part(s[j]) > m_i) m_i = real_part(s[j]);
  }
  if constexpr (is_low_precision_v<T>) {
    attention_softmax_base2(plan.sinks, sink_h, m_i, row);
    return row;
  }

  // pass 3: l_i = exp(sink_h - m_i) + sum_j exp(s_ij - m_i) over the visible keys
  Acc l_i = plan.sinks ? std::exp(sink_h - m_i) : Acc(0);
  for (std::int64_t j = 0; j < Sk; ++j) {
    if (row.visible[j]) l_i += std::exp(s[j] - m_i);
  }

  // the log-sum-exp lse_i = m_i + log l_i, what a forward saves for its backward
  row.lse = m_i + std::log(l_i);

  // pass 4: p_ij = exp(s_ij - m_i) / l_i, and the sink's share p_sink,i = exp(sink_h - m_i) / l_i
  for (std::int64_t j = 0; j < Sk; ++j) {
    if (row.visible[j]) row.p[j] = std::exp(s[j] - m_i) / l_i;
  }
  if (plan.sinks) row.p_sink = std::exp(sink_h - m_i) / l_i;
  return row;
}

/// Forward passes 1–4 for query i of sequence `seq`, head h (attention_row_from
/// with `<q_i, k_j>` of the plain k): q_i `[D]` and k_j `[D]` are read through
/// plan.q / plan.k at the sequence's rows. (ggml's profile rounds q to K's
/// type, SPEC §10.2: with plain k that is q's own type T, so q is read as it
/// is.) Inputs must be checked.
template <class T, class Acc = accumulator_t<T>>
AttentionRow<Acc> attention_row(const AttentionPlan& plan, const AttentionInputs<T>& in,
                                const AttentionSeq& seq, std::int64_t h, std::int64_t i,
                                std::span<const T> bias_step = {}) {
  const std::int64_t kv_head = plan.kv_head(h);
  const std::int64_t q_at = plan.q.at(seq.b, seq.q_row(i), h);
  // <q_i, k_j> = sum_d q_id * k_jd
  const auto dot = [&](const KeyRow& key) {
    Acc dot_ij = Acc(0);
    for (std::int64_t d = 0; d < plan.D; ++d) {
      dot_ij += static_cast<Acc>(in.q[q_at + d]) *
                static_cast<Acc>(in.k[plan.k.at(key.batch, key.seq, kv_head) + d]);
    }
    return dot_ij;
  };
  return attention_row_from<T, Acc>(plan, in, seq, h, i, dot, bias_step);
}

/// Forward pass 5 for query i of sequence `seq`, head h, with the values
/// given: `value(key, d)` is v_jd for key j at KeyRow `key`. Returns o_i
/// `[Dv]` in Acc before its final rounding (all 0 when no key is visible):
///
///     float, double, complex:  o_i = Σ_j p_ij · v_j
///     bf16, f16 (SPEC §10.2):  o_i = Σ_j w_ij · v_j / l_i,  w_ij = RN_T(e_ij)
///                              (w_ij = e_ij when !plan.rounding.operands)
///     ... output_accumulator:  a ← RN_T(a + w_ij · v_j) over j increasing, o_i = a / l_i
///
/// The caller rounds o_i to T once (RN_T).
template <class T, class Acc, class Value>
std::vector<Acc> attention_output_row_from(const AttentionPlan& plan, const AttentionSeq& seq,
                                           const AttentionRow<Acc>& row, const Value& value) {
  std::vector<Acc> o_i(plan.Dv, Acc(0));
  if constexpr (is_low_precision_v<T>) {
    if (row.n_visible == 0 && !plan.sinks) return o_i;
    // the weights as the second product takes them: w_ij = RN_T(e_ij) (profiles pytorch, ggml)
    std::vector<Acc> w(row.e);
    for (std::int64_t j = 0; plan.rounding.operands && j < seq.Sk; ++j) {
      w[j] = round_as<T>(row.e[j]);
    }
    // pass 5: a_i = Σ_j w_ij · v_j (in Acc, or in T after every key: ggml), o_i = a_i / l_i
    for (std::int64_t d = 0; d < plan.Dv; ++d) {
      Acc a_id = Acc(0);
      for (std::int64_t j = 0; j < seq.Sk; ++j) {
        if (!row.visible[j]) continue;
        a_id += w[j] * value(seq.key_row(j), d);
        if (plan.rounding.output_accumulator) a_id = round_as<T>(a_id);
      }
      o_i[d] = a_id / row.l;
    }
    return o_i;
  }
  // pass 5: o_i = sum_j p_ij * v_j   (the sink has no value)
  for (std::int64_t d = 0; d < plan.Dv; ++d) {
    for (std::int64_t j = 0; j < seq.Sk; ++j) {
      if (!row.visible[j]) continue;
      o_i[d] += row.p[j] * value(seq.key_row(j), d);
    }
  }
  return o_i;
}

/// Forward pass 5 for query i of sequence `seq`, head h: `o_i = sum_j p_ij v_j`
/// over the visible keys (attention_output_row_from), v_j `[Dv]` read through
/// plan.v at kv head h/(H/Hkv). Returns o_i `[Dv]` in Acc (all 0 when no key
/// is visible), before its rounding to T.
template <class T, class Acc = accumulator_t<T>>
std::vector<Acc> attention_output_row(const AttentionPlan& plan, const AttentionInputs<T>& in,
                                      const AttentionSeq& seq, const AttentionRow<Acc>& row,
                                      std::int64_t h) {
  const std::int64_t kv_head = plan.kv_head(h);
  const auto v_jd = [&](const KeyRow& key, std::int64_t d) {
    return static_cast<Acc>(in.v[plan.v.at(key.batch, key.seq, kv_head) + d]);
  };
  return attention_output_row_from<T, Acc>(plan, seq, row, v_jd);
}

/// The softmax row of query i rebuilt from a saved log-sum-exp: the scores of
/// attention_row (pass 1), then `p_ij = exp(s_ij − lse_i)` (and
/// `p_sink,i = exp(sink_h − lse_i)`) in place of the forward's passes 2–4.
/// lse_i is read from saved.lse `[B,H,Sq]`.
template <class T, class Acc = accumulator_t<T>>
AttentionRow<Acc> attention_row_saved(const AttentionPlan& plan, const AttentionInputs<T>& in,
                                      const AttentionSaved<T>& saved, const AttentionSeq& seq,
                                      std::int64_t h, std::int64_t i) {
  AttentionRow<Acc> row = attention_row<T, Acc>(plan, in, seq, h, i);
  const Acc lse_i = static_cast<Acc>(saved.lse[plan.lse_at(seq.b, h, seq.q_row(i))]);
  // p_ij = exp(s_ij - lse_i)   (the forward's p_ij = exp(s_ij - m_i) / l_i)
  for (std::int64_t j = 0; j < seq.Sk; ++j) {
    if (row.visible[j]) row.p[j] = std::exp(row.s[j] - lse_i);
  }
  if (plan.sinks) row.p_sink = std::exp(static_cast<Acc>(in.sinks[h]) - lse_i);
  return row;
}

/// What backward passes 1–4 give for one query row: the score gradient
/// before and after the cap, and delta_i (which the sink's gradient needs too).
template <class Acc>
struct ScoreGrad {
  std::vector<Acc>
      ds;  ///< ds_ij `[Sk]`, the gradient of the final score (and the bias), 0 for hidden keys
  std::vector<Acc> dx;  ///< dx_ij `[Sk]`, 0 for hidden keys
  Acc delta = Acc(0);   ///< delta_i = <dO_i, o_i>
};

/// Backward passes 1–4 for query i of sequence `seq`, head h: the gradient of
/// the loss <dO, O> with respect to the score before the cap,
/// x_ij = scale·<q_i,k_j>: `dx_ij = p_ij (<dO_i, v_j> − <dO_i, o_i>) ·
/// (1 − tanh²(x_ij/c))` (the last factor only when softcap c > 0). dO_i `[Dv]`
/// is read through plan.o; o_i is recomputed, or read from saved->out when
/// given. Views must be checked.
template <class T, class Acc = accumulator_t<T>>
ScoreGrad<Acc> attention_score_grad_row(const AttentionPlan& plan, const AttentionInputs<T>& in,
                                        std::span<const T> dout, const AttentionSeq& seq,
                                        const AttentionRow<Acc>& row, std::int64_t h,
                                        std::int64_t i, const AttentionSaved<T>* saved = nullptr) {
  const std::int64_t kv_head = plan.kv_head(h);
  const std::int64_t o_at = plan.o.at(seq.b, seq.q_row(i), h);
  // o_i: forward pass 5 again, or the forward's saved output row
  std::vector<Acc> o_i(plan.Dv, Acc(0));
  if (saved == nullptr) o_i = attention_output_row<T, Acc>(plan, in, seq, row, h);
  for (std::int64_t d = 0; saved != nullptr && d < plan.Dv; ++d) {
    o_i[d] = static_cast<Acc>(saved->out[o_at + d]);
  }

  // pass 1: dp_ij = <dO_i, v_j>
  //   forward: o_i = sum_j p_ij * v_j
  std::vector<Acc> dp(seq.Sk, Acc(0));
  for (std::int64_t j = 0; j < seq.Sk; ++j) {
    if (!row.visible[j]) continue;
    const KeyRow key = seq.key_row(j);
    for (std::int64_t d = 0; d < plan.Dv; ++d) {
      dp[j] += static_cast<Acc>(dout[o_at + d]) *
               static_cast<Acc>(in.v[plan.v.at(key.batch, key.seq, kv_head) + d]);
    }
  }

  // pass 2: delta_i = <dO_i, o_i>  (rowsum(dO ∘ O), equal to sum_j p_ij dp_ij; the
  // sink's dp is 0: it has no value)
  ScoreGrad<Acc> g;
  for (std::int64_t d = 0; d < plan.Dv; ++d) {
    g.delta += static_cast<Acc>(dout[o_at + d]) * o_i[d];
  }

  // pass 3: ds_ij = p_ij * (dp_ij - delta_i)
  //   forward: p_ij = exp(s_ij - m_i) / l_i
  // (ds_ij is also the gradient of the score before ALiBi and the bias, and of
  // the bias itself: d/ds and d/dbias of
  //   forward: s_ij = s_ij - m_h * |i + Sk - Sq - j|,  s_ij = s_ij + bias_ij
  // are 1; the slopes are constants.)
  std::vector<Acc>& ds = g.ds;
  ds.assign(seq.Sk, Acc(0));
  for (std::int64_t j = 0; j < seq.Sk; ++j) {
    if (row.visible[j]) ds[j] = row.p[j] * (dp[j] - g.delta);
  }

  // pass 4: dx_ij = ds_ij * (1 - tanh²(x_ij / c))   (softcap c > 0)
  //         dx_ij = ds_ij                            (no softcap: s_ij = x_ij)
  //   forward: s_ij = c * tanh(x_ij / c)
  g.dx.assign(seq.Sk, Acc(0));
  for (std::int64_t j = 0; j < seq.Sk; ++j) {
    if (!row.visible[j]) continue;
    if (plan.softcap > 0) {
      g.dx[j] = ds[j] * (Acc(1) - row.cap_tanh[j] * row.cap_tanh[j]);
    } else {
      g.dx[j] = ds[j];
    }
  }
  return g;
}

/// Attention forward (SPEC §2, §2.7–2.10): for every sequence, h, i,
/// `o_i = sum_{visible j} p_ij · v_j` with p of attention_row, 0 for a query
/// with no visible key. q `[B,Sq,H,D]`, k `[B,Sk,Hkv,D]`, v `[B,Sk,Hkv,Dv]`
/// (through plan.q/k/v, row strides allowed; packed or paged as the plan
/// says), out `[B,Sq,H,Dv]` contiguous in q's layout (plan.o); when lse
/// `[B,H,Sq]` is given it receives `lse_i = m_i + log l_i` (see
/// AttentionSaved; in stat_t<T>, float32 for bf16 and f16). `bias_step` (mask kind bias only)
/// is added to the bias at scalar T, see attention_row. For bf16 and f16 the rounding points
/// are SPEC §10.2's, per plan.rounding (attention_output_row_from): o_i = RN_T(Σ_j w_ij v_j / l_i),
/// lse_i = RN_f32(μ_i·ln 2 + ln l_i). Throws tandem::Error before writing anything when a view
/// does not fit the plan.
template <class T, class Acc = accumulator_t<T>>
void attention_forward(const AttentionPlan& plan, const AttentionInputs<T>& in, std::span<T> out,
                       std::span<stat_t<T>> lse = {}, std::span<const T> bias_step = {}) {
  check_inputs(plan, in);
  require_size(out.size(), plan.o.extent, "out");
  if (!lse.empty()) require_size(lse.size(), plan.lse_size(), "lse");
  if (!bias_step.empty()) require_size(bias_step.size(), plan.mask_size(), "bias_step");

  for (std::int64_t n = 0; n < plan.sequences(); ++n) {
    const AttentionSeq seq = plan.sequence(in, n);
    for (std::int64_t h = 0; h < plan.H; ++h) {
      for (std::int64_t i = 0; i < seq.Sq; ++i) {
        // passes 1–4: p_ij = softmax_j(s_ij) over the visible keys (and the sink)
        const AttentionRow<Acc> row = attention_row<T, Acc>(plan, in, seq, h, i, bias_step);
        // pass 5: o_i = sum_j p_ij * v_j, rounded once to T: RN_T(o_i)
        const std::vector<Acc> o_i = attention_output_row<T, Acc>(plan, in, seq, row, h);
        for (std::int64_t d = 0; d < plan.Dv; ++d) {
          out[plan.o.at(seq.b, seq.q_row(i), h) + d] = static_cast<T>(o_i[d]);
        }
        // lse_i, kept for a backward from the saved state (attention_backward_saved): RN_f32
        // for bf16 and f16
        if (!lse.empty()) {
          lse[plan.lse_at(seq.b, h, seq.q_row(i))] = static_cast<stat_t<T>>(row.lse);
        }
      }
    }
  }
}

/// dQ, dK, dV, dsinks and dbias in one pass over the queries (SPEC §3, §2.7):
/// with P the probabilities, ds and dx the score gradient after and before the cap,
/// `dq_i = scale · sum_j dx_ij k_j`, `dk_j = scale · sum_{h,i} dx_ij q_i`,
/// `dv_j = sum_{h,i} p_ij dO_i` (h over the query heads sharing kv head g),
/// `dsink_h = −sum_{n,i} p_sink,i · <dO_i, o_i>`, `dbias_{b,h,i,j} = ds_ij`
/// summed over b when Bb = 1 and over h when Hb = 1.
/// dout `[B,Sq,H,Dv]` (plan.o); grads.dq `[B,Sq,H,D]`, grads.dk `[B,Sk,Hkv,D]`,
/// grads.dv `[B,Sk,Hkv,Dv]`, grads.dsinks `[H]`, grads.dbias `[Bb,Hb,Sq,Sk]`, contiguous: any
/// non-empty subset of them, an empty view is neither computed nor written (check_grads). With
/// `saved` (the forward's out and lse) P and delta come from it instead of a second forward; see
/// attention_backward_saved. A paged plan has no backward. Throws tandem::Error before writing
/// anything. For bf16 and f16 (SPEC §10.2): p_ij from lse_i and delta_i from O_i as stored
/// (without `saved` the forward is run to store them), RN_T(p_ij) before dV and RN_T(dx_ij)
/// before dQ and dK (plan.rounding.operands), every gradient rounded once.
template <class T, class Acc = accumulator_t<T>>
void attention_backward(const AttentionPlan& plan, const AttentionInputs<T>& in,
                        std::span<const T> dout, const AttentionGrads<T>& grads,
                        const AttentionSaved<T>* saved = nullptr) {
  check_inputs(plan, in);
  require_size(dout.size(), plan.o.extent, "dout");
  check_grads(plan, grads);
  if (saved != nullptr) check_saved(plan, *saved);
  if constexpr (is_low_precision_v<T>) {
    // SPEC §10.2: a bf16 or f16 backward takes p_ij from lse_i and delta_i from O_i as the
    // forward stores them (lse in float32, O in T), so without a saved state it makes one.
    if (saved == nullptr) {
      std::vector<T> out(static_cast<std::size_t>(plan.o.extent));
      std::vector<stat_t<T>> lse(static_cast<std::size_t>(plan.lse_size()));
      attention_forward<T, Acc>(plan, in, out, lse);
      const AttentionSaved<T> stored{out, lse};
      attention_backward<T, Acc>(plan, in, dout, grads, &stored);
      return;
    }
  }
  const Acc scale = static_cast<Acc>(plan.scale);

  // dk_j, dv_j and dsink_h sum over queries (and query heads): accumulate in Acc.
  std::vector<Acc> dk_sum(grads.dk.size(), Acc(0));
  std::vector<Acc> dv_sum(grads.dv.size(), Acc(0));
  std::vector<Acc> dsink_sum(grads.dsinks.size(), Acc(0));
  std::vector<Acc> dbias_sum(grads.dbias.size(), Acc(0));
  for (std::int64_t n = 0; n < plan.sequences(); ++n) {
    const AttentionSeq seq = plan.sequence(in, n);
    for (std::int64_t h = 0; h < plan.H; ++h) {
      const std::int64_t kv_head = plan.kv_head(h);
      for (std::int64_t i = 0; i < seq.Sq; ++i) {
        const std::int64_t q_at = plan.q.at(seq.b, seq.q_row(i), h);
        // forward passes 1–4 again: p_ij (or from the saved lse_i)
        const AttentionRow<Acc> row =
            saved == nullptr ? attention_row<T, Acc>(plan, in, seq, h, i)
                             : attention_row_saved<T, Acc>(plan, in, *saved, seq, h, i);
        // backward passes 1–4: dx_ij and delta_i (from the saved o_i when given)
        const ScoreGrad<Acc> g =
            attention_score_grad_row<T, Acc>(plan, in, dout, seq, row, h, i, saved);
        // the operands of the second products (SPEC §10.2): RN_T(p_ij) before dV and
        // RN_T(dx_ij) before dQ and dK when plan.rounding.operands (identities for float)
        std::vector<Acc> p = row.p, dx = g.dx;
        for (std::int64_t j = 0; plan.rounding.operands && j < seq.Sk; ++j) {
          p[j] = round_as<T>(row.p[j]);
          dx[j] = round_as<T>(g.dx[j]);
        }

        // pass 5a: dq_i = scale * sum_j dx_ij * k_j
        //   forward: x_ij = scale * <q_i, k_j>
        for (std::int64_t d = 0; !grads.dq.empty() && d < plan.D; ++d) {
          Acc dq_id = Acc(0);
          for (std::int64_t j = 0; j < seq.Sk; ++j) {
            if (!row.visible[j]) continue;
            const KeyRow key = seq.key_row(j);
            dq_id += dx[j] * static_cast<Acc>(in.k[plan.k.at(key.batch, key.seq, kv_head) + d]);
          }
          grads.dq[plan.dq.at(seq.b, seq.q_row(i), h) + d] = static_cast<T>(scale * dq_id);
        }

        // pass 5b: dk_j += scale * dx_ij * q_i   (into kv head g = kv_head(h))
        //   forward: x_ij = scale * <q_i, k_j>
        for (std::int64_t j = 0; !grads.dk.empty() && j < seq.Sk; ++j) {
          if (!row.visible[j]) continue;
          const KeyRow key = seq.key_row(j);
          for (std::int64_t d = 0; d < plan.D; ++d) {
            dk_sum[plan.dk.at(key.batch, key.seq, kv_head) + d] +=
                scale * dx[j] * static_cast<Acc>(in.q[q_at + d]);
          }
        }

        // pass 5c: dv_j += p_ij * dO_i   (into kv head g = kv_head(h))
        //   forward: o_i = sum_j p_ij * v_j
        for (std::int64_t j = 0; !grads.dv.empty() && j < seq.Sk; ++j) {
          if (!row.visible[j]) continue;
          const KeyRow key = seq.key_row(j);
          for (std::int64_t d = 0; d < plan.Dv; ++d) {
            dv_sum[plan.dv.at(key.batch, key.seq, kv_head) + d] +=
                p[j] * static_cast<Acc>(dout[plan.o.at(seq.b, seq.q_row(i), h) + d]);
          }
        }

        // pass 6: dsink_h += -p_sink,i * delta_i
        //   forward: l_i = exp(sink_h - m_i) + sum_j exp(s_ij - m_i), the sink has no value
        if (!grads.dsinks.empty()) dsink_sum[h] += -row.p_sink * g.delta;

        // pass 7: dbias_ij += ds_ij   (row mask_row(b, h, i): b and h are 0 where Bb, Hb = 1,
        //   so the broadcast axes sum in the order n, h)
        //   forward: s_ij = s_ij + bias_ij
        for (std::int64_t j = 0; !grads.dbias.empty() && j < seq.Sk; ++j) {
          dbias_sum[plan.mask_row(seq.b, h, i) + j] += g.ds[j];
        }
      }
    }
  }
  for (std::size_t e = 0; e < grads.dk.size(); ++e) grads.dk[e] = static_cast<T>(dk_sum[e]);
  for (std::size_t e = 0; e < grads.dv.size(); ++e) grads.dv[e] = static_cast<T>(dv_sum[e]);
  for (std::size_t e = 0; e < grads.dsinks.size(); ++e) {
    grads.dsinks[e] = static_cast<T>(dsink_sum[e]);
  }
  for (std::size_t e = 0; e < grads.dbias.size(); ++e) {
    grads.dbias[e] = static_cast<T>(dbias_sum[e]);
  }
}

/// dQ alone (SPEC §3): `dq_i = scale · sum_j dx_ij k_j`, attention_backward
/// with only dq `[B,Sq,H,D]` (contiguous, plan.dq). Throws tandem::Error
/// before writing.
template <class T, class Acc = accumulator_t<T>>
void attention_backward_dq(const AttentionPlan& plan, const AttentionInputs<T>& in,
                           std::span<const T> dout, std::span<T> dq) {
  require_size(dq.size(), plan.dq.extent, "dq");
  attention_backward<T, Acc>(plan, in, dout, AttentionGrads<T>{dq, {}, {}});
}

/// dK alone (SPEC §3): `dk_j = scale · sum_{h reading kv head g} sum_i dx_ij q_i`
/// — GQA sums over the H/Hkv query heads that share k_j. dk `[B,Sk,Hkv,D]`
/// contiguous (plan.dk). Throws tandem::Error before writing.
template <class T, class Acc = accumulator_t<T>>
void attention_backward_dk(const AttentionPlan& plan, const AttentionInputs<T>& in,
                           std::span<const T> dout, std::span<T> dk) {
  require_size(dk.size(), plan.dk.extent, "dk");
  attention_backward<T, Acc>(plan, in, dout, AttentionGrads<T>{{}, dk, {}});
}

/// dV alone (SPEC §3): `dv_j = sum_{h reading kv head g} sum_i p_ij dO_i`
/// — GQA sums over the H/Hkv query heads that share v_j. dv `[B,Sk,Hkv,Dv]`
/// contiguous (plan.dv). Throws tandem::Error before writing.
template <class T, class Acc = accumulator_t<T>>
void attention_backward_dv(const AttentionPlan& plan, const AttentionInputs<T>& in,
                           std::span<const T> dout, std::span<T> dv) {
  require_size(dv.size(), plan.dv.extent, "dv");
  attention_backward<T, Acc>(plan, in, dout, AttentionGrads<T>{{}, {}, dv});
}

/// Attention forward that also saves the log-sum-exp for the backward:
/// out as attention_forward, lse `[B,H,Sq]` (contiguous, plan.lse_at)
/// `lse_i = m_i + log l_i` (the sink included), −inf for a query with no
/// visible key and no sink.
template <class T, class Acc = accumulator_t<T>>
void attention_forward_lse(const AttentionPlan& plan, const AttentionInputs<T>& in,
                           std::span<T> out, std::span<stat_t<T>> lse) {
  require_size(lse.size(), plan.lse_size(), "lse");
  attention_forward<T, Acc>(plan, in, out, lse);
}

/// The gradients from the forward's saved state (AttentionSaved: out and lse):
/// the formulas of attention_backward with `p_ij = exp(s_ij − lse_i)`,
/// `p_sink,i = exp(sink_h − lse_i)` and `delta_i = <dO_i, out_i>` read from
/// what the forward kept. A fast backend thereby skips the forward's softmax
/// and pass 5; this reference takes the scores s_ij from attention_row (whose
/// own p it overwrites) for clarity. Given the forward's own out and lse it
/// equals attention_backward up to rounding. Throws tandem::Error before
/// writing anything.
template <class T, class Acc = accumulator_t<T>>
void attention_backward_saved(const AttentionPlan& plan, const AttentionInputs<T>& in,
                              const AttentionSaved<T>& saved, std::span<const T> dout,
                              const AttentionGrads<T>& grads) {
  attention_backward<T, Acc>(plan, in, dout, grads, &saved);
}

}  // namespace tandem::reference
