// SPDX-License-Identifier: Apache-2.0
// The scores of one chunk of a FlexAttention tile (SPEC §13.4): for the
// tile's query rows i and the chunk's keys j,
//   s_ij = scale·<q_i, k_j>,  visible_ij = full block or mask_mod(b, h, i, j),
//   t_ij = score_mod(s_ij, b, h, i, j) where visible, −inf elsewhere,
// with both mods interpreted over the whole chunk (flex_mod_tile-inl.h).
//
// Agrees with the first loop of tandem::reference::flex_row; the order
// differs: <q_i, k_j> is a float multiply-add chain over d (the chunk's keys
// packed transposed, one vector of keys per d) where the reference sums in
// its scalar type, and the mods are evaluated node by node over the chunk
// instead of point by point. The products of the backward, dp_ij =
// <dO_i, v_j>, are the same kernel (Products). Included once per Highway
// target (the toggle guard below), after <hwy/highway.h>.
#if defined(TANDEM_OPTIMIZED_FLEX_SCORES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TANDEM_OPTIMIZED_FLEX_SCORES_INL_H_
#undef TANDEM_OPTIMIZED_FLEX_SCORES_INL_H_
#else
#define TANDEM_OPTIMIZED_FLEX_SCORES_INL_H_
#endif

#include <hwy/highway.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "flex_call.hpp"
#include "flex_mod_tile-inl.h"
#include "simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace tandem::optimized::HWY_NAMESPACE {
namespace flex {

using ::tandem::optimized::flex::Call;
using ::tandem::optimized::flex::kChunkKeys;
using ::tandem::optimized::flex::kTileRows;
using ::tandem::optimized::flex::KvBlock;

/// One chunk of keys [j0, j0 + cols) of kv block `full`-ness, held with
/// `stride` (cols rounded up to the lanes) elements per row.
struct Chunk {
  std::int64_t j0 = 0, cols = 0, stride = 0;  ///< first key, keys, row stride
  bool full = false;                          ///< of a full block (mask_mod not evaluated)
};

/// The chunks of kv block `kb`, in key order, appended to `out`.
inline void ChunksOf(const Call& c, const KvBlock& blk, std::vector<Chunk>& out) {
  const std::int64_t first = blk.kb * c.kv_block, last = std::min(first + c.kv_block, c.Sk);
  for (std::int64_t j0 = first; j0 < last; j0 += kChunkKeys) {
    const std::int64_t cols = std::min(kChunkKeys, last - j0);
    out.push_back({j0, cols, RoundUp(cols, Lanes()), blk.full});
  }
}

/// Per-thread scratch of one chunk: the scores s and t and the two mods'
/// values.
struct ChunkScratch {
  std::vector<float> s;  ///< [rows, stride]: s_ij
  std::vector<float> t;  ///< [rows, stride]: t_ij, −inf where hidden or padding
  ModTile score_mod, mask_mod;
  explicit ChunkScratch(const Call& c)
      : s(static_cast<std::size_t>(kTileRows * RoundUp(kChunkKeys, Lanes()))), t(s.size()) {}
};

/// xt `[n, width, stride]` = x `[n, rows, width]` transposed per matrix
/// (xt[(m·width + d)·stride + j] = x[(m·rows + j)·width + d]), zero for
/// j >= rows: the keys (or values) of each (b, kv head) packed once per
/// call, one vector of keys per d, on `threads` threads.
inline void TransposeAll(const float* x, std::int64_t n, std::int64_t rows, std::int64_t width,
                         std::int64_t stride, float* xt, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
  for (std::int64_t md = 0; md < n * width; ++md) {
    const std::int64_t m = md / width, d = md % width;
    const float* src = x + m * rows * width + d;
    float* dst = xt + md * stride;
    for (std::int64_t j = 0; j < rows; ++j) dst[j] = src[j * width];
    for (std::int64_t j = rows; j < stride; ++j) dst[j] = 0.0f;
  }
}

/// The length of a transposed row of k or v: Sk rounded up to the lanes,
/// plus one vector, so that a chunk's padding columns stay inside it.
inline std::int64_t TransposedStride(const Call& c) {
  return RoundUp(c.Sk, Lanes()) + Lanes();
}

/// Four vectors of out = mult · a_r·kt for rows r and r + 1 at columns
/// [c, c + 4N): eight multiply-add chains over d in flight.
inline void Products2x4(const float* a0, const float* a1, std::int64_t width, const float* kt,
                        std::int64_t ldk, VF m, float* o0, float* o1) {
  const DF d;
  const std::int64_t N = Lanes();
  VF x0 = hn::Zero(d), x1 = hn::Zero(d), x2 = hn::Zero(d), x3 = hn::Zero(d);
  VF y0 = hn::Zero(d), y1 = hn::Zero(d), y2 = hn::Zero(d), y3 = hn::Zero(d);
  for (std::int64_t e = 0; e < width; ++e) {
    const VF p = hn::Set(d, a0[e]), q = hn::Set(d, a1[e]);
    const float* k = kt + e * ldk;
    const VF k0 = hn::LoadU(d, k), k1 = hn::LoadU(d, k + N);
    const VF k2 = hn::LoadU(d, k + 2 * N), k3 = hn::LoadU(d, k + 3 * N);
    x0 = hn::MulAdd(p, k0, x0);
    x1 = hn::MulAdd(p, k1, x1);
    x2 = hn::MulAdd(p, k2, x2);
    x3 = hn::MulAdd(p, k3, x3);
    y0 = hn::MulAdd(q, k0, y0);
    y1 = hn::MulAdd(q, k1, y1);
    y2 = hn::MulAdd(q, k2, y2);
    y3 = hn::MulAdd(q, k3, y3);
  }
  hn::StoreU(hn::Mul(x0, m), d, o0);
  hn::StoreU(hn::Mul(x1, m), d, o0 + N);
  hn::StoreU(hn::Mul(x2, m), d, o0 + 2 * N);
  hn::StoreU(hn::Mul(x3, m), d, o0 + 3 * N);
  hn::StoreU(hn::Mul(y0, m), d, o1);
  hn::StoreU(hn::Mul(y1, m), d, o1 + N);
  hn::StoreU(hn::Mul(y2, m), d, o1 + 2 * N);
  hn::StoreU(hn::Mul(y3, m), d, o1 + 3 * N);
}

/// One vector of out = mult · a_r·kt at column c: one chain over d.
inline void Products1x1(const float* ar, std::int64_t width, const float* kt, std::int64_t ldk,
                        VF m, float* o) {
  const DF d;
  VF acc = hn::Zero(d);
  for (std::int64_t e = 0; e < width; ++e) {
    acc = hn::MulAdd(hn::Set(d, ar[e]), hn::LoadU(d, kt + e * ldk), acc);
  }
  hn::StoreU(hn::Mul(acc, m), d, o);
}

/// out[r·stride + c] = mult · Σ_d a[r·width + d] kt[d·ldk + c] for r < rows:
/// one multiply-add chain over d per (r, c), in order d = 0, 1, …, whichever
/// of the two blockings computes it (the same bits).
inline void Products(const float* a, std::int64_t rows, std::int64_t width, const float* kt,
                     std::int64_t ldk, std::int64_t stride, float mult, float* out) {
  const DF d;
  const std::int64_t N = Lanes();
  const VF m = hn::Set(d, mult);
  std::int64_t r = 0;
  for (; r + 2 <= rows; r += 2) {
    std::int64_t c = 0;
    for (; c + 4 * N <= stride; c += 4 * N) {
      Products2x4(a + r * width, a + (r + 1) * width, width, kt + c, ldk, m, out + r * stride + c,
                  out + (r + 1) * stride + c);
    }
    for (; c < stride; c += N) {
      Products1x1(a + r * width, width, kt + c, ldk, m, out + r * stride + c);
      Products1x1(a + (r + 1) * width, width, kt + c, ldk, m, out + (r + 1) * stride + c);
    }
  }
  for (; r < rows; ++r) {
    for (std::int64_t c = 0; c < stride; c += N) {
      Products1x1(a + r * width, width, kt + c, ldk, m, out + r * stride + c);
    }
  }
}

/// s and t of rows [i0, i0 + rows) of (b, h) against chunk `ch`: scratch.s,
/// scratch.t (−inf where hidden and in the padding), and the values of
/// `score_prog` (the score_mod, or its gradient program, whose result node
/// is the score_mod's) in scratch.score_mod when the call has a score_mod.
inline void ChunkScores(const Call& c, std::int64_t b, std::int64_t h, std::int64_t i0,
                        std::int64_t rows, const Chunk& ch, const ModProgram& score_prog,
                        ChunkScratch& scratch) {
  const FlexParams& p = c.plan->params();
  const std::int64_t g = h / c.G;
  Products(c.q + ((b * c.H + h) * c.Sq + i0) * c.D, rows, c.D,
           c.kt + (b * c.Hkv + g) * c.D * c.kt_stride + ch.j0, c.kt_stride, ch.stride, c.scale,
           scratch.s.data());
  const TilePoints x{b, h, i0, rows, ch.j0, ch.cols, ch.stride};
  const float* t = scratch.s.data();
  if (!p.score_mod.empty()) {
    scratch.score_mod.Evaluate(score_prog, c.score, x, scratch.s.data());
    t = scratch.score_mod.real(p.score_mod.result());
  }
  const std::int64_t* keep = nullptr;
  if (!ch.full && !p.mask_mod.empty()) {
    scratch.mask_mod.Evaluate(p.mask_mod, c.mask, x, nullptr);
    keep = scratch.mask_mod.integer(p.mask_mod.result());
  }
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  float* out = scratch.t.data();
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t j = 0; j < ch.stride; ++j) {
      const std::int64_t e = r * ch.stride + j;
      const bool visible = j < ch.cols && (keep == nullptr || keep[e] != 0);
      out[e] = visible ? t[e] : kNegInf;
    }
  }
}

}  // namespace flex
}  // namespace tandem::optimized::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // toggle guard
