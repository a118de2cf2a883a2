// SPDX-License-Identifier: Apache-2.0
/// @file attention.hpp
/// @brief Internal entry points of the optimized attention kernels, bound to
///        tandem::Backend by backend.cpp and composed by the attention block.
#pragma once

#include <span>

#include "tandem/attention.hpp"

namespace tandem::optimized::detail {
// out = attention(q, k, v, mask); when lse is non-empty it receives the log-sum-exp per (b, h, i)
// row ([B, H, Sq], contiguous), −inf for a row with no visible key.
void attention_forward(const AttentionPlan&, const AttentionInputs<float>&, std::span<float> out,
                       std::span<float> lse, int threads);
// any subset of dq, dk, dv (empty span = not wanted, at least one given);
// with `saved` (the forward's out and lse, checked) P and rowsum(dO ∘ O) come
// from it instead of a forward run over each query block.
void attention_backward(const AttentionPlan&, const AttentionInputs<float>&,
                        std::span<const float> dout, const AttentionGrads<float>&,
                        const AttentionSaved<float>* saved, int threads);
}  // namespace tandem::optimized::detail
