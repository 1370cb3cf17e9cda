// The main() of every tokensel GoogleTest binary (tokensel_add_gtest links it
// instead of GTest::gtest_main).
//
// A skip must not pass for green in CI. When the environment says CI=true
// (.ci/run sets it) and TOKENSEL_TEST_MAY_SKIP is not 1, a skipped test
// (GTEST_SKIP in the body, SetUp or SetUpTestSuite) is turned into a failure
// that repeats the skip's reason, so a missing tool, a missing privilege or a
// missing device fails the run instead of quietly shrinking it. Only suites
// whose skip is expected on a CI machine get TOKENSEL_TEST_MAY_SKIP=1: the
// `gpu` label (there is no device; tokensel_add_gtest sets it through the
// ctest ENVIRONMENT property), and TOKENSEL_REQUIRE_GPU=1 turns their skip
// into a failure again on a GPU machine (tests/testing/gpu_device.h).
// Outside CI a skip stays a skip.
#include <cstdlib>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace {

bool EnvIs(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::string(v) == value;
}

// OnTestEnd runs while the test is still the current one (before
// TestInfo::Run clears it) and, being an "end" event, before the default
// printer's OnTestEnd: the failure added here is part of the test's result
// and the printer reports the test as FAILED, not SKIPPED (so ctest's
// SKIP_REGULAR_EXPRESSION from gtest_discover_tests does not match either).
class SkipIsFailure : public ::testing::EmptyTestEventListener {
 public:
  void OnTestPartResult(const ::testing::TestPartResult& part) override {
    if (part.skipped()) {
      reason_ = part.message();
      file_ = part.file_name() != nullptr ? part.file_name() : "";
      line_ = part.line_number();
    }
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result() != nullptr && info.result()->Skipped()) {
      ADD_FAILURE_AT(file_.empty() ? info.file() : file_.c_str(),
                     file_.empty() ? info.line() : line_)
          << "skipped under CI=true, where a skip is a failure outside the `gpu` label "
             "(TOKENSEL_TEST_MAY_SKIP=1 allows it): "
          << (reason_.empty() ? std::string("(no reason given)") : reason_);
    }
    reason_.clear();
    file_.clear();
    line_ = -1;
  }

 private:
  std::string reason_;
  std::string file_;
  int line_ = -1;
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleMock(&argc, argv);
  if (EnvIs("CI", "true") && !EnvIs("TOKENSEL_TEST_MAY_SKIP", "1")) {
    ::testing::UnitTest::GetInstance()->listeners().Append(new SkipIsFailure);
  }
  return RUN_ALL_TESTS();
}
