// SPDX-License-Identifier: Apache-2.0
// The reference backend: the templated reference kernels at T = float,
// bfloat16 and float16 (sums in double), the attention block among them.
#include "tandem/reference/backend.hpp"

#include "tandem/reference/kernels.hpp"

namespace tandem::reference {

Backend backend() {
  return Backend{kernels<float>(), "reference", kernels<bfloat16>(), kernels<float16>()};
}

}  // namespace tandem::reference
