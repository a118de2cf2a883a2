// SPDX-License-Identifier: Apache-2.0
/// @file buffer.hpp
/// @brief The one float buffer of the optimized kernels: aligned for whole
///        vector loads of any Highway target, zero-filled unless asked not to
///        be, on huge pages when large.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <span>
#include <utility>

namespace tandem::optimized {

/// A float buffer of n elements. Aligned to 128 bytes (two cache lines, any
/// vector width); from 4 MiB up aligned to 2 MiB and marked for huge pages
/// (fewer TLB misses on the micro-kernel's streaming reads). Every buffer is
/// allocated before a kernel writes any output, so an allocation failure
/// (std::bad_alloc) leaves the outputs untouched.
class Buffer {
 public:
  /// Whether a new buffer is zero-filled: `uninitialized` where every element
  /// is written before it is read, so that its pages are first touched by the
  /// threads that fill them.
  enum class Init { zero, uninitialized };

  Buffer() = default;
  explicit Buffer(std::int64_t n, Init init = Init::zero) { resize(n, init); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  Buffer& operator=(Buffer&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
    return *this;
  }
  ~Buffer() { std::free(data_); }

  /// Replaces the contents by n elements (zero unless `uninitialized`).
  void resize(std::int64_t n, Init init = Init::zero) {
    std::free(data_);
    data_ = nullptr;
    size_ = 0;
    constexpr std::size_t kHugePage = std::size_t{2} << 20;
    const std::size_t bytes =
        static_cast<std::size_t>(std::max<std::int64_t>(n, 1)) * sizeof(float);
    const bool big = bytes >= 2 * kHugePage;
    const std::size_t align = big ? kHugePage : 128;
    const std::size_t padded = (bytes + align - 1) / align * align;
    data_ = static_cast<float*>(std::aligned_alloc(align, padded));
    if (data_ == nullptr) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
    if (big) madvise(data_, padded, MADV_HUGEPAGE);
#endif
    if (init == Init::zero) std::memset(data_, 0, bytes);
    size_ = std::max<std::int64_t>(n, 0);
  }

  [[nodiscard]] float* get() const {
    return data_;
  }
  [[nodiscard]] std::int64_t size() const {
    return size_;
  }
  [[nodiscard]] std::span<float> span() const {
    return {data_, static_cast<std::size_t>(size_)};
  }

 private:
  float* data_ = nullptr;
  std::int64_t size_ = 0;
};

}  // namespace tandem::optimized
