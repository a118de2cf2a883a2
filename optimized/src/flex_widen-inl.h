// SPDX-License-Identifier: Apache-2.0
// The storage boundary of FlexAttention (SPEC §13.4, as the reference's
// flex_forward_stored and flex_backward_stored): a call in bf16 or f16 has
// q, k, v and its captured real tensors read exactly into float32 copies
// (SPEC §10.1) before the float kernels run; a float call is viewed as
// given. The kernels' float results are rounded to T once, at the end
// (Narrow). Included once per Highway target (the toggle guard below),
// after <hwy/highway.h>.
#if defined(TANDEM_OPTIMIZED_FLEX_WIDEN_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TANDEM_OPTIMIZED_FLEX_WIDEN_INL_H_
#undef TANDEM_OPTIMIZED_FLEX_WIDEN_INL_H_
#else
#define TANDEM_OPTIMIZED_FLEX_WIDEN_INL_H_
#endif

#include <hwy/highway.h>

#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "buffer.hpp"
#include "convert-inl.h"
#include "flex_call.hpp"

HWY_BEFORE_NAMESPACE();
namespace tandem::optimized::HWY_NAMESPACE {
namespace flex {

using ::tandem::optimized::flex::Call;
using ::tandem::optimized::flex::kChunkKeys;
using ::tandem::optimized::flex::kTileRows;
using ::tandem::optimized::flex::KvBlock;

/// The float32 copies of a call's inputs in T (empty for T = float, whose
/// views are used as they are).
struct WideInputs {
  Buffer q, k, v;                                         ///< q, k, v widened
  std::vector<std::vector<float>> score_real, mask_real;  ///< captured real tensors widened
};

/// x read exactly into float (a vector owned by `keep`).
template <class T>
std::span<const float> WidenTensor(std::span<const T> x, std::vector<std::vector<float>>& keep) {
  std::vector<float>& w = keep.emplace_back(x.size());
  for (std::size_t e = 0; e < x.size(); ++e) w[e] = static_cast<float>(static_cast<double>(x[e]));
  return w;
}

/// The captures in float: the real tensors widened into `keep` (T != float).
template <class T>
ModCaptures<float> WidenCaptures(const ModCaptures<T>& c, std::vector<std::vector<float>>& keep) {
  ModCaptures<float> w{{}, c.integer};
  keep.reserve(c.real.size());
  for (const auto t : c.real) w.real.push_back(WidenTensor(t, keep));
  return w;
}

/// The Call of a validated call in T: its views for float, else float
/// copies in `wide` (widened on `threads` threads).
template <class T>
Call MakeCall(const FlexPlan& plan, const FlexInputs<T>& in, WideInputs& wide, int threads) {
  if constexpr (std::is_same_v<T, float>) {
    return Call(plan, in.q.data(), in.k.data(), in.v.data(), in.score_tensors, in.mask_tensors,
                in.block_mask);
  } else {
    wide.q.resize(plan.q_size(), Buffer::Init::uninitialized);
    wide.k.resize(plan.k_size(), Buffer::Init::uninitialized);
    wide.v.resize(plan.v_size(), Buffer::Init::uninitialized);
    Widen(in.q.data(), plan.q_size(), wide.q.get(), threads);
    Widen(in.k.data(), plan.k_size(), wide.k.get(), threads);
    Widen(in.v.data(), plan.v_size(), wide.v.get(), threads);
    return Call(plan, wide.q.get(), wide.k.get(), wide.v.get(),
                WidenCaptures(in.score_tensors, wide.score_real),
                WidenCaptures(in.mask_tensors, wide.mask_real), in.block_mask);
  }
}

}  // namespace flex
}  // namespace tandem::optimized::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // toggle guard
