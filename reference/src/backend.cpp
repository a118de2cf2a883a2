// SPDX-License-Identifier: Apache-2.0
// The float32 reference backend: every entry point of tandem::Backend bound
// to the templated reference kernels at T = float (sums in double).
#include "tandem/reference/backend.hpp"

#include "tandem/reference/attention.hpp"
#include "tandem/reference/attention_block.hpp"
#include "tandem/reference/axial_rope.hpp"
#include "tandem/reference/rope.hpp"
#include "tandem/reference/swiglu.hpp"

namespace tandem::reference {

Backend backend() {
  Backend b;
  b.name = "reference";
  b.attention_forward = [](const AttentionPlan& plan, const AttentionInputs<float>& in,
                           std::span<float> out) { attention_forward<float>(plan, in, out); };
  b.attention_forward_lse = attention_forward_lse<float>;
  b.attention_backward = [](const AttentionPlan& plan, const AttentionInputs<float>& in,
                            std::span<const float> dout, const AttentionGrads<float>& grads) {
    attention_backward<float>(plan, in, dout, grads);
  };
  b.attention_backward_saved = attention_backward_saved<float>;
  b.attention_backward_dq = attention_backward_dq<float>;
  b.attention_backward_dk = attention_backward_dk<float>;
  b.attention_backward_dv = attention_backward_dv<float>;
  b.rope_forward = rope_forward<float>;
  b.rope_backward = rope_backward<float>;
  b.rope_forward_qk = rope_forward_qk<float>;
  b.rope_backward_qk = rope_backward_qk<float>;
  b.axial_rope_forward = axial_rope_forward<float>;
  b.axial_rope_backward = axial_rope_backward<float>;
  b.swiglu_forward = swiglu_forward<float>;
  b.swiglu_backward = swiglu_backward<float>;
  b.attention_block = attention_block;
  return b;
}

}  // namespace tandem::reference
