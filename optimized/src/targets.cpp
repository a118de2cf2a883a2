// SPDX-License-Identifier: Apache-2.0
// Target control of the optimized backend: which Highway targets this binary
// holds and this CPU runs, and forcing dynamic dispatch onto one of them so
// the tests can run every compiled target, the scalar fallback included.
//
// The compiled set is chosen in optimized/CMakeLists.txt (every attainable
// target: on x86 AVX3, AVX2, SSE4 and the scalar fallback). Every
// HWY_DYNAMIC_DISPATCH of the backend reads the one process-wide
// hwy::ChosenTarget, so forcing a target here redirects all kernels.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "targets.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace tandem::optimized::HWY_NAMESPACE {

/// The target this copy of the code was compiled for: dispatching to it
/// tells which target dynamic dispatch picks now.
std::int64_t CompiledTarget() {
  return HWY_TARGET;
}

}  // namespace tandem::optimized::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "bf16_dot.hpp"
#include "tandem/error.hpp"
#include "tandem/optimized/backend.hpp"

namespace tandem::optimized {
HWY_EXPORT(CompiledTarget);

std::vector<std::int64_t> supported_targets() {
  // The CPU's targets, read once, before force_target() ever narrows what
  // hwy::SupportedTargets() reports (force_target() asks here first);
  // restricted to the targets compiled here (HWY_TARGETS), best first.
  static const std::int64_t cpu = hwy::SupportedTargets();
  std::vector<std::int64_t> out;
  for (std::int64_t bits = cpu & HWY_TARGETS; bits != 0; bits &= bits - 1) {
    out.push_back(bits & -bits);
  }
  return out;
}

std::string target_name(std::int64_t target) {
  return hwy::TargetName(target);
}

void force_target(std::int64_t target) {
  if (target == 0) {
    hwy::SetSupportedTargetsForTest(0);
  } else {
    const std::vector<std::int64_t> all = supported_targets();
    bool known = false;
    for (std::int64_t t : all) known = known || t == target;
    require(known, "target", std::to_string(target) + " (" + hwy::TargetName(target) + ")",
            "must be one of supported_targets()");
    hwy::SetSupportedTargetsForTest(target);
  }
  hwy::GetChosenTarget().Update(hwy::SupportedTargets());
}

std::int64_t target_named(const std::string& name) {
  std::string known;
  for (std::int64_t t : supported_targets()) {
    if (hwy::TargetName(t) == name) return t;
    known += (known.empty() ? "" : ", ") + std::string(hwy::TargetName(t));
  }
  throw Error("target", "target = " + name + " must be a target this CPU runs (" + known + ")");
}

void force_environment_target() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* name = std::getenv("TANDEM_TARGET");
    if (name == nullptr || *name == '\0') return;
    try {
      force_target(target_named(name));
    } catch (const Error& e) {
      throw Error("TANDEM_TARGET", std::string("TANDEM_TARGET: ") + e.what());
    }
  });
}

std::string current_target() {
  return hwy::TargetName(HWY_DYNAMIC_DISPATCH(CompiledTarget)());
}

bool bf16_dot_active() {
  // as attn::UseBf16Tile (attention_forward_bf16_tile-inl.h)
#if HWY_ARCH_X86
  return bf16dot::Enabled() && HWY_DYNAMIC_DISPATCH(CompiledTarget)() <= HWY_AVX3;
#else
  return false;
#endif
}

}  // namespace tandem::optimized
#endif  // HWY_ONCE
