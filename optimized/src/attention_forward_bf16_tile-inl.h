// SPDX-License-Identifier: Apache-2.0
// Per-target bf16 forward tile (SPEC §10.2, §10.5): WideTile's algorithm
// with its dot products on the CPU's AVX512-BF16 instruction (bf16_dot.hpp)
// instead of float multiply-adds, for the wide tiles of a bf16 call on AVX3
// targets whose CPU has it (UseBf16Tile). Everything but the two products
// is the wide tile's own code: the key blocks (ForEachKeyBlock), the packed
// K and V rows (PackedRows), the score transform (ScoreTransform: softcap,
// ALiBi, bias, masks), the online softmax (OnlineSoftmax, with P rounded to
// bf16 under `pytorch`), the rescale (RescaleOutput) and the finish
// (FinishRows, by the caller).
//
//  - S = Q·Kᵀ: q and k as bf16 (the values the call stored), pairs along d
//    (Qb, Kb), the sum over pairs in d order, then times Call::q_scale.
//  - O += P·V under `pytorch`: P is bf16 already (rounded by the softmax),
//    V as bf16 pairs along the keys (Vb), P as bf16 pairs along the keys
//    (Pb); under `exact` P stays float and P·V is the float product.
//
// Agreement with reference::attention_forward: each product of two bf16
// values is exact in float, so a chain of vdpbf16ps is a float chain of
// fused multiply-adds in another order (odd element of a pair first) and
// keeps the float32 bound of SPEC §10.5. The instruction flushes denormal
// inputs and results: a block whose q, k or v would lose more than float
// rounding to that takes the float products instead (Denormal, Tiny):
//  - a q or k element below 2^−126 (denormal) → the block's S in float;
//  - a nonzero v element below 2^−64 → the block's P·V in float; else a
//    flushed result (|p·v| or a partial sum below 2^−126) changes an
//    output by at most 2^−126 per key, below 2^−62·max|v| per key.
// Included once per Highway target (the toggle guard below), after
// <hwy/highway.h> and attention_forward_tile-inl.h.

#if defined(TANDEM_OPTIMIZED_ATTENTION_FORWARD_BF16_TILE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TANDEM_OPTIMIZED_ATTENTION_FORWARD_BF16_TILE_INL_H_
#undef TANDEM_OPTIMIZED_ATTENTION_FORWARD_BF16_TILE_INL_H_
#else
#define TANDEM_OPTIMIZED_ATTENTION_FORWARD_BF16_TILE_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "attention_forward_tile-inl.h"
#include "bf16_dot.hpp"

HWY_BEFORE_NAMESPACE();
namespace tandem::optimized::HWY_NAMESPACE::attn {

namespace hn = hwy::HWY_NAMESPACE;

/// Whether a call's wide tiles take Bf16Tile: a bf16 call, on an AVX3 (or
/// better) x86 target, on a CPU with AVX512-BF16, the path not switched off
/// (tandem::optimized::enable_bf16_dot), the call not invariant (SPEC §12:
/// its decode steps take the float decode tile, whose products are not the
/// instruction's). One vector of this target is then one vector of the
/// instruction (bf16dot::kLanes rows).
inline bool UseBf16Tile(const Call& c) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  static_assert(HWY_LANES(float) >= bf16dot::kLanes);
  return c.bf16_operands && !c.decode && !c.invariant && Lanes() == bf16dot::kLanes &&
         bf16dot::Enabled();
#else
  (void)c;
  return false;
#endif
}

/// The word of the pair (x0, x1) of floats that hold bf16 values (exact:
/// their low halves are zero): x0's bf16 bits low, x1's high.
HWY_INLINE std::uint32_t PairWord(float x0, float x1) {
  std::uint32_t u0, u1;
  std::memcpy(&u0, &x0, sizeof u0);
  std::memcpy(&u1, &x1, sizeof u1);
  return u0 >> 16 | (u1 & 0xFFFF0000u);
}
/// PairWord lane by lane.
HWY_INLINE hn::Vec<hn::RebindToUnsigned<DF>> PairWords(VF x0, VF x1) {
  const hn::RebindToUnsigned<DF> du;
  return hn::Or(hn::ShiftRight<16>(hn::BitCast(du, x0)),
                hn::And(hn::BitCast(du, x1), hn::Set(du, 0xFFFF0000u)));
}
/// Whether x is a denormal (vdpbf16ps flushes it).
HWY_INLINE bool Denormal(float x) {
  return x != 0.0f && std::fabs(x) < 0x1p-126f;
}
/// Lanes of x that are nonzero and below 2^−64 in magnitude (see the top).
HWY_INLINE hn::Mask<DF> Tiny(VF x) {
  const DF d;
  return hn::And(hn::Ne(x, hn::Zero(d)), hn::Lt(hn::Abs(x), hn::Set(d, 0x1p-64f)));
}

/// Per-thread scratch of Bf16Tile, sized for the largest tile of the call
/// (empty unless the call takes it), words of bf16 pairs (bf16_dot.hpp): Qb
/// [pairs of d][stride], Kb [key_block][pairs of d], Vb [pairs of keys][Dv],
/// Pb [pairs of keys][strip].
struct Bf16Scratch {
  std::vector<std::uint32_t> Qb, Kb, Vb, Pb;
  explicit Bf16Scratch(const Call& c) {
    if (!UseBf16Tile(c)) return;
    const AttentionPlan& p = *c.plan;
    const auto n = [](std::int64_t x) { return static_cast<std::size_t>(x); };
    const std::int64_t d_pairs = (p.D + 1) / 2, k_pairs = (c.key_block + 1) / 2;
    Qb.resize(n(d_pairs * c.max_stride));
    Kb.resize(n(c.key_block * d_pairs));
    Vb.resize(n(k_pairs * p.Dv));
    Pb.resize(n(k_pairs * StripWidth()));
  }
};

/// The FlashAttention-2 forward of one wide tile of a bf16 call, as WideTile
/// (with P·V) but for the products (see the top of this file): with the
/// queries in s.Qt (the float path's, PackQueriesTransposed), over the key
/// blocks the tile may see, St = factor·(K·Qt) by bf16 pairs, the online
/// softmax step, then Ot = diag(alpha)·Ot + V^T·P (bf16 pairs where P is
/// rounded to bf16). After Run, s.m, s.l and s.Ot are as WideTile's.
class Bf16Tile : public KeyBlockTile<Bf16Tile> {
 public:
  Bf16Tile(const Call& c, const Tile& t, ForwardScratch& s, Bf16Scratch& b)
      : KeyBlockTile(c, t, s, true), b_(b), d_pairs_((c.plan->D + 1) / 2) {
    q_denormal_ = PackQueries();
  }

 private:
  friend class KeyBlockTile<Bf16Tile>;
  void Block(const KeyBlock& kb) {
    const AttentionPlan& p = *c_.plan;
    const std::int64_t R = t_.stride, ks = s_.Kp->stride();
    float* St = s_.St.get();
    score_.SetBlock(kb.j0, kb.nk);
    float* Kp = s_.Kp->Get(keys_, head_, kb.j0, kb.nk);
    score_.ZeroHiddenRows(Kp, ks, kb.nk);
    const bool bf16_scores = !q_denormal_ && !PackKeys(Kp, ks, kb.nk);
    float* Vp = s_.Vp->Get(values_, head_, kb.j0, kb.nk);
    score_.ZeroHiddenRows(Vp, s_.Vp->stride(), kb.nk);
    const ValueBlock v{KeyRows{Vp, s_.Vp->stride(), values_.width}, 0};
    const bool careful = CarefulPV(score_, v, p.Dv, kb.nk);
    // P·V by bf16 pairs only where P is bf16 (`pytorch`) and every product
    // is formed (the careful path leaves some out, in float)
    const bool bf16_values =
        c_.weights == WeightRounding::bf16 && !careful && !PackValues(Vp, kb.nk);
    const std::int64_t strip = StripWidth(), k_pairs = (kb.nk + 1) / 2;
    for (std::int64_t lo = kb.lo; lo < kb.hi; lo += strip) {
      const std::int64_t hi = std::min(kb.hi, lo + strip);
      // S <- Q K^T (transposed: St[jj][r] = <k_{j0+jj}, q_r>, in log2 units
      // by the factor the float path folds into Qt)
      if (bf16_scores) {
        bf16dot::Scores(b_.Kb.data(), kb.nk, d_pairs_, b_.Qb.data(), R, lo, hi, c_.q_scale, St, R);
      } else {
        Gemm(kb.nk, hi - lo, p.D, Kp, ks, 1, s_.Qt.get() + lo, R, St + lo, R, false);
      }
      const bool rescale = softmax_.Step(St, kb.nk, lo, hi, score_, careful);
      RescaleOutput(softmax_, rescale, p.Dv, lo, hi, s_.Ot.get(), R);
      if (bf16_values) {
        PackWeights(kb.nk, lo, hi);
        bf16dot::Values(b_.Pb.data(), strip, k_pairs, b_.Vb.data(), p.Dv, hi - lo, s_.Ot.get() + lo,
                        R);
      } else {
        AddValuesFloat(p.Dv, kb.nk, lo, hi, v, careful, St, s_.Ot.get(), R);
      }
    }
  }
  /// Qb[p][r] = (q_r[2p], q_r[2p+1]) as bf16 (zero beyond D and in the
  /// padding rows); returns whether any element is a denormal.
  bool PackQueries() {
    const std::int64_t D = c_.plan->D, R = t_.stride;
    std::uint32_t* Qb = b_.Qb.data();
    bool denormal = false;
    for (std::int64_t r = 0; r < t_.rows_p; ++r) {
      const float* q = r < t_.rows ? t_.q_row(c_, r) : nullptr;
      for (std::int64_t p = 0; p < d_pairs_; ++p) {
        const float even = q != nullptr ? q[2 * p] : 0.0f;
        const float odd = q != nullptr && 2 * p + 1 < D ? q[2 * p + 1] : 0.0f;
        denormal = denormal || Denormal(even) || Denormal(odd);
        Qb[p * R + r] = PairWord(even, odd);
      }
    }
    return denormal;
  }
  /// Kb[jj][p] = (k_jj[2p], k_jj[2p+1]) from the packed rows Kp (row stride
  /// ks; zero beyond D); returns whether any element is a denormal.
  bool PackKeys(const float* Kp, std::int64_t ks, std::int64_t nk) {
    const std::int64_t D = c_.plan->D;
    std::uint32_t* Kb = b_.Kb.data();
    bool denormal = false;
    for (std::int64_t jj = 0; jj < nk; ++jj) {
      const float* k = Kp + jj * ks;
      for (std::int64_t p = 0; p < d_pairs_; ++p) {
        const float even = k[2 * p], odd = 2 * p + 1 < D ? k[2 * p + 1] : 0.0f;
        denormal = denormal || Denormal(even) || Denormal(odd);
        Kb[jj * d_pairs_ + p] = PairWord(even, odd);
      }
    }
    return denormal;
  }
  /// Vb[q][dv] = (v_2q[dv], v_2q+1[dv]) from the packed rows Vp (zero for
  /// the key after an odd last one); returns whether any element is Tiny.
  bool PackValues(const float* Vp, std::int64_t nk) {
    const DF d;
    const hn::RebindToUnsigned<DF> du;
    const std::int64_t Dv = c_.plan->Dv, vs = s_.Vp->stride(), N = Lanes();
    std::uint32_t* Vb = b_.Vb.data();
    const std::vector<float> zero(static_cast<std::size_t>(Dv), 0.0f);
    auto tiny = hn::FirstN(d, 0);
    bool tiny_tail = false;
    for (std::int64_t q = 0; q < (nk + 1) / 2; ++q) {
      const float* even = Vp + 2 * q * vs;
      const float* odd = 2 * q + 1 < nk ? even + vs : zero.data();
      std::int64_t dv = 0;
      for (; dv + N <= Dv; dv += N) {
        const VF e = hn::LoadU(d, even + dv), o = hn::LoadU(d, odd + dv);
        tiny = hn::Or(tiny, hn::Or(Tiny(e), Tiny(o)));
        hn::StoreU(PairWords(e, o), du, Vb + q * Dv + dv);
      }
      for (; dv < Dv; ++dv) {
        const VF e = hn::Set(d, even[dv]), o = hn::Set(d, odd[dv]);
        tiny_tail = tiny_tail || !hn::AllFalse(d, hn::Or(Tiny(e), Tiny(o)));
        Vb[q * Dv + dv] = PairWord(even[dv], odd[dv]);
      }
    }
    return tiny_tail || !hn::AllFalse(d, tiny);
  }
  /// Pb[q][r − lo] = (P[2q][r], P[2q+1][r]) as bf16 for the rows in [lo, hi)
  /// (P is bf16 already: OnlineSoftmax rounded it; zero for the key after an
  /// odd last one).
  void PackWeights(std::int64_t nk, std::int64_t lo, std::int64_t hi) {
    const DF d;
    const hn::RebindToUnsigned<DF> du;
    const std::int64_t R = t_.stride, ps = StripWidth();
    const float* St = s_.St.get();
    std::uint32_t* Pb = b_.Pb.data();
    for (std::int64_t q = 0; q < (nk + 1) / 2; ++q) {
      const float* even = St + 2 * q * R;
      const bool has_odd = 2 * q + 1 < nk;
      for (std::int64_t r0 = lo; r0 < hi; r0 += Lanes()) {
        const VF o = has_odd ? hn::LoadU(d, even + R + r0) : hn::Zero(d);
        hn::StoreU(PairWords(hn::LoadU(d, even + r0), o), du, Pb + q * ps + (r0 - lo));
      }
    }
  }

  Bf16Scratch& b_;
  std::int64_t d_pairs_;     ///< pairs of d: ⌈D/2⌉
  bool q_denormal_ = false;  ///< a query element is a bf16 denormal
};

}  // namespace tandem::optimized::HWY_NAMESPACE::attn
HWY_AFTER_NAMESPACE();

#endif  // toggle guard
