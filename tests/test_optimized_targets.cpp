// SPDX-License-Identifier: Apache-2.0
// Target control of the optimized backend: the compiled and supported
// Highway targets include a scalar fallback, names are Highway's, and
// force_target() moves dynamic dispatch (current_target()) onto each one, and
// so does TANDEM_TARGET (SPEC §11.5).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "tandem/error.hpp"
#include "tandem/optimized/backend.hpp"

#ifdef TANDEM_HAVE_OPTIMIZED

namespace {

namespace opt = tandem::optimized;

TEST(OptimizedTargets, ListEndsWithTheScalarFallback) {
  const std::vector<std::int64_t> targets = opt::supported_targets();
  ASSERT_FALSE(targets.empty());
  const std::string last = opt::target_name(targets.back());
  EXPECT_TRUE(last == "SCALAR" || last == "EMU128") << "last target is " << last;
  std::set<std::string> names;
  for (std::size_t i = 0; i < targets.size(); ++i) {
    const std::string name = opt::target_name(targets[i]);
    EXPECT_NE(name, "Unknown");
    EXPECT_TRUE(names.insert(name).second) << name << " listed twice";
    // One target bit each, best (lowest bit) first.
    EXPECT_EQ(targets[i] & (targets[i] - 1), 0) << name;
    if (i > 0) {
      EXPECT_LT(targets[i - 1], targets[i]) << name;
    }
  }
#if defined(__x86_64__) || defined(__i386__)
  // x86 binaries carry SSE4, AVX2 and AVX3 copies; __builtin_cpu_supports
  // tells which of them this CPU must report.
  __builtin_cpu_init();
  if (__builtin_cpu_supports("sse4.2")) {
    EXPECT_TRUE(names.count("SSE4"));
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    EXPECT_TRUE(names.count("AVX2"));
  }
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")) {
    EXPECT_TRUE(names.count("AVX3"));
  }
#endif
}

TEST(OptimizedTargets, ForceTargetMovesDispatch) {
  const std::vector<std::int64_t> targets = opt::supported_targets();
  ASSERT_FALSE(targets.empty());
  EXPECT_EQ(opt::current_target(), opt::target_name(targets.front()));
  // Every target, worst first, so each step really changes the choice.
  for (auto it = targets.rbegin(); it != targets.rend(); ++it) {
    opt::force_target(*it);
    EXPECT_EQ(opt::current_target(), opt::target_name(*it));
    // Forcing does not shrink the list of what the CPU supports.
    EXPECT_EQ(opt::supported_targets(), targets);
  }
  opt::force_target(0);
  EXPECT_EQ(opt::current_target(), opt::target_name(targets.front()));
}

TEST(OptimizedTargets, Bf16DotProductsFollowTheCpuTheTargetAndTheSwitch) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  EXPECT_EQ(opt::bf16_dot_supported(), __builtin_cpu_supports("avx512bf16") &&
                                           __builtin_cpu_supports("avx512bw") &&
                                           __builtin_cpu_supports("avx512vl"));
#else
  EXPECT_FALSE(opt::bf16_dot_supported());
#endif
  // Off by default; when switched on, taken on AVX3 (and better) targets alone.
  for (const std::int64_t t : opt::supported_targets()) {
    opt::force_target(t);
    const std::string name = opt::target_name(t);
    const bool avx3 = name.rfind("AVX3", 0) == 0;
    EXPECT_FALSE(opt::bf16_dot_active()) << name;
    opt::enable_bf16_dot(true);
    EXPECT_EQ(opt::bf16_dot_active(), opt::bf16_dot_supported() && avx3) << name;
    opt::enable_bf16_dot(false);
  }
  opt::force_target(0);
}

TEST(OptimizedTargets, ForcingAnUnsupportedTargetIsAnError) {
  const std::vector<std::int64_t> targets = opt::supported_targets();
  std::int64_t all = 0;
  for (std::int64_t t : targets) all |= t;
  // The lowest bit that is not a supported target.
  std::int64_t missing = 1;
  while (all & missing) missing <<= 1;
  const std::string before = opt::current_target();
  try {
    opt::force_target(missing);
    ADD_FAILURE() << "no error forcing target bit " << missing;
  } catch (const tandem::Error& e) {
    EXPECT_EQ(e.parameter(), "target");
  }
  EXPECT_EQ(opt::current_target(), before);
}

TEST(OptimizedTargets, TargetsAreFoundByName) {
  for (std::int64_t t : opt::supported_targets()) {
    EXPECT_EQ(opt::target_named(opt::target_name(t)), t);
  }
  try {
    (void)opt::target_named("AVX9");
    ADD_FAILURE() << "no error for target AVX9";
  } catch (const tandem::Error& e) {
    EXPECT_EQ(e.parameter(), "target");
    const std::string what = e.what();
    EXPECT_NE(what.find("AVX9"), std::string::npos) << what;
    // the message lists what this CPU runs
    EXPECT_NE(what.find(opt::target_name(opt::supported_targets().back())), std::string::npos)
        << what;
  }
}

// CTest runs each test in a process of its own, so the first backend() below
// is the process's first read of TANDEM_TARGET (SPEC §11.5).
TEST(OptimizedTargets, TheEnvironmentNamesTheTargetOfTheFirstBackend) {
  const std::string slowest = opt::target_name(opt::supported_targets().back());
  ::setenv("TANDEM_TARGET", "AVX9", 1);
  for (int attempt = 0; attempt < 2; ++attempt) {  // refused, and read again the next time
    try {
      (void)opt::backend();
      ADD_FAILURE() << "no error for TANDEM_TARGET=AVX9";
    } catch (const tandem::Error& e) {
      EXPECT_EQ(e.parameter(), "TANDEM_TARGET");
      EXPECT_NE(std::string(e.what()).find("TANDEM_TARGET: target = AVX9"), std::string::npos)
          << e.what();
    }
  }
  ::setenv("TANDEM_TARGET", slowest.c_str(), 1);
  (void)opt::backend();
  EXPECT_EQ(opt::current_target(), slowest);
  ::setenv("TANDEM_TARGET", "AVX9", 1);  // read once: a later backend keeps the target
  (void)opt::backend();
  EXPECT_EQ(opt::current_target(), slowest);
  ::unsetenv("TANDEM_TARGET");
  opt::force_target(0);  // force_target() overrides it
  EXPECT_EQ(opt::current_target(), opt::target_name(opt::supported_targets().front()));
}

}  // namespace

#endif  // TANDEM_HAVE_OPTIMIZED
