// The installed package works for an outside project: `cmake --install` of
// the tokensel_client component (excluded from a plain install) into a
// temporary prefix, then
// tests/client/consumer/project is configured with find_package(tokensel
// CONFIG REQUIRED) against that prefix only, built, and run offline and
// against a real tokensel-server.
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/server_process.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::client {
namespace {

using ::tokensel::testing::ServerProcess;

struct Result {
  int exit_code = -1;
  std::string output;
};

std::string Quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

// Runs `command` through the shell, stdout and stderr merged.
Result RunShell(const std::string& command) {
  Result result;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return result;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) result.output.append(buf, n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

class ConsumerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/tokensel-consumer-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
  }
  void TearDown() override {
    if (!dir_.empty()) RunShell("rm -rf " + Quote(dir_));
  }
  std::string dir_;
};

TEST_F(ConsumerTest, InstallConfigureBuildRun) {
  const std::string cmake = Quote(TOKENSEL_CMAKE_COMMAND);
  const std::string prefix = dir_ + "/prefix";
  const std::string build = dir_ + "/build";

  Result r = RunShell(absl::StrCat(cmake, " --install ", Quote(TOKENSEL_BUILD_DIR), " --prefix ",
                                   Quote(prefix), " --component tokensel_client"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Exists(prefix + "/include/tokensel/client/client.h"));
  EXPECT_TRUE(Exists(prefix + "/include/tokensel/v1/tokensel.grpc.pb.h"));
  EXPECT_TRUE(Exists(prefix + "/lib/cmake/tokensel/tokenselConfig.cmake"));
  EXPECT_TRUE(Exists(prefix + "/lib/cmake/tokensel/tokenselConfigVersion.cmake"));
  EXPECT_FALSE(Exists(prefix + "/bin/tokensel-server"));  // only the client component
  // A plain install (the Dockerfile's, after building only the server) does
  // not include the client package.
  const std::string plain = dir_ + "/plain";
  r = RunShell(
      absl::StrCat(cmake, " --install ", Quote(TOKENSEL_BUILD_DIR), " --prefix ", Quote(plain)));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Exists(plain + "/bin/tokensel-server"));
  EXPECT_FALSE(Exists(plain + "/lib/cmake/tokensel"));
  EXPECT_FALSE(Exists(plain + "/include/tokensel"));

  const std::string sanitize = TOKENSEL_SANITIZE_FLAGS;
  std::string configure = absl::StrCat(
      cmake, " -S ", Quote(TOKENSEL_CONSUMER_SOURCE_DIR), " -B ", Quote(build), " -G ",
      Quote(TOKENSEL_CMAKE_GENERATOR), " -DCMAKE_BUILD_TYPE=RelWithDebInfo",
      " -DCMAKE_CXX_COMPILER=", Quote(TOKENSEL_CXX_COMPILER),
      " -DCMAKE_PREFIX_PATH=", Quote(prefix), " -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON");
  if (!sanitize.empty()) {
    absl::StrAppend(&configure, " -DCMAKE_CXX_FLAGS=", Quote(sanitize),
                    " -DCMAKE_EXE_LINKER_FLAGS=", Quote(sanitize));
  }
  r = RunShell(configure);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, ::testing::Not(::testing::HasSubstr("CMake Warning")));
  r = RunShell(absl::StrCat(cmake, " --build ", Quote(build)));
  ASSERT_EQ(r.exit_code, 0) << r.output;

  const std::string consumer = Quote(build + "/tokensel_consumer");
  r = RunShell(consumer);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, ::testing::HasSubstr("consumer ok offline"));

  absl::StatusOr<std::unique_ptr<ServerProcess>> server = ServerProcess::Start();
  ASSERT_OK(server.status());
  r = RunShell(absl::StrCat(consumer, " ", Quote((*server)->unix_target())));
  EXPECT_EQ(r.exit_code, 0) << r.output << "\n--- server ---\n" << (*server)->Output();
  EXPECT_THAT(r.output, ::testing::HasSubstr("consumer ok online"));
}

}  // namespace
}  // namespace tokensel::client
