// SPDX-License-Identifier: Apache-2.0
// Per-target building blocks of the optimized attention (attention_forward.cpp,
// attention_backward.cpp): one register-tiled matrix micro-kernel, the score
// transform (scale, softcap, bias, masks) and the FlashAttention-2 forward
// over one tile of query rows. Included once per Highway target (the toggle
// guard below), after <hwy/highway.h>.
//
// Everything runs in "transposed space": a tile holds the query rows of one
// (batch, kv head, query block) — the G = H/Hkv query heads of the group times
// nq queries, row r = qi*G + gi — as the *columns* of its buffers, so one
// vector covers N query rows:
//
//     Qt[d][r]   the tile's queries, packed once per tile
//     St[jj][r]  scores of key j0 + jj against row r (then probabilities)
//     Ot[dv][r]  unnormalized output accumulator
//
// K and V are never transposed: the micro-kernel broadcasts their elements.
// Q·Kᵀ broadcasts from kMR key rows at once, so K is copied per key block
// into rows of an odd stride (rows a caller keeps 4 KiB apart would share a
// cache set); P·V broadcasts consecutive elements of one V row per step, so
// wide tiles read V in place (a copy only where padding keys must be zeroed).
// The running max / sum of the
// online softmax are vectors over N rows, and no horizontal reduction is
// needed. Tiles of a single vector of rows (decode steps) take vectors along
// d instead (see ForwardTile). Only buffers owned here, or caller rows whose
// width is a whole number of vectors, are loaded as whole vectors, so there
// are no tails to mask: owned widths are rounded up and the padding is zero.
//
// A hidden (masked) key is excluded from every sum, as in the reference,
// which never reads its k or v: its score is −inf and its probability 0, but
// 0·NaN and 0·inf are NaN. Key blocks that may hide a key from some rows and
// whose K or V rows are not all finite (or, in the backward, whose rows have
// a non-finite lse or dsum) take a careful path that leaves the products of
// hidden entries out (Skip); the all-finite case pays one check per block.

#if defined(TANDEM_OPTIMIZED_ATTENTION_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TANDEM_OPTIMIZED_ATTENTION_INL_H_
#undef TANDEM_OPTIMIZED_ATTENTION_INL_H_
#else
#define TANDEM_OPTIMIZED_ATTENTION_INL_H_
#endif

#include <hwy/cache_control.h>
#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "buffer.hpp"
#include "tandem/attention.hpp"

HWY_BEFORE_NAMESPACE();
namespace tandem::optimized::HWY_NAMESPACE::attn {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Register tile of the micro-kernel: kMR broadcast rows times kNR vectors of
// accumulators (AVX-512 has 32 vector registers, the others 16).
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
inline constexpr std::size_t kMR = 8, kNR = 3;
#else
inline constexpr std::size_t kMR = 6, kNR = 2;
#endif

/// Query rows per tile aimed at (the G heads of a group times the queries of a
/// block): large tiles read each K/V block for more rows; with causal or
/// sliding-window masks smaller ones waste less work on the diagonal.
inline constexpr std::int64_t kRowsTarget = 384;
inline constexpr std::int64_t kRowsTargetBanded = 192;
inline constexpr std::int64_t kKeyBlock = 64;
/// Keys per block where a causal or sliding-window edge crosses the tile:
/// only some rows see such a block, and a short block wastes less on the rest.
inline constexpr std::int64_t kEdgeBlock = 16;
/// How far ahead of the block being computed K and V rows are prefetched.
inline constexpr std::int64_t kPrefetchKeys = 256;

inline std::int64_t RoundUp(std::int64_t x, std::int64_t m) {
  return (x + m - 1) / m * m;
}
inline std::int64_t Lanes() {
  return static_cast<std::int64_t>(hn::Lanes(DF()));
}

// ---------------------------------------------------------------------------
// exp for the softmax

/// e^x for the softmax's arguments (x <= 0 up to rounding; −inf gives 0):
/// e^x = 2^n·2^f with n = round(x·log2 e), |f| <= 1/2, 2^f by its degree-6
/// Taylor polynomial (truncation < 1.3e-7 relative). The rounding of x·log2 e
/// adds at most |x|·6e-8 relative error, so a probability e^x keeps about 6
/// correct digits even at x = −87; below that it is 0. About half the work
/// of hn::Exp, which also handles large positive x (not needed here).
HWY_INLINE VF SoftmaxExp(DF d, VF x) {
  const hn::RebindToSigned<DF> di;
  const VF t = hn::Mul(x, hn::Set(d, 1.44269504088896341f));
  const VF n = hn::Round(hn::Max(t, hn::Set(d, -126.0f)));
  const VF f = hn::Sub(t, n);
  VF p = hn::Set(d, 1.5403530393381606e-4f);
  p = hn::MulAdd(p, f, hn::Set(d, 1.3333558146428443e-3f));
  p = hn::MulAdd(p, f, hn::Set(d, 9.6181291076284772e-3f));
  p = hn::MulAdd(p, f, hn::Set(d, 5.5504108664821580e-2f));
  p = hn::MulAdd(p, f, hn::Set(d, 2.4022650695910071e-1f));
  p = hn::MulAdd(p, f, hn::Set(d, 6.9314718055994531e-1f));
  p = hn::MulAdd(p, f, hn::Set(d, 1.0f));
  const auto bits = hn::ShiftLeft<23>(hn::Add(hn::ConvertTo(di, n), hn::Set(di, 127)));
  const VF y = hn::Mul(p, hn::BitCast(d, bits));
  return hn::IfThenZeroElse(hn::Lt(x, hn::Set(d, -87.0f)), y);
}

// ---------------------------------------------------------------------------
// The micro-kernel and the matrix product built from it.

/// Which products a Gemm leaves out. A key hidden from a query row has
/// probability 0 there, but 0·v is NaN when v holds a NaN or an infinity,
/// while SPEC §2 excludes a hidden key from every sum (its k and v are never
/// read). Key blocks whose k or v hold such a value take a careful path (see
/// ForwardTile): there the probability of a hidden entry is stored as −0.0,
/// which no visible probability ever is (exp gives +0 at the least), and the
/// products whose probability entry is −0.0 are left out; every other product
/// is formed as usual, so a NaN in a visible key still reaches its rows.
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

/// Gemm that, when `careful`, leaves out the products whose marks in H say
/// hidden (kSkip, see Skip) and otherwise forms every product: the careful
/// path and the all-finite one share each call site.
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

// ---------------------------------------------------------------------------
// One call and one tile of query rows

/// Sizes of one call, derived from the plan once.
struct Call {
  const AttentionPlan* plan = nullptr;
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  const float* mask = nullptr;
  std::int64_t G = 1;           ///< query heads per kv head
  std::int64_t q_offset = 0;    ///< max(Sk − Sq, 0)
  std::int64_t block_q = 1;     ///< queries per tile
  std::int64_t max_rows = 1;    ///< G·block_q
  std::int64_t max_rows_p = 1;  ///< max_rows rounded up to whole vectors
  std::int64_t n_qblocks = 1;   ///< ceil(Sq / block_q)
  std::int64_t window = 0;      ///< w, capped at Sk + Sq (no key lies further back)
  float scale = 1.0f;
  float softcap = 0.0f;

  Call(const AttentionPlan& p, const AttentionInputs<float>& in) : plan(&p) {
    q = in.q.data();
    k = in.k.data();
    v = in.v.data();
    mask = in.mask.empty() ? nullptr : in.mask.data();
    G = p.group();
    q_offset = p.q_offset();
    // a − w <= 0 <= j for every query position a < Sk + Sq: a larger window
    // changes nothing, and the cap keeps a − w − j0 far from overflow.
    window = std::min(p.window, p.Sk + p.Sq);
    const bool banded = p.mask == MaskKind::causal || p.mask == MaskKind::sliding_window;
    block_q = std::max<std::int64_t>(1, (banded ? kRowsTargetBanded : kRowsTarget) / G);
    block_q = std::min(block_q, p.Sq);
    n_qblocks = (p.Sq + block_q - 1) / block_q;
    max_rows = G * block_q;
    max_rows_p = RoundUp(max_rows, Lanes());
    scale = static_cast<float>(p.scale);
    softcap = static_cast<float>(p.softcap);
  }
};

/// The query rows of one tile: batch b, kv head g, queries i0 .. i0+nq−1 of
/// the G query heads h = g·G + gi; row r = qi·G + gi. rows_p = rows rounded
/// up to whole vectors (the padding rows are zero and never stored).
struct Tile {
  std::int64_t b = 0, g = 0, i0 = 0, nq = 0, rows = 0, rows_p = 0;
  std::int64_t j_begin = 0, j_end = 0;  ///< keys any row of the tile may see
  /// Narrow tiles prefetch their K and V rows of key j + pf_ahead while
  /// computing key j, as long as j + pf_ahead < pf_end (a split-key call,
  /// which steps through every kv head in turn, aims one step ahead).
  std::int64_t pf_ahead = kPrefetchKeys, pf_end = 0;

  Tile(const Call& c, std::int64_t b_, std::int64_t g_, std::int64_t qblock) : b(b_), g(g_) {
    const AttentionPlan& p = *c.plan;
    i0 = qblock * c.block_q;
    nq = std::min(c.block_q, p.Sq - i0);
    rows = nq * c.G;
    rows_p = RoundUp(rows, Lanes());
    // Blocks that causal or sliding-window masks hide for every row are
    // skipped wholesale: a = q_offset + i is the key position of query i.
    const std::int64_t a_first = c.q_offset + i0, a_last = c.q_offset + i0 + nq - 1;
    j_begin = 0;
    j_end = p.Sk;
    if (p.mask == MaskKind::causal || p.mask == MaskKind::sliding_window) {
      j_end = std::min(p.Sk, a_last + 1);
    }
    if (p.mask == MaskKind::sliding_window) j_begin = std::max<std::int64_t>(0, a_first - c.window);
    if (j_begin > j_end) j_begin = j_end;
    pf_end = j_end;
  }
  /// Restricts the tile to the keys [k_begin, k_end) (one chunk of a
  /// split-key call); rows then see no key outside that range.
  void ClipKeys(std::int64_t k_begin, std::int64_t k_end) {
    j_begin = std::max(j_begin, k_begin);
    j_end = std::min(j_end, k_end);
    if (j_begin > j_end) j_begin = j_end;
  }
  /// The columns [lo, hi) of the tile's buffers (whole vectors) holding every
  /// row that may see a key of block [j0, j0 + nk): with causal and
  /// sliding-window masks the rows of a tile see a band of keys, so blocks
  /// near the diagonal need only part of the tile (rows are in query order).
  void ActiveColumns(const Call& c, std::int64_t j0, std::int64_t nk, std::int64_t& lo,
                     std::int64_t& hi) const {
    const AttentionPlan& p = *c.plan;
    const std::int64_t N = Lanes();
    std::int64_t qi_lo = 0, qi_hi = nq;
    if (p.mask == MaskKind::causal || p.mask == MaskKind::sliding_window) {
      // row sees the block iff a >= j0 (and a − w <= j0 + nk − 1), a = q_offset + i0 + qi
      qi_lo = std::clamp<std::int64_t>(j0 - c.q_offset - i0, 0, nq);
    }
    if (p.mask == MaskKind::sliding_window) {
      qi_hi = std::clamp<std::int64_t>(j0 + nk - 1 + c.window - c.q_offset - i0 + 1, 0, nq);
    }
    lo = qi_lo * c.G / N * N;
    hi = std::min(rows_p, RoundUp(qi_hi * c.G, N));
    if (hi < lo) hi = lo;
  }
  /// Keys in the block starting at j0: kKeyBlock, or kEdgeBlock where the
  /// causal or sliding-window edge runs through the tile's rows.
  std::int64_t BlockSize(const Call& c, std::int64_t j0) const {
    const AttentionPlan& p = *c.plan;
    const std::int64_t nk = std::min(kKeyBlock, j_end - j0);
    if (p.mask != MaskKind::causal && p.mask != MaskKind::sliding_window) return nk;
    const std::int64_t a_first = c.q_offset + i0, a_last = a_first + nq - 1;
    const bool edge =
        j0 + nk - 1 > a_first || (p.mask == MaskKind::sliding_window && j0 < a_last - c.window);
    return edge ? std::min(nk, kEdgeBlock) : nk;
  }
  std::int64_t query(std::int64_t r, std::int64_t G) const { return i0 + r / G; }
  std::int64_t head(std::int64_t r, std::int64_t G) const { return g * G + r % G; }
};

/// Row stride of a packed K or V block: odd, so that the rows the
/// micro-kernel broadcasts from never share a cache set (a caller's bshd rows
/// are often a multiple of 4 KiB apart).
inline std::int64_t PackedStride(std::int64_t width) {
  return width | 1;
}

/// Copies rows j0 .. j0+nk−1 (row stride `stride`, `width` floats each) into
/// dst with row stride PackedStride(width).
inline void PackKeyRows(const float* rows, std::int64_t stride, std::int64_t width, std::int64_t j0,
                        std::int64_t nk, float* dst) {
  const std::int64_t ps = PackedStride(width);
  for (std::int64_t jj = 0; jj < nk; ++jj) {
    std::memcpy(dst + jj * ps, rows + (j0 + jj) * stride,
                static_cast<std::size_t>(width) * sizeof(float));
  }
}

/// Asks for rows j0 .. j0+nk−1 to be brought into the cache.
inline void PrefetchRows(const float* rows, std::int64_t stride, std::int64_t width,
                         std::int64_t j0, std::int64_t nk) {
  for (std::int64_t jj = 0; jj < nk; ++jj) {
    const float* row = rows + (j0 + jj) * stride;
    for (std::int64_t x = 0; x < width; x += 16) __builtin_prefetch(row + x, 0, 2);
  }
}

/// Per-thread scratch of the forward, sized for the largest tile. With
/// `natural` (narrow tiles run in the natural layout only, see TileForward)
/// the transposed and wide-tile buffers Qt, Ot, Kp, Vp are left empty.
struct ForwardScratch {
  Buffer Qt, St, Ot, m, l, alpha, lo, hi, gather, Kp, Vp, Qn, Kn, Vn, On;
  std::vector<std::int64_t> bias_row;
  explicit ForwardScratch(const Call& c, bool natural = false) {
    const AttentionPlan& p = *c.plan;
    const std::int64_t R = c.max_rows_p;
    if (R == Lanes()) {  // narrow tiles (decode): rows along vectors of d
      const std::int64_t Dp = RoundUp(p.D, Lanes()), Dvp = RoundUp(p.Dv, Lanes());
      Qn.resize(R * Dp);
      // K and V rows are packed only when not whole vectors wide, or when
      // padding keys must be zeroed (see TileForward::Run)
      const bool padding = p.mask == MaskKind::key_padding;
      if (p.D != Dp || padding) Kn.resize(kKeyBlock * Dp);
      if (p.Dv != Dvp || padding) Vn.resize(kKeyBlock * Dvp);
      On.resize(R * Dvp);
    }
    if (!natural) {
      Kp.resize(kKeyBlock * PackedStride(p.D));
      Vp.resize(kKeyBlock * PackedStride(p.Dv));
      Qt.resize(p.D * R);
      Ot.resize(p.Dv * R);
    }
    St.resize(kKeyBlock * R);
    m.resize(R);
    l.resize(R);
    alpha.resize(R);
    lo.resize(R);
    hi.resize(R);
    gather.resize(R);
    bias_row.assign(static_cast<std::size_t>(R), -1);
  }
};

/// Qt[d][r] = q_r[d] for the tile's rows, zero in the padding rows.
inline void PackQueriesTransposed(const Call& c, const Tile& t, float* Qt) {
  const AttentionPlan& p = *c.plan;
  for (std::int64_t r = 0; r < t.rows; ++r) {
    const float* src = c.q + p.q.at(t.b, t.query(r, c.G), t.head(r, c.G));
    for (std::int64_t d = 0; d < p.D; ++d) Qt[d * t.rows_p + r] = src[d];
  }
  for (std::int64_t d = 0; d < p.D; ++d) {
    for (std::int64_t r = t.rows; r < t.rows_p; ++r) Qt[d * t.rows_p + r] = 0.0f;
  }
}

/// Turns the raw dot products St[jj][r] = <q_r, k_j> of keys j = j0 + jj into
/// scores: s = scale·<q, k>; s = c·tanh(s/c) (softcap c > 0; tanh kept in T
/// when T is given, for the backward); s += bias; s = −inf where the mask
/// hides key j from row r. Row r's lanes are independent.
class ScoreTransform {
 public:
  ScoreTransform(const Call& c, const Tile& t, ForwardScratch& s)
      : c_(c),
        t_(t),
        lo_(s.lo.get()),
        hi_(s.hi.get()),
        gather_(s.gather.get()),
        bias_row_(s.bias_row.data()) {
    const AttentionPlan& p = *c.plan;
    if (p.mask == MaskKind::bias) {
      for (std::int64_t r = 0; r < t.rows_p; ++r) {
        bias_row_[r] = r < t.rows ? p.mask_row(t.b, t.head(r, c.G), t.query(r, c.G)) : -1;
      }
    }
    if (p.mask == MaskKind::key_padding) keep_ = c.mask + p.mask_row(t.b, 0, 0);
  }

  /// Prepares key block [j0, j0 + nk): the per-row visible range (causal,
  /// sliding window) relative to j0, and whether any row needs it.
  void SetBlock(std::int64_t j0, std::int64_t nk) {
    const AttentionPlan& p = *c_.plan;
    j0_ = j0;
    bounded_ = false;
    hidden_keys_ = false;
    if (keep_ != nullptr) {
      for (std::int64_t jj = 0; jj < nk; ++jj)
        hidden_keys_ = hidden_keys_ || keep_[j0 + jj] == 0.0f;
    }
    if (p.mask != MaskKind::causal && p.mask != MaskKind::sliding_window) return;
    const std::int64_t N = Lanes();
    vec_bounded_.assign(static_cast<std::size_t>(t_.rows_p / N), 0);
    for (std::int64_t r = 0; r < t_.rows_p; ++r) {
      std::int64_t lo = -1, hi = nk;
      if (r < t_.rows) {
        const std::int64_t a = c_.q_offset + t_.query(r, c_.G);
        hi = std::clamp<std::int64_t>(a - j0, -1, nk);
        if (p.mask == MaskKind::sliding_window) {
          lo = std::clamp<std::int64_t>(a - c_.window - j0, -1, nk);
        }
        if (lo > 0 || hi < nk - 1) {
          bounded_ = true;
          vec_bounded_[static_cast<std::size_t>(r / N)] = 1;
        }
      }
      lo_[r] = static_cast<float>(lo);  // small integers: exact in float
      hi_[r] = static_cast<float>(hi);
    }
  }

  /// Whether key j0 + jj of the current block is padding (keep = 0).
  bool key_hidden(std::int64_t jj) const { return hidden_keys_ && keep_[j0_ + jj] == 0.0f; }
  /// Zeroes the packed rows (row stride ws) of the padding keys of the
  /// current block: a padding key's k and v are never used, so whatever they
  /// hold (NaN included) must not reach 0·v or 0·k in any sum.
  void ZeroHiddenRows(float* rows, std::int64_t ws, std::int64_t nk) const {
    if (!hidden_keys_) return;
    for (std::int64_t jj = 0; jj < nk; ++jj) {
      if (key_hidden(jj)) std::fill(rows + jj * ws, rows + (jj + 1) * ws, 0.0f);
    }
  }
  bool any_hidden() const { return hidden_keys_; }

  /// True when the current block needs nothing but the scale: no softcap,
  /// no bias, no row of the tile with a hidden key in it.
  bool plain() const {
    return c_.softcap <= 0.0f && c_.plan->mask != MaskKind::bias && !bounded_ && !hidden_keys_;
  }
  /// As plain(), for the rows r0 .. r0+N−1 alone.
  bool plain_at(std::int64_t r0) const {
    return c_.softcap <= 0.0f && c_.plan->mask != MaskKind::bias && !hidden_keys_ &&
           (!bounded_ || vec_bounded_[static_cast<std::size_t>(r0 / Lanes())] == 0);
  }
  /// True when the block needs the scale and the causal / sliding-window
  /// band only (the diagonal blocks of a plain causal call).
  bool band_only() const {
    return c_.softcap <= 0.0f && c_.plan->mask != MaskKind::bias && bounded_ && !hidden_keys_;
  }
  /// The band of visible keys of rows r0 .. r0+N−1, relative to j0.
  HWY_INLINE void Band(std::int64_t r0, VF& lo, VF& hi) const {
    const DF d;
    lo = hn::LoadU(d, lo_ + r0);
    hi = hn::LoadU(d, hi_ + r0);
  }

  /// Score of key j0 + jj for rows r0 .. r0+N−1 from the raw dot products.
  HWY_INLINE VF operator()(VF raw, std::int64_t jj, std::int64_t r0, float* T) const {
    const DF d;
    const AttentionPlan& p = *c_.plan;
    VF s = hn::Mul(raw, hn::Set(d, c_.scale));
    if (c_.softcap > 0.0f) {
      // s = c·tanh(s/c)
      const VF t = hn::Tanh(d, hn::Div(s, hn::Set(d, c_.softcap)));
      if (T != nullptr) hn::StoreU(t, d, T + jj * t_.rows_p + r0);
      s = hn::Mul(hn::Set(d, c_.softcap), t);
    }
    if (p.mask == MaskKind::bias) {
      // s + bias, and −inf where the bias hides the key (whatever s is)
      const VF bias = Bias(jj, r0);
      s = hn::IfThenElse(hn::Eq(bias, hn::Set(d, -std::numeric_limits<float>::infinity())), bias,
                         hn::Add(s, bias));
    }
    if (bounded_) {
      s = hn::IfThenElse(InBand(jj, r0), s, hn::Set(d, -std::numeric_limits<float>::infinity()));
    }
    if (hidden_keys_ && keep_[j0_ + jj] == 0.0f) {
      s = hn::Set(d, -std::numeric_limits<float>::infinity());
    }
    return s;
  }

  /// Whether a key of the current block may be hidden from some rows of the
  /// tile and seen by others (a causal or sliding-window edge runs through
  /// the block, or a bias): only then can 0·v or 0·k of a hidden entry meet a
  /// sum, as padding keys are zeroed when packed (ZeroHiddenRows).
  bool hides_per_row() const { return bounded_ || c_.plan->mask == MaskKind::bias; }

  /// Lanes of the rows r0 .. r0+N−1 from which key j0 + jj is hidden (the
  /// mask of SPEC §2, exactly: a score of −inf does not make a key hidden).
  HWY_INLINE hn::Mask<DF> Hidden(std::int64_t jj, std::int64_t r0) const {
    const DF d;
    auto hidden = hn::FirstN(d, 0);
    if (c_.plan->mask == MaskKind::bias) {
      hidden = hn::Eq(Bias(jj, r0), hn::Set(d, -std::numeric_limits<float>::infinity()));
    }
    if (bounded_) hidden = hn::Or(hidden, hn::Not(InBand(jj, r0)));
    if (key_hidden(jj)) hidden = hn::FirstN(d, hn::Lanes(d));
    return hidden;
  }

  /// Rewrites the probabilities P[jj][r] (row stride rows_p) of key j0 + jj,
  /// jj < nk, for the rows r0 .. r0+N−1 with −0.0 where the key is hidden:
  /// the careful path's mark of a product to leave out (see Skip).
  HWY_INLINE void MarkHidden(float* P, std::int64_t nk, std::int64_t r0) const {
    const DF d;
    for (std::int64_t jj = 0; jj < nk; ++jj) {
      float* at = P + jj * t_.rows_p + r0;
      hn::StoreU(hn::IfThenElse(Hidden(jj, r0), hn::Set(d, -0.0f), hn::LoadU(d, at)), d, at);
    }
  }

 private:
  /// bias[row r][j0 + jj] for the rows r0 .. r0+N−1 (0 in the padding rows).
  HWY_INLINE VF Bias(std::int64_t jj, std::int64_t r0) const {
    const std::int64_t N = Lanes();
    for (std::int64_t n = 0; n < N; ++n) {
      const std::int64_t row = bias_row_[r0 + n];
      gather_[n] = row >= 0 ? c_.mask[row + j0_ + jj] : 0.0f;
    }
    return hn::LoadU(DF(), gather_);
  }
  /// Lanes of the rows r0 .. r0+N−1 whose causal / sliding-window band holds
  /// key j0 + jj (only when bounded_).
  HWY_INLINE hn::Mask<DF> InBand(std::int64_t jj, std::int64_t r0) const {
    const DF d;
    const VF j = hn::Set(d, static_cast<float>(jj));
    return hn::And(hn::Ge(j, hn::LoadU(d, lo_ + r0)), hn::Le(j, hn::LoadU(d, hi_ + r0)));
  }

  const Call& c_;
  const Tile& t_;
  float* lo_;
  float* hi_;
  float* gather_;
  std::int64_t* bias_row_;
  const float* keep_ = nullptr;
  std::int64_t j0_ = 0;
  bool bounded_ = false;
  std::vector<char> vec_bounded_;  ///< per vector of rows: some row sees part of the block
  bool hidden_keys_ = false;
};

/// Copies rows j0 .. j0+nk−1 into dst with row stride wp (a whole number of
/// vectors), zero beyond `width`.
inline void PackKeyRowsPadded(const float* rows, std::int64_t stride, std::int64_t width,
                              std::int64_t wp, std::int64_t j0, std::int64_t nk, float* dst) {
  for (std::int64_t jj = 0; jj < nk; ++jj) {
    std::memcpy(dst + jj * wp, rows + (j0 + jj) * stride,
                static_cast<std::size_t>(width) * sizeof(float));
    std::fill(dst + jj * wp + width, dst + (jj + 1) * wp, 0.0f);
  }
}

/// out[r] = <Qn row r0 + r, krow> for kRows rows, vectors along d (wp floats).
template <std::size_t kRows>
HWY_INLINE void DotRows(const float* HWY_RESTRICT Qn, std::int64_t r0,
                        const float* HWY_RESTRICT krow, std::int64_t wp, float* out) {
  const DF d;
  const std::int64_t N = Lanes();
  VF acc[kRows];
  for (std::size_t r = 0; r < kRows; ++r) acc[r] = hn::Zero(d);
  for (std::int64_t x = 0; x < wp; x += N) {
    const VF kv = hn::LoadU(d, krow + x);
    for (std::size_t r = 0; r < kRows; ++r) {
      acc[r] =
          hn::MulAdd(hn::LoadU(d, Qn + (r0 + static_cast<std::int64_t>(r)) * wp + x), kv, acc[r]);
    }
  }
  for (std::size_t r = 0; r < kRows; ++r) out[r] = hn::GetLane(hn::SumOfLanes(d, acc[r]));
}

/// The FlashAttention-2 forward of one tile whose queries are packed in
/// s.Qt: over the key blocks the tile may see, St = K·Qt, then the online
/// softmax (m, l per row), then Ot = diag(alpha)·Ot + V^T·P. With with_pv
/// false only m and l are formed (the backward's dV-only path). The keys
/// come in consecutive ranges (Run), so that a caller can interleave the
/// tiles of several kv heads over the same keys (split-key decode).
/// After Finish, s.m and s.l hold the row max and the row sum of exp(s − m)
/// (both −inf / 0 for a row with no visible key) and s.Ot the unnormalized
/// output.
/// With `natural` (narrow tiles only) the caller has put the queries in s.Qn
/// (row r at r·Dp, Dp = D rounded up to whole vectors, zero beyond D) instead
/// of s.Qt, and the unnormalized output is left in s.On (row r at r·Dvp)
/// instead of s.Ot: neither transposed buffer is touched.
class TileForward {
 public:
  /// Starts the tile: m = −inf, l = 0, output 0 (and the queries of a narrow
  /// tile in s.Qn unless `natural`).
  TileForward(const Call& c, const Tile& t, ForwardScratch& s, bool with_pv, bool natural = false)
      : c_(c),
        t_(t),
        s_(s),
        with_pv_(with_pv),
        natural_(natural),
        narrow_(c.max_rows_p == Lanes()),
        Dp_(RoundUp(c.plan->D, Lanes())),
        Dvp_(RoundUp(c.plan->Dv, Lanes())),
        score_(c, t_, s) {
    const DF d;
    const std::int64_t N = Lanes();
    const AttentionPlan& p = *c.plan;
    const std::int64_t R = t.rows_p;
    const VF neg_inf = hn::Set(d, -std::numeric_limits<float>::infinity());
    float* HWY_RESTRICT m = s.m.get();
    float* HWY_RESTRICT l = s.l.get();
    float* HWY_RESTRICT Ot = s.Ot.get();
    for (std::int64_t r = 0; r < R; r += N) {
      hn::StoreU(neg_inf, d, m + r);
      hn::StoreU(hn::Zero(d), d, l + r);
    }
    const bool narrow = narrow_;
    const std::int64_t Dp = Dp_, Dvp = Dvp_;
    if (with_pv && !narrow) std::fill(Ot, Ot + p.Dv * R, 0.0f);
    if (narrow && !natural) {
      for (std::int64_t r = 0; r < R; ++r) {
        for (std::int64_t x = 0; x < Dp; ++x)
          s.Qn.get()[r * Dp + x] = x < p.D ? s.Qt.get()[x * R + r] : 0.0f;
      }
    }
    if (narrow && with_pv) std::fill(s.On.get(), s.On.get() + R * Dvp, 0.0f);
    prefetched_ = t.j_begin + kKeyBlock;
  }
  TileForward(const TileForward&) = delete;
  TileForward& operator=(const TileForward&) = delete;

  /// Adds the keys of [j_from, j_to) that the tile may see, in blocks (call
  /// with consecutive ranges; the blocks depend on the ranges given).
  void Run(std::int64_t j_from, std::int64_t j_to) {
    ScoreTransform& score = score_;
    const Call& c = c_;
    const Tile& t = t_;
    ForwardScratch& s = s_;
    const bool with_pv = with_pv_, natural = natural_;
    const DF d;
    const std::int64_t N = Lanes();
    const AttentionPlan& p = *c.plan;
    const std::int64_t R = t.rows_p;
    const VF neg_inf = hn::Set(d, -std::numeric_limits<float>::infinity());
    float* HWY_RESTRICT m = s.m.get();
    float* HWY_RESTRICT l = s.l.get();
    float* HWY_RESTRICT alpha = s.alpha.get();
    float* HWY_RESTRICT St = s.St.get();
    float* HWY_RESTRICT Ot = s.Ot.get();
    const bool narrow = narrow_;
    const std::int64_t Dp = Dp_, Dvp = Dvp_;
    const float* k_rows = c.k + p.k.at(t.b, 0, t.g);
    const float* v_rows = c.v + p.v.at(t.b, 0, t.g);
    std::int64_t& prefetched = prefetched_;
    const std::int64_t j_lo = std::max(j_from, t.j_begin), j_hi = std::min(j_to, t.j_end);
    for (std::int64_t j0 = j_lo, nk = 0; j0 < j_hi; j0 += nk) {
      nk = std::min(t.BlockSize(c, j0), j_hi - j0);
      const std::int64_t ks = PackedStride(p.D), vs = PackedStride(p.Dv);
      // Keep the rows of the next kPrefetchKeys keys on their way into the
      // cache while this block computes (decode steps are pure streaming).
      const std::int64_t ahead = std::min(t.j_end, j0 + kKeyBlock + kPrefetchKeys);
      if (!narrow && ahead > prefetched) {
        PrefetchRows(k_rows, p.k.seq, p.D, prefetched, ahead - prefetched);
        if (with_pv) PrefetchRows(v_rows, p.v.seq, p.Dv, prefetched, ahead - prefetched);
        prefetched = ahead;
      }
      std::int64_t lo, hi;
      t.ActiveColumns(c, j0, nk, lo, hi);
      if (lo == hi) continue;
      score.SetBlock(j0, nk);
      if (narrow) {
        // S <- Q K^T by dot products along d, St[jj][r]
        // Rows whose width is a whole number of vectors are read in place.
        const bool k_in_place = p.D == Dp && !score.any_hidden();
        if (!k_in_place) {
          PackKeyRowsPadded(k_rows, p.k.seq, p.D, Dp, j0, nk, s.Kn.get());
          score.ZeroHiddenRows(s.Kn.get(), Dp, nk);
        }
        for (std::int64_t jj = 0; jj < nk; ++jj) {
          // a narrow tile computes little per key: spread the prefetches over
          // the keys instead of issuing a block's worth at once
          if (j0 + jj + t.pf_ahead < t.pf_end) {
            PrefetchRows(k_rows, p.k.seq, p.D, j0 + jj + t.pf_ahead, 1);
            if (with_pv) PrefetchRows(v_rows, p.v.seq, p.Dv, j0 + jj + t.pf_ahead, 1);
          }
          const float* krow = k_in_place ? k_rows + (j0 + jj) * p.k.seq : s.Kn.get() + jj * Dp;
          std::int64_t r = 0;
          for (; r + 4 <= t.rows; r += 4) DotRows<4>(s.Qn.get(), r, krow, Dp, St + jj * R + r);
          for (; r < t.rows; ++r) DotRows<1>(s.Qn.get(), r, krow, Dp, St + jj * R + r);
          for (; r < R; ++r) St[jj * R + r] = 0.0f;  // padding rows, never stored
        }
      } else {
        PackKeyRows(k_rows, p.k.seq, p.D, j0, nk, s.Kp.get());
        score.ZeroHiddenRows(s.Kp.get(), ks, nk);
        // S <- Q K^T (transposed: St[jj][r] = <k_{j0+jj}, q_r>, rows lo .. hi−1)
        Gemm(nk, hi - lo, p.D, s.Kp.get(), ks, 1, s.Qt.get() + lo, R, St + lo, R, false);
      }
      // The block's V rows: in place for a wide tile (P·V reads one V row per
      // step, see the top of this file) and for a narrow tile whose rows are
      // whole vectors wide; packed (Vp, Vn) where a padding key needs zeroing
      // or a narrow tile's rows are not whole vectors.
      const float* v_block = nullptr;
      std::int64_t v_stride = 0;
      if (with_pv) {
        if (!narrow && !score.any_hidden()) {
          v_block = v_rows + j0 * p.v.seq;
          v_stride = p.v.seq;
        } else if (!narrow) {
          PackKeyRows(v_rows, p.v.seq, p.Dv, j0, nk, s.Vp.get());
          score.ZeroHiddenRows(s.Vp.get(), vs, nk);
          v_block = s.Vp.get();
          v_stride = vs;
        } else if (p.Dv == Dvp && !score.any_hidden()) {
          v_block = v_rows + j0 * p.v.seq;
          v_stride = p.v.seq;
        } else {
          PackKeyRowsPadded(v_rows, p.v.seq, p.Dv, Dvp, j0, nk, s.Vn.get());
          score.ZeroHiddenRows(s.Vn.get(), Dvp, nk);
          v_block = s.Vn.get();
          v_stride = Dvp;
        }
      }
      // Careful path. A key hidden from a row gets probability 0 there, and
      // 0·v is NaN when v holds a NaN or an infinity: in a block where some
      // rows may not see a key that others see (a causal / sliding-window edge,
      // a bias) and whose V rows are not all finite, the hidden entries of P
      // are marked −0.0 and P·V leaves their products out (Skip), so that such
      // a key reaches no row it is hidden from. The all-finite case (checked
      // here, one integer max per vector of V) keeps the plain product.
      // (The scores of hidden keys are −inf whatever k holds; see
      // ScoreTransform.)
      const bool careful =
          with_pv && score.hides_per_row() && !RowsFinite(v_block, v_stride, p.Dv, nk);
      const bool plain = score.plain(), band_only = score.band_only();
      const VF scale = hn::Set(d, c.scale);
      bool rescale = false;
      for (std::int64_t r0 = lo; r0 < hi; r0 += N) {
        // m_new <- max(m, rowmax(S)), masked keys at −inf
        VF mx = neg_inf;
        if (plain || score.plain_at(r0)) {
          for (std::int64_t jj = 0; jj < nk; ++jj) {
            const VF sc = hn::Mul(hn::LoadU(d, St + jj * R + r0), scale);
            hn::StoreU(sc, d, St + jj * R + r0);
            mx = hn::Max(mx, sc);
          }
        } else if (band_only) {
          VF band_lo, band_hi;
          score.Band(r0, band_lo, band_hi);
          for (std::int64_t jj = 0; jj < nk; ++jj) {
            const VF j = hn::Set(d, static_cast<float>(jj));
            const auto visible = hn::And(hn::Ge(j, band_lo), hn::Le(j, band_hi));
            const VF sc =
                hn::IfThenElse(visible, hn::Mul(hn::LoadU(d, St + jj * R + r0), scale), neg_inf);
            hn::StoreU(sc, d, St + jj * R + r0);
            mx = hn::Max(mx, sc);
          }
        } else {
          for (std::int64_t jj = 0; jj < nk; ++jj) {
            const VF sc = score(hn::LoadU(d, St + jj * R + r0), jj, r0, nullptr);
            hn::StoreU(sc, d, St + jj * R + r0);
            mx = hn::Max(mx, sc);
          }
        }
        const VF m_old = hn::LoadU(d, m + r0);
        const VF m_new = hn::Max(m_old, mx);
        // A row that has seen no visible key yet keeps m = −inf; subtract 0
        // there so that exp(−inf − (−inf)) is never formed.
        const VF m_use = hn::IfThenZeroElse(hn::Eq(m_new, neg_inf), m_new);
        // P <- exp(S − m_new); l <- exp(m − m_new)·l + rowsum(P)
        const VF a = SoftmaxExp(d, hn::Sub(m_old, m_use));
        VF sum = hn::Zero(d);
        for (std::int64_t jj = 0; jj < nk; ++jj) {
          const VF pr = SoftmaxExp(d, hn::Sub(hn::LoadU(d, St + jj * R + r0), m_use));
          hn::StoreU(pr, d, St + jj * R + r0);
          sum = hn::Add(sum, pr);
        }
        hn::StoreU(hn::MulAdd(hn::LoadU(d, l + r0), a, sum), d, l + r0);
        hn::StoreU(m_new, d, m + r0);
        hn::StoreU(a, d, alpha + r0);
        rescale = rescale || !hn::AllTrue(d, hn::Eq(a, hn::Set(d, 1.0f)));
        // the sum above is unchanged by the marks (+0 and −0 add alike)
        if (careful && !score.plain_at(r0)) score.MarkHidden(St, nk, r0);
      }
      if (!with_pv) continue;
      if (narrow) {
        // O <- diag(exp(m − m_new))·O + P V, On[r][dv] natural, rows as broadcasts
        float* On = s.On.get();
        for (std::int64_t r = 0; rescale && r < t.rows; ++r) {
          const VF a = hn::Set(d, alpha[r]);
          for (std::int64_t x = 0; x < Dvp; x += N)
            hn::StoreU(hn::Mul(hn::LoadU(d, On + r * Dvp + x), a), d, On + r * Dvp + x);
        }
        // P is A here (its own marks)
        GemmCareful<Skip::by_a>(careful, t.rows, Dvp, nk, St, 1, R, v_block, v_stride, On, Dvp,
                                true, St);
        continue;
      }
      // O <- diag(exp(m − m_new))·O + P V (transposed: Ot[dv][r]); the
      // rescale is skipped when no row's max moved (every factor exactly 1)
      for (std::int64_t dv = 0; rescale && dv < p.Dv; ++dv) {
        for (std::int64_t r0 = lo; r0 < hi; r0 += N) {
          hn::StoreU(hn::Mul(hn::LoadU(d, Ot + dv * R + r0), hn::LoadU(d, alpha + r0)), d,
                     Ot + dv * R + r0);
        }
      }
      // P is B here (its own marks)
      GemmCareful<Skip::by_b>(careful, p.Dv, hi - lo, nk, v_block, 1, v_stride, St + lo, R, Ot + lo,
                              R, true, St + lo);
    }
  }

  /// Ends the tile: a narrow one goes back to the transposed s.Ot unless
  /// `natural`.
  void Finish() {
    if (!(narrow_ && with_pv_ && !natural_)) return;
    // back to the transposed layout the callers read
    const AttentionPlan& p = *c_.plan;
    const std::int64_t R = t_.rows_p, Dvp = Dvp_;
    float* HWY_RESTRICT Ot = s_.Ot.get();
    const float* HWY_RESTRICT On = s_.On.get();
    for (std::int64_t r = 0; r < R; ++r) {
      for (std::int64_t dv = 0; dv < p.Dv; ++dv) Ot[dv * R + r] = On[r * Dvp + dv];
    }
  }

  const Tile& tile() const { return t_; }

 private:
  const Call& c_;
  const Tile t_;
  ForwardScratch& s_;
  bool with_pv_, natural_;
  /// Narrow tiles (one vector of rows, e.g. a decode step: one query of the
  /// G heads of a group; then rows_p == Lanes) would waste most lanes of the
  /// broadcast micro-kernel and load every K and V element on its own; they
  /// take vectors along d instead: S by dot products, O = P V with rows in
  /// registers. Decided per call (the scratch is sized per call): the short
  /// last query block of a wider call stays wide.
  bool narrow_;
  std::int64_t Dp_, Dvp_;  ///< D and Dv rounded up to whole vectors
  ScoreTransform score_;
  std::int64_t prefetched_ = 0;
};

/// The whole forward of one tile (see TileForward).
inline void ForwardTile(const Call& c, const Tile& t, ForwardScratch& s, bool with_pv,
                        bool natural = false) {
  TileForward f(c, t, s, with_pv, natural);
  f.Run(t.j_begin, t.j_end);
  f.Finish();
}

/// inv[r] = 1/l[r] (0 for a row with no visible key) and, when lse is given,
/// lse[r] = m[r] + log(l[r]) (−inf for such a row). A row that sees a key
/// with a NaN score has l = NaN: it counts as seen (NaN, as in the
/// reference), not as a row with no visible key (0, no gradient).
inline void FinishRows(const Tile& t, const ForwardScratch& s, float* inv, float* lse) {
  const DF d;
  const std::int64_t N = Lanes();
  const VF zero = hn::Zero(d);
  for (std::int64_t r0 = 0; r0 < t.rows_p; r0 += N) {
    const VF l = hn::LoadU(d, s.l.get() + r0);
    const auto seen = hn::Not(hn::Eq(l, zero));
    hn::StoreU(hn::IfThenElseZero(seen, hn::Div(hn::Set(d, 1.0f), l)), d, inv + r0);
    if (lse != nullptr) {
      const VF m = hn::LoadU(d, s.m.get() + r0);
      // Log of the other lanes is never used; feed it 1 to keep it quiet.
      const auto positive = hn::Gt(l, zero);
      const VF lg = hn::Log(d, hn::IfThenElse(positive, l, hn::Set(d, 1.0f)));
      // l = 0 (no visible key): −inf; l = NaN: NaN
      const VF other = hn::IfThenElse(seen, l, hn::Set(d, -std::numeric_limits<float>::infinity()));
      hn::StoreU(hn::IfThenElse(positive, hn::Add(m, lg), other), d, lse + r0);
    }
  }
}

}  // namespace tandem::optimized::HWY_NAMESPACE::attn
HWY_AFTER_NAMESPACE();

#endif  // toggle guard
