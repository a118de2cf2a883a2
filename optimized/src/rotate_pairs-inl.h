// SPDX-License-Identifier: Apache-2.0
// The pair rotation of RoPE and axial RoPE (SPEC §4, §5) at storage type T
// (float, bfloat16, float16; SPEC §10.2): the pairs are widened to float on
// load, rotated in float and rounded once to T at the store, so that a bf16
// or f16 output is RN_T of the float rotation of the widened inputs, bit for
// bit. Included once per Highway target (the toggle guard below), after
// <hwy/highway.h>.
#if defined(TANDEM_OPTIMIZED_ROTATE_PAIRS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TANDEM_OPTIMIZED_ROTATE_PAIRS_INL_H_
#undef TANDEM_OPTIMIZED_ROTATE_PAIRS_INL_H_
#else
#define TANDEM_OPTIMIZED_ROTATE_PAIRS_INL_H_
#endif

#include <hwy/highway.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "convert-inl.h"
#include "simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace tandem::optimized::HWY_NAMESPACE {

/// Pairs i .. i+n of x as two float vectors (x0, x1), n <= Lanes() (the
/// lanes above n are 0): (x[i], x[i+m]) for the halves layout (NeoX),
/// (x[2i], x[2i+1]) with kInterleaved (GPT-J, axial RoPE).
template <bool kInterleaved, class T>
HWY_INLINE void LoadPairs(DF d, const T* x, std::int64_t m, std::int64_t i, std::int64_t n, VF& x0,
                          VF& x1) {
  const bool full = n == Lanes();
  if constexpr (kInterleaved) {
    if (full) {
      LoadWideInterleaved2(d, x + 2 * i, x0, x1);
    } else {
      HWY_ALIGN T buf[2 * kMaxFloatLanes] = {};
      std::memcpy(buf, x + 2 * i, static_cast<std::size_t>(2 * n) * sizeof(T));
      LoadWideInterleaved2(d, buf, x0, x1);
    }
  } else {
    x0 = full ? LoadWide(d, x + i) : LoadWideN(d, x + i, n);
    x1 = full ? LoadWide(d, x + m + i) : LoadWideN(d, x + m + i, n);
  }
}

/// RN_T of lanes 0 .. n of (y0, y1) stored as pairs i .. i+n of y (the
/// inverse of LoadPairs); nothing else is written.
template <bool kInterleaved, class T>
HWY_INLINE void StorePairs(DF d, VF y0, VF y1, std::int64_t m, std::int64_t i, std::int64_t n,
                           T* y) {
  const bool full = n == Lanes();
  if constexpr (kInterleaved) {
    if (full) {
      StoreRoundedInterleaved2(d, y0, y1, y + 2 * i);
    } else {
      HWY_ALIGN T buf[2 * kMaxFloatLanes];
      StoreRoundedInterleaved2(d, y0, y1, buf);
      std::memcpy(y + 2 * i, buf, static_cast<std::size_t>(2 * n) * sizeof(T));
    }
  } else if (full) {
    StoreRounded(d, y0, y + i);
    StoreRounded(d, y1, y + m + i);
  } else {
    StoreRoundedN(d, y0, y + i, n);
    StoreRoundedN(d, y1, y + m + i, n);
  }
}

/// The rotation of m pairs by angles with cosines c[0..m) and sines s[0..m):
///
///     y0[i] = RN_T(x0[i]·c[i] − x1[i]·s[i])
///     y1[i] = RN_T(x1[i]·c[i] + x0[i]·s[i])
///
/// x, y of storage type T; the tables of type C (T for RoPE's tables, float
/// for axial RoPE's own). With kTranspose the sines are negated (rotation by
/// −angle, the transpose), which is exact, so the backward rounds like the
/// forward. Pair i is (x[i], x[i+m]) for the halves layout (NeoX) and
/// (x[2i], x[2i+1]) with kInterleaved (GPT-J, axial RoPE). x and y may be
/// the same array (each vector is loaded before it is stored).
///
/// Order of operations: each output is one fused multiply-add on one rounded
/// product, `fma(x0, c, −(x1·s))`, in float on the widened values, then one
/// rounding to T (none for float); the reference forms both products and
/// their sum in double and rounds once, so the two agree to ~1 ulp of float
/// before the rounding to T.
template <bool kInterleaved, bool kTranspose, class T, class C>
HWY_INLINE void RotatePairs(const T* x, const C* c, const C* s, std::int64_t m, T* y) {
  const DF d;
  const std::int64_t N = Lanes();
  for (std::int64_t i = 0; i < m; i += N) {
    const std::int64_t n = m - i < N ? m - i : N;
    VF x0, x1;
    LoadPairs<kInterleaved>(d, x, m, i, n, x0, x1);
    const VF cv = n == N ? LoadWide(d, c + i) : LoadWideN(d, c + i, n);
    VF sv = n == N ? LoadWide(d, s + i) : LoadWideN(d, s + i, n);
    if constexpr (kTranspose) sv = hn::Neg(sv);
    const VF y0 = hn::MulSub(x0, cv, hn::Mul(x1, sv));  // x0·c − x1·s
    const VF y1 = hn::MulAdd(x1, cv, hn::Mul(x0, sv));  // x1·c + x0·s
    StorePairs<kInterleaved>(d, y0, y1, m, i, n, y);
  }
}

}  // namespace tandem::optimized::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // toggle guard
