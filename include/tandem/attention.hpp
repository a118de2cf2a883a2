// SPDX-License-Identifier: Apache-2.0
/// @file attention.hpp
/// @brief Scaled dot-product attention: the plan (attention_plan.hpp), the
///        shape rules that make one from tensor shapes (attention_shapes.hpp)
///        and the views a backend reads and writes (attention_views.hpp).
#pragma once

#include "tandem/attention_plan.hpp"
#include "tandem/attention_shapes.hpp"
#include "tandem/attention_views.hpp"
