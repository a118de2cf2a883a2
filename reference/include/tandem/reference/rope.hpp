// SPDX-License-Identifier: Apache-2.0
/// @file reference/rope.hpp
/// @brief Reference RoPE (rotary position embedding), forward and backward
///        (SPEC §4), on one tensor or on q and k together, as plain
///        per-element loops.
///
/// The source (x forward, dy backward) holds B·S tokens of H = W/D heads in
/// the plan's layout; head h of token (b, s) starts at `plan.src.at(b, s, h)`
/// in the source and at `plan.out.at(b, s, h)` in the contiguous output.
/// Token (b, s) reads table row `r = plan.table_row(b, s, positions)`; with
/// `c_i = cos[r*T + i]`, `s_i = sin[r*T + i]` and `m = n_rot/2`, pair i
/// (i < m) of every head is `(i, i+m)` for neox and `(2i, 2i+1)` for gptj,
/// and is rotated by angle i. Dims n_rot..D−1 pass through.
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
/// For every b < B, s < S, head h < H and i < m = n_rot/2, with
/// `row = plan.table_row(b, s, tables.positions)`, `c_i = cos[row*T + i]`,
/// `s_i = sin[row*T + i]` and the pair (j, k) = rope_pair(style, i, m) of head h:
///
///     out[j] = x[j]·c_i − x[k]·s_i
///     out[k] = x[k]·c_i + x[j]·s_i
///
/// and `out[d] = x[d]` for n_rot <= d < D.
///
/// @param plan   a validated RopePlan
/// @param x      source in the plan's layout, head h of token (b, s) at `plan.src.at(b, s, h)`;
///               elements between rows are never read
/// @param tables cos and sin `[R, T]` (only columns < n_rot/2 and the rows tokens select are
///               read), and the position ids of position_ids rows
/// @param out    contiguous, the layout of x: head h of token (b, s) at `plan.out.at(b, s, h)`
/// @throws tandem::Error (before writing anything) when a view or a position does not fit
template <class T, class Acc = accumulator_t<T>>
void rope_forward(const RopePlan& plan, std::span<const T> x, const RopeTables<T>& tables,
                  std::span<T> out) {
  check_views(plan, x, tables, out.size(), "x", "out");
  const std::int64_t m = plan.n_rot / 2;
  for (std::int64_t b = 0; b < plan.B; ++b) {
    for (std::int64_t s = 0; s < plan.S; ++s) {
      const std::int64_t row = plan.table_row(b, s, tables.positions);
      for (std::int64_t h = 0; h < plan.heads(); ++h) {
        // x_h, y_h: where element 0 of head h of token (b, s) sits in x and out.
        const std::int64_t x_h = plan.src.at(b, s, h);
        const std::int64_t y_h = plan.out.at(b, s, h);
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
/// @param dy     gradient of out, read as rope_forward reads x (`plan.src`)
/// @param tables cos, sin and position ids, as for the forward
/// @param dx     contiguous, the layout of dy (`plan.out`)
/// @throws tandem::Error (before writing anything) when a view or a position does not fit
template <class T, class Acc = accumulator_t<T>>
void rope_backward(const RopePlan& plan, std::span<const T> dy, const RopeTables<T>& tables,
                   std::span<T> dx) {
  check_views(plan, dy, tables, dx.size(), "dy", "dx");
  const std::int64_t m = plan.n_rot / 2;
  for (std::int64_t b = 0; b < plan.B; ++b) {
    for (std::int64_t s = 0; s < plan.S; ++s) {
      const std::int64_t row = plan.table_row(b, s, tables.positions);
      for (std::int64_t h = 0; h < plan.heads(); ++h) {
        const std::int64_t dy_h = plan.src.at(b, s, h);
        const std::int64_t dx_h = plan.out.at(b, s, h);
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

/// RoPE on q and k in one call, with the same tables and position ids:
///
///     q_out = rope_forward(plan.q, q),   k_out = rope_forward(plan.k, k)
///
/// (q and k may have different head counts, e.g. GQA). Both calls are
/// validated before either output is written.
template <class T, class Acc = accumulator_t<T>>
void rope_forward_qk(const RopeQkPlan& plan, std::span<const T> q, std::span<const T> k,
                     const RopeTables<T>& tables, std::span<T> q_out, std::span<T> k_out) {
  check_views(plan, q, k, tables, q_out.size(), k_out.size(), kRopeQkForward);
  rope_forward<T, Acc>(plan.q, q, tables, q_out);
  rope_forward<T, Acc>(plan.k, k, tables, k_out);
}

/// The backward of rope_forward_qk, from the gradients of q_out and k_out:
///
///     dq = rope_backward(plan.q, dq_out),   dk = rope_backward(plan.k, dk_out)
///
/// Both calls are validated before either output is written.
template <class T, class Acc = accumulator_t<T>>
void rope_backward_qk(const RopeQkPlan& plan, std::span<const T> dq_out, std::span<const T> dk_out,
                      const RopeTables<T>& tables, std::span<T> dq, std::span<T> dk) {
  check_views(plan, dq_out, dk_out, tables, dq.size(), dk.size(), kRopeQkBackward);
  rope_backward<T, Acc>(plan.q, dq_out, tables, dq);
  rope_backward<T, Acc>(plan.k, dk_out, tables, dk);
}

}  // namespace tandem::reference
