// SPDX-License-Identifier: Apache-2.0
// Optimized SwiGLU, forward and backward (SPEC §6).
//
// Agrees with tandem::reference::swiglu_forward / swiglu_backward
// (reference/include/tandem/reference/swiglu.hpp) within float rounding, at
// every storage type T (float, bfloat16, float16: x, dy, the outputs). A
// bf16 or f16 call widens its inputs to float exactly, computes as the float
// call does and rounds each output once to T (SPEC §10.2): its outputs are
// RN_T of the float call's on the widened inputs, bit for bit
// (tests/test_optimized_storage_ops.cpp). The order of operations differs:
// the reference computes σ(g) = 1/(1 + exp(−g)) and every product in double
// and rounds once at the end. Here everything is float, and σ is formed
// from e = exp(−|g|) ∈ [0, 1] (Highway's vector Exp, 1 ulp), which never
// overflows:
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

#include "convert-inl.h"
#include "hwy/contrib/math/math-inl.h"
#include "simd-inl.h"

#ifndef TANDEM_OPTIMIZED_SWIGLU_ONCE
#define TANDEM_OPTIMIZED_SWIGLU_ONCE
#include <cstdint>
#include <type_traits>

#include "entry_points.hpp"

namespace tandem::optimized::detail {
/// One SwiGLU call after validation; dy is null for the forward.
template <class T>
struct SwigluArgs {
  const SwigluPlan* plan;
  const T* x;
  const T* dy;
  T* out;  ///< y [rows, n] (forward) or dx [rows, 2n] (backward)
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

/// n lanes of p (n <= Lanes()) widened to float; the rest 0.
template <class T>
HWY_INLINE VF LoadLanes(DF d, const T* p, std::int64_t n) {
  return n == Lanes() ? LoadWide(d, p) : LoadWideN(d, p, n);
}

/// RN_T of n lanes of v (n <= Lanes()) stored to p[0 .. n).
template <class T>
HWY_INLINE void StoreLanes(DF d, VF v, T* p, std::int64_t n) {
  n == Lanes() ? StoreRounded(d, v, p) : StoreRoundedN(d, v, p, n);
}

template <class T>
void SwigluForward(const detail::SwigluArgs<T>& a) {
  const SwigluPlan& plan = *a.plan;
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(d));
  const std::int64_t n = plan.n;
  const std::int64_t g_off = plan.gate_offset(), u_off = plan.up_offset();
#pragma omp parallel for schedule(static) num_threads(a.threads)
  for (std::int64_t r = 0; r < plan.rows; ++r) {
    const T* g_row = a.x + r * 2 * n + g_off;
    const T* u_row = a.x + r * 2 * n + u_off;
    T* y_row = a.out + r * n;
    ForVectors(n, N, [&](std::int64_t i, std::int64_t lanes) {
      const V g = LoadLanes(d, g_row + i, lanes);
      const V u = LoadLanes(d, u_row + i, lanes);
      const V silu = hn::Mul(g, Sigmoid(d, g));  // silu = g·σ(g)
      const V y = hn::Mul(silu, u);              // y = silu·u
      StoreLanes(d, y, y_row + i, lanes);
    });
  }
}

template <class T>
void SwigluBackward(const detail::SwigluArgs<T>& a) {
  const SwigluPlan& plan = *a.plan;
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(d));
  const std::int64_t n = plan.n;
  const std::int64_t g_off = plan.gate_offset(), u_off = plan.up_offset();
  const V one = hn::Set(d, 1.0f);
#pragma omp parallel for schedule(static) num_threads(a.threads)
  for (std::int64_t r = 0; r < plan.rows; ++r) {
    const T* g_row = a.x + r * 2 * n + g_off;
    const T* u_row = a.x + r * 2 * n + u_off;
    const T* dy_row = a.dy + r * n;
    T* dg_row = a.out + r * 2 * n + g_off;
    T* du_row = a.out + r * 2 * n + u_off;
    ForVectors(n, N, [&](std::int64_t i, std::int64_t lanes) {
      const V g = LoadLanes(d, g_row + i, lanes);
      const V u = LoadLanes(d, u_row + i, lanes);
      const V dy = LoadLanes(d, dy_row + i, lanes);
      V one_minus_sigma;
      const V sigma = Sigmoid(d, g, &one_minus_sigma);
      const V silu = hn::Mul(g, sigma);
      const V du = hn::Mul(dy, silu);  // du = dy·silu
      // dg = (dy·u)·σ·(1 + g·(1 − σ))
      const V dg = hn::Mul(hn::Mul(hn::Mul(dy, u), sigma), hn::MulAdd(g, one_minus_sigma, one));
      StoreLanes(d, dg, dg_row + i, lanes);
      StoreLanes(d, du, du_row + i, lanes);
    });
  }
}

///@{
/// SwigluForward and SwigluBackward at each storage type, one exported
/// function per type.
void SwigluForwardF32(const detail::SwigluArgs<float>& a) {
  SwigluForward(a);
}
void SwigluForwardBF16(const detail::SwigluArgs<bfloat16>& a) {
  SwigluForward(a);
}
void SwigluForwardF16(const detail::SwigluArgs<float16>& a) {
  SwigluForward(a);
}
void SwigluBackwardF32(const detail::SwigluArgs<float>& a) {
  SwigluBackward(a);
}
void SwigluBackwardBF16(const detail::SwigluArgs<bfloat16>& a) {
  SwigluBackward(a);
}
void SwigluBackwardF16(const detail::SwigluArgs<float16>& a) {
  SwigluBackward(a);
}
///@}

}  // namespace tandem::optimized::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tandem::optimized {
HWY_EXPORT(SwigluForwardF32);
HWY_EXPORT(SwigluForwardBF16);
HWY_EXPORT(SwigluForwardF16);
HWY_EXPORT(SwigluBackwardF32);
HWY_EXPORT(SwigluBackwardBF16);
HWY_EXPORT(SwigluBackwardF16);

namespace detail {

template <class T>
void swiglu_forward(const SwigluPlan& plan, std::span<const T> x, std::span<T> out,
                    const Options& options) {
  require_size(x.size(), plan.in_size(), "x");
  require_size(out.size(), plan.out_size(), "out");
  const SwigluArgs<T> a{&plan, x.data(), nullptr, out.data(), threads_of(options)};
  if constexpr (std::is_same_v<T, float>) {
    HWY_DYNAMIC_DISPATCH(SwigluForwardF32)(a);
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    HWY_DYNAMIC_DISPATCH(SwigluForwardBF16)(a);
  } else {
    static_assert(std::is_same_v<T, float16>);
    HWY_DYNAMIC_DISPATCH(SwigluForwardF16)(a);
  }
}

template <class T>
void swiglu_backward(const SwigluPlan& plan, std::span<const T> x, std::span<const T> dy,
                     std::span<T> dx, const Options& options) {
  require_size(x.size(), plan.in_size(), "x");
  require_size(dy.size(), plan.out_size(), "dy");
  require_size(dx.size(), plan.in_size(), "dx");
  const SwigluArgs<T> a{&plan, x.data(), dy.data(), dx.data(), threads_of(options)};
  if constexpr (std::is_same_v<T, float>) {
    HWY_DYNAMIC_DISPATCH(SwigluBackwardF32)(a);
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    HWY_DYNAMIC_DISPATCH(SwigluBackwardBF16)(a);
  } else {
    static_assert(std::is_same_v<T, float16>);
    HWY_DYNAMIC_DISPATCH(SwigluBackwardF16)(a);
  }
}

template void swiglu_forward(const SwigluPlan&, std::span<const float>, std::span<float>,
                             const Options&);
template void swiglu_backward(const SwigluPlan&, std::span<const float>, std::span<const float>,
                              std::span<float>, const Options&);
template void swiglu_forward(const SwigluPlan&, std::span<const bfloat16>, std::span<bfloat16>,
                             const Options&);
template void swiglu_backward(const SwigluPlan&, std::span<const bfloat16>,
                              std::span<const bfloat16>, std::span<bfloat16>, const Options&);
template void swiglu_forward(const SwigluPlan&, std::span<const float16>, std::span<float16>,
                             const Options&);
template void swiglu_backward(const SwigluPlan&, std::span<const float16>, std::span<const float16>,
                              std::span<float16>, const Options&);

}  // namespace detail
}  // namespace tandem::optimized
#endif  // HWY_ONCE
