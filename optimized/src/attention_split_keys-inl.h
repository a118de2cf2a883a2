// SPDX-License-Identifier: Apache-2.0
// Per-target split-key (flash-decoding) forward of the optimized attention:
// decode steps with long caches run one OpenMP task per (sequence, key
// chunk) instead of one per (sequence, kv head, query block) tile, each task
// stepping through every kv head's decode tile a few keys at a time, and
// the chunks' partial softmax sums of a row are merged in chunk order
// (MergeRow, with the finish of a tile's rows, attention_softmax-inl.h).
// Each partial depends on the plan and the chunk only, and the merge order
// is fixed: bitwise identical for any number of threads. Included once per
// Highway target (the toggle guard below), after <hwy/highway.h>.
#if defined(TANDEM_OPTIMIZED_ATTENTION_SPLIT_KEYS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TANDEM_OPTIMIZED_ATTENTION_SPLIT_KEYS_INL_H_
#undef TANDEM_OPTIMIZED_ATTENTION_SPLIT_KEYS_INL_H_
#else
#define TANDEM_OPTIMIZED_ATTENTION_SPLIT_KEYS_INL_H_
#endif

#include <hwy/highway.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "attention_call-inl.h"
#include "attention_exp2-inl.h"
#include "attention_forward_tile-inl.h"
#include "attention_softmax-inl.h"
#include "attention_transpose-inl.h"
#include "buffer.hpp"

HWY_BEFORE_NAMESPACE();
namespace tandem::optimized::HWY_NAMESPACE::attn {

namespace hn = hwy::HWY_NAMESPACE;

/// Keys per chunk of the split-key (flash-decoding) forward, or 0 when the
/// call does not take it (see Geometry). Only calls of decode tiles (a
/// decode step: the few query rows of a group) with long caches do: there
/// one task per (sequence, kv head) would read a head-wide slice of every K
/// and V row (strided, and only as many tasks as those pairs), while one
/// task per (sequence, key chunk) reads whole rows one after the other.
/// Where a head's rows are contiguous (bhsd) the per-head tasks stream
/// already and only calls with few of them split. The chunk depends on the
/// shape, the sequences' lengths and the geometry alone, never on the thread
/// count; chunks of a paged cache start at block boundaries whenever the
/// chunk is a multiple of the block size (the default chunks are powers of
/// two). An invariant call's chunks are its kInvariantChunk keys (SPEC
/// §12), which its tiles merge alike.
inline std::int64_t SplitKeysChunk(const Call& c) {
  const AttentionPlan& p = *c.plan;
  const Geometry& geo = *c.geometry;
  if (!c.decode || geo.split_keys_min_chunks == 0) return 0;
  std::int64_t chunk = c.invariant ? kInvariantChunk : geo.split_keys_chunk;
  if (chunk == 0) {  // about 1 MiB of K and V rows, key_block to 1024 keys
    const std::int64_t bytes_per_key =
        static_cast<std::int64_t>(sizeof(float)) * p.Hkv * (p.D + p.Dv);
    chunk = c.key_block;
    while (chunk < 1024 && 2 * chunk * bytes_per_key <= (std::int64_t{1} << 20)) chunk *= 2;
  }
  if (c.max_Sk < geo.split_keys_min_chunks * chunk) return 0;
  // Where each head's rows are contiguous (bhsd, or a single kv head) the
  // per-head tasks already stream; split there only for want of tasks.
  const bool interleaved = p.k.seq != p.D || p.v.seq != p.Dv;
  return interleaved || c.sequences() * p.Hkv < geo.split_keys_contiguous_heads ? chunk : 0;
}

/// Where chunk boundaries fall in sequence n: its keys j with (shift + j) a
/// multiple of the chunk, shift = key_origin % chunk in an invariant call
/// (its chunks are counted from the sequence's whole start, SPEC §12.2), else 0.
inline std::int64_t ChunkShift(const Call& c, std::int64_t n, std::int64_t chunk) {
  return c.invariant ? c.seqs[n].key_origin % chunk : 0;
}

/// The keys [k0, k1) of chunk ch of sequence n.
inline std::pair<std::int64_t, std::int64_t> ChunkKeys(const Call& c, std::int64_t n,
                                                       std::int64_t ch, std::int64_t chunk) {
  const std::int64_t shift = ChunkShift(c, n, chunk);
  return {std::max<std::int64_t>(0, ch * chunk - shift),
          std::min(c.seqs[n].Sk, (ch + 1) * chunk - shift)};
}

/// The partial results of a split-key call: per (sequence n, key chunk ch
/// of it, query row h·Sq_n + i of it) one record of the unnormalized output
/// o[0 .. Dvp), then m and l. Sequence n has ceil((shift + Sk_n) / chunk)
/// chunks (ChunkShift; none without keys) of H·Sq_n records each.
class SplitPartials {
 public:
  SplitPartials(const Call& c, std::int64_t chunk) : Dvp_(RoundUp(c.plan->Dv, Lanes())) {
    first_chunk_.assign(1, 0);
    first_record_.assign(1, 0);
    for (std::int64_t n = 0; n < c.sequences(); ++n) {
      const AttentionSeq& s = c.seqs[n];
      const std::int64_t keys = s.Sk == 0 ? 0 : ChunkShift(c, n, chunk) + s.Sk;
      const std::int64_t chunks = (keys + chunk - 1) / chunk, rows = c.plan->H * s.Sq;
      first_chunk_.push_back(first_chunk_.back() + chunks);
      first_record_.push_back(first_record_.back() + chunks * rows);
      rows_.push_back(rows);
    }
    // Every record is written before the merge reads it: no zero fill.
    data_.resize(first_record_.back() * (Dvp_ + 2), Buffer::Init::uninitialized);
  }
  float* at(std::int64_t n, std::int64_t ch, std::int64_t row) const {
    const auto s = static_cast<std::size_t>(n);
    return data_.get() + (first_record_[s] + ch * rows_[s] + row) * (Dvp_ + 2);
  }
  /// The chunks of sequence n, and of every sequence (one task each).
  std::int64_t chunks(std::int64_t n) const { return first_chunk_[n + 1] - first_chunk_[n]; }
  const std::vector<std::int64_t>& first_chunk() const { return first_chunk_; }
  std::int64_t Dvp() const { return Dvp_; }

 private:
  std::int64_t Dvp_;
  std::vector<std::int64_t> first_chunk_, first_record_, rows_;
  Buffer data_;
};

/// Per-thread state of the split-key tasks: the scratch and the running
/// DecodeTile of every (kv head, query block) of one task.
struct SplitScratch {
  std::vector<std::unique_ptr<ForwardScratch>> scratch;
  std::vector<std::optional<DecodeTile>> tiles;
  SplitScratch(const Call& c, std::int64_t n_tiles) : tiles(static_cast<std::size_t>(n_tiles)) {
    scratch.reserve(static_cast<std::size_t>(n_tiles));
    for (std::int64_t i = 0; i < n_tiles; ++i)
      scratch.push_back(std::make_unique<ForwardScratch>(c, false));
  }
};

/// Keys per step of a split-key task: Geometry::split_keys_step, a whole
/// number of key blocks in an invariant call (whose blocks must not depend
/// on the steps).
inline std::int64_t SplitKeysStep(const Call& c) {
  const std::int64_t step = c.geometry->split_keys_step;
  return c.invariant ? RoundUp(step, c.key_block) : step;
}

/// One split-key task: the keys [k0, k1) of sequence n for every query row
/// of the sequence, each (kv head, query block) tile in turn per step, so
/// that whole K and V rows are read one after the other; the partials go to
/// chunk `ch` of `part`.
inline void SplitKeysTask(const Call& c, std::int64_t n, std::int64_t ch, std::int64_t k0,
                          std::int64_t k1, SplitScratch& ss, const SplitPartials& part) {
  const std::int64_t step = SplitKeysStep(c), nqb = c.qblocks(n);
  const auto n_tiles = static_cast<std::size_t>(c.plan->Hkv * nqb);
  for (std::int64_t g = 0; g < c.plan->Hkv; ++g) {
    for (std::int64_t qb = 0; qb < nqb; ++qb) {
      const auto at = static_cast<std::size_t>(g * nqb + qb);
      ForwardScratch& s = *ss.scratch[at];
      Tile t(c, n, g, qb);
      // the same head's rows, one step ahead, up to the tile's last key
      const DecodePrefetch pf{step, t.j_end};
      t.ClipKeys(k0, k1);
      PackQueriesNatural(c, t, s.Qn.get());
      if (c.invariant) PackQueriesTransposed(c, t, s.Qt.get());
      ss.tiles[at].emplace(c, t, s, true, pf);
    }
  }
  // an invariant call's steps end at whole key blocks of the sequence's positions
  const std::int64_t origin = c.invariant ? c.seqs[n].key_origin : 0;
  for (std::int64_t j = k0, j_next = 0; j < k1; j = j_next) {
    j_next = std::min(k1, j + step - (c.invariant ? (origin + j) % c.key_block : 0));
    for (std::size_t at = 0; at < n_tiles; ++at) ss.tiles[at]->Run(j, j_next);
  }
  const std::int64_t Dvp = part.Dvp();
  for (std::size_t at = 0; at < n_tiles; ++at) {
    ss.tiles[at]->Close();
    const Tile& t = ss.tiles[at]->tile();
    const ForwardScratch& s = *ss.scratch[at];
    for (std::int64_t r = 0; r < t.rows; ++r) {
      float* dst = part.at(n, ch, t.head(r) * t.Sq + t.query(r));
      std::copy(s.On.get() + r * Dvp, s.On.get() + (r + 1) * Dvp, dst);
      dst[Dvp] = s.m.get()[r];
      dst[Dvp + 1] = s.l.get()[r];
    }
    ss.tiles[at].reset();
  }
}

/// Merges the chunks' partials of query i of sequence n, head h, in chunk
/// order (m in log2 units, as OnlineSoftmax): m = max(sink_h, max_c m_c),
/// l = Σ l_c·2^(m_c − m), o = Σ o_c·2^(m_c − m); then the row's finish as a
/// tile's (the sink's share of l, MergeSink, whose factor is 1 here since m
/// already takes the sink in; FinishFactor, FinishLse): out = o / l (acc:
/// Dvp floats of scratch).
inline void MergeRow(const Call& c, const SplitPartials& part, std::int64_t n, std::int64_t h,
                     std::int64_t i, float* acc, float* out, float* lse_out) {
  const AttentionPlan& plan = *c.plan;
  const DF d;
  const std::int64_t Dvp = part.Dvp(), n_chunks = part.chunks(n), row = h * c.seqs[n].Sq + i;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const float sink = c.sinks != nullptr ? c.sinks[h] * kLog2e : neg_inf;  // log2 units
  // A NaN max (a NaN score) comes with a NaN sum, which reaches l below.
  // With rounded weights every m_c is a whole number (OnlineSoftmax), and so
  // is m with ⌈sink⌉: every factor 2^(m_c − m) is a power of two and the
  // merge changes no weight's bits.
  const bool whole = c.weights != WeightRounding::none;
  float m = whole ? std::ceil(sink) : sink;
  for (std::int64_t ch = 0; ch < n_chunks; ++ch) m = std::max(m, part.at(n, ch, row)[Dvp]);
  // No visible key anywhere: subtract 0, never form −inf − (−inf).
  const float m_use = m == neg_inf ? 0.0f : m;
  float l = 0.0f;
  std::fill(acc, acc + Dvp, 0.0f);
  for (std::int64_t ch = 0; ch < n_chunks; ++ch) {
    const float* src = part.at(n, ch, row);
    const float mc = src[Dvp], lc = src[Dvp + 1];
    if (lc == 0.0f && mc == neg_inf) continue;  // the chunk saw no key of the row
    const VF w = SoftmaxExp2(d, hn::Set(d, mc - m_use));
    l += lc * hn::GetLane(w);
    for (std::int64_t x = 0; x < Dvp; x += Lanes()) {
      hn::Store(hn::MulAdd(hn::LoadU(d, src + x), w, hn::Load(d, acc + x)), d, acc + x);
    }
  }
  float a = 1.0f;
  if (c.sinks != nullptr) MergeSink(sink, m, l, a, whole);
  const float inv = FinishFactor(l, a);
  float* dst = out + c.o_at(n, i, h);
  for (std::int64_t dv = 0; dv < plan.Dv; ++dv) dst[dv] = acc[dv] * inv;
  if (lse_out != nullptr) lse_out[c.lse_at(n, h, i)] = FinishLse(m, l);
}

/// The merge of an invariant call's chunks for the rows of tile (n, g, qb),
/// as its tile would have merged them (ChunkMerge: the first chunk's state
/// copied, each next one merged by MergeChunk, in chunk order), then the
/// tile's finish (FinishRows, WriteRows). s: a ForwardScratch of the call,
/// free (its On, m, l: the merge; its chunk scratch: the chunk being merged,
/// then 1/l and lse of the rows).
inline void MergeTileChunks(const Call& c, const SplitPartials& part, std::int64_t n,
                            std::int64_t g, std::int64_t qb, ForwardScratch& s, float* out,
                            float* lse_out) {
  const Tile t(c, n, g, qb);
  const std::int64_t Dvp = part.Dvp();
  const RowState acc{s.m.get(), s.l.get(), s.On.get(), Dvp, 1};
  const RowState cur{s.chunk.m.get(), s.chunk.l.get(), s.chunk.o.get(), Dvp, 1};
  for (std::int64_t ch = 0; ch < part.chunks(n); ++ch) {
    // the chunk's records of the tile's rows; the padding rows saw no key
    for (std::int64_t r = 0; r < t.rows_p; ++r) {
      const float* src = r < t.rows ? part.at(n, ch, t.head(r) * t.Sq + t.query(r)) : nullptr;
      float* o = cur.o + r * Dvp;
      if (src != nullptr) std::copy(src, src + Dvp, o);
      if (src == nullptr) std::fill(o, o + Dvp, 0.0f);
      cur.m[r] = src != nullptr ? src[Dvp] : -std::numeric_limits<float>::infinity();
      cur.l[r] = src != nullptr ? src[Dvp + 1] : 0.0f;
    }
    if (ch == 0) {
      CopyState(cur, acc, t.rows_p, Dvp);
    } else {
      MergeChunk(acc, cur, t.rows_p, Dvp, s.chunk.w_a.get(), s.chunk.w_c.get());
    }
  }
  float* inv = s.chunk.w_a.get();
  float* lse_rows = lse_out != nullptr ? s.chunk.w_c.get() : nullptr;
  FinishRows(c, t, acc.m, acc.l, inv, lse_rows);
  WriteRows(c, t, {acc.o, Dvp, 1}, inv, lse_rows, out, lse_out);
}

/// The merge of an invariant split-key call: one task per (sequence, kv
/// head, query block) tile (MergeTileChunks), in each thread's first
/// scratch (free again after the chunk tasks).
inline void MergeInvariantChunks(const Call& c, const SplitPartials& part,
                                 std::vector<SplitScratch>& scratch, float* out, float* lse_out) {
  const std::int64_t n_tiles = c.plan->Hkv * c.qblocks();
  ForwardScratch& s = *scratch[static_cast<std::size_t>(omp_get_thread_num())].scratch[0];
#pragma omp for schedule(static)
  for (std::int64_t task = 0; task < n_tiles; ++task) {
    const std::int64_t n = SequenceOf(c.first_qblock, task / c.plan->Hkv);
    const std::int64_t local = task - c.plan->Hkv * c.first_qblock[n], nqb = c.qblocks(n);
    MergeTileChunks(c, part, n, local / nqb, local % nqb, s, out, lse_out);
  }
}

/// The split-key forward: every (sequence, key chunk) task computes, for
/// each query row (h, i) of the sequence, the reference max m, the sum l of
/// 2^(x − m) and the unnormalized output over the visible keys of its chunk
/// (SplitKeysTask); the partials of a row are then merged in chunk order
/// (MergeRow). Each partial depends on the plan and the chunk only, and the
/// merge order is fixed: bitwise identical for any number of threads.
inline void ForwardSplitKeys(const Call& c, std::int64_t chunk, float* out, float* lse_out,
                             int threads) {
  const AttentionPlan& plan = *c.plan;
  const SplitPartials part(c, chunk);
  const std::vector<std::int64_t>& first_chunk = part.first_chunk();
  const std::int64_t n_tasks = first_chunk.back();
  const int nt =
      static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(threads, n_tasks)));
  std::int64_t max_tiles = 0;
  for (std::int64_t n = 0; n < c.sequences(); ++n) max_tiles = std::max(max_tiles, c.qblocks(n));
  std::vector<SplitScratch> scratch;
  scratch.reserve(static_cast<std::size_t>(nt));
  for (int i = 0; i < nt; ++i)
    scratch.emplace_back(c, std::max<std::int64_t>(1, plan.Hkv * max_tiles));
  // rows (query row x of the B·Sq, head h) enumerated x·H + h
  const std::int64_t n_rows = c.first_query.back() * plan.H;
#pragma omp parallel num_threads(nt)
  {
    SplitScratch& ss = scratch[static_cast<std::size_t>(omp_get_thread_num())];
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t task = 0; task < n_tasks; ++task) {
      const std::int64_t n = SequenceOf(first_chunk, task), ch = task - first_chunk[n];
      const auto [k0, k1] = ChunkKeys(c, n, ch, chunk);
      SplitKeysTask(c, n, ch, k0, k1, ss, part);
    }
    // (the implicit barrier above: every partial is written)
    if (c.invariant) {
      MergeInvariantChunks(c, part, scratch, out, lse_out);
    } else {
      float* acc = ss.scratch[0]->On.get();  // N·Dvp floats, free again
#pragma omp for schedule(static)
      for (std::int64_t row = 0; row < n_rows; ++row) {
        const std::int64_t x = row / plan.H, n = SequenceOf(c.first_query, x);
        MergeRow(c, part, n, row % plan.H, x - c.first_query[n], acc, out, lse_out);
      }
    }
  }
}

}  // namespace tandem::optimized::HWY_NAMESPACE::attn
HWY_AFTER_NAMESPACE();

#endif  // toggle guard
