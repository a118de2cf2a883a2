// SPDX-License-Identifier: Apache-2.0
/// @file backend.hpp
/// @brief A backend: every tandem kernel entry point as one value.
///
/// The reference, the optimized backend, the deliberately broken test
/// fixtures and a user's own kernels are all Backends, so the property suite,
/// the unit tests, the benchmarks and the `tandem` command iterate over them
/// alike. Every entry takes the plan first, then the input views, then the
/// output views, and validates the views against the plan (the check_*
/// functions of each plan header) before it writes anything.
#pragma once

#include <functional>
#include <span>
#include <string>

#include "tandem/attention.hpp"
#include "tandem/attention_block.hpp"
#include "tandem/axial_rope.hpp"
#include "tandem/rope.hpp"
#include "tandem/swiglu.hpp"

namespace tandem {

/// The kernel entry points of one implementation, all in float32.
struct Backend {
  /// Short name used in reports and test names ("reference", "optimized").
  std::string name;

  /// out `[B,Sq,H,Dv]` (layout of q, contiguous) = attention(q, k, v, mask), with the
  /// sinks, ALiBi, packed sequences or paged cache the plan takes (SPEC §2.7–2.10;
  /// a backend that does not implement one throws tandem::Error).
  std::function<void(const AttentionPlan&, const AttentionInputs<float>&, std::span<float> out)>
      attention_forward;
  /// dq, dk, dv (contiguous, shapes of q, k, v) and dsinks `[H]` from dout
  /// (shape of out) in one pass: any non-empty subset of them; an empty view
  /// is not computed and never written (check_grads; a backend that does not
  /// implement dsinks throws tandem::Error).
  std::function<void(const AttentionPlan&, const AttentionInputs<float>&,
                     std::span<const float> dout, const AttentionGrads<float>&)>
      attention_backward;
  /// out as attention_forward, and lse `[B,H,Sq]` (see AttentionSaved): the
  /// forward of a training step, which keeps what its backward needs.
  std::function<void(const AttentionPlan&, const AttentionInputs<float>&, std::span<float> out,
                     std::span<float> lse)>
      attention_forward_lse;
  /// The gradients (any non-empty subset) as attention_backward, from the
  /// forward's saved out and lse: `p_ij = exp(s_ij − lse_i)` and
  /// `rowsum(dO ∘ O)` without running the forward again.
  std::function<void(const AttentionPlan&, const AttentionInputs<float>&,
                     const AttentionSaved<float>&, std::span<const float> dout,
                     const AttentionGrads<float>&)>
      attention_backward_saved;
  ///@{
  /// dq alone, dk alone, dv alone.
  std::function<void(const AttentionPlan&, const AttentionInputs<float>&,
                     std::span<const float> dout, std::span<float> grad)>
      attention_backward_dq, attention_backward_dk, attention_backward_dv;
  ///@}

  ///@{
  /// out = rope(x); dx = rope_backward(dy) (the transpose); contiguous, the layout of the source.
  std::function<void(const RopePlan&, std::span<const float> src, const RopeTables<float>&,
                     std::span<float> dst)>
      rope_forward, rope_backward;
  ///@}
  ///@{
  /// q_out, k_out = rope(q), rope(k); dq, dk = rope_backward(dq_out), rope_backward(dk_out):
  /// q and k (different head counts) with the same tables and positions, in one call.
  std::function<void(const RopeQkPlan&, std::span<const float> q_src, std::span<const float> k_src,
                     const RopeTables<float>&, std::span<float> q_dst, std::span<float> k_dst)>
      rope_forward_qk, rope_backward_qk;
  ///@}

  ///@{
  /// out = axial_rope(x); dx = axial_rope_backward(dy) (the transpose).
  std::function<void(const AxialRopePlan&, std::span<const float> src, std::span<float> dst)>
      axial_rope_forward, axial_rope_backward;
  ///@}

  /// out `[rows, n]` = silu(g)·u for x `[rows, 2n]`.
  std::function<void(const SwigluPlan&, std::span<const float> x, std::span<float> out)>
      swiglu_forward;
  /// dx `[rows, 2n]` from x `[rows, 2n]` and dy `[rows, n]`.
  std::function<void(const SwigluPlan&, std::span<const float> x, std::span<const float> dy,
                     std::span<float> dx)>
      swiglu_backward;

  /// out `[B,S,E]` = the attention block of SPEC §7.
  std::function<void(const AttentionBlockPlan&, const AttentionBlockInputs&, std::span<float> out)>
      attention_block;
};

}  // namespace tandem
