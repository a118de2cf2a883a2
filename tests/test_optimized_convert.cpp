// SPDX-License-Identifier: Apache-2.0
// The optimized backend's per-target conversions (tandem/optimized/convert.hpp,
// optimized/src/convert-inl.h) against tandem/storage.hpp's scalar ones
// (SPEC §10.1), on every Highway target this CPU supports, scalar included:
// every bf16 and f16 value widened, every rounding boundary of both types
// (each midpoint between neighbours and the floats on either side of it,
// overflow included), and 10^6 random float bit patterns (subnormals,
// infinities and NaNs among them) plus 10^6 random floats in f16's range.
// Bits agree for every value but NaN; a NaN gives a NaN. Each array is also
// converted in chunks of 1 to 33 values, so that the partial-vector code
// (LoadWideN, StoreRoundedN, the pair tails) sees every tail length.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "support/tandem_test_support.hpp"
#include "tandem/storage.hpp"

#ifdef TANDEM_HAVE_OPTIMIZED
#include "tandem/optimized/convert.hpp"

namespace {

namespace opt = tandem::optimized;
using tandem::bfloat16;
using tandem::float16;

/// Whether bits of T encode a NaN (exponent all ones, fraction not 0).
template <class T>
bool is_nan_bits(std::uint16_t b) {
  return std::isnan(static_cast<double>(T::from_bits(b)));
}

/// Runs f(offset, count) over [0, n) once whole, then in chunks of 1, 2, ...,
/// 33, 1, 2, ... values: every tail length of every target's vectors.
void whole_and_chunked(std::size_t n, const std::function<void(std::size_t, std::size_t)>& f) {
  f(0, n);
  std::size_t size = 1;
  for (std::size_t i = 0; i < n; i += size, size = size % 33 + 1) f(i, std::min(size, n - i));
}

/// Empty when got and want have the same bits, or are both NaN.
std::string float_mismatch(const std::string& what, std::size_t i, float in, float got,
                           float want) {
  if (std::isnan(want) ? std::isnan(got) : tandem::test::same_bits(got, want)) return {};
  return what + "[" + std::to_string(i) + "] of input bits " +
         std::to_string(std::bit_cast<std::uint32_t>(in)) + ": got bits " +
         std::to_string(std::bit_cast<std::uint32_t>(got)) + ", want " +
         std::to_string(std::bit_cast<std::uint32_t>(want));
}

/// Every bf16 or f16 bit pattern, widened by convert_widen and by pairs.
template <class T>
void expect_widening_exact() {
  std::vector<T> all(65536);
  for (std::size_t b = 0; b < all.size(); ++b) all[b] = T::from_bits(static_cast<std::uint16_t>(b));
  std::vector<float> want(all.size());
  for (std::size_t b = 0; b < all.size(); ++b) want[b] = static_cast<float>(all[b]);
  const std::span<const T> in(all);
  whole_and_chunked(all.size(), [&](std::size_t i, std::size_t n) {
    std::vector<float> got(n);
    opt::convert_widen(in.subspan(i, n), std::span<float>(got));
    for (std::size_t j = 0; j < n; ++j) {
      const std::string m = float_mismatch("widen", i + j, 0.0f, got[j], want[i + j]);
      ASSERT_TRUE(m.empty()) << m << " (bits " << all[i + j].bits << ")";
    }
  });
  whole_and_chunked(all.size() / 2, [&](std::size_t i, std::size_t n) {
    std::vector<float> x0(n), x1(n);
    opt::convert_widen_pairs(in.subspan(2 * i, 2 * n), std::span<float>(x0), std::span<float>(x1));
    for (std::size_t j = 0; j < n; ++j) {
      const std::size_t e = 2 * (i + j);
      ASSERT_TRUE(float_mismatch("widen_pairs.x0", e, 0.0f, x0[j], want[e]).empty())
          << "bits " << all[e].bits;
      ASSERT_TRUE(float_mismatch("widen_pairs.x1", e + 1, 0.0f, x1[j], want[e + 1]).empty())
          << "bits " << all[e + 1].bits;
    }
  });
}

/// Every value of T and every rounding boundary between neighbours (the
/// midpoint and the floats just below and above it), both signs; the
/// boundary above the largest finite value is where T overflows to inf.
template <class T>
std::vector<float> boundary_floats() {
  std::vector<float> out;
  for (std::uint32_t b = 0; b < 0x8000u; ++b) {
    const double v = static_cast<double>(T::from_bits(static_cast<std::uint16_t>(b)));
    if (!std::isfinite(v)) break;  // the first non-finite positive pattern is +inf
    const double up = static_cast<double>(T::from_bits(static_cast<std::uint16_t>(b + 1)));
    const double next =
        std::isfinite(up)
            ? up
            : v + (v - static_cast<double>(T::from_bits(static_cast<std::uint16_t>(b - 1))));
    const auto mid = static_cast<float>((v + next) / 2);  // exact: T has fewer bits than float
    EXPECT_EQ(static_cast<double>(mid), (v + next) / 2);
    for (const float x : {static_cast<float>(v), mid, std::nextafter(mid, 0.0f),
                          std::nextafter(mid, std::numeric_limits<float>::infinity())}) {
      out.push_back(x);
      out.push_back(-x);
    }
  }
  return out;
}

/// n random floats: uniform bit patterns (every class of float), then values
/// with exponents from 2^−30 to 2^20 (f16's subnormals to beyond its range).
std::vector<float> random_floats(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::vector<float> out;
  std::uniform_int_distribution<std::uint32_t> bits;
  for (std::size_t i = 0; i < n; ++i) out.push_back(std::bit_cast<float>(bits(gen)));
  std::uniform_int_distribution<int> exponent(-30, 20);
  std::uniform_real_distribution<float> mantissa(-2.0f, 2.0f);
  for (std::size_t i = 0; i < n; ++i) out.push_back(std::ldexp(mantissa(gen), exponent(gen)));
  out.push_back(std::numeric_limits<float>::quiet_NaN());
  out.push_back(-std::numeric_limits<float>::quiet_NaN());
  out.push_back(std::bit_cast<float>(0x7F800001u));  // a signalling NaN
  out.push_back(std::numeric_limits<float>::infinity());
  out.push_back(-std::numeric_limits<float>::infinity());
  out.push_back(std::numeric_limits<float>::max());
  out.push_back(std::numeric_limits<float>::denorm_min());
  out.push_back(-0.0f);
  return out;
}

/// RN_T of every x by convert_round, convert_round_trip and
/// convert_round_pairs, against T(double(x)).
template <class T>
void expect_rounding_exact(const std::vector<float>& x) {
  std::vector<std::uint16_t> want(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) want[i] = T(static_cast<double>(x[i])).bits;
  const auto same = [&](std::size_t i, std::uint16_t got) {
    return is_nan_bits<T>(want[i]) ? is_nan_bits<T>(got) : got == want[i];
  };
  const std::span<const float> in(x);
  whole_and_chunked(x.size(), [&](std::size_t i, std::size_t n) {
    std::vector<T> got(n);
    std::vector<float> trip(n);
    opt::convert_round(in.subspan(i, n), std::span<T>(got));
    opt::convert_round_trip<T>(in.subspan(i, n), std::span<float>(trip));
    for (std::size_t j = 0; j < n; ++j) {
      ASSERT_TRUE(same(i + j, got[j].bits))
          << "round of float bits " << std::bit_cast<std::uint32_t>(x[i + j]) << " (" << x[i + j]
          << "): got " << got[j].bits << ", want " << want[i + j];
      const float trip_want = static_cast<float>(T::from_bits(want[i + j]));
      const std::string m = float_mismatch("round_trip", i + j, x[i + j], trip[j], trip_want);
      ASSERT_TRUE(m.empty()) << m;
    }
  });
  const std::size_t pairs = x.size() / 2;
  whole_and_chunked(pairs, [&](std::size_t i, std::size_t n) {
    // y0 from the first half of x, y1 from the second
    std::vector<T> got(2 * n);
    opt::convert_round_pairs(in.subspan(i, n), in.subspan(pairs + i, n), std::span<T>(got));
    for (std::size_t j = 0; j < n; ++j) {
      ASSERT_TRUE(same(i + j, got[2 * j].bits)) << "round_pairs.y0[" << i + j << "]";
      ASSERT_TRUE(same(pairs + i + j, got[2 * j + 1].bits)) << "round_pairs.y1[" << i + j << "]";
    }
  });
}

TEST(OptimizedConvert, WideningIsExactForEveryValueOnEveryTarget) {
  tandem::test::for_each_target([] {
    expect_widening_exact<bfloat16>();
    expect_widening_exact<float16>();
  });
}

TEST(OptimizedConvert, RoundingMatchesStorageAtEveryBoundaryOnEveryTarget) {
  const std::vector<float> bf16 = boundary_floats<bfloat16>();
  const std::vector<float> f16 = boundary_floats<float16>();
  // every finite value of each type and its three boundary floats, both signs
  EXPECT_EQ(bf16.size(), std::size_t{8} * 0x7F80u);
  EXPECT_EQ(f16.size(), std::size_t{8} * 0x7C00u);
  tandem::test::for_each_target([&] {
    expect_rounding_exact<bfloat16>(bf16);
    expect_rounding_exact<float16>(f16);
  });
}

TEST(OptimizedConvert, RoundingMatchesStorageForRandomFloatsOnEveryTarget) {
  const std::vector<float> x = random_floats(1000000, 20261202u);
  std::size_t nan = 0, subnormal = 0, inf_f16 = 0;
  for (const float e : x) {
    nan += std::isnan(e) ? 1 : 0;
    subnormal += std::fpclassify(e) == FP_SUBNORMAL ? 1 : 0;
    inf_f16 += std::isinf(static_cast<double>(float16(e))) && std::isfinite(e) ? 1 : 0;
  }
  // the classes the test claims to cover are there
  EXPECT_GT(nan, 1000u);
  EXPECT_GT(subnormal, 1000u);
  EXPECT_GT(inf_f16, 100000u);
  tandem::test::for_each_target([&] {
    expect_rounding_exact<bfloat16>(x);
    expect_rounding_exact<float16>(x);
  });
}

TEST(OptimizedConvert, MismatchedSizesAreErrors) {
  std::vector<float> x(4), y(3);
  std::vector<bfloat16> t(3);
  tandem::test::expect_error(
      [&] { opt::convert_widen(std::span<const bfloat16>(t), std::span<float>(x)); }, "out.size()");
  tandem::test::expect_error(
      [&] { opt::convert_round(std::span<const float>(x), std::span<bfloat16>(t)); }, "out.size()");
  tandem::test::expect_error(
      [&] {
        opt::convert_round_pairs(std::span<const float>(x), std::span<const float>(y),
                                 std::span<bfloat16>(t));
      },
      "y1.size()");
}

}  // namespace

#endif  // TANDEM_HAVE_OPTIMIZED
