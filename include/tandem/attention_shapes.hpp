// SPDX-License-Identifier: Apache-2.0
/// @file attention_shapes.hpp
/// @brief The shape rules of an attention call (SPEC §1, §2.7–2.10): what the
///        shapes of q, k, v, the mask and the feature inputs say about the
///        AttentionParams, then AttentionPlan::make.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "tandem/attention_plan.hpp"
#include "tandem/error.hpp"
#include "tandem/shape.hpp"

namespace tandem {

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

}  // namespace tandem
