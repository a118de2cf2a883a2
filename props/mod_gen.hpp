// SPDX-License-Identifier: Apache-2.0
/// @file mod_gen.hpp
/// @brief Random well-typed mod programs (SPEC §13.1) for the property
///        suite, drawn as a list of instructions so that RapidCheck shrinks a
///        failing program by dropping instructions and simplifying operands.
#pragma once

#include <rapidcheck.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tandem/flex_mod.hpp"

namespace tandem::props {

/// One instruction: which operation (op % the number of kinds) and which
/// earlier values of the needed types it reads (each % the pool's size).
struct ModInstruction {
  int op = 0;               ///< the kind of node to add
  int a = 0, b = 0, c = 0;  ///< operand picks
  int constant = 0;         ///< a small constant for the kinds that take one
};

/// A drawn program: the instructions, what it is for, and the call's domain.
struct ModCase {
  std::vector<ModInstruction> code;   ///< the instructions, in order
  ModRole role = ModRole::score_mod;  ///< score_mod: a real result; mask_mod: a boolean one
  ModDomain domain;                   ///< B, H, Sq, Sk (small: every point is evaluated)
};

/// The tensors every drawn program may capture: "t", real `[H, 8]`, and
/// "ids", integer `[Sk]` with values in [0, 3].
inline constexpr std::int64_t kModTableWidth = 8;
inline constexpr std::int64_t kModIdsHi = 3;

/// Builds the program of `c`: leaves (score for a score_mod, b, h, q_idx,
/// kv_idx, small constants), then one node per instruction. Loads index "t"
/// by (h, a clamped integer) and "ids" by kv_idx or q_idx clamped to Sk − 1,
/// so indices stay in range; exp, log and div take guarded arguments
/// (exp(tanh x), log(1 + x²), x / (1 + y²)) so reals stay finite.
ModProgram build_mod(const ModCase& c);

/// f + t[h, clamp(q_idx − kv_idx + 3, 0, 7)]·tanh(score), for a score_mod
/// f of build_mod: a drawn mod seldom reaches its result through a load of
/// "t", so the flex properties give every case one that does (a learned
/// relative bias scaled by the score).
ModProgram with_learned_bias(ModProgram f);

/// A ModCase of up to `max_len` instructions over a domain of at most
/// 2 × 3 × 6 × 7 points.
rc::Gen<ModCase> gen_mod_case(ModRole role, int max_len = 24);

/// The program as text, for counterexamples.
std::string describe(const ModCase& c);

}  // namespace tandem::props
