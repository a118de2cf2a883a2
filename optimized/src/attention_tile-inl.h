// SPDX-License-Identifier: Apache-2.0
// Per-target geometry of the optimized attention: one call (Call) and one
// tile of query rows (Tile), the packing of K, V and Q blocks, the softmax's
// exp and the score transform (scale, softcap, bias, masks). Included once
// per Highway target (the toggle guard below), after <hwy/highway.h>.
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
// Hidden keys never reach a sum: see Skip (gemm-inl.h).
#if defined(TANDEM_OPTIMIZED_ATTENTION_TILE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TANDEM_OPTIMIZED_ATTENTION_TILE_INL_H_
#undef TANDEM_OPTIMIZED_ATTENTION_TILE_INL_H_
#else
#define TANDEM_OPTIMIZED_ATTENTION_TILE_INL_H_
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
#include "gemm-inl.h"
#include "tandem/attention.hpp"

HWY_BEFORE_NAMESPACE();
namespace tandem::optimized::HWY_NAMESPACE::attn {

namespace hn = hwy::HWY_NAMESPACE;

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

/// Per-thread scratch of the score transform, sized for the largest tile:
/// the band of visible keys per row and the bias rows.
struct ScoreScratch {
  Buffer lo, hi, gather;
  std::vector<std::int64_t> bias_row;
  explicit ScoreScratch(std::int64_t rows)
      : lo(rows), hi(rows), gather(rows), bias_row(static_cast<std::size_t>(rows), -1) {}
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
  ScoreTransform(const Call& c, const Tile& t, ScoreScratch& s)
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

}  // namespace tandem::optimized::HWY_NAMESPACE::attn
HWY_AFTER_NAMESPACE();

#endif  // toggle guard
