// SPDX-License-Identifier: Apache-2.0
/// @file reference/rope.hpp
/// @brief Reference RoPE (rotary position embedding), forward and backward
///        (SPEC §4), as plain per-element loops.
///
/// The source (x forward, dy backward) is folded to `[B′, S, W]` and read with
/// the plan's row stride; the output is contiguous `[B′, S, W]`. Each row
/// holds W/D heads of width D. Token (b, s) reads table row
/// `row = plan.table_row(b, s)`; with `c_i = cos[row*T + i]`,
/// `s_i = sin[row*T + i]` and `m = n_rot/2`, pair i (i < m) of every head is
/// `(i, i+m)` for neox and `(2i, 2i+1)` for gptj, and is rotated by angle i.
/// Dims n_rot..D−1 pass through.
#pragma once

#include <cstdint>
#include <span>

#include "tandem/reference/scalar.hpp"
#include "tandem/rope.hpp"

namespace tandem::reference {

/// The two elements of a head that pair i rotates together:
/// neox `(i, i + m)` (rotate-half), gptj `(2i, 2i + 1)` (interleaved).
struct RopePair {
  std::int64_t j;  ///< the first element: i (neox) or 2i (gptj)
  std::int64_t k;  ///< the second element: i + m (neox) or 2i + 1 (gptj)
};

/// Pair i of a head for `style`, with m = n_rot/2.
inline RopePair rope_pair(RopeStyle style, std::int64_t i, std::int64_t m) {
  if (style == RopeStyle::neox) return {i, i + m};
  return {2 * i, 2 * i + 1};
}

/// RoPE forward.
///
/// For every b < B′, s < S, head h < W/D and i < m = n_rot/2, with
/// `row = plan.table_row(b, s)`, `c_i = cos[row*T + i]`, `s_i = sin[row*T + i]`
/// and the pair (j, k) = rope_pair(style, i, m) of head h:
///
///     out[j] = x[j]·c_i − x[k]·s_i
///     out[k] = x[k]·c_i + x[j]·s_i
///
/// and `out[d] = x[d]` for n_rot <= d < D.
///
/// @param plan   a validated RopePlan
/// @param x      source `[B′, S, W]`, row (b, s) at `(b*S + s)*src_row_stride`;
///               elements between rows are never read
/// @param tables cos and sin `[R, T]`; only columns < n_rot/2 are read
/// @param out    contiguous `[B′, S, W]`
/// @throws tandem::Error (before writing anything) when a view does not fit
template <class T, class Acc = accumulator_t<T>>
void rope_forward(const RopePlan& plan, std::span<const T> x, const RopeTables<T>& tables,
                  std::span<T> out) {
  check_views(plan, x, tables, out.size(), "x", "out");
  const std::int64_t m = plan.n_rot / 2;
  for (std::int64_t b = 0; b < plan.B; ++b) {
    for (std::int64_t s = 0; s < plan.S; ++s) {
      const std::int64_t row = plan.table_row(b, s);
      for (std::int64_t h = 0; h < plan.heads(); ++h) {
        // x_h, y_h: where element 0 of head h of token (b, s) sits in x and out.
        const std::int64_t x_h = (b * plan.S + s) * plan.src_row_stride + h * plan.D;
        const std::int64_t y_h = (b * plan.S + s) * plan.W + h * plan.D;
        // y[j] = x[j]·c_i − x[k]·s_i,  y[k] = x[k]·c_i + x[j]·s_i  for i < m
        for (std::int64_t i = 0; i < m; ++i) {
          const Acc c_i = static_cast<Acc>(tables.cos[row * plan.T + i]);
          const Acc s_i = static_cast<Acc>(tables.sin[row * plan.T + i]);
          const auto [j, k] = rope_pair(plan.style, i, m);
          const Acc x_j = static_cast<Acc>(x[x_h + j]);
          const Acc x_k = static_cast<Acc>(x[x_h + k]);
          out[y_h + j] = static_cast<T>(x_j * c_i - x_k * s_i);
          out[y_h + k] = static_cast<T>(x_k * c_i + x_j * s_i);
        }
        // y[d] = x[d]  for n_rot <= d < D
        for (std::int64_t d = plan.n_rot; d < plan.D; ++d) out[y_h + d] = x[x_h + d];
      }
    }
  }
}

/// RoPE backward: the transpose of rope_forward (each pair rotated by −angle).
///
/// With the same row, c_i, s_i and pair (j, k) as rope_forward:
///
///     dx[j] = dy[j]·c_i + dy[k]·s_i
///     dx[k] = dy[k]·c_i − dy[j]·s_i
///
/// and `dx[d] = dy[d]` for n_rot <= d < D, so that
/// `<rope_forward(x), y> == <x, rope_backward(y)>` for every x and y.
///
/// @param plan   a validated RopePlan
/// @param dy     gradient of out `[B′, S, W]`, read with src_row_stride
/// @param tables cos and sin `[R, T]`, as for the forward
/// @param dx     contiguous `[B′, S, W]`
/// @throws tandem::Error (before writing anything) when a view does not fit
template <class T, class Acc = accumulator_t<T>>
void rope_backward(const RopePlan& plan, std::span<const T> dy, const RopeTables<T>& tables,
                   std::span<T> dx) {
  check_views(plan, dy, tables, dx.size(), "dy", "dx");
  const std::int64_t m = plan.n_rot / 2;
  for (std::int64_t b = 0; b < plan.B; ++b) {
    for (std::int64_t s = 0; s < plan.S; ++s) {
      const std::int64_t row = plan.table_row(b, s);
      for (std::int64_t h = 0; h < plan.heads(); ++h) {
        const std::int64_t dy_h = (b * plan.S + s) * plan.src_row_stride + h * plan.D;
        const std::int64_t dx_h = (b * plan.S + s) * plan.W + h * plan.D;
        for (std::int64_t i = 0; i < m; ++i) {
          const Acc c_i = static_cast<Acc>(tables.cos[row * plan.T + i]);
          const Acc s_i = static_cast<Acc>(tables.sin[row * plan.T + i]);
          const auto [j, k] = rope_pair(plan.style, i, m);
          const Acc dy_j = static_cast<Acc>(dy[dy_h + j]);
          const Acc dy_k = static_cast<Acc>(dy[dy_h + k]);
          Acc dx_j = Acc(0), dx_k = Acc(0);
          // y[j] = x[j]·c_i − x[k]·s_i
          dx_j += dy_j * c_i;
          dx_k -= dy_j * s_i;
          // y[k] = x[k]·c_i + x[j]·s_i
          dx_k += dy_k * c_i;
          dx_j += dy_k * s_i;
          dx[dx_h + j] = static_cast<T>(dx_j);
          dx[dx_h + k] = static_cast<T>(dx_k);
        }
        // y[d] = x[d]  for n_rot <= d < D
        for (std::int64_t d = plan.n_rot; d < plan.D; ++d) dx[dx_h + d] = dy[dy_h + d];
      }
    }
  }
}

}  // namespace tandem::reference
