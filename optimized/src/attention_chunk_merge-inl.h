// SPDX-License-Identifier: Apache-2.0
// Per-target chunk merge of an invariant call (Geometry::invariant, SPEC
// §12): every row's keys are cut at the multiples of kInvariantChunk from
// the sequence's key 0, each chunk's online softmax starts afresh, and the
// chunks' states are merged in chunk order by one formula (MergeChunk). A
// tile that runs through several chunks merges as it goes (ChunkMerge); a
// split-key call computes the chunks in separate tasks and merges them
// afterwards by the same function, so both give the same bits. Included once
// per Highway target (the toggle guard below), after <hwy/highway.h>.
#if defined(TANDEM_OPTIMIZED_ATTENTION_CHUNK_MERGE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TANDEM_OPTIMIZED_ATTENTION_CHUNK_MERGE_INL_H_
#undef TANDEM_OPTIMIZED_ATTENTION_CHUNK_MERGE_INL_H_
#else
#define TANDEM_OPTIMIZED_ATTENTION_CHUNK_MERGE_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "attention_exp2-inl.h"
#include "buffer.hpp"
#include "simd-inl.h"
#include "tandem/optimized/options.hpp"

HWY_BEFORE_NAMESPACE();
namespace tandem::optimized::HWY_NAMESPACE::attn {

namespace hn = hwy::HWY_NAMESPACE;

/// The online-softmax state of a tile's rows_p rows: the reference max m and
/// the sum l (log2 units, as OnlineSoftmax), and the unnormalized output
/// o(r, dv) = o[r·row_step + dv·col_step] (null: none, the backward's
/// statistics-only pass). row_step = 1 is the wide tile's transposed layout
/// (Ot[dv][r]), col_step = 1 the decode tile's natural one (On[r][dv]).
struct RowState {
  float* m = nullptr;
  float* l = nullptr;
  float* o = nullptr;
  std::int64_t row_step = 0, col_step = 0;
};

/// One element of the merge: o_a·w_a + o_c·w_c, the same float operations
/// whichever layout the lanes run along.
HWY_INLINE VF MergeLanes(VF oa, VF wa, VF oc, VF wc) {
  return hn::MulAdd(oc, wc, hn::Mul(oa, wa));
}

/// acc <- the merge of acc (the chunks before) and cur (the next chunk),
/// for rows_p rows (whole vectors) and width output columns (whole vectors
/// in the natural layout), acc and cur in one layout:
///   m = max(m_a, m_c),  w_a = 2^(m_a − m),  w_c = 2^(m_c − m)
///   l = l_c·w_c + l_a·w_a,  o = o_c·w_c + o_a·w_a
/// (m = −inf, no key in either: subtract 0, never −inf − (−inf)). A chunk
/// that saw no key of a row (m_c = −inf, l_c = 0, o_c = 0) leaves its acc
/// as it is, and an empty acc takes cur's values: w = 2^0 = 1 exactly and
/// the other side's w = 0. With whole-number m (rounded weights) every w is
/// a power of two. w_a, w_c: rows_p floats of scratch.
inline void MergeChunk(const RowState& acc, const RowState& cur, std::int64_t rows_p,
                       std::int64_t width, float* w_a, float* w_c) {
  const DF d;
  const std::int64_t N = Lanes();
  const VF neg_inf = hn::Set(d, -std::numeric_limits<float>::infinity());
  for (std::int64_t r0 = 0; r0 < rows_p; r0 += N) {
    const VF ma = hn::LoadU(d, acc.m + r0), mc = hn::LoadU(d, cur.m + r0);
    const VF m = hn::Max(ma, mc);
    const VF m_use = hn::IfThenZeroElse(hn::Eq(m, neg_inf), m);
    const VF wa = SoftmaxExp2(d, hn::Sub(ma, m_use)), wc = SoftmaxExp2(d, hn::Sub(mc, m_use));
    hn::StoreU(MergeLanes(hn::LoadU(d, acc.l + r0), wa, hn::LoadU(d, cur.l + r0), wc), d,
               acc.l + r0);
    hn::StoreU(m, d, acc.m + r0);
    hn::StoreU(wa, d, w_a + r0);
    hn::StoreU(wc, d, w_c + r0);
  }
  if (acc.o == nullptr) return;
  if (acc.row_step == 1) {  // Ot[dv][r]: vectors across rows
    for (std::int64_t dv = 0; dv < width; ++dv) {
      float* oa = acc.o + dv * acc.col_step;
      const float* oc = cur.o + dv * cur.col_step;
      for (std::int64_t r0 = 0; r0 < rows_p; r0 += N) {
        const VF v = MergeLanes(hn::LoadU(d, oa + r0), hn::LoadU(d, w_a + r0),
                                hn::LoadU(d, oc + r0), hn::LoadU(d, w_c + r0));
        hn::StoreU(v, d, oa + r0);
      }
    }
    return;
  }
  for (std::int64_t r = 0; r < rows_p; ++r) {  // On[r][dv]: vectors along dv
    float* oa = acc.o + r * acc.row_step;
    const float* oc = cur.o + r * cur.row_step;
    const VF wa = hn::Set(d, w_a[r]), wc = hn::Set(d, w_c[r]);
    for (std::int64_t x = 0; x < width; x += N) {
      hn::StoreU(MergeLanes(hn::LoadU(d, oa + x), wa, hn::LoadU(d, oc + x), wc), d, oa + x);
    }
  }
}

/// dst <- src (m, l and the output's rows_p × width elements), exactly.
inline void CopyState(const RowState& src, const RowState& dst, std::int64_t rows_p,
                      std::int64_t width) {
  std::copy(src.m, src.m + rows_p, dst.m);
  std::copy(src.l, src.l + rows_p, dst.l);
  for (std::int64_t r = 0; dst.o != nullptr && r < rows_p; ++r) {
    for (std::int64_t x = 0; x < width; ++x) {
      dst.o[r * dst.row_step + x * dst.col_step] = src.o[r * src.row_step + x * src.col_step];
    }
  }
}

/// Scratch of the chunk merge, sized for the largest tile of a call: the
/// merged state of the chunks before (m, l, the output in the tile's layout)
/// and the merge's factors.
struct ChunkScratch {
  Buffer m, l, o, w_a, w_c;
  ChunkScratch() = default;
  ChunkScratch(std::int64_t rows_p, std::int64_t out_floats)
      : m(rows_p), l(rows_p), o(out_floats), w_a(rows_p), w_c(rows_p) {}
};

/// The chunk merge of one tile (an invariant call's): before each key block
/// the tile calls Enter(j0); where the block starts a new chunk, the state
/// of the chunk before is merged into the running merge (the first one
/// copied) and the tile restarts its softmax (`restart`). Close() merges
/// the last chunk and leaves the whole merge in the tile's state. A tile
/// within one chunk never merges: its state is that chunk's.
class ChunkMerge {
 public:
  /// `cur`: the tile's own state; `width`: its output columns (see
  /// MergeChunk); an inactive merge (a call that is not invariant) does
  /// nothing.
  ChunkMerge(bool active, const RowState& cur, std::int64_t rows_p, std::int64_t width,
             ChunkScratch& s)
      : active_(active), cur_(cur), rows_p_(rows_p), width_(width), s_(s) {
    acc_ = {s.m.get(), s.l.get(), cur.o != nullptr ? s.o.get() : nullptr, cur.row_step,
            cur.col_step};
  }

  /// Before the key block starting at position a (key_origin + j0, its
  /// position in the whole sequence): a new chunk merges the last.
  template <class Restart>
  void Enter(std::int64_t a, Restart&& restart) {
    if (!active_) return;
    const std::int64_t chunk = a / kInvariantChunk;
    if (chunk == chunk_) return;
    if (chunk_ >= 0) {
      Fold();
      restart();
    }
    chunk_ = chunk;
  }
  /// After the tile's last block: the merge of every chunk in the tile's
  /// state.
  void Close() {
    if (!merged_) return;
    MergeChunk(acc_, cur_, rows_p_, width_, s_.w_a.get(), s_.w_c.get());
    CopyState(acc_, cur_, rows_p_, width_);
    merged_ = false;
  }

 private:
  void Fold() {
    if (merged_) {
      MergeChunk(acc_, cur_, rows_p_, width_, s_.w_a.get(), s_.w_c.get());
    } else {
      CopyState(cur_, acc_, rows_p_, width_);
      merged_ = true;
    }
  }

  bool active_;
  RowState cur_, acc_;
  std::int64_t rows_p_, width_;
  ChunkScratch& s_;
  std::int64_t chunk_ = -1;
  bool merged_ = false;
};

}  // namespace tandem::optimized::HWY_NAMESPACE::attn
HWY_AFTER_NAMESPACE();

#endif  // toggle guard
