// SPDX-License-Identifier: Apache-2.0
/// @file flex_call.hpp
/// @brief One FlexAttention call as the optimized kernels see it (SPEC
///        §13.4): its float32 views, its tiles, and the kv blocks of each
///        query tile with their verdict (full or partial), found from the
///        block mask once per tile.
///
/// The query rows of one (b, h) are cut into tiles of at most kTileRows rows
/// that never cross a query block of the block mask, so the verdict of each
/// (tile, kv block) pair is that of its blocks; without a block mask the
/// blocks are virtual (kTileRows × kChunkKeys) and all partial. Keys are
/// visited in chunks of at most kChunkKeys keys inside one kv block.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "tandem/flex_plan.hpp"

namespace tandem::optimized::flex {

/// Query rows of one tile.
inline constexpr std::int64_t kTileRows = 16;
/// Keys of one chunk (the scores of a tile are kTileRows × kChunkKeys).
inline constexpr std::int64_t kChunkKeys = 64;

/// A kv block a query tile visits: its number and whether it is full
/// (mask_mod not evaluated) or partial.
struct KvBlock {
  std::int64_t kb = 0;  ///< the kv block
  bool full = false;    ///< full: every key visible
};

/// The call: plan, float32 views of q, k, v and the captured tensors, the
/// block mask's indices, and the tile grid.
struct Call {
  const FlexPlan* plan = nullptr;  ///< the validated plan
  const float* q = nullptr;        ///< `[B,H,Sq,D]`
  const float* k = nullptr;        ///< `[B,Hkv,Sk,D]`
  const float* v = nullptr;        ///< `[B,Hkv,Sk,Dv]`
  /// k transposed, `[B,Hkv,D,kt_stride]` (set by the kernel that packs it).
  const float* kt = nullptr;
  /// v transposed, `[B,Hkv,Dv,kt_stride]` (the backward's).
  const float* vt = nullptr;
  std::int64_t kt_stride = 0;  ///< the transposed rows' length: Sk plus a vector of zeros
  ModCaptures<float> score;    ///< the score_mod's tensors (real ones in float)
  ModCaptures<float> mask;     ///< the mask_mod's tensors
  FlexBlockMaskData blocks;    ///< the block mask's indices (with a block mask)
  std::int64_t B = 1, H = 1, Hkv = 1, G = 1, Sq = 1, Sk = 1, D = 1, Dv = 1;  ///< sizes
  float scale = 1.0f;                        ///< the plan's scale, in float
  std::int64_t q_block = kTileRows;          ///< query rows per block (the mask's, or kTileRows)
  std::int64_t kv_block = kChunkKeys;        ///< keys per block (the mask's, or kChunkKeys)
  std::int64_t q_blocks = 1, kv_blocks = 1;  ///< blocks along Sq and Sk
  std::int64_t tiles_per_block = 1;          ///< ceil(q_block / kTileRows)

  Call(const FlexPlan& p, const float* q_, const float* k_, const float* v_,
       ModCaptures<float> score_, ModCaptures<float> mask_, FlexBlockMaskData blocks_)
      : plan(&p),
        q(q_),
        k(k_),
        v(v_),
        score(std::move(score_)),
        mask(std::move(mask_)),
        blocks(blocks_) {
    const FlexParams& f = p.params();
    B = f.B, H = f.H, Hkv = f.Hkv, G = p.group(), Sq = f.Sq, Sk = f.Sk, D = f.D, Dv = f.Dv;
    scale = static_cast<float>(p.scale());
    if (f.block_mask) {
      q_block = f.block_mask->q_block;
      kv_block = f.block_mask->kv_block;
    }
    q_blocks = (Sq + q_block - 1) / q_block;
    kv_blocks = (Sk + kv_block - 1) / kv_block;
    tiles_per_block = (q_block + kTileRows - 1) / kTileRows;
  }

  /// Query tiles of one (b, h): q_blocks · tiles_per_block (some empty).
  [[nodiscard]] std::int64_t tiles() const { return q_blocks * tiles_per_block; }
  /// The rows [first, last) of tile `t` of one (b, h); first >= last: empty.
  [[nodiscard]] std::pair<std::int64_t, std::int64_t> tile_rows(std::int64_t t) const {
    const std::int64_t qb = t / tiles_per_block, sub = t % tiles_per_block;
    const std::int64_t first = qb * q_block + sub * kTileRows;
    const std::int64_t last = std::min({first + kTileRows, (qb + 1) * q_block, Sq});
    return {first, last};
  }

  /// The kv blocks tile `t` of (b, h) visits, in ascending order of kb: the
  /// block mask's full and partial blocks of its query block (row (b mod
  /// B', h mod H', qb)), or every block, partial, without a block mask.
  void kv_blocks_of(std::int64_t b, std::int64_t h, std::int64_t t,
                    std::vector<KvBlock>& out) const {
    out.clear();
    const auto& bm = plan->params().block_mask;
    if (!bm) {
      for (std::int64_t kb = 0; kb < kv_blocks; ++kb) out.push_back({kb, false});
      return;
    }
    const std::int64_t qb = t / tiles_per_block;
    const std::int64_t row = ((b % bm->B) * bm->H + h % bm->H) * q_blocks + qb;
    const auto add = [&](const Indices& num, const Indices& idx, std::int64_t width, bool full) {
      const std::int64_t n = num[static_cast<std::size_t>(row)];
      for (std::int64_t c = 0; c < n; ++c) {
        out.push_back({idx[static_cast<std::size_t>(row * width + c)], full});
      }
    };
    add(blocks.kv_num_blocks, blocks.kv_indices, bm->width, false);
    if (bm->has_full) add(blocks.full_kv_num_blocks, blocks.full_kv_indices, bm->full_width, true);
    std::sort(out.begin(), out.end(),
              [](const KvBlock& x, const KvBlock& y) { return x.kb < y.kb; });
  }
};

}  // namespace tandem::optimized::flex
