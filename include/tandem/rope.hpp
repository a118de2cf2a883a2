// SPDX-License-Identifier: Apache-2.0
/// @file rope.hpp
/// @brief The RoPE plans (rotary position embedding, SPEC §4): one tensor, or
///        q and k together.
///
/// x holds B·S tokens (b, s), each with H = W/D heads of width D, in one of
/// three layouts: `bshd` `[B, S, H, D]` (also `[B, S, H*D]` and `[S, H*D]`),
/// `bhsd` `[B, H, S, D]`, or `thd` `[T, H, D]` (packed tokens: B = 1, S = T).
/// Token (b, s) reads table row `r = table_row(b, s)`: s (position rows),
/// b·S + s (token rows) or `positions[b·S + s]` (position ids). With
/// `c_i = cos[r*T + i]`, `s_i = sin[r*T + i]`, `m = n_rot/2`, per head and i < m:
///  - neox:  `y[i] = x[i]c_i − x[i+m]s_i`,   `y[i+m] = x[i+m]c_i + x[i]s_i`
///  - gptj:  `y[2i] = x[2i]c_i − x[2i+1]s_i`, `y[2i+1] = x[2i+1]c_i + x[2i]s_i`
/// and dims n_rot..D−1 pass through. The output is contiguous, in the layout
/// of x. The backward applies the transpose (rotation by −angle) to dy with
/// the same table rows.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>

#include "tandem/error.hpp"
#include "tandem/indices.hpp"
#include "tandem/shape.hpp"

namespace tandem {

/// Which elements form a rotated pair.
enum class RopeStyle {
  neox,  ///< (x[i], x[i + n_rot/2]) — Hugging Face rotate-half
  gptj,  ///< (x[2i], x[2i+1]) — interleaved
};

/// "neox" or "gptj".
inline const char* to_string(RopeStyle s) {
  return s == RopeStyle::neox ? "neox" : "gptj";
}

/// How x holds its tokens and heads; the only thing a layout decides.
enum class RopeLayout {
  bshd,  ///< `[B, S, H, D]`, `[B, S, H*D]` or `[S, H*D]`: token (b, s) at (b·S + s)·row_stride
  bhsd,  ///< `[B, H, S, D]`: head h of token (b, s) at ((b·H + h)·S + s)·D, contiguous
  thd,   ///< `[T, H, D]` or `[T, H*D]`: packed tokens (B = 1, S = T) at t·row_stride
};

/// "bshd", "bhsd" or "thd".
inline const char* to_string(RopeLayout l) {
  return l == RopeLayout::bshd ? "bshd" : l == RopeLayout::bhsd ? "bhsd" : "thd";
}

/// Which table row token (b, s) reads.
enum class TableRows {
  position,      ///< row s; needs R >= S
  token,         ///< row b·S + s; needs R == B·S
  position_ids,  ///< row positions[b·S + s], each in [0, R) (vLLM's positions + cos_sin_cache)
};

/// "position", "token" or "position_ids".
inline const char* to_string(TableRows r) {
  return r == TableRows::position ? "position" : r == TableRows::token ? "token" : "position_ids";
}

/// Explicit parameters of a RoPE call on B·S tokens of H = width/head_dim heads.
struct RopeParams {
  std::int64_t batch = 1;                ///< B (1 for thd)
  std::int64_t seq = 0;                  ///< S, tokens per batch entry (T for thd)
  std::int64_t width = 0;                ///< W = H·D, a multiple of head_dim
  std::int64_t head_dim = 0;             ///< D
  RopeLayout layout = RopeLayout::bshd;  ///< how x holds tokens and heads
  std::optional<std::int64_t> n_rot;     ///< even, 0..D; defaults to D
  RopeStyle style = RopeStyle::neox;     ///< which elements form a rotated pair
  std::int64_t table_rows = 0;           ///< R (max_position for position_ids)
  std::int64_t table_stride = 0;         ///< T >= n_rot/2; 0 means n_rot/2
  TableRows rows = TableRows::position;  ///< which table row token (b, s) reads
  /// bshd and thd: distance between token rows, >= W; 0 = W. bhsd: must be 0.
  std::int64_t src_row_stride = 0;
};

/// Attributes of a case file's rope ops (SPEC §9), completing what shapes say.
struct RopeAttrs {
  /// D. Default: x's last dim when x has a head axis (rank 4, thd rank 3),
  /// else W / num_heads; one of the two is required for `[B, S, H*D]` and `[S, H*D]`.
  std::optional<std::int64_t> head_dim;
  /// H. Decides a rank-4 layout when exactly one of dims 1 and 2 equals it,
  /// and gives D = W / H when x has no head axis.
  std::optional<std::int64_t> num_heads;
  /// Rank 4: bshd or bhsd, else decided by num_heads (an error when it cannot
  /// decide). Rank 3: bshd `[B, S, H*D]` unless thd `[T, H, D]`. Rank 2: bshd or thd.
  std::optional<RopeLayout> layout;
  std::optional<std::int64_t> n_rot;    ///< rotated dims, even, 0..D; defaults to D
  RopeStyle style = RopeStyle::neox;    ///< which elements form a rotated pair
  std::optional<TableRows> table_rows;  ///< from shapes (and positions) when absent
};

/// What the caller calls the inputs of a RoPE call, for messages (SPEC §8):
/// an error about an input's shape has parameter `<name>.shape`.
struct RopeNames {
  std::string x = "x";  ///< the source (x, dy; q of a q-and-k call)
  std::string k = "k";  ///< the second source of a q-and-k call
  ///@{
  /// The tables and the position ids.
  std::string cos = "cos", sin = "sin", positions = "positions";
  ///@}
  std::string cos_sin_cache = "cos_sin_cache";  ///< cos and sin as one table `[R, 2T]`
};

/// One RoPE call, validated.
struct RopePlan {
  ///@{
  /// B batch entries of S tokens (B = 1, S = T for thd); each token has W = H·D elements, H heads
  /// of width D, of which the first n_rot (even, <= D) are rotated.
  std::int64_t B = 0, S = 0, W = 0, D = 0, n_rot = 0;
  ///@}
  ///@{
  std::int64_t R = 0, T = 0;  ///< table rows (max_position for position_ids) and row stride
  ///@}
  /// bshd, thd: the source (x or dy) row stride, >= W; bhsd sources are contiguous (W here).
  std::int64_t src_row_stride = 0;
  RopeStyle style = RopeStyle::neox;     ///< neox (i, i+m) or gptj (2i, 2i+1) pairs
  RopeLayout layout = RopeLayout::bshd;  ///< how source and output hold tokens and heads
  TableRows rows = TableRows::position;  ///< which table row token (b, s) reads
  Strides src;                           ///< head h of token (b, s) in the source: src.at(b, s, h)
  Strides out;  ///< ... and in the output (contiguous, the layout of the source)

  /// H = W / D heads per token.
  [[nodiscard]] std::int64_t heads() const { return W / D; }
  /// The table row that token (b, s) reads; `positions` as checked by check_tables().
  [[nodiscard]] std::int64_t table_row(std::int64_t b, std::int64_t s,
                                       const Indices& positions = {}) const {
    switch (rows) {
      case TableRows::position:
        return s;
      case TableRows::token:
        return b * S + s;
      case TableRows::position_ids:
        return positions[static_cast<std::size_t>(b * S + s)];
    }
    return s;
  }
  /// Elements a strided source must hold.
  [[nodiscard]] std::int64_t src_extent() const { return src.extent; }
  /// Elements of the contiguous output: B·S·W.
  [[nodiscard]] std::int64_t out_size() const { return out.extent; }

  /// Validates by SPEC §8 — the only place that does.
  static RopePlan make(const RopeParams& p);
  /// x of rank 2, 3 or 4 by SPEC §4's shape rules; cos and sin `[R, T]`;
  /// positions (int32/int64) of x's token axes (`[B, S]`, or `[T]` / `[S]`).
  static RopePlan from_shapes(const Shape& x, const Shape& cos, const Shape& sin,
                              const std::optional<Shape>& positions, const RopeAttrs& a);
  /// As above, naming the inputs in errors by the caller's names.
  static RopePlan from_shapes(const Shape& x, const Shape& cos, const Shape& sin,
                              const std::optional<Shape>& positions, const RopeAttrs& a,
                              const RopeNames& names);
  /// As above, without positions.
  static RopePlan from_shapes(const Shape& x, const Shape& cos, const Shape& sin,
                              const RopeAttrs& a) {
    return from_shapes(x, cos, sin, std::nullopt, a);
  }
  /// Readable summary for messages and counterexamples.
  [[nodiscard]] std::string describe() const;
};

/// Explicit parameters of RoPE on q and k in one call: k shares every
/// parameter of q's call but its width (Hkv·D, GQA) and row stride.
struct RopeQkParams {
  RopeParams q;                       ///< q's call, and what k shares with it
  std::int64_t k_width = 0;           ///< k's W = Hkv·D
  std::int64_t k_src_row_stride = 0;  ///< k's source row stride (bshd, thd); 0 = k_width
};

/// RoPE on q `[.., H, D]` and k `[.., Hkv, D]` with the same tokens, tables
/// and positions, validated: two RopePlans that differ only in W and strides.
struct RopeQkPlan {
  RopePlan q;  ///< q's tokens, heads and tables
  RopePlan k;  ///< k's: the same but W = Hkv·D and its own strides

  /// Validates by SPEC §8; errors about k's own parameters name `k_width` or
  /// `k_src_row_stride`.
  static RopeQkPlan make(const RopeQkParams& p);
  /// q and k by the shape rules of RopePlan::from_shapes (num_heads is q's);
  /// k has q's rank, layout, head width and token axes.
  static RopeQkPlan from_shapes(const Shape& q, const Shape& k, const Shape& cos, const Shape& sin,
                                const std::optional<Shape>& positions, const RopeAttrs& a);
  /// As above, naming the inputs in errors by the caller's names (names.x is q's).
  static RopeQkPlan from_shapes(const Shape& q, const Shape& k, const Shape& cos, const Shape& sin,
                                const std::optional<Shape>& positions, const RopeAttrs& a,
                                const RopeNames& names);
  /// Readable summary for messages and counterexamples.
  [[nodiscard]] std::string describe() const;
};

/// The cos and sin tables `[R, T]` of a RoPE call, and its position ids.
template <class T>
struct RopeTables {
  ///@{
  /// cos and sin `[R, T]`, row-major with row stride T:
  /// `c_i = cos[row*T + i]`, `s_i = sin[row*T + i]`, i < n_rot/2.
  std::span<const T> cos, sin;
  ///@}
  /// `[B·S]` table rows, for TableRows::position_ids only (empty otherwise).
  Indices positions = {};
};

/// Throws Error unless the position ids fit the plan: B·S of them, each in
/// [0, R), for position_ids rows; none for the other rows.
inline void check_positions(const RopePlan& plan, const Indices& positions) {
  const auto n = static_cast<std::int64_t>(positions.size());
  if (plan.rows != TableRows::position_ids) {
    require(n == 0, "positions.size()", n,
            std::string("must be 0 for table_rows = ") + to_string(plan.rows));
    return;
  }
  require_size(positions.size(), plan.B * plan.S, "positions");
  for (std::size_t i = 0; i < positions.size(); ++i) {
    const std::int64_t pos = positions[i];
    require_entry(
        pos >= 0 && pos < plan.R, "positions", static_cast<std::int64_t>(i), std::to_string(pos),
        "must be in [0, max_position = " + std::to_string(plan.R) + ") (the rows of cos and sin)");
  }
}

/// Throws Error unless tables and positions fit the plan.
template <class T>
void check_tables(const RopePlan& plan, const RopeTables<T>& tables) {
  require_size(tables.cos.size(), plan.R * plan.T, "cos");
  require_size(tables.sin.size(), plan.R * plan.T, "sin");
  check_positions(plan, tables.positions);
}

/// Throws Error unless source, tables, positions and output fit the plan.
template <class T>
void check_views(const RopePlan& plan, std::span<const T> src, const RopeTables<T>& tables,
                 std::size_t out_size, const char* src_name, const char* out_name) {
  require_extent(src.size(), plan.src_extent(), src_name);
  check_tables(plan, tables);
  require_size(out_size, plan.out_size(), out_name);
}

/// What the views of a q-and-k call are called in messages.
struct RopeQkNames {
  ///@{
  /// The two sources and the two outputs, in the order of the call.
  const char *q, *k, *q_out, *k_out;
  ///@}
};
/// rope_forward_qk: q, k → q_out, k_out.
inline constexpr RopeQkNames kRopeQkForward{"q", "k", "q_out", "k_out"};
/// rope_backward_qk: dq_out, dk_out → dq, dk.
inline constexpr RopeQkNames kRopeQkBackward{"dq_out", "dk_out", "dq", "dk"};

/// Throws Error unless both sources, the tables and both outputs fit the plan.
template <class T>
void check_views(const RopeQkPlan& plan, std::span<const T> q, std::span<const T> k,
                 const RopeTables<T>& tables, std::size_t q_out, std::size_t k_out,
                 const RopeQkNames& names) {
  check_views(plan.q, q, tables, q_out, names.q, names.q_out);
  require_extent(k.size(), plan.k.src_extent(), names.k);
  require_size(k_out, plan.k.out_size(), names.k_out);
}

// ---------------------------------------------------------------------------
// Implementation

inline RopePlan RopePlan::make(const RopeParams& p) {
  require(p.batch >= 1, "batch", p.batch, "must be >= 1");
  require(p.seq >= 1, "seq", p.seq, "must be >= 1");
  require(p.head_dim >= 1, "head_dim", p.head_dim, "must be >= 1");
  require(p.width >= 1 && p.width % p.head_dim == 0, "width", p.width,
          "must be a positive multiple of head_dim = " + std::to_string(p.head_dim));
  require(p.layout != RopeLayout::thd || p.batch == 1, "batch", p.batch,
          "must be 1 for layout thd (packed tokens: seq = T)");
  const std::int64_t n_rot = p.n_rot.value_or(p.head_dim);
  require(n_rot >= 0 && n_rot % 2 == 0 && n_rot <= p.head_dim, "n_rot", n_rot,
          "must be even and <= head_dim = " + std::to_string(p.head_dim));
  const std::int64_t T = p.table_stride == 0 ? n_rot / 2 : p.table_stride;
  require(T >= n_rot / 2, "table_stride", T, "must be >= n_rot/2 = " + std::to_string(n_rot / 2));
  const std::int64_t tokens = checked_mul(p.batch, p.seq, "batch*seq");
  switch (p.rows) {
    case TableRows::position:
      require(p.table_rows >= p.seq, "table_rows", p.table_rows,
              "must be >= seq = " + std::to_string(p.seq) + " for position rows");
      break;
    case TableRows::token:
      require(p.table_rows == tokens, "table_rows", p.table_rows,
              "must be batch*seq = " + std::to_string(tokens) + " for token rows");
      break;
    case TableRows::position_ids:
      require(p.table_rows >= 1, "table_rows", p.table_rows,
              "must be >= 1 for position_ids rows (max_position)");
      break;
  }
  if (p.layout == RopeLayout::bhsd) {
    require(p.src_row_stride == 0, "src_row_stride", p.src_row_stride,
            "must be 0 for layout bhsd (a contiguous source)");
  }
  const std::int64_t stride = p.src_row_stride == 0 ? p.width : p.src_row_stride;
  require(stride >= p.width, "src_row_stride", stride,
          "must be >= width = " + std::to_string(p.width));
  checked_mul(p.table_rows, T, "cos");

  RopePlan plan;
  plan.B = p.batch;
  plan.S = p.seq;
  plan.W = p.width;
  plan.D = p.head_dim;
  plan.n_rot = n_rot;
  plan.R = p.table_rows;
  plan.T = T;
  plan.src_row_stride = stride;
  plan.style = p.style;
  plan.layout = p.layout;
  plan.rows = p.rows;
  // thd is bshd with B = 1: the same strides.
  const Layout L = p.layout == RopeLayout::bhsd ? Layout::bhsd : Layout::bshd;
  const std::int64_t H = p.width / p.head_dim;
  plan.src = Strides::of(L, p.batch, p.seq, H, p.head_dim, stride, "x");
  plan.out = Strides::of(L, p.batch, p.seq, H, p.head_dim, 0, "out");
  return plan;
}

namespace detail {

/// The RopeParams of x (called `name` in messages) by SPEC §4's shape rules.
/// `positions`, when given, must have x's token axes; the table rows come
/// from it, from a.table_rows, or from the table's shape. `names` names the
/// tables and positions.
inline RopeParams rope_params_from_shapes(const Shape& x, const std::string& name, const Shape& cos,
                                          const Shape& sin, const std::optional<Shape>& positions,
                                          const RopeAttrs& a, const RopeNames& names) {
  const std::string xs = name + ".shape", cs = names.cos + ".shape";
  const std::size_t rank = x.size();
  require(rank >= 2 && rank <= 4, xs, to_string(x), "must have rank 2, 3 or 4");
  element_count(x, xs);
  require(cos.size() == 2, cs, to_string(cos), "must be [R, T]");
  require(sin == cos, names.sin + ".shape", to_string(sin),
          "must equal " + cs + " = " + to_string(cos));
  if (a.num_heads) require(*a.num_heads >= 1, "num_heads", *a.num_heads, "must be >= 1");

  // The layout: explicit, or for rank 4 decided by num_heads (SPEC §4).
  RopeLayout L = a.layout.value_or(RopeLayout::bshd);
  if (rank == 4) {
    if (a.layout) {
      require(L != RopeLayout::thd, "layout", "thd",
              "needs rank 2 or 3 ([T, H*D] or [T, H, D]), not " + xs + " = " + to_string(x));
    } else {
      require(a.num_heads.has_value(), "layout", "(absent)",
              "is ambiguous for " + xs + " = " + to_string(x) +
                  "; give layout bshd or bhsd (or num_heads)");
      const bool dim1 = x[1] == *a.num_heads, dim2 = x[2] == *a.num_heads;
      require(dim1 != dim2, "layout", "(absent)",
              "is ambiguous for " + xs + " = " + to_string(x) + " and num_heads = " +
                  std::to_string(*a.num_heads) + "; give layout bshd or bhsd");
      L = dim1 ? RopeLayout::bhsd : RopeLayout::bshd;
    }
  } else {
    require(L != RopeLayout::bhsd, "layout", "bhsd",
            "needs rank 4 [B, H, S, D], not " + xs + " = " + to_string(x));
  }

  // Token axes, and the head axis when x has one.
  RopeParams p;
  p.layout = L;
  std::optional<std::int64_t> heads;
  Shape tokens;  // the shape positions must have
  if (rank == 4) {
    const bool bhsd = L == RopeLayout::bhsd;
    p.batch = x[0];
    p.seq = bhsd ? x[2] : x[1];
    heads = bhsd ? x[1] : x[2];
    tokens = {p.batch, p.seq};
  } else if (rank == 3 && L == RopeLayout::thd) {
    p.seq = x[0];
    heads = x[1];
    tokens = {p.seq};
  } else {
    p.batch = rank == 3 ? x[0] : 1;
    p.seq = x[rank - 2];
    tokens = rank == 3 ? Shape{p.batch, p.seq} : Shape{p.seq};
  }
  if (heads) {  // D is the last dim; num_heads and head_dim, when given, must agree
    require(!a.num_heads || *a.num_heads == *heads, xs, to_string(x),
            "must have num_heads = " + std::to_string(a.num_heads.value_or(0)) +
                " on its head axis (" + to_string(L) + ")");
    require(!a.head_dim || *a.head_dim == x.back(), "head_dim", a.head_dim.value_or(0),
            "must equal the last dim of " + xs + " = " + to_string(x));
    p.head_dim = x.back();
    p.width = checked_mul(*heads, p.head_dim, xs);
  } else {  // [B, S, H*D] or [S, H*D]: D from head_dim or num_heads
    p.width = x.back();
    require(a.head_dim || a.num_heads, "head_dim", "(absent)",
            "is required for " + xs + " = " + to_string(x) +
                " (no head axis): give head_dim or num_heads");
    if (a.head_dim) {
      p.head_dim = *a.head_dim;
      require(!a.num_heads || p.head_dim < 1 || *a.num_heads == p.width / p.head_dim, "num_heads",
              a.num_heads.value_or(0),
              "must equal the last dim of " + xs + " = " + to_string(x) +
                  " / head_dim = " + std::to_string(p.head_dim));
    } else {
      require(p.width % *a.num_heads == 0, xs, to_string(x),
              "must have a last dim divisible by num_heads = " + std::to_string(*a.num_heads));
      p.head_dim = p.width / *a.num_heads;
    }
  }

  p.n_rot = a.n_rot;
  p.style = a.style;
  p.table_rows = cos[0];
  p.table_stride = cos[1];
  const std::int64_t n_rot = a.n_rot.value_or(p.head_dim);
  // An empty table [R, 0] only where nothing is rotated.
  require(p.table_stride >= n_rot / 2 && (p.table_stride >= 1 || n_rot == 0), cs, to_string(cos),
          "must have T >= max(n_rot/2, 1) = " +
              std::to_string(std::max<std::int64_t>(n_rot / 2, 1)) + " (T = 0 only for n_rot = 0)");

  // Table rows: position ids when given, else explicit, else from the table's shape.
  if (positions) {
    require(!a.table_rows || *a.table_rows == TableRows::position_ids, "table_rows",
            to_string(a.table_rows.value_or(TableRows::position_ids)),
            "must be absent (or position_ids) when positions are given");
    require(*positions == tokens, names.positions + ".shape", to_string(*positions),
            "must be " + name + "'s token axes " +
                (tokens.size() == 2     ? "[B, S]"
                 : L == RopeLayout::thd ? "[T]"
                                        : "[S]") +
                " = " + to_string(tokens));
    p.rows = TableRows::position_ids;
  } else if (a.table_rows) {
    require(*a.table_rows != TableRows::position_ids, names.positions, "(absent)",
            "is required for table_rows = position_ids");
    p.rows = *a.table_rows;
  } else {
    const std::int64_t n = checked_mul(p.batch, p.seq, "batch*seq");
    p.rows = (p.table_rows == n && p.batch > 1) ? TableRows::token : TableRows::position;
  }
  return p;
}

}  // namespace detail

namespace detail {

/// The RopeQkParams of q and k by the rules of RopeQkPlan::from_shapes.
inline RopeQkParams rope_qk_params_from_shapes(const Shape& q, const Shape& k, const Shape& cos,
                                               const Shape& sin,
                                               const std::optional<Shape>& positions,
                                               const RopeAttrs& a, const RopeNames& names) {
  RopeQkParams p;
  p.q = detail::rope_params_from_shapes(q, names.x, cos, sin, positions, a, names);
  const std::string ks = names.k + ".shape";
  require(k.size() == q.size(), ks, to_string(k),
          std::string("must have the rank of ") + names.x + ".shape = " + to_string(q));
  RopeAttrs ak = a;  // k: q's layout and head width; its own head count
  ak.layout = p.q.layout;
  ak.head_dim = p.q.head_dim;
  ak.num_heads.reset();
  ak.table_rows = TableRows::position;  // k's rows are q's; positions are checked against q
  const RopeParams pk =
      detail::rope_params_from_shapes(k, names.k, cos, sin, std::nullopt, ak, names);
  require(pk.batch == p.q.batch && pk.seq == p.q.seq, ks, to_string(k),
          std::string("must have the token axes of ") + names.x + ".shape = " + to_string(q));
  p.k_width = pk.width;
  return p;
}

}  // namespace detail

inline RopePlan RopePlan::from_shapes(const Shape& x, const Shape& cos, const Shape& sin,
                                      const std::optional<Shape>& positions, const RopeAttrs& a) {
  return from_shapes(x, cos, sin, positions, a, RopeNames{});
}

inline RopePlan RopePlan::from_shapes(const Shape& x, const Shape& cos, const Shape& sin,
                                      const std::optional<Shape>& positions, const RopeAttrs& a,
                                      const RopeNames& names) {
  return make(detail::rope_params_from_shapes(x, names.x, cos, sin, positions, a, names));
}

inline std::string RopePlan::describe() const {
  return std::string(to_string(layout)) + " B=" + std::to_string(B) + " S=" + std::to_string(S) +
         " W=" + std::to_string(W) + " D=" + std::to_string(D) + " n_rot=" + std::to_string(n_rot) +
         " " + to_string(style) + " table=[" + std::to_string(R) + "," + std::to_string(T) + "] " +
         to_string(rows) + " src_row_stride=" + std::to_string(src_row_stride);
}

inline RopeQkPlan RopeQkPlan::make(const RopeQkParams& p) {
  RopeQkPlan plan;
  plan.q = RopePlan::make(p.q);
  RopeParams k = p.q;
  k.width = p.k_width;
  k.src_row_stride = p.k_src_row_stride;
  try {
    plan.k = RopePlan::make(k);
  } catch (const Error& e) {  // only k's width and row stride can be at fault
    throw Error("k_" + e.parameter(), "k_" + std::string(e.what()));
  }
  return plan;
}

inline RopeQkPlan RopeQkPlan::from_shapes(const Shape& q, const Shape& k, const Shape& cos,
                                          const Shape& sin, const std::optional<Shape>& positions,
                                          const RopeAttrs& a) {
  return from_shapes(q, k, cos, sin, positions, a, RopeNames{"q"});  // x is q's name
}

inline RopeQkPlan RopeQkPlan::from_shapes(const Shape& q, const Shape& k, const Shape& cos,
                                          const Shape& sin, const std::optional<Shape>& positions,
                                          const RopeAttrs& a, const RopeNames& names) {
  return make(detail::rope_qk_params_from_shapes(q, k, cos, sin, positions, a, names));
}

inline std::string RopeQkPlan::describe() const {
  return q.describe() + " | k: W=" + std::to_string(k.W) +
         " src_row_stride=" + std::to_string(k.src_row_stride);
}

// ---------------------------------------------------------------------------
// A binding's call: the inputs as the caller gives them

/// The shapes of a RoPE call's inputs as a caller gives them (SPEC §4): one
/// source or q and k, the tables as cos and sin or as one cos_sin_cache
/// `[R, 2T]` (cos | sin, vLLM's layout), and the position ids when given.
struct RopeShapes {
  Shape x;                 ///< the source (q of a q-and-k call)
  std::optional<Shape> k;  ///< the second source of a q-and-k call
  ///@{
  /// The tables: cos and sin `[R, T]`, or cos_sin_cache `[R, 2T]`.
  std::optional<Shape> cos, sin, cos_sin_cache;
  ///@}
  std::optional<Shape> positions;  ///< x's token axes: `[B, S]`, or `[T]` / `[S]`
};

/// A RoPE call by the shape rules: its params, validated, and the shapes a
/// binding reads the arrays in (SPEC §4).
struct RopeCall {
  /// params.q is the call's (one source: k_width 0); the row strides are 0:
  /// the binding sets them from the arrays.
  RopeQkParams params;
  ///@{
  /// The views of x (and k): `[B, S, W]` rows (bshd, thd) or `[B, H, S, D]`
  /// (bhsd); k's is empty for one source. The outputs have the same shapes.
  Shape x, k;
  ///@}
  /// T for a cos_sin_cache `[R, 2T]`: cos is its columns [0, T), sin [T, 2T).
  /// 0 when cos and sin are given.
  std::int64_t cache_split = 0;
};

namespace detail {

/// The view a binding reads a source of `plan` in: `[B, H, S, D]` (bhsd) or `[B, S, W]`.
inline Shape rope_view(const RopePlan& plan) {
  if (plan.layout == RopeLayout::bhsd) return {plan.B, plan.heads(), plan.S, plan.D};
  return {plan.B, plan.S, plan.W};
}

/// cos and sin `[R, T]` of the tables given (two, or one cos_sin_cache, whose
/// name `names` then gives both); sets call.cache_split.
inline std::pair<Shape, Shape> rope_tables(const RopeShapes& s, RopeNames& names, RopeCall& call) {
  if (s.cos_sin_cache) {
    const Shape& c = *s.cos_sin_cache;
    const std::string cache = names.cos_sin_cache;
    require(!s.cos && !s.sin, cache, to_string(c),
            "must not be given with " + names.cos + " and " + names.sin + ": give one of the two");
    require(c.size() == 2 && c[1] % 2 == 0, cache + ".shape", to_string(c),
            "must be [R, 2T] (cos | sin)");
    call.cache_split = c[1] / 2;
    names.cos = names.sin = cache;
    const Shape half{c[0], call.cache_split};
    return {half, half};
  }
  for (const auto& [t, name] : {std::pair{&s.cos, names.cos}, std::pair{&s.sin, names.sin}}) {
    require(t->has_value(), name, "(absent)",
            "is required: give " + names.cos + " and " + names.sin + ", or " + names.cos_sin_cache);
  }
  return {*s.cos, *s.sin};
}

/// x of rank >= 4 without a layout (nor num_heads) as `[B', S, W]` rows:
/// every axis before the last two folded into B' (SPEC §4); D defaults to W.
inline Shape rope_folded(const Shape& x, const std::optional<Shape>& positions, RopeAttrs& a,
                         const RopeNames& names) {
  const std::string xs = names.x + ".shape";
  element_count(x, xs);
  require(!positions, "layout", "(absent)",
          "is ambiguous with " + names.positions + " for " + xs + " = " + to_string(x) +
              " (read as [..., S, W] rows): give layout bshd or bhsd");
  std::int64_t B = 1;
  for (std::size_t i = 0; i + 2 < x.size(); ++i) B = checked_mul(B, x[i], xs);
  a.head_dim = a.head_dim.value_or(x.back());
  return {B, x[x.size() - 2], x.back()};
}

}  // namespace detail

/// A binding's RoPE call (SPEC §4.1): the params and views of the shapes given,
/// by RopePlan::from_shapes (RopeQkPlan::from_shapes with k), naming the
/// inputs by `names`. Beyond those rules: the tables may be one
/// cos_sin_cache; one source of rank >= 4 without layout and num_heads is
/// read as `[..., S, W]` rows (the leading axes folded into B, D defaulting
/// to W, no positions); q and k of rank 4 need a layout or num_heads.
inline RopeCall rope_call(const RopeShapes& s, const RopeAttrs& a, const RopeNames& names) {
  RopeCall call;
  RopeNames n = names;
  const auto [cos, sin] = detail::rope_tables(s, n, call);
  const bool unlaid = !a.layout && !a.num_heads && s.x.size() >= 4;
  if (s.k) {
    require(!unlaid, "layout", "(absent)",
            "must be given (bshd or bhsd) for " + names.x + ".shape = " + to_string(s.x) + " and " +
                names.k + ".shape = " + to_string(*s.k));
    call.params = detail::rope_qk_params_from_shapes(s.x, *s.k, cos, sin, s.positions, a, n);
    const RopeQkPlan plan = RopeQkPlan::make(call.params);
    call.x = detail::rope_view(plan.q);
    call.k = detail::rope_view(plan.k);
    return call;
  }
  RopeAttrs ax = a;
  const Shape x = unlaid ? detail::rope_folded(s.x, s.positions, ax, names) : s.x;
  call.params.q = detail::rope_params_from_shapes(x, n.x, cos, sin, s.positions, ax, n);
  call.x = detail::rope_view(RopePlan::make(call.params.q));
  return call;
}

}  // namespace tandem
