// SPDX-License-Identifier: Apache-2.0
/// @file reference/swiglu.hpp
/// @brief Reference SwiGLU, forward and backward (SPEC §6), as plain
///        per-element loops.
///
/// x `[rows, 2n]` → y `[rows, n]`. Row r holds a gate half g and an up half u
/// of n elements each: with gate_first, g = x[r, 0..n) and u = x[r, n..2n),
/// otherwise the reverse. `y = silu(g)·u` with `silu(g) = g·σ(g)` and
/// `σ(g) = 1 / (1 + exp(−g))`.
#pragma once

#include <cmath>
#include <complex>
#include <cstdint>
#include <span>

#include "tandem/reference/scalar.hpp"
#include "tandem/shape.hpp"
#include "tandem/swiglu.hpp"

namespace tandem::reference {

/// The logistic function `σ(g) = 1 / (1 + exp(−g))`, written with exp so it
/// also runs on std::complex (complex-step derivatives).
template <class Acc>
Acc swiglu_sigmoid(const Acc& g) {
  using std::exp;
  return Acc(1) / (Acc(1) + exp(-g));
}

/// SwiGLU forward. For every row r < rows and i < n, with
/// `g = x[r*2n + gate_offset + i]`, `u = x[r*2n + up_offset + i]`:
///
///     sigma = σ(g) = 1 / (1 + exp(−g))
///     silu  = g·sigma
///     out[r*n + i] = silu·u
///
/// @param plan a validated SwigluPlan (gate_offset 0 and up_offset n with
///             gate_first, the reverse otherwise)
/// @param x    `[rows, 2n]`
/// @param out  `[rows, n]`
/// @throws tandem::Error (before writing anything) when a view does not fit
template <class T, class Acc = accumulator_t<T>>
void swiglu_forward(const SwigluPlan& plan, std::span<const T> x, std::span<T> out) {
  require_size(x.size(), plan.in_size(), "x");
  require_size(out.size(), plan.out_size(), "out");
  const std::int64_t n = plan.n;
  for (std::int64_t r = 0; r < plan.rows; ++r) {
    for (std::int64_t i = 0; i < n; ++i) {
      const Acc g = static_cast<Acc>(x[r * 2 * n + plan.gate_offset() + i]);
      const Acc u = static_cast<Acc>(x[r * 2 * n + plan.up_offset() + i]);
      // sigma = 1 / (1 + exp(−g))
      const Acc sigma = swiglu_sigmoid(g);
      // silu = g·sigma
      const Acc silu = g * sigma;
      // y = silu·u
      out[r * n + i] = static_cast<T>(silu * u);
    }
  }
}

/// SwiGLU backward. For every row r < rows and i < n, with g, u as in the
/// forward and `dy = dy[r*n + i]`:
///
///     du = dy·silu(g)
///     dg = dy·u·σ(g)·(1 + g·(1 − σ(g)))
///
/// written to `dx[r*2n + up_offset + i]` and `dx[r*2n + gate_offset + i]`
/// (dx `[rows, 2n]` in the input's half order).
///
/// @param plan a validated SwigluPlan
/// @param x    the forward input `[rows, 2n]`
/// @param dy   gradient of out `[rows, n]`
/// @param dx   gradient of x `[rows, 2n]`
/// @throws tandem::Error (before writing anything) when a view does not fit
template <class T, class Acc = accumulator_t<T>>
void swiglu_backward(const SwigluPlan& plan, std::span<const T> x, std::span<const T> dy,
                     std::span<T> dx) {
  require_size(x.size(), plan.in_size(), "x");
  require_size(dy.size(), plan.out_size(), "dy");
  require_size(dx.size(), plan.in_size(), "dx");
  const std::int64_t n = plan.n;
  for (std::int64_t r = 0; r < plan.rows; ++r) {
    for (std::int64_t i = 0; i < n; ++i) {
      const Acc g = static_cast<Acc>(x[r * 2 * n + plan.gate_offset() + i]);
      const Acc u = static_cast<Acc>(x[r * 2 * n + plan.up_offset() + i]);
      const Acc sigma = swiglu_sigmoid(g);
      const Acc silu = g * sigma;
      const Acc dy_i = static_cast<Acc>(dy[r * n + i]);
      // y = silu·u
      const Acc du = dy_i * silu;
      const Acc dsilu = dy_i * u;
      // silu = g·sigma, sigma = σ(g), dσ/dg = σ(1 − σ)
      //   → dg = dsilu·(sigma + g·sigma·(1 − sigma)) = dsilu·sigma·(1 + g·(1 − sigma))
      const Acc dg = dsilu * sigma * (Acc(1) + g * (Acc(1) - sigma));
      dx[r * 2 * n + plan.gate_offset() + i] = static_cast<T>(dg);
      dx[r * 2 * n + plan.up_offset() + i] = static_cast<T>(du);
    }
  }
}

}  // namespace tandem::reference
