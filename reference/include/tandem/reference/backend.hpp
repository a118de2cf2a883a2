// SPDX-License-Identifier: Apache-2.0
/// @file reference/backend.hpp
/// @brief The reference backend as a tandem::Backend (float32 in, float32
///        out, every sum accumulated in double).
#pragma once

#include "tandem/backend.hpp"

namespace tandem::reference {

/// The float32 reference backend, named "reference".
Backend backend();

}  // namespace tandem::reference
