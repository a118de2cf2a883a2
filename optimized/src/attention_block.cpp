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
// multiply-adds over k = 0..K−1 (no K blocking, no horizontal sums), then adds
// the bias. Each element is computed by exactly one thread in this fixed
// order, so the result is bitwise the same for any thread count.
//
// Why our own Highway GEMM and not OpenBLAS (Debian's 0.3.21, pthread build):
// at the block's size, x[4096, 768] · W_qkv[2304, 768]ᵀ, the two ran at the
// same speed on one AVX-512 core (best of 6: 48–51 GFLOP/s here vs 45–49 for
// cblas_sgemm; a first unpacked dot-product kernel reached only ~30–36 and
// lost), so nothing is gained by the dependency, and it costs: OpenBLAS keeps
// its own pthread pool, set only process-wide (openblas_set_num_threads, not
// per call as Options::threads is), whose workers spin for a while after each
// call and compete with the OpenMP attention that follows (on the shared
// 2-core machine we measured on, too noisy to quantify); its
// thread-count independence is observed, not documented; and it ignores
// force_target(), so the tests could not run the block on every target. The
// kernel here is the classic packed one: w is packed once per call into
// panels of 2 vectors of output features, and a 6-row × 2-vector tile of
// accumulators takes 12 fused multiply-adds per k from 2 panel loads and 6
// broadcasts of a.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention_block.cpp"
#include <hwy/aligned_allocator.h>
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

/// Rows of a per micro-tile, and rows of a per cache block: a block of
/// kBlockM rows of a stays in L2 while the packed panels of w stream past it.
constexpr std::int64_t kRows = 6;
constexpr std::int64_t kBlockM = 48;

/// Packs w `[N, K]` into panels of P = 2·Lanes output features: panel q holds
/// wp[(q·K + k)·P + c] = w[q·P + c, k], zero for q·P + c >= N, so the micro
/// kernel reads two contiguous vectors of w per k.
template <class D>
void PackPanels(D d, const detail::ProjectArgs& p, float* wp) {
  const std::int64_t P = 2 * static_cast<std::int64_t>(hn::Lanes(d));
  const std::int64_t panels = (p.N + P - 1) / P;
#pragma omp parallel for schedule(static) num_threads(p.threads)
  for (std::int64_t q = 0; q < panels; ++q) {
    float* dst = wp + q * p.K * P;
    for (std::int64_t c = 0; c < P; ++c) {
      const std::int64_t j = q * P + c;
      if (j < p.N) {
        const float* src = p.w + j * p.K;
        for (std::int64_t k = 0; k < p.K; ++k) dst[k * P + c] = src[k];
      } else {
        for (std::int64_t k = 0; k < p.K; ++k) dst[k * P + c] = 0.0f;
      }
    }
  }
}

/// c[i0..i0+6, q·P..q·P+P) of a · wᵀ (+ bias): 6 rows × 2 vectors of
/// accumulators; per k, two loads of the packed panel and one broadcast of
/// a[i, k] per row feed 12 fused multiply-adds. Each c element is one lane of
/// one accumulator: a sequential chain of multiply-adds over k = 0..K−1.
/// Rows past M are read as row M−1 and not stored.
template <class D>
void MicroTile(D d, const detail::ProjectArgs& p, const float* panel, std::int64_t i0,
               std::int64_t j0) {
  using V = hn::Vec<D>;
  const std::int64_t L = static_cast<std::int64_t>(hn::Lanes(d)), P = 2 * L;
  const auto arow = [&](std::int64_t t) { return p.a + std::min(i0 + t, p.M - 1) * p.K; };
  const float *a0 = arow(0), *a1 = arow(1), *a2 = arow(2), *a3 = arow(3), *a4 = arow(4),
              *a5 = arow(5);
  V c00 = hn::Zero(d), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
  V c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  for (std::int64_t k = 0; k < p.K; ++k) {
    const V w0 = hn::Load(d, panel + k * P), w1 = hn::Load(d, panel + k * P + L);
    V x = hn::Set(d, a0[k]);
    c00 = hn::MulAdd(x, w0, c00), c01 = hn::MulAdd(x, w1, c01);
    x = hn::Set(d, a1[k]);
    c10 = hn::MulAdd(x, w0, c10), c11 = hn::MulAdd(x, w1, c11);
    x = hn::Set(d, a2[k]);
    c20 = hn::MulAdd(x, w0, c20), c21 = hn::MulAdd(x, w1, c21);
    x = hn::Set(d, a3[k]);
    c30 = hn::MulAdd(x, w0, c30), c31 = hn::MulAdd(x, w1, c31);
    x = hn::Set(d, a4[k]);
    c40 = hn::MulAdd(x, w0, c40), c41 = hn::MulAdd(x, w1, c41);
    x = hn::Set(d, a5[k]);
    c50 = hn::MulAdd(x, w0, c50), c51 = hn::MulAdd(x, w1, c51);
  }
  // Columns j0 + [0, L) and j0 + [L, 2L), clipped at N; bias added last.
  const std::int64_t n0 = std::clamp<std::int64_t>(p.N - j0, 0, L);
  const std::int64_t n1 = std::clamp<std::int64_t>(p.N - j0 - L, 0, L);
  const auto put = [&](std::int64_t r, V lo, V hi) {
    if (i0 + r >= p.M) return;
    float* row = p.c + (i0 + r) * p.N + j0;
    const auto store = [&](V v, float* dst, const float* bias, std::int64_t n) {
      if (n == 0) return;
      if (bias != nullptr) v = hn::Add(v, n == L ? hn::LoadU(d, bias) : LoadN(d, bias, n));
      n == L ? hn::StoreU(v, d, dst) : StoreN(v, d, dst, static_cast<std::size_t>(n));
    };
    const float* bias = p.bias == nullptr ? nullptr : p.bias + j0;
    store(lo, row, bias, n0);
    store(hi, row + L, bias == nullptr ? nullptr : bias + L, n1);
  };
  put(0, c00, c01), put(1, c10, c11), put(2, c20, c21);
  put(3, c30, c31), put(4, c40, c41), put(5, c50, c51);
}

void Project(const detail::ProjectArgs& p) {
  const hn::ScalableTag<float> d;
  const std::int64_t P = 2 * static_cast<std::int64_t>(hn::Lanes(d));
  const std::int64_t panels = (p.N + P - 1) / P;
  const auto packed = hwy::AllocateAligned<float>(static_cast<std::size_t>(panels * P * p.K));
  PackPanels(d, p, packed.get());
  const std::int64_t blocks = (p.M + kBlockM - 1) / kBlockM;
#pragma omp parallel for schedule(static) num_threads(p.threads)
  for (std::int64_t ib = 0; ib < blocks; ++ib) {
    const std::int64_t i_end = std::min(p.M, (ib + 1) * kBlockM);
    for (std::int64_t q = 0; q < panels; ++q) {
      const float* panel = packed.get() + q * p.K * P;
      for (std::int64_t i = ib * kBlockM; i < i_end; i += kRows) MicroTile(d, p, panel, i, q * P);
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
