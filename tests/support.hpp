// SPDX-License-Identifier: Apache-2.0
// What the unit tests share: the check that a call throws tandem::Error
// naming a parameter, with a message that contains given fragments, its use
// on AttentionPlan::make, and the sentinel that shows an output untouched.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "tandem/attention.hpp"
#include "tandem/error.hpp"

namespace tandem::test {

/// Expects f() to throw tandem::Error whose parameter() is `parameter` and
/// whose message contains every fragment.
inline void expect_error(const std::function<void()>& f, const std::string& parameter,
                         std::initializer_list<std::string> fragments) {
  try {
    f();
  } catch (const tandem::Error& e) {
    EXPECT_EQ(e.parameter(), parameter) << "message: " << e.what();
    const std::string message = e.what();
    for (const std::string& fragment : fragments) {
      EXPECT_NE(message.find(fragment), std::string::npos)
          << "message \"" << message << "\" lacks \"" << fragment << "\"";
    }
    return;
  }
  ADD_FAILURE() << "no tandem::Error thrown (expected one about " << parameter << ")";
}

/// What an output holds before a call, to show that a rejected call left it alone.
constexpr float kSentinel = -12345.0f;

/// True when every element of x still holds kSentinel.
inline bool untouched(const std::vector<float>& x) {
  for (float e : x) {
    if (e != kSentinel) return false;
  }
  return true;
}

/// Expects AttentionPlan::make(p) to throw as expect_error() describes.
inline void expect_make_error(const tandem::AttentionParams& p, const std::string& parameter,
                              std::initializer_list<std::string> fragments) {
  expect_error([&] { tandem::AttentionPlan::make(p); }, parameter, fragments);
}

}  // namespace tandem::test
