// SPDX-License-Identifier: Apache-2.0
/// @file reference/attention_block.hpp
/// @brief Reference fused attention block (BERT-shaped, SPEC §7): the
///        composition of the reference projections, RoPE and attention.
#pragma once

#include <span>

#include "tandem/attention_block.hpp"

namespace tandem::reference {

/// The attention block of SPEC §7, in float32 with every intermediate in
/// double. x `[B, S, E]`, E = H·D, out `[B, S, E]`:
///
///     qkv[b,s,o] = b_qkv[o] + Σ_e x[b,s,e]·w_qkv[o,e]        o < 3E  (q, then k, then v)
///     q = rope(qkv[:, :, 0:E]),  k = rope(qkv[:, :, E:2E])    (plan.rope, row stride 3E;
///                                                              skipped without tables)
///     v = qkv[:, :, 2E:3E]                                     (read in place, row stride 3E)
///     a = attention(q, k, v, keep)                             (plan.attention, scale 1/sqrt(D))
///     out[b,s,o] = b_out[o] + Σ_e a[b,s,e]·w_out[o,e]         o < E
///
/// Absent biases count as zero; the keep mask `[B, S]` (1 = attend) is the
/// key-padding mask of the attention.
///
/// @param plan a validated AttentionBlockPlan
/// @param in   the input views; optional ones empty when the plan has none
/// @param out  `[B, S, E]`
/// @throws tandem::Error (before writing anything) when a view does not fit
void attention_block(const AttentionBlockPlan& plan, const AttentionBlockInputs& in,
                     std::span<float> out);

}  // namespace tandem::reference
