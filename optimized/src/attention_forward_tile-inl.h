// SPDX-License-Identifier: Apache-2.0
// Per-target FlashAttention-2 forward over one tile of query rows, by two
// algorithms over one online-softmax step (Geometry::decode_tiles chooses,
// per call):
//
//  - WideTile: vectors across query rows (the transposed layout of
//    attention_tile-inl.h); S = K·Qt and Ot += V^T·P by the broadcast
//    micro-kernel. By default every tile of more than one vector of rows.
//  - DecodeTile: vectors along d; S by dot products, O += P·V with rows as
//    broadcasts. By default tiles of one vector of rows (a decode step: one
//    query of the G heads of a group), which would waste most lanes of the
//    wide tile and load every K and V element on its own.
//
// The forward, the split-key decode and the backward's recomputation of the
// log-sum-exp run them. Included once per Highway target (the toggle guard
// below), after <hwy/highway.h>.

#if defined(TANDEM_OPTIMIZED_ATTENTION_FORWARD_TILE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TANDEM_OPTIMIZED_ATTENTION_FORWARD_TILE_INL_H_
#undef TANDEM_OPTIMIZED_ATTENTION_FORWARD_TILE_INL_H_
#else
#define TANDEM_OPTIMIZED_ATTENTION_FORWARD_TILE_INL_H_
#endif

#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "attention_tile-inl.h"

HWY_BEFORE_NAMESPACE();
namespace tandem::optimized::HWY_NAMESPACE::attn {

namespace hn = hwy::HWY_NAMESPACE;

/// Per-thread scratch of the forward tiles, sized for the largest tile of
/// the call: St (scores, then probabilities, [key_block][stride]) and the
/// online softmax's m, l, alpha for every tile; Qt, Ot, Kp, Vp for the wide
/// tile (and the backward) when `transposed`; Qn, On, Kn, Vn for the decode
/// tile when the call takes it.
struct ForwardScratch {
  Buffer St, m, l, alpha;
  ScoreScratch score;
  Buffer Qt, Ot;
  std::optional<PackedRows> Kp, Vp;
  Buffer Qn, On, Kn, Vn;
  ForwardScratch(const Call& c, bool transposed) : score(c.max_rows_p) {
    const AttentionPlan& p = *c.plan;
    const std::int64_t R = c.max_rows_p, ld = c.max_stride;
    St.resize(c.key_block * ld);
    m.resize(R);
    l.resize(R);
    alpha.resize(R);
    if (transposed) {
      Qt.resize(p.D * ld);
      Ot.resize(p.Dv * ld);
      Kp.emplace(c.max_Sk, p.D, c.key_block);
      Vp.emplace(c.max_Sk, p.Dv, c.key_block);
    }
    if (c.decode) {
      const std::int64_t Dp = RoundUp(p.D, Lanes()), Dvp = RoundUp(p.Dv, Lanes());
      Qn.resize(R * Dp);
      On.resize(R * Dvp);
      // K and V rows are packed only when not whole vectors wide, or when
      // padding keys must be zeroed (see DecodeTile)
      const bool padding = p.mask == MaskKind::key_padding;
      if (p.D != Dp || padding) Kn.resize(c.key_block * Dp);
      if (p.Dv != Dvp || padding) Vn.resize(c.key_block * Dvp);
    }
  }
};

/// A tile's unnormalized output O[r][dv] = base[r·row_step + dv·col_step]:
/// Ot (transposed) or On (natural).
struct OutputRows {
  const float* base = nullptr;
  std::int64_t row_step = 0, col_step = 0;
  float at(std::int64_t r, std::int64_t dv) const { return base[r * row_step + dv * col_step]; }
};

/// dst(r)[dv] = O[r][dv]·w[r] for r < rows, dv < width (w null: the rows as
/// they are), through a block in L1 as PackTransposed.
template <class DstRow>
void StoreRows(const OutputRows& o, std::int64_t rows, std::int64_t width, const float* w,
               DstRow dst) {
  HWY_ALIGN float block[kTransposeRows][kTransposeWidth];
  // the rows kTransposeAhead ahead of the block, for writing
  const auto prefetch = [&](std::int64_t from, std::int64_t to) {
    constexpr std::int64_t kLine = 64 / sizeof(float);  // floats per cache line
    for (std::int64_t r = from; r < std::min(rows, to); ++r) {
      for (std::int64_t x = 0; x < width; x += kLine) __builtin_prefetch(dst(r) + x, 1, 3);
    }
  };
  prefetch(0, kTransposeAhead);
  for (std::int64_t r0 = 0; r0 < rows; r0 += kTransposeRows) {
    const std::int64_t n = std::min(kTransposeRows, rows - r0);
    prefetch(r0 + kTransposeAhead, r0 + kTransposeAhead + kTransposeRows);
    for (std::int64_t x0 = 0; x0 < width; x0 += kTransposeWidth) {
      const std::int64_t m = std::min(kTransposeWidth, width - x0);
      for (std::int64_t x = 0; x < m; ++x) {
        for (std::int64_t i = 0; i < n; ++i) {
          block[i][x] = o.at(r0 + i, x0 + x) * (w != nullptr ? w[r0 + i] : 1.0f);
        }
      }
      for (std::int64_t i = 0; i < n; ++i) std::copy_n(block[i], m, dst(r0 + i) + x0);
    }
  }
}

/// The online softmax over one tile's rows (vectors over N rows at a time,
/// no horizontal reduction), in log2 units (scores x = s·log2 e): per row
/// the reference max m, the running sum l of 2^(x − m) and, for the last
/// key block, the factor alpha = 2^(m_old − m_new) the running output must
/// be rescaled by. Starts at m = −inf, l = 0; a row with no visible key
/// keeps both.
///
/// m moves only when a block's row max exceeds it by more than
/// kRescaleAbove (as FlashAttention-4 does), so after the first blocks most
/// leave the running output as it is: the probabilities against the stale
/// m stay below 2^kRescaleAbove, far from overflow, and since l and the
/// output are sums of 2^(x − m) with one and the same m, out = O/l and
/// lse = m + log2 l are exact whatever m is.
class OnlineSoftmax {
 public:
  static constexpr float kRescaleAbove = 8.0f;

  /// For rows_p rows whose scores lie `stride` apart from one key to the next.
  OnlineSoftmax(ForwardScratch& s, std::int64_t rows_p, std::int64_t stride)
      : m_(s.m.get()),
        l_(s.l.get()),
        alpha_(s.alpha.get()),
        R_(stride),
        rescaled_(static_cast<std::size_t>(rows_p / Lanes()), 0) {
    const DF d;
    for (std::int64_t r = 0; r < rows_p; r += Lanes()) {
      hn::StoreU(hn::Set(d, -std::numeric_limits<float>::infinity()), d, m_ + r);
      hn::StoreU(hn::Zero(d), d, l_ + r);
    }
  }

  /// One key block of nk keys for the rows in the columns [lo, hi): turns the
  /// raw dot products St[jj][r] (row stride `stride`) into scores (`score`),
  /// then into probabilities 2^(x − m_new), and updates m, l and alpha;
  /// with `careful` the hidden entries of P are marked for the products to
  /// leave out (see Skip in gemm-inl.h). Returns whether any alpha is not 1
  /// (only then must the running output be rescaled; rescaled(r0) says for
  /// which vectors of rows).
  bool Step(float* St, std::int64_t nk, std::int64_t lo, std::int64_t hi,
            const ScoreTransform& score, bool careful) {
    const DF d;
    const VF neg_inf = hn::Set(d, -std::numeric_limits<float>::infinity());
    bool any = false;
    for (std::int64_t r0 = lo; r0 < hi; r0 += Lanes()) {
      // m_new <- rowmax(S) where it exceeds m by more than kRescaleAbove, else
      // m (masked keys at −inf)
      const VF m_old = hn::LoadU(d, m_ + r0);
      const VF mx = Scores(St, nk, r0, score);
      const auto grow = hn::Gt(mx, hn::Add(m_old, hn::Set(d, kRescaleAbove)));
      const VF m_new = hn::IfThenElse(grow, mx, m_old);
      // A row that has seen no visible key yet keeps m = −inf; subtract 0
      // there so that 2^(−inf − (−inf)) is never formed.
      const VF m_use = hn::IfThenZeroElse(hn::Eq(m_new, neg_inf), m_new);
      // P <- 2^(S − m_new); l <- 2^(m − m_new)·l + rowsum(P)
      const bool moved = !hn::AllFalse(d, grow);
      const VF a = moved ? SoftmaxExp2(d, hn::Sub(m_old, m_use)) : hn::Set(d, 1.0f);
      VF sum = hn::Zero(d);
      for (std::int64_t jj = 0; jj < nk; ++jj) {
        const VF pr = SoftmaxExp2(d, hn::Sub(hn::LoadU(d, St + jj * R_ + r0), m_use));
        hn::StoreU(pr, d, St + jj * R_ + r0);
        sum = hn::Add(sum, pr);
      }
      hn::StoreU(hn::MulAdd(hn::LoadU(d, l_ + r0), a, sum), d, l_ + r0);
      hn::StoreU(m_new, d, m_ + r0);
      hn::StoreU(a, d, alpha_ + r0);
      rescaled_[static_cast<std::size_t>(r0 / Lanes())] = moved;
      any = any || moved;
      // the sum above is unchanged by the marks (+0 and −0 add alike)
      if (careful && !score.plain_at(r0)) score.MarkHidden(St, nk, r0);
    }
    return any;
  }

  /// alpha[r] of the last block.
  const float* alpha() const { return alpha_; }
  /// Whether the last block moved m of a row of the vector of rows r0 .. r0+N−1
  /// (else their alpha is 1).
  bool rescaled(std::int64_t r0) const { return rescaled_[static_cast<std::size_t>(r0 / Lanes())]; }

 private:
  /// S <- the scores of rows r0 .. r0+N−1 in place (the cheapest transform
  /// the block allows: none, the band, or the whole transform); returns
  /// their row max.
  VF Scores(float* St, std::int64_t nk, std::int64_t r0, const ScoreTransform& score) const {
    const DF d;
    const VF neg_inf = hn::Set(d, -std::numeric_limits<float>::infinity());
    VF mx = neg_inf;
    if (score.plain() || score.plain_at(r0)) {
      // four independent chains: one would wait out the latency of each max
      VF mx1 = neg_inf, mx2 = neg_inf, mx3 = neg_inf;
      std::int64_t jj = 0;
      for (; jj + 4 <= nk; jj += 4) {
        mx = hn::Max(mx, hn::LoadU(d, St + jj * R_ + r0));
        mx1 = hn::Max(mx1, hn::LoadU(d, St + (jj + 1) * R_ + r0));
        mx2 = hn::Max(mx2, hn::LoadU(d, St + (jj + 2) * R_ + r0));
        mx3 = hn::Max(mx3, hn::LoadU(d, St + (jj + 3) * R_ + r0));
      }
      for (; jj < nk; ++jj) mx = hn::Max(mx, hn::LoadU(d, St + jj * R_ + r0));
      mx = hn::Max(hn::Max(mx, mx1), hn::Max(mx2, mx3));
    } else if (score.band_only()) {
      VF band_lo, band_hi;
      score.Band(r0, band_lo, band_hi);
      for (std::int64_t jj = 0; jj < nk; ++jj) {
        const VF j = hn::Set(d, static_cast<float>(jj));
        const auto visible = hn::And(hn::Ge(j, band_lo), hn::Le(j, band_hi));
        const VF sc = hn::IfThenElse(visible, hn::LoadU(d, St + jj * R_ + r0), neg_inf);
        hn::StoreU(sc, d, St + jj * R_ + r0);
        mx = hn::Max(mx, sc);
      }
    } else {
      for (std::int64_t jj = 0; jj < nk; ++jj) {
        const VF sc = score(hn::LoadU(d, St + jj * R_ + r0), jj, r0, nullptr);
        hn::StoreU(sc, d, St + jj * R_ + r0);
        mx = hn::Max(mx, sc);
      }
    }
    return mx;
  }

  float* m_;
  float* l_;
  float* alpha_;
  std::int64_t R_;
  std::vector<char> rescaled_;  ///< per vector of rows, for the last block
};

/// The rows of one block of V that P·V reads: rows j0 .. j0+nk−1 of `rows`,
/// the caller's in place (ForEachRun: one run, or one per block of a paged
/// cache) or a packed copy (j0 = 0).
struct ValueBlock {
  KeyRows rows;
  std::int64_t j0 = 0;
};

/// Whether a block needs the careful P·V (see Skip in gemm-inl.h): a key may
/// be hidden from some rows and seen by others, and its V rows are not all
/// finite (checked with one integer max per vector of V). The scores of
/// hidden keys are −inf whatever k holds (ScoreTransform).
inline bool CarefulPV(const ScoreTransform& score, const ValueBlock& v, std::int64_t Dv,
                      std::int64_t nk) {
  if (!score.hides_per_row()) return false;
  bool finite = true;
  ForEachRun(v.rows, v.j0, nk, [&](std::int64_t, std::int64_t n, const float* rows) {
    finite = finite && RowsFinite(rows, v.rows.stride, Dv, n);
  });
  return !finite;
}

/// The FlashAttention-2 forward of one tile by vectors across rows: with the
/// queries in s.Qt, over the key blocks the tile may see, St = K·Qt, then the
/// online softmax step, then Ot = diag(alpha)·Ot + V^T·P (with `with_pv`;
/// without, only m and l are formed: the backward's dV-only path). After
/// Run, s.m and s.l hold the row max and the row sum of exp(s − m) (−inf and
/// 0 for a row with no visible key) and s.Ot the unnormalized output.
class WideTile {
 public:
  WideTile(const Call& c, const Tile& t, ForwardScratch& s, bool with_pv)
      : c_(c),
        t_(t),
        s_(s),
        with_pv_(with_pv),
        keys_(c.keys(t.n, t.g)),
        values_(c.values(t.n, t.g)),
        head_(t.kv_index(c)),
        score_(c, t_, s.score),
        softmax_(s, t.rows_p, t.stride),
        prefetched_(t.j_begin + c.key_block) {
    if (with_pv) std::fill(s.Ot.get(), s.Ot.get() + c.plan->Dv * t.stride, 0.0f);
  }
  WideTile(const WideTile&) = delete;
  WideTile& operator=(const WideTile&) = delete;

  /// Adds the keys of [j_from, j_to) that the tile may see (call with
  /// consecutive ranges; the blocks depend on the ranges given).
  void Run(std::int64_t j_from, std::int64_t j_to) {
    ForEachKeyBlock(c_, t_, j_from, j_to, [&](const KeyBlock& kb) { Block(kb); });
  }
  OutputRows output() const { return {s_.Ot.get(), 1, t_.stride}; }

 private:
  void Block(const KeyBlock& kb) {
    const AttentionPlan& p = *c_.plan;
    const std::int64_t R = t_.stride, ks = s_.Kp->stride();
    float* St = s_.St.get();
    Prefetch(kb.j0);
    score_.SetBlock(kb.j0, kb.nk);
    // S <- Q K^T (transposed: St[jj][r] = <k_{j0+jj}, q_r>, rows lo .. hi−1)
    float* Kp = s_.Kp->Get(keys_, head_, kb.j0, kb.nk);
    score_.ZeroHiddenRows(Kp, ks, kb.nk);
    const ValueBlock v = with_pv_ ? Values(kb) : ValueBlock{};
    const bool careful = with_pv_ && CarefulPV(score_, v, p.Dv, kb.nk);
    // One strip of the micro-kernel's width at a time: its scores stay in L1
    // from Q·K^T through the softmax to P·V.
    const std::int64_t strip = StripWidth();
    for (std::int64_t lo = kb.lo; lo < kb.hi; lo += strip) {
      const std::int64_t hi = std::min(kb.hi, lo + strip);
      Gemm(kb.nk, hi - lo, p.D, Kp, ks, 1, s_.Qt.get() + lo, R, St + lo, R, false);
      const bool rescale = softmax_.Step(St, kb.nk, lo, hi, score_, careful);
      if (with_pv_) AddValues(kb.nk, lo, hi, v, careful, rescale);
    }
  }
  /// O <- diag(2^(m − m_new))·O + P V (transposed: Ot[dv][r]) for the rows
  /// in the columns [lo, hi), the rescale only for the vectors of rows whose
  /// m moved (elsewhere every factor is 1).
  void AddValues(std::int64_t nk, std::int64_t lo, std::int64_t hi, const ValueBlock& v,
                 bool careful, bool rescale) {
    const DF d;
    const std::int64_t R = t_.stride, Dv = c_.plan->Dv;
    float* Ot = s_.Ot.get();
    float* St = s_.St.get();
    for (std::int64_t r0 = lo; rescale && r0 < hi; r0 += Lanes()) {
      if (!softmax_.rescaled(r0)) continue;
      const VF a = hn::LoadU(d, softmax_.alpha() + r0);
      for (std::int64_t dv = 0; dv < Dv; ++dv) {
        hn::StoreU(hn::Mul(hn::LoadU(d, Ot + dv * R + r0), a), d, Ot + dv * R + r0);
      }
    }
    // P is B here (its own marks)
    GemmCareful<Skip::by_b>(careful, Dv, hi - lo, nk, v.rows.base, 1, v.rows.stride, St + lo, R,
                            Ot + lo, R, true, St + lo);
  }
  /// The block's V rows, packed (see PackedRows in attention_tile-inl.h: a
  /// paged cache's rows are gathered there), zero for a padding key.
  ValueBlock Values(const KeyBlock& kb) {
    float* Vp = s_.Vp->Get(values_, head_, kb.j0, kb.nk);
    score_.ZeroHiddenRows(Vp, s_.Vp->stride(), kb.nk);
    return {KeyRows{Vp, s_.Vp->stride(), values_.width}, 0};
  }
  /// Keeps the K and V rows of the next kPrefetchKeys keys on their way into
  /// the cache while the block computes, where they are still to be packed.
  void Prefetch(std::int64_t j0) {
    const std::int64_t ahead = std::min(t_.j_end, j0 + c_.key_block + kPrefetchKeys);
    if (ahead <= prefetched_) return;
    const std::int64_t n = ahead - prefetched_;
    if (s_.Kp->Missing(head_, prefetched_, n)) PrefetchRows(keys_, prefetched_, n);
    if (with_pv_ && s_.Vp->Missing(head_, prefetched_, n)) PrefetchRows(values_, prefetched_, n);
    prefetched_ = ahead;
  }

  const Call& c_;
  const Tile t_;
  ForwardScratch& s_;
  bool with_pv_;
  KeyRows keys_, values_;
  std::int64_t head_;  ///< Tile::kv_index: which packed rows are the tile's
  ScoreTransform score_;
  OnlineSoftmax softmax_;
  std::int64_t prefetched_;
};

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

/// How a decode tile prefetches: the K and V rows of key j + ahead while it
/// computes key j, as long as j + ahead < end (a split-key call, which steps
/// through every kv head in turn, aims one step ahead).
struct DecodePrefetch {
  std::int64_t ahead = kPrefetchKeys, end = 0;
};

/// The FlashAttention-2 forward of one tile by vectors along d: with the
/// queries in s.Qn (row r at r·Dp, Dp = D rounded up to whole vectors, zero
/// beyond D; PackQueriesNatural), over the key blocks the tile may see,
/// S[jj][r] = <q_r, k_j> by dot products, then the online softmax step,
/// then On = diag(alpha)·On + P·V (with `with_pv`) with rows as broadcasts.
/// Rows whose width is a whole number of vectors are read in place. After
/// Run, s.m and s.l are as for WideTile and s.On (row r at r·Dvp) holds the
/// unnormalized output.
class DecodeTile {
 public:
  DecodeTile(const Call& c, const Tile& t, ForwardScratch& s, bool with_pv, DecodePrefetch pf)
      : c_(c),
        t_(t),
        s_(s),
        with_pv_(with_pv),
        pf_(pf),
        Dp_(RoundUp(c.plan->D, Lanes())),
        Dvp_(RoundUp(c.plan->Dv, Lanes())),
        keys_(c.keys(t.n, t.g)),
        values_(c.values(t.n, t.g)),
        score_(c, t_, s.score),
        softmax_(s, t.rows_p, t.stride) {
    if (with_pv) std::fill(s.On.get(), s.On.get() + t.rows_p * Dvp_, 0.0f);
  }
  DecodeTile(const DecodeTile&) = delete;
  DecodeTile& operator=(const DecodeTile&) = delete;

  /// As WideTile::Run.
  void Run(std::int64_t j_from, std::int64_t j_to) {
    ForEachKeyBlock(c_, t_, j_from, j_to, [&](const KeyBlock& kb) { Block(kb); });
  }
  const Tile& tile() const { return t_; }
  OutputRows output() const { return {s_.On.get(), Dvp_, 1}; }

 private:
  void Block(const KeyBlock& kb) {
    const std::int64_t R = t_.stride;
    // the rows of the tile in the block's columns (padding rows excluded)
    const std::int64_t r_end = std::min(kb.hi, t_.rows);
    float* St = s_.St.get();
    score_.SetBlock(kb.j0, kb.nk);
    Scores(kb, r_end);
    const ValueBlock v = with_pv_ ? Values(kb) : ValueBlock{};
    const bool careful = with_pv_ && CarefulPV(score_, v, c_.plan->Dv, kb.nk);
    const bool rescale = softmax_.Step(St, kb.nk, kb.lo, kb.hi, score_, careful);
    if (!with_pv_) return;
    // O <- diag(2^(m − m_new))·O + P V, On[r][dv] natural, rows as
    // broadcasts, the rescale only for the rows whose m moved
    const DF d;
    float* On = s_.On.get();
    for (std::int64_t r = kb.lo; rescale && r < r_end; ++r) {
      if (softmax_.alpha()[r] == 1.0f) continue;
      const VF a = hn::Set(d, softmax_.alpha()[r]);
      for (std::int64_t x = 0; x < Dvp_; x += Lanes())
        hn::StoreU(hn::Mul(hn::LoadU(d, On + r * Dvp_ + x), a), d, On + r * Dvp_ + x);
    }
    // P is A here (its own marks); one product per run of V rows (per
    // block of a paged cache), each continuing the same chains in key order
    ForEachRun(v.rows, v.j0, kb.nk, [&](std::int64_t jj, std::int64_t n, const float* rows) {
      float* P = St + jj * R + kb.lo;
      GemmCareful<Skip::by_a>(careful, r_end - kb.lo, Dvp_, n, P, 1, R, rows, v.rows.stride,
                              On + kb.lo * Dvp_, Dvp_, true, P);
    });
  }
  /// S <- Q K^T by dot products along d, St[jj][r] for the rows lo .. r_end−1
  /// (zero in the padding rows up to hi, never stored).
  void Scores(const KeyBlock& kb, std::int64_t r_end) {
    const std::int64_t R = t_.stride;
    float* St = s_.St.get();
    // (one row at a time: in place wherever the rows are, a paged cache too)
    const bool in_place = keys_.width == Dp_ && !score_.any_hidden();
    if (!in_place) {
      PackKeyRows(keys_, kb.j0, kb.nk, Dp_, s_.Kn.get());
      score_.ZeroHiddenRows(s_.Kn.get(), Dp_, kb.nk);
    }
    for (std::int64_t jj = 0; jj < kb.nk; ++jj) {
      // a decode tile computes little per key: spread the prefetches over
      // the keys instead of issuing a block's worth at once
      const std::int64_t j = kb.j0 + jj;
      if (j + pf_.ahead < pf_.end) {
        PrefetchRows(keys_, j + pf_.ahead, 1);
        if (with_pv_) PrefetchRows(values_, j + pf_.ahead, 1);
      }
      const float* krow = in_place ? keys_.row(j) : s_.Kn.get() + jj * Dp_;
      float* out = St + jj * R;
      std::int64_t r = kb.lo;
      for (; r + 4 <= r_end; r += 4) DotRows<4>(s_.Qn.get(), r, krow, Dp_, out + r);
      for (; r < r_end; ++r) DotRows<1>(s_.Qn.get(), r, krow, Dp_, out + r);
      for (; r < kb.hi; ++r) out[r] = 0.0f;  // padding rows, never stored
    }
  }
  /// The block's V rows: in place where they are whole vectors wide and no
  /// padding key needs zeroing (a paged cache's too, a run per block), else
  /// packed with whole-vector rows.
  ValueBlock Values(const KeyBlock& kb) {
    if (values_.width == Dvp_ && !score_.any_hidden()) return {values_, kb.j0};
    PackKeyRows(values_, kb.j0, kb.nk, Dvp_, s_.Vn.get());
    score_.ZeroHiddenRows(s_.Vn.get(), Dvp_, kb.nk);
    return {KeyRows{s_.Vn.get(), Dvp_, values_.width}, 0};
  }

  const Call& c_;
  const Tile t_;
  ForwardScratch& s_;
  bool with_pv_;
  DecodePrefetch pf_;
  std::int64_t Dp_, Dvp_;  ///< D and Dv rounded up to whole vectors
  KeyRows keys_, values_;
  ScoreTransform score_;
  OnlineSoftmax softmax_;
};

/// The whole forward of one tile with the queries in s.Qt and the
/// unnormalized output left in s.Ot (the backward's layout), by the call's
/// algorithm; a decode tile is fed s.Qn from s.Qt and its s.On is copied
/// back to s.Ot.
inline void ForwardTileTransposed(const Call& c, const Tile& t, ForwardScratch& s, bool with_pv) {
  if (!c.decode) {
    WideTile(c, t, s, with_pv).Run(t.j_begin, t.j_end);
    return;
  }
  const std::int64_t R = t.stride, D = c.plan->D, Dp = RoundUp(D, Lanes());
  const float* Qt = s.Qt.get();
  for (std::int64_t r = 0; r < t.rows_p; ++r) {
    for (std::int64_t x = 0; x < Dp; ++x) s.Qn.get()[r * Dp + x] = x < D ? Qt[x * R + r] : 0.0f;
  }
  DecodeTile tile(c, t, s, with_pv, {kPrefetchKeys, t.j_end});
  tile.Run(t.j_begin, t.j_end);
  if (!with_pv) return;
  const OutputRows o = tile.output();
  for (std::int64_t r = 0; r < t.rows_p; ++r) {
    for (std::int64_t dv = 0; dv < c.plan->Dv; ++dv) s.Ot.get()[dv * R + r] = o.at(r, dv);
  }
}

/// The sinks of the rows r0 .. r0+N−1 (spec §2.7) merged into their softmax
/// as one more partial sum with m = sink_h (in log2 units, sink_h·log2 e),
/// l = 1 and no value (the key the sink is, property sink_equals_extra_key):
/// m <- max(m, sink_h), a = 2^(m_old − m), l <- l·a + 2^(sink_h − m); the
/// running output must be scaled by a. A row with no visible key gets
/// m = sink_h, l = 1, a = 0. Padding rows keep their m and l (a = 1).
HWY_INLINE void MergeSinks(const Call& c, const Tile& t, std::int64_t r0, VF& m, VF& l, VF& a) {
  const DF d;
  const VF neg_inf = hn::Set(d, -std::numeric_limits<float>::infinity());
  HWY_ALIGN float rows[kMaxFloatLanes];
  for (std::int64_t n = 0; n < Lanes(); ++n) {
    const std::int64_t r = r0 + n;
    rows[n] = r < t.rows ? c.sinks[t.head(r)] * kLog2e : -std::numeric_limits<float>::infinity();
  }
  const VF sink = hn::Load(d, rows);
  const auto real = hn::Ne(sink, neg_inf);
  const VF m_new = hn::Max(m, sink);
  const VF a_new = SoftmaxExp2(d, hn::Sub(m, m_new));  // m = −inf: 0
  l = hn::IfThenElse(real, hn::MulAdd(l, a_new, SoftmaxExp2(d, hn::Sub(sink, m_new))), l);
  a = hn::IfThenElse(real, a_new, a);
  m = hn::IfThenElse(real, m_new, m);
}

/// inv[r] = a/l[r] (0 for a row with no visible key and no sink; a = 1, or
/// the factor of MergeSinks with sinks) and, when lse is given,
/// lse[r] = (m[r] + log2(l[r]))·ln 2 (−inf for such a row; the sink
/// included). A row that sees a key with a NaN score has l = NaN: it counts
/// as seen (NaN, as in the reference), not as a row with no visible key (0,
/// no gradient).
inline void FinishRows(const Call& c, const Tile& t, const ForwardScratch& s, float* inv,
                       float* lse) {
  const DF d;
  const std::int64_t N = Lanes();
  const VF zero = hn::Zero(d);
  for (std::int64_t r0 = 0; r0 < t.rows_p; r0 += N) {
    VF l = hn::LoadU(d, s.l.get() + r0);
    VF m = hn::LoadU(d, s.m.get() + r0);
    VF a = hn::Set(d, 1.0f);
    if (c.sinks != nullptr) MergeSinks(c, t, r0, m, l, a);
    const auto seen = hn::Not(hn::Eq(l, zero));
    hn::StoreU(hn::IfThenElseZero(seen, hn::Div(a, l)), d, inv + r0);
    if (lse != nullptr) {
      // Log of the other lanes is never used; feed it 1 to keep it quiet.
      const auto positive = hn::Gt(l, zero);
      const VF lg = hn::Log2(d, hn::IfThenElse(positive, l, hn::Set(d, 1.0f)));
      // l = 0 (no visible key): −inf; l = NaN: NaN
      const VF other = hn::IfThenElse(seen, l, hn::Set(d, -std::numeric_limits<float>::infinity()));
      hn::StoreU(hn::IfThenElse(positive, hn::Mul(hn::Add(m, lg), hn::Set(d, kLn2)), other), d,
                 lse + r0);
    }
  }
}

}  // namespace tandem::optimized::HWY_NAMESPACE::attn
HWY_AFTER_NAMESPACE();

#endif  // toggle guard
