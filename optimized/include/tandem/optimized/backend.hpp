// SPDX-License-Identifier: Apache-2.0
/// @file optimized/backend.hpp
/// @brief The optimized backend: Highway SIMD with dynamic dispatch (one
///        binary picks AVX-512, AVX2, SSE4, NEON/SVE or scalar at run time)
///        and OpenMP threads on outer loops; bitwise identical results for
///        any thread count.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tandem/backend.hpp"
#include "tandem/optimized/options.hpp"

namespace tandem::optimized {

/// The optimized backend, named "optimized". Throws tandem::Error naming the
/// field (e.g. "geometry.key_block") when an option is out of its range.
Backend backend(Options options = {});

/// Highway targets compiled into this binary that this CPU supports, best
/// first (e.g. AVX3, AVX2, SSE4, EMU128/SCALAR), as Highway target bits.
std::vector<std::int64_t> supported_targets();
/// Highway's name of a target ("AVX3", "AVX2", "EMU128", ...).
std::string target_name(std::int64_t target);
/// Restricts dynamic dispatch to `target` (tests run every compiled target,
/// scalar included); 0 restores the default choice.
void force_target(std::int64_t target);
/// The name of the target dynamic dispatch picks now.
std::string current_target();

}  // namespace tandem::optimized
