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
// With Geometry::invariant (SPEC §12) a row's bits depend on nothing but its
// own inputs: key blocks at multiples of 64 from the sequence's key 0, 1024-
// key chunks merged in order (attention_chunk_merge-inl.h), decode tiles'
// scores formed as the wide tiles' are, split-key chunks at those chunks.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention_forward.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "attention_forward_bf16_tile-inl.h"
#include "attention_forward_tile-inl.h"
#include "attention_split_keys-inl.h"
#include "buffer.hpp"
#include "convert-inl.h"
#include "tandem/storage.hpp"

HWY_BEFORE_NAMESPACE();
namespace tandem::optimized::HWY_NAMESPACE {
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using attn::Call;
using attn::DecodeTile;
using attn::ForwardScratch;
using attn::OutputRows;
using attn::Tile;

/// Per-thread scratch of the tiled forward: the tile's (and the bf16
/// tile's), and 1/l and lse of its rows.
struct TileScratch {
  ForwardScratch tile;
  attn::Bf16Scratch bf16;
  Buffer inv, lse_rows;
  explicit TileScratch(const Call& c)
      : tile(c, !c.decode), bf16(c), inv(c.max_rows_p), lse_rows(c.max_rows_p) {}
};

/// The forward of one (sequence, kv head, query block) tile, by the call's
/// algorithm, written to out (and lse_out when given).
void ForwardTile(const Call& c, const Tile& t, TileScratch& scratch, float* out, float* lse_out) {
  ForwardScratch& s = scratch.tile;
  OutputRows o;
  const auto run = [&](auto& tile) {
    tile.Run(t.j_begin, t.j_end);
    tile.Close();
    o = tile.output();
  };
  if (c.decode) {
    attn::PackQueriesNatural(c, t, s.Qn.get());
    if (c.invariant) attn::PackQueriesTransposed(c, t, s.Qt.get());
    DecodeTile tile(c, t, s, true, {attn::kPrefetchKeys, t.j_end});
    run(tile);
  } else {
    attn::PackQueriesTransposed(c, t, s.Qt.get());
    if (attn::UseBf16Tile(c)) {
      attn::Bf16Tile tile(c, t, s, scratch.bf16);
      run(tile);
    } else {
      attn::WideTile tile(c, t, s, true);
      run(tile);
    }
  }
  float* lse_rows = lse_out != nullptr ? scratch.lse_rows.get() : nullptr;
  attn::FinishRows(c, t, s.m.get(), s.l.get(), scratch.inv.get(), lse_rows);
  attn::WriteRows(c, t, o, scratch.inv.get(), lse_rows, out, lse_out);
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

/// The forward of a call whose rows the Call finds: split-key or tiled.
void Forward(const Call& c, float* out, float* lse_out, int threads) {
  if (const std::int64_t chunk = attn::SplitKeysChunk(c); chunk > 0) {
    attn::ForwardSplitKeys(c, chunk, out, lse_out, threads);
  } else {
    ForwardTiles(c, out, lse_out, threads);
  }
}

/// The forward of a bf16 or f16 call (SPEC §10.2, profiles `pytorch` and
/// `exact`) on its inputs widened to float32 (`wide`: q, k, v and the sinks
/// of the call, exact): the float tiles run on them with the weights
/// rounded to T before P·V where the profile says (Call::weights,
/// OnlineSoftmax), the output accumulated in float and rounded to T once at
/// the store; lse stays float. A bf16 call's wide tiles multiply as bf16
/// where the CPU has AVX512-BF16 and the path is enabled
/// (Call::bf16_operands, Bf16Tile in attention_forward_bf16_tile-inl.h).
template <class T>
void ForwardWide(const AttentionPlan& plan, const AttentionInputs<float>& wide, std::span<T> out,
                 std::span<float> lse, const Geometry& geometry, int threads) {
  Buffer wide_out(plan.o.extent);  // every element is written; zero keeps it defined regardless
  Call c(plan, wide, geometry);
  c.bf16_operands = std::is_same_v<T, bfloat16>;  // the wide tiles may take Bf16Tile
  if (plan.rounding.operands) {
    c.weights =
        std::is_same_v<T, bfloat16> ? attn::WeightRounding::bf16 : attn::WeightRounding::f16;
  }
  Forward(c, wide_out.get(), lse.empty() ? nullptr : lse.data(), threads);
  Narrow(wide_out.get(), plan.o.extent, out.data(), threads);
}

/// The forward of a bf16 or f16 call: q, k, v and the sinks widened to
/// float scratch (exact, SPEC §10.1), then ForwardWide.
///
/// Why widen first: the conversion is O(B·S·H·D) against the tiles'
/// O(B·Sq·Sk·H·D), and the float micro-kernels then run unchanged on every
/// target (a key block is packed anyway; the bf16 tile packs its pairs from
/// the widened values, which convert back exactly). Only a decode step
/// against a long cache reads each K/V element once, where widening the
/// whole cache first costs as much as the call: detail::stored_decode is
/// where such calls leave.
template <class T>
void ForwardStored(const AttentionPlan& plan, const AttentionInputs<T>& in, std::span<T> out,
                   std::span<float> lse, const Geometry& geometry, int threads) {
  Buffer q(plan.q.extent, Buffer::Init::uninitialized);
  Buffer k(plan.k.extent, Buffer::Init::uninitialized);
  Buffer v(plan.v.extent, Buffer::Init::uninitialized);
  Buffer sinks(static_cast<std::int64_t>(in.sinks.size()), Buffer::Init::uninitialized);
  Widen(in.q.data(), plan.q.extent, q.get(), threads);
  Widen(in.k.data(), plan.k.extent, k.get(), threads);
  Widen(in.v.data(), plan.v.extent, v.get(), threads);
  for (std::size_t h = 0; h < in.sinks.size(); ++h) {
    sinks.get()[h] = static_cast<float>(static_cast<double>(in.sinks[h]));
  }
  const AttentionInputs<float> wide = retyped<float>(
      in, {q.get(), static_cast<std::size_t>(plan.q.extent)},
      {k.get(), static_cast<std::size_t>(plan.k.extent)},
      {v.get(), static_cast<std::size_t>(plan.v.extent)}, {sinks.get(), in.sinks.size()});
  ForwardWide(plan, wide, out, lse, geometry, threads);
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
  Forward(c, out.data(), lse.empty() ? nullptr : lse.data(), threads);
}

/// The forward of bf16 and f16 calls (ForwardStored): out rounded to T,
/// lse in float.
void AttentionForwardBf16Target(const AttentionPlan& plan, const AttentionInputs<bfloat16>& in,
                                std::span<bfloat16> out, std::span<float> lse,
                                const Geometry& geometry, int threads) {
  ForwardStored(plan, in, out, lse, geometry, threads);
}
void AttentionForwardF16Target(const AttentionPlan& plan, const AttentionInputs<float16>& in,
                               std::span<float16> out, std::span<float> lse,
                               const Geometry& geometry, int threads) {
  ForwardStored(plan, in, out, lse, geometry, threads);
}
/// The same on inputs the caller has widened already (ForwardWide).
void AttentionForwardWideBf16Target(const AttentionPlan& plan, const AttentionInputs<float>& wide,
                                    std::span<bfloat16> out, std::span<float> lse,
                                    const Geometry& geometry, int threads) {
  ForwardWide(plan, wide, out, lse, geometry, threads);
}
void AttentionForwardWideF16Target(const AttentionPlan& plan, const AttentionInputs<float>& wide,
                                   std::span<float16> out, std::span<float> lse,
                                   const Geometry& geometry, int threads) {
  ForwardWide(plan, wide, out, lse, geometry, threads);
}

}  // namespace tandem::optimized::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "entry_points.hpp"

namespace tandem::optimized {
HWY_EXPORT(AttentionForwardTarget);
HWY_EXPORT(AttentionForwardBf16Target);
HWY_EXPORT(AttentionForwardF16Target);
HWY_EXPORT(AttentionForwardWideBf16Target);
HWY_EXPORT(AttentionForwardWideF16Target);

namespace detail {
namespace {

/// The one place where a decode-shaped call of storage type T (a few query
/// rows against a long or paged cache) leaves for the kernel that reads K
/// and V in T where they lie (attention_decode_stored.cpp), instead of
/// ForwardStored widening the whole cache first. Called after validation;
/// returns whether it computed the call (false: not decode-shaped, nothing
/// written). An invariant call stays (SPEC §12): that kernel's blocks and
/// sums are its own, and its decode steps would not have the bits of the
/// prefill's rows.
template <class T>
bool stored_decode(const AttentionPlan& plan, const AttentionInputs<T>& in, std::span<T> out,
                   std::span<float> lse, const Options& options) {
  if (options.geometry.invariant) return false;
  return detail::attention_decode_stored<T>(plan, in, out, lse, options);
}

/// The low-precision forward of storage type T, validated first.
template <class T>
void forward_stored(const AttentionPlan& plan, const AttentionInputs<T>& in, std::span<T> out,
                    std::span<float> lse, bool with_lse, const Options& options) {
  check_inputs(plan, in);
  require_rounding(plan);
  require_size(out.size(), plan.o.extent, "out");
  if (with_lse) require_size(lse.size(), plan.lse_size(), "lse");
  if (stored_decode(plan, in, out, lse, options)) return;
  const int threads = threads_of(options);
  if constexpr (std::is_same_v<T, bfloat16>) {
    HWY_DYNAMIC_DISPATCH(AttentionForwardBf16Target)(plan, in, out, lse, options.geometry, threads);
  } else {
    HWY_DYNAMIC_DISPATCH(AttentionForwardF16Target)(plan, in, out, lse, options.geometry, threads);
  }
}

}  // namespace

template <class T>
void attention_forward_lse_widened(const AttentionPlan& plan, const AttentionInputs<T>& in,
                                   const AttentionInputs<float>& wide, std::span<T> out,
                                   std::span<float> lse, const Options& options) {
  if (stored_decode(plan, in, out, lse, options)) return;
  const int threads = threads_of(options);
  if constexpr (std::is_same_v<T, bfloat16>) {
    HWY_DYNAMIC_DISPATCH(AttentionForwardWideBf16Target)
    (plan, wide, out, lse, options.geometry, threads);
  } else {
    HWY_DYNAMIC_DISPATCH(AttentionForwardWideF16Target)
    (plan, wide, out, lse, options.geometry, threads);
  }
}

template <class T>
void attention_forward_stored(const AttentionPlan& plan, const AttentionInputs<T>& in,
                              std::span<T> out, const Options& options) {
  forward_stored(plan, in, out, {}, false, options);
}

template <class T>
void attention_forward_lse_stored(const AttentionPlan& plan, const AttentionInputs<T>& in,
                                  std::span<T> out, std::span<float> lse, const Options& options) {
  forward_stored(plan, in, out, lse, true, options);
}

template void attention_forward_stored(const AttentionPlan&, const AttentionInputs<bfloat16>&,
                                       std::span<bfloat16>, const Options&);
template void attention_forward_stored(const AttentionPlan&, const AttentionInputs<float16>&,
                                       std::span<float16>, const Options&);
template void attention_forward_lse_stored(const AttentionPlan&, const AttentionInputs<bfloat16>&,
                                           std::span<bfloat16>, std::span<float>, const Options&);
template void attention_forward_lse_stored(const AttentionPlan&, const AttentionInputs<float16>&,
                                           std::span<float16>, std::span<float>, const Options&);
template void attention_forward_lse_widened(const AttentionPlan&, const AttentionInputs<bfloat16>&,
                                            const AttentionInputs<float>&, std::span<bfloat16>,
                                            std::span<float>, const Options&);
template void attention_forward_lse_widened(const AttentionPlan&, const AttentionInputs<float16>&,
                                            const AttentionInputs<float>&, std::span<float16>,
                                            std::span<float>, const Options&);

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
