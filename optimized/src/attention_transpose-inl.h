// SPDX-License-Identifier: Apache-2.0
// Per-target copies between a caller's rows and a tile's buffers: query
// rows into the transposed layout (PackTransposed, PackQueriesTransposed) or
// the natural one (PackQueriesNatural), a tile's rows in both at once
// (PackRows, the backward's Q and dO), and a tile's finished rows back out
// (StoreRows: out, dq). Included once per Highway target (the toggle guard
// below), after <hwy/highway.h>.
#if defined(TANDEM_OPTIMIZED_ATTENTION_TRANSPOSE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TANDEM_OPTIMIZED_ATTENTION_TRANSPOSE_INL_H_
#undef TANDEM_OPTIMIZED_ATTENTION_TRANSPOSE_INL_H_
#else
#define TANDEM_OPTIMIZED_ATTENTION_TRANSPOSE_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>

#include "attention_call-inl.h"

HWY_BEFORE_NAMESPACE();
namespace tandem::optimized::HWY_NAMESPACE::attn {

namespace hn = hwy::HWY_NAMESPACE;

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

/// Dst[r][x] = src_r[x] (x < width, zero up to wp) and/or Dt[x][r] =
/// src_r[x]·t_factor for the rows of a tile; padding rows are zero.
template <class RowPtr>
void PackRows(const Tile& t, std::int64_t width, std::int64_t wp, RowPtr row, float* Dst, float* Dt,
              float t_factor = 1.0f) {
  if (Dt != nullptr) PackTransposed(t, width, row, t_factor, Dt);
  for (std::int64_t r = 0; Dst != nullptr && r < t.rows_p; ++r) {
    float* dst = Dst + r * wp;
    const std::int64_t n = r < t.rows ? width : 0;
    if (n > 0) std::copy_n(row(r), n, dst);
    std::fill(dst + n, dst + wp, 0.0f);
  }
}

/// A tile's unnormalized output O[r][dv] = base[r·row_step + dv·col_step]:
/// Ot (transposed) or On (natural).
struct OutputRows {
  const float* base = nullptr;
  std::int64_t row_step = 0, col_step = 0;
  float at(std::int64_t r, std::int64_t dv) const { return base[r * row_step + dv * col_step]; }
};

/// dst(r)[dv] = O[r][dv]·w[r] for r < rows, dv < width (w null: the rows as
/// they are), through a block in L1 as PackTransposed.
template <class DstRow>
void StoreRows(const OutputRows& o, std::int64_t rows, std::int64_t width, const float* w,
               DstRow dst) {
  HWY_ALIGN float block[kTransposeRows][kTransposeWidth];
  // the rows kTransposeAhead ahead of the block, for writing
  const auto prefetch = [&](std::int64_t from, std::int64_t to) {
    constexpr std::int64_t kLine = 64 / sizeof(float);  // floats per cache line
    for (std::int64_t r = from; r < std::min(rows, to); ++r) {
      for (std::int64_t x = 0; x < width; x += kLine) __builtin_prefetch(dst(r) + x, 1, 3);
    }
  };
  prefetch(0, kTransposeAhead);
  for (std::int64_t r0 = 0; r0 < rows; r0 += kTransposeRows) {
    const std::int64_t n = std::min(kTransposeRows, rows - r0);
    prefetch(r0 + kTransposeAhead, r0 + kTransposeAhead + kTransposeRows);
    for (std::int64_t x0 = 0; x0 < width; x0 += kTransposeWidth) {
      const std::int64_t m = std::min(kTransposeWidth, width - x0);
      for (std::int64_t x = 0; x < m; ++x) {
        for (std::int64_t i = 0; i < n; ++i) {
          block[i][x] = o.at(r0 + i, x0 + x) * (w != nullptr ? w[r0 + i] : 1.0f);
        }
      }
      for (std::int64_t i = 0; i < n; ++i) std::copy_n(block[i], m, dst(r0 + i) + x0);
    }
  }
}

}  // namespace tandem::optimized::HWY_NAMESPACE::attn
HWY_AFTER_NAMESPACE();

#endif  // toggle guard
