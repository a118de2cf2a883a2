// SPDX-License-Identifier: Apache-2.0
// Optimized attention block (SPEC §7) and its dense projections.
//
// Agrees with tandem::reference::attention_block
// (reference/include/tandem/reference/attention_block.hpp) within float
// rounding. The block runs as its parts, as the plan describes them:
//
//     qkv  = x · W_qkvᵀ + b_qkv                       [B·S, 3E], project()
//     q, k = rope(qkv[:, 0:E]), rope(qkv[:, E:2E])    row stride 3E, rope_forward()
//     a    = attention(q, k, v = qkv[:, 2E:3E], keep) v read in place (row stride 3E)
//     y    = a · W_outᵀ + b_out                       project()
//
// Order of operations of the projections: the reference sums each dot
// product in double; project() sums in float, per output element one vector
// of partial sums over k (lane l holds k ≡ l mod lanes), then a horizontal sum,
// then the bias. Each element is computed by exactly one thread in this fixed
// order, so the result is the same for any thread count.
//
// Why our own Highway GEMM rather than OpenBLAS: see kProjectionChoice below.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention_block.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "simd-inl.h"

#ifndef TANDEM_OPTIMIZED_ATTENTION_BLOCK_ONCE
#define TANDEM_OPTIMIZED_ATTENTION_BLOCK_ONCE
#include <algorithm>
#include <cstdint>
#include <vector>

#include "attention.hpp"
#include "streaming.hpp"

namespace tandem::optimized::detail {
/// One projection c[M, N] = a[M, K] · w[N, K]ᵀ + bias[N].
struct ProjectArgs {
  const float* a;
  const float* w;
  const float* bias;  ///< null: no bias
  float* c;
  std::int64_t M, N, K;
  int threads;
};
}  // namespace tandem::optimized::detail
#endif

HWY_BEFORE_NAMESPACE();
namespace tandem::optimized::HWY_NAMESPACE {

/// Rows of a per tile, rows of w per tile, and the cache blocks: an a block
/// of kBlockM rows stays in L1/L2 while a w block of kBlockN rows streams.
constexpr std::int64_t kTile = 4;
constexpr std::int64_t kBlockM = 32;
constexpr std::int64_t kBlockN = 64;

/// The 4×4 tile c[i0..i0+4, j0..j0+4] of a · wᵀ: 16 dot products over K, each
/// a vector of partial sums (fused multiply-adds) reduced at the end. Rows
/// past M or N are read as row M−1 / N−1 and not stored, so every element
/// runs the same instructions wherever it sits.
void Tile(const detail::ProjectArgs& p, std::int64_t i0, std::int64_t j0) {
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(d));
  const std::int64_t K = p.K;
  const auto arow = [&](std::int64_t t) { return p.a + std::min(i0 + t, p.M - 1) * K; };
  const auto wrow = [&](std::int64_t t) { return p.w + std::min(j0 + t, p.N - 1) * K; };
  const float *a0 = arow(0), *a1 = arow(1), *a2 = arow(2), *a3 = arow(3);
  const float *w0 = wrow(0), *w1 = wrow(1), *w2 = wrow(2), *w3 = wrow(3);
  V c00 = hn::Zero(d), c01 = c00, c02 = c00, c03 = c00;
  V c10 = c00, c11 = c00, c12 = c00, c13 = c00;
  V c20 = c00, c21 = c00, c22 = c00, c23 = c00;
  V c30 = c00, c31 = c00, c32 = c00, c33 = c00;
  const auto step = [&](V x0, V x1, V x2, V x3, V y0, V y1, V y2, V y3) {
    c00 = hn::MulAdd(x0, y0, c00), c01 = hn::MulAdd(x0, y1, c01);
    c02 = hn::MulAdd(x0, y2, c02), c03 = hn::MulAdd(x0, y3, c03);
    c10 = hn::MulAdd(x1, y0, c10), c11 = hn::MulAdd(x1, y1, c11);
    c12 = hn::MulAdd(x1, y2, c12), c13 = hn::MulAdd(x1, y3, c13);
    c20 = hn::MulAdd(x2, y0, c20), c21 = hn::MulAdd(x2, y1, c21);
    c22 = hn::MulAdd(x2, y2, c22), c23 = hn::MulAdd(x2, y3, c23);
    c30 = hn::MulAdd(x3, y0, c30), c31 = hn::MulAdd(x3, y1, c31);
    c32 = hn::MulAdd(x3, y2, c32), c33 = hn::MulAdd(x3, y3, c33);
  };
  std::int64_t k = 0;
  for (; k + N <= K; k += N) {
    step(hn::LoadU(d, a0 + k), hn::LoadU(d, a1 + k), hn::LoadU(d, a2 + k), hn::LoadU(d, a3 + k),
         hn::LoadU(d, w0 + k), hn::LoadU(d, w1 + k), hn::LoadU(d, w2 + k), hn::LoadU(d, w3 + k));
  }
  if (k < K) {  // the last K − k < N terms, zero-padded, through the same step
    const auto n = static_cast<std::size_t>(K - k);
    step(LoadN(d, a0 + k, n), LoadN(d, a1 + k, n), LoadN(d, a2 + k, n), LoadN(d, a3 + k, n),
         LoadN(d, w0 + k, n), LoadN(d, w1 + k, n), LoadN(d, w2 + k, n), LoadN(d, w3 + k, n));
  }
  const auto put = [&](std::int64_t r, std::int64_t t, V sum) {
    if (i0 + r >= p.M || j0 + t >= p.N) return;
    float v = hn::GetLane(hn::SumOfLanes(d, sum));
    if (p.bias != nullptr) v += p.bias[j0 + t];
    p.c[(i0 + r) * p.N + j0 + t] = v;
  };
  put(0, 0, c00), put(0, 1, c01), put(0, 2, c02), put(0, 3, c03);
  put(1, 0, c10), put(1, 1, c11), put(1, 2, c12), put(1, 3, c13);
  put(2, 0, c20), put(2, 1, c21), put(2, 2, c22), put(2, 3, c23);
  put(3, 0, c30), put(3, 1, c31), put(3, 2, c32), put(3, 3, c33);
}

void Project(const detail::ProjectArgs& p) {
  const std::int64_t blocks = (p.M + kBlockM - 1) / kBlockM;
#pragma omp parallel for schedule(static) num_threads(p.threads)
  for (std::int64_t ib = 0; ib < blocks; ++ib) {
    const std::int64_t i_end = std::min(p.M, (ib + 1) * kBlockM);
    for (std::int64_t jb = 0; jb < p.N; jb += kBlockN) {
      const std::int64_t j_end = std::min(p.N, jb + kBlockN);
      for (std::int64_t i = ib * kBlockM; i < i_end; i += kTile) {
        for (std::int64_t j = jb; j < j_end; j += kTile) Tile(p, i, j);
      }
    }
  }
}

}  // namespace tandem::optimized::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tandem::optimized {
HWY_EXPORT(Project);

namespace detail {

void project(const float* a, const float* w, std::span<const float> bias, float* c, std::int64_t M,
             std::int64_t N, std::int64_t K, int threads) {
  const ProjectArgs p{a, w, bias.empty() ? nullptr : bias.data(), c, M, N, K, threads};
  HWY_DYNAMIC_DISPATCH(Project)(p);
}

void attention_block(const AttentionBlockPlan& plan, const AttentionBlockInputs& in,
                     std::span<float> out, int threads) {
  check_views(plan, in, out.size());
  const std::int64_t rows = plan.B * plan.S, E = plan.E, E3 = 3 * plan.E;
  // qkv = x · W_qkvᵀ + b_qkv: [B·S, 3E], q then k then v in each row.
  std::vector<float> qkv(static_cast<std::size_t>(rows * E3));
  project(in.x.data(), in.w_qkv.data(), in.b_qkv, qkv.data(), rows, E3, E, threads);
  const std::span<const float> all(qkv);
  const AttentionPlan& ap = plan.attention;
  AttentionInputs<float> ai;
  std::vector<float> q_rot, k_rot;
  if (plan.has_rope) {
    // q and k rotated out of the qkv rows (row stride 3E) into contiguous [B·S, E].
    q_rot.resize(static_cast<std::size_t>(rows * E));
    k_rot.resize(q_rot.size());
    const RopeTables<float> tables{in.cos, in.sin};
    const std::int64_t src = plan.rope.src_extent();
    rope_forward(plan.rope, all.subspan(0, src), tables, q_rot, threads);
    rope_forward(plan.rope, all.subspan(E, src), tables, k_rot, threads);
    ai.q = q_rot;
    ai.k = k_rot;
  } else {
    ai.q = all.subspan(0, ap.q.extent);
    ai.k = all.subspan(E, ap.k.extent);
  }
  ai.v = all.subspan(2 * E, ap.v.extent);
  ai.mask = in.keep;
  // a = attention(q, k, v, keep): [B, S, H, D] = [B·S, E].
  std::vector<float> attn(static_cast<std::size_t>(ap.o.extent));
  attention_forward(ap, ai, attn, {}, threads);
  // y = a · W_outᵀ + b_out
  project(attn.data(), in.w_out.data(), in.b_out, out.data(), rows, E, E, threads);
}

}  // namespace detail
}  // namespace tandem::optimized
#endif  // HWY_ONCE
