// SPDX-License-Identifier: Apache-2.0
/// @file arrays.hpp
/// @brief NumPy arrays and PyTorch tensors (anything nanobind takes through
///        the buffer protocol or DLPack) as the spans of tandem's views,
///        without copying: an array is accepted when its shape and strides
///        are exactly those the plan expects, and is otherwise rejected with
///        a tandem::Error naming it.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tandem/error.hpp"
#include "tandem/indices.hpp"
#include "tandem/shape.hpp"
#include "tandem/storage.hpp"

namespace tandem::python {

namespace nb = nanobind;

/// A read-only CPU array of any element type and rank.
using In = nb::ndarray<nb::ro, nb::device::cpu>;
/// A writable CPU array of any element type and rank.
using Out = nb::ndarray<nb::device::cpu>;

/// The element types the kernels take (SPEC §10.1): the storage type of a
/// call, read from its first input.
enum class Dtype { float32, float64, bfloat16, float16 };

/// True for the DLPack type of a bf16 array: torch's bfloat16 (DLPack code
/// kDLBfloat, 16 bits), or the bits of NumPy's ml_dtypes.bfloat16, which
/// neither DLPack nor the buffer protocol carries: the package passes such
/// an array as its uint16 view (no copy; tandem/_arrays.py, `crossing`). A
/// float input of another integer type never gets here: the package
/// rejects it by name first.
inline bool is_bfloat16(nb::dlpack::dtype t) {
  const auto bf = static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bfloat);
  return t.bits == 16 && t.lanes == 1 && (t.code == bf || t == nb::dtype<std::uint16_t>());
}

/// True for float16 (DLPack kDLFloat, 16 bits; NumPy's float16, torch's half).
inline bool is_float16(nb::dlpack::dtype t) {
  return t.bits == 16 && t.lanes == 1 &&
         t.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Float);
}

/// The name of a Dtype, as NumPy and torch write it.
inline const char* dtype_name(Dtype t) {
  switch (t) {
    case Dtype::float32:
      return "float32";
    case Dtype::float64:
      return "float64";
    case Dtype::bfloat16:
      return "bfloat16";
    case Dtype::float16:
      return "float16";
  }
  return "?";
}

/// The Dtype of a DLPack type; nullopt for the others.
inline std::optional<Dtype> dtype_code(nb::dlpack::dtype t) {
  if (t == nb::dtype<float>()) return Dtype::float32;
  if (t == nb::dtype<double>()) return Dtype::float64;
  if (is_bfloat16(t)) return Dtype::bfloat16;
  if (is_float16(t)) return Dtype::float16;
  return std::nullopt;
}

/// "float32", "bfloat16", ..., or the DLPack code of another type.
inline std::string dtype_name(nb::dlpack::dtype t) {
  if (const std::optional<Dtype> d = dtype_code(t)) return dtype_name(*d);
  return "(dlpack code " + std::to_string(t.code) + ", " + std::to_string(t.bits) + " bits)";
}

const char* const kDtypes = "float32, float64, bfloat16 or float16";

/// The element type of `a`; throws Error naming `name` unless float32,
/// float64, bfloat16 or float16.
template <class A>
Dtype dtype_of(const A& a, const std::string& name) {
  if (const std::optional<Dtype> d = dtype_code(a.dtype())) return *d;
  throw Error(name + ".dtype", name + ".dtype = " + dtype_name(a.dtype()) + " must be " + kDtypes);
}

/// The Dtype of a scalar type.
template <class T>
constexpr Dtype dtype_v = std::is_same_v<T, float>      ? Dtype::float32
                          : std::is_same_v<T, double>   ? Dtype::float64
                          : std::is_same_v<T, bfloat16> ? Dtype::bfloat16
                                                        : Dtype::float16;

/// The name of the first input of a call, whose dtype is the call's storage
/// type T (every other floating input must have it, SPEC §10.1); set by
/// with_dtype (module.cpp) for the duration of the call's checks.
inline thread_local std::string first_input = "the first input";

/// Where an array must sit: its shape and its strides in elements (strides
/// of size-1 axes, and of empty arrays, are never looked at: NumPy and
/// PyTorch leave them free).
struct Expect {
  Shape shape;
  Shape strides;
};

/// Contiguous (C order) strides of `shape`.
inline Expect contiguous(const Shape& shape) {
  Shape strides(shape.size(), 1);
  for (std::size_t i = shape.size(); i-- > 1;) strides[i - 1] = strides[i] * shape[i];
  return {shape, strides};
}

/// The number of elements of an array's shape (an existing array's count
/// cannot overflow, and shape.hpp's element_count builds its error message
/// eagerly: too slow for every call).
inline std::int64_t count(const Shape& shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

/// The shape of `a`.
template <class A>
Shape shape_of(const A& a) {
  Shape s(a.ndim());
  for (std::size_t i = 0; i < a.ndim(); ++i) s[i] = static_cast<std::int64_t>(a.shape(i));
  return s;
}

/// Throws Error(parameter, "<parameter> = <value> <expectation>"). The
/// checks below build their messages only when they fail: a call's checks
/// run on every kernel call from Python.
[[noreturn]] inline void fail(const std::string& parameter, const std::string& value,
                              const std::string& expectation) {
  throw Error(parameter, parameter + " = " + value + " " + expectation);
}

/// Throws Error naming `name` unless `a` has the shape and strides of `e`
/// (its element type is checked by the caller).
template <class A>
void require_shape(const A& a, const std::string& name, const Expect& e) {
  bool same = a.ndim() == e.shape.size();
  for (std::size_t i = 0; same && i < a.ndim(); ++i) {
    same = static_cast<std::int64_t>(a.shape(i)) == e.shape[i];
  }
  if (!same) fail(name + ".shape", to_string(shape_of(a)), "must be " + to_string(e.shape));
  if (count(e.shape) == 0) return;  // an empty array has no layout
  for (std::size_t i = 0; i < a.ndim(); ++i) {
    if (e.shape[i] != 1 && a.stride(i) != e.strides[i]) {
      Shape strides(a.ndim());
      for (std::size_t j = 0; j < a.ndim(); ++j) strides[j] = a.stride(j);
      fail(name + ".strides", to_string(strides),
           "must be " + to_string(e.strides) + " (elements) for shape " + to_string(e.shape));
    }
  }
}

/// Throws Error naming `name` unless `a` has the shape and strides of `e`
/// and the element type T, the call's storage type.
template <class T, class A>
void require_layout(const A& a, const std::string& name, const Expect& e) {
  if (dtype_of(a, name) != dtype_v<T>) {
    fail(name + ".dtype", dtype_name(a.dtype()),
         std::string("must be ") + dtype_name(dtype_v<T>) + " (the dtype of " + first_input +
             ": one call has one storage type, SPEC §10.1)");
  }
  require_shape(a, name, e);
}

/// The span of `extent` elements that starts at a's first element.
template <class T>
std::span<const T> in_span(const In& a, const std::string& name, const Expect& e,
                           std::int64_t extent) {
  require_layout<T>(a, name, e);
  return {static_cast<const T*>(a.data()), static_cast<std::size_t>(extent)};
}

/// The writable span of `a`, which must be contiguous with shape `shape`.
template <class T>
std::span<T> out_span(const Out& a, const std::string& name, const Shape& shape) {
  require_layout<T>(a, name, contiguous(shape));
  return {static_cast<T*>(a.data()), static_cast<std::size_t>(count(shape))};
}

/// As out_span, or an empty span for an absent output.
template <class T>
std::span<T> out_span(const std::optional<Out>& a, const std::string& name, const Shape& shape) {
  return a ? out_span<T>(*a, name, shape) : std::span<T>{};
}

/// A float32 input whatever the call's storage type (the mask, ALiBi
/// slopes, lse of a bf16 or f16 call, the scales of a quantized cache; SPEC
/// §10.1) with the shape and strides of `e`.
inline std::span<const float> float_span(const In& a, const std::string& name, const Expect& e,
                                         std::int64_t extent) {
  if (a.dtype() != nb::dtype<float>())
    fail(name + ".dtype", dtype_name(a.dtype()), "must be float32");
  require_shape(a, name, e);
  return {static_cast<const float*>(a.data()), static_cast<std::size_t>(extent)};
}

/// The writable float32 span of `a` (lse, scales), contiguous with shape `shape`.
inline std::span<float> float_out_span(const Out& a, const std::string& name, const Shape& shape) {
  if (a.dtype() != nb::dtype<float>())
    fail(name + ".dtype", dtype_name(a.dtype()), "must be float32");
  require_shape(a, name, contiguous(shape));
  return {static_cast<float*>(a.data()), static_cast<std::size_t>(count(shape))};
}

/// A float32 mask (keep mask or additive bias) of shape `shape`, contiguous;
/// an empty span when absent.
inline std::span<const float> mask_span(const std::optional<In>& a, const Shape& shape) {
  if (!a) return {};
  return float_span(*a, "mask", contiguous(shape), count(shape));
}

/// The 8-bit codes of a quantized cache (SPEC §10.4) in the layout of `e`:
/// int8 for kv_cache int8, uint8 (the bits of float8 e4m3fn) for e4m3.
template <class A>
std::span<const std::uint8_t> code_span(const A& a, const std::string& name, const Expect& e,
                                        std::int64_t extent, bool int8) {
  const bool ok =
      int8 ? a.dtype() == nb::dtype<std::int8_t>() : a.dtype() == nb::dtype<std::uint8_t>();
  if (!ok) {
    fail(name + ".dtype", dtype_name(a.dtype()),
         int8 ? "must be int8 (the codes of an int8 cache)"
              : "must be uint8 (the bits of float8 e4m3fn codes)");
  }
  require_shape(a, name, e);
  return {static_cast<const std::uint8_t*>(a.data()), static_cast<std::size_t>(extent)};
}

/// The integers of an index input (cu_seqlens, seqused_k, block tables,
/// cache lengths, RoPE positions) as an Indices view of the caller's memory:
/// `a` must be int32 or int64, contiguous, of shape `shape`; an empty view
/// when absent. Throws Error naming `name` otherwise.
inline Indices index_view(const std::optional<In>& a, const std::string& name, const Shape& shape) {
  if (!a) return {};
  const bool i32 = a->dtype() == nb::dtype<std::int32_t>(),
             i64 = a->dtype() == nb::dtype<std::int64_t>();
  if (!i32 && !i64) {
    fail(name + ".dtype",
         "(dlpack code " + std::to_string(a->dtype().code) + ", " +
             std::to_string(a->dtype().bits) + " bits)",
         "must be int32 or int64");
  }
  bool same = a->ndim() == shape.size();
  for (std::size_t i = 0; same && i < a->ndim(); ++i) {
    same = static_cast<std::int64_t>(a->shape(i)) == shape[i];
  }
  if (!same) fail(name + ".shape", to_string(shape_of(*a)), "must be " + to_string(shape));
  const Expect e = contiguous(shape);
  for (std::size_t i = 0; i < a->ndim() && count(shape) > 0; ++i) {
    if (shape[i] != 1 && a->stride(i) != e.strides[i]) {
      fail(name + ".strides", "(not contiguous)", "must be contiguous");
    }
  }
  const auto n = static_cast<std::size_t>(count(shape));
  if (i32) return std::span<const std::int32_t>(static_cast<const std::int32_t*>(a->data()), n);
  return std::span<const std::int64_t>(static_cast<const std::int64_t*>(a->data()), n);
}

}  // namespace tandem::python
