// SPDX-License-Identifier: Apache-2.0
/// @file indices.hpp
/// @brief A read-only view of integer metadata held as int32 or int64.
///
/// Position ids, sequence offsets and block tables arrive as int32 or int64
/// tensors. Indices reads either without a copy; every element comes back as
/// int64. Validating the values is the job of the plan header that uses them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace tandem {

/// n integers in int32 or int64 memory, read as int64.
class Indices {
 public:
  /// An empty view.
  Indices() = default;
  /// A view of int32 memory.
  Indices(std::span<const std::int32_t> v) : i32_(v.data()), size_(v.size()) {}  // NOLINT
  /// A view of int64 memory.
  Indices(std::span<const std::int64_t> v) : i64_(v.data()), size_(v.size()) {}  // NOLINT

  /// The number of elements.
  [[nodiscard]] std::size_t size() const { return size_; }
  /// True when there are no elements.
  [[nodiscard]] bool empty() const { return size_ == 0; }
  /// Element i (i < size()), widened to int64.
  [[nodiscard]] std::int64_t operator[](std::size_t i) const {
    return i64_ != nullptr ? i64_[i] : static_cast<std::int64_t>(i32_[i]);
  }

 private:
  const std::int32_t* i32_ = nullptr;
  const std::int64_t* i64_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace tandem
