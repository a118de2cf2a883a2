// SPDX-License-Identifier: Apache-2.0
/// @file rope.hpp
/// @brief The RoPE plan (rotary position embedding, SPEC §4).
///
/// x is folded to `[B', S, W]` (every axis before the last two becomes B');
/// each row holds W/D heads of width D. With `c_i = cos[row*T + i]`,
/// `s_i = sin[row*T + i]`, `m = n_rot/2`, per head and i < m:
///  - neox:  `y[i] = x[i]c_i − x[i+m]s_i`,   `y[i+m] = x[i+m]c_i + x[i]s_i`
///  - gptj:  `y[2i] = x[2i]c_i − x[2i+1]s_i`, `y[2i+1] = x[2i+1]c_i + x[2i]s_i`
/// and dims n_rot..D−1 pass through. The backward applies the transpose
/// (rotation by −angle) to dy with the same table rows.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "tandem/error.hpp"
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

/// Which table row token (b', s) reads.
enum class TableRows {
  position,  ///< row s; needs R >= S
  token,     ///< row b'·S + s; needs R == B'·S
};

/// "position" or "token".
inline const char* to_string(TableRows r) {
  return r == TableRows::position ? "position" : "token";
}

/// Explicit parameters of a RoPE call (x folded to [batch, seq, width]).
struct RopeParams {
  std::int64_t batch = 1;                ///< B'
  std::int64_t seq = 0;                  ///< S
  std::int64_t width = 0;                ///< W, a multiple of head_dim
  std::int64_t head_dim = 0;             ///< D
  std::optional<std::int64_t> n_rot;     ///< even, 0..D; defaults to D
  RopeStyle style = RopeStyle::neox;     ///< which elements form a rotated pair
  std::int64_t table_rows = 0;           ///< R
  std::int64_t table_stride = 0;         ///< T >= n_rot/2; 0 means n_rot/2
  TableRows rows = TableRows::position;  ///< which table row token (b', s) reads
  std::int64_t src_row_stride = 0;       ///< distance between source rows; 0 = W
};

/// Attributes of a case file's rope op (SPEC §9).
struct RopeAttrs {
  std::optional<std::int64_t> head_dim;  ///< required unless x has rank >= 4 (then x's last dim)
  std::optional<std::int64_t> n_rot;     ///< rotated dims, even, 0..D; defaults to D
  RopeStyle style = RopeStyle::neox;     ///< which elements form a rotated pair
  std::optional<TableRows> table_rows;   ///< from shapes when absent
};

/// One RoPE call, validated.
struct RopePlan {
  ///@{
  /// x folded to `[B', S, W]`: B' batch (every axis before the last two), S tokens, W row width
  /// (W/D heads), D head width, n_rot rotated dims (even, <= D).
  std::int64_t B = 0, S = 0, W = 0, D = 0, n_rot = 0;
  ///@}
  ///@{
  std::int64_t R = 0, T = 0;  ///< table rows and row stride
  ///@}
  std::int64_t src_row_stride = 0;    ///< source (x or dy) row stride, >= W
  RopeStyle style = RopeStyle::neox;  ///< neox (i, i+m) or gptj (2i, 2i+1) pairs
  /// table row of token (b', s): s (position) or b'·S + s (token)
  TableRows rows = TableRows::position;

  /// W / D heads per row.
  [[nodiscard]] std::int64_t heads() const { return W / D; }
  /// The table row that token (b, s) reads.
  [[nodiscard]] std::int64_t table_row(std::int64_t b, std::int64_t s) const {
    return rows == TableRows::position ? s : b * S + s;
  }
  /// Elements a strided source must hold: (B·S − 1)·src_row_stride + W.
  [[nodiscard]] std::int64_t src_extent() const { return (B * S - 1) * src_row_stride + W; }
  /// Elements of the contiguous output: B·S·W.
  [[nodiscard]] std::int64_t out_size() const { return B * S * W; }

  /// Validates by SPEC §8 — the only place that does.
  static RopePlan make(const RopeParams& p);
  /// x of rank >= 2 folded to [B', S, W]; cos and sin of shape [R, T].
  static RopePlan from_shapes(const Shape& x, const Shape& cos, const Shape& sin,
                              const RopeAttrs& a);
  /// Readable summary for messages and counterexamples.
  [[nodiscard]] std::string describe() const;
};

/// The cos and sin tables `[R, T]` of a RoPE call.
template <class T>
struct RopeTables {
  ///@{
  /// cos and sin `[R, T]`, row-major with row stride T:
  /// `c_i = cos[row*T + i]`, `s_i = sin[row*T + i]`, i < n_rot/2.
  std::span<const T> cos, sin;
  ///@}
};

/// Throws Error unless source, tables and output fit the plan.
template <class T>
void check_views(const RopePlan& plan, std::span<const T> src, const RopeTables<T>& tables,
                 std::size_t out_size, const char* src_name, const char* out_name) {
  require_extent(src.size(), plan.src_extent(), src_name);
  require_size(tables.cos.size(), plan.R * plan.T, "cos");
  require_size(tables.sin.size(), plan.R * plan.T, "sin");
  require_size(out_size, plan.out_size(), out_name);
}

// ---------------------------------------------------------------------------
// Implementation

inline RopePlan RopePlan::make(const RopeParams& p) {
  require(p.batch >= 1, "batch", p.batch, "must be >= 1");
  require(p.seq >= 1, "seq", p.seq, "must be >= 1");
  require(p.head_dim >= 1, "head_dim", p.head_dim, "must be >= 1");
  require(p.width >= 1 && p.width % p.head_dim == 0, "width", p.width,
          "must be a positive multiple of head_dim = " + std::to_string(p.head_dim));
  const std::int64_t n_rot = p.n_rot.value_or(p.head_dim);
  require(n_rot >= 0 && n_rot % 2 == 0 && n_rot <= p.head_dim, "n_rot", n_rot,
          "must be even and <= head_dim = " + std::to_string(p.head_dim));
  const std::int64_t T = p.table_stride == 0 ? n_rot / 2 : p.table_stride;
  require(T >= n_rot / 2, "table_stride", T, "must be >= n_rot/2 = " + std::to_string(n_rot / 2));
  const std::int64_t rows = checked_mul(p.batch, p.seq, "batch*seq");
  if (p.rows == TableRows::position) {
    require(p.table_rows >= p.seq, "table_rows", p.table_rows,
            "must be >= seq = " + std::to_string(p.seq) + " for position rows");
  } else {
    require(p.table_rows == rows, "table_rows", p.table_rows,
            "must be batch*seq = " + std::to_string(rows) + " for token rows");
  }
  const std::int64_t stride = p.src_row_stride == 0 ? p.width : p.src_row_stride;
  require(stride >= p.width, "src_row_stride", stride,
          "must be >= width = " + std::to_string(p.width));
  checked_add(checked_mul(rows - 1, stride, "x"), p.width, "x");
  checked_mul(rows, p.width, "out");
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
  plan.rows = p.rows;
  return plan;
}

inline RopePlan RopePlan::from_shapes(const Shape& x, const Shape& cos, const Shape& sin,
                                      const RopeAttrs& a) {
  require(x.size() >= 2, "x.shape", to_string(x), "must have rank >= 2");
  element_count(x, "x.shape");
  require(cos.size() == 2, "cos.shape", to_string(cos), "must be [R, T]");
  require(sin == cos, "sin.shape", to_string(sin), "must equal cos.shape = " + to_string(cos));
  RopeParams p;
  p.batch = 1;
  for (std::size_t i = 0; i + 2 < x.size(); ++i) p.batch = checked_mul(p.batch, x[i], "x.shape");
  p.seq = x[x.size() - 2];
  p.width = x.back();
  if (a.head_dim) {
    p.head_dim = *a.head_dim;
  } else {
    require(x.size() >= 4, "head_dim", std::string("(absent)"),
            "is required for x.shape = " + to_string(x) + " (rank < 4)");
    p.head_dim = p.width;
  }
  p.n_rot = a.n_rot;
  p.style = a.style;
  p.table_rows = cos[0];
  p.table_stride = cos[1];
  const std::int64_t n_rot = a.n_rot.value_or(p.head_dim);
  require(
      p.table_stride >= n_rot / 2 && p.table_stride >= 1, "cos.shape", to_string(cos),
      "must have T >= max(n_rot/2, 1) = " + std::to_string(std::max<std::int64_t>(n_rot / 2, 1)));
  if (a.table_rows) {
    p.rows = *a.table_rows;
  } else {
    p.rows =
        (p.table_rows == p.batch * p.seq && p.batch > 1) ? TableRows::token : TableRows::position;
  }
  return make(p);
}

inline std::string RopePlan::describe() const {
  return "B'=" + std::to_string(B) + " S=" + std::to_string(S) + " W=" + std::to_string(W) +
         " D=" + std::to_string(D) + " n_rot=" + std::to_string(n_rot) + " " + to_string(style) +
         " table=[" + std::to_string(R) + "," + std::to_string(T) + "] " + to_string(rows) +
         " src_row_stride=" + std::to_string(src_row_stride);
}

}  // namespace tandem
