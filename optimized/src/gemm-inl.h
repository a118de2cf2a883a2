// SPDX-License-Identifier: Apache-2.0
// Per-target matrix product of the optimized kernels: a register-tiled
// micro-kernel (kMR broadcast rows times kNR vectors of accumulators) and the
// Gemm built from it, with its careful variant that leaves out the products
// of hidden entries (Skip). Used by the attention tiles and, alone, by the
// attention block's projections. Included once per Highway target (the
// toggle guard below), after <hwy/highway.h>.
#if defined(TANDEM_OPTIMIZED_GEMM_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TANDEM_OPTIMIZED_GEMM_INL_H_
#undef TANDEM_OPTIMIZED_GEMM_INL_H_
#else
#define TANDEM_OPTIMIZED_GEMM_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace tandem::optimized::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Register tile of the micro-kernel: kMR broadcast rows times kNR vectors of
// accumulators (AVX-512 has 32 vector registers, the others 16). AVX2 takes
// 4 × 3 rather than 6 × 2: the same 12 accumulators with 7 loads per 12
// multiply-adds instead of 8, and key blocks and head widths that are
// multiples of 4 leave no short tile of rows (bench/README.md, AVX2).
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
inline constexpr std::size_t kMR = 8, kNR = 3;
#elif HWY_TARGET == HWY_AVX2
inline constexpr std::size_t kMR = 4, kNR = 3;
#else
inline constexpr std::size_t kMR = 6, kNR = 2;
#endif

// ---------------------------------------------------------------------------
// The micro-kernel and the matrix product built from it.

/// Which products a Gemm leaves out: the careful path of the attention.
///
/// Why. SPEC §2 excludes a key hidden from a query row (causal or sliding
/// window edge, −inf bias, padding) from every sum of that row, as the
/// reference does by never reading its k or v. A fast tile computes whole
/// blocks instead, where a hidden entry gets score −inf and probability 0;
/// but 0·v is NaN when v holds a NaN or an infinity, and so are 0·k, 0·q and
/// 0·dO. In the forward a non-finite v of a hidden key would reach O by P·V.
/// In the backward a non-finite v reaches dS through 0·(dP − dsum), a
/// non-finite k reaches dQ through dS·K, and a row whose lse or dsum is not
/// finite (it sees such a key elsewhere), or whose own q or dO is not
/// finite, makes exp(−inf − lse), 0·(dP − dsum), 0·q and 0·dO NaN for the
/// keys hidden from it, reaching their dK and dV.
///
/// How. Padding keys are hidden from every row: their packed K and V rows
/// are zeroed (ScoreTransform::ZeroHiddenRows), which is enough in the
/// forward; in the backward a row's non-finite lse, dsum, q or dO would
/// still meet them. A block where some key may be hidden from some rows
/// (and, in the backward, a block with a padding key) and where a value
/// such products would meet is not finite (checked per block: one integer
/// max per vector, RowsFinite) takes the careful path:
/// the probability of each hidden entry is stored as −0.0, which no visible
/// probability ever is (exp gives +0 at the least), dS is set to 0 there,
/// and the products whose probability entry is −0.0 are left out. Every
/// other product is formed as usual, so a NaN in a visible key still reaches
/// its rows. The all-finite case, the common one, keeps the plain product.
enum class Skip {
  none,  ///< every product (the all-finite case)
  by_a,  ///< leaves out A[i][k]·B[k][c] where H[i·ars + k·aks] is −0.0 (H laid out like A)
  by_b,  ///< leaves out A[i][k]·B[k][c] where H[k·bs + c] is −0.0 (H laid out like B)
};

/// Lanes of v that are not −0.0 (the careful path's mark of a hidden entry).
HWY_INLINE hn::Mask<DF> NotHiddenMark(DF d, VF v) {
  const hn::RebindToSigned<DF> di;
  return hn::RebindMask(
      d, hn::Ne(hn::BitCast(di, v), hn::Set(di, std::numeric_limits<std::int32_t>::min())));
}

/// C[i][c] (+)= Σ_k A[i·ars + k·aks] · B[k·bs + c] for i < MR, c < NR·N,
/// leaving out the products kSkip names (H: their marks, see Skip).
/// A is read by scalar broadcasts (in place, any strides), B and C by whole
/// vectors (owned, padded buffers).
template <Skip kSkip, std::size_t MR, std::size_t NR>
HWY_INLINE void MicroTile(const float* HWY_RESTRICT A, std::int64_t ars, std::int64_t aks,
                          const float* HWY_RESTRICT B, std::int64_t bs, float* HWY_RESTRICT C,
                          std::int64_t cs, std::int64_t K, bool accumulate,
                          const float* HWY_RESTRICT H) {
  const DF d;
  const std::size_t N = hn::Lanes(d);
  VF c[MR][NR];
#pragma GCC unroll 8
  for (std::size_t i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (std::size_t n = 0; n < NR; ++n) {
      c[i][n] =
          accumulate ? hn::LoadU(d, C + static_cast<std::int64_t>(i) * cs + n * N) : hn::Zero(d);
    }
  }
  const float* a[MR];
  const float* h[MR];
#pragma GCC unroll 8
  for (std::size_t i = 0; i < MR; ++i) {
    a[i] = A + static_cast<std::int64_t>(i) * ars;
    h[i] = kSkip == Skip::by_a ? H + static_cast<std::int64_t>(i) * ars : nullptr;
  }
  for (std::int64_t k = 0; k < K; ++k) {
    const float* HWY_RESTRICT b = B + k * bs;
    VF bv[NR];
    hn::Mask<DF> keep_b[NR];  // Skip::by_b: the lanes whose product is formed
#pragma GCC unroll 8
    for (std::size_t n = 0; n < NR; ++n) {
      bv[n] = hn::LoadU(d, b + n * N);
      if constexpr (kSkip == Skip::by_b)
        keep_b[n] = NotHiddenMark(d, hn::LoadU(d, H + k * bs + n * N));
    }
#pragma GCC unroll 8
    for (std::size_t i = 0; i < MR; ++i) {
      const VF av = hn::Set(d, a[i][k * aks]);
      if constexpr (kSkip == Skip::none) {
#pragma GCC unroll 8
        for (std::size_t n = 0; n < NR; ++n) c[i][n] = hn::MulAdd(av, bv[n], c[i][n]);
      } else if constexpr (kSkip == Skip::by_a) {
        const auto keep_a = NotHiddenMark(d, hn::Set(d, h[i][k * aks]));
#pragma GCC unroll 8
        for (std::size_t n = 0; n < NR; ++n)
          c[i][n] = hn::IfThenElse(keep_a, hn::MulAdd(av, bv[n], c[i][n]), c[i][n]);
      } else {
#pragma GCC unroll 8
        for (std::size_t n = 0; n < NR; ++n)
          c[i][n] = hn::IfThenElse(keep_b[n], hn::MulAdd(av, bv[n], c[i][n]), c[i][n]);
      }
    }
  }
#pragma GCC unroll 8
  for (std::size_t i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (std::size_t n = 0; n < NR; ++n) {
      hn::StoreU(c[i][n], d, C + static_cast<std::int64_t>(i) * cs + n * N);
    }
  }
}

template <Skip kSkip, std::size_t NR, std::size_t MR = kMR>
HWY_INLINE void MicroTileRows(std::size_t mr, const float* A, std::int64_t ars, std::int64_t aks,
                              const float* B, std::int64_t bs, float* C, std::int64_t cs,
                              std::int64_t K, bool accumulate, const float* H) {
  if constexpr (MR > 0) {
    if (mr == MR) {
      MicroTile<kSkip, MR, NR>(A, ars, aks, B, bs, C, cs, K, accumulate, H);
    } else {
      MicroTileRows<kSkip, NR, MR - 1>(mr, A, ars, aks, B, bs, C, cs, K, accumulate, H);
    }
  }
}

template <Skip kSkip, std::size_t NR = kNR>
HWY_INLINE void MicroTileCols(std::size_t nr, std::size_t mr, const float* A, std::int64_t ars,
                              std::int64_t aks, const float* B, std::int64_t bs, float* C,
                              std::int64_t cs, std::int64_t K, bool accumulate, const float* H) {
  if constexpr (NR > 0) {
    if (nr == NR) {
      MicroTileRows<kSkip, NR>(mr, A, ars, aks, B, bs, C, cs, K, accumulate, H);
    } else {
      MicroTileCols<kSkip, NR - 1>(nr, mr, A, ars, aks, B, bs, C, cs, K, accumulate, H);
    }
  }
}

/// C[i][c] (+)= Σ_{k<K} A[i·ars + k·aks] · B[k·bs + c] for i < M, c < NC, NC a
/// multiple of the lane count, leaving out the products kSkip names (their
/// marks in H, laid out like A or like B; see Skip). Each element of C is
/// one chain of fused multiply-adds in k order, whatever M, NC and the
/// tiling are.
template <Skip kSkip = Skip::none>
inline HWY_NOINLINE void Gemm(std::int64_t M, std::int64_t NC, std::int64_t K, const float* A,
                              std::int64_t ars, std::int64_t aks, const float* B, std::int64_t bs,
                              float* C, std::int64_t cs, bool accumulate,
                              const float* H = nullptr) {
  const std::int64_t N = Lanes();
  for (std::int64_t c0 = 0; c0 < NC; c0 += static_cast<std::int64_t>(kNR) * N) {
    const auto nr = static_cast<std::size_t>(std::min<std::int64_t>(kNR, (NC - c0) / N));
    for (std::int64_t i0 = 0; i0 < M; i0 += static_cast<std::int64_t>(kMR)) {
      const auto mr = static_cast<std::size_t>(std::min<std::int64_t>(kMR, M - i0));
      const float* h = kSkip == Skip::by_a ? H + i0 * ars : kSkip == Skip::by_b ? H + c0 : nullptr;
      MicroTileCols<kSkip>(nr, mr, A + i0 * ars, ars, aks, B + c0, bs, C + i0 * cs + c0, cs, K,
                           accumulate, h);
    }
  }
}

/// Columns of C one pass of Gemm's micro-tiles covers (kNR vectors).
inline std::int64_t StripWidth() {
  return static_cast<std::int64_t>(kNR) * Lanes();
}

/// Gemm that, when `careful`, leaves out the products whose marks in H say
/// hidden (kSkip) and otherwise forms every product: the careful path and
/// the all-finite one share each call site.
template <Skip kSkip>
inline void GemmCareful(bool careful, std::int64_t M, std::int64_t NC, std::int64_t K,
                        const float* A, std::int64_t ars, std::int64_t aks, const float* B,
                        std::int64_t bs, float* C, std::int64_t cs, bool accumulate,
                        const float* H) {
  if (careful) {
    Gemm<kSkip>(M, NC, K, A, ars, aks, B, bs, C, cs, accumulate, H);
  } else {
    Gemm(M, NC, K, A, ars, aks, B, bs, C, cs, accumulate);
  }
}

/// Whether rows 0 .. n−1 (row stride `stride`, `width` floats each) hold
/// finite values only: the largest exponent field over the rows (one integer
/// max per vector, no branch) must stay below the all-ones one of inf and NaN.
inline bool RowsFinite(const float* rows, std::int64_t stride, std::int64_t width, std::int64_t n) {
  const DF d;
  const hn::RebindToSigned<DF> di;
  const std::int64_t N = Lanes();
  const auto exponent = hn::Set(di, 0x7f800000);
  auto top = hn::Zero(di);
  bool finite = true;
  for (std::int64_t j = 0; j < n; ++j) {
    const float* row = rows + j * stride;
    std::int64_t x = 0;
    for (; x + N <= width; x += N) {
      top = hn::Max(top, hn::And(hn::BitCast(di, hn::LoadU(d, row + x)), exponent));
    }
    for (; x < width; ++x) finite = finite && std::isfinite(row[x]);
  }
  return finite && hn::AllFalse(di, hn::Eq(top, exponent));
}

}  // namespace tandem::optimized::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // toggle guard
