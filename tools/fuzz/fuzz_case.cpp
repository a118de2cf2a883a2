// SPDX-License-Identifier: Apache-2.0
// libFuzzer target for the case loader. The input is case.json text, a NUL
// byte, then the shapes of the inputs case.json names (in name order): one
// byte rank (mod 7), then one byte per dimension (< 0xF0: that value mod 33;
// 0xF0..0xFD: 2^(48 + b − 0xF0); 0xFE: 2^62; 0xFF: INT64_MAX).
//
// parse_case_json and plan_case must return or throw CaseError — never crash,
// hang, overflow or throw anything else. When every tensor is small, the
// reference backend then runs the plan on the remaining bytes as data (index
// inputs — positions, cu_seqlens, seqused_k, block tables, cache lengths — as
// integers in [−16, 15], valid or not; a quantized cache's codes as bytes and
// its scales >= 0; every value exact in the case's storage type, SPEC §9.4),
// so a plan that admits a shape the
// kernel cannot handle, or an index the validation lets through, shows up
// under ASan.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <string_view>

#include "case.hpp"
#include "tandem/reference/backend.hpp"

namespace {

std::int64_t dim_of(std::uint8_t b) {
  if (b < 0xF0) return b % 33;
  if (b == 0xFF) return std::numeric_limits<std::int64_t>::max();
  if (b == 0xFE) return std::int64_t{1} << 62;
  return std::int64_t{1} << (48 + (b - 0xF0));
}

constexpr std::int64_t kMaxRunElements = 512;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tandem::tool;
  const auto* nul = static_cast<const std::uint8_t*>(std::memchr(data, 0, size));
  const std::size_t json_len = nul ? static_cast<std::size_t>(nul - data) : size;
  const std::string_view json(reinterpret_cast<const char*>(data), json_len);
  std::size_t pos = nul ? json_len + 1 : size;
  const auto next = [&]() -> std::uint8_t { return pos < size ? data[pos++] : 0; };

  Case c;
  try {
    c.spec = parse_case_json(json, "fuzz");
    std::map<std::string, tandem::Shape> shapes;
    for (const auto& [name, file] : c.spec.inputs) {
      tandem::Shape s(next() % 7);
      for (auto& d : s) d = dim_of(next());
      shapes[name] = s;
    }
    c.planned = plan_case(c.spec, shapes);
    // Run small cases on the reference with the remaining bytes as values.
    for (const auto& [name, shape] : shapes) {
      std::int64_t n = 1;
      for (std::int64_t d : shape) {
        if (d > kMaxRunElements || (n *= d) > kMaxRunElements) return 0;
      }
      NpyArray a;
      a.shape = shape;
      a.values.resize(static_cast<std::size_t>(n));
      if (is_index_input(name)) {  // indices: small signed integers
        a.dtype = NpyDtype::i4;
        a.integers.resize(a.values.size());
        for (std::size_t i = 0; i < a.values.size(); ++i) {
          a.integers[i] = static_cast<std::int8_t>(next()) / 8;
          a.values[i] = static_cast<float>(a.integers[i]);
        }
      } else if ((name == "k" || name == "v") && c.spec.kv_cache != tandem::KvCache::plain) {
        // a quantized cache's codes: any byte (int8, or e4m3 bits with its NaNs)
        a.dtype = c.spec.kv_cache == tandem::KvCache::int8 ? NpyDtype::i1 : NpyDtype::u1;
        a.integers.resize(a.values.size());
        for (std::size_t i = 0; i < a.values.size(); ++i) {
          const std::uint8_t b = next();
          a.integers[i] = a.dtype == NpyDtype::i1 ? static_cast<std::int8_t>(b) : b;
          a.values[i] = static_cast<float>(a.integers[i]);
        }
      } else if (name == "k_scale" || name == "v_scale") {
        for (auto& v : a.values) v = static_cast<float>(next()) / 64.0f;  // >= 0, finite
      } else {
        // int8/16: exact in bf16 and f16 as in float32, so every storage type reads it
        for (auto& v : a.values) v = static_cast<float>(static_cast<std::int8_t>(next())) / 16.0f;
      }
      c.inputs[name] = CaseTensor{c.spec.inputs.at(name), std::move(a)};
    }
    for (const auto& [name, shape] : c.planned.outputs) {
      std::int64_t n = 1;
      for (std::int64_t d : shape) {
        if (d > kMaxRunElements || (n *= d) > kMaxRunElements) return 0;
      }
    }
    const auto outputs = run_case(c, tandem::reference::backend());
    for (const auto& [name, values] : outputs) {
      std::int64_t n = 1;
      for (std::int64_t d : c.planned.outputs.at(name)) n *= d;
      if (static_cast<std::int64_t>(values.size()) != n) __builtin_trap();
    }
  } catch (const CaseError&) {
  }
  return 0;
}
