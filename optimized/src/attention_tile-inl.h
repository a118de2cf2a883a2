// SPDX-License-Identifier: Apache-2.0
// Per-target geometry of the optimized attention: one call (Call) and one
// tile of query rows (Tile), the packing of K, V and Q blocks, the softmax's
// exp and the score transform (scale, softcap, bias, masks). Included once
// per Highway target (the toggle guard below), after <hwy/highway.h>.
//
// The wide tile and the backward run in "transposed space": a tile holds the
// query rows of one (batch, kv head, query block) — the G = H/Hkv query heads
// of the group times nq queries, row r = qi*G + gi — as the *columns* of its
// buffers, so one vector covers N query rows:
//
//     Qt[d][r]   the tile's queries, packed once per tile
//     St[jj][r]  scores of key j0 + jj against row r (then probabilities)
//     Ot[dv][r]  unnormalized output accumulator
//
// K and V are never transposed: the micro-kernel broadcasts their elements.
// Q·Kᵀ broadcasts from kMR key rows at once and P·V from one V row per key
// of a block, so both are copied per key block into rows of an odd stride
// (rows a caller keeps 4 KiB apart would share a cache set, and P·V walks
// the rows of its block once per micro-tile). The lines of Qt, St and Ot lie
// an odd number of cache lines apart too (LineStride).
// The running max / sum of the online softmax are vectors over N rows, and
// no horizontal reduction is needed. Decode tiles take vectors along d
// instead (DecodeTile, attention_forward_tile-inl.h). Only buffers owned
// here, or caller rows whose width is a whole number of vectors, are loaded
// as whole vectors, so there are no tails to mask: owned widths are rounded
// up and the padding is zero.
//
// The block sizes come from the call's Geometry (Call), never from globals.
//
// Hidden keys never reach a sum: see Skip (gemm-inl.h).
#if defined(TANDEM_OPTIMIZED_ATTENTION_TILE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TANDEM_OPTIMIZED_ATTENTION_TILE_INL_H_
#undef TANDEM_OPTIMIZED_ATTENTION_TILE_INL_H_
#else
#define TANDEM_OPTIMIZED_ATTENTION_TILE_INL_H_
#endif

#include <hwy/cache_control.h>
#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "buffer.hpp"
#include "gemm-inl.h"
#include "tandem/attention.hpp"
#include "tandem/optimized/backend.hpp"

HWY_BEFORE_NAMESPACE();
namespace tandem::optimized::HWY_NAMESPACE::attn {

namespace hn = hwy::HWY_NAMESPACE;

/// How far ahead of the block being computed K and V rows are prefetched.
inline constexpr std::int64_t kPrefetchKeys = 256;

// ---------------------------------------------------------------------------
// exp for the softmax

/// log2 e and ln 2: the softmax runs in base 2 (scores x = s·log2 e, p = 2^x).
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2 = 0.69314718055994531f;

/// 2^x for the softmax's arguments in log2 units (x <= 0 up to rounding, or
/// up to OnlineSoftmax::kRescaleAbove; −inf gives 0, NaN stays NaN):
/// 2^x = 2^n·2^f with n = round(x), |f| <= 1/2, 2^f by a degree-5 polynomial
/// with constant term 1, fitted to the relative error on [−1/2, 1/2] (below
/// 9.2e-8, 1.8e-7 with the float rounding of its evaluation). The constant 1
/// makes 2^0 exactly 1: a row's own maximum gets probability 1 before the
/// division by l, so a row with one visible key reproduces v and its dS is 0
/// exactly, as in the reference. n
/// is rounded by adding 1.5·2^23 + 127, which leaves n + 127 in the low bits
/// of the sum: shifted into the exponent field, they make 2^n. Below
/// kSoftmaxFloor the result is 0. About a third of the work of hn::Exp, which
/// also handles large positive x (not needed here).
/// Where SoftmaxExp2 gives 0. A weight below 2^−64 changes no sum it joins
/// beyond float rounding: the row's largest weight is at least 1 (x − m with
/// m never above the row's max, OnlineSoftmax) or 1/Sk (the backward's
/// probabilities, x − lse). Products of such weights fall below
/// float's normal range, where every product they then feed (P·V; dS and
/// from it dQ, dK) takes the processor's slow path for subnormal operands:
/// ALiBi's steep heads make most weights of a long row that small.
inline constexpr float kSoftmaxFloor = -64.0f;

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

// ---------------------------------------------------------------------------
// One call and one tile of query rows

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
  std::int64_t key_block = 1;   ///< Geometry::key_block
  std::int64_t edge_block = 1;  ///< Geometry::edge_block
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

  Call(const AttentionPlan& p, const AttentionInputs<float>& in, const Geometry& geo)
      : plan(&p), geometry(&geo), key_block(geo.key_block), edge_block(geo.edge_block) {
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

  Tile(const Call& c, std::int64_t n_, std::int64_t g_, std::int64_t qblock)
      : n(n_), b(c.seqs[n_].b), g(g_), G(c.G) {
    const AttentionSeq& s = c.seqs[n];
    Sq = s.Sq;
    Sk = s.Sk;
    q_offset = s.q_offset();
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
  /// less on the rest).
  std::int64_t BlockSize(const Call& c, std::int64_t j0) const {
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

/// Row stride of a packed K or V block: odd, so that the rows the
/// micro-kernel broadcasts from never share a cache set (a caller's bshd rows
/// are often a multiple of 4 KiB apart).
inline std::int64_t PackedStride(std::int64_t width) {
  return width | 1;
}

/// Copies key rows j0 .. j0+nk−1 into dst with row stride ws >= rows.width,
/// zero beyond the width (PackedStride for the wide tile's broadcasts, whole
/// vectors for the decode tile's loads).
inline void PackKeyRows(const KeyRows& rows, std::int64_t j0, std::int64_t nk, std::int64_t ws,
                        float* dst) {
  for (std::int64_t jj = 0; jj < nk; ++jj) {
    std::memcpy(dst + jj * ws, rows.row(j0 + jj),
                static_cast<std::size_t>(rows.width) * sizeof(float));
    std::fill(dst + jj * ws + rows.width, dst + (jj + 1) * ws, 0.0f);
  }
}

/// The packed K (or V) rows a thread's wide tiles read (PackKeyRows, row
/// stride PackedStride(width)), kept for the whole key range of one
/// (sequence, kv head) when that fits kHeadBytes: the next tile of the same head then
/// reads them as they are, where packing per tile would fetch every K and V
/// row again from memory (rows a caller keeps 4 KiB apart, which the
/// hardware prefetchers do not follow) for every tile of query rows. Heads
/// beyond 8 MiB each for K and V (16384 keys at D = 128) are packed block by
/// block: a thread's scratch stays O(Sk·D), and a backward there (whose dK
/// and dV sums take 16 MiB a thread) within 64 MiB on two threads.
class PackedRows {
 public:
  static constexpr std::int64_t kHeadBytes = std::int64_t{8} << 20;

  /// For heads of up to max_keys keys of `width` floats, blocks of up to
  /// key_block keys.
  PackedRows(std::int64_t max_keys, std::int64_t width, std::int64_t key_block)
      : stride_(PackedStride(width)),
        whole_head_(max_keys * stride_ * static_cast<std::int64_t>(sizeof(float)) <= kHeadBytes),
        rows_((whole_head_ ? max_keys : key_block) * stride_, Buffer::Init::uninitialized) {}

  std::int64_t stride() const { return stride_; }
  /// Rows j0 .. j0+nk−1 of `rows`, those of (sequence, kv head) `head`
  /// (Tile::kv_index), packed:
  /// the first row's address (row stride stride()).
  float* Get(const KeyRows& rows, std::int64_t head, std::int64_t j0, std::int64_t nk) {
    if (!whole_head_) {
      PackKeyRows(rows, j0, nk, stride_, rows_.get());
      return rows_.get();
    }
    // [lo_, hi_) of `head_` are packed; extend it, or start over
    if (head != head_ || j0 < lo_ || j0 > hi_) {
      head_ = head;
      lo_ = hi_ = j0;
    }
    if (j0 + nk > hi_) {
      PackKeyRows(rows, hi_, j0 + nk - hi_, stride_, rows_.get() + hi_ * stride_);
      hi_ = j0 + nk;
    }
    return rows_.get() + j0 * stride_;
  }
  /// Whether rows j0 .. j0+nk−1 of `head` need packing (a cache miss ahead).
  bool Missing(std::int64_t head, std::int64_t j0, std::int64_t nk) const {
    return !whole_head_ || head != head_ || j0 < lo_ || j0 + nk > hi_;
  }

 private:
  std::int64_t stride_;
  bool whole_head_;
  Buffer rows_;
  std::int64_t head_ = -1, lo_ = 0, hi_ = 0;
};

/// Asks for key rows j0 .. j0+nk−1 to be brought into the cache.
inline void PrefetchRows(const KeyRows& rows, std::int64_t j0, std::int64_t nk) {
  constexpr std::int64_t kLine = 64 / sizeof(float);  // floats per cache line
  for (std::int64_t jj = 0; jj < nk; ++jj) {
    const float* row = rows.row(j0 + jj);
    for (std::int64_t x = 0; x < rows.width; x += kLine) __builtin_prefetch(row + x, 0, 2);
  }
}

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

/// A transposing copy moves kTransposeRows rows at a time, kTransposeWidth
/// floats of each at a time, through a block held in L1: whole vectors
/// between the block and the caller's rows, elements between the block and
/// the tile's transposed buffer. The caller's rows are often a multiple of
/// 4 KiB apart and not in cache, which the hardware prefetchers do not
/// follow: element by element, too few of their cache lines would be in
/// flight at once. (Rows written are also prefetched kTransposeAhead rows
/// ahead, see StoreRows.)
inline constexpr std::int64_t kTransposeRows = 8;
inline constexpr std::int64_t kTransposeWidth = 256;
inline constexpr std::int64_t kTransposeAhead = 2 * kTransposeRows;

/// Dt[x·stride + r] = row(r)[x]·factor for x < width, r < t.rows, and zero in
/// the padding rows up to t.rows_p: rows into a tile's transposed layout.
template <class RowPtr>
void PackTransposed(const Tile& t, std::int64_t width, RowPtr row, float factor, float* Dt) {
  HWY_ALIGN float block[kTransposeRows][kTransposeWidth];
  for (std::int64_t r0 = 0; r0 < t.rows_p; r0 += kTransposeRows) {
    const std::int64_t n = std::min(kTransposeRows, t.rows_p - r0);
    const std::int64_t real = std::clamp<std::int64_t>(t.rows - r0, 0, n);
    for (std::int64_t x0 = 0; x0 < width; x0 += kTransposeWidth) {
      const std::int64_t w = std::min(kTransposeWidth, width - x0);
      for (std::int64_t i = 0; i < real; ++i) std::copy_n(row(r0 + i) + x0, w, block[i]);
      for (std::int64_t x = 0; x < w; ++x) {
        float* line = Dt + (x0 + x) * t.stride + r0;
        for (std::int64_t i = 0; i < real; ++i) line[i] = block[i][x] * factor;
        for (std::int64_t i = real; i < n; ++i) line[i] = 0.0f;
      }
    }
  }
}

/// Qt[d][r] = q_r[d]·c.q_scale for the tile's rows, zero in the padding rows
/// (the wide tile's layout, and the backward's).
inline void PackQueriesTransposed(const Call& c, const Tile& t, float* Qt) {
  PackTransposed(
      t, c.plan->D, [&](std::int64_t r) { return t.q_row(c, r); }, c.q_scale, Qt);
}

/// Qn[r][x] = q_r[x]·c.q_scale for the tile's rows (row stride Dp = D
/// rounded up to whole vectors), zero beyond D and in the padding rows (the
/// decode tile's layout).
inline void PackQueriesNatural(const Call& c, const Tile& t, float* Qn) {
  const std::int64_t D = c.plan->D, Dp = RoundUp(D, Lanes());
  for (std::int64_t r = 0; r < t.rows_p; ++r) {
    float* dst = Qn + r * Dp;
    const float* src = r < t.rows ? t.q_row(c, r) : nullptr;
    for (std::int64_t x = 0; x < D && src != nullptr; ++x) dst[x] = src[x] * c.q_scale;
    std::fill(dst + (src != nullptr ? D : 0), dst + Dp, 0.0f);
  }
}

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
