// SPDX-License-Identifier: Apache-2.0
/// @file attention.hpp
/// @brief The attention plan: shapes, layout, mask, scale, softcap, sinks,
///        ALiBi, packed sequences and paged caches of one scaled dot-product
///        attention call, validated once (SPEC §1–3, §2.7–2.10, §8).
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
#include <complex>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "tandem/error.hpp"
#include "tandem/indices.hpp"
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
};

/// Attributes that shapes do not carry, for AttentionPlan::from_shapes
/// (the `attrs` of a case file, SPEC §9).
struct AttentionAttrs {
  std::int64_t num_heads = 0;      ///< H (required)
  std::optional<Layout> layout;    ///< from shapes when absent (SPEC §1)
  MaskKind mask = MaskKind::none;  ///< which keys each query sees (SPEC §2)
  std::int64_t window = 0;         ///< w of sliding_window: keys a−w..a are visible
  std::optional<double> scale;     ///< multiplies <q_i, k_j>; defaults to 1/sqrt(D)
  double softcap = 0.0;            ///< c of s ← c·tanh(s/c); 0 disables the cap
};

/// The shapes of an attention call's tensors, for AttentionPlan::from_shapes;
/// an absent optional input is not given. Which of them are present decides
/// the features (SPEC §2.7–2.10): sinks `[H]`; alibi_slopes `[H]` or `[n, H]`;
/// cu_seqlens_q and cu_seqlens_k `[n+1]` (and optionally seqused_k `[n]`)
/// make q, k, v packed; block_table `[B, max_blocks]` and cache_seqlens `[B]`
/// make k, v a paged cache.
struct AttentionShapes {
  ///@{
  /// q, k, v (SPEC §1 shape rules).
  Shape q, k, v;
  ///@}
  std::optional<Shape> mask = {};          ///< keep mask or bias, when the mask kind takes one
  std::optional<Shape> sinks = {};         ///< `[H]`
  std::optional<Shape> alibi_slopes = {};  ///< `[H]` or `[n, H]`
  ///@{
  /// `[n+1]` each: packed sequences.
  std::optional<Shape> cu_seqlens_q = {}, cu_seqlens_k = {};
  ///@}
  std::optional<Shape> seqused_k = {};      ///< `[n]`, packed sequences only
  std::optional<Shape> block_table = {};    ///< `[B, max_blocks]`: a paged cache
  std::optional<Shape> cache_seqlens = {};  ///< `[B]`: a paged cache
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
struct AttentionInputs;

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
  static AttentionPlan from_shapes(const Shape& q, const Shape& k, const Shape& v,
                                   const std::optional<Shape>& mask, const AttentionAttrs& a);

  /// As above, with the shapes of the feature inputs (SPEC §2.7–2.10), whose
  /// presence turns the features on: packed q `[total_q, H, D]` (or
  /// `[total_q, H·D]`) with cu_seqlens; a paged k `[num_blocks, block_size,
  /// Hkv, D]` with q `[B, Sq, H, D]` and a block table.
  static AttentionPlan from_shapes(const AttentionShapes& s, const AttentionAttrs& a);

  /// "B=1 Sq=4 Sk=6 H=4 Hkv=2 D=8 Dv=8 bshd causal scale=0.3536 ..." for
  /// messages and counterexamples.
  [[nodiscard]] std::string describe() const;
};

/// Read-only views of the inputs of an attention call, in any scalar type
/// (float for the backends; double and complex for the reference in tests).
/// `mask` and `alibi_slopes` are always float; sinks have the scalar type so
/// that a complex-step derivative reaches them. A feature's views are empty
/// when the plan does not take it (check_inputs says which are required).
template <class T>
struct AttentionInputs {
  ///@{
  /// q `[B,Sq,H,D]`, k `[B,Sk,Hkv,D]`, v `[B,Sk,Hkv,Dv]` in the plan's layout, read through the
  /// plan's strides (at least q.extent, k.extent, v.extent elements).
  std::span<const T> q, k, v;
  ///@}
  /// keep `[B, Sk]` (key_padding; nonzero = attend) or additive bias `[Bb, Hb, Sq, Sk]` (bias);
  /// empty otherwise
  std::span<const float> mask = {};
  /// sinks `[H]`, finite: the logit of query head h's sink (SPEC §2.7)
  std::span<const T> sinks = {};
  /// ALiBi slopes `[H]` or `[n, H]`, finite (SPEC §2.8)
  std::span<const float> alibi_slopes = {};
  ///@{
  /// `[n+1]` each, non-decreasing from 0 to total_q (total_k): sequence n owns query rows
  /// [cu_seqlens_q[n], cu_seqlens_q[n+1]) and the key slot [cu_seqlens_k[n], cu_seqlens_k[n+1])
  /// (SPEC §2.9).
  Indices cu_seqlens_q = {}, cu_seqlens_k = {};
  ///@}
  /// `[n]` or empty: sequence n reads only the first seqused_k[n] keys of its slot (SPEC §2.9)
  Indices seqused_k = {};
  /// `[B, max_blocks]`: key j of batch entry b is slot j % block_size of block
  /// block_table[b, j / block_size] (SPEC §2.10)
  Indices block_table = {};
  /// `[B]`, 0 <= cache_seqlens[b] <= max_blocks·block_size: the keys of batch entry b (SPEC §2.10)
  Indices cache_seqlens = {};
};

/// Writable views of the gradients; an empty view is not computed.
template <class T>
struct AttentionGrads {
  ///@{
  /// dq `[B,Sq,H,D]`, dk `[B,Sk,Hkv,D]`, dv `[B,Sk,Hkv,Dv]`, contiguous in the plan's layout; an
  /// empty view is not computed.
  std::span<T> dq, dk, dv;
  ///@}
  /// dsinks `[H]` (plans with sinks only): `dsink_h = −Σ_{b,i} p_sink,i · <dO_i, O_i>`
  /// (SPEC §2.7); empty: not computed.
  std::span<T> dsinks = {};
};

/// What a training step's forward keeps for its backward (FlashAttention's
/// saved state), so that the backward need not run the forward again:
/// out `[B,Sq,H,Dv]` (contiguous, plan.o) and the log-sum-exp lse `[B,H,Sq]`
/// (contiguous, plan.lse_at), `lse_i = m_i + log Σ_j exp(s_ij − m_i)` over the
/// keys visible to query i (−inf for a query that sees none), so that
/// `p_ij = exp(s_ij − lse_i)`. With sinks the sink joins the sum:
/// `lse_i = log(exp(sink_h) + Σ_j exp(s_ij))`, sink_h for a query that sees no key.
template <class T>
struct AttentionSaved {
  std::span<const T> out;  ///< the forward's output `[B,Sq,H,Dv]`
  std::span<const T> lse;  ///< the forward's log-sum-exp `[B,H,Sq]`
};

namespace detail {

/// True when x (real, or both parts of a complex) is finite.
template <class T>
bool finite_value(const T& x) {
  if constexpr (std::is_arithmetic_v<T>) {
    return std::isfinite(x);
  } else {
    return std::isfinite(x.real()) && std::isfinite(x.imag());
  }
}

/// x as text for messages (the real part of a complex).
template <class T>
std::string value_text(const T& x) {
  if constexpr (std::is_arithmetic_v<T>) {
    return std::to_string(x);
  } else {
    return std::to_string(x.real());
  }
}

/// Throws Error naming `name` unless the view has `size` finite values.
template <class T>
void check_finite_values(std::span<const T> x, std::int64_t size, const std::string& name) {
  require_size(x.size(), size, name);
  for (std::size_t i = 0; i < x.size(); ++i) {
    require_entry(finite_value(x[i]), name, static_cast<std::int64_t>(i), value_text(x[i]),
                  "must be finite");
  }
}

/// Throws Error naming `name` unless offsets `[n+1]` start at 0, never
/// decrease and end at `total`.
inline void check_offsets(const Indices& cu, std::int64_t n, std::int64_t total,
                          const std::string& name) {
  require_size(cu.size(), n == 0 ? 0 : n + 1, name);
  if (n == 0) return;
  require_entry(cu[0] == 0, name, 0, std::to_string(cu[0]),
                "must be 0 (the first sequence starts at row 0)");
  for (std::int64_t s = 0; s < n; ++s) {
    const std::int64_t a = cu[static_cast<std::size_t>(s)], b = cu[static_cast<std::size_t>(s + 1)];
    require_entry(b >= a, name, s + 1, std::to_string(b),
                  "must be >= " + name + "[" + std::to_string(s) + "] = " + std::to_string(a) +
                      " (offsets never decrease)");
  }
  const std::int64_t last = cu[static_cast<std::size_t>(n)];
  require_entry(last == total, name, n, std::to_string(last),
                "must be the total number of rows, " + std::to_string(total));
}

}  // namespace detail

/// Throws Error unless the views fit the plan (SPEC §8): strided inputs hold
/// q.extent…, the mask has mask_size() elements (none when the kind takes
/// none); sinks `[H]` and ALiBi slopes `[slopes_size()]` are finite (empty
/// when not taken); packed sequences' cu_seqlens start at 0, never decrease
/// and end at the row count, 0 <= seqused_k[n] <= its slot; a paged cache's
/// lengths lie in [0, max_blocks·block_size] and every block-table entry a
/// length uses lies in [0, num_blocks) (the others are never read and may
/// hold anything). Every feature input the plan does not take must be empty.
template <class T>
void check_inputs(const AttentionPlan& plan, const AttentionInputs<T>& in) {
  require_extent(in.q.size(), plan.q.extent, "q");
  require_extent(in.k.size(), plan.k.extent, "k");
  require_extent(in.v.size(), plan.v.extent, "v");
  require_size(in.mask.size(), plan.mask_size(), "mask");
  detail::check_finite_values(in.sinks, plan.sinks ? plan.H : 0, "sinks");
  detail::check_finite_values(in.alibi_slopes, plan.slopes_size(), "alibi_slopes");
  // packed sequences
  const std::int64_t n = plan.num_seqs;
  detail::check_offsets(in.cu_seqlens_q, n, plan.Sq, "cu_seqlens_q");
  detail::check_offsets(in.cu_seqlens_k, n, plan.Sk, "cu_seqlens_k");
  if (!in.seqused_k.empty() || n == 0) require_size(in.seqused_k.size(), n, "seqused_k");
  for (std::size_t s = 0; s < in.seqused_k.size(); ++s) {
    const std::int64_t slot = in.cu_seqlens_k[s + 1] - in.cu_seqlens_k[s];
    require_entry(in.seqused_k[s] >= 0 && in.seqused_k[s] <= slot, "seqused_k",
                  static_cast<std::int64_t>(s), std::to_string(in.seqused_k[s]),
                  "must lie in [0, " + std::to_string(slot) + "] (the keys of sequence " +
                      std::to_string(s) + "'s slot in cu_seqlens_k)");
  }
  // paged cache
  const std::int64_t B = plan.paged() ? plan.B : 0, W = plan.max_blocks;
  require_size(in.block_table.size(), B * W, "block_table");
  require_size(in.cache_seqlens.size(), B, "cache_seqlens");
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t len = in.cache_seqlens[static_cast<std::size_t>(b)];
    require_entry(len >= 0 && len <= plan.Sk, "cache_seqlens", b, std::to_string(len),
                  "must lie in [0, " + std::to_string(plan.Sk) + "] (max_blocks·block_size = " +
                      std::to_string(W) + "·" + std::to_string(plan.block_size) + ")");
    const std::int64_t used = (len + plan.block_size - 1) / plan.block_size;
    for (std::int64_t j = 0; j < used; ++j) {
      const std::int64_t e = in.block_table[static_cast<std::size_t>(b * W + j)];
      require_entry(e >= 0 && e < plan.num_blocks, "block_table", b * W + j, std::to_string(e),
                    "must lie in [0, num_blocks = " + std::to_string(plan.num_blocks) +
                        ") (entry [" + std::to_string(b) + ", " + std::to_string(j) +
                        "] holds keys of cache_seqlens[" + std::to_string(b) +
                        "] = " + std::to_string(len) + ")");
    }
  }
}

/// Throws Error unless the gradient views fit the plan: every non-empty one
/// has its full size (dsinks `[H]` only for plans with sinks) and at least
/// one is asked for. A paged plan has no backward (SPEC §2.10).
template <class T>
void check_grads(const AttentionPlan& plan, const AttentionGrads<T>& g) {
  require(!plan.paged(), "block_table", std::string("(a paged cache)"),
          "has no backward: attention backward takes contiguous or packed k and v");
  if (!g.dq.empty()) require_size(g.dq.size(), plan.dq.extent, "dq");
  if (!g.dk.empty()) require_size(g.dk.size(), plan.dk.extent, "dk");
  if (!g.dv.empty()) require_size(g.dv.size(), plan.dv.extent, "dv");
  if (!g.dsinks.empty()) require_size(g.dsinks.size(), plan.sinks ? plan.H : 0, "dsinks");
  require(!g.dq.empty() || !g.dk.empty() || !g.dv.empty() || !g.dsinks.empty(), "grads",
          std::string("(all empty)"), "must ask for at least one of dq, dk, dv, dsinks");
}

/// Throws Error unless the saved out and lse have their full sizes.
template <class T>
void check_saved(const AttentionPlan& plan, const AttentionSaved<T>& saved) {
  require_size(saved.out.size(), plan.o.extent, "out");
  require_size(saved.lse.size(), plan.lse_size(), "lse");
}

template <class T>
AttentionSeq AttentionPlan::sequence(const AttentionInputs<T>& in, std::int64_t n) const {
  AttentionSeq seq;
  seq.n = n;
  seq.Sq = Sq;
  seq.Sk = Sk;
  if (varlen()) {
    const auto s = static_cast<std::size_t>(n);
    seq.b = 0;
    seq.q_start = in.cu_seqlens_q[s];
    seq.Sq = in.cu_seqlens_q[s + 1] - seq.q_start;
    seq.k_start = in.cu_seqlens_k[s];
    seq.Sk = in.seqused_k.empty() ? in.cu_seqlens_k[s + 1] - seq.k_start : in.seqused_k[s];
  } else if (paged()) {
    seq.b = n;
    seq.Sk = in.cache_seqlens[static_cast<std::size_t>(n)];
    seq.block_size = block_size;
    seq.blocks = in.block_table.subview(static_cast<std::size_t>(n * max_blocks),
                                        static_cast<std::size_t>(max_blocks));
  } else {
    seq.b = n;
  }
  return seq;
}

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

/// The feature rules of make() (SPEC §2.9–2.10): packed sequences are a bshd
/// batch of 1, a paged cache is a bshd batch read through a block table, the
/// two do not combine, and neither takes a key_padding or bias mask (a
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
    require(p.B == 1, "batch", p.B,
            "must be 1 with packed sequences (num_seqs = " + std::to_string(p.num_seqs) +
                "): q is [total_q, H, D]");
    require(p.layout == Layout::bshd, "layout", to_string(p.layout),
            "must be bshd with packed sequences (q [total_q, H, D])");
    mask_ok("packed sequences (cu_seqlens)");
  }
  if (!paged) {
    require(p.Sk >= 1, "seq_k", p.Sk, "must be >= 1");
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
      p.Sk == 0 || p.Sk == capacity, "seq_k", p.Sk,
      "must be 0 or max_blocks*block_size = " + std::to_string(capacity) + " for a paged cache");
  return capacity;
}

}  // namespace detail

inline AttentionPlan AttentionPlan::make(const AttentionParams& p) {
  require(p.B >= 1, "batch", p.B, "must be >= 1");
  require(p.Sq >= 1, "seq_q", p.Sq, "must be >= 1");
  const std::int64_t Sk = detail::check_feature_params(p);
  require(p.H >= 1, "num_heads", p.H, "must be >= 1");
  const std::int64_t Hkv = p.Hkv == 0 ? p.H : p.Hkv;
  require(Hkv >= 1 && p.H % Hkv == 0, "kv_heads", Hkv,
          "must divide num_heads = " + std::to_string(p.H));
  require(p.D >= 1, "head_dim", p.D, "must be >= 1");
  const std::int64_t Dv = p.Dv == 0 ? p.D : p.Dv;
  require(Dv >= 1, "v_head_dim", Dv, "must be >= 1");
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
            "must be 1 or batch = " + std::to_string(p.B));
    require(p.bias_heads == 1 || p.bias_heads == p.H, "bias_heads", p.bias_heads,
            "must be 1 or num_heads = " + std::to_string(p.H));
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
  return plan;
}

namespace detail {

/// q, k, v whose heads have their own axis (rank 4 `[B,S,H,D]`/`[B,H,S,D]`,
/// packed rank 3 `[T,H,D]`, paged caches): reads B (axis b_ax, or 1 when
/// b_ax < 0), Sq, D, Hkv, Dv, and Sk — or, for a paged cache, num_blocks and
/// block_size from k's first two axes. `where` names the layout in messages.
inline void split_head_params(const Shape& q, const Shape& k, const Shape& v, std::int64_t H,
                              int b_ax, int s_ax, int h_ax, bool paged, const std::string& where,
                              AttentionParams& p) {
  const std::size_t d_ax = q.size() - 1;
  require(q[h_ax] == H, "q.shape", to_string(q),
          std::string("must have num_heads = ") + std::to_string(H) + " on its head axis (" +
              where + ")");
  p.B = b_ax < 0 ? 1 : q[b_ax];
  p.Sq = q[s_ax];
  p.D = q[d_ax];
  p.Hkv = k[h_ax];
  p.Dv = v[d_ax];
  if (paged) {
    p.num_blocks = k[0];
    p.block_size = k[1];
  } else {
    p.Sk = k[s_ax];
    require(b_ax < 0 || k[b_ax] == p.B, "k.shape", to_string(k),
            "must have batch = " + std::to_string(p.B));
  }
  require(k[d_ax] == p.D, "k.shape", to_string(k),
          "must have head_dim = " + std::to_string(p.D) + " (q's last dim)");
  bool v_fits = true;
  for (std::size_t ax = 0; ax < d_ax; ++ax) v_fits = v_fits && v[ax] == k[ax];
  require(v_fits, "v.shape", to_string(v),
          "must match k.shape = " + to_string(k) + " except the last dim");
}

/// q, k, v with heads folded into the last axis: rank 3 `[B,S,H·D]` or rank 2
/// `[S,H·D]` (B = 1).
inline void folded_head_params(const Shape& q, const Shape& k, const Shape& v, std::int64_t H,
                               AttentionParams& p) {
  const std::size_t rank = q.size();
  const std::size_t o = rank == 3 ? 1 : 0;
  p.B = rank == 3 ? q[0] : 1;
  p.Sq = q[o];
  require(q[o + 1] % H == 0, "q.shape", to_string(q),
          "must have a last dim divisible by num_heads = " + std::to_string(H));
  p.D = q[o + 1] / H;
  require(p.D >= 1, "q.shape", to_string(q), "must have a non-empty last dim");
  require(rank == 2 || k[0] == p.B, "k.shape", to_string(k),
          "must have batch = " + std::to_string(p.B));
  p.Sk = k[o];
  require(k[o + 1] % p.D == 0, "k.shape", to_string(k),
          "must have a last dim divisible by head_dim = " + std::to_string(p.D));
  p.Hkv = k[o + 1] / p.D;
  require(p.Hkv >= 1, "k.shape", to_string(k), "must have a non-empty last dim");
  require((rank == 2 || v[0] == p.B) && v[o] == p.Sk, "v.shape", to_string(v),
          "must match k.shape = " + to_string(k) + " except the last dim");
  require(v[o + 1] % p.Hkv == 0, "v.shape", to_string(v),
          "must have a last dim divisible by kv_heads = " + std::to_string(p.Hkv));
  p.Dv = v[o + 1] / p.Hkv;
}

/// The layout of a rank-4 call: the attr, or the one of dims 1 and 2 that
/// equals num_heads (an Error when both or neither do).
inline Layout rank4_layout(const Shape& q, const AttentionAttrs& a) {
  if (a.layout) return *a.layout;
  const bool dim1 = q[1] == a.num_heads, dim2 = q[2] == a.num_heads;
  require(dim1 != dim2, "layout", std::string("(absent)"),
          "is ambiguous for q.shape = " + to_string(q) +
              " and num_heads = " + std::to_string(a.num_heads) + "; give layout bshd or bhsd");
  return dim1 ? Layout::bhsd : Layout::bshd;
}

/// Throws Error unless `shape` is the rank-1 `[n]` of input `name` (n >= 1
/// when `n` is negative, i.e. still to be learned). Returns n.
inline std::int64_t vector_length(const Shape& shape, std::int64_t n, const std::string& name,
                                  const std::string& meaning) {
  require(shape.size() == 1 && shape[0] >= 1 && (n < 0 || shape[0] == n), name + ".shape",
          to_string(shape),
          "must be " + (n < 0 ? std::string("[n] with n >= 1") : to_string(Shape{n})) + " (" +
              meaning + ")");
  return shape[0];
}

/// The shapes of the feature inputs (SPEC §2.7–2.10) into p: sinks, ALiBi slopes,
/// cu_seqlens, seqused_k, block table and cache lengths. p's batch, heads
/// and (paged) key shape are already set.
inline void feature_params(const AttentionShapes& s, AttentionParams& p) {
  const std::int64_t H = p.H;
  if (s.sinks) {
    vector_length(*s.sinks, H, "sinks",
                  "one logit per query head, num_heads = " + std::to_string(H));
    p.sinks = true;
  }
  if (s.cu_seqlens_q) {
    const std::int64_t n1 =
        vector_length(*s.cu_seqlens_q, -1, "cu_seqlens_q", "offsets of n sequences: n + 1");
    require(n1 >= 2, "cu_seqlens_q.shape", to_string(*s.cu_seqlens_q),
            "must be [n+1] with n >= 1 sequences");
    vector_length(*s.cu_seqlens_k, n1, "cu_seqlens_k", "as cu_seqlens_q");
    p.num_seqs = n1 - 1;
  }
  if (s.seqused_k) vector_length(*s.seqused_k, p.num_seqs, "seqused_k", "one per sequence");
  if (s.block_table) {
    const Shape& t = *s.block_table;
    require(t.size() == 2 && t[0] == p.B && t[1] >= 1, "block_table.shape", to_string(t),
            "must be [B, max_blocks] with B = " + std::to_string(p.B) + " and max_blocks >= 1");
    p.max_blocks = t[1];
    vector_length(*s.cache_seqlens, p.B, "cache_seqlens", "one per batch entry");
  }
  if (s.alibi_slopes) {
    const Shape& m = *s.alibi_slopes;
    const std::int64_t n = p.num_seqs > 0 ? p.num_seqs : p.B;
    const bool per_head = m == Shape{H}, per_seq = m == Shape{n, H};
    require(per_head || per_seq, "alibi_slopes.shape", to_string(m),
            "must be [H] = " + to_string(Shape{H}) + " or [n, H] = " + to_string(Shape{n, H}) +
                " (n the batch entries or packed sequences)");
    p.alibi = per_head ? AlibiKind::per_head : AlibiKind::per_batch_head;
  }
}

}  // namespace detail

inline AttentionPlan AttentionPlan::from_shapes(const Shape& q, const Shape& k, const Shape& v,
                                                const std::optional<Shape>& mask,
                                                const AttentionAttrs& a) {
  return from_shapes(AttentionShapes{q, k, v, mask}, a);
}

inline AttentionPlan AttentionPlan::from_shapes(const AttentionShapes& s, const AttentionAttrs& a) {
  const Shape &q = s.q, &k = s.k, &v = s.v;
  const std::optional<Shape>& mask = s.mask;
  require(a.num_heads >= 1, "num_heads", a.num_heads, "must be >= 1");
  const std::int64_t H = a.num_heads;
  const std::size_t rank = q.size();
  require(rank >= 2 && rank <= 4, "q.shape", to_string(q), "must have rank 2, 3 or 4");
  require(k.size() == rank, "k.shape", to_string(k),
          "must have the rank of q.shape = " + to_string(q));
  require(v.size() == rank, "v.shape", to_string(v),
          "must have the rank of q.shape = " + to_string(q));
  element_count(q, "q.shape");
  element_count(k, "k.shape");
  element_count(v, "v.shape");
  // Which inputs come in pairs, and which features combine (SPEC §2.9–2.10).
  const auto pair = [](const std::optional<Shape>& x, const std::optional<Shape>& y,
                       const char* x_name, const char* y_name, const char* what) {
    require(x.has_value() || !y.has_value(), x_name, std::string("(absent)"),
            std::string("is required with ") + y_name + " (" + what + " take both)");
  };
  pair(s.cu_seqlens_q, s.cu_seqlens_k, "cu_seqlens_q", "cu_seqlens_k", "packed sequences");
  pair(s.cu_seqlens_k, s.cu_seqlens_q, "cu_seqlens_k", "cu_seqlens_q", "packed sequences");
  pair(s.block_table, s.cache_seqlens, "block_table", "cache_seqlens", "paged caches");
  pair(s.cache_seqlens, s.block_table, "cache_seqlens", "block_table", "paged caches");
  const bool packed = s.cu_seqlens_q.has_value(), paged = s.block_table.has_value();
  require(!(packed && paged), "block_table", paged ? to_string(*s.block_table) : "",
          "and cu_seqlens_q do not combine: a paged cache takes q [B, Sq, H, D], not packed "
          "sequences");
  require(!s.seqused_k || packed, "seqused_k", s.seqused_k ? to_string(*s.seqused_k) : "",
          "is only taken with cu_seqlens_q and cu_seqlens_k (packed sequences)");

  AttentionParams p;
  p.H = H;
  p.mask = a.mask;
  p.window = a.window;
  p.scale = a.scale;
  p.softcap = a.softcap;
  if (packed || paged) {
    const char* what = packed ? "packed sequences" : "a paged cache";
    require(!a.layout || *a.layout == Layout::bshd, "layout",
            std::string(a.layout ? to_string(*a.layout) : ""),
            std::string("must be bshd (or absent) with ") + what);
    p.layout = Layout::bshd;
  }
  if (packed) {
    require(rank <= 3, "q.shape", to_string(q),
            "must be [total_q, H, D] or [total_q, H*D] with packed sequences (cu_seqlens)");
    if (rank == 3) {
      detail::split_head_params(q, k, v, H, -1, 0, 1, false, "packed [total_q, H, D]", p);
    } else {
      detail::folded_head_params(q, k, v, H, p);
    }
  } else if (paged) {
    require(rank == 4, "k.shape", to_string(k),
            "must be [num_blocks, block_size, Hkv, D] with a paged cache (block_table), and q "
            "[B, Sq, H, D]");
    detail::split_head_params(q, k, v, H, 0, 1, 2, true, "bshd", p);
  } else if (rank == 4) {
    const Layout L = detail::rank4_layout(q, a);
    const bool bshd = L == Layout::bshd;
    detail::split_head_params(q, k, v, H, 0, bshd ? 1 : 2, bshd ? 2 : 1, false, to_string(L), p);
    p.layout = L;
  } else {
    require(!a.layout || *a.layout == Layout::bshd, "layout",
            std::string(a.layout ? to_string(*a.layout) : ""),
            "must be bshd for rank-" + std::to_string(rank) + " tensors");
    p.layout = Layout::bshd;
    detail::folded_head_params(q, k, v, H, p);
  }
  // make() reads v_head_dim = 0 as "Dv = D": an empty v head must fail here.
  require(p.Dv >= 1, "v.shape", to_string(v), "must have a non-empty last dim");
  require(p.Hkv >= 1 && H % p.Hkv == 0, "kv_heads", p.Hkv,
          "(from k.shape = " + to_string(k) + ") must divide num_heads = " + std::to_string(H));

  // (A mask kind that takes a mask is refused by make() for packed and paged calls.)
  const bool takes_mask = a.mask == MaskKind::key_padding || a.mask == MaskKind::bias;
  if (!takes_mask) {
    require(!mask, "mask", mask ? to_string(*mask) : "",
            std::string("must be absent for mask ") + to_string(a.mask));
  } else if (!packed && !paged) {
    require(mask.has_value(), "mask", std::string("(absent)"),
            std::string("is required for mask ") + to_string(a.mask));
    const Shape& m = *mask;
    if (a.mask == MaskKind::key_padding) {
      require(m.size() == 2 && m[0] == p.B && m[1] == p.Sk, "mask.shape", to_string(m),
              "must be [B, Sk] = " + to_string({p.B, p.Sk}) + " for key_padding");
    } else {
      require(m.size() == 4 && (m[0] == 1 || m[0] == p.B) && (m[1] == 1 || m[1] == H) &&
                  m[2] == p.Sq && m[3] == p.Sk,
              "mask.shape", to_string(m),
              "must be [Bb, Hb, Sq, Sk] with Bb in {1, " + std::to_string(p.B) + "}, Hb in {1, " +
                  std::to_string(H) + "}, Sq = " + std::to_string(p.Sq) +
                  ", Sk = " + std::to_string(p.Sk) + " for bias");
      p.bias_batch = m[0];
      p.bias_heads = m[1];
    }
  }
  detail::feature_params(s, p);
  return make(p);
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
  if (layout == Layout::bshd) {
    s += " row_strides=" + std::to_string(q.seq) + "/" + std::to_string(k.seq) + "/" +
         std::to_string(v.seq);
  }
  return s;
}

}  // namespace tandem
