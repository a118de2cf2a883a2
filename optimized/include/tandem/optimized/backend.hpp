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
/// The target of supported_targets() named `name` (Highway's name, as
/// target_name() gives it: "AVX3", "AVX2", "SSE4", "EMU128" or "SCALAR");
/// throws tandem::Error naming the ones this CPU runs when there is none.
std::int64_t target_named(const std::string& name);
/// Forces the target the environment variable `TANDEM_TARGET` names, once
/// per process, on the first call (backend() calls it): a user's check of
/// the AVX2 path, say, on an AVX-512 CPU, in any program that links tandem.
/// Unset or empty: nothing is forced. A name this CPU does not run throws
/// tandem::Error (and is read again on the next call).
void force_environment_target();

/// Whether this CPU has AVX512-BF16 (with AVX512 F/BW/VL): the bf16 forward's
/// wide tiles can then multiply q·k (and, under the `pytorch` profile, P·V)
/// as bf16 with vdpbf16ps on AVX3 targets (SPEC §10.5).
bool bf16_dot_supported();
/// Switches that path on or off (the default: the portable float products on
/// every target, which measured faster on the one AVX512-BF16 CPU tried,
/// bench/README.md); the tests and the property suite run both. Process-wide:
/// not for use while a call runs.
void enable_bf16_dot(bool enabled);
/// Whether a bf16 forward would take that path now: supported, enabled and
/// the target dynamic dispatch picks now AVX3 or better.
bool bf16_dot_active();

}  // namespace tandem::optimized
