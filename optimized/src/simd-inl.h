// SPDX-License-Identifier: Apache-2.0
// Per-target helpers shared by every kernel: the float vector type and its
// lane count, partial-vector loads and stores that touch exactly the n
// elements they are given. Included once per Highway target (the toggle
// guard below), after <hwy/highway.h>.
//
// Why not MaskedLoad/BlendedStore: in Highway 1.0.3 the SSE4 and scalar
// MaskedLoad is an *aligned* full-vector Load (it may fault on an unaligned
// tail and reads past the end of the view), and the SSE4 BlendedStore rewrites
// the lanes it does not own, which would race with the thread writing the next
// row. LoadN/StoreN go through a small stack buffer instead, so every SIMD body
// is written once and serves full and partial vectors alike.

#if defined(TANDEM_OPTIMIZED_SIMD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TANDEM_OPTIMIZED_SIMD_INL_H_
#undef TANDEM_OPTIMIZED_SIMD_INL_H_
#else
#define TANDEM_OPTIMIZED_SIMD_INL_H_
#endif

#include <hwy/highway.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

HWY_BEFORE_NAMESPACE();
namespace tandem::optimized::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

/// Lanes of the widest float vector of any target: the size of tail buffers.
inline constexpr std::size_t kMaxFloatLanes = HWY_MAX_BYTES / sizeof(float);

/// The float vector of this target, its tag and its lane count.
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
inline std::int64_t Lanes() {
  return static_cast<std::int64_t>(hn::Lanes(DF()));
}
/// x rounded up to a multiple of m.
inline std::int64_t RoundUp(std::int64_t x, std::int64_t m) {
  return (x + m - 1) / m * m;
}

/// The first n elements of p in lanes 0..n−1 and zero above; reads exactly
/// p[0..n). n <= Lanes(d).
template <class D>
HWY_INLINE hn::Vec<D> LoadN(D d, const float* p, std::size_t n) {
  HWY_ALIGN float buf[kMaxFloatLanes] = {};
  std::memcpy(buf, p, n * sizeof(float));
  return hn::Load(d, buf);
}

/// Writes lanes 0..n−1 of v to p[0..n) and nothing else. n <= Lanes(d).
template <class D>
HWY_INLINE void StoreN(hn::Vec<D> v, D d, float* p, std::size_t n) {
  HWY_ALIGN float buf[kMaxFloatLanes];
  hn::Store(v, d, buf);
  std::memcpy(p, buf, n * sizeof(float));
}

}  // namespace tandem::optimized::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // toggle guard
