// SPDX-License-Identifier: Apache-2.0
/// @file optimized/decode.hpp
/// @brief The optimized backend's bf16/f16 decode kernel on its own: the
///        path that Backend::bf16 and Backend::f16's attention_forward
///        take for a decode step, which reads K and V in their stored
///        width (SPEC §10.4's last paragraph), exposed so that tests and
///        benchmarks can run it by name and know that it ran.
///
/// A call is a decode step when every sequence has at most one task's
/// query rows (a handful of queries per kv head); any other call is
/// declined. The forwards of backend.hpp's Backend give the same bits for
/// a decode step: they call this first.
#pragma once

#include <span>

#include "tandem/attention.hpp"
#include "tandem/optimized/options.hpp"
#include "tandem/storage.hpp"

namespace tandem::optimized {

/// out `[plan.o]` = RN_T(attention(q, k, v, mask)) and, when non-empty, lse
/// `[B, H, Sq]` (float32; −inf for a row with no visible key), with K and V
/// read as stored, for T = bfloat16 or float16 and the `pytorch` or `exact`
/// profile (SPEC §10.2). Validates `options` and the views against the plan
/// first (tandem::Error naming the input, nothing written); returns false,
/// writing nothing, when the call is not a decode step, true when it
/// computed it. Bitwise identical for any `options.threads`.
template <class T>
bool attention_decode_stored(const AttentionPlan& plan, const AttentionInputs<T>& in,
                             std::span<T> out, std::span<float> lse, const Options& options = {});

}  // namespace tandem::optimized
