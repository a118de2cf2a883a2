// SPDX-License-Identifier: Apache-2.0
/// @file reference/flex.hpp
/// @brief The reference FlexAttention (SPEC §13.4): forward and backward,
///        one query row at a time, in the scalar type S (double, or complex
///        for complex-step gradients through q, k, v and the captured
///        tensors). The mods are evaluated one element at a time by
///        evaluate_mod (reference/flex_mod.hpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "tandem/flex_plan.hpp"
#include "tandem/reference/flex_mod.hpp"
#include "tandem/reference/scalar.hpp"
#include "tandem/storage.hpp"

namespace tandem::reference {

/// The block mask's verdict on one block (SPEC §13.4).
enum class FlexBlock : std::uint8_t { hidden, partial, full };

/// The verdict on kv block `kb` of query block `qb` for (b, h): listed in
/// full_kv_indices → full, in kv_indices → partial, else hidden; without a
/// block mask every block is partial.
inline FlexBlock flex_block(const FlexPlan& plan, const FlexBlockMaskData& m, std::int64_t b,
                            std::int64_t h, std::int64_t qb, std::int64_t kb) {
  if (!plan.params().block_mask) return FlexBlock::partial;
  const FlexBlockMaskShape& s = *plan.params().block_mask;
  // row = (b mod B', h mod H', qb): B' and H' of 1 broadcast
  const std::int64_t row = ((b % s.B) * s.H + h % s.H) * plan.q_blocks() + qb;
  const auto listed = [&](const Indices& num, const Indices& idx, std::int64_t width) {
    for (std::int64_t c = 0; c < num[static_cast<std::size_t>(row)]; ++c) {
      if (idx[static_cast<std::size_t>(row * width + c)] == kb) return true;
    }
    return false;
  };
  if (s.has_full && listed(m.full_kv_num_blocks, m.full_kv_indices, s.full_width)) {
    return FlexBlock::full;
  }
  return listed(m.kv_num_blocks, m.kv_indices, s.width) ? FlexBlock::partial : FlexBlock::hidden;
}

/// visible(b, h, i, j): a full block, or a partial block where mask_mod(b, h, i, j) holds.
template <class S>
bool flex_visible(const FlexPlan& plan, const FlexInputs<S>& in, std::int64_t b, std::int64_t h,
                  std::int64_t i, std::int64_t j, std::vector<ModValueAt<S>>& val) {
  const auto& bm = plan.params().block_mask;
  const std::int64_t qb = bm ? i / bm->q_block : 0, kb = bm ? j / bm->kv_block : 0;
  const FlexBlock block = flex_block(plan, in.block_mask, b, h, qb, kb);
  if (block != FlexBlock::partial) return block == FlexBlock::full;
  const ModProgram& mask = plan.params().mask_mod;
  if (mask.empty()) return true;
  evaluate_mod(mask, in.mask_tensors, ModPoint<S>{S{}, b, h, i, j}, val);
  return val[static_cast<std::size_t>(mask.result())].integer != 0;
}

/// One query row (b, h, i) of the forward: t_ij for every key (−inf where
/// hidden), lse_i and o_i `[Dv]`.
template <class S>
struct FlexRow {
  std::vector<S> s;  ///< s_ij = scale·<q_i, k_j>
  std::vector<S> t;  ///< t_ij = score_mod(s_ij, b, h, i, j); −inf where not visible
  S lse{};           ///< log Σ_j e^{t_ij}; −inf when no key is visible
  std::vector<S> o;  ///< o_i = Σ_j p_ij v_j
};

/// Element offsets into the `bhsd` tensors of (b, head, row).
inline std::int64_t flex_at(std::int64_t b, std::int64_t heads, std::int64_t head,
                            std::int64_t rows, std::int64_t row, std::int64_t width) {
  return ((b * heads + head) * rows + row) * width;
}

/// The forward of query row (b, h, i).
template <class S>
FlexRow<S> flex_row(const FlexPlan& plan, const FlexInputs<S>& in, std::int64_t b, std::int64_t h,
                    std::int64_t i) {
  const FlexParams& p = plan.params();
  const std::int64_t g = h / plan.group();  // the kv head of query head h
  const S* q_i = in.q.data() + flex_at(b, p.H, h, p.Sq, i, p.D);
  const S neg_inf = S(-std::numeric_limits<double>::infinity());
  FlexRow<S> row{std::vector<S>(static_cast<std::size_t>(p.Sk)),
                 std::vector<S>(static_cast<std::size_t>(p.Sk), neg_inf), neg_inf,
                 std::vector<S>(static_cast<std::size_t>(p.Dv))};
  std::vector<ModValueAt<S>> val;
  // t_ij = score_mod(scale·Σ_d q_id k_jd, b, h, i, j) for visible j
  for (std::int64_t j = 0; j < p.Sk; ++j) {
    const S* k_j = in.k.data() + flex_at(b, p.Hkv, g, p.Sk, j, p.D);
    S dot{};
    for (std::int64_t d = 0; d < p.D; ++d) dot += q_i[d] * k_j[d];
    const S s = S(plan.scale()) * dot;
    row.s[static_cast<std::size_t>(j)] = s;
    if (!flex_visible(plan, in, b, h, i, j, val)) continue;
    if (p.score_mod.empty()) {
      row.t[static_cast<std::size_t>(j)] = s;
      continue;
    }
    evaluate_mod(p.score_mod, in.score_tensors, ModPoint<S>{s, b, h, i, j}, val);
    row.t[static_cast<std::size_t>(j)] = val[static_cast<std::size_t>(p.score_mod.result())].real;
  }
  // a visible t_ij that is NaN or +inf: o_i and lse_i are NaN
  for (const S& t : row.t) {
    const double x = static_cast<double>(real_part(t));
    if (std::isnan(x) || x == std::numeric_limits<double>::infinity()) {
      row.lse = S(std::numeric_limits<double>::quiet_NaN());
      std::fill(row.o.begin(), row.o.end(), row.lse);
      return row;
    }
  }
  // m = max_j t_ij (by real part); a row with m = −inf sees nothing: o = 0, lse = −inf
  double m = -std::numeric_limits<double>::infinity();
  for (const S& t : row.t) m = std::max(m, static_cast<double>(real_part(t)));
  if (m == -std::numeric_limits<double>::infinity()) return row;
  // lse_i = m + log Σ_j e^{t_ij − m}
  S l{};
  for (const S& t : row.t) l += std::exp(t - S(m));
  row.lse = S(m) + std::log(l);
  // o_i = Σ_j e^{t_ij − lse_i} v_j
  for (std::int64_t j = 0; j < p.Sk; ++j) {
    const S p_ij = std::exp(row.t[static_cast<std::size_t>(j)] - row.lse);
    const S* v_j = in.v.data() + flex_at(b, p.Hkv, g, p.Sk, j, p.Dv);
    for (std::int64_t e = 0; e < p.Dv; ++e) row.o[static_cast<std::size_t>(e)] += p_ij * v_j[e];
  }
  return row;
}

/// out `[B,H,Sq,Dv]` and, when not empty, lse `[B,H,Sq]` (SPEC §13.4).
/// Throws Error (FlexPlan::check_inputs) before writing anything.
template <class S>
void flex_forward(const FlexPlan& plan, const FlexInputs<S>& in, std::span<S> out,
                  std::span<S> lse = {}) {
  plan.check_inputs(in, out.size(), lse.size());
  const FlexParams& p = plan.params();
  for (std::int64_t b = 0; b < p.B; ++b) {
    for (std::int64_t h = 0; h < p.H; ++h) {
      for (std::int64_t i = 0; i < p.Sq; ++i) {
        const FlexRow<S> row = flex_row(plan, in, b, h, i);
        S* o_i = out.data() + flex_at(b, p.H, h, p.Sq, i, p.Dv);
        for (std::int64_t e = 0; e < p.Dv; ++e) o_i[e] = row.o[static_cast<std::size_t>(e)];
        if (!lse.empty()) lse[static_cast<std::size_t>(flex_at(b, p.H, h, p.Sq, i, 1))] = row.lse;
      }
    }
  }
}

/// dT[e] += dt_ij · ∂t/∂T[e] for each load of a real tensor element T[e]
/// (`val` holds the gradient program evaluated at (s_ij, b, h, i, j)).
template <class S>
void flex_tensor_grads(const ModGradient& df, const std::vector<ModValueAt<S>>& val, S dt_ij,
                       const std::vector<std::span<S>>& dT) {
  if (dT.empty()) return;
  for (const ModGradient::Load& l : df.loads) {
    const ModNode& n = df.program.node(l.node);
    const std::span<S> d = dT[static_cast<std::size_t>(n.tensor)];
    if (d.empty()) continue;
    const auto e = static_cast<std::size_t>(mod_offset(df.program, n, val));
    d[e] += dt_ij * val[static_cast<std::size_t>(l.d)].real;
  }
}

/// A row of the output or an input, or nullptr when its view is empty.
template <class S>
S* flex_row_of(std::span<S> x, std::int64_t at) {
  return x.empty() ? nullptr : x.data() + at;
}

/// The gradients of query row (b, h, i) of the backward (flex_backward).
template <class S>
void flex_backward_row(const FlexPlan& plan, const FlexInputs<S>& in, std::span<const S> dout,
                       const FlexGrads<S>& grads, const ModGradient& df, std::int64_t b,
                       std::int64_t h, std::int64_t i, std::vector<ModValueAt<S>>& val) {
  const FlexParams& p = plan.params();
  const std::int64_t g = h / plan.group();
  const FlexRow<S> row = flex_row(plan, in, b, h, i);
  if (real_part(row.lse) == -std::numeric_limits<double>::infinity()) return;  // nothing visible
  const S* q_i = in.q.data() + flex_at(b, p.H, h, p.Sq, i, p.D);
  const S* dO_i = dout.data() + flex_at(b, p.H, h, p.Sq, i, p.Dv);
  S* dq_i = flex_row_of(grads.dq, flex_at(b, p.H, h, p.Sq, i, p.D));
  const S scale = S(plan.scale());
  // D_i = <dO_i, o_i>
  S D_i{};
  for (std::int64_t e = 0; e < p.Dv; ++e) D_i += dO_i[e] * row.o[static_cast<std::size_t>(e)];
  for (std::int64_t j = 0; j < p.Sk; ++j) {
    const S t_ij = row.t[static_cast<std::size_t>(j)];
    if (real_part(t_ij) == -std::numeric_limits<double>::infinity()) continue;  // p_ij = 0
    const S p_ij = std::exp(t_ij - row.lse);
    const S* k_j = in.k.data() + flex_at(b, p.Hkv, g, p.Sk, j, p.D);
    const S* v_j = in.v.data() + flex_at(b, p.Hkv, g, p.Sk, j, p.Dv);
    S* dk_j = flex_row_of(grads.dk, flex_at(b, p.Hkv, g, p.Sk, j, p.D));
    S* dv_j = flex_row_of(grads.dv, flex_at(b, p.Hkv, g, p.Sk, j, p.Dv));
    // dv_j += p_ij dO_i;  dp_ij = <dO_i, v_j>
    S dp_ij{};
    for (std::int64_t e = 0; e < p.Dv; ++e) {
      if (dv_j != nullptr) dv_j[e] += p_ij * dO_i[e];
      dp_ij += dO_i[e] * v_j[e];
    }
    // dt_ij = p_ij (dp_ij − D_i)
    const S dt_ij = p_ij * (dp_ij - D_i);
    // ds_ij = dt_ij · ∂t/∂s, and dT[e] += dt_ij · ∂t/∂T[e]
    S ds_ij = dt_ij;
    if (!p.score_mod.empty()) {
      evaluate_mod(df.program, in.score_tensors,
                   ModPoint<S>{row.s[static_cast<std::size_t>(j)], b, h, i, j}, val);
      ds_ij = df.d_score < 0 ? S{} : dt_ij * val[static_cast<std::size_t>(df.d_score)].real;
      flex_tensor_grads(df, val, dt_ij, grads.d_score_tensors);
    }
    // dq_i += scale ds_ij k_j;  dk_j += scale ds_ij q_i
    for (std::int64_t d = 0; d < p.D; ++d) {
      if (dq_i != nullptr) dq_i[d] += scale * ds_ij * k_j[d];
      if (dk_j != nullptr) dk_j[d] += scale * ds_ij * q_i[d];
    }
  }
}

/// dq, dk, dv and the score_mod tensors' gradients (any subset; SPEC §13.4)
/// from dout `[B,H,Sq,Dv]`, recomputing the forward one row at a time:
///   dv_j += p_ij dO_i                         (o_i = Σ_j p_ij v_j)
///   dt_ij = p_ij (<dO_i, v_j> − <dO_i, o_i>)  (p_ij = e^{t_ij − lse_i})
///   ds_ij = dt_ij · ∂t/∂s                     (t_ij = score_mod(s_ij, …))
///   dq_i += scale ds_ij k_j, dk_j += scale ds_ij q_i   (s_ij = scale <q_i, k_j>)
///   dT[e] += dt_ij · ∂t/∂T[e] for each load of T[e]
/// with ∂t from `df` (the plan's score_grad(): flex_backward). Throws Error
/// (FlexPlan::check_grads) before writing anything.
template <class S>
void flex_backward_by(const FlexPlan& plan, const ModGradient& df, const FlexInputs<S>& in,
                      std::span<const S> dout, const FlexGrads<S>& grads) {
  plan.check_grads(in, dout.size(), grads);
  const FlexParams& p = plan.params();
  for (auto x : {grads.dq, grads.dk, grads.dv}) std::fill(x.begin(), x.end(), S{});
  for (auto x : grads.d_score_tensors) std::fill(x.begin(), x.end(), S{});
  std::vector<ModValueAt<S>> val;
  for (std::int64_t b = 0; b < p.B; ++b) {
    for (std::int64_t h = 0; h < p.H; ++h) {
      for (std::int64_t i = 0; i < p.Sq; ++i) {
        flex_backward_row(plan, in, dout, grads, df, b, h, i, val);
      }
    }
  }
}

/// The backward of SPEC §13.4 (flex_backward_by with the plan's derivative).
template <class S>
void flex_backward(const FlexPlan& plan, const FlexInputs<S>& in, std::span<const S> dout,
                   const FlexGrads<S>& grads) {
  flex_backward_by(plan, plan.score_grad(), in, dout, grads);
}

/// How many of block (qb, kb)'s elements mask_mod(b, h, i, j) keeps, and
/// the first (i, j) it hides (−1 when none), for create_block_mask and
/// validate_block_mask. An empty mask_mod keeps every element.
struct FlexBlockCount {
  std::int64_t kept = 0;       ///< elements kept
  std::int64_t size = 0;       ///< elements in the block
  std::int64_t hidden_i = -1;  ///< the first element hidden: its q_idx
  std::int64_t hidden_j = -1;  ///< … and its kv_idx
  std::int64_t kept_i = -1;    ///< the first element kept: its q_idx
  std::int64_t kept_j = -1;    ///< … and its kv_idx
};

/// Counts the elements of block (qb, kv) of (b, h) that mask_mod keeps.
template <class S>
FlexBlockCount flex_block_count(const FlexPlan& plan, const ModCaptures<S>& tensors,
                                std::int64_t q_block, std::int64_t kv_block, std::int64_t b,
                                std::int64_t h, std::int64_t qb, std::int64_t kb) {
  const FlexParams& p = plan.params();
  FlexBlockCount c;
  std::vector<ModValueAt<S>> val;
  for (std::int64_t i = qb * q_block; i < std::min(p.Sq, (qb + 1) * q_block); ++i) {
    for (std::int64_t j = kb * kv_block; j < std::min(p.Sk, (kb + 1) * kv_block); ++j) {
      bool keep = true;
      if (!p.mask_mod.empty()) {
        evaluate_mod(p.mask_mod, tensors, ModPoint<S>{S{}, b, h, i, j}, val);
        keep = val[static_cast<std::size_t>(p.mask_mod.result())].integer != 0;
      }
      ++c.size;
      if (keep) {
        if (c.kept++ == 0) std::tie(c.kept_i, c.kept_j) = std::pair(i, j);
      } else if (c.hidden_i < 0) {
        std::tie(c.hidden_i, c.hidden_j) = std::pair(i, j);
      }
    }
  }
  return c;
}

/// torch's create_block_mask: the block mask of `plan`'s mask_mod (the plan
/// has no block mask of its own) with blocks of q_block × kv_block: a
/// block where mask_mod keeps every element is full, one where it keeps
/// some is partial, the rest are hidden. B' = 1 (H' = 1) evaluates
/// mask_mod at b = 0 (h = 0) only and broadcasts it, as torch's B=None.
template <class S>
FlexBlockMask create_block_mask(const FlexPlan& plan, const ModCaptures<S>& mask_tensors,
                                std::int64_t q_block, std::int64_t kv_block,
                                bool broadcast_b = false, bool broadcast_h = false) {
  const FlexParams& p = plan.params();
  require(!p.block_mask, "block_mask", "given", "must be absent: create_block_mask makes it");
  require(q_block >= 1, "q_block", q_block, "must be >= 1");
  require(kv_block >= 1, "kv_block", kv_block, "must be >= 1");
  FlexBlockMask m;
  auto& s = m.shape;
  s = {q_block, kv_block, broadcast_b ? 1 : p.B, broadcast_h ? 1 : p.H, 0, 0, true};
  const std::int64_t nq = (p.Sq + q_block - 1) / q_block, nk = (p.Sk + kv_block - 1) / kv_block;
  s.width = s.full_width = nk;
  const auto rows = static_cast<std::size_t>(s.B * s.H * nq);
  m.kv_num_blocks.assign(rows, 0);
  m.full_kv_num_blocks.assign(rows, 0);
  m.kv_indices.assign(rows * static_cast<std::size_t>(nk), 0);
  m.full_kv_indices.assign(rows * static_cast<std::size_t>(nk), 0);
  std::size_t row = 0;
  for (std::int64_t b = 0; b < s.B; ++b) {
    for (std::int64_t h = 0; h < s.H; ++h) {
      for (std::int64_t qb = 0; qb < nq; ++qb, ++row) {
        for (std::int64_t kb = 0; kb < nk; ++kb) {
          const FlexBlockCount c =
              flex_block_count(plan, mask_tensors, q_block, kv_block, b, h, qb, kb);
          if (c.kept == 0) continue;
          const bool full = c.kept == c.size;
          auto& num = full ? m.full_kv_num_blocks : m.kv_num_blocks;
          auto& idx = full ? m.full_kv_indices : m.kv_indices;
          idx[row * static_cast<std::size_t>(nk) + static_cast<std::size_t>(num[row]++)] =
              static_cast<std::int32_t>(kb);
        }
      }
    }
  }
  return m;
}

/// Whether the call's block mask agrees with its mask_mod (SPEC §13.4):
/// nothing when every full block is all kept and every hidden block all
/// hidden, else the first disagreement, as text naming the block and the
/// element. (A full block that is not all kept corrupts the output of every
/// implementation that trusts it; partial blocks are always right.)
template <class S>
std::optional<std::string> validate_block_mask(const FlexPlan& plan, const FlexInputs<S>& in) {
  const FlexParams& p = plan.params();
  if (!p.block_mask) return std::nullopt;
  const FlexBlockMaskShape& s = *p.block_mask;
  plan.check_inputs(in, static_cast<std::size_t>(plan.out_size()), 0);
  for (std::int64_t b = 0; b < p.B; ++b) {
    for (std::int64_t h = 0; h < p.H; ++h) {
      for (std::int64_t qb = 0; qb < plan.q_blocks(); ++qb) {
        for (std::int64_t kb = 0; kb < plan.kv_blocks(); ++kb) {
          const FlexBlock v = flex_block(plan, in.block_mask, b, h, qb, kb);
          if (v == FlexBlock::partial) continue;
          const FlexBlockCount c =
              flex_block_count(plan, in.mask_tensors, s.q_block, s.kv_block, b, h, qb, kb);
          const bool full = v == FlexBlock::full;
          if (full ? c.kept == c.size : c.kept == 0) continue;
          const auto at = [&](std::int64_t i, std::int64_t j) {
            return "(b " + std::to_string(b) + ", h " + std::to_string(h) + ", q_idx " +
                   std::to_string(i) + ", kv_idx " + std::to_string(j) + ")";
          };
          return "block (q block " + std::to_string(qb) + ", kv block " + std::to_string(kb) +
                 ") of (b " + std::to_string(b) + ", h " + std::to_string(h) + ") is marked " +
                 (full ? "full, but mask_mod hides " + at(c.hidden_i, c.hidden_j)
                       : "hidden, but mask_mod keeps " + at(c.kept_i, c.kept_j));
        }
      }
    }
  }
  return std::nullopt;
}

// ------------------------------------------------------------ stored types

/// The inputs of a call in storage type T read exactly into Acc (owning
/// copies; FlexInputs views them), for the kernels at T of SPEC §13.4.
template <class T, class Acc>
struct FlexWidened {
  std::vector<Acc> q;                        ///< q in Acc
  std::vector<Acc> k;                        ///< k in Acc
  std::vector<Acc> v;                        ///< v in Acc
  std::vector<std::vector<Acc>> score_real;  ///< the score_mod's real tensors in Acc
  std::vector<std::vector<Acc>> mask_real;   ///< the mask_mod's real tensors in Acc
  FlexInputs<Acc> in;                        ///< views of the above

  FlexWidened(const FlexWidened&) = delete;             ///< `in` views this object's own vectors
  FlexWidened& operator=(const FlexWidened&) = delete;  ///< as the copy

  /// x read exactly into Acc.
  static std::vector<Acc> widen(std::span<const T> x) {
    std::vector<Acc> w(x.size());
    for (std::size_t e = 0; e < x.size(); ++e) w[e] = Acc(static_cast<double>(x[e]));
    return w;
  }
  /// The captured tensors in Acc (the real ones copied into `keep`).
  static ModCaptures<Acc> widen(const ModCaptures<T>& c, std::vector<std::vector<Acc>>& keep) {
    ModCaptures<Acc> w{{}, c.integer};
    for (const auto t : c.real) keep.push_back(widen(t));
    for (const auto& t : keep) w.real.emplace_back(t);
    return w;
  }
  /// The copies of x's inputs.
  explicit FlexWidened(const FlexInputs<T>& x) : q(widen(x.q)), k(widen(x.k)), v(widen(x.v)) {
    in = {q,           k, v, widen(x.score_tensors, score_real), widen(x.mask_tensors, mask_real),
          x.block_mask};
  }
};

/// The forward at storage type T with every sum in Acc: T's inputs read
/// exactly, o_i rounded to T once and lse_i to stat_t<T> once (SPEC §13.4).
template <class T, class Acc>
void flex_forward_stored(const FlexPlan& plan, const FlexInputs<T>& in, std::span<T> out,
                         std::span<stat_t<T>> lse) {
  if constexpr (std::is_same_v<T, Acc>) {
    flex_forward<Acc>(plan, in, out, lse);
  } else {
    plan.check_inputs(in, out.size(), lse.size());
    const FlexWidened<T, Acc> w(in);
    std::vector<Acc> o(out.size()), l(lse.size());
    flex_forward<Acc>(plan, w.in, o, l);
    for (std::size_t e = 0; e < o.size(); ++e) out[e] = static_cast<T>(o[e]);
    for (std::size_t e = 0; e < l.size(); ++e) lse[e] = static_cast<stat_t<T>>(l[e]);
  }
}

/// The backward at storage type T with every sum in Acc: each gradient
/// rounded to T once (SPEC §13.4).
template <class T, class Acc>
void flex_backward_stored(const FlexPlan& plan, const FlexInputs<T>& in, std::span<const T> dout,
                          const FlexGrads<T>& grads) {
  if constexpr (std::is_same_v<T, Acc>) {
    flex_backward<Acc>(plan, in, dout, grads);
  } else {
    plan.check_grads(in, dout.size(), grads);
    const FlexWidened<T, Acc> w(in);
    const std::vector<Acc> dO = FlexWidened<T, Acc>::widen(dout);
    std::vector<std::vector<Acc>> g;
    const auto acc = [&g](std::span<T> x) {
      g.emplace_back(x.size());
      return std::span<Acc>(g.back());
    };
    g.reserve(3 + grads.d_score_tensors.size());
    FlexGrads<Acc> ga{acc(grads.dq), acc(grads.dk), acc(grads.dv), {}};
    for (const auto t : grads.d_score_tensors) ga.d_score_tensors.push_back(acc(t));
    flex_backward<Acc>(plan, w.in, dO, ga);
    std::vector<std::span<T>> outs{grads.dq, grads.dk, grads.dv};
    outs.insert(outs.end(), grads.d_score_tensors.begin(), grads.d_score_tensors.end());
    for (std::size_t t = 0; t < outs.size(); ++t) {
      for (std::size_t e = 0; e < outs[t].size(); ++e) outs[t][e] = static_cast<T>(g[t][e]);
    }
  }
}

}  // namespace tandem::reference
