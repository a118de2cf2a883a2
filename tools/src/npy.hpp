// SPDX-License-Identifier: Apache-2.0
/// @file npy.hpp
/// @brief A small, strict reader and writer of NumPy's `.npy` format.
///
/// Reads format versions 1.0, 2.0 and 3.0, C order, little-endian
/// `<f4`, `<f8`, `<f2`, `<u2`, `<i4`, `<i8`, `|i1`, `|u1` and `|b1` arrays of
/// any rank; every value is converted to float32 (exactly, but for `<f8`).
/// `<u2` holds bit patterns (bfloat16's, when a case declares it, SPEC §9.4)
/// and `|i1`/`|u1` the codes of a quantized cache (int8, e4m3 bits). Writes `<f4`, C order,
/// version 1.0 (2.0 only when the header does not fit 1.0's 16-bit length).
/// A malformed file raises NpyError; nothing a file says is trusted: the
/// header is parsed by a strict grammar, sizes are overflow-checked 64-bit
/// integers and the data length must match the shape exactly.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/shape.hpp"

namespace tandem::tool {

/// A malformed or unsupported `.npy` file. `field()` names the part of the
/// file at fault ("magic", "version", "header", "descr", "fortran_order",
/// "shape", "data").
class NpyError : public std::runtime_error {
 public:
  NpyError(std::string field, const std::string& message)
      : std::runtime_error(message), field_(std::move(field)) {}
  [[nodiscard]] const std::string& field() const noexcept { return field_; }

 private:
  std::string field_;
};

/// The element types tandem reads.
enum class NpyDtype { f4, f8, b1, i4, i8, f2, u2, i1, u1 };

/// "<f4", "<f8", "|b1", "<i4", "<i8", "<f2", "<u2", "|i1" or "|u1".
const char* to_string(NpyDtype dtype);
using tandem::to_string;  // shapes, layouts and mask kinds, alongside the dtype overload

/// True for `<f4` and `<f8`.
inline bool is_float(NpyDtype dtype) {
  return dtype == NpyDtype::f4 || dtype == NpyDtype::f8;
}

/// An array read from a `.npy` file: its shape (C order), the dtype it was
/// stored in and its values converted to float32 (`<f8` rounds to nearest;
/// integers and booleans convert exactly up to 2^24, and non-zero stays
/// non-zero). `<i4`, `<i8`, `<u2`, `|i1` and `|u1` arrays also keep their
/// exact values in `integers` (index inputs: sequence offsets, block tables,
/// lengths; bfloat16 bits; cache codes).
struct NpyArray {
  Shape shape;
  NpyDtype dtype = NpyDtype::f4;
  std::vector<float> values;
  std::vector<std::int64_t> integers = {};  ///< exact values of integer arrays; empty otherwise
};

/// True for `<i4` and `<i8`.
inline bool is_integer(NpyDtype dtype) {
  return dtype == NpyDtype::i4 || dtype == NpyDtype::i8;
}

/// The parsed header of a `.npy` file.
struct NpyHeader {
  int major = 0, minor = 0;
  NpyDtype dtype = NpyDtype::f4;
  Shape shape;
  std::size_t data_offset = 0;  ///< bytes before the first element
  std::int64_t count = 0;       ///< number of elements (overflow-checked)
};

/// Parses the header of `bytes` (a whole `.npy` file) and checks that the
/// data that follows holds exactly `count` elements. Throws NpyError.
NpyHeader parse_npy_header(std::string_view bytes);

/// Parses a whole `.npy` file held in memory. Throws NpyError.
NpyArray parse_npy(std::string_view bytes);

/// Reads and parses the file at `path`. Throws NpyError (also when the file
/// cannot be opened or read).
NpyArray read_npy(const std::string& path);

/// The bytes of a `<f4`, C-order, version 1.0 `.npy` file holding `values`
/// with `shape`. Throws NpyError if the sizes disagree.
std::string encode_npy(const Shape& shape, const std::vector<float>& values);

/// Writes encode_npy(shape, values) to `path`. Throws NpyError on I/O failure.
void write_npy(const std::string& path, const Shape& shape, const std::vector<float>& values);

}  // namespace tandem::tool
