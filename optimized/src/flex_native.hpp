// SPDX-License-Identifier: Apache-2.0
/// @file flex_native.hpp
/// @brief FlexAttention calls that are native attention calls (SPEC §13.5):
///        found by reading the mods, never by evaluating them, and run on
///        the native kernels.
///
/// A mask_mod built from comparisons of integer expressions that are affine
/// in q_idx and kv_idx, joined by and, or and not, hides key j from query i
/// by d = j − i alone when every comparison is one on d, or holds for every
/// q_idx (or every kv_idx) of the call, or for none: such a mask_mod is a
/// band lo <= d <= hi. On the call's d ∈ [−(Sq − 1), Sk − 1] the band is no
/// mask (it holds the whole range), causal (hi = o, lo at the range's end;
/// o = max(Sk − Sq, 0), SPEC §2) or a sliding window w (hi = o, lo = o − w).
/// A block mask keeps the native form when it says nothing the band does
/// not: each block it marks full lies inside the band and each it hides lies
/// outside (a partial block is evaluated, so it may be anything). A
/// score_mod is native when it is absent, the score itself, or a softcap
/// `c · tanh(score / c)` with one positive constant c. Anything else (ALiBi
/// and document masks among them, which read tensors) runs as a program.
#pragma once

#include <optional>

#include <span>

#include "tandem/attention_plan.hpp"
#include "tandem/flex_plan.hpp"
#include "tandem/optimized/options.hpp"

namespace tandem::optimized::flex {

/// The AttentionParams (layout bhsd, rounding exact) of the native call that
/// computes the same function as flex call `(plan, blocks)`, or nothing.
std::optional<AttentionParams> native_form(const FlexPlan& plan, const FlexBlockMaskData& blocks);

/// Runs the forward of a checked flex call on the native kernels when it
/// has a native form (then returns true; otherwise nothing is written).
template <class T>
bool native_forward(const FlexPlan& plan, const FlexInputs<T>& in, std::span<T> out,
                    std::span<float> lse, const Options& options);

/// Runs the backward of a checked flex call on the native kernels (the
/// forward rerun, as flex_backward does) when it has a native form.
template <class T>
bool native_backward(const FlexPlan& plan, const FlexInputs<T>& in, std::span<const T> dout,
                     const FlexGrads<T>& grads, const Options& options);

}  // namespace tandem::optimized::flex
