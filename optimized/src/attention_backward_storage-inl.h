// SPDX-License-Identifier: Apache-2.0
// Per-target storage-type boundary of the optimized attention backward
// (SPEC §10.2): the gradients rounded to the storage type T once, at their
// store, from their float32 sums (the inputs are widened to float32 once at
// entry, by convert-inl.h's Widen; exact: every bf16 and f16 value is a
// float32). For T = float every function here is a plain copy. Included once per
// Highway target (the toggle guard below), after <hwy/highway.h>.
#if defined(TANDEM_OPTIMIZED_ATTENTION_BACKWARD_STORAGE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TANDEM_OPTIMIZED_ATTENTION_BACKWARD_STORAGE_INL_H_
#undef TANDEM_OPTIMIZED_ATTENTION_BACKWARD_STORAGE_INL_H_
#else
#define TANDEM_OPTIMIZED_ATTENTION_BACKWARD_STORAGE_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "convert-inl.h"
#include "simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace tandem::optimized::HWY_NAMESPACE::attn {

namespace hn = hwy::HWY_NAMESPACE;

/// dst[x] = RN_T(factor · src[x]) for x < n: one rounding of a float32 sum
/// (factor 1: the sum itself; for T = float a plain copy then).
template <class T>
void StoreRow(const float* src, std::int64_t n, float factor, T* dst) {
  if constexpr (std::is_same_v<T, float>) {
    if (factor == 1.0f) {
      std::copy_n(src, n, dst);
      return;
    }
  }
  const DF d;
  const std::int64_t N = Lanes();
  const VF f = hn::Set(d, factor);
  std::int64_t x = 0;
  for (; x + N <= n; x += N) StoreRounded<T>(d, hn::Mul(hn::LoadU(d, src + x), f), dst + x);
  if (x < n) {
    const auto m = static_cast<std::size_t>(n - x);
    const VF v = hn::Mul(LoadN(d, src + x, m), f);
    if constexpr (std::is_same_v<T, float>) {
      StoreN(v, d, dst + x, m);
    } else {
      StoreRoundedN<T>(d, v, dst + x, n - x);
    }
  }
}

/// dst[jj] = RN_T(col[jj · stride]) for jj < n: a column of a tile's
/// transposed buffer (dS of one row against a key block) into a row.
template <class T>
void StoreColumn(const float* col, std::int64_t stride, std::int64_t n, T* dst) {
  if constexpr (std::is_same_v<T, float>) {
    for (std::int64_t jj = 0; jj < n; ++jj) dst[jj] = col[jj * stride];
  } else {
    const DF d;
    const std::int64_t N = Lanes();
    HWY_ALIGN float buf[kMaxFloatLanes];
    for (std::int64_t j0 = 0; j0 < n; j0 += N) {
      const std::int64_t m = std::min(N, n - j0);
      for (std::int64_t i = 0; i < m; ++i) buf[i] = col[(j0 + i) * stride];
      StoreRoundedN<T>(d, hn::Load(d, buf), dst + j0, m);
    }
  }
}

/// RN_T(x) of a sum kept in double (dsinks, a broadcast dbias): rounded once,
/// from the double, never through float32 first.
template <class T>
T RoundSum(double x) {
  if constexpr (std::is_same_v<T, float>) {
    return static_cast<float>(x);
  } else {
    return T(x);
  }
}

}  // namespace tandem::optimized::HWY_NAMESPACE::attn
HWY_AFTER_NAMESPACE();

#endif  // toggle guard
