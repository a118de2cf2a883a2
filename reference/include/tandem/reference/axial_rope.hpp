// SPDX-License-Identifier: Apache-2.0
/// @file reference/axial_rope.hpp
/// @brief Reference axial 2-D RoPE (vision transformers, as in SAM 2),
///        forward and backward (SPEC §5), as plain per-element loops.
///
/// The source is folded to `[B′, S, W]` and read with the plan's row stride;
/// the output is contiguous `[B′, S, W]`, with num_heads heads of width D per
/// row. Token s sits at `p = s mod (end_x·end_y)` on an end_x × end_y grid,
/// column `px = p mod end_x`, row `py = p div end_x`. With the frequencies
/// `f_k = theta^(−4k/D)`, k < D/4, the pair `(x[2j], x[2j+1])`, j < D/2,
/// of every head is rotated by angle `px·f_j` for j < D/4 (the x half) and by
/// `py·f_{j−D/4}` for j >= D/4 (the y half).
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "tandem/axial_rope.hpp"
#include "tandem/reference/scalar.hpp"

namespace tandem::reference {

/// The frequencies of an axial RoPE head, in double:
/// `f_k = theta^(−4k/D)` for k < D/4.
inline std::vector<double> axial_rope_frequencies(const AxialRopePlan& plan) {
  std::vector<double> f(static_cast<std::size_t>(plan.D / 4));
  for (std::int64_t k = 0; k < plan.D / 4; ++k) {
    // f_k = theta^(−4k/D)
    f[k] = std::pow(plan.theta, -4.0 * static_cast<double>(k) / static_cast<double>(plan.D));
  }
  return f;
}

/// The rotation angle of pair j (j < D/2) of token s, in double:
/// `px·f_j` for j < D/4 and `py·f_{j−D/4}` for j >= D/4, where
/// `p = s mod (end_x·end_y)`, `px = p mod end_x`, `py = p div end_x`.
inline double axial_rope_angle(const AxialRopePlan& plan, const std::vector<double>& f,
                               std::int64_t s, std::int64_t j) {
  const std::int64_t p = s % (plan.end_x * plan.end_y);
  const std::int64_t px = p % plan.end_x;
  const std::int64_t py = p / plan.end_x;
  const std::int64_t quarter = plan.D / 4;
  if (j < quarter) return static_cast<double>(px) * f[j];
  return static_cast<double>(py) * f[j - quarter];
}

/// Axial 2-D RoPE forward.
///
/// For every b < B′, s < S, head h < num_heads and j < D/2, with
/// `a_j = axial_rope_angle(plan, f, s, j)`, `c_j = cos(a_j)`, `s_j = sin(a_j)`:
///
///     out[2j]   = x[2j]·c_j − x[2j+1]·s_j
///     out[2j+1] = x[2j+1]·c_j + x[2j]·s_j
///
/// (element d of head h of token (b, s) is
/// `x[(b*S + s)*src_row_stride + h*D + d]`, `out[(b*S + s)*W + h*D + d]`).
///
/// @param plan a validated AxialRopePlan
/// @param x    source `[B′, S, W]` read with src_row_stride
/// @param out  contiguous `[B′, S, W]`
/// @throws tandem::Error (before writing anything) when a view does not fit
template <class T, class Acc = accumulator_t<T>>
void axial_rope_forward(const AxialRopePlan& plan, std::span<const T> x, std::span<T> out) {
  check_views(plan, x, out.size(), "x", "out");
  const std::vector<double> f = axial_rope_frequencies(plan);
  for (std::int64_t b = 0; b < plan.B; ++b) {
    for (std::int64_t s = 0; s < plan.S; ++s) {
      for (std::int64_t h = 0; h < plan.num_heads; ++h) {
        const std::int64_t x_h = (b * plan.S + s) * plan.src_row_stride + h * plan.D;
        const std::int64_t y_h = (b * plan.S + s) * plan.W + h * plan.D;
        // y[2j] = x[2j]·c_j − x[2j+1]·s_j,  y[2j+1] = x[2j+1]·c_j + x[2j]·s_j  for j < D/2
        for (std::int64_t j = 0; j < plan.D / 2; ++j) {
          const double a_j = axial_rope_angle(plan, f, s, j);
          const Acc c_j = static_cast<Acc>(std::cos(a_j));
          const Acc s_j = static_cast<Acc>(std::sin(a_j));
          const Acc x_0 = static_cast<Acc>(x[x_h + 2 * j]);
          const Acc x_1 = static_cast<Acc>(x[x_h + 2 * j + 1]);
          out[y_h + 2 * j] = static_cast<T>(x_0 * c_j - x_1 * s_j);
          out[y_h + 2 * j + 1] = static_cast<T>(x_1 * c_j + x_0 * s_j);
        }
      }
    }
  }
}

/// Axial 2-D RoPE backward: the transpose of axial_rope_forward (each pair
/// rotated by −a_j). With the same a_j, c_j, s_j:
///
///     dx[2j]   = dy[2j]·c_j + dy[2j+1]·s_j
///     dx[2j+1] = dy[2j+1]·c_j − dy[2j]·s_j
///
/// @param plan a validated AxialRopePlan
/// @param dy   gradient of out `[B′, S, W]` read with src_row_stride
/// @param dx   contiguous `[B′, S, W]`
/// @throws tandem::Error (before writing anything) when a view does not fit
template <class T, class Acc = accumulator_t<T>>
void axial_rope_backward(const AxialRopePlan& plan, std::span<const T> dy, std::span<T> dx) {
  check_views(plan, dy, dx.size(), "dy", "dx");
  const std::vector<double> f = axial_rope_frequencies(plan);
  for (std::int64_t b = 0; b < plan.B; ++b) {
    for (std::int64_t s = 0; s < plan.S; ++s) {
      for (std::int64_t h = 0; h < plan.num_heads; ++h) {
        const std::int64_t dy_h = (b * plan.S + s) * plan.src_row_stride + h * plan.D;
        const std::int64_t dx_h = (b * plan.S + s) * plan.W + h * plan.D;
        for (std::int64_t j = 0; j < plan.D / 2; ++j) {
          const double a_j = axial_rope_angle(plan, f, s, j);
          const Acc c_j = static_cast<Acc>(std::cos(a_j));
          const Acc s_j = static_cast<Acc>(std::sin(a_j));
          const Acc dy_0 = static_cast<Acc>(dy[dy_h + 2 * j]);
          const Acc dy_1 = static_cast<Acc>(dy[dy_h + 2 * j + 1]);
          Acc dx_0 = Acc(0), dx_1 = Acc(0);
          // y[2j] = x[2j]·c_j − x[2j+1]·s_j
          dx_0 += dy_0 * c_j;
          dx_1 -= dy_0 * s_j;
          // y[2j+1] = x[2j+1]·c_j + x[2j]·s_j
          dx_1 += dy_1 * c_j;
          dx_0 += dy_1 * s_j;
          dx[dx_h + 2 * j] = static_cast<T>(dx_0);
          dx[dx_h + 2 * j + 1] = static_cast<T>(dx_1);
        }
      }
    }
  }
}

}  // namespace tandem::reference
