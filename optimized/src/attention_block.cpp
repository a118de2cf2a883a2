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
// product in double and rounds once; project() keeps each output element in
// one lane of one float accumulator and runs a sequential chain of fused
// multiply-adds over k = 0..K−1 (slices of k resume the chain from the stored
// partial sum; no horizontal sums), then adds
// the bias. Each element is computed by exactly one thread in this fixed
// order, so the result is bitwise the same for any thread count.
//
// The projections run the attention's own register-tiled micro-kernel (Gemm,
// gemm-inl.h) over w packed once per call into panels of its width, blocked
// by rows of a and by slices of k so that the panel slice in use stays in L1
// (see Project), rather than a BLAS: a BLAS keeps its own thread pool, set
// process-wide rather than per call as Options::threads is, and ignores
// force_target(), so the tests could not run the block on every target. The
// measurements behind this choice are in bench/README.md.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention_block.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "gemm-inl.h"

#ifndef TANDEM_OPTIMIZED_ATTENTION_BLOCK_ONCE
#define TANDEM_OPTIMIZED_ATTENTION_BLOCK_ONCE
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "buffer.hpp"
#include "entry_points.hpp"

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

/// Rows of a per cache block (a block of a and its C tile stay in L2), and
/// the depth of one pass over k: a kDepth-deep slice of one packed panel
/// (kDepth × panel width floats, 24 KiB with AVX-512) stays in L1 while every
/// micro-tile of the row block runs over it.
constexpr std::int64_t kBlockM = 64;
constexpr std::int64_t kDepth = 128;

/// Packs w `[N, K]` into panels of SW = kNR·Lanes output features (the
/// micro-kernel's width): panel q holds wp[(q·K + k)·SW + c] = w[q·SW + c, k],
/// zero for q·SW + c >= N, so the micro-kernel reads whole vectors of w per k.
void PackPanels(const detail::ProjectArgs& p, std::int64_t SW, float* wp) {
  const std::int64_t panels = (p.N + SW - 1) / SW;
#pragma omp parallel for schedule(static) num_threads(p.threads)
  for (std::int64_t q = 0; q < panels; ++q) {
    float* dst = wp + q * p.K * SW;
    for (std::int64_t c = 0; c < SW; ++c) {
      const std::int64_t j = q * SW + c;
      const float* src = j < p.N ? p.w + j * p.K : nullptr;
      for (std::int64_t k = 0; k < p.K; ++k) dst[k * SW + c] = src != nullptr ? src[k] : 0.0f;
    }
  }
}

/// c = a · wᵀ (+ bias), blocked: for each block of kBlockM rows of a (one
/// thread), for each kDepth slice of k, for each packed panel of w, the
/// attention's register-tiled micro-kernel (Gemm, kMR rows × kNR
/// vectors) accumulates into the block's C tile; then the bias is added and
/// the tile copied out. Each C element is one chain of fused multiply-adds
/// over k = 0..K−1 in order (a slice resumes from the stored partial sum),
/// then + bias: bitwise the same for any thread count and any blocking.
void Project(const detail::ProjectArgs& p) {
  const std::int64_t SW = static_cast<std::int64_t>(kNR) * Lanes();
  const std::int64_t panels = (p.N + SW - 1) / SW, Np = panels * SW;
  const Buffer packed(panels * SW * p.K, Buffer::Init::uninitialized);
  const std::int64_t blocks = (p.M + kBlockM - 1) / kBlockM;
  const int nt =
      static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(p.threads, blocks)));
  std::vector<Buffer> tiles;
  tiles.reserve(static_cast<std::size_t>(nt));
  for (int t = 0; t < nt; ++t) tiles.emplace_back(kBlockM * Np, Buffer::Init::uninitialized);
  PackPanels(p, SW, packed.get());
#pragma omp parallel num_threads(nt)
  {
    float* HWY_RESTRICT tile = tiles[static_cast<std::size_t>(omp_get_thread_num())].get();
#pragma omp for schedule(static)
    for (std::int64_t ib = 0; ib < blocks; ++ib) {
      const std::int64_t i0 = ib * kBlockM, mb = std::min(kBlockM, p.M - i0);
      for (std::int64_t k0 = 0; k0 < p.K; k0 += kDepth) {
        const std::int64_t kc = std::min(kDepth, p.K - k0);
        for (std::int64_t q = 0; q < panels; ++q) {
          // tile[r][q·SW + c] (+)= Σ_{k in slice} a[i0 + r, k] · w[q·SW + c, k]
          Gemm(mb, SW, kc, p.a + i0 * p.K + k0, p.K, 1, packed.get() + (q * p.K + k0) * SW, SW,
               tile + q * SW, Np, k0 > 0);
        }
      }
      // c = tile + bias, the padding columns dropped
      for (std::int64_t r = 0; r < mb; ++r) {
        float* HWY_RESTRICT dst = p.c + (i0 + r) * p.N;
        const float* HWY_RESTRICT src = tile + r * Np;
        if (p.bias == nullptr) {
          std::copy_n(src, p.N, dst);
        } else {
          for (std::int64_t j = 0; j < p.N; ++j) dst[j] = src[j] + p.bias[j];
        }
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
                     std::span<float> out, const Options& options) {
  check_views(plan, in, out.size());
  const int threads = threads_of(options);
  const std::int64_t rows = plan.B * plan.S, E = plan.E, E3 = 3 * plan.E;
  const AttentionPlan& ap = plan.attention;
  // Every buffer up front, so an allocation failure leaves out unwritten.
  // Every element is written before it is read: no zero fill.
  constexpr auto kUninitialized = Buffer::Init::uninitialized;
  const Buffer qkv(rows * E3, kUninitialized), attn(ap.o.extent, kUninitialized);
  const Buffer q_rot(plan.has_rope ? rows * E : 0, kUninitialized),
      k_rot(plan.has_rope ? rows * E : 0, kUninitialized);
  // qkv = x · W_qkvᵀ + b_qkv: [B·S, 3E], q then k then v in each row.
  project(in.x.data(), in.w_qkv.data(), in.b_qkv, qkv.get(), rows, E3, E, threads);
  const std::span<const float> all = qkv.span();
  AttentionInputs<float> ai;
  if (plan.has_rope) {
    // q and k rotated out of the qkv rows (row stride 3E) into contiguous [B·S, E].
    const RopeTables<float> tables{in.cos, in.sin};
    const std::int64_t src = plan.rope.src_extent();
    rope_forward<float>(plan.rope, all.subspan(0, src), tables, q_rot.span(), options);
    rope_forward<float>(plan.rope, all.subspan(E, src), tables, k_rot.span(), options);
    ai.q = q_rot.span();
    ai.k = k_rot.span();
  } else {
    ai.q = all.subspan(0, ap.q.extent);
    ai.k = all.subspan(E, ap.k.extent);
  }
  ai.v = all.subspan(2 * E, ap.v.extent);
  ai.mask = in.keep;
  // a = attention(q, k, v, keep): [B, S, H, D] = [B·S, E].
  attention_forward(ap, ai, attn.span(), options);
  // y = a · W_outᵀ + b_out
  project(attn.get(), in.w_out.data(), in.b_out, out.data(), rows, E, E, threads);
}

}  // namespace detail
}  // namespace tandem::optimized
#endif  // HWY_ONCE
