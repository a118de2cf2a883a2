// SPDX-License-Identifier: Apache-2.0
// The tuning file of the optimized backend (SPEC §11): a written file loads
// back, a file for another CPU is ignored with one message, a malformed one
// throws an Error naming the file and the field; calls are classed by shape.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "support/tandem_test_support.hpp"
#include "tandem/attention_plan.hpp"
#include "tandem/error.hpp"
#include "tandem/optimized/tuning.hpp"

namespace {

using namespace tandem::optimized;

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("tandem_tuning_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

Tuning here_tuning() {
  Tuning t;
  t.cpu = current_cpu();
  TunedFields f;
  f.rows_per_tile = 128;
  t.classes.push_back({{ShapeKind::prefill, 64}, f});
  return t;
}

void write(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

/// The message of the Error load_tuning(path) throws (empty: none thrown).
std::string load_error(const std::string& path) {
  try {
    (void)load_tuning(path);
  } catch (const tandem::Error& e) {
    return e.what();
  }
  return {};
}

TEST(Tuning, WrittenFileLoadsBack) {
  const std::string path = temp_path("here.json");
  save_tuning(here_tuning(), path);
  const std::optional<Tuning> t = load_tuning(path);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->cpu, current_cpu());
  ASSERT_EQ(t->classes.size(), 1u);
  const TunedFields* f = t->find({ShapeKind::prefill, 64});
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->rows_per_tile, 128);
  EXPECT_EQ(t->find({ShapeKind::prefill, 128}), nullptr);
  EXPECT_EQ(t->geometry({ShapeKind::prefill, 64}, Geometry{}).rows_per_tile, 128);
  EXPECT_EQ(t->geometry({ShapeKind::decode, 64}, Geometry{}).rows_per_tile,
            Geometry{}.rows_per_tile);
  std::filesystem::remove(path);
}

TEST(Tuning, ForeignCpuIgnoredWithMessage) {
  Tuning t = here_tuning();
  t.cpu.model += 1;
  const std::string path = temp_path("foreign.json");
  save_tuning(t, path);
  testing::internal::CaptureStderr();
  const std::optional<Tuning> loaded = load_tuning(path);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_FALSE(loaded.has_value());
  EXPECT_NE(err.find("tuning file " + path + " was made on"), std::string::npos) << err;
  EXPECT_NE(err.find("ignored, default geometry used"), std::string::npos) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  std::filesystem::remove(path);
}

TEST(Tuning, OtherTargetIgnored) {
  Tuning t = here_tuning();
  t.cpu.target = "SOME_OTHER_TARGET";
  const std::string path = temp_path("target.json");
  save_tuning(t, path);
  testing::internal::CaptureStderr();
  EXPECT_FALSE(load_tuning(path).has_value());
  EXPECT_NE(testing::internal::GetCapturedStderr().find("SOME_OTHER_TARGET"), std::string::npos);
  std::filesystem::remove(path);
}

TEST(Tuning, MalformedFileNamesFileAndField) {
  const std::string path = temp_path("bad.json");
  const std::string cpu =
      R"("cpu": {"vendor": "v", "brand": "b", "target": "AVX2", "family": 1, "model": 2})";
  const struct {
    std::string text, fragment;
  } cases[] = {
      {"not json", "is not JSON"},
      {R"({"format": 2, "cpu": {}, "classes": []})", "format = 2 must be 1"},
      {R"({"format": 1, "classes": []})", "cpu is missing"},
      {R"({"format": 1, "cpu": {"vendor": "v"}, "classes": []})", "cpu.brand is missing"},
      {R"({"format": 1, )" + cpu + R"(, "classes": {}})", "classes must be an array"},
      {R"({"format": 1, )" + cpu + R"(, "classes": [{"kind": "sideways", "D": 64}]})",
       "classes[0].kind = \"sideways\" must be prefill, decode or backward"},
      {R"({"format": 1, )" + cpu + R"(, "classes": [{"kind": "prefill", "D": "64"}]})",
       "classes[0].D must be an integer"},
      {R"({"format": 1, )" + cpu +
           R"(, "classes": [{"kind": "prefill", "D": 64, "key_block": 32}]})",
       "classes[0].key_block is not a bit-neutral field"},
      {R"({"format": 1, )" + cpu +
           R"(, "classes": [{"kind": "prefill", "D": 64, "rows_per_tile": 8}]})",
       "classes[0].rows_per_tile = 8 is outside the tuning space of prefill calls"},
      {R"({"format": 1, )" + cpu +
           R"(, "classes": [{"kind": "backward", "D": 64, "rows_per_tile": 128}]})",
       "classes[0].rows_per_tile = 128 is outside the tuning space of backward calls"},
      {R"({"format": 1, )" + cpu +
           R"(, "classes": [{"kind": "decode", "D": 8}, {"kind": "decode", "D": 8}]})",
       "classes[1].kind repeats an earlier class"},
      {R"({"cpu": {}, "classes": []})", "format is missing"},
      {R"({"format": 1, "cpu": "AVX2", "classes": []})", "cpu.vendor is missing"},
      {R"({"format": 1, )" + cpu + R"(, "classes": [7]})", "classes[0].kind is missing"},
      {R"({"format": 1, )" + cpu + R"(, "classes": [{"kind": "decode", "D": 0}]})",
       "classes[0].D must be >= 1"},
      // an unsigned 2^64 − 1 must not wrap into a valid D
      {R"({"format": 1, )" + cpu +
           R"(, "classes": [{"kind": "decode", "D": 18446744073709551615}]})",
       "classes[0].D must be >= 1"},
      {R"({"format": 1, )" + cpu +
           R"(, "classes": [{"kind": "prefill", "D": 64, "rows_per_tile": 128.0}]})",
       "classes[0].rows_per_tile must be an integer"},
      // the batch-invariant order changes bits: never a tuned field
      {R"({"format": 1, )" + cpu +
           R"(, "classes": [{"kind": "prefill", "D": 64, "invariant": true}]})",
       "classes[0].invariant is not a bit-neutral field"},
  };
  for (const auto& c : cases) {
    write(path, c.text);
    const std::string m = load_error(path);
    EXPECT_NE(m.find("tuning file " + path + ": "), std::string::npos) << c.text << "\n" << m;
    EXPECT_NE(m.find(c.fragment), std::string::npos) << c.text << "\n" << m;
  }
  std::filesystem::remove(path);
  EXPECT_NE(load_error(path).find("cannot be read"), std::string::npos);
}

TEST(Tuning, UnwritablePathIsAnErrorAndWritesNothing) {
  const std::string dir = temp_path("missing_dir");
  const std::string path = dir + "/tuning.json";
  ASSERT_FALSE(std::filesystem::exists(dir));
  tandem::test::expect_error([&] { save_tuning(here_tuning(), path); }, "tuning",
                             {"tuning file " + path + ": cannot be written"});
  EXPECT_FALSE(std::filesystem::exists(dir));
}

// The only test of this process that reads TANDEM_TUNING (read once per process).
TEST(Tuning, EnvironmentVariableNamesTheFile) {
  const std::string path = temp_path("env.json");
  save_tuning(here_tuning(), path);
  ASSERT_EQ(::setenv("TANDEM_TUNING", path.c_str(), 1), 0);
  const std::shared_ptr<const Tuning> t = environment_tuning();
  ::unsetenv("TANDEM_TUNING");
  ASSERT_NE(t, nullptr);
  const TunedFields* f = t->find({ShapeKind::prefill, 64});
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->rows_per_tile, 128);
  EXPECT_EQ(environment_tuning(), t);  // loaded once
  std::filesystem::remove(path);
}

TEST(Tuning, CallsClassedByShape) {
  tandem::AttentionParams p = tandem::test::attention_params(1, 1, 100, 32, 8, 128, 128);
  const tandem::AttentionPlan decode = tandem::AttentionPlan::make(p);
  EXPECT_EQ(shape_class(decode, false), (ShapeClass{ShapeKind::decode, 128}));
  EXPECT_EQ(shape_class(decode, true), (ShapeClass{ShapeKind::backward, 128}));
  p.Sq = 5;  // 5 queries of 4 heads: 20 rows per kv head
  EXPECT_EQ(shape_class(tandem::AttentionPlan::make(p), false).kind, ShapeKind::prefill);
  p.Sq = 4;
  EXPECT_EQ(shape_class(tandem::AttentionPlan::make(p), false).kind, ShapeKind::decode);
}

TEST(Tuning, SpaceIsBitNeutralFieldsOnly) {
  for (std::int64_t rows : tuning_space(ShapeKind::prefill).rows_per_tile) EXPECT_GE(rows, 64);
  EXPECT_TRUE(tuning_space(ShapeKind::decode).empty());
  EXPECT_TRUE(tuning_space(ShapeKind::backward).empty());
}

}  // namespace
