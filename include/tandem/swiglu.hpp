// SPDX-License-Identifier: Apache-2.0
/// @file swiglu.hpp
/// @brief The SwiGLU plan (SPEC §6).
///
/// x `[rows, 2n]` → y `[rows, n]`, `y = silu(g)·u`, `silu(g) = g·σ(g)`; with
/// gate_first the gate g is the first half of each row and u the second
/// (ggml's swiglu), otherwise the reverse. Backward:
/// `dg = dy·u·σ(g)·(1 + g·(1 − σ(g)))`, `du = dy·silu(g)`, dx `[rows, 2n]` in
/// the input's half order.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "tandem/error.hpp"
#include "tandem/shape.hpp"

namespace tandem {

/// Explicit parameters of a SwiGLU call.
struct SwigluParams {
  std::int64_t rows = 1;  ///< product of all dims but the last
  std::int64_t n = 0;     ///< half of the last dim
  /// true: gate g = first half of a row (ggml's swiglu); false: g = second half
  bool gate_first = true;
};

/// One SwiGLU call, validated.
struct SwigluPlan {
  ///@{
  /// x `[rows, 2n]` → y `[rows, n]`: rows is the product of all dims but the last, 2n the last dim.
  std::int64_t rows = 0, n = 0;
  ///@}
  bool gate_first = true;  ///< true: gate g = first half of a row; false: g = second half

  ///@{
  /// Offset of the gate and of the up half within a row of 2n.
  [[nodiscard]] std::int64_t gate_offset() const { return gate_first ? 0 : n; }
  [[nodiscard]] std::int64_t up_offset() const { return gate_first ? n : 0; }
  ///@}
  /// Elements of x and dx: rows·2n.
  [[nodiscard]] std::int64_t in_size() const { return rows * 2 * n; }
  /// Elements of y and dy: rows·n.
  [[nodiscard]] std::int64_t out_size() const { return rows * n; }

  /// Validates by SPEC §8 — the only place that does.
  static SwigluPlan make(const SwigluParams& p);
  /// x `[..., 2n]`, rank >= 1.
  static SwigluPlan from_shapes(const Shape& x, bool gate_first, const std::string& name = "x");
  /// Readable summary for messages and counterexamples.
  [[nodiscard]] std::string describe() const;
};

// ---------------------------------------------------------------------------
// Implementation

inline SwigluPlan SwigluPlan::make(const SwigluParams& p) {
  require(p.rows >= 1, "rows", p.rows, "must be >= 1");
  require(p.n >= 1, "n", p.n, "must be >= 1");
  checked_mul(checked_mul(p.rows, p.n, "x"), 2, "x");
  return SwigluPlan{p.rows, p.n, p.gate_first};
}

inline SwigluPlan SwigluPlan::from_shapes(const Shape& x, bool gate_first,
                                          const std::string& name) {
  const std::string xs = name + ".shape";
  require(!x.empty(), xs, to_string(x), "must have rank >= 1");
  element_count(x, xs);
  const std::int64_t last = x.back();
  require(last >= 2 && last % 2 == 0, xs, to_string(x),
          "must have an even, non-zero last dim (2n)");
  std::int64_t rows = 1;
  for (std::size_t i = 0; i + 1 < x.size(); ++i) rows = checked_mul(rows, x[i], xs);
  return make({rows, last / 2, gate_first});
}

inline std::string SwigluPlan::describe() const {
  return "rows=" + std::to_string(rows) + " n=" + std::to_string(n) +
         (gate_first ? " gate_first" : " up_first");
}

}  // namespace tandem
