// SPDX-License-Identifier: Apache-2.0
// Optimized RoPE, forward and backward (SPEC §4).
//
// Agrees with tandem::reference::rope_forward / rope_backward
// (reference/include/tandem/reference/rope.hpp) within float rounding. The
// order of operations differs: the reference widens x, c_i and s_i to double,
// forms x[p]·c_i − x[q]·s_i there and rounds once; here each output is one
// float fused multiply-add on one rounded float product (see RotatePairs in
// simd-inl.h), about 1 ulp apart. The backward rotates by −angle by negating
// the sines, which is exact.
//
// Layout of the loop: one OpenMP iteration per token row (b, s) with a static
// schedule; within a row, every head rotates its m = n_rot/2 pairs with
// vectors of pairs i (NeoX: x[i] and x[i+m] are two contiguous runs; GPT-J:
// LoadInterleaved2 splits x[2i] and x[2i+1] into two vectors) against the
// contiguous table row c[0..m), s[0..m); dims n_rot..D−1 are copied.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "rope.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "simd-inl.h"

#ifndef TANDEM_OPTIMIZED_ROPE_ONCE
#define TANDEM_OPTIMIZED_ROPE_ONCE
#include <cstdint>
#include <cstring>

#include "entry_points.hpp"

namespace tandem::optimized::detail {
/// The raw pointers and sizes of one RoPE call, after validation.
struct RopeArgs {
  const RopePlan* plan;
  const float* src;
  const float* cos;
  const float* sin;
  float* dst;
  bool transpose;  ///< the backward: rotate by −angle
  int threads;
};
}  // namespace tandem::optimized::detail
#endif

HWY_BEFORE_NAMESPACE();
namespace tandem::optimized::HWY_NAMESPACE {

template <bool kInterleaved, bool kTranspose>
void RopeRows(const detail::RopeArgs& a) {
  const RopePlan& plan = *a.plan;
  const std::int64_t rows = plan.B * plan.S;
  const std::int64_t m = plan.n_rot / 2;
  const std::int64_t heads = plan.heads();
  const std::int64_t D = plan.D, W = plan.W, T = plan.T;
  const std::int64_t pass = plan.D - plan.n_rot;  // dims n_rot..D−1, copied
#pragma omp parallel for schedule(static) num_threads(a.threads)
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t b = r / plan.S, s = r % plan.S;
    const std::int64_t row = plan.table_row(b, s);
    const float* c = a.cos + row * T;
    const float* sn = a.sin + row * T;
    const float* x = a.src + r * plan.src_row_stride;
    float* y = a.dst + r * W;
    for (std::int64_t h = 0; h < heads; ++h) {
      RotatePairs<kInterleaved, kTranspose>(x + h * D, c, sn, m, y + h * D);
      if (pass > 0) {
        std::memcpy(y + h * D + plan.n_rot, x + h * D + plan.n_rot,
                    static_cast<std::size_t>(pass) * sizeof(float));
      }
    }
  }
}

void Rope(const detail::RopeArgs& a) {
  const bool gptj = a.plan->style == RopeStyle::gptj;
  if (gptj) {
    a.transpose ? RopeRows<true, true>(a) : RopeRows<true, false>(a);
  } else {
    a.transpose ? RopeRows<false, true>(a) : RopeRows<false, false>(a);
  }
}

}  // namespace tandem::optimized::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tandem::optimized {
HWY_EXPORT(Rope);

namespace detail {

void rope_forward(const RopePlan& plan, std::span<const float> x, const RopeTables<float>& tables,
                  std::span<float> out, const Options& options) {
  check_views(plan, x, tables, out.size(), "x", "out");
  const RopeArgs a{&plan,      x.data(), tables.cos.data(),  tables.sin.data(),
                   out.data(), false,    threads_of(options)};
  HWY_DYNAMIC_DISPATCH(Rope)(a);
}

void rope_backward(const RopePlan& plan, std::span<const float> dy, const RopeTables<float>& tables,
                   std::span<float> dx, const Options& options) {
  check_views(plan, dy, tables, dx.size(), "dy", "dx");
  const RopeArgs a{&plan,     dy.data(), tables.cos.data(),  tables.sin.data(),
                   dx.data(), true,      threads_of(options)};
  HWY_DYNAMIC_DISPATCH(Rope)(a);
}

}  // namespace detail
}  // namespace tandem::optimized
#endif  // HWY_ONCE
