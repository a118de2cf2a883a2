// SPDX-License-Identifier: Apache-2.0
// Optimized RoPE, forward and backward, of one tensor or of q and k (SPEC §4).
//
// Agrees with tandem::reference::rope_forward / rope_backward and
// rope_forward_qk / rope_backward_qk (reference/include/tandem/reference/rope.hpp)
// within float rounding; the q-and-k call does in one pass over the tokens
// what the reference does as two calls. The
// order of operations differs: the reference widens x, c_i and s_i to double,
// forms x[p]·c_i − x[q]·s_i there and rounds once; here each output is one
// float fused multiply-add on one rounded float product (see RotatePairs in
// simd-inl.h), about 1 ulp apart. The backward rotates by −angle by negating
// the sines, which is exact.
//
// Layout of the loop: one OpenMP iteration per token (b, s) with a static
// schedule; the token's table row (position, token or position id) is found
// once and every head of the token — of x, or of q and then k in the q-and-k
// call — rotates its m = n_rot/2 pairs with vectors of pairs i (NeoX: x[i]
// and x[i+m] are two contiguous runs; GPT-J: LoadInterleaved2 splits x[2i]
// and x[2i+1] into two vectors) against the contiguous table row c[0..m),
// s[0..m); dims n_rot..D−1 are copied. Heads are found through the plan's
// Strides, so every layout runs the same loop.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "rope.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "simd-inl.h"

#ifndef TANDEM_OPTIMIZED_ROPE_ONCE
#define TANDEM_OPTIMIZED_ROPE_ONCE
#include <cstdint>
#include <cstring>

#include "streaming.hpp"

namespace tandem::optimized::detail {
/// One tensor of a RoPE call, after validation: its plan, source and output.
struct RopeTensor {
  const RopePlan* plan;
  const float* src;
  float* dst;
};
/// The raw pointers of one RoPE call (x alone, or q and k), after validation.
/// Every tensor has the tokens and tables of tensors[0].
struct RopeArgs {
  RopeTensor tensors[2];
  int count;  ///< 1, or 2 for q and k
  const float* cos;
  const float* sin;
  Indices positions;
  bool transpose;  ///< the backward: rotate by −angle
  int threads;
};
}  // namespace tandem::optimized::detail
#endif

HWY_BEFORE_NAMESPACE();
namespace tandem::optimized::HWY_NAMESPACE {

/// Every head of token (b, s) of one tensor, rotated by the table row c, sn.
template <bool kInterleaved, bool kTranspose>
void RopeHeads(const detail::RopeTensor& t, std::int64_t b, std::int64_t s, const float* c,
               const float* sn) {
  const RopePlan& plan = *t.plan;
  const std::int64_t m = plan.n_rot / 2;
  const std::int64_t pass = plan.D - plan.n_rot;  // dims n_rot..D−1, copied
  for (std::int64_t h = 0; h < plan.heads(); ++h) {
    const float* x = t.src + plan.src.at(b, s, h);
    float* y = t.dst + plan.out.at(b, s, h);
    RotatePairs<kInterleaved, kTranspose>(x, c, sn, m, y);
    if (pass > 0) {
      std::memcpy(y + plan.n_rot, x + plan.n_rot, static_cast<std::size_t>(pass) * sizeof(float));
    }
  }
}

template <bool kInterleaved, bool kTranspose>
void RopeRows(const detail::RopeArgs& a) {
  const RopePlan& plan = *a.tensors[0].plan;
  const std::int64_t tokens = plan.B * plan.S;
#pragma omp parallel for schedule(static) num_threads(a.threads)
  for (std::int64_t r = 0; r < tokens; ++r) {
    const std::int64_t b = r / plan.S, s = r % plan.S;
    const std::int64_t row = plan.table_row(b, s, a.positions);
    const float* c = a.cos + row * plan.T;
    const float* sn = a.sin + row * plan.T;
    for (int t = 0; t < a.count; ++t) {
      RopeHeads<kInterleaved, kTranspose>(a.tensors[t], b, s, c, sn);
    }
  }
}

void Rope(const detail::RopeArgs& a) {
  const bool gptj = a.tensors[0].plan->style == RopeStyle::gptj;
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

namespace {
/// Rotates `count` validated tensors that share tokens and tables.
void rope(const RopeTensor (&tensors)[2], int count, const RopeTables<float>& tables,
          bool transpose, int threads) {
  const RopeArgs a{{tensors[0], tensors[1]},
                   count,
                   tables.cos.data(),
                   tables.sin.data(),
                   tables.positions,
                   transpose,
                   threads};
  HWY_DYNAMIC_DISPATCH(Rope)(a);
}
}  // namespace

void rope_forward(const RopePlan& plan, std::span<const float> x, const RopeTables<float>& tables,
                  std::span<float> out, int threads) {
  check_views(plan, x, tables, out.size(), "x", "out");
  rope({{&plan, x.data(), out.data()}, {}}, 1, tables, false, threads);
}

void rope_backward(const RopePlan& plan, std::span<const float> dy, const RopeTables<float>& tables,
                   std::span<float> dx, int threads) {
  check_views(plan, dy, tables, dx.size(), "dy", "dx");
  rope({{&plan, dy.data(), dx.data()}, {}}, 1, tables, true, threads);
}

void rope_qk(const RopeQkPlan& plan, std::span<const float> q, std::span<const float> k,
             const RopeTables<float>& tables, std::span<float> q_dst, std::span<float> k_dst,
             bool transpose, int threads) {
  check_views(plan, q, k, tables, q_dst.size(), k_dst.size(),
              transpose ? kRopeQkBackward : kRopeQkForward);
  rope({{&plan.q, q.data(), q_dst.data()}, {&plan.k, k.data(), k_dst.data()}}, 2, tables, transpose,
       threads);
}

}  // namespace detail
}  // namespace tandem::optimized
#endif  // HWY_ONCE
