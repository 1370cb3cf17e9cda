#include "client/cli/server_launcher.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cli/connection.h"
#include "common/errno_string.h"

namespace tokensel::cli {
namespace {

absl::Status ErrnoError(absl::string_view what) {
  return absl::InternalError(absl::StrCat(what, ": ", ErrnoString(errno)));
}

constexpr absl::string_view kMetricsPrefix = "metrics on ";

}  // namespace

absl::StatusOr<std::string> FindServerBinary(const std::string& flag_value) {
  if (!flag_value.empty()) {
    if (access(flag_value.c_str(), X_OK) != 0) {
      return absl::NotFoundError(
          absl::StrCat("--server_binary=", flag_value, ": ", ErrnoString(errno)));
    }
    return flag_value;
  }
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return absl::InternalError(absl::StrCat("/proc/self/exe: ", ec.message()));
  const std::vector<std::filesystem::path> candidates = {
      self.parent_path() / "tokensel-server",
      self.parent_path() / ".." / ".." / "server" / "tokensel-server"};
  std::vector<std::string> tried;
  for (const auto& c : candidates) {
    if (access(c.c_str(), X_OK) == 0) return std::filesystem::canonical(c).string();
    tried.push_back(c.lexically_normal().string());
  }
  return absl::NotFoundError(absl::StrCat("no tokensel-server found (tried ",
                                          absl::StrJoin(tried, ", "),
                                          "); pass --server_binary or --server"));
}

absl::StatusOr<std::unique_ptr<LaunchedServer>> LaunchedServer::Start(
    const LaunchOptions& options) {
  if (options.shm_prefix.empty()) return absl::InvalidArgumentError("shm_prefix is required");
  std::unique_ptr<LaunchedServer> server(new LaunchedServer());
  char dir[] = "/tmp/tokensel-demo-XXXXXX";
  if (mkdtemp(dir) == nullptr) return ErrnoError("mkdtemp");
  server->dir_ = dir;
  server->target_ = absl::StrCat("unix://", server->dir_, "/tokensel.sock");
  absl::StatusOr<std::unique_ptr<Subprocess>> process = Subprocess::Spawn({
      .argv = {options.binary, absl::StrCat("--listen=", server->target_),
               absl::StrCat("--metrics_address=", options.metrics_address),
               absl::StrCat("--shm_prefix=", options.shm_prefix)},
      .name = "tokensel-server",
      .merge_stderr = true,
      .max_lines = 1000,  // enough for any error report
  });
  if (!process.ok()) return process.status();
  server->process_ = *std::move(process);
  Subprocess& child = *server->process_;

  const absl::Time deadline = absl::Now() + options.startup_timeout;
  if (!options.metrics_address.empty()) {
    std::string url;
    child.AwaitOutput(
        [&url](const Subprocess::OutputView& out) {
          for (const auto& line : out.lines) {
            if (absl::StartsWith(line, kMetricsPrefix)) url = line.substr(kMetricsPrefix.size());
          }
          return !url.empty();
        },
        deadline);
    if (url.empty()) {
      return server->WithOutput(absl::DeadlineExceededError(
          child.output_ended() ? "tokensel-server exited during startup"
                               : "tokensel-server did not announce its metrics address"));
    }
    server->metrics_url_ = std::move(url);
  }
  absl::StatusOr<client::Client> client =
      Connect(server->target_, absl::Seconds(2), /*wait_for_ready=*/true);
  if (!client.ok()) return client.status();
  std::string last = "no attempt";
  while (true) {
    absl::StatusOr<std::string> health = CheckHealth(*client, "");
    if (health.ok() && *health == "SERVING") break;
    last = health.ok() ? *health : health.status().ToString();
    if (child.output_ended()) {
      return server->WithOutput(absl::InternalError("tokensel-server exited during startup"));
    }
    if (absl::Now() > deadline) {
      return server->WithOutput(
          absl::DeadlineExceededError(absl::StrCat("tokensel-server never SERVING: ", last)));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return server;
}

absl::Status LaunchedServer::Stop() {
  if (process_ == nullptr || process_->reaped()) {
    return absl::FailedPreconditionError("tokensel-server not running");
  }
  if (absl::Status s = process_->Signal(SIGTERM); !s.ok()) return s;
  absl::StatusOr<int> code = process_->WaitForExitCode(absl::Now() + absl::Seconds(10));
  if (!code.ok()) return WithOutput(code.status());
  // The whole output, for the report below.
  process_->AwaitOutput([](const Subprocess::OutputView& out) { return out.ended; },
                        absl::InfiniteFuture());
  if (*code == 0) return absl::OkStatus();
  return WithOutput(absl::InternalError(absl::StrCat("tokensel-server exited with ", *code)));
}

LaunchedServer::~LaunchedServer() {
  if (process_ != nullptr) (void)process_->Terminate(absl::Seconds(10));
  process_.reset();
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

std::string LaunchedServer::OutputTail(size_t max_lines) const {
  return process_ == nullptr ? std::string() : process_->OutputTail(max_lines);
}

absl::Status LaunchedServer::WithOutput(const absl::Status& status) const {
  return absl::Status(status.code(),
                      absl::StrCat(status.message(), "\n--- tokensel-server output (tail) ---\n",
                                   OutputTail(), "\n---"));
}

}  // namespace tokensel::cli
