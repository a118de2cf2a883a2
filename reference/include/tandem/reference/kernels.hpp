// SPDX-License-Identifier: Apache-2.0
/// @file reference/kernels.hpp
/// @brief The templated reference as a tandem::Kernels<T>: every entry point
///        at element type T, every sum in Acc.
///
/// kernels<float>(), kernels<bfloat16>() and kernels<float16>() are what the
/// reference Backend holds (sums in double; bf16 and f16 round at SPEC
/// §10.2's points and nowhere else); kernels<double>() and the single-precision baseline
/// kernels<float, float>() are what the Python package runs for float64 inputs and for
/// `reference_fp32acc` (SPEC, general rules).
#pragma once

#include "tandem/kernels.hpp"
#include "tandem/reference/attention.hpp"
#include "tandem/reference/attention_block.hpp"
#include "tandem/reference/axial_rope.hpp"
#include "tandem/reference/flex.hpp"
#include "tandem/reference/quantized.hpp"
#include "tandem/reference/rope.hpp"
#include "tandem/reference/scalar.hpp"
#include "tandem/reference/swiglu.hpp"

namespace tandem::reference {

/// Every entry point of the reference at element type T, sums in Acc.
template <class T, class Acc = accumulator_t<T>>
Kernels<T> kernels() {
  Kernels<T> k;
  // the two with a defaulted last parameter (lse, saved) through a call
  k.attention_forward = [](const auto&... a) { attention_forward<T, Acc>(a...); };
  k.attention_backward = [](const auto&... a) { attention_backward<T, Acc>(a...); };
  k.attention_forward_lse = attention_forward_lse<T, Acc>;
  k.attention_backward_saved = attention_backward_saved<T, Acc>;
  k.attention_backward_dq = attention_backward_dq<T, Acc>;
  k.attention_backward_dk = attention_backward_dk<T, Acc>;
  k.attention_backward_dv = attention_backward_dv<T, Acc>;
  k.attention_forward_quantized = attention_forward_quantized<T, Acc>;
  k.quantize_kv = quantize_kv<T, Acc>;
  k.flex_forward = flex_forward_stored<T, Acc>;
  k.flex_backward = flex_backward_stored<T, Acc>;
  k.rope_forward = rope_forward<T, Acc>;
  k.rope_backward = rope_backward<T, Acc>;
  k.rope_forward_qk = rope_forward_qk<T, Acc>;
  k.rope_backward_qk = rope_backward_qk<T, Acc>;
  k.axial_rope_forward = axial_rope_forward<T, Acc>;
  k.axial_rope_backward = axial_rope_backward<T, Acc>;
  k.swiglu_forward = swiglu_forward<T, Acc>;
  k.swiglu_backward = swiglu_backward<T, Acc>;
  k.attention_block = attention_block<T, Acc>;
  return k;
}

}  // namespace tandem::reference
