// SPDX-License-Identifier: Apache-2.0
// Optimized quantize_kv: the int8 or e4m3 codes and float scales of k and v
// of type float, bf16 or f16 (SPEC §10.4), bitwise equal to the definition:
//
//     int8: σ = RN_f32(max_d |x_d| / 127) per (key row, kv head),
//           c = clamp(round_even(RN_f32(x_d / σ)), −127, 127)
//     e4m3: σ = RN_f32(max |x| / 448) per kv head (every row of the head),
//           c = RN_e4m3(RN_f32(x / σ))  (ties to even, saturating at ±448)
//
// and c = 0 where σ = 0. Every quotient is a true float division (never a
// product with 1/σ); the maxima are exact, so their order does not matter:
// one OpenMP iteration per key row (static schedule), bitwise identical for
// any thread count. RN_e4m3 is integer arithmetic on the float's bits.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "quantize_kv.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "convert-inl.h"
#include "simd-inl.h"

#ifndef TANDEM_OPTIMIZED_QUANTIZE_KV_ONCE
#define TANDEM_OPTIMIZED_QUANTIZE_KV_ONCE
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "entry_points.hpp"

namespace tandem::optimized::detail {

/// One tensor (k or v) of a quantize_kv call after validation: x of type T
/// through `at` (rows × Hkv rows of `width` elements), codes at the same
/// offsets, scales `[kv_scale_size()]`.
struct QuantizeArgs {
  const AttentionPlan* plan = nullptr;
  const void* x = nullptr;
  const Strides* at = nullptr;
  std::int64_t width = 0;
  std::uint8_t* codes = nullptr;
  float* scales = nullptr;
  int threads = 1;
};

}  // namespace tandem::optimized::detail
#endif  // TANDEM_OPTIMIZED_QUANTIZE_KV_ONCE

HWY_BEFORE_NAMESPACE();
namespace tandem::optimized::HWY_NAMESPACE {
namespace {

using detail::QuantizeArgs;

/// max |x_d| over one row of `width` elements.
template <class T>
float RowAbsMax(const T* x, std::int64_t width) {
  const DF d;
  const std::int64_t N = Lanes();
  VF m = hn::Zero(d);
  for (std::int64_t i = 0; i < width; i += N) {
    const VF v = i + N <= width ? LoadWide<T>(d, x + i) : LoadWideN<T>(d, x + i, width - i);
    m = hn::Max(m, hn::Abs(v));
  }
  return hn::GetLane(hn::MaxOfLanes(d, m));
}

/// The int8 codes of x / σ: round half to even, clamped to ±127.
HWY_INLINE hn::Vec<DI32> Int8Codes(DF d, VF x, VF sigma) {
  const VF c =
      hn::Min(hn::Max(hn::Round(hn::Div(x, sigma)), hn::Set(d, -127.0f)), hn::Set(d, 127.0f));
  return hn::ConvertTo(DI32(), c);
}

/// RN_e4m3(x) as the code's bits in u32 lanes: normal results (|x| >=
/// 2^−6) by rebiasing the exponent and rounding the 20 dropped bits to even,
/// saturated at 0x7E (448); below, |x| + 2^14 rounds |x| to a multiple of
/// 2^−9 (the subnormal spacing, ties to even by the processor); NaN: 0x7F.
HWY_INLINE VU32 E4m3Codes(DF d, VF x) {
  const DU32 du;
  const DI32 di;
  const VU32 bits = hn::BitCast(du, x);
  const VU32 mag = hn::And(bits, hn::Set(du, 0x7FFFFFFFu));
  const VU32 odd = hn::And(hn::ShiftRight<20>(mag), hn::Set(du, 1u));
  const VU32 rebias = hn::Sub(mag, hn::Set(du, 120u << 23));
  VU32 normal = hn::ShiftRight<20>(hn::Add(rebias, hn::Add(hn::Set(du, 0x7FFFFu), odd)));
  normal = hn::Min(normal, hn::Set(du, 0x7Eu));
  const VF big = hn::Set(d, 16384.0f);
  const VU32 sub =
      hn::Sub(hn::BitCast(du, hn::Add(hn::BitCast(d, mag), big)), hn::BitCast(du, big));
  const auto tiny = hn::RebindMask(du, hn::Lt(hn::BitCast(di, mag), hn::Set(di, 0x3C800000)));
  const auto nan = hn::RebindMask(du, hn::Gt(hn::BitCast(di, mag), hn::Set(di, 0x7F800000)));
  VU32 r = hn::IfThenElse(tiny, sub, normal);
  r = hn::IfThenElse(nan, hn::Set(du, 0x7Fu), r);
  return hn::Or(r, hn::And(hn::ShiftRight<24>(bits), hn::Set(du, 0x80u)));
}

/// Codes of one row x[0 .. width) with scale σ (> 0) into c[0 .. width).
template <class T, bool kInt8>
void RowCodes(const T* x, std::int64_t width, float sigma, std::uint8_t* c) {
  const DF d;
  const std::int64_t N = Lanes();
  const hn::Rebind<std::uint8_t, DF> d8;
  const VF s = hn::Set(d, sigma);
  for (std::int64_t i = 0; i < width; i += N) {
    const bool full = i + N <= width;
    const VF v = full ? LoadWide<T>(d, x + i) : LoadWideN<T>(d, x + i, width - i);
    hn::Vec<DI32> bits;
    if constexpr (kInt8) {
      // two's complement bytes: the low 8 bits of the int32 code
      bits = hn::And(Int8Codes(d, v, s), hn::Set(DI32(), 0xFF));
    } else {
      bits = hn::BitCast(DI32(), E4m3Codes(d, hn::Div(v, s)));
    }
    const auto bytes = hn::DemoteTo(d8, bits);
    if (full) {
      hn::StoreU(bytes, d8, c + i);
    } else {
      HWY_ALIGN std::uint8_t buf[kMaxFloatLanes];
      hn::Store(bytes, d8, buf);
      std::memcpy(c + i, buf, static_cast<std::size_t>(width - i));
    }
  }
}

/// int8: per (row, kv head) its scale and codes.
template <class T>
void QuantizeInt8(const QuantizeArgs& a) {
  const AttentionPlan& p = *a.plan;
  const T* x = static_cast<const T*>(a.x);
  const std::int64_t rows = p.kv_batch() * p.kv_seq() * p.Hkv;
#pragma omp parallel for schedule(static) num_threads(a.threads)
  for (std::int64_t row = 0; row < rows; ++row) {
    const std::int64_t g = row % p.Hkv, s = row / p.Hkv % p.kv_seq(), b = row / p.Hkv / p.kv_seq();
    const std::int64_t off = a.at->at(b, s, g);
    const float sigma = RowAbsMax(x + off, a.width) / 127.0f;
    a.scales[p.kv_scale_at(b, s, g)] = sigma;
    if (sigma == 0.0f) {
      std::memset(a.codes + off, 0, static_cast<std::size_t>(a.width));
    } else {
      RowCodes<T, true>(x + off, a.width, sigma, a.codes + off);
    }
  }
}

/// e4m3: per kv head the max over all its rows, then the codes.
template <class T>
void QuantizeE4m3(const QuantizeArgs& a) {
  const AttentionPlan& p = *a.plan;
  const T* x = static_cast<const T*>(a.x);
  const std::int64_t per_head = p.kv_batch() * p.kv_seq(), rows = per_head * p.Hkv;
  std::vector<float> row_max(static_cast<std::size_t>(rows));
  std::vector<float> sigma(static_cast<std::size_t>(p.Hkv));
#pragma omp parallel num_threads(a.threads)
  {
#pragma omp for schedule(static)
    for (std::int64_t row = 0; row < rows; ++row) {
      const std::int64_t g = row / per_head, bs = row % per_head;
      const std::int64_t off = a.at->at(bs / p.kv_seq(), bs % p.kv_seq(), g);
      row_max[static_cast<std::size_t>(row)] = RowAbsMax(x + off, a.width);
    }
#pragma omp single
    for (std::int64_t g = 0; g < p.Hkv; ++g) {
      const auto first = row_max.begin() + g * per_head;
      const float amax = per_head == 0 ? 0.0f : *std::max_element(first, first + per_head);
      sigma[static_cast<std::size_t>(g)] = amax / 448.0f;
      a.scales[p.kv_scale_at(0, 0, g)] = sigma[static_cast<std::size_t>(g)];
    }
#pragma omp for schedule(static)
    for (std::int64_t row = 0; row < rows; ++row) {
      const std::int64_t g = row / per_head, bs = row % per_head;
      const std::int64_t off = a.at->at(bs / p.kv_seq(), bs % p.kv_seq(), g);
      const float s = sigma[static_cast<std::size_t>(g)];
      if (s == 0.0f) {
        std::memset(a.codes + off, 0, static_cast<std::size_t>(a.width));
      } else {
        RowCodes<T, false>(x + off, a.width, s, a.codes + off);
      }
    }
  }
}

}  // namespace

void QuantizeInt8F32(const QuantizeArgs& a) {
  QuantizeInt8<float>(a);
}
void QuantizeInt8Bf16(const QuantizeArgs& a) {
  QuantizeInt8<bfloat16>(a);
}
void QuantizeInt8F16(const QuantizeArgs& a) {
  QuantizeInt8<float16>(a);
}
void QuantizeE4m3F32(const QuantizeArgs& a) {
  QuantizeE4m3<float>(a);
}
void QuantizeE4m3Bf16(const QuantizeArgs& a) {
  QuantizeE4m3<bfloat16>(a);
}
void QuantizeE4m3F16(const QuantizeArgs& a) {
  QuantizeE4m3<float16>(a);
}

}  // namespace tandem::optimized::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tandem::optimized {
HWY_EXPORT(QuantizeInt8F32);
HWY_EXPORT(QuantizeInt8Bf16);
HWY_EXPORT(QuantizeInt8F16);
HWY_EXPORT(QuantizeE4m3F32);
HWY_EXPORT(QuantizeE4m3Bf16);
HWY_EXPORT(QuantizeE4m3F16);

namespace detail {

template <class T>
void quantize_kv(const AttentionPlan& plan, std::span<const T> k, std::span<const T> v,
                 const QuantizedKvOut& out, const Options& options) {
  check_quantize(plan, k, v, out);
  const int threads = threads_of(options);
  const QuantizeArgs ka{&plan,        k.data(),           &plan.k, plan.D,
                        out.k.data(), out.k_scale.data(), threads};
  const QuantizeArgs va{&plan,        v.data(),           &plan.v, plan.Dv,
                        out.v.data(), out.v_scale.data(), threads};
  const bool int8 = plan.kv_cache == KvCache::int8;
  for (const QuantizeArgs& a : {ka, va}) {
    if constexpr (std::is_same_v<T, float>) {
      int8 ? HWY_DYNAMIC_DISPATCH(QuantizeInt8F32)(a) : HWY_DYNAMIC_DISPATCH(QuantizeE4m3F32)(a);
    } else if constexpr (std::is_same_v<T, bfloat16>) {
      int8 ? HWY_DYNAMIC_DISPATCH(QuantizeInt8Bf16)(a) : HWY_DYNAMIC_DISPATCH(QuantizeE4m3Bf16)(a);
    } else {
      int8 ? HWY_DYNAMIC_DISPATCH(QuantizeInt8F16)(a) : HWY_DYNAMIC_DISPATCH(QuantizeE4m3F16)(a);
    }
  }
}

template void quantize_kv<float>(const AttentionPlan&, std::span<const float>,
                                 std::span<const float>, const QuantizedKvOut&, const Options&);
template void quantize_kv<bfloat16>(const AttentionPlan&, std::span<const bfloat16>,
                                    std::span<const bfloat16>, const QuantizedKvOut&,
                                    const Options&);
template void quantize_kv<float16>(const AttentionPlan&, std::span<const float16>,
                                   std::span<const float16>, const QuantizedKvOut&, const Options&);

}  // namespace detail
}  // namespace tandem::optimized
#endif  // HWY_ONCE
