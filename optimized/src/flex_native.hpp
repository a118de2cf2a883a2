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
/// score_mod is native when it is absent, the score itself, a softcap
/// `c · tanh(score / c)` with one positive constant c, or ALiBi with slopes
/// `[H]` captured as its one tensor (`score − slopes[h]·abs(q_idx − kv_idx
/// + Sk − Sq)`, or torch's `score + slopes[h]·(kv_idx − q_idx)` where the
/// band keeps kv_idx − q_idx <= Sk − Sq = 0); a backward that asks for the
/// slopes' gradient runs as a program. A mask_mod may also be the band and
/// (`and`) a document mask `doc[q_idx] == doc[kv_idx]` over an integer
/// tensor doc `[Sk]` whose values never decrease, with Sq = Sk: each batch
/// entry's documents are then the sequences of one packed bhsd call (SPEC
/// §2.9) on the entry's rows in place, the block mask checked against band
/// and documents. Anything else runs as
/// a program.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "tandem/attention_plan.hpp"
#include "tandem/flex_plan.hpp"
#include "tandem/optimized/options.hpp"

namespace tandem::optimized::flex {

/// A native call that computes the same function as a flex call.
struct NativeForm {
  AttentionParams params;    ///< layout bhsd, rounding exact
  std::int32_t slopes = -1;  ///< the score_mod tensor holding ALiBi's slopes `[H]`, or −1
  /// The mask_mod tensor holding each key's document `[Sk]`, or −1: each
  /// batch entry's documents run as packed sequences (SPEC §2.9).
  std::int32_t documents = -1;
};

/// The native form of flex call `(plan, blocks)` whose mask_mod's integer
/// tensors are `mask_integers` (the documents are read), or nothing.
std::optional<NativeForm> native_form(const FlexPlan& plan, const FlexBlockMaskData& blocks,
                                      const std::vector<Indices>& mask_integers);

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
