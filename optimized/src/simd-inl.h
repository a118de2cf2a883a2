// SPDX-License-Identifier: Apache-2.0
// Per-target helpers shared by every kernel: the float vector type and its
// lane count, partial-vector loads and stores that touch exactly the n
// elements they are given, and the pair rotation used by RoPE and axial RoPE. Included once per
// Highway target (the toggle guard below), after <hwy/highway.h>.
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

/// The rotation of m pairs by angles with cosines c[0..m) and sines s[0..m):
///
///     y0[i] = x0[i]·c[i] − x1[i]·s[i]
///     y1[i] = x1[i]·c[i] + x0[i]·s[i]
///
/// With kTranspose the sines are negated (rotation by −angle, the transpose),
/// which is exact, so the backward rounds like the forward. Pair i is
/// (x[i], x[i+m]) for the halves layout (NeoX) and (x[2i], x[2i+1]) with
/// kInterleaved (GPT-J, axial RoPE), deinterleaved by LoadInterleaved2.
/// x and y may be the same array (each vector is loaded before it is stored).
///
/// Order of operations: each output is one fused multiply-add on one rounded
/// product, `fma(x0, c, −(x1·s))`, in float; the reference forms both products
/// and their sum in double and rounds once, so the two agree to ~1 ulp.
template <bool kInterleaved, bool kTranspose>
HWY_INLINE void RotatePairs(const float* x, const float* c, const float* s, std::int64_t m,
                            float* y) {
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(d));
  const auto rotate = [&](V x0, V x1, V cv, V sv, V& y0, V& y1) {
    if constexpr (kTranspose) sv = hn::Neg(sv);
    y0 = hn::MulSub(x0, cv, hn::Mul(x1, sv));  // x0·c − x1·s
    y1 = hn::MulAdd(x1, cv, hn::Mul(x0, sv));  // x1·c + x0·s
  };
  std::int64_t i = 0;
  for (; i + N <= m; i += N) {
    V x0, x1, y0, y1;
    if constexpr (kInterleaved) {
      hn::LoadInterleaved2(d, x + 2 * i, x0, x1);
    } else {
      x0 = hn::LoadU(d, x + i);
      x1 = hn::LoadU(d, x + m + i);
    }
    rotate(x0, x1, hn::LoadU(d, c + i), hn::LoadU(d, s + i), y0, y1);
    if constexpr (kInterleaved) {
      hn::StoreInterleaved2(y0, y1, d, y + 2 * i);
    } else {
      hn::StoreU(y0, d, y + i);
      hn::StoreU(y1, d, y + m + i);
    }
  }
  if (i < m) {  // the last m − i < N pairs, through the same body
    const std::size_t n = static_cast<std::size_t>(m - i);
    V x0, x1, y0, y1;
    if constexpr (kInterleaved) {
      HWY_ALIGN float buf[2 * kMaxFloatLanes] = {};
      std::memcpy(buf, x + 2 * i, 2 * n * sizeof(float));
      hn::LoadInterleaved2(d, buf, x0, x1);
    } else {
      x0 = LoadN(d, x + i, n);
      x1 = LoadN(d, x + m + i, n);
    }
    rotate(x0, x1, LoadN(d, c + i, n), LoadN(d, s + i, n), y0, y1);
    if constexpr (kInterleaved) {
      HWY_ALIGN float buf[2 * kMaxFloatLanes];
      hn::StoreInterleaved2(y0, y1, d, buf);
      std::memcpy(y + 2 * i, buf, 2 * n * sizeof(float));
    } else {
      StoreN(y0, d, y + i, n);
      StoreN(y1, d, y + m + i, n);
    }
  }
}

}  // namespace tandem::optimized::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // toggle guard
