// SPDX-License-Identifier: Apache-2.0
// Per-target score transform of the optimized attention (SPEC §2): from the
// raw dot products of a key block to the scores in log2 units — softcap,
// ALiBi, bias and the masks — and which keys each row may not see (the
// careful path's marks, see Skip in gemm-inl.h). Included once per Highway
// target (the toggle guard below), after <hwy/highway.h>.
//
// Hidden keys never reach a sum: see Skip (gemm-inl.h).
#if defined(TANDEM_OPTIMIZED_ATTENTION_SCORE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TANDEM_OPTIMIZED_ATTENTION_SCORE_INL_H_
#undef TANDEM_OPTIMIZED_ATTENTION_SCORE_INL_H_
#else
#define TANDEM_OPTIMIZED_ATTENTION_SCORE_INL_H_
#endif

#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "attention_call-inl.h"
#include "attention_exp2-inl.h"
#include "buffer.hpp"

HWY_BEFORE_NAMESPACE();
namespace tandem::optimized::HWY_NAMESPACE::attn {

namespace hn = hwy::HWY_NAMESPACE;

/// Per-thread scratch of the score transform, sized for the largest tile:
/// the band of visible keys per row, the bias rows, and each row's ALiBi
/// slope and position.
struct ScoreScratch {
  Buffer lo, hi, gather, slope, position;
  std::vector<std::int64_t> bias_row;
  explicit ScoreScratch(std::int64_t rows)
      : lo(rows),
        hi(rows),
        gather(rows),
        slope(rows),
        position(rows),
        bias_row(static_cast<std::size_t>(rows), -1) {}
};

/// Turns the raw dot products St[jj][r] of keys j = j0 + jj (of the packed
/// queries, see Call::q_scale) into scores in log2 units, x = s·log2 e:
/// s = scale·<q, k>; s = c·tanh(s/c) (softcap c > 0; tanh(s/c) kept in
/// `tanh_out` when given, for the backward); s −= m·|i + Sk − Sq − j|
/// (ALiBi, slope m of the row's head and sequence, i and j local to the
/// sequence); s += bias; s = −inf where the mask hides key j from row r.
/// Row r's lanes are independent.
class ScoreTransform {
 public:
  ScoreTransform(const Call& c, const Tile& t, ScoreScratch& s)
      : c_(c),
        t_(t),
        lo_(s.lo.get()),
        hi_(s.hi.get()),
        gather_(s.gather.get()),
        slope_(s.slope.get()),
        position_(s.position.get()),
        bias_row_(s.bias_row.data()),
        terms_(c.softcap > 0.0f || c.slopes != nullptr || c.plan->mask == MaskKind::bias) {
    const AttentionPlan& p = *c.plan;
    if (c.slopes != nullptr) {
      // row r: slope m·log2 e of (sequence, head), in log2 units as the
      // scores, and position i + Sk − Sq (0 in padding rows)
      for (std::int64_t r = 0; r < t.rows_p; ++r) {
        const bool real = r < t.rows;
        slope_[r] = real ? c.slopes[p.slope_at(t.n, t.head(r))] * kLog2e : 0.0f;
        position_[r] = real ? static_cast<float>(t.query(r) + t.Sk - t.Sq) : 0.0f;
      }
    }
    if (p.mask == MaskKind::bias) {
      for (std::int64_t r = 0; r < t.rows_p; ++r) {
        bias_row_[r] = r < t.rows ? p.mask_row(t.b, t.head(r), t.query(r)) : -1;
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
        const std::int64_t a = t_.q_offset + t_.query(r);
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
  /// current block (see Skip in gemm-inl.h).
  void ZeroHiddenRows(float* rows, std::int64_t ws, std::int64_t nk) const {
    if (!hidden_keys_) return;
    for (std::int64_t jj = 0; jj < nk; ++jj) {
      if (key_hidden(jj)) std::fill(rows + jj * ws, rows + (jj + 1) * ws, 0.0f);
    }
  }
  bool any_hidden() const { return hidden_keys_; }

  /// True when the raw dot products of the current block are its scores: no
  /// softcap, no ALiBi, no bias, no row of the tile with a hidden key in it.
  bool plain() const { return !terms_ && !bounded_ && !hidden_keys_; }
  /// As plain(), for the rows r0 .. r0+N−1 alone.
  bool plain_at(std::int64_t r0) const {
    return !terms_ && !hidden_keys_ &&
           (!bounded_ || vec_bounded_[static_cast<std::size_t>(r0 / Lanes())] == 0);
  }
  /// True when the block needs the causal / sliding-window band alone (the
  /// diagonal blocks of a plain causal call).
  bool band_only() const { return !terms_ && bounded_ && !hidden_keys_; }
  /// The band of visible keys of rows r0 .. r0+N−1, relative to j0.
  HWY_INLINE void Band(std::int64_t r0, VF& lo, VF& hi) const {
    const DF d;
    lo = hn::LoadU(d, lo_ + r0);
    hi = hn::LoadU(d, hi_ + r0);
  }

  /// Score of key j0 + jj for rows r0 .. r0+N−1 from the raw dot products,
  /// in log2 units.
  HWY_INLINE VF operator()(VF raw, std::int64_t jj, std::int64_t r0, float* tanh_out) const {
    const DF d;
    const AttentionPlan& p = *c_.plan;
    VF s = raw;  // s·log2 e already, without a softcap (Call::q_scale)
    if (c_.softcap > 0.0f) {
      // s = c·tanh(scale·<q, k>/c), in log2 units
      const VF t = hn::Tanh(d, hn::Div(hn::Mul(raw, hn::Set(d, c_.scale)), hn::Set(d, c_.softcap)));
      if (tanh_out != nullptr) hn::StoreU(t, d, tanh_out + jj * t_.stride + r0);
      s = hn::Mul(hn::Set(d, c_.softcap * kLog2e), t);
    }
    if (c_.slopes != nullptr) {
      // s − m·|i + Sk − Sq − j| (slope_ holds m·log2 e)
      const VF j = hn::Set(d, static_cast<float>(j0_ + jj));
      const VF distance = hn::Abs(hn::Sub(hn::LoadU(d, position_ + r0), j));
      s = hn::NegMulAdd(hn::LoadU(d, slope_ + r0), distance, s);
    }
    if (p.mask == MaskKind::bias) {
      // s + bias, and −inf where the bias hides the key (whatever s is)
      const VF bias = Bias(jj, r0);
      s = hn::IfThenElse(hn::Eq(bias, hn::Set(d, -std::numeric_limits<float>::infinity())), bias,
                         hn::MulAdd(bias, hn::Set(d, kLog2e), s));
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
  /// the block, or a bias): the blocks that may need the careful path (see
  /// Skip in gemm-inl.h).
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

  /// Rewrites the probabilities P[jj][r] (row stride t.stride) of key j0 + jj,
  /// jj < nk, for the rows r0 .. r0+N−1 with −0.0 where the key is hidden:
  /// the careful path's mark of a product to leave out (see Skip).
  HWY_INLINE void MarkHidden(float* P, std::int64_t nk, std::int64_t r0) const {
    const DF d;
    for (std::int64_t jj = 0; jj < nk; ++jj) {
      float* at = P + jj * t_.stride + r0;
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
  float* slope_;
  float* position_;
  std::int64_t* bias_row_;
  bool terms_;  ///< a term beyond the scale: softcap, ALiBi or bias
  const float* keep_ = nullptr;
  std::int64_t j0_ = 0;
  bool bounded_ = false;
  std::vector<char> vec_bounded_;  ///< per vector of rows: some row sees part of the block
  bool hidden_keys_ = false;
};

}  // namespace tandem::optimized::HWY_NAMESPACE::attn
HWY_AFTER_NAMESPACE();

#endif  // toggle guard
