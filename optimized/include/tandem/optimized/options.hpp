// SPDX-License-Identifier: Apache-2.0
/// @file optimized/options.hpp
/// @brief The settings of the optimized backend: the threads of a call and
///        the attention's tile geometry. What the kernels of optimized/src
///        read; backend.hpp makes a Backend from them.
#pragma once

#include <cstdint>
#include <memory>

namespace tandem::optimized {

/// Which tiles of query rows the attention runs by the decode algorithm
/// (vectors along the head dimension: a dot product per key and row, the
/// rows of P as broadcasts) instead of the wide one (vectors across query
/// rows: the register-tiled micro-kernel).
enum class DecodeTiles {
  one_vector,  ///< calls whose tiles fit one SIMD vector of rows (decode steps)
  never,       ///< every tile wide, even one of a handful of rows
  always,      ///< every tile by the decode algorithm, however many rows
};

/// The block sizes of the optimized attention. They set the order of the
/// float operations, never the function computed: at every geometry the
/// results agree with the reference to float rounding and are bitwise the
/// same for any thread count. The defaults are the tuned ones; small
/// geometries make a case of a dozen keys cross every block boundary (tests).
/// Only rows_per_tile, from 64 rows up and in the forward, changes no bit of
/// any result (SPEC §11): it is the field `tandem tune` tunes per CPU
/// (tuning.hpp); every other field reorders float operations.
///
/// A tile holds the rows of one (batch, kv head, query block): the G = H/Hkv
/// query heads sharing a kv head times block_q queries, block_q =
/// max(1, rows_per_tile / G). Its keys are visited in blocks.
struct Geometry {
  /// Keys per block of a tile, in [1, 4096].
  std::int64_t key_block = 64;
  /// Keys per block where a causal or sliding-window edge runs through the
  /// tile (only some rows see such a block), in [1, key_block].
  std::int64_t edge_block = 16;
  /// Query rows a tile aims at (whole queries, at least one), in [1, 65536].
  std::int64_t rows_per_tile = 384;
  /// The same under causal and sliding-window masks (a smaller tile wastes
  /// less work on the diagonal), in [1, 65536].
  std::int64_t rows_per_tile_banded = 192;
  /// Which tiles take the decode algorithm.
  DecodeTiles decode_tiles = DecodeTiles::one_vector;

  ///@{
  /// Split-key decode (flash-decoding): a call whose tiles take the decode
  /// algorithm and whose keys make at least split_keys_min_chunks chunks of
  /// split_keys_chunk keys runs one task per (batch, key chunk) and merges
  /// the chunks' partial softmax sums in chunk order. split_keys_chunk = 0:
  /// about 1 MiB of K and V rows per chunk, key_block to 1024 keys; else in
  /// [1, 2^20]. split_keys_min_chunks in [0, 2^20]; 0 never splits. Where
  /// each kv head's K and V rows are contiguous (bhsd, or one kv head) the
  /// per-head tasks stream already: such calls split only with fewer than
  /// split_keys_contiguous_heads (batch, kv head) pairs (>= 0).
  /// split_keys_step in [1, 2^20]: keys per step of a task, each step
  /// visiting the tiles of every kv head: few, so that the kv heads' parts of
  /// a few K and V rows are read one after the other (all but sequential
  /// memory, which the hardware prefetchers follow).
  std::int64_t split_keys_chunk = 0;
  std::int64_t split_keys_min_chunks = 2;
  std::int64_t split_keys_contiguous_heads = 4;
  std::int64_t split_keys_step = 8;
  ///@}

  ///@{
  /// Backward query parts: with fewer than backward_min_tasks (batch, kv
  /// head) pairs, the query blocks of each are split into interleaved parts
  /// (enough for backward_min_tasks tasks, at most one per query block, dK
  /// and dV partials within 64 MiB) whose dK/dV partials are added in part
  /// order; backward_query_parts > 0 sets the parts instead (at most one per
  /// query block). backward_min_tasks in [1, 2^20], backward_query_parts in
  /// [0, 2^20].
  std::int64_t backward_min_tasks = 8;
  std::int64_t backward_query_parts = 0;
  ///@}

  /// Batch-invariant, deterministic inference (SPEC §12): a query row's out
  /// and lse (and a sequence's dq, dk, dv) are bitwise the same whatever
  /// else the call holds and however it is split: the Sq of the call
  /// (prefill, decode step, prefill chunk), the batch, packed or separate
  /// sequences, a paged or contiguous cache, split-key decisions, the other
  /// fields of this geometry and the thread count. The float operations
  /// then follow one fixed order: key blocks of kInvariantKeyBlock keys at
  /// multiples of it from each sequence's key 0, chunks of
  /// kInvariantChunk keys merged in chunk order, and dot products summed
  /// along d in order, in the wide and the decode tile alike; key_block,
  /// edge_block and backward_query_parts no longer apply.
  bool invariant = false;
};

/// Keys per block of the online softmax under Geometry::invariant.
inline constexpr std::int64_t kInvariantKeyBlock = 64;
/// Keys per chunk under Geometry::invariant: each row's keys are split at
/// multiples of it, each chunk's softmax sums formed alone and the chunks
/// merged in order (as a split-key decode merges them).
inline constexpr std::int64_t kInvariantChunk = 1024;

struct Tuning;  // tuning.hpp

/// Settings of the optimized backend.
struct Options {
  /// All cores, the default geometry.
  Options() = default;
  /// `threads_per_call` threads (0 = all cores) and the geometry `geo`.
  explicit Options(int threads_per_call, const Geometry& geo = {})
      : threads(threads_per_call), geometry(geo) {}

  int threads = 0;    ///< OpenMP threads per call; 0 = all cores (omp_get_max_threads)
  Geometry geometry;  ///< the attention's block sizes
  /// Per shape class, bit-neutral fields over `geometry` (tuning.hpp); null:
  /// the tuning TANDEM_TUNING names, when `tuning_from_environment`.
  std::shared_ptr<const Tuning> tuning;
  /// Whether a null `tuning` takes TANDEM_TUNING's (false: the geometry alone).
  bool tuning_from_environment = true;
};

}  // namespace tandem::optimized
