// SPDX-License-Identifier: Apache-2.0
/// @file tune.hpp
/// @brief `tandem tune`: the bit-neutral geometry of the optimized attention
///        tuned on this CPU per shape class, written as a tuning file
///        (optimized/tuning.hpp, SPEC §10.6).
#pragma once

#include <string>

namespace tandem::tool {

struct TuneArgs {
  double seconds = 120;  ///< the whole search's time budget
  std::string out;       ///< the tuning file written
  int threads = 0;       ///< threads per call, 0 = all cores
  bool tiny = false;     ///< a few small shapes (tests) instead of the report's
};

/// Tunes every shape class within about args.seconds, printing a line per
/// candidate, and writes args.out. Returns 0; throws tandem::Error when a
/// winner changes bits (nothing is written then).
int tune(const TuneArgs& args);

}  // namespace tandem::tool
