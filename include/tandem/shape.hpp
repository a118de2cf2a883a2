// SPDX-License-Identifier: Apache-2.0
/// @file shape.hpp
/// @brief Shapes, and the strides that place element (b, s, h, d) of a
///        multi-head tensor in memory (SPEC §1).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tandem/error.hpp"

namespace tandem {

/// A tensor shape, outermost dimension first (C order).
using Shape = std::vector<std::int64_t>;

/// "[2, 5, 8]" — used in error messages and counterexamples.
inline std::string to_string(const Shape& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    s += (i ? ", " : "") + std::to_string(shape[i]);
  }
  return s + "]";
}

/// Product of the dimensions; throws Error naming `what` on overflow or a
/// negative dimension.
inline std::int64_t element_count(const Shape& shape, const std::string& what) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    require(d >= 0, what, to_string(shape), "has a negative dimension");
    n = checked_mul(n, d, what);
  }
  return n;
}

/// The two memory layouts of a multi-head tensor (SPEC §1).
enum class Layout {
  bshd,  ///< (b*S + s)*row_stride + h*Dx + d; rank-3 [B,S,H*Dx] and rank-2 [S,H*Dx] too
  bhsd,  ///< ((b*heads + h)*S + s)*Dx + d, always contiguous
};

/// "bshd" or "bhsd".
inline const char* to_string(Layout layout) {
  return layout == Layout::bshd ? "bshd" : "bhsd";
}

/// Where element (b, s, h, d) of one multi-head tensor lives:
/// `b*batch + s*seq + h*head + d`. The one place where a layout turns into
/// numbers; kernels only ever read these strides.
struct Strides {
  std::int64_t batch = 0;   ///< elements between (b, s, h) and (b+1, s, h)
  std::int64_t seq = 0;     ///< elements between (b, s, h) and (b, s+1, h)
  std::int64_t head = 0;    ///< elements between (b, s, h) and (b, s, h+1)
  std::int64_t extent = 0;  ///< the smallest span length that holds every element

  /// Offset of element (b, s, h, 0).
  [[nodiscard]] std::int64_t at(std::int64_t b, std::int64_t s, std::int64_t h) const {
    return b * batch + s * seq + h * head;
  }

  /// Strides of a [B, S, heads, width] tensor in `layout`. `row_stride` is
  /// the distance between rows (b, s) of a `bshd` tensor, >= heads*width; 0
  /// means contiguous. `what` names the tensor in overflow errors.
  static Strides of(Layout layout, std::int64_t B, std::int64_t S, std::int64_t heads,
                    std::int64_t width, std::int64_t row_stride, const std::string& what) {
    const std::int64_t row = checked_mul(heads, width, what);
    Strides st;
    if (layout == Layout::bshd) {
      const std::int64_t rs = row_stride == 0 ? row : row_stride;
      st.seq = rs;
      st.head = width;
      st.batch = checked_mul(S, rs, what);
      const std::int64_t rows = checked_mul(B, S, what);
      st.extent = rows == 0 ? 0 : checked_add(checked_mul(rows - 1, rs, what), row, what);
    } else {
      st.seq = width;
      st.head = checked_mul(S, width, what);
      st.batch = checked_mul(heads, st.head, what);
      st.extent = checked_mul(B, st.batch, what);
    }
    return st;
  }
};

/// Throws Error unless a view of length `got` has exactly `expected` elements.
inline void require_size(std::size_t got, std::int64_t expected, const std::string& name) {
  require(static_cast<std::int64_t>(got) == expected, name + ".size()",
          static_cast<std::int64_t>(got), "must be " + std::to_string(expected));
}

/// Throws Error unless a strided view of length `got` holds `extent` elements.
inline void require_extent(std::size_t got, std::int64_t extent, const std::string& name) {
  require(static_cast<std::int64_t>(got) >= extent, name + ".size()",
          static_cast<std::int64_t>(got), "must be >= " + std::to_string(extent));
}

}  // namespace tandem
