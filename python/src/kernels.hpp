// SPDX-License-Identifier: Apache-2.0
/// @file kernels.hpp
/// @brief The kernel entry points of one implementation at scalar type T: a
///        float32 Backend (optimized or reference), the reference templated
///        in double (what float64 calls run), or the reference accumulating
///        in float32 (the single-precision baseline of tandem.testing).
#pragma once

#include <functional>
#include <span>
#include <string>

#include "tandem/backend.hpp"
#include "tandem/reference/attention.hpp"
#include "tandem/reference/axial_rope.hpp"
#include "tandem/reference/rope.hpp"
#include "tandem/reference/swiglu.hpp"

namespace tandem::python {

/// Backend's entry points (all but the float32-only attention block) at
/// scalar type T; same argument order and meaning.
template <class T>
struct Kernels {
  ///@{
  /// See tandem::Backend.
  std::function<void(const AttentionPlan&, const AttentionInputs<T>&, std::span<T>)>
      attention_forward;
  std::function<void(const AttentionPlan&, const AttentionInputs<T>&, std::span<T>, std::span<T>)>
      attention_forward_lse;
  std::function<void(const AttentionPlan&, const AttentionInputs<T>&, std::span<const T>,
                     const AttentionGrads<T>&)>
      attention_backward;
  std::function<void(const AttentionPlan&, const AttentionInputs<T>&, const AttentionSaved<T>&,
                     std::span<const T>, const AttentionGrads<T>&)>
      attention_backward_saved;
  std::function<void(const AttentionPlan&, const AttentionInputs<T>&, std::span<const T>,
                     std::span<T>)>
      attention_backward_dq, attention_backward_dk, attention_backward_dv;
  std::function<void(const RopePlan&, std::span<const T>, const RopeTables<T>&, std::span<T>)>
      rope_forward, rope_backward;
  std::function<void(const RopeQkPlan&, std::span<const T>, std::span<const T>,
                     const RopeTables<T>&, std::span<T>, std::span<T>)>
      rope_forward_qk, rope_backward_qk;
  std::function<void(const AxialRopePlan&, std::span<const T>, std::span<T>)> axial_rope_forward,
      axial_rope_backward;
  std::function<void(const SwigluPlan&, std::span<const T>, std::span<T>)> swiglu_forward;
  std::function<void(const SwigluPlan&, std::span<const T>, std::span<const T>, std::span<T>)>
      swiglu_backward;
  ///@}
};

/// A float32 Backend's entry points.
inline Kernels<float> kernels_of(const Backend& be) {
  return {be.attention_forward,        be.attention_forward_lse, be.attention_backward,
          be.attention_backward_saved, be.attention_backward_dq, be.attention_backward_dk,
          be.attention_backward_dv,    be.rope_forward,          be.rope_backward,
          be.rope_forward_qk,          be.rope_backward_qk,      be.axial_rope_forward,
          be.axial_rope_backward,      be.swiglu_forward,        be.swiglu_backward};
}

/// The templated reference at scalar type T, every sum in Acc.
template <class T, class Acc>
Kernels<T> reference_kernels() {
  namespace ref = tandem::reference;
  Kernels<T> k;
  k.attention_forward = [](const AttentionPlan& p, const AttentionInputs<T>& in, std::span<T> out) {
    ref::attention_forward<T, Acc>(p, in, out);
  };
  k.attention_forward_lse = ref::attention_forward_lse<T, Acc>;
  k.attention_backward = [](const AttentionPlan& p, const AttentionInputs<T>& in,
                            std::span<const T> dout, const AttentionGrads<T>& g) {
    ref::attention_backward<T, Acc>(p, in, dout, g);
  };
  k.attention_backward_saved = ref::attention_backward_saved<T, Acc>;
  k.attention_backward_dq = ref::attention_backward_dq<T, Acc>;
  k.attention_backward_dk = ref::attention_backward_dk<T, Acc>;
  k.attention_backward_dv = ref::attention_backward_dv<T, Acc>;
  k.rope_forward = ref::rope_forward<T, Acc>;
  k.rope_backward = ref::rope_backward<T, Acc>;
  k.rope_forward_qk = ref::rope_forward_qk<T, Acc>;
  k.rope_backward_qk = ref::rope_backward_qk<T, Acc>;
  k.axial_rope_forward = ref::axial_rope_forward<T, Acc>;
  k.axial_rope_backward = ref::axial_rope_backward<T, Acc>;
  k.swiglu_forward = ref::swiglu_forward<T, Acc>;
  k.swiglu_backward = ref::swiglu_backward<T, Acc>;
  return k;
}

}  // namespace tandem::python
