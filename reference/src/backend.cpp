// SPDX-License-Identifier: Apache-2.0
// The float32 reference backend: the templated reference kernels at
// T = float (sums in double) and the attention block.
#include "tandem/reference/backend.hpp"

#include "tandem/reference/attention_block.hpp"
#include "tandem/reference/kernels.hpp"

namespace tandem::reference {

Backend backend() {
  return Backend{kernels<float>(), "reference", attention_block, {}, {}};
}

}  // namespace tandem::reference
