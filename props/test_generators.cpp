// SPDX-License-Identifier: Apache-2.0
// The attention generator draws what the suite relies on it drawing: within
// the cases of one property (300, RapidCheck's sizes 0 to 99), shapes at the
// edges of the optimized backend's default geometry (keys around one and two
// key blocks of 64 and from the 2048 of split-key decode; queries around a
// query tile) and every numerical extreme (far negative biases among the
// cases of a bias-mask property, the only ones that take them). Prints the
// counts.
#include <gtest/gtest.h>

#include <cstdint>
#include <iostream>
#include <map>
#include <string>

#include "cases.hpp"

namespace {

using tandem::MaskKind;
using tandem::props::AttentionCase;
using tandem::props::Extreme;

/// The edge of the default geometry a case lies at, or "" for none.
std::string shape_class(const AttentionCase& c) {
  const std::int64_t Sk = c.params.Sk, Sq = c.params.Sq;
  if (Sk >= 63 && Sk <= 65) return "Sk at one key block (63-65)";
  if (Sk >= 127 && Sk <= 129) return "Sk at two key blocks (127-129)";
  if (Sk >= 2047) return Sq == 1 ? "decode at split-key (Sk 2047-2049)" : "Sk >= 2047";
  if (Sq > 17) {
    const bool banded =
        c.params.mask == MaskKind::causal || c.params.mask == MaskKind::sliding_window;
    return banded ? "Sq around a banded tile" : "Sq around a tile";
  }
  return "";
}

TEST(Generators, DrawEdgeShapesAndExtremes) {
  constexpr int kCases = 300;
  const tandem::props::AttentionGen any;
  std::map<std::string, int> seen;
  for (const tandem::props::AttentionGen& g : {any, any.with_mask(MaskKind::bias)}) {
    const rc::Gen<AttentionCase> gen = tandem::props::gen_attention(g);
    rc::Random random(20261201);
    for (int i = 0; i < kCases; ++i) {
      const AttentionCase c = gen(random.split(), i % 100).value();
      const std::string shape = shape_class(c);
      if (!shape.empty()) ++seen[shape];
      if (c.extreme != Extreme::none) ++seen[std::string("extreme ") + to_string(c.extreme)];
    }
  }
  for (const auto& [what, n] : seen) std::cout << what << ": " << n << " of 2 x " << kCases << "\n";
  for (const char* what :
       {"Sk at one key block (63-65)", "Sk at two key blocks (127-129)",
        "decode at split-key (Sk 2047-2049)", "Sq around a tile", "Sq around a banded tile"}) {
    EXPECT_GT(seen[what], 0) << what;
  }
  for (Extreme e : {Extreme::huge_logits, Extreme::far_bias, Extreme::subnormal,
                    Extreme::equal_scores, Extreme::equal_logits}) {
    EXPECT_GT(seen[std::string("extreme ") + to_string(e)], 0) << to_string(e);
  }
}

}  // namespace
