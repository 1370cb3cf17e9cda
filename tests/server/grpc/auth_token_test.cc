#include "server/grpc/auth_token.h"

#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::server {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::tokensel::testing::StatusIs;

constexpr char kToken[] = "0123456789abcdef-token";

class TokenFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tokensel-token-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    ::unlink(path_.c_str());
    ::rmdir(dir_.c_str());
  }
  const std::string& Write(const std::string& contents) {
    path_ = dir_ + "/token";
    std::ofstream(path_, std::ios::trunc) << contents;
    return path_;
  }
  std::string dir_;
  std::string path_;
};

TEST_F(TokenFileTest, TrimsSurroundingWhitespace) {
  absl::StatusOr<std::string> token = ReadTokenFile(Write(std::string(" \t") + kToken + "\r\n\n"));
  ASSERT_OK(token);
  EXPECT_EQ(*token, kToken);
}

TEST_F(TokenFileTest, RejectsMissingEmptyShortAndUnprintable) {
  EXPECT_THAT(ReadTokenFile(dir_ + "/absent"),
              StatusIs(absl::StatusCode::kInvalidArgument, "No such file or directory"));
  EXPECT_THAT(ReadTokenFile(Write("\n  \n")),
              StatusIs(absl::StatusCode::kInvalidArgument, "is empty"));
  EXPECT_THAT(
      ReadTokenFile(Write("short-secret\n")),
      StatusIs(absl::StatusCode::kInvalidArgument, "token has 12 characters, need at least 16"));
  const absl::Status spaced = ReadTokenFile(Write("two words-0123456789")).status();
  EXPECT_THAT(spaced, StatusIs(absl::StatusCode::kInvalidArgument, "character 3"));
  EXPECT_THAT(spaced.message(), Not(HasSubstr("words")));  // never echoes the token
  EXPECT_THAT(ReadTokenFile(Write(std::string("0123456789abcdef\x01"))),
              StatusIs(absl::StatusCode::kInvalidArgument, "not printable ASCII"));
}

TEST(ConstantTimeEqualsTest, ComparesWholeValues) {
  EXPECT_TRUE(ConstantTimeEquals(kToken, kToken));
  EXPECT_FALSE(ConstantTimeEquals(kToken, ""));
  EXPECT_FALSE(ConstantTimeEquals(kToken, "0123456789abcdef-toke"));    // prefix
  EXPECT_FALSE(ConstantTimeEquals(kToken, "0123456789abcdef-tokenX"));  // longer
  EXPECT_FALSE(ConstantTimeEquals(kToken, "X123456789abcdef-token"));   // first char
  EXPECT_FALSE(ConstantTimeEquals(kToken, "0123456789abcdef-tokeN"));   // last char
  // The candidate wraps around the secret: a repetition must not match.
  EXPECT_FALSE(ConstantTimeEquals("ab", "abab"));
  EXPECT_TRUE(ConstantTimeEquals("a", "a"));
}

TEST(CheckAuthorizationTest, OutcomesByCode) {
  const std::string right = std::string("Bearer ") + kToken;
  EXPECT_OK(CheckAuthorization({right}, kToken));
  EXPECT_OK(CheckAuthorization({std::string("bearer ") + kToken}, kToken));  // scheme case
  EXPECT_THAT(CheckAuthorization({}, kToken),
              StatusIs(absl::StatusCode::kUnauthenticated, "missing authorization metadata"));
  EXPECT_THAT(CheckAuthorization({right, right}, kToken),
              StatusIs(absl::StatusCode::kUnauthenticated, "2 values"));
  for (const char* malformed :
       {"", "Bearer", "Bearer ", "Basic 0123456789abcdef-token", "0123456789abcdef-token",
        "Bearer  0123456789abcdef-token", "Bearer 0123456789abcdef-token extra"}) {
    EXPECT_THAT(CheckAuthorization({malformed}, kToken),
                StatusIs(absl::StatusCode::kUnauthenticated, "malformed"))
        << "'" << malformed << "'";
  }
  const absl::Status wrong = CheckAuthorization({"Bearer 0123456789abcdef-tokeX"}, kToken);
  EXPECT_THAT(wrong, StatusIs(absl::StatusCode::kPermissionDenied, "invalid bearer token"));
  EXPECT_THAT(wrong.message(), Not(HasSubstr("tokeX")));
}

}  // namespace
}  // namespace tokensel::server
