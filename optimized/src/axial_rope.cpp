// SPDX-License-Identifier: Apache-2.0
// Optimized axial 2-D RoPE, forward and backward (SPEC §5).
//
// Agrees with tandem::reference::axial_rope_forward / axial_rope_backward
// (reference/include/tandem/reference/axial_rope.hpp) within float rounding.
// The order of operations differs: the reference evaluates, per element, the
// angle a_j = px·f_j (or py·f_{j−D/4}) and cos(a_j), sin(a_j) in double and
// rotates in double. Here the cosines and sines are computed once per call,
// in double and then rounded to float, into two small tables
//
//     cx[px, k] = cos(px·f_k), sx[px, k] = sin(px·f_k)   px < end_x, k < D/4
//     cy[py, k] = cos(py·f_k), sy[py, k] = sin(py·f_k)   py < end_y, k < D/4
//
// (end_x·D/4 and end_y·D/4 entries each, with f_k = theta^(−4k/D) as in the
// reference), so the streaming loop is a table-driven rotation: the first D/2
// elements of a head (pairs j < D/4) rotate with table row px of (cx, sx), the
// last D/2 (pairs j >= D/4) with row py of (cy, sy), each pair (x[2j],
// x[2j+1]) as one fused multiply-add on a rounded product in float (see
// RotatePairs in simd-inl.h).

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "axial_rope.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "simd-inl.h"

#ifndef TANDEM_OPTIMIZED_AXIAL_ROPE_ONCE
#define TANDEM_OPTIMIZED_AXIAL_ROPE_ONCE
#include <cmath>
#include <cstdint>

#include "buffer.hpp"
#include "entry_points.hpp"

namespace tandem::optimized::detail {
/// One axial RoPE call after validation, with its per-call tables.
struct AxialRopeArgs {
  const AxialRopePlan* plan;
  const float* src;
  float* dst;
  const float* cx;  ///< [end_x, D/4] cos(px·f_k)
  const float* sx;  ///< [end_x, D/4] sin(px·f_k)
  const float* cy;  ///< [end_y, D/4] cos(py·f_k)
  const float* sy;  ///< [end_y, D/4] sin(py·f_k)
  bool transpose;   ///< the backward: rotate by −angle
  int threads;
};
}  // namespace tandem::optimized::detail
#endif

HWY_BEFORE_NAMESPACE();
namespace tandem::optimized::HWY_NAMESPACE {

template <bool kTranspose>
void AxialRows(const detail::AxialRopeArgs& a) {
  const AxialRopePlan& plan = *a.plan;
  const std::int64_t rows = plan.B * plan.S;
  const std::int64_t D = plan.D, W = plan.W, Q = plan.D / 4;
  const std::int64_t grid = plan.end_x * plan.end_y;
#pragma omp parallel for schedule(static) num_threads(a.threads)
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t s = r % plan.S;
    const std::int64_t p = s % grid;
    const std::int64_t px = p % plan.end_x, py = p / plan.end_x;
    const float* x = a.src + r * plan.src_row_stride;
    float* y = a.dst + r * W;
    for (std::int64_t h = 0; h < plan.num_heads; ++h) {
      // pairs j < D/4: angle px·f_j; pairs j >= D/4: angle py·f_{j−D/4}
      RotatePairs<true, kTranspose>(x + h * D, a.cx + px * Q, a.sx + px * Q, Q, y + h * D);
      RotatePairs<true, kTranspose>(x + h * D + D / 2, a.cy + py * Q, a.sy + py * Q, Q,
                                    y + h * D + D / 2);
    }
  }
}

void AxialRope(const detail::AxialRopeArgs& a) {
  a.transpose ? AxialRows<true>(a) : AxialRows<false>(a);
}

}  // namespace tandem::optimized::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tandem::optimized {
HWY_EXPORT(AxialRope);

namespace detail {
namespace {

/// cos and sin of `pos·f_k` for pos < positions, k < D/4, in double, rounded
/// to float: `[positions, D/4]` each.
void axial_tables(const AxialRopePlan& plan, std::int64_t positions, Buffer& cos_table,
                  Buffer& sin_table) {
  const std::int64_t Q = plan.D / 4;
  cos_table.resize(positions * Q, Buffer::Init::uninitialized);
  sin_table.resize(positions * Q, Buffer::Init::uninitialized);
  float* c = cos_table.get();
  float* s = sin_table.get();
  for (std::int64_t k = 0; k < Q; ++k) {
    // f_k = theta^(−4k/D)
    const double f_k =
        std::pow(plan.theta, -4.0 * static_cast<double>(k) / static_cast<double>(plan.D));
    for (std::int64_t pos = 0; pos < positions; ++pos) {
      const double angle = static_cast<double>(pos) * f_k;
      c[pos * Q + k] = static_cast<float>(std::cos(angle));
      s[pos * Q + k] = static_cast<float>(std::sin(angle));
    }
  }
}

void axial_rope(const AxialRopePlan& plan, const float* src, float* dst, bool transpose,
                int threads) {
  // The rotation tables, computed once per call.
  Buffer cx, sx, cy, sy;
  axial_tables(plan, plan.end_x, cx, sx);
  axial_tables(plan, plan.end_y, cy, sy);
  const AxialRopeArgs a{&plan,    src,      dst,       cx.get(), sx.get(),
                        cy.get(), sy.get(), transpose, threads};
  HWY_DYNAMIC_DISPATCH(AxialRope)(a);
}

}  // namespace

void axial_rope_forward(const AxialRopePlan& plan, std::span<const float> x, std::span<float> out,
                        const Options& options) {
  check_views(plan, x, out.size(), "x", "out");
  axial_rope(plan, x.data(), out.data(), false, threads_of(options));
}

void axial_rope_backward(const AxialRopePlan& plan, std::span<const float> dy, std::span<float> dx,
                         const Options& options) {
  check_views(plan, dy, dx.size(), "dy", "dx");
  axial_rope(plan, dy.data(), dx.data(), true, threads_of(options));
}

}  // namespace detail
}  // namespace tandem::optimized
#endif  // HWY_ONCE
