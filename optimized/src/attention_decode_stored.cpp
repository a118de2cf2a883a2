// SPDX-License-Identifier: Apache-2.0
// Optimized attention forward reading K and V in their stored type: bf16 or
// f16 caches (plain, SPEC §10.2) and int8 or e4m3 codes with float scales
// (SPEC §10.4), for q of type float, bf16 or f16. Decode is bound by the
// bytes of K and V; these are read once per (sequence, kv head) for all the
// G query heads of the group, widened in registers (LoadStored,
// attention_decode_stored-inl.h) and never written back widened.
//
// Agrees with tandem::reference's attention_forward_quantized and the bf16/
// f16 attention_forward (SPEC §10.5). Per query row i, key j, in float32:
//
//     y_ij  = σ^k_j · <q_i·scale·log2 e, c_j>        (σ = 1 for bf16/f16; with a softcap
//                                                  c: log2 e · c·tanh(scale·σ<q,c>/c))
//             − log2 e·m_h·|i + Sk − Sq − j| + log2 e·bias_ij    (ALiBi, bias)
//     μ_i   = ⌈max_j y_ij⌉, kept as a whole number through the online softmax
//     e_ij  = 2^(y_ij − μ_i),  l_i = 2^(sink_h·log2 e − μ_i) + Σ_j e_ij
//     w_ij  = RN_T(e_ij) (rounding.operands, T = q's type low precision) else e_ij
//     o_i   = RN_T( Σ_j (w_ij·σ^v_j)·c^v_j / l_i ),   lse_i = (μ_i + log2 l_i)·ln 2
//
// A rescale of the running sums when μ moves is a whole power of two, exact,
// so the weights' bits do not depend on which key block moved the maximum.
//
// The order of the sums differs from the reference's key-by-key loops (within
// SPEC §10.5's bound, which does not depend on the order): each dot product
// <q, c> is summed in vector lanes, 4 query rows × N/4 keys at a time, and
// the lanes of all of them are reduced together (SumLanesTransposed); o and
// l are summed per key block, blocks in key order, chunks merged in chunk
// order. A key block that every row sees whole (no mask, or inside the
// causal or sliding-window band) skips the mask, and without softcap and
// ALiBi the score transform as well.
//
// Work: one task per (sequence, query block, key chunk); the rows of each
// kv head g are its G query heads × the block's queries, so one pass over
// the head's K and V rows serves all of them, and the kv heads take each
// block of keys in turn, so that whole K and V rows are read in order.
// Long caches of few (sequence, query block) pairs are split into key
// chunks at fixed boundaries (multiples of the chunk from key 0, depending
// on the shape only); every task writes its
// partial (o, μ, l) and the partials of a row are merged in chunk order with
// the exact factors 2^(μ_c − μ): bitwise identical for any thread count.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention_decode_stored.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "attention_decode_stored-inl.h"
#include "attention_exp2-inl.h"
#include "convert-inl.h"
#include "simd-inl.h"

#ifndef TANDEM_OPTIMIZED_ATTENTION_DECODE_STORED_ONCE
#define TANDEM_OPTIMIZED_ATTENTION_DECODE_STORED_ONCE
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "buffer.hpp"
#include "entry_points.hpp"

namespace tandem::optimized::detail {

/// Query rows per task at most (more when one query's G heads are more).
inline constexpr std::int64_t kDecodeRows = 16;
/// Keys per block of the online softmax inside a task.
inline constexpr std::int64_t kDecodeKeyBlock = 16;
/// Keys per chunk of a split call, unless Geometry::split_keys_chunk says.
inline constexpr std::int64_t kDecodeChunk = 512;
/// Calls with fewer (sequence, query block) pairs than this split their keys.
inline constexpr std::int64_t kDecodeSplitBelow = 64;

/// One call after validation, whatever its element types: q, out of type
/// Q; k, v of stored element E (codes: the scales given); the sinks widened
/// to float.
struct DecodeArgs {
  const AttentionPlan* plan = nullptr;
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const float* k_scale = nullptr;  ///< codes only, else null
  const float* v_scale = nullptr;
  const float* mask = nullptr;
  const float* slopes = nullptr;
  std::vector<float> sinks;  ///< `[H]` with sinks, else empty
  std::vector<AttentionSeq> seqs;
  void* out = nullptr;
  float* lse = nullptr;  ///< or null
  std::int64_t chunk = 0;
  std::int64_t block_q = 1;  ///< queries per task
  int threads = 1;
};

}  // namespace tandem::optimized::detail
#endif  // TANDEM_OPTIMIZED_ATTENTION_DECODE_STORED_ONCE

HWY_BEFORE_NAMESPACE();
namespace tandem::optimized::HWY_NAMESPACE {
namespace {

using detail::DecodeArgs;
using detail::kDecodeKeyBlock;

/// 2^n for a whole number n <= 0 held in a float (−inf: 0), exactly.
inline float PowerOfTwo(float n) {
  if (!(n > -300.0f)) return n == n ? 0.0f : n;  // far below float's range, or NaN
  return std::ldexp(1.0f, static_cast<int>(n));
}

/// Query rows and keys per pass of the dot products (DotPass): their
/// kPassDots accumulators reduce to whole vectors of sums, one vector from
/// SSE4 on (four single lanes on the scalar target).
constexpr std::int64_t kPassRows = 4;
constexpr std::int64_t kPassKeys =
    std::max<std::int64_t>(1, static_cast<std::int64_t>(hn::MaxLanes(DF())) / kPassRows);
constexpr std::int64_t kPassDots = kPassRows * kPassKeys;
static_assert(kDecodeKeyBlock % kPassKeys == 0);

/// One round of SumLanesTransposed: v[i] = the even plus the odd lanes of
/// the pair v[2i], v[2i + 1] (i in I), whose lower half then holds v[2i]'s
/// pair sums and its upper half v[2i + 1]'s.
template <std::size_t... I>
HWY_INLINE void FoldPairs(DF d, VF* v, std::index_sequence<I...> /*pairs*/) {
#if HWY_TARGET == HWY_SCALAR
  (void)d;
  (void)v;
#else
  ((v[I] = hn::Add(hn::ConcatEven(d, v[2 * I + 1], v[2 * I]),
                   hn::ConcatOdd(d, v[2 * I + 1], v[2 * I]))),
   ...);
#endif
}

/// Lane k of v[k / N] becomes the sum of the lanes of the original v[k], for
/// k < kCount (N = kWidth lanes, kCount a multiple of N, or N = 1 where the
/// lanes are the sums): log2 N rounds of FoldPairs, 3 operations per pair
/// against about 2·log2 N for each horizontal sum. Indices are constants
/// throughout, so that v stays in registers.
template <std::size_t kCount, std::size_t kWidth>
HWY_INLINE void SumLanesTransposed(DF d, VF* v) {
  if constexpr (kWidth > 1) {
    FoldPairs(d, v, std::make_index_sequence<kCount / 2>());
    SumLanesTransposed<kCount / 2, kWidth / 2>(d, v);
  }
}

/// One task: sequence n, kv head g, queries [i0, i0 + nq), keys [k0, k1).
struct DecodeTask {
  std::int64_t n = 0, g = 0, i0 = 0, nq = 0, k0 = 0, k1 = 0;
};

/// Per-thread scratch: the task's queries (rows rounded up to 4, zero
/// padding), the scores then weights of one key block, the output
/// accumulators, the running μ and l, and which rows see each key.
struct DecodeScratch {
  Buffer Qn, S, W, On, m, l;
  std::vector<unsigned char> seen;
  std::int64_t Dp = 0, Dvp = 0, R = 0;
  DecodeScratch(const AttentionPlan& p, std::int64_t rows) {
    Dp = RoundUp(p.D, Lanes());
    Dvp = RoundUp(p.Dv, Lanes());
    R = RoundUp(rows, 4);
    Qn.resize(R * Dp);
    S.resize(R * RoundUp(kDecodeKeyBlock, Lanes()));
    W.resize(R * kDecodeKeyBlock);
    On.resize(R * Dvp);
    m.resize(R);
    l.resize(R);
    seen.resize(static_cast<std::size_t>(R * kDecodeKeyBlock));
  }
};

/// The kernel of one call with q of type Q and K/V elements E.
template <class Q, class E>
class DecodeKernel {
 public:
  explicit DecodeKernel(const DecodeArgs& a)
      : a_(a),
        p_(*a.plan),
        q_(static_cast<const Q*>(a.q)),
        k_(static_cast<const E*>(a.k)),
        v_(static_cast<const E*>(a.v)),
        G_(p_.group()),
        round_(is_low_precision_v<Q> && p_.rounding.operands) {
    scale_ = static_cast<float>(p_.scale);
    softcap_ = static_cast<float>(p_.softcap);
    q_scale_ =
        softcap_ > 0.0f ? 1.0f : static_cast<float>(p_.scale * static_cast<double>(attn::kLog2e));
  }

  /// The task's partials: for every kv head g and row r (= qi·G + gi) of
  /// it, record g·rows + r: Dvp floats of the unnormalized output, then μ
  /// and l. The keys go by blocks, each block through every kv head in
  /// turn, so that whole K and V rows (all heads) are read one after the
  /// other, as the split-key forward does (attention_split_keys-inl.h).
  void Run(const DecodeTask& task, std::vector<DecodeScratch>& heads, float* partial) const {
    const AttentionSeq& seq = a_.seqs[task.n];
    const std::int64_t rows = task.nq * G_;
    std::int64_t j_lo = task.k0, j_hi = task.k1;
    KeyBand(task, seq, j_lo, j_hi);
    DecodeTask t = task;
    for (t.g = 0; t.g < p_.Hkv; ++t.g) {
      DecodeScratch& s = heads[static_cast<std::size_t>(t.g)];
      PackQueries(t, seq, s, rows);
      std::fill(s.On.get(), s.On.get() + s.R * s.Dvp, 0.0f);
      std::fill(s.m.get(), s.m.get() + s.R, -std::numeric_limits<float>::infinity());
      std::fill(s.l.get(), s.l.get() + s.R, 0.0f);
    }
    for (std::int64_t j0 = j_lo; j0 < j_hi; j0 += kDecodeKeyBlock) {
      const std::int64_t nk = std::min(kDecodeKeyBlock, j_hi - j0);
      const bool whole = BlockVisible(task, seq, j0, nk);
      for (t.g = 0; t.g < p_.Hkv; ++t.g) {
        DecodeScratch& s = heads[static_cast<std::size_t>(t.g)];
        Scores(t, seq, s, rows, j0, nk, whole);
        Softmax(s, rows, nk);
        Values(t, seq, s, rows, j0, nk, whole);
      }
    }
    for (t.g = 0; t.g < p_.Hkv; ++t.g) {
      const DecodeScratch& s = heads[static_cast<std::size_t>(t.g)];
      for (std::int64_t r = 0; r < rows; ++r) {
        float* dst = partial + (t.g * rows + r) * (s.Dvp + 2);
        std::copy(s.On.get() + r * s.Dvp, s.On.get() + (r + 1) * s.Dvp, dst);
        dst[s.Dvp] = s.m.get()[r];
        dst[s.Dvp + 1] = s.l.get()[r];
      }
    }
  }

 private:
  std::int64_t Head(const DecodeTask& t, std::int64_t r) const { return t.g * G_ + r % G_; }
  std::int64_t Query(const DecodeTask& t, std::int64_t r) const { return t.i0 + r / G_; }

  /// Qn[r] = q_r · q_scale, widened (whole vectors; the padding is zero).
  void PackQueries(const DecodeTask& t, const AttentionSeq& seq, DecodeScratch& s,
                   std::int64_t rows) const {
    const DF d;
    const std::int64_t N = Lanes();
    const VF qs = hn::Set(d, q_scale_);
    std::fill(s.Qn.get(), s.Qn.get() + s.R * s.Dp, 0.0f);
    for (std::int64_t r = 0; r < rows; ++r) {
      const Q* src = q_ + p_.q.at(seq.b, seq.q_row(Query(t, r)), Head(t, r));
      float* dst = s.Qn.get() + r * s.Dp;
      for (std::int64_t x = 0; x < p_.D; x += N) {
        const VF qv = x + N <= p_.D ? LoadWide<Q>(d, src + x) : LoadWideN<Q>(d, src + x, p_.D - x);
        hn::Store(hn::Mul(qv, qs), d, dst + x);
      }
    }
  }

  /// Restricts [j_lo, j_hi) to the keys a causal or sliding-window mask
  /// shows any query of the task (SPEC §2: a = q_offset + i).
  void KeyBand(const DecodeTask& t, const AttentionSeq& seq, std::int64_t& j_lo,
               std::int64_t& j_hi) const {
    const std::int64_t a_first = seq.q_offset() + t.i0, a_last = a_first + t.nq - 1;
    if (p_.mask == MaskKind::causal || p_.mask == MaskKind::sliding_window) {
      j_hi = std::min(j_hi, a_last + 1);
    }
    if (p_.mask == MaskKind::sliding_window) {
      j_lo = std::max(j_lo, a_first - std::min(p_.window, p_.Sk + p_.Sq));
    }
    if (j_lo > j_hi) j_lo = j_hi;
  }

  /// Whether key j is visible to row r (SPEC §2's table).
  bool Visible(const DecodeTask& t, const AttentionSeq& seq, std::int64_t r, std::int64_t j) const {
    const std::int64_t a = seq.q_offset() + Query(t, r);
    switch (p_.mask) {
      case MaskKind::none:
        return true;
      case MaskKind::causal:
        return j <= a;
      case MaskKind::sliding_window:
        return a - p_.window <= j && j <= a;
      case MaskKind::key_padding:
        return a_.mask[p_.mask_row(seq.b, Head(t, r), Query(t, r)) + j] != 0.0f;
      case MaskKind::bias:
        return a_.mask[p_.mask_row(seq.b, Head(t, r), Query(t, r)) + j] !=
               -std::numeric_limits<float>::infinity();
    }
    return false;
  }

  /// Whether every row of the task sees every key of [j0, j0 + nk): no mask,
  /// or a causal or sliding-window band holding the whole block (the other
  /// masks are read key by key).
  bool BlockVisible(const DecodeTask& t, const AttentionSeq& seq, std::int64_t j0,
                    std::int64_t nk) const {
    const std::int64_t a_first = seq.q_offset() + t.i0, a_last = a_first + t.nq - 1;
    const std::int64_t j_last = j0 + nk - 1;
    switch (p_.mask) {
      case MaskKind::none:
        return true;
      case MaskKind::causal:
        return j_last <= a_first;
      case MaskKind::sliding_window:
        return j_last <= a_first && a_last - p_.window <= j0;
      default:
        return false;
    }
  }

  /// dots[kk·kPassRows + r] = <Qn_r, c_kk> for the kPassRows rows at qn
  /// (stride Dp) and the kPassKeys key rows `key`: one accumulator per
  /// (key, row), all summed at once by SumLanesTransposed instead of a
  /// horizontal sum per dot product. Agrees with the reference's
  /// Σ_x q_x·c_x up to the order of the sum (lanes, then the reduction tree).
  void DotPass(const float* qn, std::int64_t Dp, const E* const* key, float* dots) const {
    const DF d;
    const std::int64_t N = Lanes();
    VF acc[kPassDots];
    for (VF& a : acc) a = hn::Zero(d);
    for (std::int64_t x = 0; x < p_.D; x += N) {
      const bool full = x + N <= p_.D;
      HWY_UNROLL(16)  // every accumulator index a constant: acc stays in registers
      for (std::int64_t kk = 0; kk < kPassKeys; ++kk) {
        const VF kv =
            full ? LoadStored<E>(d, key[kk] + x) : LoadStoredN<E>(d, key[kk] + x, p_.D - x);
        HWY_UNROLL(4)
        for (std::int64_t r = 0; r < kPassRows; ++r) {
          VF& a = acc[kk * kPassRows + r];
          a = hn::MulAdd(hn::Load(d, qn + r * Dp + x), kv, a);
        }
      }
    }
    SumLanesTransposed<static_cast<std::size_t>(kPassDots), hn::MaxLanes(DF())>(d, acc);
    for (std::int64_t i = 0; i * N < kPassDots; ++i) hn::StoreU(acc[i], d, dots + i * N);
  }

  /// seen[jj·R + r] = whether row r sees key j0 + jj, and any[jj] whether
  /// some row does.
  void MarkSeen(const DecodeTask& t, const AttentionSeq& seq, DecodeScratch& s, std::int64_t rows,
                std::int64_t j0, std::int64_t nk, bool* any) const {
    for (std::int64_t jj = 0; jj < nk; ++jj) {
      unsigned char* seen = s.seen.data() + jj * s.R;
      any[jj] = false;
      for (std::int64_t r = 0; r < rows; ++r) {
        seen[r] = Visible(t, seq, r, j0 + jj) ? 1 : 0;
        any[jj] = any[jj] || seen[r] != 0;
      }
    }
  }

  /// S[r][jj] = y_rj in log2 units for the keys j0 + jj (−inf where hidden).
  /// A `whole` block (BlockVisible) skips the mask; without softcap and
  /// ALiBi its y is σ^k·dot alone. Otherwise seen (MarkSeen) says which rows
  /// see each key, and keys of a pass no row sees are not read.
  void Scores(const DecodeTask& t, const AttentionSeq& seq, DecodeScratch& s, std::int64_t rows,
              std::int64_t j0, std::int64_t nk, bool whole) const {
    const std::int64_t ld = RoundUp(kDecodeKeyBlock, Lanes());
    const float neg_inf = -std::numeric_limits<float>::infinity();
    const E* keys[kDecodeKeyBlock];
    float sk[kDecodeKeyBlock];
    for (std::int64_t jj = 0; jj < kDecodeKeyBlock; ++jj) {
      const KeyRow at = seq.key_row(j0 + std::min(jj, nk - 1));  // the pass's padding repeats
      keys[jj] = k_ + p_.k.at(at.batch, at.seq, t.g);
      sk[jj] = a_.k_scale != nullptr ? a_.k_scale[p_.kv_scale_at(at.batch, at.seq, t.g)] : 1.0f;
    }
    bool any[kDecodeKeyBlock];
    if (!whole) MarkSeen(t, seq, s, rows, j0, nk, any);
    const bool plain = whole && softcap_ == 0.0f && a_.slopes == nullptr;
    float dots[kPassDots] = {};
    for (std::int64_t jp = 0; jp < nk; jp += kPassKeys) {
      const std::int64_t np = std::min(kPassKeys, nk - jp);
      const bool read = whole || std::any_of(any + jp, any + jp + np, [](bool b) { return b; });
      for (std::int64_t r0 = 0; r0 < rows; r0 += kPassRows) {
        if (read) DotPass(s.Qn.get() + r0 * s.Dp, s.Dp, keys + jp, dots);
        for (std::int64_t kk = 0; kk < np; ++kk) {
          const std::int64_t jj = jp + kk;
          for (std::int64_t r = r0; r < std::min(rows, r0 + kPassRows); ++r) {
            const float dot = dots[kk * kPassRows + r - r0];
            float& y = s.S.get()[r * ld + jj];
            if (plain) {
              y = sk[jj] * dot;
            } else {
              const bool sees = whole || s.seen[static_cast<std::size_t>(jj * s.R + r)] != 0;
              y = sees ? Transform(t, seq, r, j0 + jj, sk[jj], dot) : neg_inf;
            }
          }
        }
      }
    }
    for (std::int64_t r = 0; r < rows; ++r) {
      std::fill(s.S.get() + r * ld + nk, s.S.get() + (r + 1) * ld, neg_inf);
    }
  }

  /// y of row r, key j from its dot product (Qn carries scale·log2 e
  /// without a softcap, 1 with one) and the key's scale.
  float Transform(const DecodeTask& t, const AttentionSeq& seq, std::int64_t r, std::int64_t j,
                  float sk, float dot) const {
    float y = 0.0f;
    if (softcap_ > 0.0f) {
      const float x = scale_ * sk * dot;
      y = softcap_ * std::tanh(x / softcap_) * attn::kLog2e;
    } else {
      y = sk * dot;
    }
    if (a_.slopes != nullptr) {
      const float slope = a_.slopes[p_.slope_at(seq.n, Head(t, r))];
      const auto dist = static_cast<float>(std::llabs(Query(t, r) + seq.alibi_shift() - j));
      y -= slope * attn::kLog2e * dist;
    }
    if (p_.mask == MaskKind::bias) {
      y += a_.mask[p_.mask_row(seq.b, Head(t, r), Query(t, r)) + j] * attn::kLog2e;
    }
    return y;
  }

  /// The online softmax step of one block, row by row: μ ← max(μ, ⌈max y⌉)
  /// (a whole number), l and On rescaled by the exact 2^(μ_old − μ), l +=
  /// Σ e, S ← w (RN_T(e) when rounding).
  void Softmax(DecodeScratch& s, std::int64_t rows, std::int64_t nk) const {
    const DF d;
    const std::int64_t N = Lanes(), ld = RoundUp(kDecodeKeyBlock, N), width = RoundUp(nk, N);
    for (std::int64_t r = 0; r < rows; ++r) {
      float* S = s.S.get() + r * ld;
      VF mx = hn::Set(d, -std::numeric_limits<float>::infinity());
      for (std::int64_t x = 0; x < width; x += N) mx = hn::Max(mx, hn::Load(d, S + x));
      const float block_max = hn::GetLane(hn::MaxOfLanes(d, mx));
      float& m = s.m.get()[r];
      const float m_new = std::max(m, std::ceil(block_max));
      if (m_new == -std::numeric_limits<float>::infinity()) continue;  // nothing seen yet
      if (m_new != m) {
        const float alpha = PowerOfTwo(m - m_new);
        s.l.get()[r] *= alpha;
        float* o = s.On.get() + r * s.Dvp;
        for (std::int64_t x = 0; x < s.Dvp; x += N) {
          hn::Store(hn::Mul(hn::Load(d, o + x), hn::Set(d, alpha)), d, o + x);
        }
        m = m_new;
      }
      const VF mv = hn::Set(d, m);
      VF sum = hn::Zero(d);
      for (std::int64_t x = 0; x < width; x += N) {
        const VF e = attn::SoftmaxExp2(d, hn::Sub(hn::Load(d, S + x), mv));
        sum = hn::Add(sum, e);
        hn::Store(round_ ? RoundAs<Q>(d, e) : e, d, S + x);
      }
      s.l.get()[r] += hn::GetLane(hn::SumOfLanes(d, sum));
    }
  }

  /// On[r] += Σ_jj (w_rj·σ^v_j)·c^v_j over the keys some row sees, in key
  /// order. When every such key is seen by all rows (always in a `whole`
  /// block), the weights are scaled once (W) and the On vectors of four rows
  /// stay in registers across the block (ValuesSeenByAll); otherwise a row
  /// that does not see a key never touches its values (they may be NaN).
  void Values(const DecodeTask& t, const AttentionSeq& seq, DecodeScratch& s, std::int64_t rows,
              std::int64_t j0, std::int64_t nk, bool whole) const {
    const DF d;
    const std::int64_t N = Lanes(), ld = RoundUp(kDecodeKeyBlock, N), Dv = p_.Dv;
    const E* vals[kDecodeKeyBlock];
    HWY_ALIGN float sv[kDecodeKeyBlock] = {};
    std::int64_t keys[kDecodeKeyBlock];
    std::int64_t n_active = 0;
    bool all = true;
    for (std::int64_t jj = 0; jj < nk; ++jj) {
      if (!whole) {
        const unsigned char* seen = s.seen.data() + jj * s.R;
        std::int64_t n_seen = 0;
        for (std::int64_t r = 0; r < rows; ++r) n_seen += seen[r];
        if (n_seen == 0) continue;
        all = all && n_seen == rows;
      }
      const KeyRow at = seq.key_row(j0 + jj);
      vals[n_active] = v_ + p_.v.at(at.batch, at.seq, t.g);
      sv[n_active] =
          a_.v_scale != nullptr ? a_.v_scale[p_.kv_scale_at(at.batch, at.seq, t.g)] : 1.0f;
      keys[n_active++] = jj;
    }
    if (all) {
      ScaleWeights(s, rows, sv, keys, n_active, whole);
      ValuesSeenByAll(s, rows, vals, n_active);
      return;
    }
    for (std::int64_t a = 0; a < n_active; ++a) {
      const unsigned char* seen = s.seen.data() + keys[a] * s.R;
      for (std::int64_t x = 0; x < Dv; x += N) {
        const VF vv =
            x + N <= Dv ? LoadStored<E>(d, vals[a] + x) : LoadStoredN<E>(d, vals[a] + x, Dv - x);
        for (std::int64_t r = 0; r < rows; ++r) {
          if (!seen[r]) continue;
          float* o = s.On.get() + r * s.Dvp + x;
          const VF w = hn::Set(d, s.S.get()[r * ld + keys[a]] * sv[a]);
          hn::Store(hn::MulAdd(w, vv, hn::Load(d, o)), d, o);
        }
      }
    }
  }

  /// W[r][a] = w_r,key(a)·σ^v_a, 0 for the padding rows; a `whole` block's
  /// keys are a = 0 .. nk − 1, so whole rows are multiplied at once (sv is
  /// zero past the block's keys).
  void ScaleWeights(DecodeScratch& s, std::int64_t rows, const float* sv, const std::int64_t* keys,
                    std::int64_t n_active, bool whole) const {
    const DF d;
    const std::int64_t N = Lanes(), ld = RoundUp(kDecodeKeyBlock, N);
    float* W = s.W.get();
    for (std::int64_t r = 0; r < s.R; ++r) {
      float* w = W + r * kDecodeKeyBlock;
      const float* y = s.S.get() + r * ld;
      if (r >= rows) {
        std::fill(w, w + kDecodeKeyBlock, 0.0f);
      } else if (whole && kDecodeKeyBlock % N == 0) {
        for (std::int64_t x = 0; x < kDecodeKeyBlock; x += N) {
          hn::Store(hn::Mul(hn::Load(d, y + x), hn::Load(d, sv + x)), d, w + x);
        }
      } else {
        for (std::int64_t a = 0; a < n_active; ++a) w[a] = y[keys[a]] * sv[a];
      }
    }
  }

  /// Values' common case, every key seen by all rows: for four rows at a
  /// time their On columns two vectors wide (eight independent accumulators,
  /// enough to keep both FMA units busy), one vector for an odd last one
  /// (ValueColumns), the weights W from ScaleWeights.
  void ValuesSeenByAll(DecodeScratch& s, std::int64_t rows, const E* const* vals,
                       std::int64_t n_active) const {
    const std::int64_t N = Lanes(), Dv = p_.Dv;
    for (std::int64_t r0 = 0; r0 < rows; r0 += 4) {
      const float* w = s.W.get() + r0 * kDecodeKeyBlock;
      float* o = s.On.get() + r0 * s.Dvp;
      std::int64_t x = 0;
      for (; x + 2 * N <= Dv; x += 2 * N) ValueColumns<2>(w, o + x, s.Dvp, vals, n_active, x);
      for (; x < Dv; x += N) ValueColumns<1>(w, o + x, s.Dvp, vals, n_active, x);
    }
  }

  /// o[r·ldo + c·N + lane] += Σ_a w[r][a]·c^v_a[x + c·N + lane] for rows
  /// r < 4 and kCols vectors c, the keys a in order: the same products and
  /// sums as the key-by-key loop, so the same bits.
  template <int kCols>
  void ValueColumns(const float* w, float* o, std::int64_t ldo, const E* const* vals,
                    std::int64_t n_active, std::int64_t x) const {
    const DF d;
    const std::int64_t N = Lanes(), Dv = p_.Dv;
    const bool full = x + kCols * N <= Dv;
    VF acc[4][kCols];
    for (int r = 0; r < 4; ++r) {
      for (int c = 0; c < kCols; ++c) acc[r][c] = hn::Load(d, o + r * ldo + c * N);
    }
    for (std::int64_t a = 0; a < n_active; ++a) {
      for (int c = 0; c < kCols; ++c) {
        const E* src = vals[a] + x + c * N;
        const VF vv = full ? LoadStored<E>(d, src) : LoadStoredN<E>(d, src, Dv - x - c * N);
        for (int r = 0; r < 4; ++r) {
          acc[r][c] = hn::MulAdd(hn::Set(d, w[r * kDecodeKeyBlock + a]), vv, acc[r][c]);
        }
      }
    }
    for (int r = 0; r < 4; ++r) {
      for (int c = 0; c < kCols; ++c) hn::Store(acc[r][c], d, o + r * ldo + c * N);
    }
  }

  const DecodeArgs& a_;
  const AttentionPlan& p_;
  const Q* q_;
  const E* k_;
  const E* v_;
  std::int64_t G_;
  bool round_;
  float scale_ = 1.0f, softcap_ = 0.0f, q_scale_ = 1.0f;
};

/// Where each task's partials lie: tasks in the order (sequence, query
/// block, key chunk), chunk innermost, each covering every kv head; a group
/// = the chunks of one (sequence, query block), merged together.
struct DecodeLayout {
  std::vector<DecodeTask> tasks;
  std::vector<std::int64_t> first;        ///< `[tasks + 1]` float offset of each partial
  std::vector<std::int64_t> group_first;  ///< `[groups + 1]` first task of each group
  std::vector<DecodeTask> groups;         ///< the group's task without keys

  DecodeLayout(const DecodeArgs& a, std::int64_t Dvp) {
    const AttentionPlan& p = *a.plan;
    first.assign(1, 0);
    group_first.assign(1, 0);
    for (std::int64_t n = 0; n < static_cast<std::int64_t>(a.seqs.size()); ++n) {
      const AttentionSeq& seq = a.seqs[n];
      for (std::int64_t i0 = 0; i0 < seq.Sq; i0 += a.block_q) {
        DecodeTask t{n, 0, i0, std::min(a.block_q, seq.Sq - i0), 0, 0};
        groups.push_back(t);
        for (std::int64_t k0 = 0; k0 < seq.Sk; k0 += a.chunk) {
          t.k0 = k0;
          t.k1 = std::min(seq.Sk, k0 + a.chunk);
          tasks.push_back(t);
          first.push_back(first.back() + p.Hkv * t.nq * p.group() * (Dvp + 2));
        }
        group_first.push_back(static_cast<std::int64_t>(tasks.size()));
      }
    }
  }
};

/// Merges row r of kv head g of a group's chunk partials in chunk order (μ = max of the
/// sink's ⌈·⌉ and the μ_c; o = Σ o_c·2^(μ_c − μ), l likewise, exact factors),
/// adds the sink's weight to l and stores RN_Q(o / l) and the lse.
template <class Q>
void MergeRow(const DecodeArgs& a, const DecodeLayout& lay, const float* partials, std::int64_t grp,
              std::int64_t g, std::int64_t r, std::int64_t Dvp, float* acc) {
  const AttentionPlan& p = *a.plan;
  const DF d;
  const std::int64_t N = Lanes(), G = p.group();
  const DecodeTask& t = lay.groups[grp];
  const AttentionSeq& seq = a.seqs[t.n];
  const std::int64_t h = g * G + r % G, i = t.i0 + r / G, rows = t.nq * G;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const float sink = a.sinks.empty() ? neg_inf : a.sinks[h] * attn::kLog2e;
  const std::int64_t c0 = lay.group_first[grp], c1 = lay.group_first[grp + 1];
  const auto part = [&](std::int64_t c) { return lay.first[c] + (g * rows + r) * (Dvp + 2); };
  float m = std::ceil(sink);
  for (std::int64_t c = c0; c < c1; ++c) m = std::max(m, partials[part(c) + Dvp]);
  std::fill(acc, acc + Dvp, 0.0f);
  float l = 0.0f;
  if (m != neg_inf) {
    for (std::int64_t c = c0; c < c1; ++c) {
      const float* src = partials + part(c);
      if (src[Dvp] == neg_inf) continue;  // the chunk saw no key of the row
      const float f = PowerOfTwo(src[Dvp] - m);
      l += src[Dvp + 1] * f;
      for (std::int64_t x = 0; x < Dvp; x += N) {
        hn::Store(hn::MulAdd(hn::LoadU(d, src + x), hn::Set(d, f), hn::Load(d, acc + x)), d,
                  acc + x);
      }
    }
    if (sink != neg_inf) l += hn::GetLane(attn::SoftmaxExp2(d, hn::Set(d, sink - m)));
  }
  const float inv = l == 0.0f ? 0.0f : 1.0f / l;
  Q* dst = static_cast<Q*>(a.out) + p.o.at(seq.b, seq.q_row(i), h);
  for (std::int64_t x = 0; x < p.Dv; x += N) {
    const VF o = hn::Mul(hn::Load(d, acc + x), hn::Set(d, inv));
    if (x + N <= p.Dv) {
      StoreRounded<Q>(d, o, dst + x);
    } else {
      StoreRoundedN<Q>(d, o, dst + x, p.Dv - x);
    }
  }
  if (a.lse != nullptr) {
    float lse = neg_inf;
    if (l > 0.0f) lse = (m + std::log2(l)) * attn::kLn2;
    if (l != l) lse = l;  // a NaN score stays NaN
    a.lse[p.lse_at(seq.b, h, seq.q_row(i))] = lse;
  }
}

/// The call: every task's partial (in parallel, any order), then every
/// row's merge; each result depends on the plan and the fixed chunks only.
template <class Q, class E>
void Decode(const DecodeArgs& a) {
  const AttentionPlan& p = *a.plan;
  const DecodeKernel<Q, E> kernel(a);
  const std::int64_t Dvp = RoundUp(p.Dv, Lanes()), rows = a.block_q * p.group();
  const DecodeLayout lay(a, Dvp);
  Buffer partials;
  partials.resize(std::max<std::int64_t>(1, lay.first.back()), Buffer::Init::uninitialized);
  const auto n_tasks = static_cast<std::int64_t>(lay.tasks.size());
  const auto n_groups = static_cast<std::int64_t>(lay.groups.size());
  const int nt = static_cast<int>(
      std::max<std::int64_t>(1, std::min<std::int64_t>(a.threads, std::max(n_tasks, n_groups))));
#pragma omp parallel num_threads(nt)
  {
    std::vector<DecodeScratch> heads;
    heads.reserve(static_cast<std::size_t>(p.Hkv));
    for (std::int64_t g = 0; g < p.Hkv; ++g) heads.emplace_back(p, rows);
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t i = 0; i < n_tasks; ++i) {
      kernel.Run(lay.tasks[static_cast<std::size_t>(i)], heads, partials.get() + lay.first[i]);
    }
    // (the implicit barrier above: every partial is written)
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t grp = 0; grp < n_groups; ++grp) {
      const std::int64_t grp_rows = lay.groups[static_cast<std::size_t>(grp)].nq * p.group();
      for (std::int64_t g = 0; g < p.Hkv; ++g) {
        for (std::int64_t r = 0; r < grp_rows; ++r) {
          MergeRow<Q>(a, lay, partials.get(), grp, g, r, Dvp, heads[0].On.get());
        }
      }
    }
  }
}

}  // namespace

void DecodeF32Int8(const DecodeArgs& a) {
  Decode<float, std::int8_t>(a);
}
void DecodeF32E4m3(const DecodeArgs& a) {
  Decode<float, float8_e4m3>(a);
}
void DecodeBf16Bf16(const DecodeArgs& a) {
  Decode<bfloat16, bfloat16>(a);
}
void DecodeBf16Int8(const DecodeArgs& a) {
  Decode<bfloat16, std::int8_t>(a);
}
void DecodeBf16E4m3(const DecodeArgs& a) {
  Decode<bfloat16, float8_e4m3>(a);
}
void DecodeF16F16(const DecodeArgs& a) {
  Decode<float16, float16>(a);
}
void DecodeF16Int8(const DecodeArgs& a) {
  Decode<float16, std::int8_t>(a);
}
void DecodeF16E4m3(const DecodeArgs& a) {
  Decode<float16, float8_e4m3>(a);
}

}  // namespace tandem::optimized::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tandem::optimized {
HWY_EXPORT(DecodeF32Int8);
HWY_EXPORT(DecodeF32E4m3);
HWY_EXPORT(DecodeBf16Bf16);
HWY_EXPORT(DecodeBf16Int8);
HWY_EXPORT(DecodeBf16E4m3);
HWY_EXPORT(DecodeF16F16);
HWY_EXPORT(DecodeF16Int8);
HWY_EXPORT(DecodeF16E4m3);

namespace detail {
namespace {

/// The arguments every call shares: the sequences, the sinks widened, the
/// chunk (splitting only calls with few (sequence, query block) pairs and long
/// caches; Geometry::split_keys_chunk, when set, fixes it), the query block.
template <class T>
DecodeArgs common_args(const AttentionPlan& plan, const AttentionInputs<T>& in, T* out, float* lse,
                       const Options& options) {
  require_rounding(plan);
  DecodeArgs a;
  a.plan = &plan;
  a.q = in.q.data();
  a.mask = in.mask.empty() ? nullptr : in.mask.data();
  a.slopes = plan.alibi != AlibiKind::none ? in.alibi_slopes.data() : nullptr;
  if (plan.sinks) {
    for (const T& x : in.sinks) a.sinks.push_back(static_cast<float>(x));
  }
  a.block_q = std::max<std::int64_t>(1, kDecodeRows / plan.group());
  std::int64_t max_Sk = 0, qblocks = 0;
  for (std::int64_t n = 0; n < plan.sequences(); ++n) {
    a.seqs.push_back(plan.sequence(in, n));
    max_Sk = std::max(max_Sk, a.seqs.back().Sk);
    qblocks += (a.seqs.back().Sq + a.block_q - 1) / a.block_q;
  }
  const Geometry& geo = options.geometry;
  const std::int64_t chunk = geo.split_keys_chunk > 0 ? geo.split_keys_chunk : kDecodeChunk;
  const bool split = geo.split_keys_min_chunks > 0 && max_Sk >= geo.split_keys_min_chunks * chunk &&
                     (qblocks < kDecodeSplitBelow || geo.split_keys_chunk > 0);
  a.chunk = split ? chunk : std::max<std::int64_t>(1, max_Sk);
  a.out = out;
  a.lse = lse;
  a.threads = threads_of(options);
  return a;
}

}  // namespace

template <class T>
bool attention_decode_stored(const AttentionPlan& plan, const AttentionInputs<T>& in,
                             std::span<T> out, std::span<float> lse, const Options& options) {
  check_inputs(plan, in);
  require_size(out.size(), plan.o.extent, "out");
  if (!lse.empty()) require_size(lse.size(), plan.lse_size(), "lse");
  DecodeArgs a = common_args(plan, in, out.data(), lse.empty() ? nullptr : lse.data(), options);
  for (const AttentionSeq& s : a.seqs) {
    if (s.Sq > a.block_q) return false;  // not a decode step: more than one task's rows
  }
  a.k = in.k.data();
  a.v = in.v.data();
  if constexpr (std::is_same_v<T, bfloat16>) {
    HWY_DYNAMIC_DISPATCH(DecodeBf16Bf16)(a);
  } else {
    HWY_DYNAMIC_DISPATCH(DecodeF16F16)(a);
  }
  return true;
}

template <class T>
void attention_forward_quantized(const AttentionPlan& plan, const AttentionInputs<T>& in,
                                 const QuantizedKv& kv, std::span<T> out, const Options& options) {
  check_inputs(plan, in, kv);
  require_size(out.size(), plan.o.extent, "out");
  DecodeArgs a = common_args(plan, in, out.data(), nullptr, options);
  a.k = kv.k.data();
  a.v = kv.v.data();
  a.k_scale = kv.k_scale.data();
  a.v_scale = kv.v_scale.data();
  const bool int8 = plan.kv_cache == KvCache::int8;
  if constexpr (std::is_same_v<T, float>) {
    int8 ? HWY_DYNAMIC_DISPATCH(DecodeF32Int8)(a) : HWY_DYNAMIC_DISPATCH(DecodeF32E4m3)(a);
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    int8 ? HWY_DYNAMIC_DISPATCH(DecodeBf16Int8)(a) : HWY_DYNAMIC_DISPATCH(DecodeBf16E4m3)(a);
  } else {
    int8 ? HWY_DYNAMIC_DISPATCH(DecodeF16Int8)(a) : HWY_DYNAMIC_DISPATCH(DecodeF16E4m3)(a);
  }
}

template bool attention_decode_stored<bfloat16>(const AttentionPlan&,
                                                const AttentionInputs<bfloat16>&,
                                                std::span<bfloat16>, std::span<float>,
                                                const Options&);
template bool attention_decode_stored<float16>(const AttentionPlan&,
                                               const AttentionInputs<float16>&, std::span<float16>,
                                               std::span<float>, const Options&);
template void attention_forward_quantized<float>(const AttentionPlan&,
                                                 const AttentionInputs<float>&, const QuantizedKv&,
                                                 std::span<float>, const Options&);
template void attention_forward_quantized<bfloat16>(const AttentionPlan&,
                                                    const AttentionInputs<bfloat16>&,
                                                    const QuantizedKv&, std::span<bfloat16>,
                                                    const Options&);
template void attention_forward_quantized<float16>(const AttentionPlan&,
                                                   const AttentionInputs<float16>&,
                                                   const QuantizedKv&, std::span<float16>,
                                                   const Options&);

}  // namespace detail
}  // namespace tandem::optimized
#endif  // HWY_ONCE
