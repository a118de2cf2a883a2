// SPDX-License-Identifier: Apache-2.0
// The optimized attention forward: FlashAttention-2 on the CPU, Highway SIMD
// (dynamic dispatch) and OpenMP over (batch, kv head, query block) tiles.
//
// Must agree with tandem::reference::attention_forward
// (reference/include/tandem/reference/attention.hpp) to float rounding. The
// order of operations differs on purpose:
//  - online softmax: the row max m and the row sum l are updated key block by
//    key block and the running output is rescaled by exp(m_old − m_new),
//    instead of one max, one sum and one weighted sum over all keys; no
//    [Sq, Sk] score matrix is ever formed (memory O(tile) per thread);
//  - tiling: <q_i, k_j> and Σ_j p_ij v_j are float fused multiply-add chains
//    in the micro-kernel's order (d, then j), where the reference sums in
//    double; exp is a polynomial on 2^f (attn::SoftmaxExp, ~1e-7 relative),
//    tanh and log are Highway's float approximations (≤ 4 ulp);
//  - the query heads of a GQA group share one pass over their K/V rows, and
//    key blocks that causal or sliding-window masks hide are never visited.
// The result of every tile depends only on the plan, never on the thread
// count or the schedule: bitwise identical for any number of threads.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention_forward.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <omp.h>

#include <memory>
#include <vector>

#include "attention-inl.h"

HWY_BEFORE_NAMESPACE();
namespace tandem::optimized::HWY_NAMESPACE {

/// out (and lse when non-empty) for every (b, h, i): one OpenMP task per
/// (batch, kv head, query block) tile.
void AttentionForwardTarget(const AttentionPlan& plan, const AttentionInputs<float>& in,
                            std::span<float> out, std::span<float> lse, int threads) {
  const attn::Call c(plan, in);
  const std::int64_t n_tiles = plan.B * plan.Hkv * c.n_qblocks;
  const int nt =
      static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(threads, n_tiles)));
  float* o = out.data();
  float* lse_out = lse.empty() ? nullptr : lse.data();
  // Scratch for every thread, allocated before any output is written (an
  // allocation failure is an exception here, not inside the parallel region).
  struct Scratch {
    attn::ForwardScratch tile;
    attn::Buffer inv, lse_rows;
    explicit Scratch(const attn::Call& call)
        : tile(call), inv(call.max_rows_p), lse_rows(call.max_rows_p) {}
  };
  std::vector<std::unique_ptr<Scratch>> scratch;
  for (int i = 0; i < nt; ++i) scratch.push_back(std::make_unique<Scratch>(c));
#pragma omp parallel num_threads(nt)
  {
    Scratch& mine = *scratch[static_cast<std::size_t>(omp_get_thread_num())];
    attn::ForwardScratch& s = mine.tile;
    attn::Buffer& inv = mine.inv;
    attn::Buffer& lse_rows = mine.lse_rows;
    // Tiles are independent and each is computed by one thread alone, so
    // dynamic scheduling (which balances causal tiles) cannot change results.
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t task = 0; task < n_tiles; ++task) {
      const std::int64_t qb = task % c.n_qblocks;
      const std::int64_t g = task / c.n_qblocks % plan.Hkv;
      const std::int64_t b = task / c.n_qblocks / plan.Hkv;
      const attn::Tile t(c, b, g, qb);
      attn::PackQueriesTransposed(c, t, s.Qt.get());
      attn::ForwardTile(c, t, s, true);
      attn::FinishRows(t, s, inv.get(), lse_out != nullptr ? lse_rows.get() : nullptr);
      // O <- diag(1/l)·O, written back in the layout of q
      const float* Ot = s.Ot.get();
      for (std::int64_t r = 0; r < t.rows; ++r) {
        const std::int64_t i = t.query(r, c.G), h = t.head(r, c.G);
        float* dst = o + plan.o.at(b, i, h);
        const float w = inv.get()[r];
        for (std::int64_t dv = 0; dv < plan.Dv; ++dv) dst[dv] = Ot[dv * t.rows_p + r] * w;
        if (lse_out != nullptr) lse_out[(b * plan.H + h) * plan.Sq + i] = lse_rows.get()[r];
      }
    }
  }
}

}  // namespace tandem::optimized::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "attention.hpp"

namespace tandem::optimized {
HWY_EXPORT(AttentionForwardTarget);

namespace detail {

void attention_forward(const AttentionPlan& plan, const AttentionInputs<float>& in,
                       std::span<float> out, std::span<float> lse, int threads) {
  check_inputs(plan, in);
  require_size(out.size(), plan.o.extent, "out");
  if (!lse.empty()) {
    require_size(lse.size(), checked_mul(checked_mul(plan.B, plan.H, "lse"), plan.Sq, "lse"),
                 "lse");
  }
  if (threads <= 0) threads = omp_get_max_threads();
  HWY_DYNAMIC_DISPATCH(AttentionForwardTarget)(plan, in, out, lse, threads);
}

}  // namespace detail
}  // namespace tandem::optimized
#endif  // HWY_ONCE
