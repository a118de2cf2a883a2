// SPDX-License-Identifier: Apache-2.0
// Optimized RoPE, forward and backward, of one tensor or of q and k (SPEC §4).
//
// Agrees with tandem::reference::rope_forward / rope_backward and
// rope_forward_qk / rope_backward_qk (reference/include/tandem/reference/rope.hpp)
// within float rounding; the q-and-k call does in one pass over the tokens
// what the reference does as two calls. The order of operations differs: the
// reference widens x, c_i and s_i to double, forms x[p]·c_i − x[q]·s_i there
// and rounds once; here each output is one float fused multiply-add on one
// rounded float product (see RotatePairs in rotate_pairs-inl.h), about 1 ulp
// apart. The backward rotates by −angle by negating the sines, which is exact.
//
// Storage types (SPEC §10.2): x, the tables and the output are all T, float,
// bfloat16 or float16. A bf16 or f16 call widens x and the tables to float
// exactly, rotates as the float call does and rounds each output once to T:
// its output is RN_T of the float call's on the widened inputs, bit for bit
// (tests/test_optimized_storage_ops.cpp).
//
// Layout of the loop: the source is walked in memory order, one OpenMP
// iteration per token (b, s) for bshd and thd (RopeByToken: the token's table
// row — position, token or position id — is found once for every head of x,
// or of q and then k) and one per block of 128 tokens for bhsd (RopeByHead:
// each head's contiguous run of the block's rows), with a static schedule.
// Each head rotates its m = n_rot/2 pairs with vectors of pairs i (NeoX: x[i]
// and x[i+m] are two contiguous runs; GPT-J: LoadInterleaved2 splits x[2i]
// and x[2i+1] into two vectors) against the contiguous table row c[0..m),
// s[0..m); dims n_rot..D−1 are copied. Heads are found through the plan's
// Strides.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "rope.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "rotate_pairs-inl.h"
#include "simd-inl.h"

#ifndef TANDEM_OPTIMIZED_ROPE_ONCE
#define TANDEM_OPTIMIZED_ROPE_ONCE
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "entry_points.hpp"

namespace tandem::optimized::detail {
/// One tensor of a RoPE call, after validation: its plan, source and output.
template <class T>
struct RopeTensor {
  const RopePlan* plan;
  const T* src;
  T* dst;
};
/// The raw pointers of one RoPE call (x alone, or q and k), after validation.
/// Every tensor has the tokens and tables of tensors[0].
template <class T>
struct RopeArgs {
  RopeTensor<T> tensors[2];
  int count;  ///< 1, or 2 for q and k
  const T* cos;
  const T* sin;
  Indices positions;
  bool transpose;  ///< the backward: rotate by −angle
  int threads;
};
}  // namespace tandem::optimized::detail
#endif

HWY_BEFORE_NAMESPACE();
namespace tandem::optimized::HWY_NAMESPACE {

/// Head h of token (b, s) of one tensor, rotated by the table row c, sn.
template <bool kInterleaved, bool kTranspose, class T>
void RotateHead(const detail::RopeTensor<T>& t, std::int64_t b, std::int64_t s, std::int64_t h,
                const T* c, const T* sn) {
  const RopePlan& plan = *t.plan;
  const T* x = t.src + plan.src.at(b, s, h);
  T* y = t.dst + plan.out.at(b, s, h);
  RotatePairs<kInterleaved, kTranspose>(x, c, sn, plan.n_rot / 2, y);
  const std::int64_t pass = plan.D - plan.n_rot;  // dims n_rot..D−1, copied (RN_T(x) = x)
  if (pass > 0) {
    std::memcpy(y + plan.n_rot, x + plan.n_rot, static_cast<std::size_t>(pass) * sizeof(T));
  }
}

/// bshd, thd: one iteration per token (b, s), whose heads (of x, or of q and
/// then k) sit side by side in one row; the table row is found once per token.
template <bool kInterleaved, bool kTranspose, class T>
void RopeByToken(const detail::RopeArgs<T>& a) {
  const RopePlan& plan = *a.tensors[0].plan;
  const std::int64_t tokens = plan.B * plan.S;
#pragma omp parallel for schedule(static) num_threads(a.threads)
  for (std::int64_t r = 0; r < tokens; ++r) {
    const std::int64_t b = r / plan.S, s = r % plan.S;
    const std::int64_t row = plan.table_row(b, s, a.positions);
    const T* c = a.cos + row * plan.T;
    const T* sn = a.sin + row * plan.T;
    for (int t = 0; t < a.count; ++t) {
      for (std::int64_t h = 0; h < a.tensors[t].plan->heads(); ++h) {
        RotateHead<kInterleaved, kTranspose>(a.tensors[t], b, s, h, c, sn);
      }
    }
  }
}

/// Tokens per block of RopeByHead: their table rows (64 KiB of cos and sin at
/// T = 64) stay in cache while every head's run of them (64 KiB at D = 128)
/// streams by; 32-token blocks measured about 10 % slower (bench/README.md).
constexpr std::int64_t kBlockTokens = 128;

/// bhsd: one iteration per block of kBlockTokens tokens of one batch entry;
/// every head (of x, or of q's heads and then k's) rotates its contiguous run
/// of the block's rows in memory order. Token-major order keeps 2·H streams
/// open at once, head-major order over whole sequences streams the table once
/// per head: both measured 10–20 % below bshd (bench/README.md).
template <bool kInterleaved, bool kTranspose, class T>
void RopeByHead(const detail::RopeArgs<T>& a) {
  const RopePlan& plan = *a.tensors[0].plan;
  const std::int64_t blocks = (plan.S + kBlockTokens - 1) / kBlockTokens;
#pragma omp parallel for schedule(static) num_threads(a.threads)
  for (std::int64_t u = 0; u < plan.B * blocks; ++u) {
    const std::int64_t b = u / blocks, s0 = (u % blocks) * kBlockTokens;
    const std::int64_t s1 = std::min(s0 + kBlockTokens, plan.S);
    for (int t = 0; t < a.count; ++t) {
      for (std::int64_t h = 0; h < a.tensors[t].plan->heads(); ++h) {
        for (std::int64_t s = s0; s < s1; ++s) {
          const std::int64_t row = plan.table_row(b, s, a.positions);
          RotateHead<kInterleaved, kTranspose>(a.tensors[t], b, s, h, a.cos + row * plan.T,
                                               a.sin + row * plan.T);
        }
      }
    }
  }
}

template <bool kInterleaved, bool kTranspose, class T>
void RopeIn(const detail::RopeArgs<T>& a) {
  if (a.tensors[0].plan->layout == RopeLayout::bhsd) {
    RopeByHead<kInterleaved, kTranspose>(a);
  } else {
    RopeByToken<kInterleaved, kTranspose>(a);
  }
}

template <class T>
void Rope(const detail::RopeArgs<T>& a) {
  const bool gptj = a.tensors[0].plan->style == RopeStyle::gptj;
  if (gptj) {
    a.transpose ? RopeIn<true, true>(a) : RopeIn<true, false>(a);
  } else {
    a.transpose ? RopeIn<false, true>(a) : RopeIn<false, false>(a);
  }
}

/// Rope at each storage type, one exported function per type.
void RopeF32(const detail::RopeArgs<float>& a) {
  Rope(a);
}
void RopeBF16(const detail::RopeArgs<bfloat16>& a) {
  Rope(a);
}
void RopeF16(const detail::RopeArgs<float16>& a) {
  Rope(a);
}

}  // namespace tandem::optimized::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tandem::optimized {
HWY_EXPORT(RopeF32);
HWY_EXPORT(RopeBF16);
HWY_EXPORT(RopeF16);

namespace detail {

namespace {
/// Rotates `count` validated tensors that share tokens and tables.
template <class T>
void rope(const RopeTensor<T> (&tensors)[2], int count, const RopeTables<T>& tables, bool transpose,
          int threads) {
  const RopeArgs<T> a{{tensors[0], tensors[1]},
                      count,
                      tables.cos.data(),
                      tables.sin.data(),
                      tables.positions,
                      transpose,
                      threads};
  if constexpr (std::is_same_v<T, float>) {
    HWY_DYNAMIC_DISPATCH(RopeF32)(a);
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    HWY_DYNAMIC_DISPATCH(RopeBF16)(a);
  } else {
    static_assert(std::is_same_v<T, float16>);
    HWY_DYNAMIC_DISPATCH(RopeF16)(a);
  }
}
}  // namespace

template <class T>
void rope_forward(const RopePlan& plan, std::span<const T> x, const RopeTables<T>& tables,
                  std::span<T> out, const Options& options) {
  check_views(plan, x, tables, out.size(), "x", "out");
  rope<T>({{&plan, x.data(), out.data()}, {}}, 1, tables, false, threads_of(options));
}

template <class T>
void rope_backward(const RopePlan& plan, std::span<const T> dy, const RopeTables<T>& tables,
                   std::span<T> dx, const Options& options) {
  check_views(plan, dy, tables, dx.size(), "dy", "dx");
  rope<T>({{&plan, dy.data(), dx.data()}, {}}, 1, tables, true, threads_of(options));
}

template <class T>
void rope_qk(const RopeQkPlan& plan, std::span<const T> q, std::span<const T> k,
             const RopeTables<T>& tables, std::span<T> q_dst, std::span<T> k_dst, bool transpose,
             const Options& options) {
  check_views(plan, q, k, tables, q_dst.size(), k_dst.size(),
              transpose ? kRopeQkBackward : kRopeQkForward);
  rope<T>({{&plan.q, q.data(), q_dst.data()}, {&plan.k, k.data(), k_dst.data()}}, 2, tables,
          transpose, threads_of(options));
}

template void rope_forward(const RopePlan&, std::span<const float>, const RopeTables<float>&,
                           std::span<float>, const Options&);
template void rope_backward(const RopePlan&, std::span<const float>, const RopeTables<float>&,
                            std::span<float>, const Options&);
template void rope_qk(const RopeQkPlan&, std::span<const float>, std::span<const float>,
                      const RopeTables<float>&, std::span<float>, std::span<float>, bool,
                      const Options&);
template void rope_forward(const RopePlan&, std::span<const bfloat16>, const RopeTables<bfloat16>&,
                           std::span<bfloat16>, const Options&);
template void rope_backward(const RopePlan&, std::span<const bfloat16>, const RopeTables<bfloat16>&,
                            std::span<bfloat16>, const Options&);
template void rope_qk(const RopeQkPlan&, std::span<const bfloat16>, std::span<const bfloat16>,
                      const RopeTables<bfloat16>&, std::span<bfloat16>, std::span<bfloat16>, bool,
                      const Options&);
template void rope_forward(const RopePlan&, std::span<const float16>, const RopeTables<float16>&,
                           std::span<float16>, const Options&);
template void rope_backward(const RopePlan&, std::span<const float16>, const RopeTables<float16>&,
                            std::span<float16>, const Options&);
template void rope_qk(const RopeQkPlan&, std::span<const float16>, std::span<const float16>,
                      const RopeTables<float16>&, std::span<float16>, std::span<float16>, bool,
                      const Options&);

}  // namespace detail
}  // namespace tandem::optimized
#endif  // HWY_ONCE
