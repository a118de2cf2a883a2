// SPDX-License-Identifier: Apache-2.0
/// @file reference/scalar.hpp
/// @brief Scalar-type helpers for the templated reference: the accumulator
///        type and the real part used for comparisons.
///
/// The reference is templated on its scalar type T so it runs in float (the
/// backend), double (the ground truth of the property suite) and
/// std::complex<double> (complex-step gradient checks). Sums run in Acc,
/// double by default for float; `reference<float, float>` is the pure
/// single-precision baseline of the accuracy property.
#pragma once

#include <complex>
#include <type_traits>

#include "tandem/storage.hpp"

namespace tandem::reference {

/// The default accumulator of scalar type T: double for float, T otherwise.
template <class T>
struct accumulator {
  using type = T;  ///< sums of T run in T
};
/// float sums run in double: the reference backend rounds once per output.
template <>
struct accumulator<float> {
  using type = double;  ///< sums of float run in double
};
/// bfloat16 sums run in double: the rest is rounded only at SPEC §10.2's points.
template <>
struct accumulator<bfloat16> {
  using type = double;  ///< sums of bfloat16 run in double
};
/// float16 sums run in double, as bfloat16's.
template <>
struct accumulator<float16> {
  using type = double;  ///< sums of float16 run in double
};
/// Shorthand for accumulator<T>::type.
template <class T>
using accumulator_t = typename accumulator<T>::type;

/// The real part of x (x itself for real types). Comparisons (the running
/// maximum of a softmax) look at it; complex-step derivatives ride along in
/// the imaginary part untouched.
template <class T>
constexpr auto real_part(const T& x) {
  if constexpr (std::is_arithmetic_v<T>) {
    return x;
  } else {
    return x.real();
  }
}

}  // namespace tandem::reference
