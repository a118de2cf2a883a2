// SPDX-License-Identifier: Apache-2.0
// Per-target FlashAttention-2 forward over one tile of query rows, by two
// algorithms over one online-softmax step (Geometry::decode_tiles chooses,
// per call):
//
//  - WideTile: vectors across query rows (the transposed layout of
//    attention_call-inl.h); S = K·Qt and Ot += V^T·P by the broadcast
//    micro-kernel. By default every tile of more than one vector of rows.
//  - DecodeTile: vectors along d; S by dot products, O += P·V with rows as
//    broadcasts. By default tiles of one vector of rows (a decode step: one
//    query of the G heads of a group), which would waste most lanes of the
//    wide tile and load every K and V element on its own.
//
// The forward, the split-key decode and the backward's recomputation of the
// log-sum-exp run them. A tile's keys go through the headers below in the
// order of a block: packed (attention_packed_rows-inl.h), multiplied
// (gemm-inl.h), transformed (attention_score-inl.h), turned into
// probabilities (attention_softmax-inl.h) and multiplied with V; the queries
// come in and the rows go out through attention_transpose-inl.h. Included
// once per Highway target (the toggle guard below), after <hwy/highway.h>.

#if defined(TANDEM_OPTIMIZED_ATTENTION_FORWARD_TILE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TANDEM_OPTIMIZED_ATTENTION_FORWARD_TILE_INL_H_
#undef TANDEM_OPTIMIZED_ATTENTION_FORWARD_TILE_INL_H_
#else
#define TANDEM_OPTIMIZED_ATTENTION_FORWARD_TILE_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>

#include "attention_call-inl.h"
#include "attention_chunk_merge-inl.h"
#include "attention_packed_rows-inl.h"
#include "attention_score-inl.h"
#include "attention_softmax-inl.h"
#include "attention_transpose-inl.h"
#include "buffer.hpp"
#include "gemm-inl.h"

HWY_BEFORE_NAMESPACE();
namespace tandem::optimized::HWY_NAMESPACE::attn {

namespace hn = hwy::HWY_NAMESPACE;

/// Per-thread scratch of the forward tiles, sized for the largest tile of
/// the call: St (scores, then probabilities, [key_block][stride]) and the
/// online softmax's m, l, alpha for every tile; Qt, Ot, Kp, Vp for the wide
/// tile (and the backward) when `transposed`; Qn, On, Kn, Vn for the decode
/// tile when the call takes it (and Qt, which its scores are formed from,
/// in an invariant call); the chunk merge's state in an invariant call.
struct ForwardScratch {
  Buffer St, m, l, alpha;
  ScoreScratch score;
  Buffer Qt, Ot;
  std::optional<PackedRows> Kp, Vp;
  Buffer Qn, On, Kn, Vn;
  ChunkScratch chunk;
  ForwardScratch(const Call& c, bool transposed) : score(c.max_rows_p) {
    const AttentionPlan& p = *c.plan;
    const std::int64_t R = c.max_rows_p, ld = c.max_stride;
    St.resize(c.key_block * ld);
    m.resize(R);
    l.resize(R);
    alpha.resize(R);
    if (transposed || (c.decode && c.invariant)) Qt.resize(p.D * ld);
    if (transposed) {
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
    if (c.invariant) {
      const std::int64_t Dvp = RoundUp(p.Dv, Lanes());
      chunk = ChunkScratch(R, std::max(transposed ? p.Dv * ld : 0, c.decode ? R * Dvp : 0));
    }
  }
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

/// O <- diag(2^(m − m_new))·O (transposed: Ot[dv][r], Dv lines R apart) for
/// the rows in the columns [lo, hi) after softmax.Step returned `rescale`:
/// only the vectors of rows whose m moved (elsewhere every factor is 1).
inline void RescaleOutput(const OnlineSoftmax& softmax, bool rescale, std::int64_t Dv,
                          std::int64_t lo, std::int64_t hi, float* Ot, std::int64_t R) {
  const DF d;
  for (std::int64_t r0 = lo; rescale && r0 < hi; r0 += Lanes()) {
    if (!softmax.rescaled(r0)) continue;
    const VF a = hn::LoadU(d, softmax.alpha() + r0);
    for (std::int64_t dv = 0; dv < Dv; ++dv) {
      hn::StoreU(hn::Mul(hn::LoadU(d, Ot + dv * R + r0), a), d, Ot + dv * R + r0);
    }
  }
}

/// O <- O + P V in float (transposed: Ot[dv][r] += Σ_jj St[jj][r]·v_jj[dv])
/// for the rows in the columns [lo, hi) of a block of nk keys, leaving out
/// the marked products when `careful` (P is B here, with its own marks).
inline void AddValuesFloat(std::int64_t Dv, std::int64_t nk, std::int64_t lo, std::int64_t hi,
                           const ValueBlock& v, bool careful, float* St, float* Ot,
                           std::int64_t R) {
  GemmCareful<Skip::by_b>(careful, Dv, hi - lo, nk, v.rows.base, 1, v.rows.stride, St + lo, R,
                          Ot + lo, R, true, St + lo);
}

/// What the forward tiles (WideTile, Bf16Tile) share: the call, the tile,
/// its scratch, its K and V rows, the score transform and the online
/// softmax over the tile's rows, and Run, which hands each key block the tile
/// may see to Derived::Block. With zero_output, s.Ot starts at 0.
template <class Derived>
class KeyBlockTile {
 public:
  KeyBlockTile(const KeyBlockTile&) = delete;
  KeyBlockTile& operator=(const KeyBlockTile&) = delete;

  /// Adds the keys of [j_from, j_to) that the tile may see (call with
  /// consecutive ranges; the blocks depend on the ranges given, but in an
  /// invariant call).
  void Run(std::int64_t j_from, std::int64_t j_to) {
    ForEachKeyBlock(c_, t_, j_from, j_to, [&](const KeyBlock& kb) {
      merge_.Enter(t_.key_origin + kb.j0, [&] { Restart(); });
      static_cast<Derived*>(this)->Block(kb);
    });
  }
  /// After the last Run: an invariant call's chunks merged (ChunkMerge).
  void Close() { merge_.Close(); }
  OutputRows output() const { return {s_.Ot.get(), 1, t_.stride}; }

 protected:
  KeyBlockTile(const Call& c, const Tile& t, ForwardScratch& s, bool zero_output)
      : c_(c),
        t_(t),
        s_(s),
        keys_(c.keys(t.n, t.g)),
        values_(c.values(t.n, t.g)),
        head_(t.kv_index(c)),
        score_(c, t_, s.score),
        softmax_(s.m.get(), s.l.get(), s.alpha.get(), t.rows_p, t.stride, c.weights),
        with_output_(zero_output),
        merge_(c.invariant, {s.m.get(), s.l.get(), zero_output ? s.Ot.get() : nullptr, 1, t.stride},
               t.rows_p, c.plan->Dv, s.chunk) {
    ZeroOutput();
  }
  ~KeyBlockTile() = default;

  /// No key seen: the softmax's start and a zero output.
  void Restart() {
    softmax_.Restart();
    ZeroOutput();
  }
  void ZeroOutput() {
    if (with_output_) std::fill(s_.Ot.get(), s_.Ot.get() + c_.plan->Dv * t_.stride, 0.0f);
  }

  const Call& c_;
  const Tile t_;
  ForwardScratch& s_;
  KeyRows keys_, values_;
  std::int64_t head_;  ///< Tile::kv_index: which packed rows are the tile's
  ScoreTransform score_;
  OnlineSoftmax softmax_;
  bool with_output_;
  ChunkMerge merge_;
};

/// The FlashAttention-2 forward of one tile by vectors across rows: with the
/// queries in s.Qt, over the key blocks the tile may see, St = K·Qt, then the
/// online softmax step, then Ot = diag(alpha)·Ot + V^T·P (with `with_pv`;
/// without, only m and l are formed: the backward's dV-only path). After
/// Run, s.m and s.l hold the row max and the row sum of exp(s − m) (−inf and
/// 0 for a row with no visible key) and s.Ot the unnormalized output.
class WideTile : public KeyBlockTile<WideTile> {
 public:
  WideTile(const Call& c, const Tile& t, ForwardScratch& s, bool with_pv)
      : KeyBlockTile(c, t, s, with_pv), with_pv_(with_pv), prefetched_(t.j_begin + c.key_block) {}

 private:
  friend class KeyBlockTile<WideTile>;
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
  /// O <- diag(2^(m − m_new))·O + P V for the rows in the columns [lo, hi).
  void AddValues(std::int64_t nk, std::int64_t lo, std::int64_t hi, const ValueBlock& v,
                 bool careful, bool rescale) {
    RescaleOutput(softmax_, rescale, c_.plan->Dv, lo, hi, s_.Ot.get(), t_.stride);
    AddValuesFloat(c_.plan->Dv, nk, lo, hi, v, careful, s_.St.get(), s_.Ot.get(), t_.stride);
  }
  /// The block's V rows, packed (see PackedRows in attention_packed_rows-inl.h: a
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

  bool with_pv_;
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
        softmax_(s.m.get(), s.l.get(), s.alpha.get(), t.rows_p, t.stride, c.weights),
        merge_(c.invariant, {s.m.get(), s.l.get(), with_pv ? s.On.get() : nullptr, Dvp_, 1},
               t.rows_p, Dvp_, s.chunk) {
    ZeroOutput();
  }
  DecodeTile(const DecodeTile&) = delete;
  DecodeTile& operator=(const DecodeTile&) = delete;

  /// As WideTile::Run.
  void Run(std::int64_t j_from, std::int64_t j_to) {
    ForEachKeyBlock(c_, t_, j_from, j_to, [&](const KeyBlock& kb) {
      merge_.Enter(t_.key_origin + kb.j0, [&] {
        softmax_.Restart();
        ZeroOutput();
      });
      Block(kb);
    });
  }
  /// As WideTile::Close.
  void Close() { merge_.Close(); }
  const Tile& tile() const { return t_; }
  OutputRows output() const { return {s_.On.get(), Dvp_, 1}; }

 private:
  void Block(const KeyBlock& kb) {
    const std::int64_t R = t_.stride;
    // the rows of the tile in the block's columns (padding rows excluded)
    const std::int64_t r_end = std::min(kb.hi, t_.rows);
    float* St = s_.St.get();
    score_.SetBlock(kb.j0, kb.nk);
    if (c_.invariant) {
      ScoresInOrder(kb);
    } else {
      Scores(kb, r_end);
    }
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
  /// S <- Q K^T as the wide tile forms it (an invariant call, SPEC §12):
  /// St[jj][r] = one multiply-add chain over d in order (Gemm, with the
  /// queries in s.Qt as vectors across rows) for the block's columns, the K
  /// rows read in place (a run per block of a paged cache) unless a padding
  /// key must be zeroed.
  void ScoresInOrder(const KeyBlock& kb) {
    const std::int64_t R = t_.stride, D = c_.plan->D, cols = kb.hi - kb.lo;
    float* St = s_.St.get() + kb.lo;
    const float* Qt = s_.Qt.get() + kb.lo;
    for (std::int64_t j = kb.j0 + pf_.ahead; j < std::min(kb.j0 + kb.nk + pf_.ahead, pf_.end);
         ++j) {
      PrefetchRows(keys_, j, 1);
      if (with_pv_) PrefetchRows(values_, j, 1);
    }
    if (score_.any_hidden()) {
      PackKeyRows(keys_, kb.j0, kb.nk, Dp_, s_.Kn.get());
      score_.ZeroHiddenRows(s_.Kn.get(), Dp_, kb.nk);
      Gemm(kb.nk, cols, D, s_.Kn.get(), Dp_, 1, Qt, R, St, R, false);
      return;
    }
    ForEachRun(keys_, kb.j0, kb.nk, [&](std::int64_t jj, std::int64_t n, const float* rows) {
      Gemm(n, cols, D, rows, keys_.stride, 1, Qt, R, St + jj * R, R, false);
    });
  }
  /// On = 0 (with P·V).
  void ZeroOutput() {
    if (with_pv_) std::fill(s_.On.get(), s_.On.get() + t_.rows_p * Dvp_, 0.0f);
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
  ChunkMerge merge_;
};

/// out = O / l for the rows of a finished tile, in the layout of q, and lse
/// when lse_out is given (inv = 1/l and lse_rows per row, FinishRows).
inline void WriteRows(const Call& c, const Tile& t, const OutputRows& o, const float* inv,
                      const float* lse_rows, float* out, float* lse_out) {
  // O <- diag(1/l)·O
  StoreRows(o, t.rows, c.plan->Dv, inv, [&](std::int64_t r) { return out + t.o_at(c, r); });
  for (std::int64_t r = 0; lse_out != nullptr && r < t.rows; ++r) {
    lse_out[t.lse_at(c, r)] = lse_rows[r];
  }
}

/// The whole forward of one tile with the queries in s.Qt and the
/// unnormalized output left in s.Ot (the backward's layout), by the call's
/// algorithm; a decode tile is fed s.Qn from s.Qt and its s.On is copied
/// back to s.Ot.
inline void ForwardTileTransposed(const Call& c, const Tile& t, ForwardScratch& s, bool with_pv) {
  if (!c.decode) {
    WideTile tile(c, t, s, with_pv);
    tile.Run(t.j_begin, t.j_end);
    tile.Close();
    return;
  }
  const std::int64_t R = t.stride, D = c.plan->D, Dp = RoundUp(D, Lanes());
  const float* Qt = s.Qt.get();
  for (std::int64_t r = 0; r < t.rows_p; ++r) {
    for (std::int64_t x = 0; x < Dp; ++x) s.Qn.get()[r * Dp + x] = x < D ? Qt[x * R + r] : 0.0f;
  }
  DecodeTile tile(c, t, s, with_pv, {kPrefetchKeys, t.j_end});
  tile.Run(t.j_begin, t.j_end);
  tile.Close();
  if (!with_pv) return;
  const OutputRows o = tile.output();
  for (std::int64_t r = 0; r < t.rows_p; ++r) {
    for (std::int64_t dv = 0; dv < c.plan->Dv; ++dv) s.Ot.get()[dv * R + r] = o.at(r, dv);
  }
}

}  // namespace tandem::optimized::HWY_NAMESPACE::attn
HWY_AFTER_NAMESPACE();

#endif  // toggle guard
