// SPDX-License-Identifier: Apache-2.0
// Testing your own kernel with tandem's property suite (docs page "Testing
// your own kernel with tandem"). This program is built and run by CTest
// (docs_example_own_backend), so the page quotes code that works.
//
// my_attention_forward is a plain float attention written against the plan:
// sizes and strides from tandem::AttentionPlan, visibility by SPEC §2. It
// replaces one entry of the reference backend; the properties then compare it
// with the double-precision reference and check the identities of the suite.
#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "support.hpp"  // props/: Subject, properties(), run_property()
#include "tandem/reference/backend.hpp"
#include "tandem/tandem.hpp"

namespace {

using std::int64_t;

// [my-kernel]
void my_attention_forward(const tandem::AttentionPlan& plan,
                          const tandem::AttentionInputs<float>& in, std::span<float> out) {
  tandem::check_inputs(plan, in);  // validate every view before writing anything
  tandem::require_size(out.size(), plan.o.extent, "out");
  const int64_t off = plan.q_offset();
  std::vector<float> p(plan.Sk);
  for (int64_t b = 0; b < plan.B; ++b)
    for (int64_t h = 0; h < plan.H; ++h)
      for (int64_t i = 0; i < plan.Sq; ++i) {
        const int64_t g = plan.kv_head(h), a = off + i;
        float m = -std::numeric_limits<float>::infinity(), l = 0.0f;
        std::vector<bool> vis(plan.Sk);
        for (int64_t j = 0; j < plan.Sk; ++j) {
          const float* mrow = in.mask.empty() ? nullptr : &in.mask[plan.mask_row(b, h, i)];
          switch (plan.mask) {
            case tandem::MaskKind::none:
              vis[j] = true;
              break;
            case tandem::MaskKind::causal:
              vis[j] = j <= a;
              break;
            case tandem::MaskKind::sliding_window:
              vis[j] = a - plan.window <= j && j <= a;
              break;
            case tandem::MaskKind::key_padding:
              vis[j] = mrow[j] != 0.0f;
              break;
            case tandem::MaskKind::bias:
              vis[j] = mrow[j] != -std::numeric_limits<float>::infinity();
          }
          if (!vis[j]) continue;
          float s = 0.0f;
          for (int64_t d = 0; d < plan.D; ++d)
            s += in.q[plan.q.at(b, i, h) + d] * in.k[plan.k.at(b, j, g) + d];
          s *= static_cast<float>(plan.scale);
          if (plan.softcap > 0) s = plan.softcap * std::tanh(s / plan.softcap);
          if (plan.mask == tandem::MaskKind::bias) s += mrow[j];
          p[j] = s;
          m = std::max(m, s);
        }
        for (int64_t j = 0; j < plan.Sk; ++j)
          if (vis[j]) l += (p[j] = std::exp(p[j] - m));
        for (int64_t d = 0; d < plan.Dv; ++d) {
          float o = 0.0f;
          for (int64_t j = 0; j < plan.Sk; ++j)
            if (vis[j]) o += p[j] / l * in.v[plan.v.at(b, j, g) + d];
          out[plan.o.at(b, i, h) + d] = o;  // 0 when no key is visible
        }
      }
}
// [my-kernel]

// [visit]
/// What is wrong with the entry points of `backend`, given those it says it
/// does not offer: an empty entry not in `not_offered`, a bound one that is
/// in it, and a name in it that is no entry point. An empty list: each entry
/// point is bound or declared not offered.
std::vector<std::string> entry_point_problems(const tandem::Backend& backend,
                                              const std::set<std::string>& not_offered) {
  std::vector<std::string> problems;
  std::set<std::string> seen;
  tandem::for_each_entry_point(backend, [&](std::string_view name, const auto& entry) {
    const std::string n(name);
    seen.insert(n);
    const bool declared = not_offered.count(n) != 0;
    if (!entry && !declared) problems.push_back("no " + n + " entry point");
    if (entry && declared) problems.push_back(n + " is bound but declared not offered");
  });
  for (const std::string& n : not_offered) {
    if (!seen.count(n)) problems.push_back(n + " is not an entry point");
  }
  return problems;
}
// [visit]

}  // namespace

int main() {
  // [register]
  tandem::Backend mine = tandem::reference::backend();  // every entry point...
  mine.name = "mine";
  mine.attention_forward = my_attention_forward;  // ...but the one under test
  // This backend has no quantized KV cache (SPEC §10.4): it says so, and
  // leaves those entry points empty rather than borrowing the reference's.
  const std::set<std::string> not_offered = {"attention_forward_quantized", "quantize_kv"};
  mine.attention_forward_quantized = nullptr;
  mine.quantize_kv = nullptr;

  tandem::props::Subject subject;
  subject.name = "mine";
  subject.backend = mine;
  subject.thread_variants = {mine};  // the same kernel at every "thread count"

  int failed = 0;
  for (const std::string& problem : entry_point_problems(mine, not_offered)) {
    std::cout << "FAIL  " << problem << "\n";
    ++failed;
  }
  for (const std::string& name : not_offered) std::cout << "not offered  " << name << "\n";
  for (const char* name :
       {"agree_attention_forward", "attention_layouts_equivalent",
        "attention_strided_rows_equal_contiguous", "gqa_equals_repeated_mha",
        "bias_upper_inf_equals_causal", "key_padding_equals_bias", "fully_masked_rows_zero",
        "masked_keys_never_read", "memory_guards_and_inputs_untouched"}) {
    const tandem::props::Property& p = tandem::props::property(name);
    const std::string failure = tandem::props::run_property(p, subject, 40, false);
    std::cout << (failure.empty() ? "pass  " : "FAIL  ") << name << "\n";
    if (!failure.empty()) {
      std::cout << failure << "\n";
      ++failed;
    }
  }
  return failed == 0 ? 0 : 1;
  // [register]
}
