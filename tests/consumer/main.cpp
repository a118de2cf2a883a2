// SPDX-License-Identifier: Apache-2.0
// One small attention call through an installed tandem: two queries, two
// keys, one head of width 2, so the answer is worked out by hand below.
#include <cmath>
#include <cstdio>
#include <vector>

#include "tandem/reference/backend.hpp"
#include "tandem/tandem.hpp"
#ifdef CONSUMER_HAVE_OPTIMIZED
#include "tandem/optimized/backend.hpp"
#endif

namespace {

int check(const tandem::Backend& backend) {
  // q = k = identity rows, v = [[1, 2], [3, 4]], scale 1/sqrt(2), no mask:
  // query 0 weighs key 0 by p = e^{1/sqrt 2} / (e^{1/sqrt 2} + 1), key 1 by 1 − p,
  // so out[0] = p·[1, 2] + (1 − p)·[3, 4] = [3 − 2p, 4 − 2p]; query 1 mirrors it.
  const std::vector<float> q = {1, 0, 0, 1}, k = {1, 0, 0, 1}, v = {1, 2, 3, 4};
  tandem::AttentionAttrs attrs;
  attrs.num_heads = 1;
  const auto plan =
      tandem::AttentionPlan::from_shapes({1, 2, 2}, {1, 2, 2}, {1, 2, 2}, std::nullopt, attrs);
  std::vector<float> out(4, -1.0f);
  backend.attention_forward(plan, {q, k, v}, out);
  const double p = std::exp(1 / std::sqrt(2.0)) / (std::exp(1 / std::sqrt(2.0)) + 1);
  const double want[4] = {3 - 2 * p, 4 - 2 * p, 1 + 2 * p, 2 + 2 * p};
  int bad = 0;
  for (int i = 0; i < 4; ++i) {
    if (std::fabs(out[i] - want[i]) > 1e-5) {
      std::printf("%s: out[%d] = %.7f, expected %.7f\n", backend.name.c_str(), i, out[i], want[i]);
      ++bad;
    }
  }
  std::printf("%s: out = [%.6f, %.6f, %.6f, %.6f] %s\n", backend.name.c_str(), out[0], out[1],
              out[2], out[3], bad ? "WRONG" : "ok");
  return bad;
}

}  // namespace

int main() {
  std::printf("tandem %s\n", tandem::version);
  int bad = check(tandem::reference::backend());
#ifdef CONSUMER_HAVE_OPTIMIZED
  bad += check(tandem::optimized::backend());
#endif
  return bad == 0 ? 0 : 1;
}
