// SPDX-License-Identifier: Apache-2.0
// The optimized FlexAttention forward (SPEC §13.4): Highway SIMD (one
// dynamic dispatch per call) and OpenMP over (b, h, query tile) tasks.
//
// A call whose mods are a native form (a band mask_mod, no score_mod or a
// softcap: flex_native.hpp, SPEC §13.5) runs on the native attention
// kernels instead; everything below is the path of every other program.
//
// Must agree with tandem::reference::flex_forward (and flex_forward_stored;
// reference/include/tandem/reference/flex.hpp) to float rounding. The order
// of operations differs on purpose:
//  - each query tile (at most flex::kTileRows rows inside one query block)
//    visits only the kv blocks the block mask keeps for it, in ascending
//    order, chunk by chunk (flex::kChunkKeys keys); without a block mask it
//    visits every key, every block partial. A full block's keys are visible
//    without evaluating mask_mod; a partial block evaluates mask_mod on the
//    whole chunk. The reference asks flex_visible key by key;
//  - the mods are interpreted node by node over a whole chunk of scores in
//    float (flex_mod_tile-inl.h), where the reference evaluates them point
//    by point in its scalar type;
//  - <q_i, k_j> is a float multiply-add chain over d, and the softmax is
//    online (a running maximum and sum per row, the output rescaled where
//    the maximum moves: flex_softmax-inl.h) instead of one maximum, one sum
//    and one weighted sum over all keys in double.
// A tile's result depends only on the plan and the inputs, never on the
// thread count or the schedule: bitwise identical for any number of
// threads. bf16 and f16 calls read q, k, v and the captured real tensors
// widened to float (exact), round out to T once and keep lse in float.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "flex_forward.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <type_traits>
#include <vector>

#include "buffer.hpp"
#include "convert-inl.h"
#include "flex_call.hpp"
#include "flex_softmax-inl.h"
#include "flex_widen-inl.h"
#include "tandem/storage.hpp"

HWY_BEFORE_NAMESPACE();
namespace tandem::optimized::HWY_NAMESPACE {
namespace {

using flex::Call;
using flex::TileScratch;

/// out `[B,H,Sq,Dv]` and lse `[B,H,Sq]` (nullptr: not written) of call `c`:
/// one OpenMP task per (b, h, query tile).
void Forward(const Call& call, float* out, float* lse, int threads) {
  // k transposed once per call (one vector of keys per d, flex::Products)
  Call c = call;
  c.kt_stride = flex::TransposedStride(c);
  Buffer kt(c.B * c.Hkv * c.D * c.kt_stride, Buffer::Init::uninitialized);
  flex::TransposeAll(c.k, c.B * c.Hkv, c.Sk, c.D, c.kt_stride, kt.get(), threads);
  c.kt = kt.get();
  const std::int64_t tiles = c.tiles(), n_tasks = c.B * c.H * tiles;
  const int nt =
      static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(threads, n_tasks)));
  // Scratch for every thread, allocated before any output is written.
  std::vector<std::unique_ptr<TileScratch>> scratch;
  scratch.reserve(static_cast<std::size_t>(nt));
  for (int i = 0; i < nt; ++i) scratch.push_back(std::make_unique<TileScratch>(c));
    // Each task is computed by one thread alone: dynamic scheduling cannot
    // change the results.
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
  for (std::int64_t task = 0; task < n_tasks; ++task) {
    const std::int64_t bh = task / tiles, t = task % tiles, b = bh / c.H, h = bh % c.H;
    const auto [first, last] = c.tile_rows(t);
    if (first >= last) continue;
    TileScratch& s = *scratch[static_cast<std::size_t>(omp_get_thread_num())];
    flex::TileChunks(c, b, h, t, s);
    flex::ForwardTileRows(c, b, h, first, last - first, s);
    const std::int64_t row0 = bh * c.Sq + first;
    std::copy(s.o.begin(), s.o.begin() + (last - first) * c.Dv, out + row0 * c.Dv);
    if (lse != nullptr) std::copy(s.l.begin(), s.l.begin() + (last - first), lse + row0);
  }
}

/// The forward at storage type T (validated by the caller): T = float runs
/// on the views; bf16 and f16 on float copies, out rounded to T once.
template <class T>
void ForwardStored(const FlexPlan& plan, const FlexInputs<T>& in, std::span<T> out,
                   std::span<float> lse, int threads) {
  flex::WideInputs wide;
  const Call c = flex::MakeCall(plan, in, wide, threads);
  float* lse_out = lse.empty() ? nullptr : lse.data();
  if constexpr (std::is_same_v<T, float>) {
    Forward(c, out.data(), lse_out, threads);
  } else {
    Buffer o(plan.out_size(), Buffer::Init::uninitialized);  // every element is written
    Forward(c, o.get(), lse_out, threads);
    Narrow(o.get(), plan.out_size(), out.data(), threads);
  }
}

}  // namespace

/// The forward of SPEC §13.4 at float, bf16 and f16 (ForwardStored).
void FlexForwardTarget(const FlexPlan& plan, const FlexInputs<float>& in, std::span<float> out,
                       std::span<float> lse, int threads) {
  ForwardStored(plan, in, out, lse, threads);
}
void FlexForwardBf16Target(const FlexPlan& plan, const FlexInputs<bfloat16>& in,
                           std::span<bfloat16> out, std::span<float> lse, int threads) {
  ForwardStored(plan, in, out, lse, threads);
}
void FlexForwardF16Target(const FlexPlan& plan, const FlexInputs<float16>& in,
                          std::span<float16> out, std::span<float> lse, int threads) {
  ForwardStored(plan, in, out, lse, threads);
}

}  // namespace tandem::optimized::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "entry_points.hpp"
#include "flex_native.hpp"

namespace tandem::optimized {
HWY_EXPORT(FlexForwardTarget);
HWY_EXPORT(FlexForwardBf16Target);
HWY_EXPORT(FlexForwardF16Target);

namespace detail {

template <class T>
void flex_forward(const FlexPlan& plan, const FlexInputs<T>& in, std::span<T> out,
                  std::span<stat_t<T>> lse, const Options& options) {
  plan.check_inputs(in, out.size(), lse.size());
  if (flex::native_forward(plan, in, out, lse, options)) return;
  const int threads = threads_of(options);
  if constexpr (std::is_same_v<T, float>) {
    HWY_DYNAMIC_DISPATCH(FlexForwardTarget)(plan, in, out, lse, threads);
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    HWY_DYNAMIC_DISPATCH(FlexForwardBf16Target)(plan, in, out, lse, threads);
  } else {
    HWY_DYNAMIC_DISPATCH(FlexForwardF16Target)(plan, in, out, lse, threads);
  }
}

template void flex_forward(const FlexPlan&, const FlexInputs<float>&, std::span<float>,
                           std::span<float>, const Options&);
template void flex_forward(const FlexPlan&, const FlexInputs<bfloat16>&, std::span<bfloat16>,
                           std::span<float>, const Options&);
template void flex_forward(const FlexPlan&, const FlexInputs<float16>&, std::span<float16>,
                           std::span<float>, const Options&);

}  // namespace detail
}  // namespace tandem::optimized
#endif  // HWY_ONCE
