// SPDX-License-Identifier: Apache-2.0
/// @file attention_block.hpp
/// @brief The fused BERT-shaped attention block plan (SPEC §7).
///
/// x `[B, S, E]`, E = H·D, w_qkv `[3E, E]` (rows q, then k, then v, as
/// PyTorch's in_proj_weight), optional b_qkv `[3E]`, w_out `[E, E]`, optional
/// b_out `[E]`, optional keep `[B, S]`, optional NeoX cos/sin `[R, T]`
/// (n_rot = D, position rows) applied to q and k:
/// @f[ y = \mathrm{attention}\big(\mathrm{rope}(xW_q^\top + b_q),
///     \mathrm{rope}(xW_k^\top + b_k), xW_v^\top + b_v, \mathrm{keep}\big)
///     W_{out}^\top + b_{out},\qquad \mathrm{scale} = 1/\sqrt{D}. @f]
/// The block is planned as its parts: `qkv = x W_qkvᵀ + b_qkv` is one
/// `[B, S, 3E]` buffer, RoPE reads q and k out of it with row stride 3E, and
/// attention reads v out of it in place.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "tandem/attention.hpp"
#include "tandem/error.hpp"
#include "tandem/rope.hpp"
#include "tandem/rounding.hpp"
#include "tandem/shape.hpp"

namespace tandem {

/// Explicit parameters of an attention block.
struct AttentionBlockParams {
  ///@{
  /// x `[B, S, E]` with E = H·D: batch B, sequence length S, embedding width E, heads H.
  std::int64_t batch = 1, seq = 0, embed = 0, heads = 0;
  ///@}
  ///@{
  /// Which optional inputs the call takes: b_qkv `[3E]`, b_out `[E]`, a key-padding keep
  /// mask `[B, S]` (nonzero = attend), NeoX RoPE tables applied to q and k.
  bool qkv_bias = false, out_bias = false, key_padding = false, rope = false;
  ///@}
  ///@{
  std::int64_t table_rows = 0, table_stride = 0;  ///< R, T of the RoPE tables
  ///@}
  /// Where the attention of a bf16 or f16 block rounds besides its output (SPEC §10.2).
  Rounding rounding = kRoundingPytorch;
};

/// One attention block, validated, with the plans of its parts.
struct AttentionBlockPlan {
  ///@{
  /// x `[B, S, E]`, E = H·D: batch, sequence length, embedding width, heads, head width.
  std::int64_t B = 0, S = 0, E = 0, H = 0, D = 0;
  ///@}
  ///@{
  /// Which optional inputs the call takes (b_qkv, b_out, keep, cos/sin).
  bool qkv_bias = false, out_bias = false, key_padding = false, has_rope = false;
  ///@}
  AttentionPlan attention;  ///< q, k: contiguous after RoPE (row stride E) or in qkv (3E)
  RopePlan rope;            ///< valid only when has_rope: q/k out of qkv, row stride 3E

  /// Elements of x and of the output: B·S·E.
  [[nodiscard]] std::int64_t x_size() const { return B * S * E; }
  /// Elements of the qkv buffer `[B, S, 3E]`: B·S·3E.
  [[nodiscard]] std::int64_t qkv_size() const { return 3 * B * S * E; }
  /// Elements of each of the rotated q and k `[B, S, E]`: B·S·E with RoPE, 0 without.
  [[nodiscard]] std::int64_t rotated_size() const { return has_rope ? B * S * E : 0; }

  /// Validates by SPEC §8 — the only place that does.
  static AttentionBlockPlan make(const AttentionBlockParams& p);
  /// Shapes of x, w_qkv, w_out and the optional tensors (absent = not given).
  static AttentionBlockPlan from_shapes(const Shape& x, const Shape& w_qkv,
                                        const std::optional<Shape>& b_qkv, const Shape& w_out,
                                        const std::optional<Shape>& b_out,
                                        const std::optional<Shape>& keep,
                                        const std::optional<Shape>& cos,
                                        const std::optional<Shape>& sin, std::int64_t num_heads,
                                        const std::string& keep_name = "key_padding");
  /// Readable summary for messages and counterexamples.
  [[nodiscard]] std::string describe() const;
};

/// Read-only views of an attention block's inputs at storage type T (float,
/// bfloat16, float16; SPEC §10.1); optional ones are empty when absent.
template <class T = float>
struct AttentionBlockInputs {
  ///@{
  /// x `[B, S, E]`, w_qkv `[3E, E]` (rows q, k, v), b_qkv `[3E]`, w_out `[E, E]`, b_out `[E]`,
  /// contiguous, in T; an optional input is empty when absent.
  std::span<const T> x, w_qkv, b_qkv, w_out, b_out;
  ///@}
  /// keep `[B, S]` (nonzero = attend), float32 whatever T is, as every mask (SPEC §10.1).
  std::span<const float> keep;
  ///@{
  /// cos and sin `[R, T]` in T, as the tables of the rope op (SPEC §10.2).
  std::span<const T> cos, sin;
  ///@}
};

/// Throws Error unless the views fit the plan.
template <class T>
void check_views(const AttentionBlockPlan& plan, const AttentionBlockInputs<T>& in,
                 std::size_t out_size) {
  const std::int64_t E = plan.E;
  require_size(in.x.size(), plan.x_size(), "x");
  require_size(in.w_qkv.size(), 3 * E * E, "w_qkv");
  require_size(in.b_qkv.size(), plan.qkv_bias ? 3 * E : 0, "b_qkv");
  require_size(in.w_out.size(), E * E, "w_out");
  require_size(in.b_out.size(), plan.out_bias ? E : 0, "b_out");
  require_size(in.keep.size(), plan.key_padding ? plan.B * plan.S : 0, "keep");
  const std::int64_t table = plan.has_rope ? plan.rope.R * plan.rope.T : 0;
  require_size(in.cos.size(), table, "cos");
  require_size(in.sin.size(), table, "sin");
  require_size(out_size, plan.x_size(), "out");
}

/// The attention's inputs of a block (SPEC §7) out of its qkv buffer
/// `[B, S, 3E]` (q, then k, then v in each row), at storage type T:
///
///     q = rope(qkv[:, :, 0:E]),  k = rope(qkv[:, :, E:2E])   into q_rot, k_rot `[B, S, E]`
///                                                          (row stride E); without tables q
///                                                          and k are read in place (stride 3E)
///     v = qkv[:, :, 2E:3E]                                   in place (row stride 3E)
///     mask = keep `[B, S]`                                   (empty without key padding)
///
/// With tables, rope(plan.rope, src, dst) is called for q and then for k:
/// src the qkv columns (row stride 3E, plan.rope.src_extent() elements), dst
/// `[B, S, E]`; the caller's rope decides at what precision it rotates.
///
/// @param qkv   `[B, S, 3E]`, plan.qkv_size() elements
/// @param q_rot, k_rot plan.rotated_size() elements each (empty without RoPE)
/// @return views into qkv, q_rot and k_rot, which must outlive them
/// @throws tandem::Error (before calling rope) when a view does not fit
template <class T, class Rope>
AttentionInputs<T> block_attention_inputs(const AttentionBlockPlan& plan, std::span<const T> qkv,
                                          std::span<const float> keep, std::span<T> q_rot,
                                          std::span<T> k_rot, Rope&& rope) {
  const std::int64_t E = plan.E;
  const AttentionPlan& ap = plan.attention;
  require_size(qkv.size(), plan.qkv_size(), "qkv");
  require_size(q_rot.size(), plan.rotated_size(), "q_rot");
  require_size(k_rot.size(), plan.rotated_size(), "k_rot");
  AttentionInputs<T> ai;
  if (plan.has_rope) {
    const auto src = static_cast<std::size_t>(plan.rope.src_extent());
    rope(plan.rope, qkv.subspan(0, src), q_rot);
    rope(plan.rope, qkv.subspan(static_cast<std::size_t>(E), src), k_rot);
    ai.q = q_rot;
    ai.k = k_rot;
  } else {
    ai.q = qkv.subspan(0, static_cast<std::size_t>(ap.q.extent));
    ai.k = qkv.subspan(static_cast<std::size_t>(E), static_cast<std::size_t>(ap.k.extent));
  }
  ai.v = qkv.subspan(static_cast<std::size_t>(2 * E), static_cast<std::size_t>(ap.v.extent));
  ai.mask = keep;
  return ai;
}

// ---------------------------------------------------------------------------
// Implementation

inline AttentionBlockPlan AttentionBlockPlan::make(const AttentionBlockParams& p) {
  require(p.batch >= 1, "batch", p.batch, "must be >= 1");
  require(p.seq >= 1, "seq", p.seq, "must be >= 1");
  require(p.heads >= 1, "num_heads", p.heads, "must be >= 1");
  require(p.embed >= 1 && p.embed % p.heads == 0, "embed", p.embed,
          "must be a positive multiple of num_heads = " + std::to_string(p.heads));
  const std::int64_t E3 = checked_mul(p.embed, 3, "embed");
  checked_mul(E3, p.embed, "w_qkv");
  AttentionBlockPlan plan;
  plan.B = p.batch;
  plan.S = p.seq;
  plan.E = p.embed;
  plan.H = p.heads;
  plan.D = p.embed / p.heads;
  plan.qkv_bias = p.qkv_bias;
  plan.out_bias = p.out_bias;
  plan.key_padding = p.key_padding;
  plan.has_rope = p.rope;

  AttentionParams a;
  a.B = p.batch;
  a.Sq = a.Sk = p.seq;
  a.H = a.Hkv = p.heads;
  a.D = a.Dv = plan.D;
  a.layout = Layout::bshd;
  a.mask = p.key_padding ? MaskKind::key_padding : MaskKind::none;
  a.rounding = p.rounding;
  a.q_row_stride = a.k_row_stride = p.rope ? p.embed : E3;
  a.v_row_stride = E3;
  plan.attention = AttentionPlan::make(a);
  if (p.rope) {
    RopeParams r;
    r.batch = p.batch;
    r.seq = p.seq;
    r.width = p.embed;
    r.head_dim = plan.D;
    r.n_rot = plan.D;
    r.style = RopeStyle::neox;
    r.table_rows = p.table_rows;
    r.table_stride = p.table_stride;
    r.rows = TableRows::position;
    r.src_row_stride = E3;
    plan.rope = RopePlan::make(r);
  }
  return plan;
}

inline AttentionBlockPlan AttentionBlockPlan::from_shapes(
    const Shape& x, const Shape& w_qkv, const std::optional<Shape>& b_qkv, const Shape& w_out,
    const std::optional<Shape>& b_out, const std::optional<Shape>& keep,
    const std::optional<Shape>& cos, const std::optional<Shape>& sin, std::int64_t num_heads,
    const std::string& keep_name) {
  require(x.size() == 3, "x.shape", to_string(x), "must be [B, S, E]");
  element_count(x, "x.shape");
  const std::int64_t B = x[0], S = x[1], E = x[2];
  checked_mul(E, 3, "x.shape");  // 3E below must not overflow (x may be empty)
  require(w_qkv == Shape{3 * E, E}, "w_qkv.shape", to_string(w_qkv),
          "must be [3E, E] = " + to_string({3 * E, E}));
  require(!b_qkv || *b_qkv == Shape{3 * E}, "b_qkv.shape", b_qkv ? to_string(*b_qkv) : "",
          "must be [3E] = " + to_string({3 * E}));
  require(w_out == Shape{E, E}, "w_out.shape", to_string(w_out),
          "must be [E, E] = " + to_string({E, E}));
  require(!b_out || *b_out == Shape{E}, "b_out.shape", b_out ? to_string(*b_out) : "",
          "must be [E] = " + to_string({E}));
  require(!keep || *keep == Shape{B, S}, keep_name + ".shape", keep ? to_string(*keep) : "",
          "must be [B, S] = " + to_string({B, S}) + " (a keep mask)");
  require(cos.has_value() == sin.has_value(), cos ? "sin" : "cos", std::string("(absent)"),
          "must be given with the other RoPE table");
  AttentionBlockParams p;
  p.batch = B;
  p.seq = S;
  p.embed = E;
  p.heads = num_heads;
  p.qkv_bias = b_qkv.has_value();
  p.out_bias = b_out.has_value();
  p.key_padding = keep.has_value();
  p.rope = cos.has_value();
  if (cos) {
    require(cos->size() == 2, "cos.shape", to_string(*cos), "must be [R, T]");
    require(*sin == *cos, "sin.shape", to_string(*sin),
            "must equal cos.shape = " + to_string(*cos));
    p.table_rows = (*cos)[0];
    p.table_stride = (*cos)[1];
    require(p.table_stride >= 1, "cos.shape", to_string(*cos), "must have T >= 1");
  }
  return make(p);
}

inline std::string AttentionBlockPlan::describe() const {
  return "B=" + std::to_string(B) + " S=" + std::to_string(S) + " E=" + std::to_string(E) +
         " H=" + std::to_string(H) + (qkv_bias ? " b_qkv" : "") + (out_bias ? " b_out" : "") +
         (key_padding ? " key_padding" : "") + (has_rope ? " rope" : "");
}

}  // namespace tandem
