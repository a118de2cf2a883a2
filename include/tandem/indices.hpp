// SPDX-License-Identifier: Apache-2.0
/// @file indices.hpp
/// @brief A read-only view of integer metadata (sequence offsets, block
///        tables, cache lengths) held as int32 or int64, read without a copy.
///
/// Frameworks keep such metadata as int32 tensors (FlashAttention's
/// cu_seqlens, vLLM's block tables) or int64 ones (PyTorch's default integer
/// type); an Indices view reads either and hands out int64_t, so no caller
/// converts and no kernel cares which one it got.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tandem/error.hpp"

namespace tandem {

/// A read-only view of n integers stored as int32 or int64; `x[i]` is int64.
/// An empty view means "not given".
class Indices {
 public:
  Indices() = default;
  /// Views int32 storage (not copied: it must outlive the view).
  Indices(std::span<const std::int32_t> v) : p32_(v.data()), n_(v.size()) {}
  /// Views int64 storage (not copied: it must outlive the view).
  Indices(std::span<const std::int64_t> v) : p64_(v.data()), n_(v.size()) {}
  /// Views the elements of a vector (which must outlive the view).
  Indices(const std::vector<std::int32_t>& v) : Indices(std::span<const std::int32_t>(v)) {}
  /// Views the elements of a vector (which must outlive the view).
  Indices(const std::vector<std::int64_t>& v) : Indices(std::span<const std::int64_t>(v)) {}

  /// Number of integers viewed.
  [[nodiscard]] std::size_t size() const { return n_; }
  /// True when nothing is viewed (the input was not given).
  [[nodiscard]] bool empty() const { return n_ == 0; }
  /// Element i (unchecked, like std::span), widened to int64.
  [[nodiscard]] std::int64_t operator[](std::size_t i) const {
    return p64_ != nullptr ? p64_[i] : static_cast<std::int64_t>(p32_[i]);
  }
  /// Elements [offset, offset + count) as a view of the same storage (unchecked).
  [[nodiscard]] Indices subview(std::size_t offset, std::size_t count) const {
    Indices s;
    s.p32_ = p32_ != nullptr ? p32_ + offset : nullptr;
    s.p64_ = p64_ != nullptr ? p64_ + offset : nullptr;
    s.n_ = count;
    return s;
  }

 private:
  const std::int32_t* p32_ = nullptr;
  const std::int64_t* p64_ = nullptr;
  std::size_t n_ = 0;
};

/// Throws Error(name, "<name>[<i>] = <value> <expectation>") unless `ok`:
/// the message of a bad entry of an index or value input.
inline void require_entry(bool ok, const std::string& name, std::int64_t i,
                          const std::string& value, const std::string& expectation) {
  if (!ok) {
    throw Error(name, name + "[" + std::to_string(i) + "] = " + value + " " + expectation);
  }
}

}  // namespace tandem
