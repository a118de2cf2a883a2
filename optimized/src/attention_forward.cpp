// SPDX-License-Identifier: Apache-2.0
// The optimized attention forward: FlashAttention-2 on the CPU, Highway SIMD
// (dynamic dispatch) and OpenMP over (sequence, kv head, query block) tiles.
//
// Must agree with tandem::reference::attention_forward
// (reference/include/tandem/reference/attention.hpp) to float rounding. The
// order of operations differs on purpose:
//  - online softmax: a reference max m and the row sum l are updated key
//    block by key block, and the running output is rescaled by
//    2^(m_old − m_new) where m moves (only by more than
//    OnlineSoftmax::kRescaleAbove), instead of one max, one sum and one
//    weighted sum over all keys; no [Sq, Sk] score matrix is ever formed
//    (memory O(tile) per thread);
//  - tiling: <q_i, k_j> and Σ_j p_ij v_j are float fused multiply-add chains
//    in the micro-kernel's order (d, then j), where the reference sums in
//    double; the softmax runs in base 2 (the scale and log2 e folded into
//    the packed queries), 2^x by a polynomial on 2^f (attn::SoftmaxExp2,
//    ~2e-7 relative), tanh and log2 are Highway's float approximations
//    (≤ 4 ulp);
//  - the query heads of a GQA group share one pass over their K/V rows, and
//    key blocks that causal or sliding-window masks hide are never visited;
//  - decode steps with long caches split the keys into chunks (flash-decoding,
//    attn::ForwardSplitKeys, attention_split_keys-inl.h) and merge the
//    chunks' partial softmax sums;
//  - a sink joins a row's softmax at the finish, as one more partial sum
//    (attn::MergeSink, from attn::FinishRows and MergeRow), where the
//    reference starts its max and sum from it.
// Sequences (batch entries, packed sequences, paged cache rows) are found
// by AttentionPlan::sequence, as in the reference, and each has its own
// tiles (attn::Call).
// The result of every tile depends only on the plan, never on the thread
// count or the schedule: bitwise identical for any number of threads.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention_forward.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "attention_forward_tile-inl.h"
#include "attention_split_keys-inl.h"

HWY_BEFORE_NAMESPACE();
namespace tandem::optimized::HWY_NAMESPACE {
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using attn::Call;
using attn::DecodeTile;
using attn::ForwardScratch;
using attn::OutputRows;
using attn::Tile;

/// out = O / l for the rows of a finished tile, in the layout of q, and lse
/// when lse_out is given (inv = 1/l and lse_rows per row, FinishRows).
void WriteRows(const Call& c, const Tile& t, const OutputRows& o, const float* inv,
               const float* lse_rows, float* out, float* lse_out) {
  // O <- diag(1/l)·O
  attn::StoreRows(o, t.rows, c.plan->Dv, inv, [&](std::int64_t r) { return out + t.o_at(c, r); });
  for (std::int64_t r = 0; lse_out != nullptr && r < t.rows; ++r) {
    lse_out[t.lse_at(c, r)] = lse_rows[r];
  }
}

/// Per-thread scratch of the tiled forward: the tile's, and 1/l and lse of
/// its rows.
struct TileScratch {
  ForwardScratch tile;
  Buffer inv, lse_rows;
  explicit TileScratch(const Call& c)
      : tile(c, !c.decode), inv(c.max_rows_p), lse_rows(c.max_rows_p) {}
};

/// The forward of one (sequence, kv head, query block) tile, by the call's
/// algorithm, written to out (and lse_out when given).
void ForwardTile(const Call& c, const Tile& t, TileScratch& scratch, float* out, float* lse_out) {
  ForwardScratch& s = scratch.tile;
  OutputRows o;
  if (c.decode) {
    attn::PackQueriesNatural(c, t, s.Qn.get());
    DecodeTile tile(c, t, s, true, {attn::kPrefetchKeys, t.j_end});
    tile.Run(t.j_begin, t.j_end);
    o = tile.output();
  } else {
    attn::PackQueriesTransposed(c, t, s.Qt.get());
    attn::WideTile tile(c, t, s, true);
    tile.Run(t.j_begin, t.j_end);
    o = tile.output();
  }
  float* lse_rows = lse_out != nullptr ? scratch.lse_rows.get() : nullptr;
  attn::FinishRows(c, t, s.m.get(), s.l.get(), scratch.inv.get(), lse_rows);
  WriteRows(c, t, o, scratch.inv.get(), lse_rows, out, lse_out);
}

/// The tiled forward: one OpenMP task per (sequence, kv head, query block)
/// tile.
void ForwardTiles(const Call& c, float* out, float* lse_out, int threads) {
  const AttentionPlan& plan = *c.plan;
  const std::int64_t n_tiles = plan.Hkv * c.qblocks();
  const int nt =
      static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(threads, n_tiles)));
  // Scratch for every thread, allocated before any output is written (an
  // allocation failure is an exception here, not inside the parallel region).
  std::vector<std::unique_ptr<TileScratch>> scratch;
  scratch.reserve(static_cast<std::size_t>(nt));
  for (int i = 0; i < nt; ++i) scratch.push_back(std::make_unique<TileScratch>(c));
  // Tiles are independent and each is computed by one thread alone, so
  // dynamic scheduling (which balances causal tiles) cannot change results.
  // Under a causal mask the last query blocks see the most keys: they are
  // handed out first, so that the small ones fill in at the end.
  const bool last_first = plan.mask == MaskKind::causal;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
  for (std::int64_t task = 0; task < n_tiles; ++task) {
    // sequence n owns the tasks [Hkv·first_qblock[n], Hkv·first_qblock[n+1])
    const std::int64_t n = attn::SequenceOf(c.first_qblock, task / plan.Hkv);
    const std::int64_t nqb = c.qblocks(n), local = task - plan.Hkv * c.first_qblock[n];
    const std::int64_t qb = last_first ? nqb - 1 - local % nqb : local % nqb;
    const std::int64_t g = local / nqb;
    TileScratch& thread_scratch = *scratch[static_cast<std::size_t>(omp_get_thread_num())];
    ForwardTile(c, Tile(c, n, g, qb), thread_scratch, out, lse_out);
  }
}

}  // namespace

/// out (and lse when non-empty) for every (b, h, i): one OpenMP task per
/// (sequence, kv head, query block) tile, or per (sequence, key chunk) for
/// decode steps with long caches (attn::ForwardSplitKeys).
///
/// A tile is the G query heads of one kv head times block_q queries of one
/// sequence (attn::Tile), run over its visible key blocks by the wide or the
/// decode algorithm (attention_forward_tile-inl.h). Agrees with
/// reference::attention_forward (and _lse) to float rounding; the order
/// differs because the softmax is online (a running max and sum per key
/// block, rescaling the output only where the max moves), the products are
/// float multiply-add chains in the micro-kernel's order, sinks join at the
/// finish and split-key chunks are merged in chunk order (see the top of
/// this file).
void AttentionForwardTarget(const AttentionPlan& plan, const AttentionInputs<float>& in,
                            std::span<float> out, std::span<float> lse, const Geometry& geometry,
                            int threads) {
  const Call c(plan, in, geometry);
  float* lse_out = lse.empty() ? nullptr : lse.data();
  if (const std::int64_t chunk = attn::SplitKeysChunk(c); chunk > 0) {
    attn::ForwardSplitKeys(c, chunk, out.data(), lse_out, threads);
  } else {
    ForwardTiles(c, out.data(), lse_out, threads);
  }
}

}  // namespace tandem::optimized::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "entry_points.hpp"

namespace tandem::optimized {
HWY_EXPORT(AttentionForwardTarget);

namespace detail {

void attention_forward(const AttentionPlan& plan, const AttentionInputs<float>& in,
                       std::span<float> out, const Options& options) {
  check_inputs(plan, in);
  require_size(out.size(), plan.o.extent, "out");
  HWY_DYNAMIC_DISPATCH(AttentionForwardTarget)
  (plan, in, out, {}, options.geometry, threads_of(options));
}

void attention_forward_lse(const AttentionPlan& plan, const AttentionInputs<float>& in,
                           std::span<float> out, std::span<float> lse, const Options& options) {
  check_inputs(plan, in);
  require_size(out.size(), plan.o.extent, "out");
  require_size(lse.size(), plan.lse_size(), "lse");
  HWY_DYNAMIC_DISPATCH(AttentionForwardTarget)
  (plan, in, out, lse, options.geometry, threads_of(options));
}

}  // namespace detail
}  // namespace tandem::optimized
#endif  // HWY_ONCE
