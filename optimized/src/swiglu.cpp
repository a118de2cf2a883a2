// SPDX-License-Identifier: Apache-2.0
// Optimized SwiGLU, forward and backward (SPEC §6).
//
// Agrees with tandem::reference::swiglu_forward / swiglu_backward
// (reference/include/tandem/reference/swiglu.hpp) within float rounding. The
// order of operations differs: the reference computes σ(g) = 1/(1 + exp(−g))
// and every product in double and rounds once at the end. Here everything is
// float, and σ is formed from e = exp(−|g|) ∈ [0, 1] (Highway's vector Exp,
// 1 ulp), which never overflows:
//
//     σ(|g|) = 1/(1 + e),   σ(g) = σ(|g|) for g >= 0,  e·σ(|g|) for g < 0
//
// so large |g| give σ = 0 or 1 exactly as the double formula rounds to, and a
// NaN gate stays NaN through silu = g·σ. Then, as in the reference,
//
//     forward:  y  = silu·u,  silu = g·σ
//     backward: du = dy·silu, dg = (dy·u)·σ·(1 + g·(1 − σ))
//
// where 1 − σ(g) = σ(−g) is formed from e as well (no cancellation for g ≫ 0).
//
// One OpenMP iteration per row (static schedule); within a row, vectors of i.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "swiglu.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "hwy/contrib/math/math-inl.h"
#include "simd-inl.h"

#ifndef TANDEM_OPTIMIZED_SWIGLU_ONCE
#define TANDEM_OPTIMIZED_SWIGLU_ONCE
#include <cstdint>

#include "entry_points.hpp"

namespace tandem::optimized::detail {
/// One SwiGLU call after validation; dy and dx are null for the forward.
struct SwigluArgs {
  const SwigluPlan* plan;
  const float* x;
  const float* dy;
  float* out;  ///< y [rows, n] (forward) or dx [rows, 2n] (backward)
  int threads;
};
}  // namespace tandem::optimized::detail
#endif

HWY_BEFORE_NAMESPACE();
namespace tandem::optimized::HWY_NAMESPACE {

/// σ(g) = 1/(1 + exp(−g)), from e = exp(−|g|) so that nothing overflows;
/// with `complement` also 1 − σ(g) = σ(−g), formed the same way rather than
/// by the subtraction, which would cancel for large g.
template <class D, class V>
HWY_INLINE V Sigmoid(D d, V g, V* complement = nullptr) {
  const V one = hn::Set(d, 1.0f);
  const V e = hn::Exp(d, hn::Neg(hn::Abs(g)));
  const V pos = hn::Div(one, hn::Add(one, e));  // σ(|g|)
  const V neg = hn::Mul(e, pos);                // σ(−|g|) = e/(1 + e)
  const auto g_nonneg = hn::Ge(g, hn::Zero(d));
  if (complement != nullptr) *complement = hn::IfThenElse(g_nonneg, neg, pos);
  return hn::IfThenElse(g_nonneg, pos, neg);
}

/// Runs body(i, n) over i = 0, N, 2N, ... < count with n = min(N, count − i)
/// lanes: the same body for full vectors and the last partial one.
template <class Body>
HWY_INLINE void ForVectors(std::int64_t count, std::int64_t N, const Body& body) {
  std::int64_t i = 0;
  for (; i + N <= count; i += N) body(i, N);
  if (i < count) body(i, count - i);
}

void SwigluForward(const detail::SwigluArgs& a) {
  const SwigluPlan& plan = *a.plan;
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(d));
  const std::int64_t n = plan.n;
  const std::int64_t g_off = plan.gate_offset(), u_off = plan.up_offset();
#pragma omp parallel for schedule(static) num_threads(a.threads)
  for (std::int64_t r = 0; r < plan.rows; ++r) {
    const float* g_row = a.x + r * 2 * n + g_off;
    const float* u_row = a.x + r * 2 * n + u_off;
    float* y_row = a.out + r * n;
    ForVectors(n, N, [&](std::int64_t i, std::int64_t lanes) {
      const bool full = lanes == N;
      const auto k = static_cast<std::size_t>(lanes);
      const V g = full ? hn::LoadU(d, g_row + i) : LoadN(d, g_row + i, k);
      const V u = full ? hn::LoadU(d, u_row + i) : LoadN(d, u_row + i, k);
      const V silu = hn::Mul(g, Sigmoid(d, g));  // silu = g·σ(g)
      const V y = hn::Mul(silu, u);              // y = silu·u
      full ? hn::StoreU(y, d, y_row + i) : StoreN(y, d, y_row + i, k);
    });
  }
}

void SwigluBackward(const detail::SwigluArgs& a) {
  const SwigluPlan& plan = *a.plan;
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(d));
  const std::int64_t n = plan.n;
  const std::int64_t g_off = plan.gate_offset(), u_off = plan.up_offset();
  const V one = hn::Set(d, 1.0f);
#pragma omp parallel for schedule(static) num_threads(a.threads)
  for (std::int64_t r = 0; r < plan.rows; ++r) {
    const float* g_row = a.x + r * 2 * n + g_off;
    const float* u_row = a.x + r * 2 * n + u_off;
    const float* dy_row = a.dy + r * n;
    float* dg_row = a.out + r * 2 * n + g_off;
    float* du_row = a.out + r * 2 * n + u_off;
    ForVectors(n, N, [&](std::int64_t i, std::int64_t lanes) {
      const bool full = lanes == N;
      const auto k = static_cast<std::size_t>(lanes);
      const V g = full ? hn::LoadU(d, g_row + i) : LoadN(d, g_row + i, k);
      const V u = full ? hn::LoadU(d, u_row + i) : LoadN(d, u_row + i, k);
      const V dy = full ? hn::LoadU(d, dy_row + i) : LoadN(d, dy_row + i, k);
      V one_minus_sigma;
      const V sigma = Sigmoid(d, g, &one_minus_sigma);
      const V silu = hn::Mul(g, sigma);
      const V du = hn::Mul(dy, silu);  // du = dy·silu
      // dg = (dy·u)·σ·(1 + g·(1 − σ))
      const V dg = hn::Mul(hn::Mul(hn::Mul(dy, u), sigma), hn::MulAdd(g, one_minus_sigma, one));
      if (full) {
        hn::StoreU(dg, d, dg_row + i);
        hn::StoreU(du, d, du_row + i);
      } else {
        StoreN(dg, d, dg_row + i, k);
        StoreN(du, d, du_row + i, k);
      }
    });
  }
}

}  // namespace tandem::optimized::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tandem::optimized {
HWY_EXPORT(SwigluForward);
HWY_EXPORT(SwigluBackward);

namespace detail {

void swiglu_forward(const SwigluPlan& plan, std::span<const float> x, std::span<float> out,
                    const Options& options) {
  require_size(x.size(), plan.in_size(), "x");
  require_size(out.size(), plan.out_size(), "out");
  HWY_DYNAMIC_DISPATCH(SwigluForward)
  ({&plan, x.data(), nullptr, out.data(), threads_of(options)});
}

void swiglu_backward(const SwigluPlan& plan, std::span<const float> x, std::span<const float> dy,
                     std::span<float> dx, const Options& options) {
  require_size(x.size(), plan.in_size(), "x");
  require_size(dy.size(), plan.out_size(), "dy");
  require_size(dx.size(), plan.in_size(), "dx");
  HWY_DYNAMIC_DISPATCH(SwigluBackward)
  ({&plan, x.data(), dy.data(), dx.data(), threads_of(options)});
}

}  // namespace detail
}  // namespace tandem::optimized
#endif  // HWY_ONCE
