// SPDX-License-Identifier: Apache-2.0
// The property suite: every property on every correct backend (reference,
// the scalar fixture without a bug, and the optimized backend at every SIMD
// target this CPU supports), one GoogleTest per pair: <backend>.<property>.
#include <gtest/gtest.h>

#include "support.hpp"

namespace {

class PropertyTest : public testing::Test {
 public:
  PropertyTest(tandem::props::Subject s, const tandem::props::Property* p)
      : subject_(std::move(s)), property_(p) {}
  void TestBody() override {
    const int cases = tandem::props::case_count(*property_);
    const std::string failure = tandem::props::run_property(*property_, subject_, cases, false);
    if (!failure.empty()) {
      FAIL() << property_->name << " (" << property_->group << ") failed on " << subject_.name
             << ":\n"
             << failure
             << "\nThe RC_PARAMS line printed when this program exits replays it; add "
                "verbose_shrinking=1 to watch the shrink.";
    }
  }

 private:
  tandem::props::Subject subject_;
  const tandem::props::Property* property_;
};

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  for (const tandem::props::Subject& s : tandem::props::correct_subjects()) {
    for (const tandem::props::Property& p : tandem::props::properties()) {
      testing::RegisterTest(s.name.c_str(), p.name.c_str(), nullptr, p.group.c_str(), __FILE__,
                            __LINE__,
                            [s, &p]() -> testing::Test* { return new PropertyTest(s, &p); });
    }
  }
  return RUN_ALL_TESTS();
}
