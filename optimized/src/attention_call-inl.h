// SPDX-License-Identifier: Apache-2.0
// Per-target geometry of the optimized attention: one call (Call), the rows
// of its keys (KeyRows), one tile of query rows (Tile) and the key blocks a
// tile visits (KeyBlock, ForEachKeyBlock). Every address of a q, out, dout,
// gradient, lse or K/V row is formed here. Included once per Highway target
// (the toggle guard below), after <hwy/highway.h>.
//
// The wide tile and the backward run in "transposed space": a tile holds the
// query rows of one (sequence, kv head, query block) — the G = H/Hkv query
// heads of the group times nq queries, row r = qi*G + gi — as the *columns*
// of its buffers, so one vector covers N query rows:
//
//     Qt[d][r]   the tile's queries, packed once per tile
//     St[jj][r]  scores of key j0 + jj against row r (then probabilities)
//     Ot[dv][r]  unnormalized output accumulator
//
// The lines of Qt, St and Ot lie an odd number of cache lines apart
// (LineStride). The running max / sum of the online softmax are vectors
// over N rows, and no horizontal reduction is needed. Decode tiles take
// vectors along d instead (DecodeTile, attention_forward_tile-inl.h). Only
// buffers owned by the tiles, or caller rows whose width is a whole number
// of vectors, are loaded as whole vectors, so there are no tails to mask:
// owned widths are rounded up and the padding is zero.
//
// The block sizes come from the call's Geometry (Call), never from globals.
#if defined(TANDEM_OPTIMIZED_ATTENTION_CALL_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TANDEM_OPTIMIZED_ATTENTION_CALL_INL_H_
#undef TANDEM_OPTIMIZED_ATTENTION_CALL_INL_H_
#else
#define TANDEM_OPTIMIZED_ATTENTION_CALL_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "attention_exp2-inl.h"
#include "simd-inl.h"
#include "tandem/attention.hpp"
#include "tandem/optimized/options.hpp"

HWY_BEFORE_NAMESPACE();
namespace tandem::optimized::HWY_NAMESPACE::attn {

namespace hn = hwy::HWY_NAMESPACE;

/// The rows of k or v (keys) of one (sequence, kv head): key j at row(j).
/// Every address of a key row is formed here: `stride` apart from the
/// sequence's key 0 (dense and packed sequences), or, for a paged cache,
/// slot j % block_size of block block_table[b, j / block_size]
/// (AttentionSeq::key_row, the one helper that reads a block table).
struct KeyRows {
  const float* base = nullptr;        ///< key 0; paged: slot 0 of block 0 (at the kv head)
  std::int64_t stride = 0;            ///< from one key's row to the next (one slot to the next)
  std::int64_t width = 0;             ///< floats per row: D or Dv
  std::int64_t block_stride = 0;      ///< paged: from one block of the cache to the next
  const AttentionSeq* seq = nullptr;  ///< paged: the sequence whose block table places the rows
  const float* row(std::int64_t j) const {
    if (seq == nullptr) return base + j * stride;
    const KeyRow at = seq->key_row(j);
    return base + at.batch * block_stride + at.seq * stride;
  }
  /// Number of keys from key j on whose rows lie `stride` apart: all of them,
  /// or (paged) those up to the end of j's block.
  std::int64_t run(std::int64_t j) const {
    return seq == nullptr ? std::numeric_limits<std::int64_t>::max()
                          : seq->block_size - j % seq->block_size;
  }
  /// Whether rows j0 .. j0+n−1 lie `stride` apart from row(j0), so that a
  /// block can be read in place (always, but across a paged cache's blocks).
  bool strided(std::int64_t j0, std::int64_t n) const { return n <= run(j0); }
};

/// Distance between consecutive lines of an owned buffer the micro-kernel
/// reads a column strip of (a tile's transposed Qt[d], St[jj], Ot[dv], the
/// backward's rows of Q and dO), n floats wide (whole vectors): n, plus one
/// vector where n is a multiple of 32 floats. Lines 2^k cache lines apart
/// would put the strip's many lines into a few cache sets; an odd number of
/// cache lines spreads it over all of them.
inline std::int64_t LineStride(std::int64_t n) {
  return n % 32 == 0 ? n + Lanes() : n;
}

/// Calls f(jj, n, rows) for the runs of keys j0 + jj .. j0 + jj + n − 1 of
/// the block [j0, j0 + nk) whose rows lie rows.stride apart from `rows`
/// (one run, but where a paged cache's block ends), in key order.
template <class F>
void ForEachRun(const KeyRows& rows, std::int64_t j0, std::int64_t nk, F&& f) {
  for (std::int64_t jj = 0, n = 0; jj < nk; jj += n) {
    n = std::min(nk - jj, rows.run(j0 + jj));
    f(jj, n, rows.row(j0 + jj));
  }
}

/// Which sequence holds entry x of a range that sequences split in order:
/// the last n with start[n] <= x (start: [sequences + 1], non-decreasing,
/// x < start.back()), so an empty sequence never holds one.
inline std::int64_t SequenceOf(const std::vector<std::int64_t>& start, std::int64_t x) {
  return std::upper_bound(start.begin(), start.end(), x) - start.begin() - 1;
}

/// Whether, and to which storage type, a call rounds the weights of its
/// softmax before the product with V (SPEC §10.2: the `pytorch` profile of a
/// bf16 or f16 call); none for float and the `exact` profile.
enum class WeightRounding { none, bf16, f16 };

/// Sizes of one call, derived from the plan, the inputs and the geometry
/// once, and the addresses of its rows: every q, out, dout, dq, dk and dv
/// row, lse entry and K or V row is found through the accessors below. The
/// call runs over sequences (AttentionPlan::sequence: a batch entry, a
/// packed sequence or a paged cache row), each with its own Sq and Sk, and
/// its query blocks are tiles of their own.
struct Call {
  const AttentionPlan* plan = nullptr;
  const Geometry* geometry = nullptr;
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  const float* mask = nullptr;
  const float* sinks = nullptr;    ///< `[H]` with sinks, else null
  const float* slopes = nullptr;   ///< the ALiBi slopes, else null
  std::vector<AttentionSeq> seqs;  ///< every sequence of the call, in order
  ///@{
  /// `[sequences + 1]` each, sequence n's share of a range split in sequence
  /// order: its query blocks [first_qblock[n], first_qblock[n+1]); its query
  /// rows [first_query[n], …) of the B·Sq rows (b·Sq + q_start + i); its key
  /// slot [first_key[n], …) of the B·Sk rows (b·Sk + k_start + j; for packed
  /// sequences the cu_seqlens_k slot, padding included).
  std::vector<std::int64_t> first_qblock, first_query, first_key;
  ///@}
  std::int64_t max_Sq = 1;      ///< the longest sequence's queries (at least 1)
  std::int64_t max_Sk = 0;      ///< the longest sequence's keys
  std::int64_t G = 1;           ///< query heads per kv head
  std::int64_t block_q = 1;     ///< queries per tile
  std::int64_t max_rows = 1;    ///< G·block_q
  std::int64_t max_rows_p = 1;  ///< max_rows rounded up to whole vectors
  std::int64_t max_stride = 1;  ///< LineStride(max_rows_p)
  std::int64_t window = 0;      ///< w, capped at Sk + Sq (no key lies further back)
  std::int64_t key_block = 1;   ///< Geometry::key_block (kInvariantKeyBlock when invariant)
  std::int64_t edge_block = 1;  ///< Geometry::edge_block (key_block when invariant)
  /// Geometry::invariant (SPEC §12): key blocks end at multiples of
  /// key_block counted from the sequence's key 0, whatever the tile; each
  /// kInvariantChunk keys' softmax sums are formed alone and merged in chunk
  /// order (ChunkMerge); decode tiles sum their dot products along d in
  /// order, as the wide tiles do.
  bool invariant = false;
  /// Whether the tiles take the decode algorithm (DecodeTile: vectors along
  /// d) rather than the wide one (WideTile: vectors across rows): decided per
  /// call, so that the scratch is sized once; the short last query block of
  /// a wider call stays wide.
  bool decode = false;
  float scale = 1.0f;
  float softcap = 0.0f;
  /// The factor the packed queries carry: scale·log2 e without a softcap,
  /// so that a raw dot product is already the score in log2 units (see
  /// ScoreTransform); 1 with one (tanh needs scale·<q, k> itself).
  float q_scale = 1.0f;
  /// Whether the softmax rounds P before P·V (set by a low-precision call
  /// after construction; OnlineSoftmax).
  WeightRounding weights = WeightRounding::none;
  /// Whether q, k and v hold bf16 values (a bf16 call widened to float, set
  /// after construction): the wide tiles may then multiply them as bf16
  /// (Bf16Tile, attention_forward_bf16_tile-inl.h).
  bool bf16_operands = false;

  Call(const AttentionPlan& p, const AttentionInputs<float>& in, const Geometry& geo)
      : plan(&p),
        geometry(&geo),
        key_block(geo.invariant ? kInvariantKeyBlock : geo.key_block),
        edge_block(geo.invariant ? kInvariantKeyBlock : geo.edge_block),
        invariant(geo.invariant) {
    q = in.q.data();
    k = in.k.data();
    v = in.v.data();
    mask = in.mask.empty() ? nullptr : in.mask.data();
    sinks = p.sinks ? in.sinks.data() : nullptr;
    slopes = p.alibi != AlibiKind::none ? in.alibi_slopes.data() : nullptr;
    G = p.group();
    Sequences(in);
    // a − w <= 0 <= j for every query position a < Sk + Sq: a larger window
    // changes nothing, and the cap keeps a − w − j0 far from overflow.
    window = std::min(p.window, p.Sk + p.Sq);
    // Large tiles read each K/V block for more rows; with causal or
    // sliding-window masks smaller ones waste less work on the diagonal.
    const std::int64_t rows_aimed = banded() ? geo.rows_per_tile_banded : geo.rows_per_tile;
    block_q = std::max<std::int64_t>(1, rows_aimed / G);
    block_q = std::min(block_q, max_Sq);
    // As many tiles as the longest sequence takes, of about equal size
    // (whole vectors of rows where the group allows): no short last tile
    // that computes at a fraction of the rate, and shares a thread's time
    // unevenly.
    const std::int64_t tiles = (max_Sq + block_q - 1) / block_q;
    const std::int64_t align = Lanes() / std::gcd(G, Lanes());
    block_q = std::min(block_q, RoundUp((max_Sq + tiles - 1) / tiles, align));
    max_rows = G * block_q;
    max_rows_p = RoundUp(max_rows, Lanes());
    max_stride = LineStride(max_rows_p);
    first_qblock.assign(1, 0);
    for (const AttentionSeq& s : seqs) {
      first_qblock.push_back(first_qblock.back() + (s.Sq + block_q - 1) / block_q);
    }
    // Tiles of one vector of rows (a decode step: one query of the G heads
    // of a group) would waste most lanes of the broadcast micro-kernel.
    switch (geo.decode_tiles) {
      case DecodeTiles::one_vector:
        decode = max_rows_p == Lanes();
        break;
      case DecodeTiles::never:
        decode = false;
        break;
      case DecodeTiles::always:
        decode = true;
        break;
    }
    scale = static_cast<float>(p.scale);
    softcap = static_cast<float>(p.softcap);
    q_scale = softcap > 0.0f ? 1.0f : static_cast<float>(p.scale * static_cast<double>(kLog2e));
  }

  /// Causal and sliding-window masks: each row sees a band of keys.
  bool banded() const {
    return plan->mask == MaskKind::causal || plan->mask == MaskKind::sliding_window;
  }
  std::int64_t sequences() const { return static_cast<std::int64_t>(seqs.size()); }
  /// The query blocks of sequence n (ceil(Sq_n / block_q)), and of all.
  std::int64_t qblocks(std::int64_t n) const { return first_qblock[n + 1] - first_qblock[n]; }
  std::int64_t qblocks() const { return first_qblock.back(); }
  /// Rows of the key slot of sequence n (dk and dv rows it writes).
  std::int64_t slot(std::int64_t n) const { return first_key[n + 1] - first_key[n]; }

  /// Offset of row i of sequence n, head h, of out, dout and the saved out.
  std::int64_t o_at(std::int64_t n, std::int64_t i, std::int64_t h) const {
    return plan->o.at(seqs[n].b, seqs[n].q_row(i), h);
  }
  std::int64_t dq_at(std::int64_t n, std::int64_t i, std::int64_t h) const {
    return plan->dq.at(seqs[n].b, seqs[n].q_row(i), h);
  }
  std::int64_t lse_at(std::int64_t n, std::int64_t h, std::int64_t i) const {
    return plan->lse_at(seqs[n].b, h, seqs[n].q_row(i));
  }
  const float* q_row(std::int64_t n, std::int64_t i, std::int64_t h) const {
    return q + plan->q.at(seqs[n].b, seqs[n].q_row(i), h);
  }
  /// Offset of key j of sequence n, kv head g, of dk and dv (no paged cache).
  std::int64_t dk_at(std::int64_t n, std::int64_t j, std::int64_t g) const {
    const KeyRow at = seqs[n].key_row(j);
    return plan->dk.at(at.batch, at.seq, g);
  }
  std::int64_t dv_at(std::int64_t n, std::int64_t j, std::int64_t g) const {
    const KeyRow at = seqs[n].key_row(j);
    return plan->dv.at(at.batch, at.seq, g);
  }
  KeyRows keys(std::int64_t n, std::int64_t g) const { return RowsOf(k, plan->k, plan->D, n, g); }
  KeyRows values(std::int64_t n, std::int64_t g) const {
    return RowsOf(v, plan->v, plan->Dv, n, g);
  }

 private:
  /// seqs, max_Sq, max_Sk, first_query and first_key from the inputs.
  void Sequences(const AttentionInputs<float>& in) {
    const AttentionPlan& p = *plan;
    first_query.assign(1, 0);
    first_key.clear();
    max_Sq = 1;
    for (std::int64_t n = 0; n < p.sequences(); ++n) {
      seqs.push_back(p.sequence(in, n));
      const AttentionSeq& s = seqs.back();
      max_Sq = std::max(max_Sq, s.Sq);
      max_Sk = std::max(max_Sk, s.Sk);
      first_query.push_back(first_query.back() + s.Sq);
      first_key.push_back(s.b * p.Sk + s.k_start);
    }
    first_key.push_back(p.B * p.Sk);  // each slot ends where the next begins
  }
  KeyRows RowsOf(const float* x, const Strides& st, std::int64_t width, std::int64_t n,
                 std::int64_t g) const {
    const AttentionSeq& s = seqs[n];
    if (plan->paged()) return {x + st.at(0, 0, g), st.seq, width, st.batch, &s};
    const KeyRow first = s.key_row(0);
    return {x + st.at(first.batch, first.seq, g), st.seq, width, 0, nullptr};
  }
};

/// The query rows of one tile: sequence n, kv head g, its queries i0 ..
/// i0+nq−1 (local to the sequence) of the G query heads h = g·G + gi; row
/// r = qi·G + gi. rows_p = rows rounded up to whole vectors (the padding
/// rows are zero and never stored); stride = LineStride(rows_p), the line
/// length of the tile's transposed buffers.
struct Tile {
  std::int64_t n = 0, b = 0, g = 0, G = 1, i0 = 0, nq = 0, rows = 0, rows_p = 0, stride = 0;
  std::int64_t Sq = 0, Sk = 0, q_offset = 0;  ///< the lengths of sequence n
  std::int64_t j_begin = 0, j_end = 0;        ///< keys any row of the tile may see
  std::int64_t key_origin = 0;                ///< sequence n's position of key 0

  Tile(const Call& c, std::int64_t n_, std::int64_t g_, std::int64_t qblock)
      : n(n_), b(c.seqs[n_].b), g(g_), G(c.G) {
    const AttentionSeq& s = c.seqs[n];
    Sq = s.Sq;
    Sk = s.Sk;
    q_offset = s.q_offset();
    key_origin = s.key_origin;
    i0 = qblock * c.block_q;
    nq = std::min(c.block_q, Sq - i0);
    rows = nq * G;
    rows_p = RoundUp(rows, Lanes());
    stride = LineStride(rows_p);
    // Blocks that causal or sliding-window masks hide for every row are
    // skipped wholesale: a = q_offset + i is the key position of query i.
    const std::int64_t a_first = q_offset + i0, a_last = q_offset + i0 + nq - 1;
    j_begin = 0;
    j_end = Sk;
    if (c.banded()) j_end = std::min(Sk, a_last + 1);
    if (c.plan->mask == MaskKind::sliding_window) {
      j_begin = std::max<std::int64_t>(0, a_first - c.window);
    }
    if (j_begin > j_end) j_begin = j_end;
  }
  /// Restricts the tile to the keys [k_begin, k_end) (one chunk of a
  /// split-key call); rows then see no key outside that range.
  void ClipKeys(std::int64_t k_begin, std::int64_t k_end) {
    j_begin = std::max(j_begin, k_begin);
    j_end = std::min(j_end, k_end);
    if (j_begin > j_end) j_begin = j_end;
  }
  /// The columns [lo, hi) of the tile's buffers (whole vectors) holding every
  /// row that may see a key of block [j0, j0 + nk): with causal and
  /// sliding-window masks the rows of a tile see a band of keys, so blocks
  /// near the diagonal need only part of the tile (rows are in query order).
  void ActiveColumns(const Call& c, std::int64_t j0, std::int64_t nk, std::int64_t& lo,
                     std::int64_t& hi) const {
    const std::int64_t N = Lanes();
    std::int64_t qi_lo = 0, qi_hi = nq;
    if (c.banded()) {
      // row sees the block iff a >= j0 (and a − w <= j0 + nk − 1), a = q_offset + i0 + qi
      qi_lo = std::clamp<std::int64_t>(j0 - q_offset - i0, 0, nq);
    }
    if (c.plan->mask == MaskKind::sliding_window) {
      qi_hi = std::clamp<std::int64_t>(j0 + nk - 1 + c.window - q_offset - i0 + 1, 0, nq);
    }
    lo = qi_lo * G / N * N;
    hi = std::min(rows_p, RoundUp(qi_hi * G, N));
    if (hi < lo) hi = lo;
  }
  /// Keys in the block starting at j0 (j0 < j_end): c.key_block, or
  /// c.edge_block where the causal or sliding-window edge runs through the
  /// tile's rows (only some rows see such a block, and a short block wastes
  /// less on the rest). An invariant call's blocks end where the keys'
  /// positions in the whole sequence (key_origin + j) reach a multiple of
  /// key_block instead, for every tile alike (a tile that starts or ends
  /// inside one holds its visible part: the keys it leaves out would add
  /// exact zeros to every sum of the rows).
  std::int64_t BlockSize(const Call& c, std::int64_t j0) const {
    if (c.invariant) {
      return std::min(c.key_block - (key_origin + j0) % c.key_block, j_end - j0);
    }
    const std::int64_t nk = std::min(c.key_block, j_end - j0);
    if (!c.banded()) return nk;
    const std::int64_t a_first = q_offset + i0, a_last = a_first + nq - 1;
    const bool edge = j0 + nk - 1 > a_first ||
                      (c.plan->mask == MaskKind::sliding_window && j0 < a_last - c.window);
    return edge ? std::min(nk, c.edge_block) : nk;
  }
  std::int64_t query(std::int64_t r) const { return i0 + r / G; }
  std::int64_t head(std::int64_t r) const { return g * G + r % G; }
  /// n·Hkv + g: which (sequence, kv head) the tile's K and V rows are, the
  /// key of PackedRows.
  std::int64_t kv_index(const Call& c) const { return n * c.plan->Hkv + g; }
  const float* q_row(const Call& c, std::int64_t r) const { return c.q_row(n, query(r), head(r)); }
  std::int64_t o_at(const Call& c, std::int64_t r) const { return c.o_at(n, query(r), head(r)); }
  std::int64_t dq_at(const Call& c, std::int64_t r) const { return c.dq_at(n, query(r), head(r)); }
  std::int64_t lse_at(const Call& c, std::int64_t r) const {
    return c.lse_at(n, head(r), query(r));
  }
};

/// One key block of a tile: keys [j0, j0 + nk), of which only the rows in
/// the columns [lo, hi) may see any.
struct KeyBlock {
  std::int64_t j0 = 0, nk = 0, lo = 0, hi = 0;
};

/// Calls f(KeyBlock) for the key blocks of [j_from, j_to) ∩ [t.j_begin,
/// t.j_end), in key order, leaving out those no row of the tile sees. The
/// blocks depend on the range: callers that split the keys into consecutive
/// ranges (split-key decode) get the blocks of each range.
template <class F>
void ForEachKeyBlock(const Call& c, const Tile& t, std::int64_t j_from, std::int64_t j_to, F&& f) {
  const std::int64_t j_lo = std::max(j_from, t.j_begin), j_hi = std::min(j_to, t.j_end);
  for (std::int64_t j0 = j_lo, nk = 0; j0 < j_hi; j0 += nk) {
    nk = std::min(t.BlockSize(c, j0), j_hi - j0);
    KeyBlock kb{j0, nk, 0, 0};
    t.ActiveColumns(c, j0, nk, kb.lo, kb.hi);
    if (kb.lo < kb.hi) f(kb);
  }
}

}  // namespace tandem::optimized::HWY_NAMESPACE::attn
HWY_AFTER_NAMESPACE();

#endif  // toggle guard
