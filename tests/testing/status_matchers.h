// GoogleTest matchers for absl::Status / absl::StatusOr (abseil 20220623 ships
// none):
//   EXPECT_THAT(status, IsOk());
//   EXPECT_THAT(status, StatusIs(absl::StatusCode::kInvalidArgument, "indices"));
// StatusIs' second argument is a substring the message must contain (or any
// gMock string matcher).
#ifndef TOKENSEL_TESTS_TESTING_STATUS_MATCHERS_H_
#define TOKENSEL_TESTS_TESTING_STATUS_MATCHERS_H_

#include <ostream>
#include <string>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"

namespace tokensel::testing {

inline const absl::Status& GetStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

MATCHER(IsOk, "is OK") {
  const absl::Status& s = GetStatus(arg);
  if (!s.ok()) *result_listener << "status is " << s;
  return s.ok();
}

MATCHER_P2(StatusIsImpl, code, message_matcher, "has code " + absl::StatusCodeToString(code)) {
  const absl::Status& s = GetStatus(arg);
  *result_listener << "status is " << s;
  if (s.code() != code) return false;
  return ::testing::ExplainMatchResult(message_matcher, std::string(s.message()), result_listener);
}

inline auto StatusIs(absl::StatusCode code) { return StatusIsImpl(code, ::testing::_); }
inline auto StatusIs(absl::StatusCode code, const char* substring) {
  return StatusIsImpl(code, ::testing::HasSubstr(substring));
}
inline auto StatusIs(absl::StatusCode code, const std::string& substring) {
  return StatusIsImpl(code, ::testing::HasSubstr(substring));
}
template <typename M, typename = std::enable_if_t<!std::is_convertible_v<M, std::string>>>
auto StatusIs(absl::StatusCode code, M matcher) {
  return StatusIsImpl(code, matcher);
}

}  // namespace tokensel::testing

#define ASSERT_OK(expr) ASSERT_THAT((expr), ::tokensel::testing::IsOk())
#define EXPECT_OK(expr) EXPECT_THAT((expr), ::tokensel::testing::IsOk())

#endif  // TOKENSEL_TESTS_TESTING_STATUS_MATCHERS_H_
