// SPDX-License-Identifier: Apache-2.0
// Per-target FlashAttention-2 forward over one tile of query rows (the
// forward, the split-key decode and the backward's recomputation of the
// log-sum-exp run it). Included once per Highway target (the toggle guard
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
#include <vector>

#include "attention_tile-inl.h"

HWY_BEFORE_NAMESPACE();
namespace tandem::optimized::HWY_NAMESPACE::attn {

namespace hn = hwy::HWY_NAMESPACE;

/// Per-thread scratch of the forward, sized for the largest tile. With
/// `natural` (narrow tiles run in the natural layout only, see TileForward)
/// the transposed and wide-tile buffers Qt, Ot, Kp, Vp are left empty.
struct ForwardScratch {
  Buffer Qt, St, Ot, m, l, alpha, Kp, Vp, Qn, Kn, Vn, On;
  ScoreScratch score;
  explicit ForwardScratch(const Call& c, bool natural = false) : score(c.max_rows_p) {
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
  }
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
        score_(c, t_, s.score) {
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
