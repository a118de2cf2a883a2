// SPDX-License-Identifier: Apache-2.0
// Per-target softmax of the optimized attention, in log2 units (scores
// x = s·log2 e, p = 2^x, attention_exp2-inl.h): the online softmax of a
// tile's rows over its key blocks (OnlineSoftmax), and the finish of a row
// — the sink merged as one more partial sum, the output's factor 1/l and
// the log-sum-exp — written once for a vector of rows (the tiles,
// FinishRows) and for one row (the split-key merge, MergeRow in
// attention_forward.cpp). Included once per Highway target (the toggle
// guard below), after <hwy/highway.h>.
#if defined(TANDEM_OPTIMIZED_ATTENTION_SOFTMAX_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TANDEM_OPTIMIZED_ATTENTION_SOFTMAX_INL_H_
#undef TANDEM_OPTIMIZED_ATTENTION_SOFTMAX_INL_H_
#else
#define TANDEM_OPTIMIZED_ATTENTION_SOFTMAX_INL_H_
#endif

#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "attention_call-inl.h"
#include "attention_exp2-inl.h"
#include "attention_score-inl.h"
#include "convert-inl.h"

HWY_BEFORE_NAMESPACE();
namespace tandem::optimized::HWY_NAMESPACE::attn {

namespace hn = hwy::HWY_NAMESPACE;

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
///
/// A call that rounds its weights to a storage type T (Call::weights, the
/// `pytorch` profile of SPEC §10.2) stores RN_T(2^(x − m)) into P for the
/// product with V, while l sums the unrounded 2^(x − m). Its m is moved to
/// ⌈row max⌉, a whole number (μ_i of §10.2): every alpha is then a power of
/// two, and since RN_T(2^k·y) = 2^k·RN_T(y), the rounded weights are those
/// against the row's final μ_i whichever block moved m last. Calls that
/// keep their weights in float keep m at the row max itself, so that a
/// row's own maximum gets weight 2^0 = 1 exactly (a row with one visible key
/// reproduces v).
class OnlineSoftmax {
 public:
  static constexpr float kRescaleAbove = 8.0f;

  /// For rows_p rows whose scores lie `stride` apart from one key to the next;
  /// m, l and alpha: rows_p floats each (ForwardScratch); `weights`: whether
  /// and to which storage type P is rounded (Call::weights).
  OnlineSoftmax(float* m, float* l, float* alpha, std::int64_t rows_p, std::int64_t stride,
                WeightRounding weights)
      : m_(m),
        l_(l),
        alpha_(alpha),
        rows_p_(rows_p),
        R_(stride),
        weights_(weights),
        rescaled_(static_cast<std::size_t>(rows_p / Lanes()), 0) {
    Restart();
  }

  /// m = −inf and l = 0 for every row: no key seen (the start, and an
  /// invariant call's next chunk, ChunkMerge).
  void Restart() {
    const DF d;
    for (std::int64_t r = 0; r < rows_p_; r += Lanes()) {
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
      // m_new <- rowmax(S) (⌈rowmax(S)⌉ when P is rounded) where it exceeds m
      // by more than kRescaleAbove, else m (masked keys at −inf)
      const VF m_old = hn::LoadU(d, m_ + r0);
      const VF mx = Scores(St, nk, r0, score);
      const auto grow = hn::Gt(mx, hn::Add(m_old, hn::Set(d, kRescaleAbove)));
      const bool whole = weights_ != WeightRounding::none;
      const VF m_new = hn::IfThenElse(grow, whole ? hn::Ceil(mx) : mx, m_old);
      // A row that has seen no visible key yet keeps m = −inf; subtract 0
      // there so that 2^(−inf − (−inf)) is never formed.
      const VF m_use = hn::IfThenZeroElse(hn::Eq(m_new, neg_inf), m_new);
      // P <- 2^(S − m_new); l <- 2^(m − m_new)·l + rowsum(P)
      const bool moved = !hn::AllFalse(d, grow);
      const VF a = moved ? SoftmaxExp2(d, hn::Sub(m_old, m_use)) : hn::Set(d, 1.0f);
      VF sum;
      switch (weights_) {
        case WeightRounding::none:
          sum = Exponentiate<float>(St, nk, r0, m_use);
          break;
        case WeightRounding::bf16:
          sum = Exponentiate<bfloat16>(St, nk, r0, m_use);
          break;
        case WeightRounding::f16:
          sum = Exponentiate<float16>(St, nk, r0, m_use);
          break;
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
  /// P <- RN_T(2^(S − m)) in place for rows r0 .. r0+N−1 (2^(S − m) itself
  /// for T = float); returns rowsum(2^(S − m)), the unrounded weights.
  template <class T>
  HWY_INLINE VF Exponentiate(float* St, std::int64_t nk, std::int64_t r0, VF m_use) const {
    const DF d;
    VF sum = hn::Zero(d);
    for (std::int64_t jj = 0; jj < nk; ++jj) {
      const VF pr = SoftmaxExp2(d, hn::Sub(hn::LoadU(d, St + jj * R_ + r0), m_use));
      hn::StoreU(RoundAs<T>(d, pr), d, St + jj * R_ + r0);
      sum = hn::Add(sum, pr);
    }
    return sum;
  }
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
  std::int64_t rows_p_;
  std::int64_t R_;
  WeightRounding weights_;
  std::vector<char> rescaled_;  ///< per vector of rows, for the last block
};

// ---------------------------------------------------------------------------
// The finish of a row, written once for a vector of rows (VF: FinishRows)
// and for one row (float: the split-key merge, MergeRow): the lane
// operations below take either, and the bodies use +, −, ·, / and the
// comparisons, which Highway defines for vectors as for floats. (One row
// stays a float rather than a one-lane vector: the compiler may fuse a
// vector's m + log2 l, log2 being a product, into one multiply-add, and the
// split-key merge has always rounded the two apart.)

/// Lane operations of the finish, for a vector of rows and for one row.
namespace lane {
template <class V>
V Splat(float x);
template <>
HWY_INLINE float Splat<float>(float x) {
  return x;
}
template <>
HWY_INLINE VF Splat<VF>(float x) {
  return hn::Set(DF(), x);
}
HWY_INLINE float IfThenElse(bool m, float yes, float no) {
  return m ? yes : no;
}
HWY_INLINE VF IfThenElse(hn::Mask<DF> m, VF yes, VF no) {
  return hn::IfThenElse(m, yes, no);
}
HWY_INLINE float Max(float a, float b) {
  return std::max(a, b);
}
HWY_INLINE VF Max(VF a, VF b) {
  return hn::Max(a, b);
}
HWY_INLINE float MulAdd(float a, float b, float c) {
  return a * b + c;
}
HWY_INLINE VF MulAdd(VF a, VF b, VF c) {
  return hn::MulAdd(a, b, c);
}
HWY_INLINE float Ceil(float x) {
  return std::ceil(x);
}
HWY_INLINE VF Ceil(VF x) {
  return hn::Ceil(x);
}
HWY_INLINE float Exp2(float x) {
  return hn::GetLane(SoftmaxExp2(DF(), hn::Set(DF(), x)));
}
HWY_INLINE VF Exp2(VF x) {
  return SoftmaxExp2(DF(), x);
}
HWY_INLINE float Log2(float x) {
  return hn::GetLane(hn::Log2(DF(), hn::Set(DF(), x)));
}
HWY_INLINE VF Log2(VF x) {
  return hn::Log2(DF(), x);
}
}  // namespace lane

/// The sink s (in log2 units, s = sink_h·log2 e) merged into a softmax row's
/// max m and sum l as one more partial sum with max s, sum 1 and no value
/// (the key the sink is, SPEC §2.7, property sink_equals_extra_key):
/// m <- max(m, s), a = 2^(m_old − m), l <- l·a + 2^(s − m); the row's
/// unnormalized output must be scaled by a. A row with no visible key gets
/// m = s, l = 1, a = 0; where m >= s already (the split-key merge takes the
/// sink into its max) a = 2^0 = 1 exactly. Lanes with s = −inf (padding
/// rows) keep their m, l and a. With `whole` (a whole-number m, see
/// OnlineSoftmax) m <- max(m, ⌈s⌉), so that a stays a power of two. V: VF
/// or float.
template <class V>
HWY_INLINE void MergeSink(V s, V& m, V& l, V& a, bool whole) {
  const auto real = s != lane::Splat<V>(-std::numeric_limits<float>::infinity());
  const V m_new = lane::Max(m, whole ? lane::Ceil(s) : s);
  const V a_new = lane::Exp2(m - m_new);  // m = −inf: 0
  l = lane::IfThenElse(real, lane::MulAdd(l, a_new, lane::Exp2(s - m_new)), l);
  a = lane::IfThenElse(real, a_new, a);
  m = lane::IfThenElse(real, m_new, m);
}

/// The factor a/l a finished row's unnormalized output is multiplied by
/// (a = 1, or MergeSink's factor): l = 0 (no visible key, no sink) gives 0,
/// the row's output 0 (SPEC §2.3); l = NaN (the row saw a key with a NaN
/// score) counts as seen and gives NaN, as in the reference. V: VF or float.
template <class V>
HWY_INLINE V FinishFactor(V l, V a) {
  const V zero = lane::Splat<V>(0.0f);
  return lane::IfThenElse(l == zero, zero, a / l);
}

/// A finished row's log-sum-exp (SPEC §2.5) from its max m and sum l of
/// 2^(x − m) in log2 units: lse = (m + log2 l)·ln 2; l = 0 (no visible key,
/// no sink) gives −inf, l = NaN stays NaN. V: VF or float.
template <class V>
HWY_INLINE V FinishLse(V m, V l) {
  const V zero = lane::Splat<V>(0.0f);
  // Log of the other lanes is never used; feed it 1 to keep it quiet.
  const auto positive = l > zero;
  const V lg = lane::Log2(lane::IfThenElse(positive, l, lane::Splat<V>(1.0f)));
  const V other =
      lane::IfThenElse(l == zero, lane::Splat<V>(-std::numeric_limits<float>::infinity()), l);
  return lane::IfThenElse(positive, (m + lg) * lane::Splat<V>(kLn2), other);
}

/// The finish of a tile's rows from the online softmax's m and l (rows_p
/// floats each): with sinks, each row's sink merged (MergeSink, sink_h of
/// the row's head); inv[r] = FinishFactor and, when lse is given, lse[r] =
/// FinishLse (the sink included), for whole vectors of rows.
inline void FinishRows(const Call& c, const Tile& t, const float* m_rows, const float* l_rows,
                       float* inv, float* lse) {
  const DF d;
  const std::int64_t N = Lanes();
  HWY_ALIGN float sinks[kMaxFloatLanes];
  for (std::int64_t r0 = 0; r0 < t.rows_p; r0 += N) {
    VF l = hn::LoadU(d, l_rows + r0);
    VF m = hn::LoadU(d, m_rows + r0);
    VF a = hn::Set(d, 1.0f);
    if (c.sinks != nullptr) {
      for (std::int64_t n = 0; n < N; ++n) {
        const std::int64_t r = r0 + n;
        sinks[n] =
            r < t.rows ? c.sinks[t.head(r)] * kLog2e : -std::numeric_limits<float>::infinity();
      }
      MergeSink(hn::Load(d, sinks), m, l, a, c.weights != WeightRounding::none);
    }
    hn::StoreU(FinishFactor(l, a), d, inv + r0);
    if (lse != nullptr) hn::StoreU(FinishLse(m, l), d, lse + r0);
  }
}

}  // namespace tandem::optimized::HWY_NAMESPACE::attn
HWY_AFTER_NAMESPACE();

#endif  // toggle guard
