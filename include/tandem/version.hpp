// SPDX-License-Identifier: Apache-2.0
/// @file version.hpp
/// @brief tandem's version.
#pragma once

namespace tandem {
/// The library version, "major.minor.patch".
inline constexpr const char* version = "0.1.0";
}  // namespace tandem
