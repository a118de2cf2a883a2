// SPDX-License-Identifier: Apache-2.0
// The AVX512-BF16 kernels of bf16_dot.hpp: register-blocked vdpbf16ps
// (_mm512_dpbf16_ps) products, compiled for that instruction set alone
// (the target attribute below), so that the rest of the library runs on any
// x86-64 and these run only where Supported() says the CPU has them.
//
// What vdpbf16ps computes (Intel SDM, VDPBF16PS): for each float lane i,
//   acc_i <- RN(RN(acc_i + a_{2i+1}·b_{2i+1}) + a_{2i}·b_{2i}),
// a product of two bf16 values is exact in float (8 + 8 significant bits),
// each sum is rounded to nearest even in float, and denormal inputs and
// results are flushed to zero whatever MXCSR says (DAZ, FTZ). So a chain of
// pairs is the float fused multiply-add chain of the portable tiles in
// another order, with the same error bound (SPEC §10.5); the flushes are
// what the callers keep out (attention_forward_bf16_tile-inl.h: blocks with
// denormal operands take the float path).
#include "bf16_dot.hpp"

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "tandem/optimized/backend.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TANDEM_BF16_DOT_X86 1
#else
#define TANDEM_BF16_DOT_X86 0
#endif

namespace tandem::optimized::bf16dot {
namespace {

/// Off by default: on the AVX512-BF16 CPU measured (bench/README.md, bf16
/// prefill) the float products were faster.
std::atomic<bool> enabled{false};

#if TANDEM_BF16_DOT_X86
#define TANDEM_BF16_TARGET __attribute__((target("avx512bf16,avx512bw,avx512vl,avx512f")))

/// acc[j][v] += Σ_p ⟨A[p][v], B[j][p]⟩ for NJ outputs (keys, or dv) times NV
/// vectors of rows, pairs p in order: A the rows' words (lines a_stride
/// words apart, one vector = kLanes rows), B the words broadcast per output
/// (b_stride apart from one output to the next, b_step from one pair to the
/// next).
template <int NJ, int NV>
TANDEM_BF16_TARGET inline void Chains(const std::uint32_t* A, std::int64_t a_stride,
                                      const std::uint32_t* B, std::int64_t b_stride,
                                      std::int64_t b_step, std::int64_t pairs,
                                      __m512 (&acc)[NJ][NV]) {
  for (std::int64_t p = 0; p < pairs; ++p) {
    __m512bh a[NV];
    for (int v = 0; v < NV; ++v) {
      a[v] = (__m512bh)_mm512_loadu_si512(A + p * a_stride + v * kLanes);
    }
    for (int j = 0; j < NJ; ++j) {
      const __m512bh b =
          (__m512bh)_mm512_set1_epi32(static_cast<int>(B[j * b_stride + p * b_step]));
      for (int v = 0; v < NV; ++v) acc[j][v] = _mm512_dpbf16_ps(acc[j][v], a[v], b);
    }
  }
}

/// Scores for NJ keys from jj and NV vectors of rows from r0.
template <int NJ, int NV>
TANDEM_BF16_TARGET void ScoreTile(const std::uint32_t* Kb, std::int64_t jj, std::int64_t pairs,
                                  const std::uint32_t* Qb, std::int64_t qs, std::int64_t r0,
                                  float factor, float* St, std::int64_t R) {
  __m512 acc[NJ][NV];
  for (int j = 0; j < NJ; ++j) {
    for (int v = 0; v < NV; ++v) acc[j][v] = _mm512_setzero_ps();
  }
  Chains<NJ, NV>(Qb + r0, qs, Kb + jj * pairs, pairs, 1, pairs, acc);
  const __m512 f = _mm512_set1_ps(factor);
  for (int j = 0; j < NJ; ++j) {
    for (int v = 0; v < NV; ++v) {
      _mm512_storeu_ps(St + (jj + j) * R + r0 + v * kLanes, _mm512_mul_ps(acc[j][v], f));
    }
  }
}

/// Ot += P·V for NJ outputs from dv and NV vectors of rows from r0.
template <int NJ, int NV>
TANDEM_BF16_TARGET void ValueTile(const std::uint32_t* Pb, std::int64_t ps, std::int64_t pairs,
                                  const std::uint32_t* Vb, std::int64_t Dv, std::int64_t dv,
                                  std::int64_t r0, float* Ot, std::int64_t R) {
  __m512 acc[NJ][NV];
  for (int j = 0; j < NJ; ++j) {
    for (int v = 0; v < NV; ++v) acc[j][v] = _mm512_loadu_ps(Ot + (dv + j) * R + r0 + v * kLanes);
  }
  Chains<NJ, NV>(Pb + r0, ps, Vb + dv, 1, Dv, pairs, acc);
  for (int j = 0; j < NJ; ++j) {
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(Ot + (dv + j) * R + r0 + v * kLanes, acc[j][v]);
  }
}

/// Calls f.template operator()<NJ, NV>(j, r0) over an n × (width / kLanes)
/// grid of outputs and vectors of rows, in blocks of up to kNJ × kNV.
constexpr int kNJ = 4, kNV = 4;
template <int NJ, class F>
TANDEM_BF16_TARGET void ForRowVectors(std::int64_t j, std::int64_t lo, std::int64_t hi, F&& f) {
  std::int64_t r0 = lo;
  for (; r0 + kNV * kLanes <= hi; r0 += kNV * kLanes) f.template operator()<NJ, kNV>(j, r0);
  switch ((hi - r0) / kLanes) {
    case 3:
      f.template operator()<NJ, 3>(j, r0);
      break;
    case 2:
      f.template operator()<NJ, 2>(j, r0);
      break;
    case 1:
      f.template operator()<NJ, 1>(j, r0);
      break;
    default:
      break;
  }
}
template <class F>
TANDEM_BF16_TARGET void ForGrid(std::int64_t n, std::int64_t lo, std::int64_t hi, F&& f) {
  std::int64_t j = 0;
  for (; j + kNJ <= n; j += kNJ) ForRowVectors<kNJ>(j, lo, hi, f);
  switch (n - j) {
    case 3:
      ForRowVectors<3>(j, lo, hi, f);
      break;
    case 2:
      ForRowVectors<2>(j, lo, hi, f);
      break;
    case 1:
      ForRowVectors<1>(j, lo, hi, f);
      break;
    default:
      break;
  }
}
#endif  // TANDEM_BF16_DOT_X86

}  // namespace

bool Supported() {
#if TANDEM_BF16_DOT_X86
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  }();
  return has;
#else
  return false;
#endif
}

bool Enabled() {
  return Supported() && enabled.load(std::memory_order_relaxed);
}

void SetEnabled(bool on) {
  enabled.store(on, std::memory_order_relaxed);
}

#if TANDEM_BF16_DOT_X86
TANDEM_BF16_TARGET void Scores(const std::uint32_t* Kb, std::int64_t nk, std::int64_t pairs,
                               const std::uint32_t* Qb, std::int64_t qs, std::int64_t lo,
                               std::int64_t hi, float factor, float* St, std::int64_t R) {
  ForGrid(nk, lo, hi, [&]<int NJ, int NV>(std::int64_t jj, std::int64_t r0) {
    ScoreTile<NJ, NV>(Kb, jj, pairs, Qb, qs, r0, factor, St, R);
  });
}

TANDEM_BF16_TARGET void Values(const std::uint32_t* Pb, std::int64_t ps, std::int64_t pairs,
                               const std::uint32_t* Vb, std::int64_t Dv, std::int64_t width,
                               float* Ot, std::int64_t R) {
  ForGrid(Dv, 0, width, [&]<int NJ, int NV>(std::int64_t dv, std::int64_t r0) {
    ValueTile<NJ, NV>(Pb, ps, pairs, Vb, Dv, dv, r0, Ot, R);
  });
}
#else
// Never called: Enabled() is false off x86.
void Scores(const std::uint32_t*, std::int64_t, std::int64_t, const std::uint32_t*, std::int64_t,
            std::int64_t, std::int64_t, float, float*, std::int64_t) {}
void Values(const std::uint32_t*, std::int64_t, std::int64_t, const std::uint32_t*, std::int64_t,
            std::int64_t, float*, std::int64_t) {}
#endif

}  // namespace tandem::optimized::bf16dot

namespace tandem::optimized {

bool bf16_dot_supported() {
  return bf16dot::Supported();
}

void enable_bf16_dot(bool enabled) {
  bf16dot::SetEnabled(enabled);
}

}  // namespace tandem::optimized
