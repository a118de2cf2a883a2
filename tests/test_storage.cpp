// SPDX-License-Identifier: Apache-2.0
// The storage types of SPEC §10.1 (tandem/storage.hpp): reading a value is
// exact and RN_T rounds to nearest, ties to even, from the exact value —
// every bf16 and f16 bit pattern round-trips, ties go to the even neighbour,
// a value just past a tie is not double-rounded through float32, overflow
// gives ±inf (bf16, f16) or saturates (e4m3), and every e4m3 code decodes to
// its OCP e4m3fn value.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "support/tandem_test_support.hpp"
#include "tandem/storage.hpp"

namespace {

using tandem::bfloat16;
using tandem::float16;
using tandem::float8_e4m3;

constexpr double kInf = std::numeric_limits<double>::infinity();

/// The float32 whose top 16 bits are `bits`: what a bf16 value is.
float float_of_bf16_bits(std::uint16_t bits) {
  const std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;
  float f = 0.0f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

TEST(Storage, EveryBf16BitPatternIsTheTopHalfOfAFloatAndRoundTrips) {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const double x = static_cast<double>(bfloat16::from_bits(bits));
    const float f = float_of_bf16_bits(bits);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(x)) << std::hex << b;
      EXPECT_TRUE(std::isnan(static_cast<double>(bfloat16(x)))) << std::hex << b;
      continue;
    }
    ASSERT_EQ(x, static_cast<double>(f)) << std::hex << b;
    ASSERT_EQ(bfloat16(x).bits, bits) << std::hex << b;
    ASSERT_EQ(static_cast<float>(bfloat16::from_bits(bits)), f) << std::hex << b;
  }
}

TEST(Storage, EveryF16BitPatternRoundTrips) {
  int nans = 0;
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const double x = static_cast<double>(float16::from_bits(bits));
    const unsigned exp = (b >> 10) & 0x1Fu, frac = b & 0x3FFu;
    if (exp == 0x1F && frac != 0) {
      EXPECT_TRUE(std::isnan(x)) << std::hex << b;
      ++nans;
      continue;
    }
    // the value from the fields: (−1)^s · 2^(e−15) · 1.f, or 2^−14 · 0.f below
    const double magnitude = exp == 0x1F ? kInf
                             : exp == 0  ? std::ldexp(frac, -24)
                                         : std::ldexp(frac + 1024.0, static_cast<int>(exp) - 25);
    ASSERT_EQ(x, (b & 0x8000u) != 0 ? -magnitude : magnitude) << std::hex << b;
    ASSERT_EQ(float16(x).bits, bits) << std::hex << b;
  }
  EXPECT_EQ(nans, 2 * 1023);
}

TEST(Storage, Bf16RoundsToNearestTiesToEvenFromTheExactValue) {
  // 1 + 2^−8 lies halfway between 1 and 1 + 2^−7: the even one (1) wins
  EXPECT_EQ(static_cast<double>(bfloat16(1.0 + 0x1p-8)), 1.0);
  // 1 + 3·2^−8 lies halfway between 1 + 2^−7 (odd) and 1 + 2^−6 (even)
  EXPECT_EQ(static_cast<double>(bfloat16(1.0 + 3 * 0x1p-8)), 1.0 + 0x1p-6);
  // just past the tie: up; through float32 it would become the tie and round down
  EXPECT_EQ(static_cast<double>(bfloat16(1.0 + 0x1p-8 + 0x1p-40)), 1.0 + 0x1p-7);
  EXPECT_EQ(static_cast<float>(1.0 + 0x1p-8 + 0x1p-40), 1.0f + 0x1p-8f);
  EXPECT_EQ(static_cast<double>(bfloat16(-1.0 - 0x1p-8)), -1.0);
  // bf16 subnormals are float32's: 2^−133 is the smallest, 2^−134 ties to 0
  EXPECT_EQ(bfloat16(0x1p-133).bits, 0x0001);
  EXPECT_EQ(bfloat16(0x1p-134).bits, 0x0000);
  EXPECT_EQ(bfloat16(0x1p-134 + 0x1p-160).bits, 0x0001);
  EXPECT_EQ(bfloat16(-0.0).bits, 0x8000);
}

TEST(Storage, F16RoundsToNearestTiesToEvenFromTheExactValue) {
  EXPECT_EQ(static_cast<double>(float16(1.0 + 0x1p-11)), 1.0);
  EXPECT_EQ(static_cast<double>(float16(1.0 + 3 * 0x1p-11)), 1.0 + 0x1p-9);
  EXPECT_EQ(static_cast<double>(float16(2049.0)), 2048.0);
  EXPECT_EQ(static_cast<double>(float16(2051.0)), 2052.0);
  EXPECT_EQ(static_cast<double>(float16(1.0 + 0x1p-11 + 0x1p-40)), 1.0 + 0x1p-10);
  // subnormals: 2^−24 is the smallest; 2^−25 ties to 0, 3·2^−25 to 2·2^−24
  EXPECT_EQ(float16(0x1p-24).bits, 0x0001);
  EXPECT_EQ(float16(0x1p-25).bits, 0x0000);
  EXPECT_EQ(float16(0x1p-25 + 0x1p-50).bits, 0x0001);
  EXPECT_EQ(float16(3 * 0x1p-25).bits, 0x0002);
  EXPECT_EQ(float16(0x1p-14 - 0x1p-25).bits, 0x0400);  // rounds up into the normal range
}

TEST(Storage, OverflowGivesInfinityForBf16AndF16) {
  EXPECT_EQ(static_cast<double>(float16(65504.0)), 65504.0);
  EXPECT_EQ(static_cast<double>(float16(65519.99)), 65504.0);
  EXPECT_EQ(static_cast<double>(float16(65520.0)), kInf);  // the tie rounds to even: 2^16
  EXPECT_EQ(static_cast<double>(float16(-1e10)), -kInf);
  EXPECT_EQ(float16(kInf).bits, 0x7C00);
  EXPECT_EQ(static_cast<double>(bfloat16(0x1.fep127)), 0x1.fep127);
  EXPECT_EQ(static_cast<double>(bfloat16(0x1.feffp127)), 0x1.fep127);
  EXPECT_EQ(static_cast<double>(bfloat16(0x1.ffp127)), kInf);
  EXPECT_EQ(static_cast<double>(bfloat16(-1e300)), -kInf);
  EXPECT_EQ(bfloat16(kInf).bits, 0x7F80);
  EXPECT_TRUE(std::isnan(static_cast<double>(bfloat16(std::nan("")))));
  EXPECT_TRUE(std::isnan(static_cast<double>(float16(std::nan("")))));
}

TEST(Storage, EveryE4m3CodeDecodesToItsValueAndRoundTrips) {
  for (std::uint32_t c = 0; c < 256; ++c) {
    const auto code = static_cast<std::uint8_t>(c);
    const double x = static_cast<double>(float8_e4m3::from_bits(code));
    const unsigned exp = (c >> 3) & 0xFu, frac = c & 0x7u;
    if (exp == 0xF && frac == 0x7) {  // e4m3fn: S.1111.111 is NaN, there is no infinity
      EXPECT_TRUE(std::isnan(x)) << c;
      continue;
    }
    const double magnitude =
        exp == 0 ? std::ldexp(frac, -9) : std::ldexp(frac + 8.0, static_cast<int>(exp) - 10);
    ASSERT_EQ(x, (c & 0x80u) != 0 ? -magnitude : magnitude) << c;
    ASSERT_EQ(float8_e4m3(x).bits, code) << c;
  }
  EXPECT_EQ(static_cast<double>(float8_e4m3::from_bits(0x7E)), 448.0);
  EXPECT_EQ(static_cast<double>(float8_e4m3::from_bits(0x38)), 1.0);
  EXPECT_EQ(static_cast<double>(float8_e4m3::from_bits(0x08)), 0x1p-6);
  EXPECT_EQ(static_cast<double>(float8_e4m3::from_bits(0x01)), 0x1p-9);
}

TEST(Storage, E4m3RoundsTiesToEvenAndSaturates) {
  EXPECT_EQ(static_cast<double>(float8_e4m3(1.0625)), 1.0);   // halfway 1 | 1.125: even
  EXPECT_EQ(static_cast<double>(float8_e4m3(1.1875)), 1.25);  // halfway 1.125 | 1.25: even
  EXPECT_EQ(static_cast<double>(float8_e4m3(1.0625 + 1e-9)), 1.125);
  EXPECT_EQ(float8_e4m3(470.0).bits, 0x7E);  // nearer 480 than 448: saturates at 448
  EXPECT_EQ(float8_e4m3(1e6).bits, 0x7E);
  EXPECT_EQ(float8_e4m3(-1e30).bits, 0xFE);
  EXPECT_EQ(float8_e4m3(kInf).bits, 0x7E);
  EXPECT_EQ(float8_e4m3(-kInf).bits, 0xFE);
  EXPECT_EQ(float8_e4m3(0x1p-10).bits, 0x00);  // halfway 0 | 2^−9: even
  EXPECT_EQ(float8_e4m3(3 * 0x1p-10).bits, 0x02);
  EXPECT_TRUE(std::isnan(static_cast<double>(float8_e4m3(std::nan("")))));
}

TEST(Storage, RoundAsIsTheIdentityForFloatAndDoubleAndRnForBf16F16) {
  EXPECT_EQ(tandem::round_as<float>(0.1), 0.1);
  EXPECT_EQ(tandem::round_as<double>(0.1), 0.1);
  EXPECT_EQ(tandem::round_as<bfloat16>(0.1), static_cast<double>(bfloat16(0.1)));
  EXPECT_EQ(tandem::round_as<float16>(0.1), static_cast<double>(float16(0.1)));
  EXPECT_NE(tandem::round_as<bfloat16>(0.1), tandem::round_as<float16>(0.1));
  static_assert(std::is_same_v<tandem::stat_t<bfloat16>, float>);
  static_assert(std::is_same_v<tandem::stat_t<float16>, float>);
  static_assert(std::is_same_v<tandem::stat_t<double>, double>);
}

}  // namespace
