// SPDX-License-Identifier: Apache-2.0
// Optimized attention block (SPEC §7) and its dense projections, at storage
// type T = float, bfloat16 or float16.
//
// Agrees with tandem::reference::attention_block<T>
// (reference/include/tandem/reference/attention_block.hpp): within float
// rounding for float, and at bf16 and f16 it rounds to T at the same points
// (SPEC §10.2, "The attention block"). The block runs as its parts, as the
// plan describes them:
//
//     qkv  = RN_T(x · W_qkvᵀ + b_qkv)                 [B·S, 3E], project()
//     q, k = rope(qkv[:, 0:E]), rope(qkv[:, E:2E])    row stride 3E, rope_forward<T>()
//     a    = attention(q, k, v = qkv[:, 2E:3E], keep) v read in place (row stride 3E), in T
//     y    = RN_T(a · W_outᵀ + b_out)                 project()
//
// Order of operations of the projections: the reference sums each dot
// product in double and rounds once; project() keeps each output element in
// one lane of one float accumulator and runs a sequential chain of fused
// multiply-adds over k = 0..K−1 (slices of k resume the chain from the stored
// partial sum; no horizontal sums), then adds the bias and rounds the float
// sum to T once at the store. bf16 and f16 operands are widened to float32
// (exactly) as they are loaded: w as it is packed, a row block of a into the
// thread's own float block. Each element is computed by exactly one thread
// in this fixed order, so the result is bitwise the same for any thread
// count.
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

#include "convert-inl.h"
#include "gemm-inl.h"

#ifndef TANDEM_OPTIMIZED_ATTENTION_BLOCK_ONCE
#define TANDEM_OPTIMIZED_ATTENTION_BLOCK_ONCE
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "buffer.hpp"
#include "entry_points.hpp"

namespace tandem::optimized::detail {
/// One projection c[M, N] = RN_T(a[M, K] · w[N, K]ᵀ + bias[N]) at storage type T.
template <class T>
struct ProjectArgs {
  const T* a;
  const T* w;
  const T* bias;  ///< null: no bias
  T* c;
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
/// zero for q·SW + c >= N, so the micro-kernel reads whole vectors of w per k
/// (w of type T widened to float32, exactly).
template <class T>
void PackPanels(const detail::ProjectArgs<T>& p, std::int64_t SW, float* wp) {
  const std::int64_t panels = (p.N + SW - 1) / SW;
#pragma omp parallel for schedule(static) num_threads(p.threads)
  for (std::int64_t q = 0; q < panels; ++q) {
    float* dst = wp + q * p.K * SW;
    for (std::int64_t c = 0; c < SW; ++c) {
      const std::int64_t j = q * SW + c;
      const T* src = j < p.N ? p.w + j * p.K : nullptr;
      for (std::int64_t k = 0; k < p.K; ++k) {
        dst[k * SW + c] = src != nullptr ? static_cast<float>(src[k]) : 0.0f;
      }
    }
  }
}

/// Rows [i0, i0 + mb) of a `[M, K]` widened to float32 (exactly) into
/// wide `[mb, K]`, one vector at a time.
template <class T>
void WidenRows(const T* HWY_RESTRICT a, std::int64_t K, std::int64_t i0, std::int64_t mb,
               float* HWY_RESTRICT wide) {
  const DF d;
  const std::int64_t n = mb * K, L = Lanes();
  const T* HWY_RESTRICT src = a + i0 * K;
  std::int64_t i = 0;
  for (; i + L <= n; i += L) hn::StoreU(LoadWide(d, src + i), d, wide + i);
  if (i < n) StoreN(LoadWideN(d, src + i, n - i), d, wide + i, static_cast<std::size_t>(n - i));
}

/// c[r, 0 .. N) = RN_T(tile[r, 0 .. N) + bias[0 .. N)) for one row r: the
/// float sum rounded once at the store (SPEC §10.2); bias widened exactly.
template <class T>
void StoreRow(const float* HWY_RESTRICT tile, const T* bias, std::int64_t N, T* HWY_RESTRICT c) {
  const DF d;
  const std::int64_t L = Lanes();
  std::int64_t j = 0;
  for (; j + L <= N; j += L) {
    VF v = hn::LoadU(d, tile + j);
    if (bias != nullptr) v = hn::Add(v, LoadWide(d, bias + j));
    StoreRounded(d, v, c + j);
  }
  if (j < N) {
    VF v = LoadN(d, tile + j, static_cast<std::size_t>(N - j));
    if (bias != nullptr) v = hn::Add(v, LoadWideN(d, bias + j, N - j));
    StoreRoundedN(d, v, c + j, N - j);
  }
}

/// c = RN_T(a · wᵀ (+ bias)), blocked: for each block of kBlockM rows of a
/// (one thread; widened to float32 first unless T is float), for each kDepth
/// slice of k, for each packed panel of w, the attention's register-tiled
/// micro-kernel (Gemm, kMR rows × kNR vectors) accumulates into the block's
/// C tile; then the bias is added and the tile rounded out. Each C element
/// is one chain of fused multiply-adds over k = 0..K−1 in order (a slice
/// resumes from the stored partial sum), then + bias, then RN_T: bitwise the
/// same for any thread count and any blocking.
template <class T>
void ProjectT(const detail::ProjectArgs<T>& p) {
  constexpr bool kWiden = !std::is_same_v<T, float>;
  const std::int64_t SW = static_cast<std::int64_t>(kNR) * Lanes();
  const std::int64_t panels = (p.N + SW - 1) / SW, Np = panels * SW;
  const Buffer packed(panels * SW * p.K, Buffer::Init::uninitialized);
  const std::int64_t blocks = (p.M + kBlockM - 1) / kBlockM;
  const int nt =
      static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(p.threads, blocks)));
  std::vector<Buffer> tiles, wides;
  tiles.reserve(static_cast<std::size_t>(nt));
  wides.reserve(static_cast<std::size_t>(nt));
  for (int t = 0; t < nt; ++t) {
    tiles.emplace_back(kBlockM * Np, Buffer::Init::uninitialized);
    wides.emplace_back(kWiden ? kBlockM * p.K : 0, Buffer::Init::uninitialized);
  }
  PackPanels(p, SW, packed.get());
#pragma omp parallel num_threads(nt)
  {
    const auto t = static_cast<std::size_t>(omp_get_thread_num());
    float* HWY_RESTRICT tile = tiles[t].get();
    [[maybe_unused]] float* HWY_RESTRICT wide = wides[t].get();
#pragma omp for schedule(static)
    for (std::int64_t ib = 0; ib < blocks; ++ib) {
      const std::int64_t i0 = ib * kBlockM, mb = std::min(kBlockM, p.M - i0);
      // a_blk: rows i0 .. i0 + mb of a as float32, row stride K
      const float* a_blk = nullptr;
      if constexpr (kWiden) {
        WidenRows(p.a, p.K, i0, mb, wide);
        a_blk = wide;
      } else {
        a_blk = p.a + i0 * p.K;
      }
      for (std::int64_t k0 = 0; k0 < p.K; k0 += kDepth) {
        const std::int64_t kc = std::min(kDepth, p.K - k0);
        for (std::int64_t q = 0; q < panels; ++q) {
          // tile[r][q·SW + c] (+)= Σ_{k in slice} a[i0 + r, k] · w[q·SW + c, k]
          Gemm(mb, SW, kc, a_blk + k0, p.K, 1, packed.get() + (q * p.K + k0) * SW, SW,
               tile + q * SW, Np, k0 > 0);
        }
      }
      // c = RN_T(tile + bias), the padding columns dropped
      for (std::int64_t r = 0; r < mb; ++r) {
        StoreRow(tile + r * Np, p.bias, p.N, p.c + (i0 + r) * p.N);
      }
    }
  }
}

/// ProjectT at each storage type, for dynamic dispatch.
void ProjectF32(const detail::ProjectArgs<float>& p) {
  ProjectT(p);
}
void ProjectBf16(const detail::ProjectArgs<bfloat16>& p) {
  ProjectT(p);
}
void ProjectF16(const detail::ProjectArgs<float16>& p) {
  ProjectT(p);
}

}  // namespace tandem::optimized::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tandem::optimized {
HWY_EXPORT(ProjectF32);
HWY_EXPORT(ProjectBf16);
HWY_EXPORT(ProjectF16);

namespace detail {

template <class T>
void project(const T* a, const T* w, std::span<const T> bias, T* c, std::int64_t M, std::int64_t N,
             std::int64_t K, int threads) {
  const ProjectArgs<T> p{a, w, bias.empty() ? nullptr : bias.data(), c, M, N, K, threads};
  if constexpr (std::is_same_v<T, bfloat16>) {
    HWY_DYNAMIC_DISPATCH(ProjectBf16)(p);
  } else if constexpr (std::is_same_v<T, float16>) {
    HWY_DYNAMIC_DISPATCH(ProjectF16)(p);
  } else {
    HWY_DYNAMIC_DISPATCH(ProjectF32)(p);
  }
}

namespace {

/// The block's attention at storage type T: the float32 entry point, or the
/// bf16/f16 one (rounding at the plan's profile, SPEC §10.2).
template <class T>
void block_attention(const AttentionPlan& plan, const AttentionInputs<T>& in, std::span<T> out,
                     const Options& options) {
  if constexpr (std::is_same_v<T, float>) {
    attention_forward(plan, in, out, options);
  } else {
    attention_forward_stored<T>(plan, in, out, options);
  }
}

/// n elements of T in an uninitialized Buffer (every element is written
/// before it is read: no zero fill).
template <class T>
class Stored {
 public:
  explicit Stored(std::int64_t n)
      : n_(n),
        buf_((n * static_cast<std::int64_t>(sizeof(T)) + 3) / 4, Buffer::Init::uninitialized) {}
  [[nodiscard]] T* get() const { return reinterpret_cast<T*>(buf_.get()); }
  [[nodiscard]] std::span<T> span() const { return {get(), static_cast<std::size_t>(n_)}; }

 private:
  std::int64_t n_;
  Buffer buf_;
};

}  // namespace

template <class T>
void attention_block(const AttentionBlockPlan& plan, const AttentionBlockInputs<T>& in,
                     std::span<T> out, const Options& options) {
  check_views(plan, in, out.size());
  const int threads = threads_of(options);
  const std::int64_t rows = plan.B * plan.S, E = plan.E, E3 = 3 * plan.E;
  const AttentionPlan& ap = plan.attention;
  // Every buffer up front, so an allocation failure leaves out unwritten.
  const Stored<T> qkv(plan.qkv_size()), attn(ap.o.extent);
  const Stored<T> q_rot(plan.rotated_size()), k_rot(plan.rotated_size());
  // qkv = RN_T(x · W_qkvᵀ + b_qkv): [B·S, 3E], q then k then v in each row.
  project(in.x.data(), in.w_qkv.data(), in.b_qkv, qkv.get(), rows, E3, E, threads);
  // q and k rotated out of the qkv rows (row stride 3E) into contiguous [B·S, E], in T.
  const RopeTables<T> tables{in.cos, in.sin};
  const AttentionInputs<T> ai = block_attention_inputs<T>(
      plan, std::span<const T>(qkv.span()), in.keep, q_rot.span(), k_rot.span(),
      [&](const RopePlan& rp, std::span<const T> src, std::span<T> dst) {
        rope_forward<T>(rp, src, tables, dst, options);
      });
  // a = attention(q, k, v, keep): [B, S, H, D] = [B·S, E], in T.
  block_attention<T>(ap, ai, attn.span(), options);
  // y = RN_T(a · W_outᵀ + b_out)
  project(attn.get(), in.w_out.data(), in.b_out, out.data(), rows, E, E, threads);
}

template void attention_block<float>(const AttentionBlockPlan&, const AttentionBlockInputs<float>&,
                                     std::span<float>, const Options&);
template void attention_block<bfloat16>(const AttentionBlockPlan&,
                                        const AttentionBlockInputs<bfloat16>&, std::span<bfloat16>,
                                        const Options&);
template void attention_block<float16>(const AttentionBlockPlan&,
                                       const AttentionBlockInputs<float16>&, std::span<float16>,
                                       const Options&);

}  // namespace detail
}  // namespace tandem::optimized
#endif  // HWY_ONCE
