// SPDX-License-Identifier: Apache-2.0
/// @file attention_shapes.hpp
/// @brief The shape rules of an attention call (SPEC §1, §2.7–2.10): what the
///        shapes of q, k, v, the mask and the feature inputs say about the
///        AttentionParams, then AttentionPlan::make. Errors name the inputs by
///        the caller's names (AttentionNames, SPEC §8).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>

#include "tandem/attention_plan.hpp"
#include "tandem/error.hpp"
#include "tandem/shape.hpp"

namespace tandem {

/// How the caller's q, k, v hold their tokens and heads (SPEC §1): one of the
/// two memory layouts, or thd — packed tokens `[total, H, D]` (or
/// `[total, H·D]`), the bshd layout of packed sequences (B = 1, SPEC §2.9).
enum class QkvLayout {
  bshd,  ///< `[B, S, H, D]`, `[B, S, H·D]` or `[S, H·D]`
  bhsd,  ///< `[B, H, S, D]`
  thd,   ///< `[total, H, D]` or `[total, H·D]`, with cu_seqlens
};

/// "bshd", "bhsd" or "thd".
inline const char* to_string(QkvLayout l) {
  return l == QkvLayout::bshd ? "bshd" : l == QkvLayout::bhsd ? "bhsd" : "thd";
}

/// Attributes that shapes do not carry, for AttentionPlan::from_shapes
/// (the `attrs` of a case file, SPEC §9).
struct AttentionAttrs {
  /// H; 0: read from q's head axis, where q has one (rank 4 with a layout, a paged
  /// cache's q, packed `[total, H, D]`).
  std::int64_t num_heads = 0;
  std::optional<QkvLayout> layout;  ///< from shapes when absent (SPEC §1)
  MaskKind mask = MaskKind::none;   ///< which keys each query sees (SPEC §2)
  std::int64_t window = 0;          ///< w of sliding_window: keys a−w..a are visible
  std::optional<double> scale;      ///< multiplies <q_i, k_j>; defaults to 1/sqrt(D)
  double softcap = 0.0;             ///< c of s ← c·tanh(s/c); 0 disables the cap
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
  std::optional<Shape> key_origin = {};     ///< `[n]`: each sequence's position of key 0
};

/// What the caller calls the inputs of an attention call (SPEC §8): an error
/// about an input's shape has parameter `<name>.shape`. The defaults are the
/// names of tandem's Python API; the mask is named by what it is, `bias` or
/// `key_padding`, unless `mask` names it (a case file's `mask`, SPEC §9).
struct AttentionNames {
  ///@{
  /// q, k and v.
  std::string q = "q", k = "k", v = "v";
  ///@}
  std::string mask;  ///< the mask of either kind; empty: `bias` or `key_padding`
  ///@{
  /// The feature inputs (SPEC §2.7–2.10).
  std::string sinks = "sinks", alibi_slopes = "alibi_slopes";
  std::string cu_seqlens_q = "cu_seqlens_q", cu_seqlens_k = "cu_seqlens_k";
  std::string seqused_k = "seqused_k", block_table = "block_table";
  std::string cache_seqlens = "cache_seqlens", key_origin = "key_origin";
  ///@}

  /// The name of the mask that mask kind `kind` takes (bias or key_padding).
  [[nodiscard]] std::string mask_of(MaskKind kind) const {
    if (!mask.empty()) return mask;
    return kind == MaskKind::bias ? "bias" : "key_padding";
  }
};

namespace detail {

/// "<name>.shape", the parameter of an error about input `name`'s shape.
inline std::string shape_param(const std::string& name) {
  return name + ".shape";
}

/// q, k, v whose heads have their own axis (rank 4 `[B,S,H,D]`/`[B,H,S,D]`,
/// packed rank 3 `[T,H,D]`, paged caches): reads B (axis b_ax, or 1 when
/// b_ax < 0), Sq, D, Hkv, Dv, and Sk — or, for a paged cache, num_blocks and
/// block_size from k's first two axes. `where` names the layout in messages.
inline void split_head_params(const AttentionShapes& s, std::int64_t H, int b_ax, int s_ax,
                              int h_ax, bool paged, const std::string& where,
                              const AttentionNames& n, AttentionParams& p) {
  const Shape &q = s.q, &k = s.k, &v = s.v;
  const std::size_t d_ax = q.size() - 1;
  require(q[h_ax] == H, shape_param(n.q), to_string(q),
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
    require(b_ax < 0 || k[b_ax] == p.B, shape_param(n.k), to_string(k),
            "must have B = " + std::to_string(p.B) + " (" + n.q + "'s)");
  }
  require(k[d_ax] == p.D, shape_param(n.k), to_string(k),
          "must have D = " + std::to_string(p.D) + " (" + n.q + "'s last dim)");
  bool v_fits = true;
  for (std::size_t ax = 0; ax < d_ax; ++ax) v_fits = v_fits && v[ax] == k[ax];
  require(v_fits, shape_param(n.v), to_string(v),
          "must match " + n.k + ".shape = " + to_string(k) + " except the last dim");
}

/// q, k, v with heads folded into the last axis: rank 3 `[B,S,H·D]` or rank 2
/// `[S,H·D]` (B = 1).
inline void folded_head_params(const AttentionShapes& s, std::int64_t H, const AttentionNames& n,
                               AttentionParams& p) {
  const Shape &q = s.q, &k = s.k, &v = s.v;
  const std::size_t rank = q.size();
  const std::size_t o = rank == 3 ? 1 : 0;
  p.B = rank == 3 ? q[0] : 1;
  p.Sq = q[o];
  require(q[o + 1] % H == 0, shape_param(n.q), to_string(q),
          "must have a last dim divisible by num_heads = " + std::to_string(H));
  p.D = q[o + 1] / H;
  require(rank == 2 || k[0] == p.B, shape_param(n.k), to_string(k),
          "must have B = " + std::to_string(p.B) + " (" + n.q + "'s)");
  p.Sk = k[o];
  require(k[o + 1] % p.D == 0, shape_param(n.k), to_string(k),
          "must have a last dim divisible by D = " + std::to_string(p.D) + " (" + n.q +
              "'s last dim / num_heads)");
  p.Hkv = k[o + 1] / p.D;
  require((rank == 2 || v[0] == p.B) && v[o] == p.Sk, shape_param(n.v), to_string(v),
          "must match " + n.k + ".shape = " + to_string(k) + " except the last dim");
  require(v[o + 1] % p.Hkv == 0, shape_param(n.v), to_string(v),
          "must have a last dim divisible by " + n.k + "'s head count " + std::to_string(p.Hkv));
  p.Dv = v[o + 1] / p.Hkv;
}

/// The layout of a rank-4 call: the attr, or the one of dims 1 and 2 that
/// equals num_heads (an Error when both or neither do).
inline Layout rank4_layout(const Shape& q, const AttentionAttrs& a, const AttentionNames& n) {
  if (a.layout) {
    require(*a.layout != QkvLayout::thd, "layout", "thd",
            "needs packed sequences: " + n.q +
                " [total, H, D] with cu_seqlens_q and "
                "cu_seqlens_k, not " +
                n.q + ".shape = " + to_string(q));
    return *a.layout == QkvLayout::bshd ? Layout::bshd : Layout::bhsd;
  }
  const bool dim1 = q[1] == a.num_heads, dim2 = q[2] == a.num_heads;
  require(dim1 != dim2, "layout", std::string("(absent)"),
          "is ambiguous for " + n.q + ".shape = " + to_string(q) +
              " and num_heads = " + std::to_string(a.num_heads) + "; give layout bshd or bhsd");
  return dim1 ? Layout::bhsd : Layout::bshd;
}

/// Throws Error unless `shape` is the rank-1 `[n]` of input `name` (n >= 1
/// when `n` is negative, i.e. still to be learned). Returns n.
inline std::int64_t vector_length(const Shape& shape, std::int64_t n, const std::string& name,
                                  const std::string& meaning) {
  require(shape.size() == 1 && shape[0] >= 1 && (n < 0 || shape[0] == n), shape_param(name),
          to_string(shape),
          "must be " + (n < 0 ? std::string("[n] with n >= 1") : to_string(Shape{n})) + " (" +
              meaning + ")");
  return shape[0];
}

/// The shapes of the feature inputs (SPEC §2.7–2.10) into p: sinks, ALiBi slopes,
/// cu_seqlens, seqused_k, block table and cache lengths. p's B, H and (paged)
/// key shape are already set.
inline void feature_params(const AttentionShapes& s, const AttentionNames& names,
                           AttentionParams& p) {
  const std::int64_t H = p.H;
  if (s.sinks) {
    vector_length(*s.sinks, H, names.sinks,
                  "one logit per query head, num_heads = " + std::to_string(H));
    p.sinks = true;
  }
  if (s.cu_seqlens_q) {
    const std::int64_t n1 =
        vector_length(*s.cu_seqlens_q, -1, names.cu_seqlens_q, "offsets of n sequences: n + 1");
    require(n1 >= 2, shape_param(names.cu_seqlens_q), to_string(*s.cu_seqlens_q),
            "must be [n+1] with n >= 1 sequences");
    vector_length(*s.cu_seqlens_k, n1, names.cu_seqlens_k, "as " + names.cu_seqlens_q);
    p.num_seqs = n1 - 1;
  }
  if (s.seqused_k) vector_length(*s.seqused_k, p.num_seqs, names.seqused_k, "one per sequence");
  if (s.block_table) {
    const Shape& t = *s.block_table;
    require(t.size() == 2 && t[0] == p.B && t[1] >= 1, shape_param(names.block_table), to_string(t),
            "must be [B, max_blocks] with B = " + std::to_string(p.B) + " and max_blocks >= 1");
    p.max_blocks = t[1];
    vector_length(*s.cache_seqlens, p.B, names.cache_seqlens, "one per batch entry");
  }
  if (s.key_origin) {
    vector_length(*s.key_origin, p.num_seqs > 0 ? p.num_seqs : p.B, names.key_origin,
                  "one per sequence (the batch entries or packed sequences)");
  }
  if (s.alibi_slopes) {
    const Shape& m = *s.alibi_slopes;
    const std::int64_t n = p.num_seqs > 0 ? p.num_seqs : p.B;
    const bool per_head = m == Shape{H}, per_seq = m == Shape{n, H};
    require(per_head || per_seq, shape_param(names.alibi_slopes), to_string(m),
            "must be [H] = " + to_string(Shape{H}) + " or [n, H] = " + to_string(Shape{n, H}) +
                " (n the batch entries or packed sequences)");
    p.alibi = per_head ? AlibiKind::per_head : AlibiKind::per_batch_head;
  }
}

/// The mask's shape into p (bias_batch, bias_heads): keep `[B, Sk]`, bias
/// `[Bb, Hb, Sq, Sk]` (or `[Sq, Sk]`, read as `[1, 1, Sq, Sk]`); absent unless the mask kind takes
/// one. A packed or paged call takes none (make() refuses those kinds there).
inline void mask_params(const AttentionShapes& s, const AttentionAttrs& a,
                        const AttentionNames& names, bool dense, AttentionParams& p) {
  const std::optional<Shape>& mask = s.mask;
  const bool takes_mask = a.mask == MaskKind::key_padding || a.mask == MaskKind::bias;
  if (!takes_mask) {
    const std::string name = names.mask.empty() ? "mask" : names.mask;
    require(!mask, name, mask ? to_string(*mask) : "",
            std::string("must be absent for mask ") + to_string(a.mask));
    return;
  }
  if (!dense) return;
  const std::string name = names.mask_of(a.mask);
  require(mask.has_value(), name, std::string("(absent)"),
          std::string("is required for mask ") + to_string(a.mask));
  const Shape& m = *mask;
  if (a.mask == MaskKind::key_padding) {
    require(m.size() == 2 && m[0] == p.B && m[1] == p.Sk, shape_param(name), to_string(m),
            "must be [B, Sk] = " + to_string({p.B, p.Sk}) + " (a keep mask)");
    return;
  }
  if (m == Shape{p.Sq, p.Sk}) return;  // [Sq, Sk]: one bias for every batch entry and head
  require(m.size() == 4 && (m[0] == 1 || m[0] == p.B) && (m[1] == 1 || m[1] == p.H) &&
              m[2] == p.Sq && m[3] == p.Sk,
          shape_param(name), to_string(m),
          "must be [Bb, Hb, Sq, Sk] or [Sq, Sk] (an additive bias) with Bb in {1, " +
              std::to_string(p.B) + "}, Hb in {1, " + std::to_string(p.H) +
              "} (batch entries and heads it spans), Sq = " + std::to_string(p.Sq) +
              ", Sk = " + std::to_string(p.Sk));
  p.bias_batch = m[0];
  p.bias_heads = m[1];
}

/// The layout of q, k, v and its params (B, Sq, Sk, H, Hkv, D, Dv, paged
/// key shape) by SPEC §1 and §2.9–2.10.
inline void qkv_params(const AttentionShapes& s, const AttentionAttrs& a, const AttentionNames& n,
                       bool packed, bool paged, AttentionParams& p) {
  const Shape& q = s.q;
  const std::size_t rank = q.size();
  const std::int64_t H = a.num_heads;
  p.layout = Layout::bshd;
  if (packed || paged) {
    const char* what = packed ? "packed sequences" : "a paged cache";
    const bool ok =
        !a.layout || *a.layout == QkvLayout::bshd || (packed && *a.layout == QkvLayout::thd);
    require(
        ok, "layout", std::string(a.layout ? to_string(*a.layout) : ""),
        std::string("must be ") + (packed ? "thd or bshd" : "bshd") + " (or absent) with " + what);
  }
  if (packed) {
    require(
        rank <= 3, shape_param(n.q), to_string(q),
        "must be [total_q, H, D] or [total_q, H*D] with packed sequences (" + n.cu_seqlens_q + ")");
    if (rank == 3) {
      split_head_params(s, H, -1, 0, 1, false, "packed [total_q, H, D]", n, p);
    } else {
      folded_head_params(s, H, n, p);
    }
  } else if (paged) {
    require(rank == 4, shape_param(n.k), to_string(s.k),
            "must be [num_blocks, block_size, Hkv, D] with a paged cache (" + n.block_table +
                "), and " + n.q + " [B, Sq, H, D]");
    split_head_params(s, H, 0, 1, 2, true, "bshd", n, p);
  } else if (rank == 4) {
    const Layout L = rank4_layout(q, a, n);
    const bool bshd = L == Layout::bshd;
    split_head_params(s, H, 0, bshd ? 1 : 2, bshd ? 2 : 1, false, to_string(L), n, p);
    p.layout = L;
  } else {
    require(!a.layout || *a.layout == QkvLayout::bshd, "layout",
            std::string(a.layout ? to_string(*a.layout) : ""),
            "must be bshd for rank-" + std::to_string(rank) + " tensors" +
                (a.layout == QkvLayout::thd ? " without packed sequences (" + n.cu_seqlens_q + ")"
                                            : std::string()));
    folded_head_params(s, H, n, p);
  }
}

/// Throws Error naming `param` unless x has no negative dim, an element
/// count that fits in 64 bits and no empty axis (SPEC §8: empty tensors are
/// rejected; here in the caller's words, before make() would say Sq or D).
inline void require_sized(const Shape& x, const std::string& param) {
  element_count(x, param);
  require(std::find(x.begin(), x.end(), 0) == x.end(), param, to_string(x),
          "must have every dim >= 1 (no empty axis)");
}

/// H: the num_heads attr, or when it is 0 the head axis of q (rank 4 with a
/// layout or a paged cache: axis 1 bhsd, 2 bshd; `[total, H, D]` packed or thd: axis 1).
inline std::int64_t num_heads(const AttentionShapes& s, const AttentionAttrs& a,
                              const AttentionNames& n) {
  const Shape& q = s.q;
  if (a.num_heads != 0) {
    require(a.num_heads >= 1, "num_heads", a.num_heads, "must be >= 1");
    return a.num_heads;
  }
  const bool paged = s.block_table.has_value(), packed = s.cu_seqlens_q.has_value();
  if (q.size() == 4 && (a.layout || paged)) return q[a.layout == QkvLayout::bhsd ? 1 : 2];
  if (q.size() == 3 && (packed || a.layout == QkvLayout::thd)) return q[1];
  require(false, "num_heads", a.num_heads,
          "must be given (>= 1) for " + n.q + ".shape = " + to_string(q) +
              (q.size() == 4 ? " without a layout" : ", which has no head axis"));
  return 0;
}

}  // namespace detail

/// The AttentionParams that the shapes and attrs of a call say (SPEC §1,
/// §2.7–2.10), without row strides (contiguous inputs); errors name the inputs
/// by `names`. AttentionPlan::from_shapes is make() of these.
inline AttentionParams attention_params_from_shapes(const AttentionShapes& s,
                                                    const AttentionAttrs& attrs,
                                                    const AttentionNames& names = {});

inline AttentionPlan AttentionPlan::from_shapes(const Shape& q, const Shape& k, const Shape& v,
                                                const std::optional<Shape>& mask,
                                                const AttentionAttrs& a) {
  return from_shapes(AttentionShapes{q, k, v, mask}, a, AttentionNames{});
}

inline AttentionPlan AttentionPlan::from_shapes(const AttentionShapes& s, const AttentionAttrs& a) {
  return from_shapes(s, a, AttentionNames{});
}

inline AttentionPlan AttentionPlan::from_shapes(const AttentionShapes& s, const AttentionAttrs& a,
                                                const AttentionNames& n) {
  return make(attention_params_from_shapes(s, a, n));
}

inline AttentionParams attention_params_from_shapes(const AttentionShapes& s,
                                                    const AttentionAttrs& attrs,
                                                    const AttentionNames& n) {
  const Shape &q = s.q, &k = s.k, &v = s.v;
  const std::size_t rank = q.size();
  const std::string qs = detail::shape_param(n.q);
  require(rank >= 2 && rank <= 4, qs, to_string(q), "must have rank 2, 3 or 4");
  detail::require_sized(q, qs);
  // H first: a q without a head axis needs num_heads whatever k and v are
  AttentionAttrs a = attrs;
  a.num_heads = detail::num_heads(s, attrs, n);
  const std::int64_t H = a.num_heads;
  require(k.size() == rank, detail::shape_param(n.k), to_string(k),
          "must have the rank of " + qs + " = " + to_string(q));
  require(v.size() == rank, detail::shape_param(n.v), to_string(v),
          "must have the rank of " + qs + " = " + to_string(q));
  detail::require_sized(k, detail::shape_param(n.k));
  detail::require_sized(v, detail::shape_param(n.v));
  // Which inputs come in pairs, and which features combine (SPEC §2.9–2.10).
  const auto pair = [](const std::optional<Shape>& x, const std::optional<Shape>& y,
                       const std::string& x_name, const std::string& y_name, const char* what) {
    require(x.has_value() || !y.has_value(), x_name, std::string("(absent)"),
            "is required with " + y_name + " (" + what + " take both)");
  };
  pair(s.cu_seqlens_q, s.cu_seqlens_k, n.cu_seqlens_q, n.cu_seqlens_k, "packed sequences");
  pair(s.cu_seqlens_k, s.cu_seqlens_q, n.cu_seqlens_k, n.cu_seqlens_q, "packed sequences");
  pair(s.block_table, s.cache_seqlens, n.block_table, n.cache_seqlens, "paged caches");
  pair(s.cache_seqlens, s.block_table, n.cache_seqlens, n.block_table, "paged caches");
  const bool packed = s.cu_seqlens_q.has_value(), paged = s.block_table.has_value();
  require(!(packed && paged), n.block_table, paged ? to_string(*s.block_table) : "",
          "and " + n.cu_seqlens_q + " do not combine: a paged cache takes " + n.q +
              " [B, Sq, H, D], not packed sequences");
  require(
      !s.seqused_k || packed, n.seqused_k, s.seqused_k ? to_string(*s.seqused_k) : "",
      "is only taken with " + n.cu_seqlens_q + " and " + n.cu_seqlens_k + " (packed sequences)");

  AttentionParams p;
  p.H = H;
  p.mask = a.mask;
  p.window = a.window;
  p.scale = a.scale;
  p.softcap = a.softcap;
  detail::qkv_params(s, a, n, packed, paged, p);
  require(p.Hkv >= 1 && H % p.Hkv == 0, detail::shape_param(n.k), to_string(k),
          "must have a head count (" + std::to_string(p.Hkv) +
              ") that divides num_heads = " + std::to_string(H));
  detail::mask_params(s, a, n, !packed && !paged, p);
  detail::feature_params(s, n, p);
  return p;
}

}  // namespace tandem
