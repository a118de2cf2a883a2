// SPDX-License-Identifier: Apache-2.0
/// @file attention_plan.hpp
/// @brief The attention plan: sizes, layout, mask, scale, softcap, sinks,
///        ALiBi, packed sequences and paged caches of one scaled dot-product
///        attention call, validated once by make() (SPEC §1.4, §2, §8).
///
/// For each sequence n (a batch entry, a packed sequence or a paged cache
/// row), query head h (kv head g = h / (H/Hkv)), query i and key j of that
/// sequence (Sq_n queries, Sk_n keys):
/// @f[ s_{ij} = \mathrm{scale}\,\langle q_i, k_j\rangle,\quad
///     s_{ij} \leftarrow c\tanh(s_{ij}/c)\ (c>0),\quad
///     s_{ij} \leftarrow s_{ij} - m_h\,\lvert i + Sk_n - Sq_n - j\rvert\ (\text{ALiBi}),\quad
///     s_{ij} \leftarrow s_{ij} + \mathrm{bias}_{ij}, @f]
/// @f[ p_{ij} = \frac{e^{s_{ij}}}{[e^{\mathrm{sink}_h}] + \sum_{\text{visible } j'}
/// e^{s_{ij'}}},\qquad
///     o_i = \sum_{\text{visible } j} p_{ij} v_j . @f]
/// q `[B,Sq,H,D]`, k `[B,Sk,Hkv,D]`, v `[B,Sk,Hkv,Dv]`, out `[B,Sq,H,Dv]`
/// (shown in `bshd`; `bhsd` swaps the S and H axes). Packed sequences
/// (SPEC §2.9) are the `bshd` case B = 1, Sq = total_q, Sk = total_k; a paged
/// cache (SPEC §2.10) holds k and v as `[num_blocks, block_size, Hkv, D]`.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tandem/error.hpp"
#include "tandem/indices.hpp"
#include "tandem/rounding.hpp"
#include "tandem/shape.hpp"

namespace tandem {

/// Which keys a query sees (SPEC §2). With `a = q_offset + i`,
/// `q_offset = max(Sk − Sq, 0)` (bottom-right alignment):
enum class MaskKind {
  none,            ///< every key
  causal,          ///< j <= a
  sliding_window,  ///< a − w <= j <= a  (at most w + 1 keys)
  key_padding,     ///< keep[b, j] != 0, keep `[B, Sk]`
  bias,            ///< additive bias `[Bb, Hb, Sq, Sk]`; −inf hides the key
};

/// "none", "causal", "sliding_window", "key_padding" or "bias".
inline const char* to_string(MaskKind kind) {
  switch (kind) {
    case MaskKind::none:
      return "none";
    case MaskKind::causal:
      return "causal";
    case MaskKind::sliding_window:
      return "sliding_window";
    case MaskKind::key_padding:
      return "key_padding";
    case MaskKind::bias:
      return "bias";
  }
  return "?";
}

/// Which ALiBi slopes a call takes (SPEC §2.8): the score of query i and key j
/// of a sequence gains `−m · abs(i + Sk − Sq − j)`.
enum class AlibiKind {
  none,            ///< no ALiBi
  per_head,        ///< slopes `[H]`: m = slopes[h]
  per_batch_head,  ///< slopes `[n, H]`: m = slopes[n·H + h], n the sequence (batch entry)
};

/// "none", "per_head" or "per_batch_head".
inline const char* to_string(AlibiKind kind) {
  switch (kind) {
    case AlibiKind::none:
      return "none";
    case AlibiKind::per_head:
      return "per_head";
    case AlibiKind::per_batch_head:
      return "per_batch_head";
  }
  return "?";
}

/// The standard ALiBi slopes of `heads` heads (Press et al.; what BLOOM and
/// MPT use), SPEC §2.8: with n = 2^floor(log2 H) the largest power of two
/// <= H, slope_h = 2^(−8(h+1)/n) for h < n, then the odd terms
/// 2^(−4(2i+1)/n), i = 0 … H−n−1, of the 2n-head sequence for the rest.
/// Returns `[H]`. Throws Error unless heads >= 1.
inline std::vector<float> alibi_standard_slopes(std::int64_t heads) {
  require(heads >= 1, "num_heads", heads, "must be >= 1");
  std::int64_t n = 1;
  while (2 * n <= heads) n *= 2;
  std::vector<float> slopes;
  slopes.reserve(static_cast<std::size_t>(heads));
  for (std::int64_t h = 0; h < n; ++h) {
    slopes.push_back(static_cast<float>(std::exp2(-8.0 * double(h + 1) / double(n))));
  }
  for (std::int64_t i = 0; i < heads - n; ++i) {
    slopes.push_back(static_cast<float>(std::exp2(-4.0 * double(2 * i + 1) / double(n))));
  }
  return slopes;
}

/// How the keys and values of an attention call are stored (SPEC §10.4).
enum class KvCache {
  plain,  ///< k and v in the call's storage type T, like q
  int8,   ///< int8 codes with one float32 scale per (key row, kv head): k = scale·code
  e4m3,   ///< float8 e4m3fn codes with one float32 scale per kv head: k = scale·code
};

/// "plain", "int8", "e4m3".
constexpr const char* to_string(KvCache c) {
  switch (c) {
    case KvCache::plain:
      return "plain";
    case KvCache::int8:
      return "int8";
    case KvCache::e4m3:
      return "e4m3";
  }
  return "?";
}

/// Explicit parameters of an attention call; AttentionPlan::make validates
/// them. Zero means "the default" where noted.
struct AttentionParams {
  ///@{
  /// Sizes in SPEC's symbols, as the plan has them: B batch, Sq query length, Sk key length, H
  /// query heads, Hkv kv heads (divides H; 0 means H), D q/k head width, Dv v/out head width
  /// (0 means D).
  std::int64_t B = 1, Sq = 0, Sk = 0, H = 0, Hkv = 0, D = 0, Dv = 0;
  ///@}
  Layout layout = Layout::bshd;    ///< memory layout of q, k, v, out and the gradients (SPEC §1)
  MaskKind mask = MaskKind::none;  ///< which keys each query sees (SPEC §2)
  std::int64_t window = 0;         ///< w of sliding_window
  std::optional<double> scale;     ///< defaults to 1/sqrt(D)
  double softcap = 0.0;            ///< c; 0 disables the cap
  std::int64_t q_row_stride = 0;   ///< bshd row stride of q; 0 = H*D
  std::int64_t k_row_stride = 0;   ///< bshd row stride of k; 0 = Hkv*D
  std::int64_t v_row_stride = 0;   ///< bshd row stride of v; 0 = Hkv*Dv
  std::int64_t bias_batch = 1;     ///< Bb ∈ {1, B} of a bias mask
  std::int64_t bias_heads = 1;     ///< Hb ∈ {1, H} of a bias mask
  bool sinks = false;              ///< a learned logit sinks[h] joins every softmax (SPEC §2.7)
  AlibiKind alibi = AlibiKind::none;  ///< ALiBi slopes `[H]` or `[n, H]` (SPEC §2.8)
  /// Packed sequences (SPEC §2.9): n >= 1 sequences packed along the token
  /// axis of q `[total_q, H, D]` and k, v `[total_k, Hkv, D or Dv]`, with B = 1,
  /// Sq = total_q, Sk = total_k; 0 = not packed.
  std::int64_t num_seqs = 0;
  ///@{
  /// A paged KV cache (SPEC §2.10): k and v are `[num_blocks, block_size, Hkv, D or Dv]`
  /// and each batch entry reads its keys through a block table `[B, max_blocks]`;
  /// all three 0 = not paged (then Sk is 0 or max_blocks·block_size).
  std::int64_t num_blocks = 0, block_size = 0, max_blocks = 0;
  ///@}
  /// Where a low-precision call rounds between its inputs and its outputs
  /// (SPEC §10.2); float32 and float64 calls round nowhere in between.
  Rounding rounding = kRoundingPytorch;
  /// How k and v are stored: plain (type T, like q) or as 8-bit codes with
  /// scales, read by attention_forward_quantized (SPEC §10.4).
  KvCache kv_cache = KvCache::plain;
};

/// Where key j of a sequence lives: the (batch, seq) index of k and v through
/// the plan's Strides (`plan.k.at(row.batch, row.seq, g)`). For a paged
/// cache, batch is the block and seq the slot in it.
struct KeyRow {
  std::int64_t batch = 0;  ///< batch entry, or block of a paged cache
  std::int64_t seq = 0;    ///< position along the S axis of k and v (slot of a block)
};

/// One sequence of an attention call — a batch entry, a packed sequence or
/// one row of a paged cache — resolved by AttentionPlan::sequence, the one
/// place that reads cu_seqlens, seqused_k, block tables and cache lengths.
/// Query i (0 <= i < Sq) of the sequence is row (b, q_row(i)) of q, out, dout
/// and dq and entry (b, h, q_row(i)) of lse; key j (0 <= j < Sk) is
/// key_row(j) of k, v, dk and dv.
struct AttentionSeq {
  std::int64_t n = 0;           ///< index of the sequence (row n of `[n, H]` ALiBi slopes)
  std::int64_t b = 0;           ///< batch index of its query rows (0 for packed sequences)
  std::int64_t q_start = 0;     ///< its first query row (cu_seqlens_q[n]; 0 unless packed)
  std::int64_t Sq = 0;          ///< its number of queries
  std::int64_t Sk = 0;          ///< its number of keys (seqused_k[n] or its slot; cache_seqlens[b])
  std::int64_t k_start = 0;     ///< its first key row (cu_seqlens_k[n]; 0 unless packed)
  std::int64_t block_size = 0;  ///< keys per block of a paged cache (0 otherwise)
  Indices blocks;               ///< its row of the block table (paged only)
  /// The position of its key 0 in the whole sequence (key_origin[n], else 0): where the
  /// invariant order counts its blocks and chunks from (SPEC §12.2); no value depends on it.
  std::int64_t key_origin = 0;

  /// max(Sk − Sq, 0): query i sits at key position q_offset + i (masks, SPEC §2).
  [[nodiscard]] std::int64_t q_offset() const { return Sk > Sq ? Sk - Sq : 0; }
  /// Sk − Sq: ALiBi's distance of query i to key j is abs(i + alibi_shift − j) (SPEC §2.8).
  [[nodiscard]] std::int64_t alibi_shift() const { return Sk - Sq; }
  /// The row of query i along q's S axis.
  [[nodiscard]] std::int64_t q_row(std::int64_t i) const { return q_start + i; }
  /// Where key j lives: (b, k_start + j), or for a paged cache
  /// (block_table[b, j / block_size], j % block_size).
  [[nodiscard]] KeyRow key_row(std::int64_t j) const {
    if (block_size > 0) {
      return {blocks[static_cast<std::size_t>(j / block_size)], j % block_size};
    }
    return {b, k_start + j};
  }
};

template <class T>
struct AttentionInputs;  // attention_views.hpp
struct AttentionAttrs;   // attention_shapes.hpp
struct AttentionShapes;  // attention_shapes.hpp
struct AttentionNames;   // attention_shapes.hpp

/// One attention call, validated. Kernels read sizes and the strides of
/// every tensor from here and nowhere else.
struct AttentionPlan {
  ///@{
  /// Sizes in SPEC's symbols: B batch, Sq query length, Sk key length, H query heads, Hkv kv heads
  /// (divides H), D q/k head width, Dv v/out head width.
  std::int64_t B = 0, Sq = 0, Sk = 0, H = 0, Hkv = 0, D = 0, Dv = 0;
  ///@}
  Layout layout = Layout::bshd;    ///< layout of every tensor of the call (SPEC §1)
  MaskKind mask = MaskKind::none;  ///< which keys each query sees (SPEC §2)
  std::int64_t window = 0;         ///< w of sliding_window (0 for the other mask kinds)
  double scale = 0.0;              ///< resolved: never absent
  double softcap = 0.0;            ///< 0 = no cap
  ///@{
  /// Bb ∈ {1, B} and Hb ∈ {1, H}: the broadcast shape `[Bb, Hb, Sq, Sk]` of a bias mask (1 and 1
  /// otherwise).
  std::int64_t bias_batch = 1, bias_heads = 1;
  ///@}
  bool sinks = false;                 ///< sinks `[H]` join every softmax (SPEC §2.7)
  AlibiKind alibi = AlibiKind::none;  ///< ALiBi slopes `[H]` or `[n, H]` (SPEC §2.8)
  std::int64_t num_seqs = 0;          ///< packed sequences (B = 1); 0 = not packed (SPEC §2.9)
  ///@{
  /// Paged cache `[num_blocks, block_size, Hkv, D]` read through a block table
  /// `[B, max_blocks]`; 0 = not paged (SPEC §2.10). Sk = max_blocks·block_size then.
  std::int64_t num_blocks = 0, block_size = 0, max_blocks = 0;
  ///@}
  Rounding rounding = kRoundingPytorch;  ///< rounding points of a low-precision call (SPEC §10.2)
  KvCache kv_cache = KvCache::plain;     ///< how k and v are stored (SPEC §10.4)

  ///@{
  Strides q, k, v;  ///< inputs, possibly with row strides (bshd)
  ///@}
  Strides o;  ///< out and dout: contiguous, layout of q
  ///@{
  Strides dq, dk, dv;  ///< gradients: contiguous, shapes of q, k, v
  ///@}

  /// H / Hkv: query heads per kv head.
  [[nodiscard]] std::int64_t group() const { return H / Hkv; }
  /// The kv head that query head h reads: h / (H/Hkv) (contiguous groups).
  [[nodiscard]] std::int64_t kv_head(std::int64_t h) const { return h / group(); }
  /// max(Sk − Sq, 0): query i sits at key position q_offset + i.
  [[nodiscard]] std::int64_t q_offset() const { return Sk > Sq ? Sk - Sq : 0; }
  /// Number of mask elements the call takes: B·Sk, Bb·Hb·Sq·Sk, or 0.
  [[nodiscard]] std::int64_t mask_size() const;
  /// Offset of mask element (b, h, i, 0): the keep row of b, or the bias row.
  [[nodiscard]] std::int64_t mask_row(std::int64_t b, std::int64_t h, std::int64_t i) const;
  /// Number of log-sum-exp values a forward saves: B·H·Sq, one per query row
  /// (no overflow: make() checked the larger B·Sq·H·D).
  [[nodiscard]] std::int64_t lse_size() const { return B * H * Sq; }
  /// Offset of lse(b, h, i) in the contiguous `[B, H, Sq]` log-sum-exp.
  [[nodiscard]] std::int64_t lse_at(std::int64_t b, std::int64_t h, std::int64_t i) const {
    return (b * H + h) * Sq + i;
  }
  /// True for packed variable-length sequences (varlen, SPEC §2.9).
  [[nodiscard]] bool varlen() const { return num_seqs > 0; }
  /// True for a paged KV cache (SPEC §2.10).
  [[nodiscard]] bool paged() const { return num_blocks > 0; }
  /// Number of sequences the call attends over: num_seqs when packed, else B.
  [[nodiscard]] std::int64_t sequences() const { return varlen() ? num_seqs : B; }
  ///@{
  /// The outer dims `[B', S']` of k and v (and dk, dv): `[B, Sk]`, or
  /// `[num_blocks, block_size]` for a paged cache.
  /// The scales of a quantized cache (SPEC §10.4): B'·S'·Hkv for int8 (one per key row and kv
  /// head of k's `[B', S', Hkv, D]`, B' = kv_batch(), S' = kv_seq()), Hkv for e4m3, 0 for plain.
  [[nodiscard]] std::int64_t kv_scale_size() const {
    if (kv_cache == KvCache::plain) return 0;
    return kv_cache == KvCache::e4m3 ? Hkv : kv_batch() * kv_seq() * Hkv;
  }
  /// Where the scale of key row (b, s) of kv head g lives: `[B', S', Hkv]` row-major for int8
  /// (whatever the layout), g for e4m3.
  [[nodiscard]] std::int64_t kv_scale_at(std::int64_t b, std::int64_t s, std::int64_t g) const {
    return kv_cache == KvCache::e4m3 ? g : (b * kv_seq() + s) * Hkv + g;
  }
  [[nodiscard]] std::int64_t kv_batch() const { return paged() ? num_blocks : B; }
  [[nodiscard]] std::int64_t kv_seq() const { return paged() ? block_size : Sk; }
  ///@}
  /// Number of ALiBi slopes the call takes: 0, H or sequences()·H.
  [[nodiscard]] std::int64_t slopes_size() const {
    return alibi == AlibiKind::none ? 0 : alibi == AlibiKind::per_head ? H : sequences() * H;
  }
  /// Offset of the ALiBi slope of sequence n, head h.
  [[nodiscard]] std::int64_t slope_at(std::int64_t n, std::int64_t h) const {
    return alibi == AlibiKind::per_batch_head ? n * H + h : h;
  }
  /// Sequence n (0 <= n < sequences()) of a call whose inputs `in` passed
  /// check_inputs: its query rows, key rows and lengths (see AttentionSeq).
  /// A dense call gives (b = n, Sq, Sk); the one helper every backend, test
  /// and tool uses to find a sequence's rows.
  template <class T>
  [[nodiscard]] AttentionSeq sequence(const AttentionInputs<T>& in, std::int64_t n) const;

  /// Validates `p` by SPEC §8 — the only place that does — and derives strides.
  static AttentionPlan make(const AttentionParams& p);

  /// Applies the shape rules of SPEC §1 to q, k, v (and the mask, when the
  /// mask kind takes one), then make(). An ambiguous rank-4 layout is an error.
  /// Defined in attention_shapes.hpp, with the attrs and shapes it takes.
  static AttentionPlan from_shapes(const Shape& q, const Shape& k, const Shape& v,
                                   const std::optional<Shape>& mask, const AttentionAttrs& a);

  /// As above, with the shapes of the feature inputs (SPEC §2.7–2.10), whose
  /// presence turns the features on: packed q `[total_q, H, D]` (or
  /// `[total_q, H·D]`) with cu_seqlens; a paged k `[num_blocks, block_size,
  /// Hkv, D]` with q `[B, Sq, H, D]` and a block table.
  static AttentionPlan from_shapes(const AttentionShapes& s, const AttentionAttrs& a);

  /// As above, naming the inputs in errors by the caller's names (SPEC §8).
  static AttentionPlan from_shapes(const AttentionShapes& s, const AttentionAttrs& a,
                                   const AttentionNames& names);

  /// "B=1 Sq=4 Sk=6 H=4 Hkv=2 D=8 Dv=8 bshd causal scale=0.3536 ..." for
  /// messages and counterexamples.
  [[nodiscard]] std::string describe() const;
};

// ---------------------------------------------------------------------------
// Implementation

inline std::int64_t AttentionPlan::mask_size() const {
  switch (mask) {
    case MaskKind::key_padding:
      return B * Sk;
    case MaskKind::bias:
      return bias_batch * bias_heads * Sq * Sk;
    default:
      return 0;
  }
}

inline std::int64_t AttentionPlan::mask_row(std::int64_t b, std::int64_t h, std::int64_t i) const {
  if (mask == MaskKind::key_padding) return b * Sk;
  const std::int64_t bb = bias_batch == 1 ? 0 : b;
  const std::int64_t hb = bias_heads == 1 ? 0 : h;
  return ((bb * bias_heads + hb) * Sq + i) * Sk;
}

namespace detail {

/// The feature rules of make() (SPEC §2.9–2.10): packed sequences are a
/// batch of 1 (bshd `[total, H, D]` or bhsd `[H, total, D]`), a paged cache is a bshd batch read
/// through a block table, the two do not combine, and neither takes a key_padding or bias mask (a
/// padded or biased key is addressed by position, which neither has).
/// Returns the key length Sk of the plan.
inline std::int64_t check_feature_params(const AttentionParams& p) {
  require(p.num_seqs >= 0, "num_seqs", p.num_seqs, "must be >= 0 (0: not packed)");
  const bool packed = p.num_seqs > 0;
  const bool paged = p.num_blocks != 0 || p.block_size != 0 || p.max_blocks != 0;
  const auto mask_ok = [&](const char* feature) {
    require(p.mask == MaskKind::none || p.mask == MaskKind::causal ||
                p.mask == MaskKind::sliding_window,
            "mask", to_string(p.mask),
            std::string("must be none, causal or sliding_window with ") + feature);
  };
  if (packed) {
    require(!paged, "num_blocks", p.num_blocks,
            "must be 0 with packed sequences (num_seqs = " + std::to_string(p.num_seqs) +
                "): a paged cache and packed sequences do not combine");
    require(p.B == 1, "B", p.B,
            "must be 1 with packed sequences (num_seqs = " + std::to_string(p.num_seqs) +
                "): q is [total_q, H, D]");
    mask_ok("packed sequences (cu_seqlens)");
  }
  if (!paged) {
    require(p.Sk >= 1, "Sk", p.Sk, "must be >= 1");
    return p.Sk;
  }
  require(p.num_blocks >= 1, "num_blocks", p.num_blocks, "must be >= 1 for a paged cache");
  require(p.block_size >= 1, "block_size", p.block_size, "must be >= 1 for a paged cache");
  require(p.max_blocks >= 1, "max_blocks", p.max_blocks, "must be >= 1 for a paged cache");
  require(p.layout == Layout::bshd, "layout", to_string(p.layout),
          "must be bshd with a paged cache (k [num_blocks, block_size, Hkv, D])");
  mask_ok("a paged cache (block_table)");
  const std::int64_t capacity = checked_mul(p.max_blocks, p.block_size, "max_blocks*block_size");
  checked_mul(p.B, p.max_blocks, "block_table");
  require(
      p.Sk == 0 || p.Sk == capacity, "Sk", p.Sk,
      "must be 0 or max_blocks*block_size = " + std::to_string(capacity) + " for a paged cache");
  return capacity;
}

}  // namespace detail

inline AttentionPlan AttentionPlan::make(const AttentionParams& p) {
  require(p.B >= 1, "B", p.B, "must be >= 1");
  require(p.Sq >= 1, "Sq", p.Sq, "must be >= 1");
  const std::int64_t Sk = detail::check_feature_params(p);
  require(p.H >= 1, "H", p.H, "must be >= 1");
  const std::int64_t Hkv = p.Hkv == 0 ? p.H : p.Hkv;
  require(Hkv >= 1 && p.H % Hkv == 0, "Hkv", Hkv, "must divide H = " + std::to_string(p.H));
  require(p.D >= 1, "D", p.D, "must be >= 1");
  const std::int64_t Dv = p.Dv == 0 ? p.D : p.Dv;
  require(Dv >= 1, "Dv", Dv, "must be >= 1");
  if (p.mask == MaskKind::sliding_window) {
    require(p.window >= 0, "window", p.window, "must be >= 0");
  } else {
    require(p.window == 0, "window", p.window,
            std::string("must be 0 (only mask sliding_window takes a window; mask is ") +
                to_string(p.mask) + ")");
  }
  const double scale = p.scale ? *p.scale : 1.0 / std::sqrt(static_cast<double>(p.D));
  require(std::isfinite(scale) && scale != 0.0, "scale", std::to_string(scale),
          "must be finite and non-zero");
  require(std::isfinite(p.softcap) && p.softcap >= 0.0, "softcap", std::to_string(p.softcap),
          "must be finite and >= 0 (0 disables it)");
  if (p.mask == MaskKind::bias) {
    require(p.bias_batch == 1 || p.bias_batch == p.B, "bias_batch", p.bias_batch,
            "must be 1 or B = " + std::to_string(p.B) + " (Bb of a bias [Bb, Hb, Sq, Sk])");
    require(p.bias_heads == 1 || p.bias_heads == p.H, "bias_heads", p.bias_heads,
            "must be 1 or H = " + std::to_string(p.H) + " (Hb of a bias [Bb, Hb, Sq, Sk])");
  }
  const auto check_stride = [&](std::int64_t stride, std::int64_t heads, std::int64_t width,
                                const char* name) {
    if (stride == 0) return;
    const std::int64_t row = checked_mul(heads, width, name);
    if (p.layout == Layout::bhsd) {
      require(stride == row, name, stride,
              "must be 0 or " + std::to_string(row) + " (bhsd is always contiguous)");
    } else {
      require(stride >= row, name, stride, "must be >= heads*width = " + std::to_string(row));
    }
  };
  check_stride(p.q_row_stride, p.H, p.D, "q_row_stride");
  check_stride(p.k_row_stride, Hkv, p.D, "k_row_stride");
  check_stride(p.v_row_stride, Hkv, Dv, "v_row_stride");

  AttentionPlan plan;
  plan.B = p.B;
  plan.Sq = p.Sq;
  plan.Sk = Sk;
  plan.H = p.H;
  plan.Hkv = Hkv;
  plan.D = p.D;
  plan.Dv = Dv;
  plan.layout = p.layout;
  plan.mask = p.mask;
  plan.window = p.window;
  plan.scale = scale;
  plan.softcap = p.softcap;
  plan.bias_batch = p.mask == MaskKind::bias ? p.bias_batch : 1;
  plan.bias_heads = p.mask == MaskKind::bias ? p.bias_heads : 1;
  plan.sinks = p.sinks;
  plan.alibi = p.alibi;
  plan.num_seqs = p.num_seqs;
  plan.num_blocks = p.num_blocks;
  plan.block_size = p.block_size;
  plan.max_blocks = p.max_blocks;
  plan.rounding = p.rounding;
  plan.kv_cache = p.kv_cache;
  const Layout L = p.layout;
  const std::int64_t KB = plan.kv_batch(), KS = plan.kv_seq();
  plan.q = Strides::of(L, plan.B, plan.Sq, plan.H, plan.D, p.q_row_stride, "q");
  plan.k = Strides::of(L, KB, KS, Hkv, plan.D, p.k_row_stride, "k");
  plan.v = Strides::of(L, KB, KS, Hkv, Dv, p.v_row_stride, "v");
  plan.o = Strides::of(L, plan.B, plan.Sq, plan.H, Dv, 0, "out");
  plan.dq = Strides::of(L, plan.B, plan.Sq, plan.H, plan.D, 0, "dq");
  plan.dk = Strides::of(L, KB, KS, Hkv, plan.D, 0, "dk");
  plan.dv = Strides::of(L, KB, KS, Hkv, Dv, 0, "dv");
  checked_mul(plan.sequences(), plan.H, "alibi_slopes");
  // Mask sizes must fit in 64 bits too (only the mask the kind takes: a call
  // without a bias never forms Sq·Sk).
  if (plan.mask == MaskKind::bias) {
    checked_mul(checked_mul(checked_mul(plan.bias_batch, plan.bias_heads, "mask"), plan.Sq, "mask"),
                plan.Sk, "mask");
  }
  checked_mul(plan.B, plan.Sk, "mask");
  checked_mul(checked_mul(KB, KS, "k_scale"), Hkv, "k_scale");
  return plan;
}

inline std::string AttentionPlan::describe() const {
  std::string s = "B=" + std::to_string(B) + " Sq=" + std::to_string(Sq) +
                  " Sk=" + std::to_string(Sk) + " H=" + std::to_string(H) +
                  " Hkv=" + std::to_string(Hkv) + " D=" + std::to_string(D) +
                  " Dv=" + std::to_string(Dv) + " " + to_string(layout) + " " + to_string(mask);
  if (mask == MaskKind::sliding_window) s += "(w=" + std::to_string(window) + ")";
  if (mask == MaskKind::bias) {
    s += '[';  // appended, not "[" + …: GCC 12 misreads that insert at 0 (-Wrestrict)
    s += std::to_string(bias_batch) + "," + std::to_string(bias_heads) + ",Sq,Sk]";
  }
  s += " scale=" + std::to_string(scale);
  if (softcap > 0) s += " softcap=" + std::to_string(softcap);
  if (sinks) s += " sinks";
  if (alibi != AlibiKind::none) s += std::string(" alibi=") + to_string(alibi);
  if (varlen()) s += " packed(n=" + std::to_string(num_seqs) + ")";
  if (paged()) {
    s += " paged(blocks=" + std::to_string(num_blocks) +
         " block_size=" + std::to_string(block_size) + " max_blocks=" + std::to_string(max_blocks) +
         ")";
  }
  if (rounding != kRoundingPytorch) s += " rounding=" + std::string(rounding.name);
  if (kv_cache != KvCache::plain) s += std::string(" kv_cache=") + to_string(kv_cache);
  if (layout == Layout::bshd) {
    s += " row_strides=" + std::to_string(q.seq) + "/" + std::to_string(k.seq) + "/" +
         std::to_string(v.seq);
  }
  return s;
}

}  // namespace tandem
