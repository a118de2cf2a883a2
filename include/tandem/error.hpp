// SPDX-License-Identifier: Apache-2.0
/// @file error.hpp
/// @brief The one error type of tandem and the checked 64-bit size arithmetic.
///
/// Every entry point validates its whole input before it writes anything
/// (SPEC §8). An invalid call throws tandem::Error whose message names the
/// parameter, the value given and what was expected, e.g.
/// `n_rot = 5 must be even and <= head_dim = 4`.
#pragma once

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

namespace tandem {

/// Thrown by plan construction and by every kernel entry point on invalid
/// input. Output buffers are untouched when it is thrown.
class Error : public std::invalid_argument {
 public:
  /// @param parameter the name of the offending parameter (e.g. "n_rot")
  /// @param message   the whole human-readable message
  Error(std::string parameter, const std::string& message)
      : std::invalid_argument(message), parameter_(std::move(parameter)) {}

  /// The name of the parameter the message is about.
  [[nodiscard]] const std::string& parameter() const noexcept { return parameter_; }

 private:
  std::string parameter_;
};

/// Throws Error(parameter, "<parameter> = <value> <expectation>") unless `ok`.
/// Example: `require(n_rot % 2 == 0, "n_rot", n_rot, "must be even")`.
inline void require(bool ok, const std::string& parameter, std::int64_t value,
                    const std::string& expectation) {
  if (!ok) {
    throw Error(parameter, parameter + " = " + std::to_string(value) + " " + expectation);
  }
}

/// As require(), for a value that is best shown as text (a shape, a name).
inline void require(bool ok, const std::string& parameter, const std::string& value,
                    const std::string& expectation) {
  if (!ok) {
    throw Error(parameter, parameter + " = " + value + " " + expectation);
  }
}

/// a·b for non-negative sizes; throws Error naming `what` on int64 overflow.
inline std::int64_t checked_mul(std::int64_t a, std::int64_t b, const std::string& what) {
  std::int64_t r = 0;
  if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &r)) {
    throw Error(what, what + " overflows a 64-bit size (" + std::to_string(a) + " * " +
                          std::to_string(b) + ")");
  }
  return r;
}

/// a+b for non-negative sizes; throws Error naming `what` on int64 overflow.
inline std::int64_t checked_add(std::int64_t a, std::int64_t b, const std::string& what) {
  std::int64_t r = 0;
  if (a < 0 || b < 0 || __builtin_add_overflow(a, b, &r)) {
    throw Error(what, what + " overflows a 64-bit size (" + std::to_string(a) + " + " +
                          std::to_string(b) + ")");
  }
  return r;
}

}  // namespace tandem
