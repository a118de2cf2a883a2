// SPDX-License-Identifier: Apache-2.0
/// @file reference/attention_block.hpp
/// @brief Reference fused attention block (BERT-shaped, SPEC §7): the
///        composition of the reference projections, RoPE and attention, at
///        storage type T, rounding where SPEC §10.2 says.
#pragma once

#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "tandem/attention_block.hpp"
#include "tandem/reference/attention.hpp"
#include "tandem/reference/rope.hpp"
#include "tandem/reference/scalar.hpp"

namespace tandem::reference {

/// The type the reference block keeps its intermediates (qkv, q, k, the
/// attention's output) in: T itself for bf16 and f16, whose block stores
/// them as a model in T does (SPEC §10.2), and Acc for float and double,
/// which round nothing in between.
template <class T, class Acc>
using block_intermediate_t = std::conditional_t<is_low_precision_v<T>, T, Acc>;

/// The attention block of SPEC §7 at storage type T (float, double, bfloat16,
/// float16), every sum in Acc. x `[B, S, E]`, E = H·D, out `[B, S, E]`, with
/// M = block_intermediate_t<T, Acc> (T for bf16 and f16, Acc otherwise):
///
///     qkv[b,s,o] = RN_M(b_qkv[o] + Σ_e x[b,s,e]·w_qkv[o,e])   o < 3E  (q, then k, then v)
///     q = rope(qkv[:, :, 0:E]),  k = rope(qkv[:, :, E:2E])    (plan.rope at M: RN_M of each
///                                                              element; skipped without tables)
///     v = qkv[:, :, 2E:3E]                                     (read in place, row stride 3E)
///     a = attention(q, k, v, keep)                             (plan.attention at M, its
///                                                              rounding profile; a in M)
///     out[b,s,o] = RN_T(b_out[o] + Σ_e a[b,s,e]·w_out[o,e])   o < E
///
/// Absent biases count as zero; the keep mask `[B, S]` (1 = attend, float32)
/// is the key-padding mask of the attention. For bf16 and f16 these four
/// roundings to T (qkv, the rotated q and k, a, out) and the attention's own
/// are the only ones (SPEC §10.2, "The attention block").
///
/// @param plan a validated AttentionBlockPlan
/// @param in   the input views; optional ones empty when the plan has none
/// @param out  `[B, S, E]`
/// @throws tandem::Error (before writing anything) when a view does not fit
template <class T, class Acc = accumulator_t<T>>
void attention_block(const AttentionBlockPlan& plan, const AttentionBlockInputs<T>& in,
                     std::span<T> out) {
  using M = block_intermediate_t<T, Acc>;
  check_views(plan, in, out.size());
  const std::int64_t B = plan.B, S = plan.S, E = plan.E;

  // qkv[b,s,o] = RN_M(b_qkv[o] + Σ_e x[b,s,e]·w_qkv[o,e])   for o < 3E (rows q, k, v of w_qkv)
  std::vector<M> qkv(static_cast<std::size_t>(plan.qkv_size()));
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t s = 0; s < S; ++s) {
      for (std::int64_t o = 0; o < 3 * E; ++o) {
        Acc acc = plan.qkv_bias ? static_cast<Acc>(in.b_qkv[o]) : Acc(0);
        for (std::int64_t e = 0; e < E; ++e) {
          acc +=
              static_cast<Acc>(in.x[(b * S + s) * E + e]) * static_cast<Acc>(in.w_qkv[o * E + e]);
        }
        qkv[(b * S + s) * 3 * E + o] = static_cast<M>(acc);
      }
    }
  }
  // q = rope(qkv[:, :, 0:E]), k = rope(qkv[:, :, E:2E]): NeoX, n_rot = D, position rows, into
  // contiguous [B, S, E] (without tables read in place); v = qkv[:, :, 2E:3E] in place.
  std::vector<M> q_rot(static_cast<std::size_t>(plan.rotated_size()));
  std::vector<M> k_rot(q_rot.size());
  const std::vector<M> cos(in.cos.begin(), in.cos.end());  // exact: T is M or narrower
  const std::vector<M> sin(in.sin.begin(), in.sin.end());
  const RopeTables<M> tables{cos, sin};
  const AttentionInputs<M> att_in = block_attention_inputs<M>(
      plan, std::span<const M>(qkv), in.keep, std::span<M>(q_rot), std::span<M>(k_rot),
      [&](const RopePlan& rp, std::span<const M> src, std::span<M> dst) {
        rope_forward<M, Acc>(rp, src, tables, dst);
      });

  // a = attention(q, k, v, keep), a [B, S, H, D] = [B, S, E]
  std::vector<M> a(static_cast<std::size_t>(B * S * E));
  attention_forward<M, Acc>(plan.attention, att_in, std::span<M>(a));

  // out[b,s,o] = RN_T(b_out[o] + Σ_e a[b,s,e]·w_out[o,e])   for o < E
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t s = 0; s < S; ++s) {
      for (std::int64_t o = 0; o < E; ++o) {
        Acc acc = plan.out_bias ? static_cast<Acc>(in.b_out[o]) : Acc(0);
        for (std::int64_t e = 0; e < E; ++e) {
          acc += static_cast<Acc>(a[(b * S + s) * E + e]) * static_cast<Acc>(in.w_out[o * E + e]);
        }
        out[(b * S + s) * E + o] = static_cast<T>(acc);
      }
    }
  }
}

}  // namespace tandem::reference
