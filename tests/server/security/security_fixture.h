// The security suites' fixture: a real tokensel-server whose unix socket a
// test group may use, hostile clients run as other users (numeric uids the
// test makes up; only root can become them, so those tests skip otherwise),
// and a well-behaved in-process client.
#ifndef TOKENSEL_TESTS_SERVER_SECURITY_SECURITY_FIXTURE_H_
#define TOKENSEL_TESTS_SERVER_SECURITY_SECURITY_FIXTURE_H_

#include <unistd.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/child_process.h"
#include "tests/testing/http_get.h"
#include "tests/testing/server_process.h"
#include "tests/testing/status_matchers.h"
#include "tokensel/client/client.h"
#include "tokensel/client/session.h"
#include "tokensel/client/shared_region.h"

namespace tokensel::security {

namespace tc = ::tokensel::client;
namespace v1 = ::tokensel::v1;
using ::tokensel::testing::ChildProcess;
using ::tokensel::testing::ServerOptions;
using ::tokensel::testing::ServerProcess;

// Made-up principals: the socket's group, an attacker in it, a victim user.
inline constexpr gid_t kSocketGroup = 61000;
inline constexpr uid_t kAttacker = 61001;
inline constexpr uid_t kVictim = 61002;

class SecurityTest : public ::testing::Test {
 protected:
  static bool IsRoot() { return geteuid() == 0; }

  void StartServer(std::vector<std::string> extra_args = {}) {
    ServerOptions options;
    options.socket_group = kSocketGroup;
    options.extra_args = std::move(extra_args);
    absl::StatusOr<std::unique_ptr<ServerProcess>> server = ServerProcess::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  void TearDown() override {
    if (HasFailure() && server_ != nullptr) {
      std::string out = server_->Output();
      if (out.size() > 8000) out = "..." + out.substr(out.size() - 8000);
      std::fprintf(stderr, "---- server output ----\n%s\n", out.c_str());
    }
  }

  // The in-process client (this process's uid) on the unix socket.
  tc::Client Client() const {
    absl::StatusOr<tc::Client> client =
        tc::Client::Connect(server_->unix_target(), {.deadline = absl::Seconds(30)});
    EXPECT_TRUE(client.ok()) << client.status();
    return *client;
  }

  // tokensel_hostile_client `command` as `uid` (in the socket group), with
  // --target and `flags`.
  std::unique_ptr<ChildProcess> Hostile(const std::string& command, uid_t uid,
                                        const std::vector<std::string>& flags = {}) const {
    std::vector<std::string> argv = {TOKENSEL_HOSTILE_CLIENT_BINARY, command,
                                     "--target=" + server_->unix_target()};
    if (IsRoot()) {
      argv.push_back(absl::StrCat("--uid=", uid));
      argv.push_back(absl::StrCat("--gid=", uid));
      argv.push_back(absl::StrCat("--groups=", kSocketGroup));
    }
    argv.insert(argv.end(), flags.begin(), flags.end());
    absl::StatusOr<std::unique_ptr<ChildProcess>> child = ChildProcess::Start(argv);
    EXPECT_TRUE(child.ok()) << child.status();
    return child.ok() ? *std::move(child) : nullptr;
  }

  // The key=value fields of the child's "RESULT ..." line (it must exit 0).
  static std::map<std::string, int64_t> Result(ChildProcess& child,
                                               absl::Duration timeout = absl::Seconds(120)) {
    std::map<std::string, int64_t> fields;
    absl::StatusOr<std::string> line = child.WaitForLine("RESULT", absl::Now() + timeout);
    EXPECT_TRUE(line.ok()) << line.status();
    if (!line.ok()) return fields;
    for (absl::string_view item : absl::StrSplit(line->substr(7), ' ', absl::SkipEmpty())) {
      std::pair<std::string, std::string> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
      int64_t v = 0;
      if (absl::SimpleAtoi(kv.second, &v)) fields[kv.first] = v;
    }
    absl::StatusOr<int> code = child.WaitForExit(absl::Now() + absl::Seconds(30));
    EXPECT_TRUE(code.ok() && *code == 0)
        << (code.ok() ? absl::StrCat("exit ", *code) : code.status().ToString());
    return fields;
  }

  // A gauge or counter of the server's /metrics.
  double Metric(absl::string_view series) const {
    absl::StatusOr<testing::HttpResponse> r =
        testing::HttpGet(server_->metrics_port(), "/metrics", absl::Seconds(5));
    if (!r.ok()) return -1;
    return testing::MetricValue(r->body, series).value_or(-1);
  }

  // The server's VmHWM (peak resident set) in KiB.
  int64_t PeakRssKiB() const {
    std::FILE* f = std::fopen(absl::StrCat("/proc/", server_->pid(), "/status").c_str(), "r");
    if (f == nullptr) return -1;
    char line[256];
    int64_t kib = -1;
    while (std::fgets(line, sizeof(line), f) != nullptr) {
      if (std::sscanf(line, "VmHWM: %lld kB", reinterpret_cast<long long*>(&kib)) == 1) break;
    }
    std::fclose(f);
    return kib;
  }

  void ExpectServing() const {
    EXPECT_FALSE(server_->exited()) << "the server died";
    EXPECT_TRUE(Client().Ping().ok()) << "the server stopped serving";
  }

  std::unique_ptr<ServerProcess> server_;
};

#define TOKENSEL_REQUIRE_ROOT()                                                            \
  do {                                                                                     \
    if (!IsRoot()) {                                                                       \
      GTEST_SKIP() << "needs root: the test runs clients as other uids (CI runs as root)"; \
    }                                                                                      \
  } while (0)

}  // namespace tokensel::security

#endif  // TOKENSEL_TESTS_SERVER_SECURITY_SECURITY_FIXTURE_H_
