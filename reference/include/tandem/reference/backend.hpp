// SPDX-License-Identifier: Apache-2.0
/// @file reference/backend.hpp
/// @brief The reference backend as a tandem::Backend (float32, bfloat16 and
///        float16 storage, every sum accumulated in double; SPEC §10.2).
#pragma once

#include "tandem/backend.hpp"

namespace tandem::reference {

/// The reference backend, named "reference": float32 entry points, and bf16, f16 ones.
Backend backend();

}  // namespace tandem::reference
