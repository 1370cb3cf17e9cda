// One real tokensel-server per test suite for the CLI tests.
#ifndef TOKENSEL_TESTS_CLIENT_CLI_CLI_FIXTURE_H_
#define TOKENSEL_TESTS_CLIENT_CLI_CLI_FIXTURE_H_

#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/client/cli/cli_runner.h"
#include "tests/testing/server_process.h"

namespace tokensel::cli::testing {

class CliServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto server = ::tokensel::testing::ServerProcess::Start();
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(server).value().release();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }

  // `tokensel <command> --server=<unix socket> <args...>`.
  static CliResult Run(const std::string& command, std::vector<std::string> args = {}) {
    args.insert(args.begin(), {command, "--server=" + server_->unix_target()});
    return RunCli(args);
  }

  static ::tokensel::testing::ServerProcess* server_;
};

inline ::tokensel::testing::ServerProcess* CliServerTest::server_ = nullptr;

}  // namespace tokensel::cli::testing

#endif  // TOKENSEL_TESTS_CLIENT_CLI_CLI_FIXTURE_H_
