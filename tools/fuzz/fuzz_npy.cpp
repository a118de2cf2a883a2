// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: any bytes given to the .npy reader either parse or raise
// NpyError; a parsed <f4 array re-encodes to a file that parses to the same
// shape and the same bits.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "npy.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  tandem::tool::NpyArray a;
  try {
    a = tandem::tool::parse_npy(bytes);
  } catch (const tandem::tool::NpyError&) {
    return 0;
  }
  if (a.dtype != tandem::tool::NpyDtype::f4) return 0;
  const tandem::tool::NpyArray b =
      tandem::tool::parse_npy(tandem::tool::encode_npy(a.shape, a.values));
  if (b.shape != a.shape || b.values.size() != a.values.size() ||
      (!a.values.empty() &&
       std::memcmp(a.values.data(), b.values.data(), a.values.size() * sizeof(float)) != 0)) {
    std::abort();
  }
  return 0;
}
