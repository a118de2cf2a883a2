// SPDX-License-Identifier: Apache-2.0
// Per-target loads of K and V rows in their stored element type (SPEC
// §10.1, §10.4), widened to float32 in registers: bf16 and f16 through
// LoadWide (convert-inl.h) or the processor's f16 conversion, int8 codes by sign extension, e4m3
// codes by bit arithmetic. Nothing is written back: the decode kernel (attention_decode_stored.cpp)
// multiplies the widened codes into its dot products and accumulators directly.
//
// e4m3 by bit arithmetic rather than a 256-entry table: a table needs a
// gather per vector (16 loads on AVX3, none at all on SSE4), while the code,
// sign-extended to 32 bits and shifted left by 20, holds its sign in bit 31
// and its 7 magnitude bits in float's exponent and fraction fields; masked
// and scaled by 2^(127 − 7) that gives every normal and subnormal value in
// three vector operations after the widening load (against nine from
// the zero-extended code); 0x7F (NaN) is caught by one compare of |value|.
// f16 goes through the processor's conversion (vcvtph2ps) on
// AVX2 and AVX3, which have it, and through LoadWide's bit arithmetic
// elsewhere (Highway's emulation on SSE4 maps inf and NaN to finite
// values). Included once per Highway target (the toggle guard below), after
// <hwy/highway.h>.
#if defined(TANDEM_OPTIMIZED_ATTENTION_DECODE_STORED_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TANDEM_OPTIMIZED_ATTENTION_DECODE_STORED_INL_H_
#undef TANDEM_OPTIMIZED_ATTENTION_DECODE_STORED_INL_H_
#else
#define TANDEM_OPTIMIZED_ATTENTION_DECODE_STORED_INL_H_
#endif

#include <hwy/highway.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "convert-inl.h"
#include "simd-inl.h"
#include "tandem/storage.hpp"

HWY_BEFORE_NAMESPACE();
namespace tandem::optimized::HWY_NAMESPACE {

using VI32 = hn::Vec<DI32>;

/// Bytes of one stored element: 1 for codes, 2 for bf16/f16.
template <class E>
inline constexpr bool kIsCode = std::is_same_v<E, std::int8_t> || std::is_same_v<E, float8_e4m3>;

/// The float32 values of e4m3 codes sign-extended into i32 lanes:
/// sign · 2^(e − 7) · 1.f (e > 0), sign · 2^−6 · 0.f (e = 0); 0x7F and 0xFF
/// are NaN (e4m3fn has no infinity). Exact: every e4m3 value is a float32.
HWY_INLINE VF WidenE4m3(DF d, VI32 c) {
  const DU32 du;
  // c << 20: bits 20..26 the magnitude, 27..31 copies of the sign
  const VU32 bits = hn::And(hn::BitCast(du, hn::ShiftLeft<20>(c)), hn::Set(du, 0x87F00000u));
  const VF value = hn::Mul(hn::BitCast(d, bits), hn::Set(d, 0x1p120f));
  // magnitude 0x7F: 1.875 · 2^8 = 480, above the largest finite code (448)
  const auto nan = hn::Eq(hn::Abs(value), hn::Set(d, 480.0f));
  return hn::IfThenElse(nan, hn::Set(d, std::numeric_limits<float>::quiet_NaN()), value);
}

/// A full vector of stored elements from p as floats: the values of bf16
/// and f16, the codes c of int8 and e4m3 (the scale is applied by the
/// caller, SPEC §10.4).
template <class E>
HWY_INLINE VF LoadStored(DF d, const E* p) {
  if constexpr (std::is_same_v<E, std::int8_t>) {
    const hn::Rebind<std::int8_t, DF> d8;
    return hn::ConvertTo(d, hn::PromoteTo(DI32(), hn::LoadU(d8, p)));
  } else if constexpr (std::is_same_v<E, float8_e4m3>) {
    const hn::Rebind<std::int8_t, DF> d8;
    return WidenE4m3(d,
                     hn::PromoteTo(DI32(), hn::LoadU(d8, reinterpret_cast<const std::int8_t*>(p))));
#if HWY_TARGET <= HWY_AVX2
  } else if constexpr (std::is_same_v<E, float16>) {
    const hn::Rebind<hwy::float16_t, DF> dh;
    return hn::PromoteTo(d, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p)));
#endif
  } else {
    return LoadWide<E>(d, p);
  }
}

/// Elements p[0 .. n) as floats (n <= Lanes(); the rest 0); reads exactly
/// those.
template <class E>
HWY_INLINE VF LoadStoredN(DF d, const E* p, std::int64_t n) {
  if constexpr (kIsCode<E>) {
    HWY_ALIGN E buf[kMaxFloatLanes] = {};
    std::memcpy(buf, p, static_cast<std::size_t>(n));
    return LoadStored<E>(d, buf);
  } else {
    return LoadWideN<E>(d, p, n);
  }
}

}  // namespace tandem::optimized::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // toggle guard
