// SPDX-License-Identifier: Apache-2.0
/// @file kernels.hpp
/// @brief The kernel entry points, each signature written once, at element
///        type T: what every implementation binds and every client calls.
///
/// tandem::Backend is Kernels<float> with a name and the bf16 and f16 kernels;
/// the reference also binds them at double and with float sums
/// (reference/kernels.hpp). Every entry takes the plan first, then the input
/// views, then the output views, and validates the views against the plan
/// (the check_* functions of each plan header) before it writes anything.
/// entry_points() names them, so that tests and tools iterate over them
/// without listing them again (SPEC, general rules; validation: SPEC §8).
#pragma once

#include <functional>
#include <span>
#include <string_view>
#include <tuple>

#include "tandem/attention.hpp"
#include "tandem/attention_block.hpp"
#include "tandem/axial_rope.hpp"
#include "tandem/flex_plan.hpp"
#include "tandem/rope.hpp"
#include "tandem/swiglu.hpp"

namespace tandem {

/// The kernel entry points of one implementation at element type T: float
/// (every backend), double and complex (the reference), and the
/// low-precision storage types bfloat16 and float16 (SPEC §10), whose
/// statistics (lse) are float32: stat_t<T>.
template <class T>
struct Kernels {
  /// out `[B,Sq,H,Dv]` (layout of q, contiguous) = attention(q, k, v, mask), with the
  /// sinks, ALiBi, packed sequences or paged cache the plan takes (SPEC §2.7–2.10;
  /// a backend that does not implement one throws tandem::Error).
  std::function<void(const AttentionPlan&, const AttentionInputs<T>&, std::span<T> out)>
      attention_forward;
  /// dq, dk, dv (contiguous, shapes of q, k, v), dsinks `[H]` and dbias
  /// (the bias's `[Bb,Hb,Sq,Sk]`, summed over its broadcast dims) from dout
  /// (shape of out) in one pass: any non-empty subset of them; an empty view
  /// is not computed and never written (SPEC §3; check_grads; a backend that
  /// does not implement dsinks or dbias throws tandem::Error).
  std::function<void(const AttentionPlan&, const AttentionInputs<T>&, std::span<const T> dout,
                     const AttentionGrads<T>&)>
      attention_backward;
  /// out as attention_forward, and lse `[B,H,Sq]` (SPEC §2.5, AttentionSaved): the
  /// forward of a training step, which keeps what its backward needs.
  std::function<void(const AttentionPlan&, const AttentionInputs<T>&, std::span<T> out,
                     std::span<stat_t<T>> lse)>
      attention_forward_lse;
  /// The gradients (any non-empty subset) as attention_backward, from the
  /// forward's saved out and lse: `p_ij = exp(s_ij − lse_i)` and
  /// `rowsum(dO ∘ O)` without running the forward again.
  std::function<void(const AttentionPlan&, const AttentionInputs<T>&, const AttentionSaved<T>&,
                     std::span<const T> dout, const AttentionGrads<T>&)>
      attention_backward_saved;
  /// One gradient alone (SPEC §3.2), contiguous, from dout (shape of out).
  using OneGradient = std::function<void(const AttentionPlan&, const AttentionInputs<T>&,
                                         std::span<const T> dout, std::span<T> grad)>;
  OneGradient attention_backward_dq;  ///< dq `[B,Sq,H,D]` alone
  OneGradient attention_backward_dk;  ///< dk `[B,Sk,Hkv,D]` alone
  OneGradient attention_backward_dv;  ///< dv `[B,Sk,Hkv,Dv]` alone

  /// out `[B,Sq,H,Dv]` = attention(q, k, v) for a plan with kv_cache int8 or e4m3, k and v read
  /// from their codes and scales (SPEC §10.4; `in.k`, `in.v` empty): decode and paged decode
  /// read the codes and never write a dequantized copy. Forward only.
  std::function<void(const AttentionPlan&, const AttentionInputs<T>&, const QuantizedKv&,
                     std::span<T> out)>
      attention_forward_quantized;
  /// The codes and scales of k `[B,Sk,Hkv,D]` and v `[B,Sk,Hkv,Dv]` (through plan.k and plan.v;
  /// a paged plan's whole cache) for the plan's kv_cache int8 or e4m3 (SPEC §10.4).
  std::function<void(const AttentionPlan&, std::span<const T> k, std::span<const T> v,
                     const QuantizedKvOut&)>
      quantize_kv;

  /// FlexAttention (SPEC §13.4): out `[B,H,Sq,Dv]` and, when not empty, lse `[B,H,Sq]`, from q,
  /// k, v (contiguous `bhsd`), the plan's score_mod and mask_mod with their captured tensors,
  /// and its block mask.
  std::function<void(const FlexPlan&, const FlexInputs<T>&, std::span<T> out,
                     std::span<stat_t<T>> lse)>
      flex_forward;
  /// dq, dk, dv and the gradients of the score_mod's real tensors (any subset; an empty view is
  /// not computed) from dout `[B,H,Sq,Dv]` (SPEC §13.4), recomputing the forward.
  std::function<void(const FlexPlan&, const FlexInputs<T>&, std::span<const T> dout,
                     const FlexGrads<T>&)>
      flex_backward;

  /// RoPE of one tensor (SPEC §4): dst contiguous, in the layout of src.
  using Rope = std::function<void(const RopePlan&, std::span<const T> src, const RopeTables<T>&,
                                  std::span<T> dst)>;
  Rope rope_forward;   ///< out = rope(x)
  Rope rope_backward;  ///< dx = rope_backward(dy), the transpose
  /// RoPE of q and k (different head counts) with the same tables and
  /// positions, in one call (SPEC §4.7).
  using RopeQk =
      std::function<void(const RopeQkPlan&, std::span<const T> q_src, std::span<const T> k_src,
                         const RopeTables<T>&, std::span<T> q_dst, std::span<T> k_dst)>;
  RopeQk rope_forward_qk;   ///< q_out, k_out = rope(q), rope(k)
  RopeQk rope_backward_qk;  ///< dq, dk = rope_backward(dq_out), rope_backward(dk_out)

  /// Axial 2-D RoPE (SPEC §5): src and dst `[B', S, W]`, dst contiguous.
  using AxialRope =
      std::function<void(const AxialRopePlan&, std::span<const T> src, std::span<T> dst)>;
  AxialRope axial_rope_forward;   ///< out = axial_rope(x)
  AxialRope axial_rope_backward;  ///< dx = axial_rope_backward(dy), the transpose

  /// out `[rows, n]` = silu(g)·u for x `[rows, 2n]` (SPEC §6).
  std::function<void(const SwigluPlan&, std::span<const T> x, std::span<T> out)> swiglu_forward;
  /// dx `[rows, 2n]` from x `[rows, 2n]` and dy `[rows, n]`.
  std::function<void(const SwigluPlan&, std::span<const T> x, std::span<const T> dy,
                     std::span<T> dx)>
      swiglu_backward;

  /// out `[B,S,E]` = the attention block of SPEC §7, rounding to T where SPEC §10.2 says.
  std::function<void(const AttentionBlockPlan&, const AttentionBlockInputs<T>&, std::span<T> out)>
      attention_block;
};

/// One entry point of a kernel struct K: its name and the member holding it.
template <class K, class Fn>
struct EntryPoint {
  std::string_view name;  ///< the member's name, "attention_forward"
  Fn K::*member;          ///< the member, &K::attention_forward
};

/// Every entry point of Kernels<T>, in the order declared there; the names
/// are the members' names (test_entry_points checks that it names each
/// member once, in order).
template <class T>
constexpr auto entry_points() {
  using K = Kernels<T>;
  const auto e = []<class Fn>(std::string_view name, Fn K::*member) {
    return EntryPoint<K, Fn>{name, member};
  };
  return std::tuple{e("attention_forward", &K::attention_forward),
                    e("attention_backward", &K::attention_backward),
                    e("attention_forward_lse", &K::attention_forward_lse),
                    e("attention_backward_saved", &K::attention_backward_saved),
                    e("attention_backward_dq", &K::attention_backward_dq),
                    e("attention_backward_dk", &K::attention_backward_dk),
                    e("attention_backward_dv", &K::attention_backward_dv),
                    e("attention_forward_quantized", &K::attention_forward_quantized),
                    e("quantize_kv", &K::quantize_kv),
                    e("flex_forward", &K::flex_forward),
                    e("flex_backward", &K::flex_backward),
                    e("rope_forward", &K::rope_forward),
                    e("rope_backward", &K::rope_backward),
                    e("rope_forward_qk", &K::rope_forward_qk),
                    e("rope_backward_qk", &K::rope_backward_qk),
                    e("axial_rope_forward", &K::axial_rope_forward),
                    e("axial_rope_backward", &K::axial_rope_backward),
                    e("swiglu_forward", &K::swiglu_forward),
                    e("swiglu_backward", &K::swiglu_backward),
                    e("attention_block", &K::attention_block)};
}

///@{
/// Calls `visit(name, entry)` for every entry point of `kernels`, in the
/// order of entry_points(); `entry` is the std::function member itself (so
/// a visitor may test, call, wrap or replace it).
template <class T, class Visit>
void for_each_entry_point(const Kernels<T>& kernels, Visit&& visit) {
  std::apply([&](const auto&... e) { (visit(e.name, kernels.*e.member), ...); }, entry_points<T>());
}
template <class T, class Visit>
void for_each_entry_point(Kernels<T>& kernels, Visit&& visit) {
  std::apply([&](const auto&... e) { (visit(e.name, kernels.*e.member), ...); }, entry_points<T>());
}
///@}

}  // namespace tandem
