// SPDX-License-Identifier: Apache-2.0
// The optimized attention forward: FlashAttention-2 on the CPU, Highway SIMD
// (dynamic dispatch) and OpenMP over (batch, kv head, query block) tiles.
//
// Must agree with tandem::reference::attention_forward
// (reference/include/tandem/reference/attention.hpp) to float rounding. The
// order of operations differs on purpose:
//  - online softmax: the row max m and the row sum l are updated key block by
//    key block and the running output is rescaled by exp(m_old − m_new),
//    instead of one max, one sum and one weighted sum over all keys; no
//    [Sq, Sk] score matrix is ever formed (memory O(tile) per thread);
//  - tiling: <q_i, k_j> and Σ_j p_ij v_j are float fused multiply-add chains
//    in the micro-kernel's order (d, then j), where the reference sums in
//    double; exp is a polynomial on 2^f (attn::SoftmaxExp, ~1e-7 relative),
//    tanh and log are Highway's float approximations (≤ 4 ulp);
//  - the query heads of a GQA group share one pass over their K/V rows, and
//    key blocks that causal or sliding-window masks hide are never visited;
//  - decode steps with long caches split the keys into chunks (flash-decoding,
//    ForwardSplitKeys) and merge the chunks' partial softmax sums.
// The result of every tile depends only on the plan, never on the thread
// count or the schedule: bitwise identical for any number of threads.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention_forward.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <omp.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "attention_forward_tile-inl.h"

HWY_BEFORE_NAMESPACE();
namespace tandem::optimized::HWY_NAMESPACE {

/// Keys per step of a split-key task: each step visits every kv head.
constexpr std::int64_t kDecodeStep = 32;

/// Keys per chunk of the split-key (flash-decoding) forward, or 0 when the
/// call does not take it. Only narrow tiles (a decode step: the few query rows
/// of a group fit one vector) with long caches do: there one task per
/// (batch, kv head) would read a head-wide slice of every K and V row
/// (strided, and only B·Hkv tasks), while one task per (batch, key chunk)
/// reads whole rows one after the other. Where a head's rows are contiguous
/// (bhsd) the per-head tasks stream already and only calls with few of them
/// split. The chunk depends on the shape alone, never on the thread count:
/// about 1 MiB of K and V rows per chunk (64 to 1024 keys), at least two.
std::int64_t SplitKeysChunk(const attn::Call& c) {
  const AttentionPlan& p = *c.plan;
  if (c.max_rows_p != Lanes()) return 0;
  const std::int64_t bytes_per_key = 4 * p.Hkv * (p.D + p.Dv);
  std::int64_t chunk = attn::kKeyBlock;
  while (chunk < 1024 && 2 * chunk * bytes_per_key <= (std::int64_t{1} << 20)) chunk *= 2;
  if (p.Sk < 2 * chunk) return 0;
  // Where each head's rows are contiguous (bhsd, or a single kv head) the
  // per-head tasks already stream; split there only for want of tasks.
  const bool interleaved = p.k.seq != p.D || p.v.seq != p.Dv;
  return interleaved || p.B * p.Hkv < 4 ? chunk : 0;
}

/// The split-key forward: every (batch, key chunk) task computes, for each
/// query row (b, h, i), the row max m, the sum l of exp(s − m) and the
/// unnormalized output over the visible keys of its chunk; the partials of a
/// row are then merged in chunk order (m = max m_c, l = Σ l_c·e^(m_c − m),
/// o = Σ o_c·e^(m_c − m), out = o / l). Each partial depends on the plan and
/// the chunk only, and the merge order is fixed: bitwise identical for any
/// number of threads.
void ForwardSplitKeys(const attn::Call& c, std::int64_t chunk, float* o, float* lse_out,
                      int threads) {
  namespace hn = hwy::HWY_NAMESPACE;
  const AttentionPlan& plan = *c.plan;
  const DF d;
  const std::int64_t N = Lanes();
  const std::int64_t Dp = RoundUp(plan.D, N), Dvp = RoundUp(plan.Dv, N);
  const std::int64_t n_chunks = (plan.Sk + chunk - 1) / chunk;
  const std::int64_t n_rows = plan.B * plan.H * plan.Sq;  // row (b·H + h)·Sq + i
  // One record per (chunk, row): o[0 .. Dvp), then m, l.
  const std::int64_t rec = Dvp + 2;
  const std::int64_t n_tasks = plan.B * n_chunks;
  const int nt =
      static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(threads, n_tasks)));
  // Every record is written before the merge reads it: no zero fill.
  const Buffer part(n_chunks * n_rows * rec, Buffer::Init::uninitialized);
  // Per thread: the scratch and the running state of every tile of a task.
  const std::int64_t n_tiles = plan.Hkv * c.n_qblocks;
  struct Mine {
    std::vector<std::unique_ptr<attn::ForwardScratch>> scratch;
    std::vector<std::optional<attn::TileForward>> tiles;
  };
  std::vector<Mine> mine(static_cast<std::size_t>(nt));
  for (Mine& m : mine) {
    for (std::int64_t i = 0; i < n_tiles; ++i)
      m.scratch.push_back(std::make_unique<attn::ForwardScratch>(c, true));
    m.tiles = std::vector<std::optional<attn::TileForward>>(static_cast<std::size_t>(n_tiles));
  }
#pragma omp parallel num_threads(nt)
  {
    Mine& my = mine[static_cast<std::size_t>(omp_get_thread_num())];
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t task = 0; task < n_tasks; ++task) {
      const std::int64_t b = task / n_chunks, ch = task % n_chunks;
      const std::int64_t k0 = ch * chunk, k1 = std::min(plan.Sk, k0 + chunk);
      for (std::int64_t g = 0; g < plan.Hkv; ++g) {
        for (std::int64_t qb = 0; qb < c.n_qblocks; ++qb) {
          const auto at = static_cast<std::size_t>(g * c.n_qblocks + qb);
          attn::ForwardScratch& s = *my.scratch[at];
          attn::Tile t(c, b, g, qb);
          t.ClipKeys(k0, k1);
          t.pf_ahead = kDecodeStep;  // the same head's rows, one step ahead
          float* Qn = s.Qn.get();
          for (std::int64_t r = 0; r < t.rows; ++r) {
            const float* src = c.q + plan.q.at(b, t.query(r, c.G), t.head(r, c.G));
            std::copy(src, src + plan.D, Qn + r * Dp);
            std::fill(Qn + r * Dp + plan.D, Qn + (r + 1) * Dp, 0.0f);
          }
          my.tiles[at].emplace(c, t, s, true, true);
        }
      }
      // Step by step through the chunk, every kv head in turn: whole K and V
      // rows are read one after the other.
      for (std::int64_t j = k0; j < k1; j += kDecodeStep) {
        for (auto& tile : my.tiles) tile->Run(j, std::min(k1, j + kDecodeStep));
      }
      for (std::size_t at = 0; at < my.tiles.size(); ++at) {
        const attn::Tile& t = my.tiles[at]->tile();
        const attn::ForwardScratch& s = *my.scratch[at];
        for (std::int64_t r = 0; r < t.rows; ++r) {
          const std::int64_t row = (b * plan.H + t.head(r, c.G)) * plan.Sq + t.query(r, c.G);
          float* dst = part.get() + (ch * n_rows + row) * rec;
          std::copy(s.On.get() + r * Dvp, s.On.get() + (r + 1) * Dvp, dst);
          dst[Dvp] = s.m.get()[r];
          dst[Dvp + 1] = s.l.get()[r];
        }
        my.tiles[at].reset();
      }
    }
    // Merge (the implicit barrier above: every partial is written).
    float* acc = my.scratch[0]->On.get();  // N·Dvp floats, free again
    const float neg_inf = -std::numeric_limits<float>::infinity();
#pragma omp for schedule(static)
    for (std::int64_t row = 0; row < n_rows; ++row) {
      // A NaN max (a NaN score) comes with a NaN sum, which reaches l below.
      float m = neg_inf;
      for (std::int64_t ch = 0; ch < n_chunks; ++ch) {
        const float mc = part.get()[(ch * n_rows + row) * rec + Dvp];
        if (mc > m) m = mc;
      }
      // No visible key anywhere: subtract 0, never form −inf − (−inf).
      const float m_use = m == neg_inf ? 0.0f : m;
      float l = 0.0f;
      std::fill(acc, acc + Dvp, 0.0f);
      for (std::int64_t ch = 0; ch < n_chunks; ++ch) {
        const float* src = part.get() + (ch * n_rows + row) * rec;
        const float mc = src[Dvp], lc = src[Dvp + 1];
        if (lc == 0.0f && mc == neg_inf) continue;  // the chunk saw no key of the row
        const VF w = attn::SoftmaxExp(d, hn::Set(d, mc - m_use));
        l += lc * hn::GetLane(w);
        for (std::int64_t x = 0; x < Dvp; x += N) {
          hn::Store(hn::MulAdd(hn::LoadU(d, src + x), w, hn::Load(d, acc + x)), d, acc + x);
        }
      }
      const std::int64_t b = row / (plan.H * plan.Sq), h = row / plan.Sq % plan.H,
                         i = row % plan.Sq;
      // l = 0: no visible key, output 0; l = NaN counts as seen (NaN).
      const float inv = l != 0.0f ? 1.0f / l : 0.0f;
      float* dst = o + plan.o.at(b, i, h);
      for (std::int64_t dv = 0; dv < plan.Dv; ++dv) dst[dv] = acc[dv] * inv;
      if (lse_out != nullptr) {
        float lse = l == 0.0f ? neg_inf : l;  // NaN stays NaN
        if (l > 0.0f) lse = m + hn::GetLane(hn::Log(d, hn::Set(d, l)));
        lse_out[row] = lse;
      }
    }
  }
}

/// out (and lse when non-empty) for every (b, h, i): one OpenMP task per
/// (batch, kv head, query block) tile, or per (batch, key chunk) for decode
/// steps with long caches (ForwardSplitKeys).
void AttentionForwardTarget(const AttentionPlan& plan, const AttentionInputs<float>& in,
                            std::span<float> out, std::span<float> lse, int threads) {
  const attn::Call c(plan, in);
  if (const std::int64_t chunk = SplitKeysChunk(c); chunk > 0) {
    ForwardSplitKeys(c, chunk, out.data(), lse.empty() ? nullptr : lse.data(), threads);
    return;
  }
  const std::int64_t n_tiles = plan.B * plan.Hkv * c.n_qblocks;
  const int nt =
      static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(threads, n_tiles)));
  float* o = out.data();
  float* lse_out = lse.empty() ? nullptr : lse.data();
  // Scratch for every thread, allocated before any output is written (an
  // allocation failure is an exception here, not inside the parallel region).
  struct Scratch {
    attn::ForwardScratch tile;
    Buffer inv, lse_rows;
    explicit Scratch(const attn::Call& call)
        : tile(call), inv(call.max_rows_p), lse_rows(call.max_rows_p) {}
  };
  std::vector<std::unique_ptr<Scratch>> scratch;
  for (int i = 0; i < nt; ++i) scratch.push_back(std::make_unique<Scratch>(c));
#pragma omp parallel num_threads(nt)
  {
    Scratch& mine = *scratch[static_cast<std::size_t>(omp_get_thread_num())];
    attn::ForwardScratch& s = mine.tile;
    Buffer& inv = mine.inv;
    Buffer& lse_rows = mine.lse_rows;
    // Tiles are independent and each is computed by one thread alone, so
    // dynamic scheduling (which balances causal tiles) cannot change results.
    // Under a causal mask the last query blocks see the most keys: they are
    // handed out first, so that the small ones fill in at the end.
    const bool last_first = plan.mask == MaskKind::causal;
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t task = 0; task < n_tiles; ++task) {
      const std::int64_t qb =
          last_first ? c.n_qblocks - 1 - task % c.n_qblocks : task % c.n_qblocks;
      const std::int64_t g = task / c.n_qblocks % plan.Hkv;
      const std::int64_t b = task / c.n_qblocks / plan.Hkv;
      const attn::Tile t(c, b, g, qb);
      attn::PackQueriesTransposed(c, t, s.Qt.get());
      attn::ForwardTile(c, t, s, true);
      attn::FinishRows(t, s, inv.get(), lse_out != nullptr ? lse_rows.get() : nullptr);
      // O <- diag(1/l)·O, written back in the layout of q
      const float* Ot = s.Ot.get();
      for (std::int64_t r = 0; r < t.rows; ++r) {
        const std::int64_t i = t.query(r, c.G), h = t.head(r, c.G);
        float* dst = o + plan.o.at(b, i, h);
        const float w = inv.get()[r];
        for (std::int64_t dv = 0; dv < plan.Dv; ++dv) dst[dv] = Ot[dv * t.rows_p + r] * w;
        if (lse_out != nullptr) lse_out[(b * plan.H + h) * plan.Sq + i] = lse_rows.get()[r];
      }
    }
  }
}

}  // namespace tandem::optimized::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "attention.hpp"

namespace tandem::optimized {
HWY_EXPORT(AttentionForwardTarget);

namespace detail {

void attention_forward(const AttentionPlan& plan, const AttentionInputs<float>& in,
                       std::span<float> out, std::span<float> lse, int threads) {
  check_inputs(plan, in);
  require_size(out.size(), plan.o.extent, "out");
  if (!lse.empty()) {
    require_size(lse.size(), checked_mul(checked_mul(plan.B, plan.H, "lse"), plan.Sq, "lse"),
                 "lse");
  }
  if (threads <= 0) threads = omp_get_max_threads();
  HWY_DYNAMIC_DISPATCH(AttentionForwardTarget)(plan, in, out, lse, threads);
}

}  // namespace detail
}  // namespace tandem::optimized
#endif  // HWY_ONCE
