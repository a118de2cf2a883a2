// SPDX-License-Identifier: Apache-2.0
/// @file storage.hpp
/// @brief The storage types of tandem's tensors besides float32 and float64:
///        bfloat16, float16 and the 8-bit codes of a quantized KV cache, with
///        the exact conversions that define them (SPEC §10.1).
///
/// A storage type is only a way to hold a number: every kernel reads it
/// exactly (each value of these types is a float32), computes in float32 or
/// wider, and rounds to it only at the points SPEC §10.2 names. Rounding is
/// always to nearest, ties to even, as the processors' conversion
/// instructions do: RN_T(x) below, written once here and used by the
/// reference; a backend's vector conversions must give the same bits.
#pragma once

#include <cmath>
#include <complex>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string_view>
#include <type_traits>

namespace tandem {

/// The element types a tensor of a tandem call can have (SPEC §10.1).
enum class DType {
  f32,   ///< IEEE binary32
  f64,   ///< IEEE binary64 (the reference only)
  bf16,  ///< bfloat16: 8 exponent bits, 7 fraction bits (the top half of an f32)
  f16,   ///< IEEE binary16: 5 exponent bits, 10 fraction bits
  int8,  ///< two's complement int8 codes of a quantized KV cache (SPEC §10.4)
  e4m3,  ///< OCP float8 e4m3fn codes of a quantized KV cache: 4 exponent, 3 fraction bits
};

/// "f32", "f64", "bf16", "f16", "int8", "e4m3".
constexpr std::string_view to_string(DType t) {
  switch (t) {
    case DType::f32:
      return "f32";
    case DType::f64:
      return "f64";
    case DType::bf16:
      return "bf16";
    case DType::f16:
      return "f16";
    case DType::int8:
      return "int8";
    case DType::e4m3:
      return "e4m3";
  }
  return "?";
}

namespace detail {

/// A binary floating-point format narrower than binary32: `fraction` stored
/// fraction bits, smallest normal exponent `min_exp` (2^min_exp), largest
/// finite value `max_finite`; `has_inf` false means overflow saturates to
/// ±max_finite (only e4m3, whose codes have no infinity) instead of ±inf.
struct Format {
  int fraction;
  int min_exp;
  double max_finite;
  bool has_inf;
};
inline constexpr Format kBf16{7, -126, 0x1.fep127, true};
inline constexpr Format kF16{10, -14, 65504.0, true};
inline constexpr Format kE4m3{3, -6, 448.0, false};

/// RN_F(x): x rounded to the nearest value of format F, ties to even, from
/// the exact value x (no double rounding through float); subnormals kept;
/// NaN stays NaN; beyond the largest finite value: ±inf, or ±max_finite for
/// a format without infinity.
inline double round_to(double x, const Format& f) {
  if (!std::isfinite(x) || x == 0.0)
    return f.has_inf || !std::isinf(x) ? x : std::copysign(f.max_finite, x);
  const int e = std::max(std::ilogb(x), f.min_exp);  // the binade, or the subnormal range
  const double quantum = std::ldexp(1.0, e - f.fraction);
  const double r = std::nearbyint(x / quantum) * quantum;  // nearbyint: ties to even
  if (std::fabs(r) > f.max_finite) {
    return f.has_inf ? std::copysign(std::numeric_limits<double>::infinity(), x)
                     : std::copysign(f.max_finite, x);
  }
  return r;
}

/// The bits of a value v of format F (v already in F: round_to's result), with
/// `exp_bits` exponent bits and bias 2^(exp_bits−1) − 1; `nan_bits` for NaN.
inline std::uint16_t encode(double v, const Format& f, int exp_bits, std::uint16_t nan_bits) {
  if (std::isnan(v)) return nan_bits;
  const std::uint16_t sign = std::signbit(v) ? std::uint16_t(1u << (exp_bits + f.fraction)) : 0;
  const double a = std::fabs(v);
  const int bias = (1 << (exp_bits - 1)) - 1;
  if (std::isinf(a))
    return static_cast<std::uint16_t>(sign | (((1u << exp_bits) - 1) << f.fraction));
  if (a == 0.0) return sign;
  const int e = std::ilogb(a);
  if (e < f.min_exp) {  // subnormal: fraction = a / 2^(min_exp − fraction)
    return static_cast<std::uint16_t>(sign |
                                      static_cast<unsigned>(std::ldexp(a, f.fraction - f.min_exp)));
  }
  const auto frac = static_cast<unsigned>(std::ldexp(a, f.fraction - e)) - (1u << f.fraction);
  return static_cast<std::uint16_t>(sign | (static_cast<unsigned>(e + bias) << f.fraction) | frac);
}

/// The value of the bits of format F (the inverse of encode); e4m3fn has no
/// infinity, and its all-ones exponent with all-ones fraction is NaN.
inline double decode(unsigned bits, const Format& f, int exp_bits, bool ieee_specials) {
  const unsigned frac = bits & ((1u << f.fraction) - 1);
  const unsigned exp = (bits >> f.fraction) & ((1u << exp_bits) - 1);
  const bool negative = ((bits >> (f.fraction + exp_bits)) & 1u) != 0;
  const int bias = (1 << (exp_bits - 1)) - 1;
  double a = 0.0;
  const unsigned exp_max = (1u << exp_bits) - 1;
  if (ieee_specials && exp == exp_max) {
    a = frac == 0 ? std::numeric_limits<double>::infinity()
                  : std::numeric_limits<double>::quiet_NaN();
  } else if (!ieee_specials && exp == exp_max && frac == (1u << f.fraction) - 1) {
    a = std::numeric_limits<double>::quiet_NaN();
  } else if (exp == 0) {
    a = std::ldexp(static_cast<double>(frac), f.min_exp - f.fraction);
  } else {
    a = std::ldexp(static_cast<double>(frac + (1u << f.fraction)),
                   static_cast<int>(exp) - bias - f.fraction);
  }
  return negative ? -a : a;
}

}  // namespace detail

namespace detail {

/// A value of the narrow binary format F, held as its bits (the layout of
/// the same type in torch, ml_dtypes and Highway): `Narrow(x)` is RN_F(x),
/// reading a value (`static_cast<double>`, `static_cast<float>`) is exact,
/// since every value of these formats is a float32.
template <class Bits, const Format& F, int kExpBits, Bits kNanBits, bool kIeeeSpecials>
struct Narrow {
  Bits bits = 0;  ///< sign, exponent bits, fraction bits

  Narrow() = default;
  /// RN_F(x), ties to even, from the exact value x
  explicit Narrow(double x)
      : bits(static_cast<Bits>(encode(round_to(x, F), F, kExpBits, kNanBits))) {}
  /// The value, exactly.
  explicit operator double() const { return decode(bits, F, kExpBits, kIeeeSpecials); }
  /// The value, exactly.
  explicit operator float() const { return static_cast<float>(static_cast<double>(*this)); }
  /// The value with these bits.
  static Narrow from_bits(Bits b) {
    Narrow x;
    x.bits = b;
    return x;
  }
};

}  // namespace detail

/// bfloat16 (SPEC §10.1): the top 16 bits of a float32 (1 sign, 8 exponent,
/// 7 fraction bits), so every value is a float32 and reading one is exact;
/// `bfloat16(x)` is RN_bf16(x). Layout-compatible with torch.bfloat16,
/// ml_dtypes.bfloat16 and hwy::bfloat16_t.
using bfloat16 = detail::Narrow<std::uint16_t, detail::kBf16, 8, 0x7FC0, true>;

/// IEEE binary16 (SPEC §10.1; 1 sign, 5 exponent, 10 fraction bits): every
/// value is a float32, so reading one is exact; `float16(x)` is RN_f16(x)
/// (beyond 65504 + half an ulp: ±inf). Layout-compatible with
/// torch.float16, numpy.float16 and hwy::float16_t.
using float16 = detail::Narrow<std::uint16_t, detail::kF16, 5, 0x7E00, true>;

/// The OCP float8 e4m3fn code of a quantized KV cache (SPEC §10.4; 1 sign,
/// 4 exponent bits with bias 7, 3 fraction bits): values up to ±448, no
/// infinity; `float8_e4m3(x)` is RN_e4m3(x), saturating to ±448.
/// Layout-compatible with torch.float8_e4m3fn and ml_dtypes.float8_e4m3fn.
using float8_e4m3 = detail::Narrow<std::uint8_t, detail::kE4m3, 4, 0x7F, false>;

/// What a storage type T is (SPEC §10.1): its DType, whether it is one of the
/// low-precision types that round at SPEC §10.2's points, the type of the
/// statistics a call keeps beside it (the log-sum-exp: float32 for every
/// storage type narrower than float32), and u, half the distance from 1 to
/// the next value (the unit roundoff 2^−(fraction+1)).
template <class T>
struct storage_traits {
  static constexpr bool low_precision =
      false;       ///< float, double, complex: no intermediate rounding
  using stat = T;  ///< lse in T itself
};
/// float32: the rounding of every f32 kernel.
template <>
struct storage_traits<float> {
  static constexpr DType dtype = DType::f32;        ///< its DType
  static constexpr bool low_precision = false;      ///< rounds at SPEC §10.2's points
  using stat = float;                               ///< the type of its lse
  static constexpr double unit_roundoff = 0x1p-24;  ///< u = 2^−(fraction bits + 1)
};
/// float64: the reference's ground truth.
template <>
struct storage_traits<double> {
  static constexpr DType dtype = DType::f64;        ///< its DType
  static constexpr bool low_precision = false;      ///< rounds at SPEC §10.2's points
  using stat = double;                              ///< the type of its lse
  static constexpr double unit_roundoff = 0x1p-53;  ///< u = 2^−(fraction bits + 1)
};
/// bfloat16: rounds at SPEC §10.2's points, lse in float32.
template <>
struct storage_traits<bfloat16> {
  static constexpr DType dtype = DType::bf16;      ///< its DType
  static constexpr bool low_precision = true;      ///< rounds at SPEC §10.2's points
  using stat = float;                              ///< the type of its lse
  static constexpr double unit_roundoff = 0x1p-8;  ///< u = 2^−(fraction bits + 1)
};
/// float16: rounds at SPEC §10.2's points, lse in float32.
template <>
struct storage_traits<float16> {
  static constexpr DType dtype = DType::f16;        ///< its DType
  static constexpr bool low_precision = true;       ///< rounds at SPEC §10.2's points
  using stat = float;                               ///< the type of its lse
  static constexpr double unit_roundoff = 0x1p-11;  ///< u = 2^−(fraction bits + 1)
};

/// The type of the statistics (lse) kept beside tensors of storage type T.
template <class T>
using stat_t = typename storage_traits<T>::stat;

/// True for the storage types that round at SPEC §10.2's points (bf16, f16).
template <class T>
inline constexpr bool is_low_precision_v = storage_traits<T>::low_precision;

/// RN_T(x) as a value of Acc: x itself unless T is a low-precision storage
/// type, whose rounding points the reference marks with this (SPEC §10.2).
template <class T, class Acc>
Acc round_as(const Acc& x) {
  if constexpr (is_low_precision_v<T>) {
    if constexpr (std::is_arithmetic_v<Acc>) {
      return static_cast<Acc>(static_cast<double>(T(static_cast<double>(x))));
    } else {
      return Acc(static_cast<double>(T(x.real())), x.imag());  // (complex steps are not rounded)
    }
  } else {
    return x;
  }
}

}  // namespace tandem
