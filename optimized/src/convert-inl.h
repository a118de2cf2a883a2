// SPDX-License-Identifier: Apache-2.0
// Per-target conversions between float32 vectors and the storage types of
// SPEC §10.1 (float, tandem::bfloat16, tandem::float16): widening loads,
// rounding stores and the round trip RN_T that marks a rounding point of
// SPEC §10.2 inside a tile. They give the bits of tandem/storage.hpp's
// scalar conversions (round to nearest, ties to even; overflow to ±inf; NaN
// stays NaN), checked against them for every bf16 and f16 value and for
// random floats (tests/test_optimized_convert.cpp).
//
// Why not hn::DemoteTo: in Highway 1.0.3 the bf16 DemoteTo of every x86
// target keeps the top 16 bits (truncation), and the f16 DemoteTo of SSE4
// and scalar truncates too and never gives inf. Rounding is done here with
// integer arithmetic, the same on every target; the f16 load is done the
// same way so that inf and NaN widen correctly without F16C. Last, whole
// arrays widened or rounded (WidenRange, NarrowRange), and the same on
// OpenMP threads (Widen, Narrow): the storage boundary of the forward and
// the backward (SPEC §10.2). Included once per Highway target (the toggle
// guard below), after <hwy/highway.h>.
#if defined(TANDEM_OPTIMIZED_CONVERT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TANDEM_OPTIMIZED_CONVERT_INL_H_
#undef TANDEM_OPTIMIZED_CONVERT_INL_H_
#else
#define TANDEM_OPTIMIZED_CONVERT_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "simd-inl.h"
#include "tandem/storage.hpp"

HWY_BEFORE_NAMESPACE();
namespace tandem::optimized::HWY_NAMESPACE {

using DU32 = hn::RebindToUnsigned<DF>;
using DI32 = hn::RebindToSigned<DF>;
using VU32 = hn::Vec<DU32>;
/// 16-bit lanes, as many as DF has floats: the storage of one float vector.
using DU16 = hn::Rebind<std::uint16_t, DF>;

/// The float32 bits of bf16 or f16 values (held in the low 16 bits of each
/// u32 lane) — exact: every value of both types is a float32.
template <class T>
HWY_INLINE VF WidenBits(DF d, VU32 h) {
  const DU32 du;
  if constexpr (std::is_same_v<T, bfloat16>) {
    return hn::BitCast(d, hn::ShiftLeft<16>(h));
  } else {
    static_assert(std::is_same_v<T, float16>);
    // |x| of a normal or subnormal f16: its exponent and fraction bits moved
    // to float's, then scaled by 2^(127 − 15) (exact); exponent 31 is inf/NaN.
    const DI32 di;
    const VU32 sign = hn::ShiftLeft<16>(hn::And(h, hn::Set(du, 0x8000u)));
    const VU32 mag = hn::ShiftLeft<13>(hn::And(h, hn::Set(du, 0x7FFFu)));
    const VF scaled = hn::Mul(hn::BitCast(d, mag), hn::Set(d, 0x1p112f));
    const auto special =
        hn::RebindMask(du, hn::Gt(hn::BitCast(di, mag), hn::Set(di, (0x7C00 << 13) - 1)));
    const VU32 inf_nan = hn::Or(mag, hn::Set(du, 0x7F800000u));
    const VU32 bits = hn::IfThenElse(special, inf_nan, hn::BitCast(du, scaled));
    return hn::BitCast(d, hn::Or(bits, sign));
  }
}

/// RN_T(v) as the bits of T in the low 16 bits of each u32 lane.
template <class T>
HWY_INLINE VU32 RoundBits(DF d, VF v) {
  const DU32 du;
  const VU32 bits = hn::BitCast(du, v);
  const VU32 sign = hn::And(bits, hn::Set(du, 0x80000000u));
  const VU32 mag = hn::Xor(bits, sign);
  const DI32 di;  // magnitudes are below 2^31: compared as signed
  const auto nan = hn::RebindMask(du, hn::Gt(hn::BitCast(di, mag), hn::Set(di, 0x7F800000)));
  if constexpr (std::is_same_v<T, bfloat16>) {
    // add half an ulp less one, plus the kept lsb (ties to even); inf stays inf
    const VU32 lsb = hn::And(hn::ShiftRight<16>(bits), hn::Set(du, 1u));
    const VU32 r = hn::ShiftRight<16>(hn::Add(bits, hn::Add(hn::Set(du, 0x7FFFu), lsb)));
    const VU32 quiet = hn::Or(hn::ShiftRight<16>(bits), hn::Set(du, 0x0040u));
    return hn::IfThenElse(nan, quiet, r);
  } else {
    static_assert(std::is_same_v<T, float16>);
    (void)d;
    const VU32 s16 = hn::ShiftRight<16>(sign);
    // normal results: rebias the exponent, round the 13 dropped bits to even
    // (a carry into the exponent is right, up to inf at 65520)
    const VU32 odd = hn::And(hn::ShiftRight<13>(mag), hn::Set(du, 1u));
    const VU32 rebias = hn::Sub(mag, hn::Set(du, (127u - 15u) << 23));
    const VU32 normal = hn::ShiftRight<13>(hn::Add(rebias, hn::Add(hn::Set(du, 0xFFFu), odd)));
    // below 2^−14: the float sum |x| + 0.5 rounds |x| to a multiple of 2^−24
    // (ties to even, by the processor), whose low bits are the f16 bits
    const VF half = hn::Set(d, 0.5f);
    const VU32 sub =
        hn::Sub(hn::BitCast(du, hn::Add(hn::BitCast(d, mag), half)), hn::BitCast(du, half));
    const auto tiny = hn::RebindMask(du, hn::Lt(hn::BitCast(di, mag), hn::Set(di, 0x38800000)));
    // >= 65536: inf (or NaN)
    const auto big = hn::RebindMask(du, hn::Gt(hn::BitCast(di, mag), hn::Set(di, 0x47800000 - 1)));
    VU32 r = hn::IfThenElse(tiny, sub, normal);
    r = hn::IfThenElse(big, hn::Set(du, 0x7C00u), r);
    r = hn::IfThenElse(nan, hn::Set(du, 0x7E00u), r);
    return hn::Or(r, s16);
  }
}

/// Lanes p[0 .. n) of storage type T as floats (n <= Lanes(); the rest 0).
template <class T>
HWY_INLINE VF LoadWideN(DF d, const T* p, std::int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    return LoadN(d, p, static_cast<std::size_t>(n));
  } else {
    const DU32 du;
    HWY_ALIGN std::uint32_t buf[kMaxFloatLanes] = {};
    for (std::int64_t i = 0; i < n; ++i) buf[i] = p[i].bits;
    return WidenBits<T>(d, hn::Load(du, buf));
  }
}

/// A full vector of storage type T from p as floats.
template <class T>
HWY_INLINE VF LoadWide(DF d, const T* p) {
  if constexpr (std::is_same_v<T, float>) {
    return hn::LoadU(d, p);
  } else {
    const DU32 du;
    const DU16 du16;
    const auto h = hn::LoadU(du16, reinterpret_cast<const std::uint16_t*>(p));
    return WidenBits<T>(d, hn::PromoteTo(du, h));
  }
}

/// RN_T(v) stored to p[0 .. Lanes()).
template <class T>
HWY_INLINE void StoreRounded(DF d, VF v, T* p) {
  if constexpr (std::is_same_v<T, float>) {
    hn::StoreU(v, d, p);
  } else {
    const DU16 du16;
    const DI32 di;
    hn::StoreU(hn::DemoteTo(du16, hn::BitCast(di, RoundBits<T>(d, v))), du16,
               reinterpret_cast<std::uint16_t*>(p));
  }
}

/// RN_T(v) stored to p[0 .. n) (n <= Lanes()); nothing else is written.
template <class T>
HWY_INLINE void StoreRoundedN(DF d, VF v, T* p, std::int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    StoreN(v, d, p, static_cast<std::size_t>(n));
  } else {
    const DU32 du;
    HWY_ALIGN std::uint32_t buf[kMaxFloatLanes] = {};  // (lanes above Lanes() are never read)
    hn::Store(RoundBits<T>(d, v), du, buf);
    for (std::int64_t i = 0; i < n; ++i) p[i].bits = static_cast<std::uint16_t>(buf[i]);
  }
}

/// Pairs (p[2i], p[2i+1]), i < Lanes(), of storage type T as two float
/// vectors x0[i] = p[2i], x1[i] = p[2i+1] (hn::LoadInterleaved2 for float).
/// For bf16 and f16 each pair is one little-endian u32 lane: p[2i] in its
/// low 16 bits, p[2i+1] in its high 16 bits.
template <class T>
HWY_INLINE void LoadWideInterleaved2(DF d, const T* p, VF& x0, VF& x1) {
  if constexpr (std::is_same_v<T, float>) {
    hn::LoadInterleaved2(d, p, x0, x1);
  } else {
    static_assert(std::endian::native == std::endian::little);
    const DU32 du;
    const VU32 pairs = hn::LoadU(du, reinterpret_cast<const std::uint32_t*>(p));
    x0 = WidenBits<T>(d, hn::And(pairs, hn::Set(du, 0xFFFFu)));
    x1 = WidenBits<T>(d, hn::ShiftRight<16>(pairs));
  }
}

/// RN_T(y0[i]), RN_T(y1[i]) stored to p[2i], p[2i+1], i < Lanes() (the
/// inverse of LoadWideInterleaved2; hn::StoreInterleaved2 for float).
template <class T>
HWY_INLINE void StoreRoundedInterleaved2(DF d, VF y0, VF y1, T* p) {
  if constexpr (std::is_same_v<T, float>) {
    hn::StoreInterleaved2(y0, y1, d, p);
  } else {
    const DU32 du;
    const VU32 pairs = hn::Or(RoundBits<T>(d, y0), hn::ShiftLeft<16>(RoundBits<T>(d, y1)));
    hn::StoreU(pairs, du, reinterpret_cast<std::uint32_t*>(p));
  }
}

/// RN_T(v) as floats: a rounding point of SPEC §10.2 inside a tile (the
/// weights before P·V, dX before dQ and dK); v itself for float.
template <class T>
HWY_INLINE VF RoundAs(DF d, VF v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    return WidenBits<T>(d, RoundBits<T>(d, v));
  }
}

/// dst[0 .. n) = src[0 .. n) as float32, exactly (LoadWide<T>; SPEC §10.1).
template <class T>
void WidenRange(const T* src, std::int64_t n, float* dst) {
  const DF d;
  const std::int64_t N = Lanes();
  std::int64_t x = 0;
  for (; x + N <= n; x += N) hn::StoreU(LoadWide<T>(d, src + x), d, dst + x);
  if (x < n) StoreN(LoadWideN<T>(d, src + x, n - x), d, dst + x, static_cast<std::size_t>(n - x));
}

/// dst[0 .. n) = RN_T(src[0 .. n)) (StoreRounded<T>; a copy for float).
template <class T>
void NarrowRange(const float* src, std::int64_t n, T* dst) {
  const DF d;
  const std::int64_t N = Lanes();
  std::int64_t x = 0;
  for (; x + N <= n; x += N) StoreRounded<T>(d, hn::LoadU(d, src + x), dst + x);
  if (x < n)
    StoreRoundedN<T>(d, LoadN(d, src + x, static_cast<std::size_t>(n - x)), dst + x, n - x);
}

/// Elements per task of Widen and Narrow: whole vectors on every target,
/// and enough that a task outweighs its scheduling.
inline constexpr std::int64_t kConvertChunk = 1 << 14;

/// fn(i0, m) for the chunks [i0, i0 + m) of kConvertChunk elements of
/// [0, n), on at most `threads` OpenMP threads. Each element is converted
/// alone, so the result does not depend on the thread count.
template <class Fn>
void ForEachConvertChunk(std::int64_t n, int threads, const Fn& fn) {
  const std::int64_t chunks = (n + kConvertChunk - 1) / kConvertChunk;
  const int nt =
      static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(threads, chunks)));
#pragma omp parallel for num_threads(nt) schedule(static)
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::int64_t i0 = c * kConvertChunk;
    fn(i0, std::min(kConvertChunk, n - i0));
  }
}

/// dst[0 .. n) = src[0 .. n) as float32 (WidenRange), on `threads` threads.
template <class T>
void Widen(const T* src, std::int64_t n, float* dst, int threads) {
  ForEachConvertChunk(
      n, threads, [&](std::int64_t i0, std::int64_t m) { WidenRange<T>(src + i0, m, dst + i0); });
}

/// dst[0 .. n) = RN_T(src[0 .. n)) (NarrowRange), on `threads` threads.
template <class T>
void Narrow(const float* src, std::int64_t n, T* dst, int threads) {
  ForEachConvertChunk(
      n, threads, [&](std::int64_t i0, std::int64_t m) { NarrowRange<T>(src + i0, m, dst + i0); });
}

}  // namespace tandem::optimized::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // toggle guard
