// SPDX-License-Identifier: Apache-2.0
// The forward of one FlexAttention query tile (SPEC §13.4) by an online
// softmax: the tile's kv blocks are visited chunk by chunk in ascending key
// order (flex_scores-inl.h gives t), and each row keeps a running maximum m,
// a running sum l = Σ_j e^{t_ij − m} and the running output
// o = Σ_j e^{t_ij − m} v_j, both rescaled by e^{m_old − m_new} when a chunk
// raises m. At the end o_i /= l_i and lse_i = m_i + log l_i; a row that saw
// no visible key (m = −inf) has o = 0 and lse = −inf, and a row with a
// visible t that is NaN or +inf has o and lse NaN (m is set to NaN at once,
// and the row takes no more updates: Highway's Exp is not defined there).
//
// Agrees with tandem::reference::flex_row; the order differs: the
// reference takes one maximum over all keys, then the sum, then the
// weighted sum of v, in its scalar type; here the three are updated per
// chunk in float (one pass over the keys, no [Sq, Sk] score matrix), e^x is
// Highway's float Exp (≤ 1 ulp) and the sums are float vectors reduced per
// chunk. The backward recomputes its tiles with the same function, so its
// lse and o are the forward's bits. Included once per Highway target (the
// toggle guard below), after <hwy/highway.h>.
#if defined(TANDEM_OPTIMIZED_FLEX_SOFTMAX_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TANDEM_OPTIMIZED_FLEX_SOFTMAX_INL_H_
#undef TANDEM_OPTIMIZED_FLEX_SOFTMAX_INL_H_
#else
#define TANDEM_OPTIMIZED_FLEX_SOFTMAX_INL_H_
#endif

#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "flex_call.hpp"
#include "flex_scores-inl.h"
#include "simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace tandem::optimized::HWY_NAMESPACE {
namespace flex {

/// Per-thread scratch of one query tile's forward: the chunk's, the kv
/// blocks and chunks of the tile, the weights e^{t − m} of a chunk, and the
/// rows' m, l and o (then lse and the normalized o).
struct TileScratch {
  ChunkScratch chunk;
  std::vector<KvBlock> blocks;
  std::vector<Chunk> chunks;
  std::vector<float> w;  ///< [rows, stride]: e^{t_ij − m_i} of the chunk
  std::vector<float> m;  ///< [rows]: running maximum
  std::vector<float> l;  ///< [rows]: running sum, then lse
  std::vector<float> o;  ///< [rows, Dv]: running output, then o_i
  explicit TileScratch(const Call& c)
      : chunk(c),
        w(chunk.s.size()),
        m(kTileRows),
        l(kTileRows),
        o(static_cast<std::size_t>(kTileRows * c.Dv)) {}
};

/// The chunks tile `t` of (b, h) visits, in key order, into s.chunks.
inline void TileChunks(const Call& c, std::int64_t b, std::int64_t h, std::int64_t t,
                       TileScratch& s) {
  c.kv_blocks_of(b, h, t, s.blocks);
  s.chunks.clear();
  for (const KvBlock& blk : s.blocks) ChunksOf(c, blk, s.chunks);
}

/// o[0, 8N) += Σ_j w_j v[j·ld + (0, 8N)] in key order (w_j = 0 skipped):
/// eight vectors of o in registers.
inline void AddWeighted8(const Chunk& ch, const float* w, const float* v, std::int64_t ld,
                         float* o) {
  const DF d;
  const std::int64_t N = Lanes();
  VF a0 = hn::LoadU(d, o), a1 = hn::LoadU(d, o + N), a2 = hn::LoadU(d, o + 2 * N);
  VF a3 = hn::LoadU(d, o + 3 * N), a4 = hn::LoadU(d, o + 4 * N), a5 = hn::LoadU(d, o + 5 * N);
  VF a6 = hn::LoadU(d, o + 6 * N), a7 = hn::LoadU(d, o + 7 * N);
  for (std::int64_t j = 0; j < ch.cols; ++j) {
    if (w[j] == 0.0f) continue;
    const VF wj = hn::Set(d, w[j]);
    const float* vj = v + j * ld;
    a0 = hn::MulAdd(wj, hn::LoadU(d, vj), a0);
    a1 = hn::MulAdd(wj, hn::LoadU(d, vj + N), a1);
    a2 = hn::MulAdd(wj, hn::LoadU(d, vj + 2 * N), a2);
    a3 = hn::MulAdd(wj, hn::LoadU(d, vj + 3 * N), a3);
    a4 = hn::MulAdd(wj, hn::LoadU(d, vj + 4 * N), a4);
    a5 = hn::MulAdd(wj, hn::LoadU(d, vj + 5 * N), a5);
    a6 = hn::MulAdd(wj, hn::LoadU(d, vj + 6 * N), a6);
    a7 = hn::MulAdd(wj, hn::LoadU(d, vj + 7 * N), a7);
  }
  hn::StoreU(a0, d, o);
  hn::StoreU(a1, d, o + N);
  hn::StoreU(a2, d, o + 2 * N);
  hn::StoreU(a3, d, o + 3 * N);
  hn::StoreU(a4, d, o + 4 * N);
  hn::StoreU(a5, d, o + 5 * N);
  hn::StoreU(a6, d, o + 6 * N);
  hn::StoreU(a7, d, o + 7 * N);
}

/// The online-softmax update of row r by one chunk's t (row of `stride`).
inline void UpdateRow(const Call& c, const Chunk& ch, const float* t, const float* v,
                      std::int64_t r, TileScratch& s) {
  const DF d;
  const std::int64_t N = Lanes();
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const float m_old = s.m[static_cast<std::size_t>(r)];
  if (std::isnan(m_old)) return;  // the row is NaN already
  float mx = kNegInf;
  bool poisoned = false;  // a NaN or +inf t: the row's o and lse are NaN
  for (std::int64_t j = 0; j < ch.cols; ++j) {
    mx = std::max(mx, t[j]);
    poisoned |= std::isnan(t[j]) || t[j] == -kNegInf;
  }
  if (poisoned) {
    s.m[static_cast<std::size_t>(r)] = std::numeric_limits<float>::quiet_NaN();
    return;
  }
  const float m_new = std::max(m_old, mx);
  if (m_new == kNegInf) return;  // nothing visible yet
  float* w = s.w.data() + r * ch.stride;
  VF sum = hn::Zero(d);
  for (std::int64_t j = 0; j < ch.stride; j += N) {
    const VF x = hn::Sub(hn::LoadU(d, t + j), hn::Set(d, m_new));
    const VF e = hn::Exp(d, x);  // 0 at −inf (Highway's Exp is 0 below −104)
    hn::StoreU(e, d, w + j);
    sum = hn::Add(sum, e);
  }
  float* o = s.o.data() + r * c.Dv;
  if (m_new != m_old) {
    // α = e^{m_old − m_new} (0 for the first visible chunk: o and l are 0)
    const float alpha =
        m_old == kNegInf ? 0.0f : hn::GetLane(hn::Exp(d, hn::Set(d, m_old - m_new)));
    s.l[static_cast<std::size_t>(r)] *= alpha;
    for (std::int64_t e = 0; e < c.Dv; ++e) o[e] *= alpha;
    s.m[static_cast<std::size_t>(r)] = m_new;
  }
  s.l[static_cast<std::size_t>(r)] += hn::GetLane(hn::SumOfLanes(d, sum));
  // o += Σ_j w_j v_j in key order, vectors of o held in registers
  const float* v0 = v + ch.j0 * c.Dv;
  std::int64_t e = 0;
  for (; e + 8 * N <= c.Dv; e += 8 * N) AddWeighted8(ch, w, v0 + e, c.Dv, o + e);
  for (; e + N <= c.Dv; e += N) {
    VF a0 = hn::LoadU(d, o + e);
    for (std::int64_t j = 0; j < ch.cols; ++j) {
      if (w[j] != 0.0f) a0 = hn::MulAdd(hn::Set(d, w[j]), hn::LoadU(d, v0 + j * c.Dv + e), a0);
    }
    hn::StoreU(a0, d, o + e);
  }
  for (; e < c.Dv; ++e) {
    for (std::int64_t j = 0; j < ch.cols; ++j) o[e] += w[j] * v0[j * c.Dv + e];
  }
}

/// The forward of rows [i0, i0 + rows) of (b, h) over the chunks in
/// s.chunks: s.o holds o_i `[rows, Dv]` and s.l holds lse_i on return.
inline void ForwardTileRows(const Call& c, std::int64_t b, std::int64_t h, std::int64_t i0,
                            std::int64_t rows, TileScratch& s) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  std::fill(s.m.begin(), s.m.end(), kNegInf);
  std::fill(s.l.begin(), s.l.end(), 0.0f);
  std::fill(s.o.begin(), s.o.end(), 0.0f);
  const float* v = c.v + (b * c.Hkv + h / c.G) * c.Sk * c.Dv;
  const ModProgram& score_mod = c.plan->params().score_mod;
  for (const Chunk& ch : s.chunks) {
    ChunkScores(c, b, h, i0, rows, ch, score_mod, s.chunk);
    for (std::int64_t r = 0; r < rows; ++r) {
      UpdateRow(c, ch, s.chunk.t.data() + r * ch.stride, v, r, s);
    }
  }
  for (std::int64_t r = 0; r < rows; ++r) {
    float* o = s.o.data() + r * c.Dv;
    float& l = s.l[static_cast<std::size_t>(r)];
    const float m = s.m[static_cast<std::size_t>(r)];
    if (m == kNegInf) {  // no visible key: o = 0, lse = −inf
      l = kNegInf;
      continue;
    }
    if (std::isnan(m)) {  // a NaN or +inf t: o and lse NaN
      std::fill(o, o + c.Dv, m);
      l = m;
      continue;
    }
    for (std::int64_t e = 0; e < c.Dv; ++e) o[e] /= l;
    l = m + std::log(l);
  }
}

}  // namespace flex
}  // namespace tandem::optimized::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // toggle guard
