// SPDX-License-Identifier: Apache-2.0
// Per-target copies of K and V rows for the optimized attention's tiles: the
// packed rows a thread's wide tiles (and the backward) broadcast from
// (PackedRows, kept per (sequence, kv head) across tiles), the decode tile's
// whole-vector copies (PackKeyRows) and the prefetches ahead of them.
// Included once per Highway target (the toggle guard below), after
// <hwy/highway.h>.
//
// K and V are never transposed: the micro-kernel broadcasts their elements.
// Q·Kᵀ broadcasts from kMR key rows at once and P·V from one V row per key
// of a block, so both are copied per key block into rows of an odd stride
// (rows a caller keeps 4 KiB apart would share a cache set, and P·V walks
// the rows of its block once per micro-tile).
#if defined(TANDEM_OPTIMIZED_ATTENTION_PACKED_ROWS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TANDEM_OPTIMIZED_ATTENTION_PACKED_ROWS_INL_H_
#undef TANDEM_OPTIMIZED_ATTENTION_PACKED_ROWS_INL_H_
#else
#define TANDEM_OPTIMIZED_ATTENTION_PACKED_ROWS_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "attention_call-inl.h"
#include "buffer.hpp"

HWY_BEFORE_NAMESPACE();
namespace tandem::optimized::HWY_NAMESPACE::attn {

namespace hn = hwy::HWY_NAMESPACE;

/// How far ahead of the block being computed K and V rows are prefetched.
inline constexpr std::int64_t kPrefetchKeys = 256;

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

}  // namespace tandem::optimized::HWY_NAMESPACE::attn
HWY_AFTER_NAMESPACE();

#endif  // toggle guard
