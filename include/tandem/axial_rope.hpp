// SPDX-License-Identifier: Apache-2.0
/// @file axial_rope.hpp
/// @brief The axial 2-D RoPE plan (vision transformers, as in SAM 2; SPEC §5).
///
/// x folded to `[B', S, W]` as for RoPE, heads of width D = W / num_heads,
/// D divisible by 4, S = r·end_x·end_y. Token s has `p = s mod (end_x·end_y)`,
/// `px = p mod end_x`, `py = p div end_x`; with `f_k = theta^(−4k/D)`, k < D/4,
/// pair `(x[2j], x[2j+1])`, j < D/2, rotates by `px·f_j` for j < D/4 and by
/// `py·f_{j−D/4}` for j >= D/4. The backward is the transpose.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <string>

#include "tandem/error.hpp"
#include "tandem/shape.hpp"

namespace tandem {

/// Explicit parameters of an axial RoPE call.
struct AxialRopeParams {
  std::int64_t batch = 1;      ///< B'
  std::int64_t seq = 0;        ///< S = repeat_factor·end_x·end_y
  std::int64_t width = 0;      ///< W
  std::int64_t num_heads = 1;  ///< W / D
  ///@{
  /// The token grid: end_x columns, end_y rows (S = repeat_factor·end_x·end_y).
  std::int64_t end_x = 0, end_y = 0;
  ///@}
  double theta = 10000.0;           ///< frequency base: f_k = theta^(−4k/D)
  std::int64_t repeat_factor = 1;   ///< r >= 1
  std::int64_t src_row_stride = 0;  ///< 0 = W
};

/// Attributes of a case file's axial_rope op (SPEC §9).
struct AxialRopeAttrs {
  std::int64_t num_heads = 1;  ///< heads per row: D = W / num_heads
  ///@{
  /// The token grid: end_x columns, end_y rows (S = repeat_factor·end_x·end_y).
  std::int64_t end_x = 0, end_y = 0;
  ///@}
  double theta = 10000.0;          ///< frequency base: f_k = theta^(−4k/D)
  std::int64_t repeat_factor = 1;  ///< r >= 1: the grid repeats r times along S
};

/// One axial RoPE call, validated.
struct AxialRopePlan {
  ///@{
  /// x folded to `[B', S, W]`: B' batch, S tokens, W row width, num_heads heads of width D = W /
  /// num_heads (D % 4 == 0).
  std::int64_t B = 0, S = 0, W = 0, num_heads = 1, D = 0;
  ///@}
  ///@{
  /// Grid of end_x columns by end_y rows, repeated repeat_factor times: S =
  /// repeat_factor·end_x·end_y.
  std::int64_t end_x = 0, end_y = 0, repeat_factor = 1;
  ///@}
  double theta = 10000.0;           ///< frequency base: f_k = theta^(−4k/D), k < D/4
  std::int64_t src_row_stride = 0;  ///< distance between source rows, >= W

  /// Elements a strided source must hold: (B'·S − 1)·src_row_stride + W.
  [[nodiscard]] std::int64_t src_extent() const { return (B * S - 1) * src_row_stride + W; }
  /// Elements of the contiguous output `[B', S, W]`: B'·S·W.
  [[nodiscard]] std::int64_t out_size() const { return B * S * W; }

  /// Validates by SPEC §8 — the only place that does.
  static AxialRopePlan make(const AxialRopeParams& p);
  /// x of rank >= 2 folded to [B', S, W].
  static AxialRopePlan from_shapes(const Shape& x, const AxialRopeAttrs& a);
  /// Readable summary for messages and counterexamples.
  [[nodiscard]] std::string describe() const;
};

/// Throws Error unless source and output fit the plan.
template <class T>
void check_views(const AxialRopePlan& plan, std::span<const T> src, std::size_t out_size,
                 const char* src_name, const char* out_name) {
  require_extent(src.size(), plan.src_extent(), src_name);
  require_size(out_size, plan.out_size(), out_name);
}

// ---------------------------------------------------------------------------
// Implementation

inline AxialRopePlan AxialRopePlan::make(const AxialRopeParams& p) {
  require(p.batch >= 1, "batch", p.batch, "must be >= 1");
  require(p.seq >= 1, "seq", p.seq, "must be >= 1");
  require(p.num_heads >= 1, "num_heads", p.num_heads, "must be >= 1");
  require(p.width >= 1 && p.width % p.num_heads == 0, "width", p.width,
          "must be a positive multiple of num_heads = " + std::to_string(p.num_heads));
  const std::int64_t D = p.width / p.num_heads;
  require(D % 4 == 0, "head_dim", D, "(width / num_heads) must be divisible by 4");
  require(p.end_x >= 1, "end_x", p.end_x, "must be >= 1");
  require(p.end_y >= 1, "end_y", p.end_y, "must be >= 1");
  require(p.repeat_factor >= 1, "repeat_factor", p.repeat_factor, "must be >= 1");
  require(std::isfinite(p.theta) && p.theta > 0, "theta", std::to_string(p.theta),
          "must be finite and > 0");
  const std::int64_t grid = checked_mul(p.end_x, p.end_y, "end_x*end_y");
  const std::int64_t need = checked_mul(p.repeat_factor, grid, "repeat_factor*end_x*end_y");
  require(p.seq == need, "seq", p.seq,
          "must equal repeat_factor*end_x*end_y = " + std::to_string(need));
  const std::int64_t stride = p.src_row_stride == 0 ? p.width : p.src_row_stride;
  require(stride >= p.width, "src_row_stride", stride,
          "must be >= width = " + std::to_string(p.width));
  const std::int64_t rows = checked_mul(p.batch, p.seq, "batch*seq");
  checked_add(checked_mul(rows - 1, stride, "x"), p.width, "x");
  checked_mul(rows, p.width, "out");

  AxialRopePlan plan;
  plan.B = p.batch;
  plan.S = p.seq;
  plan.W = p.width;
  plan.num_heads = p.num_heads;
  plan.D = D;
  plan.end_x = p.end_x;
  plan.end_y = p.end_y;
  plan.repeat_factor = p.repeat_factor;
  plan.theta = p.theta;
  plan.src_row_stride = stride;
  return plan;
}

inline AxialRopePlan AxialRopePlan::from_shapes(const Shape& x, const AxialRopeAttrs& a) {
  require(x.size() >= 2, "x.shape", to_string(x), "must have rank >= 2");
  element_count(x, "x.shape");
  AxialRopeParams p;
  p.batch = 1;
  for (std::size_t i = 0; i + 2 < x.size(); ++i) p.batch = checked_mul(p.batch, x[i], "x.shape");
  p.seq = x[x.size() - 2];
  p.width = x.back();
  p.num_heads = a.num_heads;
  p.end_x = a.end_x;
  p.end_y = a.end_y;
  p.theta = a.theta;
  p.repeat_factor = a.repeat_factor;
  return make(p);
}

inline std::string AxialRopePlan::describe() const {
  return "B'=" + std::to_string(B) + " S=" + std::to_string(S) + " W=" + std::to_string(W) +
         " heads=" + std::to_string(num_heads) + " D=" + std::to_string(D) +
         " end_x=" + std::to_string(end_x) + " end_y=" + std::to_string(end_y) +
         " r=" + std::to_string(repeat_factor) + " theta=" + std::to_string(theta) +
         " src_row_stride=" + std::to_string(src_row_stride);
}

}  // namespace tandem
