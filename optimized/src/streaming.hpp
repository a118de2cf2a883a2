// SPDX-License-Identifier: Apache-2.0
/// @file streaming.hpp
/// @brief Internal entry points of the optimized streaming kernels (RoPE,
///        axial RoPE, SwiGLU), the projections and the attention block.
///
/// Every function here validates its views against the plan before it writes
/// anything, then dispatches once to the best Highway target and runs its
/// outer loop (rows) on `threads` OpenMP threads with a static schedule. No
/// value is ever reduced across threads, so results are bitwise identical
/// for any thread count.
#pragma once

#include <cstdint>
#include <span>

#include "tandem/attention_block.hpp"
#include "tandem/axial_rope.hpp"
#include "tandem/rope.hpp"
#include "tandem/swiglu.hpp"

namespace tandem::optimized::detail {

/// out = rope(x) (SPEC §4); x read through plan.src, out contiguous (plan.out).
void rope_forward(const RopePlan& plan, std::span<const float> x, const RopeTables<float>& tables,
                  std::span<float> out, int threads);
/// dx = rope_backward(dy), the transpose of rope_forward.
void rope_backward(const RopePlan& plan, std::span<const float> dy, const RopeTables<float>& tables,
                   std::span<float> dx, int threads);
/// q_dst, k_dst = rope(q), rope(k) (or the backward when `transpose`), in one
/// pass over the tokens: both validated first, then each token's table row
/// found once for the heads of q and of k.
void rope_qk(const RopeQkPlan& plan, std::span<const float> q, std::span<const float> k,
             const RopeTables<float>& tables, std::span<float> q_dst, std::span<float> k_dst,
             bool transpose, int threads);

/// out `[B', S, W]` = axial_rope(x) (SPEC §5).
void axial_rope_forward(const AxialRopePlan& plan, std::span<const float> x, std::span<float> out,
                        int threads);
/// dx `[B', S, W]` = axial_rope_backward(dy), the transpose of axial_rope_forward.
void axial_rope_backward(const AxialRopePlan& plan, std::span<const float> dy, std::span<float> dx,
                         int threads);

/// out `[rows, n]` = silu(g)·u for x `[rows, 2n]` (SPEC §6).
void swiglu_forward(const SwigluPlan& plan, std::span<const float> x, std::span<float> out,
                    int threads);
/// dx `[rows, 2n]` from x `[rows, 2n]` and dy `[rows, n]` (SPEC §6).
void swiglu_backward(const SwigluPlan& plan, std::span<const float> x, std::span<const float> dy,
                     std::span<float> dx, int threads);

/// The dense projection `c[M, N] = a[M, K] · w[N, K]ᵀ (+ bias[N])` of the
/// attention block (rows of w are output features, as PyTorch's Linear).
/// `bias` is empty or has N elements. Every c element is computed by one
/// thread in a fixed order, so the result does not depend on `threads`.
/// Sizes are trusted (the block validates them).
void project(const float* a, const float* w, std::span<const float> bias, float* c, std::int64_t M,
             std::int64_t N, std::int64_t K, int threads);

/// out `[B, S, E]` = the attention block of SPEC §7.
void attention_block(const AttentionBlockPlan& plan, const AttentionBlockInputs& in,
                     std::span<float> out, int threads);

}  // namespace tandem::optimized::detail
