// SPDX-License-Identifier: Apache-2.0
// The one list of entry points (tandem/kernels.hpp): entry_points() names
// every member of Kernels<T>, each once and in declaration order (the
// attention block among them), a Backend visits those of its float kernels,
// and every implementation binds every entry.
#include <gtest/gtest.h>

#include <cstddef>
#include <functional>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "support/tandem_test_support.hpp"
#include "tandem/reference/backend.hpp"
#include "tandem/reference/kernels.hpp"

namespace {

using tandem::Backend;
using tandem::Kernels;

// A std::function has one size whatever its signature, so the members of
// Kernels<T> fill it exactly when entry_points() names as many as there are:
// a member added without its name in the list fails to compile here.
constexpr std::size_t kEntryPoints = std::tuple_size_v<decltype(tandem::entry_points<float>())>;
static_assert(kEntryPoints * sizeof(std::function<void()>) == sizeof(Kernels<float>));
static_assert(kEntryPoints * sizeof(std::function<void()>) == sizeof(Kernels<double>));

/// The names of the entry points of `k` that are set, and of those that are empty.
struct Bound {
  std::vector<std::string> set, empty;
};
template <class K>
Bound bound(const K& k) {
  Bound b;
  tandem::for_each_entry_point(k, [&b](std::string_view name, const auto& entry) {
    (entry ? b.set : b.empty).emplace_back(name);
  });
  return b;
}

TEST(EntryPoints, TheListNamesEveryMemberOnceInOrder) {
  Kernels<float> k;
  const auto* begin = reinterpret_cast<const char*>(&k);
  std::vector<std::ptrdiff_t> offsets;
  std::set<std::string> names;
  tandem::for_each_entry_point(k, [&](std::string_view name, auto& entry) {
    offsets.push_back(reinterpret_cast<const char*>(&entry) - begin);
    EXPECT_TRUE(names.emplace(name).second) << name << " named twice";
  });
  ASSERT_EQ(offsets.size(), kEntryPoints);
  for (std::size_t i = 0; i < offsets.size(); ++i) {
    EXPECT_EQ(offsets[i], static_cast<std::ptrdiff_t>(i * sizeof(std::function<void()>)))
        << "entry " << i;
  }
}

TEST(EntryPoints, BackendVisitsItsFloatKernelsTheBlockLast) {
  const Backend b;
  const Bound all = bound(b);
  ASSERT_EQ(all.empty.size(), kEntryPoints);
  EXPECT_EQ(all.empty.back(), "attention_block");
  EXPECT_EQ(all.empty, bound(static_cast<const Kernels<float>&>(b)).empty);
  EXPECT_EQ(bound(b.bf16).empty, all.empty);
}

TEST(EntryPoints, AVisitorReplacesEntriesWithoutTheirSignatures) {
  Backend b = tandem::reference::backend();
  tandem::for_each_entry_point(b, [](std::string_view, auto& entry) { entry = nullptr; });
  EXPECT_TRUE(bound(b).set.empty());
  EXPECT_EQ(bound(b).empty.size(), kEntryPoints);
}

TEST(EntryPoints, EveryImplementationBindsEveryEntryPoint) {
  std::vector<std::pair<std::string, Bound>> impls{
      {"reference", bound(tandem::reference::backend())},
      {"reference<double>", bound(tandem::reference::kernels<double>())},
      {"reference<float, float>", bound(tandem::reference::kernels<float, float>())},
      {"reference bf16", bound(tandem::reference::backend().bf16)},
      {"reference f16", bound(tandem::reference::backend().f16)}};
#ifdef TANDEM_HAVE_OPTIMIZED
  impls.emplace_back("optimized", bound(tandem::optimized::backend()));
#endif
  for (const auto& [name, b] : impls) {
    EXPECT_TRUE(b.empty.empty()) << name << " lacks " << ::testing::PrintToString(b.empty);
    EXPECT_GE(b.set.size(), kEntryPoints) << name;
  }
}

}  // namespace
