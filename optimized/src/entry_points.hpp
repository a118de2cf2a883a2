// SPDX-License-Identifier: Apache-2.0
/// @file entry_points.hpp
/// @brief The entry points of the optimized kernels, bound to
///        tandem::Backend by backend.cpp and composed by the attention block:
///        the backend's one validation and thread-count layer.
///
/// Each entry point validates its views against the plan (the check_*
/// helpers of the plan headers) before it writes anything, resolves the thread count of the call
/// once (threads_of), then dispatches once to the best Highway target. Outer loops run on that many
/// OpenMP threads, and no result depends on their number: bitwise identical
/// for any thread count.
#pragma once

#include <omp.h>

#include <cstdint>
#include <span>
#include <string>

#include "tandem/attention.hpp"
#include "tandem/attention_block.hpp"
#include "tandem/axial_rope.hpp"
#include "tandem/flex_plan.hpp"
#include "tandem/optimized/options.hpp"
#include "tandem/rope.hpp"
#include "tandem/swiglu.hpp"

namespace tandem::optimized::detail {

/// The OpenMP threads of one call: Options::threads, or all of OpenMP's
/// threads (omp_get_max_threads at call time) when it is 0.
inline int threads_of(const Options& options) {
  return options.threads > 0 ? options.threads : omp_get_max_threads();
}

/// Throws Error naming `rounding` unless the optimized backend implements
/// the plan's profile (SPEC §10.2): those whose only rounding points inside
/// the attention are the operands of its products, `pytorch` and `exact`;
/// `ggml`'s q rounded to K's type and its output accumulator in T are not.
/// Called before anything is read or written.
inline void require_rounding(const AttentionPlan& plan) {
  const Rounding& r = plan.rounding;
  require(!r.q_as_k && !r.output_accumulator, "rounding", std::string(r.name),
          "is not implemented by the optimized backend (it implements pytorch and exact)");
}

/// out = attention(q, k, v, mask).
void attention_forward(const AttentionPlan& plan, const AttentionInputs<float>& in,
                       std::span<float> out, const Options& options);
/// out as attention_forward, and lse the log-sum-exp per (b, h, i) row
/// ([B, H, Sq], contiguous), −inf for a row with no visible key.
void attention_forward_lse(const AttentionPlan& plan, const AttentionInputs<float>& in,
                           std::span<float> out, std::span<float> lse, const Options& options);
/// attention_forward and attention_forward_lse for storage type T = bfloat16
/// or float16 (SPEC §10.2, profiles `pytorch` and `exact`; `ggml` is an
/// Error naming `rounding`): out in T, lse in float.
template <class T>
void attention_forward_stored(const AttentionPlan& plan, const AttentionInputs<T>& in,
                              std::span<T> out, const Options& options);
template <class T>
void attention_forward_lse_stored(const AttentionPlan& plan, const AttentionInputs<T>& in,
                                  std::span<T> out, std::span<float> lse, const Options& options);
/// attention_forward_lse_stored on inputs already validated and widened:
/// `wide` holds in's q, k, v and sinks as float32 (exact, SPEC §10.1) and
/// its other views as given, so that a caller holding such copies (a
/// backward without a saved state) does not widen them again. The same bits
/// as attention_forward_lse_stored(plan, in, ...); nothing is validated.
template <class T>
void attention_forward_lse_widened(const AttentionPlan& plan, const AttentionInputs<T>& in,
                                   const AttentionInputs<float>& wide, std::span<T> out,
                                   std::span<float> lse, const Options& options);
/// The forward of a decode step with K and V read as stored (bf16, f16; SPEC
/// §10.2): out = RN_T(attention), lse (float, [B, H, Sq]; empty: not
/// written) as attention_forward_lse. Validates the views first; returns
/// false, writing nothing, when the call is not decode-shaped (a sequence
/// with more queries than one task's rows, attention_decode_stored.cpp),
/// for the caller to take another path.
template <class T>
bool attention_decode_stored(const AttentionPlan& plan, const AttentionInputs<T>& in,
                             std::span<T> out, std::span<float> lse, const Options& options);
/// out = RN_T(attention) with k and v read as int8 or e4m3 codes times their
/// scales (SPEC §10.4), T = float, bfloat16 or float16; any shape (decode
/// steps run fastest).
template <class T>
void attention_forward_quantized(const AttentionPlan& plan, const AttentionInputs<T>& in,
                                 const QuantizedKv& kv, std::span<T> out, const Options& options);
/// The codes and scales of k and v (SPEC §10.4's definition, bitwise), T =
/// float, bfloat16 or float16.
template <class T>
void quantize_kv(const AttentionPlan& plan, std::span<const T> k, std::span<const T> v,
                 const QuantizedKvOut& out, const Options& options);

/// Any non-empty subset of dq, dk, dv, dsinks, dbias (an empty view is not computed); with
/// `saved` (the forward's out and lse) P and rowsum(dO ∘ O) come from it
/// instead of a forward run over each query block. T: float, bfloat16 or
/// float16 (SPEC §10.2: the pytorch and exact profiles; ggml's is an Error).
template <class T>
void attention_backward(const AttentionPlan& plan, const AttentionInputs<T>& in,
                        std::span<const T> dout, const AttentionGrads<T>& grads,
                        const AttentionSaved<T>* saved, const Options& options);
/// One gradient alone.
enum class Gradient { dq, dk, dv };
/// dq, dk or dv alone (`which`) into `grad`, as attention_backward.
template <class T>
void attention_backward_one(const AttentionPlan& plan, const AttentionInputs<T>& in,
                            std::span<const T> dout, Gradient which, std::span<T> grad,
                            const Options& options);

/// FlexAttention's forward (SPEC §13.4): out `[B,H,Sq,Dv]` and, when not
/// empty, lse `[B,H,Sq]` (float for every T), T = float, bfloat16 or float16
/// (q, k, v and the captured real tensors read into float, out rounded to T
/// once). Validates the views first (FlexPlan::check_inputs).
template <class T>
void flex_forward(const FlexPlan& plan, const FlexInputs<T>& in, std::span<T> out,
                  std::span<stat_t<T>> lse, const Options& options);
/// FlexAttention's backward (SPEC §13.4): any subset of dq, dk, dv and the
/// score_mod's real tensors' gradients (an empty view is not computed) from
/// dout `[B,H,Sq,Dv]`, recomputing the forward; deterministic for any
/// thread count. Validates the views first (FlexPlan::check_grads).
template <class T>
void flex_backward(const FlexPlan& plan, const FlexInputs<T>& in, std::span<const T> dout,
                   const FlexGrads<T>& grads, const Options& options);

/// out = rope(x) (SPEC §4); x read through plan.src, out contiguous (plan.out).
/// T is float, bfloat16 or float16 (x, the tables and out; SPEC §10.2).
template <class T>
void rope_forward(const RopePlan& plan, std::span<const T> x, const RopeTables<T>& tables,
                  std::span<T> out, const Options& options);
/// dx = rope_backward(dy), the transpose of rope_forward.
template <class T>
void rope_backward(const RopePlan& plan, std::span<const T> dy, const RopeTables<T>& tables,
                   std::span<T> dx, const Options& options);
/// q_dst, k_dst = rope(q), rope(k) (or the backward when `transpose`), in one
/// pass over the tokens: both validated first, then each token's table row
/// found once for the heads of q and of k.
template <class T>
void rope_qk(const RopeQkPlan& plan, std::span<const T> q, std::span<const T> k,
             const RopeTables<T>& tables, std::span<T> q_dst, std::span<T> k_dst, bool transpose,
             const Options& options);

/// out `[B', S, W]` = axial_rope(x) (SPEC §5); T float, bfloat16 or float16.
template <class T>
void axial_rope_forward(const AxialRopePlan& plan, std::span<const T> x, std::span<T> out,
                        const Options& options);
/// dx `[B', S, W]` = axial_rope_backward(dy), the transpose of axial_rope_forward.
template <class T>
void axial_rope_backward(const AxialRopePlan& plan, std::span<const T> dy, std::span<T> dx,
                         const Options& options);

/// out `[rows, n]` = silu(g)·u for x `[rows, 2n]` (SPEC §6); T float,
/// bfloat16 or float16.
template <class T>
void swiglu_forward(const SwigluPlan& plan, std::span<const T> x, std::span<T> out,
                    const Options& options);
/// dx `[rows, 2n]` from x `[rows, 2n]` and dy `[rows, n]` (SPEC §6).
template <class T>
void swiglu_backward(const SwigluPlan& plan, std::span<const T> x, std::span<const T> dy,
                     std::span<T> dx, const Options& options);

/// out `[B, S, E]` = the attention block of SPEC §7; T float, bfloat16 or
/// float16, rounding to T where SPEC §10.2 says.
template <class T>
void attention_block(const AttentionBlockPlan& plan, const AttentionBlockInputs<T>& in,
                     std::span<T> out, const Options& options);

/// The dense projection `c[M, N] = RN_T(a[M, K] · w[N, K]ᵀ (+ bias[N]))` of
/// the attention block (rows of w are output features, as PyTorch's Linear),
/// summed in float32, on `threads` threads; T float, bfloat16 or float16.
/// `bias` is empty or has N elements. Every c element is computed by one
/// thread in a fixed order, so the result does not depend on `threads`. Not
/// an entry point: sizes are trusted (the block validates them).
template <class T>
void project(const T* a, const T* w, std::span<const T> bias, T* c, std::int64_t M, std::int64_t N,
             std::int64_t K, int threads);

}  // namespace tandem::optimized::detail
