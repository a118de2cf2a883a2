// SPDX-License-Identifier: Apache-2.0
/// @file rounding.hpp
/// @brief Rounding profiles: where an attention call with low-precision
///        storage rounds to its storage type between reading its inputs and
///        writing its outputs (SPEC §10.2, §10.3).
///
/// A profile is a small description that each backend interprets: the
/// reference rounds exactly where it says and nowhere else (computing
/// everything else in double); the optimized backend implements the
/// profiles a fast kernel is wanted for (tandem's default and exact) and
/// throws tandem::Error for the others. Profiles describing other libraries
/// let `tandem check` say which one a user's tensors match.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>

namespace tandem {

/// Where an attention call of low-precision storage type T rounds to T, on
/// top of the rounding of every output once (SPEC §10.2). For float32 and
/// float64 storage every profile is `exact`: nothing is rounded in between.
struct Rounding {
  /// The profile's name in messages, case files and Python ("pytorch", "exact", "ggml").
  std::string_view name = "pytorch";
  /// The operands of the second products are rounded to T, as a GEMM in T
  /// takes them: the forward's weights `w_ij = RN_T(2^(x_ij − μ_i))` before
  /// `Σ_j w_ij v_j` (μ_i an integer, so the bits do not depend on it), and in
  /// the backward `RN_T(p_ij)` before dV and `RN_T(ds_ij)` before dQ and dK
  /// (PyTorch's CPU flash attention, FlashAttention). False: kept in float32.
  bool operands = true;
  /// q is rounded to K's type before the scores (ggml converts q to K's type);
  /// matters only for a quantized or lower-precision K than q.
  bool q_as_k = false;
  /// The output accumulator `Σ_j w_ij v_j` is kept in T and rounded after
  /// every key (ggml with an f16 V), rather than in float32.
  bool output_accumulator = false;

  /// Profiles are equal when every field is.
  friend bool operator==(const Rounding&, const Rounding&) = default;
};

/// tandem's default and PyTorch's CPU flash attention (and FlashAttention):
/// scores, softmax and the output accumulator in float32; P (and dS) rounded
/// to T before the products that take them; every output rounded once.
inline constexpr Rounding kRoundingPytorch{"pytorch", true, false, false};
/// No intermediate rounding: inputs are read exactly, everything is
/// computed in float32 or wider, and only the outputs are rounded.
inline constexpr Rounding kRoundingExact{"exact", false, false, false};
/// ggml's CPU FLASH_ATTN_EXT with f16 K and V: q rounded to K's type, the
/// weights rounded as the V accumulator's type, which stays in T.
inline constexpr Rounding kRoundingGgml{"ggml", true, true, true};

/// Every named profile, tandem's default first.
inline constexpr std::array<Rounding, 3> kRoundingProfiles{kRoundingPytorch, kRoundingExact,
                                                           kRoundingGgml};

/// The profile called `name`, or nothing.
inline std::optional<Rounding> rounding_profile(std::string_view name) {
  for (const Rounding& r : kRoundingProfiles) {
    if (r.name == name) return r;
  }
  return std::nullopt;
}

/// "pytorch, exact, ggml": the names, for messages.
inline std::string rounding_profile_names() {
  std::string s;
  for (const Rounding& r : kRoundingProfiles) s += (s.empty() ? "" : ", ") + std::string(r.name);
  return s;
}

}  // namespace tandem
