// SPDX-License-Identifier: Apache-2.0
// Per-target exp of the optimized attention's softmax: 2^x by a polynomial,
// in log2 units (the scores carry log2 e, see Call::q_scale), shared by the
// forward's online softmax, the split-key merge and the backward's
// probabilities. Included once per Highway target (the toggle guard below),
// after <hwy/highway.h>.
#if defined(TANDEM_OPTIMIZED_ATTENTION_EXP2_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TANDEM_OPTIMIZED_ATTENTION_EXP2_INL_H_
#undef TANDEM_OPTIMIZED_ATTENTION_EXP2_INL_H_
#else
#define TANDEM_OPTIMIZED_ATTENTION_EXP2_INL_H_
#endif

#include <hwy/highway.h>

#include "simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace tandem::optimized::HWY_NAMESPACE::attn {

namespace hn = hwy::HWY_NAMESPACE;

/// log2 e and ln 2: the softmax runs in base 2 (scores x = s·log2 e, p = 2^x).
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2 = 0.69314718055994531f;

/// Where SoftmaxExp2 gives 0: below x = −64. A weight below 2^−64 changes no
/// sum it joins beyond float rounding: the row's largest weight is at least
/// 1 (x − m with m never above the row's max, OnlineSoftmax) or 1/Sk (the
/// backward's probabilities, x − lse). Products of such weights fall below
/// float's normal range, where every product they then feed (P·V; dS and
/// from it dQ, dK) takes the processor's slow path for subnormal operands:
/// ALiBi's steep heads make most weights of a long row that small.
inline constexpr float kSoftmaxFloor = -64.0f;

/// 2^x, lane by lane, for the softmax's arguments in log2 units (x <= 0 up
/// to rounding, or up to OnlineSoftmax::kRescaleAbove; −inf gives 0, NaN
/// stays NaN, x < kSoftmaxFloor gives 0): 2^x = 2^n·2^f with n = round(x),
/// |f| <= 1/2, and 2^f by a degree-5 polynomial with constant term 1, fitted
/// to the relative error on [−1/2, 1/2] (below 9.2e-8, 1.8e-7 with the float
/// rounding of its evaluation). The constant 1 makes 2^0 exactly 1: a row's
/// own maximum gets probability 1 before the division by l, so a row with
/// one visible key reproduces v and its dS is 0 exactly, as in the
/// reference. n is rounded by adding 1.5·2^23 + 127, which leaves n + 127 in
/// the low bits of the sum: shifted into the exponent field, they make 2^n.
/// About a third of the work of hn::Exp, which also handles large positive
/// x (not needed here).
HWY_INLINE VF SoftmaxExp2(DF d, VF x) {
  const hn::RebindToSigned<DF> di;
  const VF magic = hn::Set(d, 12582912.0f + 127.0f);
  const VF biased = hn::Add(x, magic);  // 1.5·2^23 + 127 + round(x)
  const VF f = hn::Sub(x, hn::Sub(biased, magic));
  VF p = hn::Set(d, 1.32647110e-3f);
  p = hn::MulAdd(p, f, hn::Set(d, 9.67151206e-3f));
  p = hn::MulAdd(p, f, hn::Set(d, 5.55073395e-2f));
  p = hn::MulAdd(p, f, hn::Set(d, 2.40222424e-1f));
  p = hn::MulAdd(p, f, hn::Set(d, 6.93147004e-1f));
  p = hn::MulAdd(p, f, hn::Set(d, 1.0f));
  const VF two_n = hn::BitCast(d, hn::ShiftLeft<23>(hn::BitCast(di, biased)));
  return hn::IfThenZeroElse(hn::Lt(x, hn::Set(d, kSoftmaxFloor)), hn::Mul(p, two_n));
}

}  // namespace tandem::optimized::HWY_NAMESPACE::attn
HWY_AFTER_NAMESPACE();

#endif  // toggle guard
