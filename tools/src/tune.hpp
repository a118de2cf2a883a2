// SPDX-License-Identifier: Apache-2.0
/// @file tune.hpp
/// @brief `tandem tune`: the bit-neutral geometry of the optimized attention
///        tuned on this CPU per shape class, written as a tuning file
///        (optimized/tuning.hpp, SPEC §11).
#pragma once

#include <string>

namespace tandem::tool {

struct TuneArgs {
  double seconds = 120;  ///< the whole search's time budget
  std::string out;       ///< the tuning file written
  int threads = 0;       ///< threads per call, 0 = all cores
  bool tiny = false;     ///< a few small shapes (tests) instead of the report's
  std::string compare;   ///< compare: the tuning file timed against the default
};

/// Tunes every shape class within about args.seconds, printing a line per
/// candidate, and writes args.out. Returns 0; throws tandem::Error when a
/// winner changes bits (nothing is written then).
int tune(const TuneArgs& args);

/// Times every shape class at the default geometry and at args.compare's
/// tuning in alternating pairs for about args.seconds in all, and prints
/// them side by side (a Markdown table: medians, the paired speedup's
/// median and quartiles, whether the bits are the same). Returns 0.
int compare(const TuneArgs& args);

}  // namespace tandem::tool
