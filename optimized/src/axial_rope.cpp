// SPDX-License-Identifier: Apache-2.0
// Optimized axial 2-D RoPE, forward and backward (SPEC §5).
//
// Agrees with tandem::reference::axial_rope_forward / axial_rope_backward
// (reference/include/tandem/reference/axial_rope.hpp) within float rounding,
// at every storage type T (float, bfloat16, float16: x and the output). A
// bf16 or f16 call widens x to float exactly, rotates as the float call does
// (the same float tables) and rounds each output once to T (SPEC §10.2): its
// output is RN_T of the float call's on the widened input, bit for bit
// (tests/test_optimized_storage_ops.cpp).
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
// RotatePairs in rotate_pairs-inl.h).

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "axial_rope.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "rotate_pairs-inl.h"
#include "simd-inl.h"

#ifndef TANDEM_OPTIMIZED_AXIAL_ROPE_ONCE
#define TANDEM_OPTIMIZED_AXIAL_ROPE_ONCE
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "buffer.hpp"
#include "entry_points.hpp"

namespace tandem::optimized::detail {
/// One axial RoPE call after validation, with its per-call tables (float
/// whatever T is).
template <class T>
struct AxialRopeArgs {
  const AxialRopePlan* plan;
  const T* src;
  T* dst;
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

template <bool kTranspose, class T>
void AxialRows(const detail::AxialRopeArgs<T>& a) {
  const AxialRopePlan& plan = *a.plan;
  const std::int64_t rows = plan.B * plan.S;
  const std::int64_t D = plan.D, W = plan.W, Q = plan.D / 4;
  const std::int64_t grid = plan.end_x * plan.end_y;
#pragma omp parallel for schedule(static) num_threads(a.threads)
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t s = r % plan.S;
    const std::int64_t p = s % grid;
    const std::int64_t px = p % plan.end_x, py = p / plan.end_x;
    const T* x = a.src + r * plan.src_row_stride;
    T* y = a.dst + r * W;
    for (std::int64_t h = 0; h < plan.num_heads; ++h) {
      // pairs j < D/4: angle px·f_j; pairs j >= D/4: angle py·f_{j−D/4}
      RotatePairs<true, kTranspose>(x + h * D, a.cx + px * Q, a.sx + px * Q, Q, y + h * D);
      RotatePairs<true, kTranspose>(x + h * D + D / 2, a.cy + py * Q, a.sy + py * Q, Q,
                                    y + h * D + D / 2);
    }
  }
}

template <class T>
void AxialRope(const detail::AxialRopeArgs<T>& a) {
  a.transpose ? AxialRows<true>(a) : AxialRows<false>(a);
}

/// AxialRope at each storage type, one exported function per type.
void AxialRopeF32(const detail::AxialRopeArgs<float>& a) {
  AxialRope(a);
}
void AxialRopeBF16(const detail::AxialRopeArgs<bfloat16>& a) {
  AxialRope(a);
}
void AxialRopeF16(const detail::AxialRopeArgs<float16>& a) {
  AxialRope(a);
}

}  // namespace tandem::optimized::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tandem::optimized {
HWY_EXPORT(AxialRopeF32);
HWY_EXPORT(AxialRopeBF16);
HWY_EXPORT(AxialRopeF16);

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

template <class T>
void axial_rope(const AxialRopePlan& plan, const T* src, T* dst, bool transpose, int threads) {
  // The rotation tables, computed once per call.
  Buffer cx, sx, cy, sy;
  axial_tables(plan, plan.end_x, cx, sx);
  axial_tables(plan, plan.end_y, cy, sy);
  const AxialRopeArgs<T> a{&plan,    src,      dst,       cx.get(), sx.get(),
                           cy.get(), sy.get(), transpose, threads};
  if constexpr (std::is_same_v<T, float>) {
    HWY_DYNAMIC_DISPATCH(AxialRopeF32)(a);
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    HWY_DYNAMIC_DISPATCH(AxialRopeBF16)(a);
  } else {
    static_assert(std::is_same_v<T, float16>);
    HWY_DYNAMIC_DISPATCH(AxialRopeF16)(a);
  }
}

}  // namespace

template <class T>
void axial_rope_forward(const AxialRopePlan& plan, std::span<const T> x, std::span<T> out,
                        const Options& options) {
  check_views(plan, x, out.size(), "x", "out");
  axial_rope(plan, x.data(), out.data(), false, threads_of(options));
}

template <class T>
void axial_rope_backward(const AxialRopePlan& plan, std::span<const T> dy, std::span<T> dx,
                         const Options& options) {
  check_views(plan, dy, dx.size(), "dy", "dx");
  axial_rope(plan, dy.data(), dx.data(), true, threads_of(options));
}

template void axial_rope_forward(const AxialRopePlan&, std::span<const float>, std::span<float>,
                                 const Options&);
template void axial_rope_forward(const AxialRopePlan&, std::span<const bfloat16>,
                                 std::span<bfloat16>, const Options&);
template void axial_rope_forward(const AxialRopePlan&, std::span<const float16>, std::span<float16>,
                                 const Options&);
template void axial_rope_backward(const AxialRopePlan&, std::span<const float>, std::span<float>,
                                  const Options&);
template void axial_rope_backward(const AxialRopePlan&, std::span<const bfloat16>,
                                  std::span<bfloat16>, const Options&);
template void axial_rope_backward(const AxialRopePlan&, std::span<const float16>,
                                  std::span<float16>, const Options&);

}  // namespace detail
}  // namespace tandem::optimized
#endif  // HWY_ONCE
