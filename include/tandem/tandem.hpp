// SPDX-License-Identifier: Apache-2.0
/// @file tandem.hpp
/// @brief The whole public API: plans, views and the backend interface.
#pragma once

#include "tandem/attention.hpp"
#include "tandem/attention_block.hpp"
#include "tandem/attention_plan.hpp"
#include "tandem/attention_shapes.hpp"
#include "tandem/attention_views.hpp"
#include "tandem/axial_rope.hpp"
#include "tandem/backend.hpp"
#include "tandem/error.hpp"
#include "tandem/flex_mod.hpp"
#include "tandem/indices.hpp"
#include "tandem/kernels.hpp"
#include "tandem/rope.hpp"
#include "tandem/shape.hpp"
#include "tandem/swiglu.hpp"
#include "tandem/version.hpp"
