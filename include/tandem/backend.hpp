// SPDX-License-Identifier: Apache-2.0
/// @file backend.hpp
/// @brief A backend: every tandem kernel entry point in float32 as one value.
///
/// The reference, the optimized backend, the deliberately broken test
/// fixtures and a user's own kernels are all Backends, so the property suite,
/// the unit tests, the benchmarks and the `tandem` command iterate over them
/// alike. The entry points and their signatures are those of Kernels<float>
/// (kernels.hpp); a Backend adds its name and the same entry points in
/// bfloat16 and float16.
#pragma once

#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "tandem/kernels.hpp"

namespace tandem {

/// The kernel entry points of one implementation: in float32
/// `backend.attention_forward(plan, in, out)` and the other members of
/// Kernels<float> (the attention block among them); in bfloat16 and float16
/// `backend.bf16.attention_forward(…)`, `backend.kernels<T>()`.
struct Backend : Kernels<float> {
  /// Short name used in reports and test names ("reference", "optimized").
  std::string name;

  ///@{
  /// The same entry points with bfloat16 and float16 storage (SPEC §10); an empty member is one
  /// the backend does not offer.
  Kernels<bfloat16> bf16;
  Kernels<float16> f16;
  ///@}

  /// The entry points at storage type T (float, bfloat16 or float16).
  template <class T>
  const Kernels<T>& kernels() const {
    if constexpr (std::is_same_v<T, bfloat16>) {
      return bf16;
    } else if constexpr (std::is_same_v<T, float16>) {
      return f16;
    } else {
      static_assert(std::is_same_v<T, float>,
                    "a Backend holds float, bfloat16 and float16 kernels");
      return *this;
    }
  }
  /// The entry points at storage type T, to bind or replace.
  template <class T>
  Kernels<T>& kernels() {
    return const_cast<Kernels<T>&>(static_cast<const Backend&>(*this).kernels<T>());
  }
};

/// for_each_entry_point(backend, visit) visits the float32 entry points of a Backend (those of
/// Kernels<float>, kernels.hpp); `backend.bf16` and `backend.f16` are visited alike.

}  // namespace tandem
