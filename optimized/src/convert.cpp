// SPDX-License-Identifier: Apache-2.0
// The conversions of convert-inl.h over whole arrays, per Highway target
// (tandem/optimized/convert.hpp): how the tests reach the per-target
// widening loads, rounding stores and round trips of the kernels.
// Each array is walked in full vectors, then one partial vector (through a
// zero-filled buffer for the pair conversions, as RotatePairs does).

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "convert.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "convert-inl.h"
#include "simd-inl.h"

#ifndef TANDEM_OPTIMIZED_CONVERT_ONCE
#define TANDEM_OPTIMIZED_CONVERT_ONCE
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>

#include "tandem/optimized/convert.hpp"
#include "tandem/shape.hpp"

namespace tandem::optimized::detail {
/// Which conversion of convert.hpp a call runs.
enum class Conversion { widen, round, round_trip, widen_pairs, round_pairs };
/// One conversion call over n values (pairs for the pair conversions): its
/// input, of T or float (two float arrays for round_pairs), and its output,
/// of T or float (two float arrays for widen_pairs); the rest null.
template <class T>
struct ConvertArgs {
  Conversion op;
  std::int64_t n;
  const T* t_in = nullptr;
  const float* f_in[2] = {};
  T* t_out = nullptr;
  float* f_out[2] = {};
};
}  // namespace tandem::optimized::detail
#endif

HWY_BEFORE_NAMESPACE();
namespace tandem::optimized::HWY_NAMESPACE {

/// Pairs i .. i+n (n <= Lanes()) of a.stored to or from a.f0, a.f1.
template <class T>
void ConvertPairs(const detail::ConvertArgs<T>& a, std::int64_t i, std::int64_t n) {
  const DF d;
  HWY_ALIGN T buf[2 * kMaxFloatLanes] = {};
  const auto bytes = static_cast<std::size_t>(2 * n) * sizeof(T);
  if (a.op == detail::Conversion::widen_pairs) {
    std::memcpy(buf, a.t_in + 2 * i, bytes);
    VF x0, x1;
    LoadWideInterleaved2(d, buf, x0, x1);
    StoreN(x0, d, a.f_out[0] + i, static_cast<std::size_t>(n));
    StoreN(x1, d, a.f_out[1] + i, static_cast<std::size_t>(n));
  } else {
    const auto k = static_cast<std::size_t>(n);
    StoreRoundedInterleaved2(d, LoadN(d, a.f_in[0] + i, k), LoadN(d, a.f_in[1] + i, k), buf);
    std::memcpy(a.t_out + 2 * i, buf, bytes);
  }
}

/// Values i .. i+n (n <= Lanes(); the full-vector code when n = Lanes()).
template <class T>
void ConvertVector(const detail::ConvertArgs<T>& a, std::int64_t i, std::int64_t n) {
  const DF d;
  const bool full = n == Lanes();
  const auto k = static_cast<std::size_t>(n);
  switch (a.op) {
    case detail::Conversion::widen: {
      const VF x = full ? LoadWide(d, a.t_in + i) : LoadWideN(d, a.t_in + i, n);
      StoreN(x, d, a.f_out[0] + i, k);
      break;
    }
    case detail::Conversion::round: {
      const VF x = LoadN(d, a.f_in[0] + i, k);
      full ? StoreRounded(d, x, a.t_out + i) : StoreRoundedN(d, x, a.t_out + i, n);
      break;
    }
    case detail::Conversion::round_trip:
      StoreN(RoundAs<T>(d, LoadN(d, a.f_in[0] + i, k)), d, a.f_out[0] + i, k);
      break;
    case detail::Conversion::widen_pairs:
    case detail::Conversion::round_pairs:
      if (full) {
        VF x0, x1;
        if (a.op == detail::Conversion::widen_pairs) {
          LoadWideInterleaved2(d, a.t_in + 2 * i, x0, x1);
          hn::StoreU(x0, d, a.f_out[0] + i);
          hn::StoreU(x1, d, a.f_out[1] + i);
        } else {
          StoreRoundedInterleaved2(d, hn::LoadU(d, a.f_in[0] + i), hn::LoadU(d, a.f_in[1] + i),
                                   a.t_out + 2 * i);
        }
      } else {
        ConvertPairs(a, i, n);
      }
      break;
  }
}

template <class T>
void Convert(const detail::ConvertArgs<T>& a) {
  const std::int64_t N = Lanes();
  for (std::int64_t i = 0; i < a.n; i += N) ConvertVector(a, i, a.n - i < N ? a.n - i : N);
}

/// Convert at each storage type, one exported function per type.
void ConvertBF16(const detail::ConvertArgs<bfloat16>& a) {
  Convert(a);
}
void ConvertF16(const detail::ConvertArgs<float16>& a) {
  Convert(a);
}

}  // namespace tandem::optimized::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tandem::optimized {
HWY_EXPORT(ConvertBF16);
HWY_EXPORT(ConvertF16);

namespace {

template <class T>
void convert(const detail::ConvertArgs<T>& a) {
  if constexpr (std::is_same_v<T, bfloat16>) {
    HWY_DYNAMIC_DISPATCH(ConvertBF16)(a);
  } else {
    static_assert(std::is_same_v<T, float16>, "bfloat16 or float16");
    HWY_DYNAMIC_DISPATCH(ConvertF16)(a);
  }
}

std::int64_t size_of(std::size_t n) {
  return static_cast<std::int64_t>(n);
}

}  // namespace

template <class T>
void convert_widen(std::span<const T> x, std::span<float> out) {
  require_size(out.size(), size_of(x.size()), "out");
  detail::ConvertArgs<T> a{detail::Conversion::widen, size_of(x.size())};
  a.t_in = x.data();
  a.f_out[0] = out.data();
  convert(a);
}

template <class T>
void convert_round(std::span<const float> x, std::span<T> out) {
  require_size(out.size(), size_of(x.size()), "out");
  detail::ConvertArgs<T> a{detail::Conversion::round, size_of(x.size())};
  a.f_in[0] = x.data();
  a.t_out = out.data();
  convert(a);
}

template <class T>
void convert_round_trip(std::span<const float> x, std::span<float> out) {
  require_size(out.size(), size_of(x.size()), "out");
  detail::ConvertArgs<T> a{detail::Conversion::round_trip, size_of(x.size())};
  a.f_in[0] = x.data();
  a.f_out[0] = out.data();
  convert(a);
}

template <class T>
void convert_widen_pairs(std::span<const T> x, std::span<float> x0, std::span<float> x1) {
  require_size(x.size(), 2 * size_of(x0.size()), "x");
  require_size(x1.size(), size_of(x0.size()), "x1");
  detail::ConvertArgs<T> a{detail::Conversion::widen_pairs, size_of(x0.size())};
  a.t_in = x.data();
  a.f_out[0] = x0.data();
  a.f_out[1] = x1.data();
  convert(a);
}

template <class T>
void convert_round_pairs(std::span<const float> y0, std::span<const float> y1, std::span<T> out) {
  require_size(y1.size(), size_of(y0.size()), "y1");
  require_size(out.size(), 2 * size_of(y0.size()), "out");
  detail::ConvertArgs<T> a{detail::Conversion::round_pairs, size_of(y0.size())};
  a.f_in[0] = y0.data();
  a.f_in[1] = y1.data();
  a.t_out = out.data();
  convert(a);
}

template void convert_widen(std::span<const bfloat16>, std::span<float>);
template void convert_widen(std::span<const float16>, std::span<float>);
template void convert_round(std::span<const float>, std::span<bfloat16>);
template void convert_round(std::span<const float>, std::span<float16>);
template void convert_round_trip<bfloat16>(std::span<const float>, std::span<float>);
template void convert_round_trip<float16>(std::span<const float>, std::span<float>);
template void convert_widen_pairs(std::span<const bfloat16>, std::span<float>, std::span<float>);
template void convert_widen_pairs(std::span<const float16>, std::span<float>, std::span<float>);
template void convert_round_pairs(std::span<const float>, std::span<const float>,
                                  std::span<bfloat16>);
template void convert_round_pairs(std::span<const float>, std::span<const float>,
                                  std::span<float16>);

}  // namespace tandem::optimized
#endif  // HWY_ONCE
