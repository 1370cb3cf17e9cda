#include "client/cli/server_launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cli/connection.h"

namespace tokensel::cli {
namespace {

absl::Status ErrnoError(absl::string_view what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

constexpr absl::string_view kMetricsPrefix = "metrics on ";

}  // namespace

absl::StatusOr<std::string> FindServerBinary(const std::string& flag_value) {
  if (!flag_value.empty()) {
    if (access(flag_value.c_str(), X_OK) != 0) {
      return absl::NotFoundError(
          absl::StrCat("--server_binary=", flag_value, ": ", std::strerror(errno)));
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
  const std::vector<std::string> argv = {
      options.binary, absl::StrCat("--listen=", server->target_),
      absl::StrCat("--metrics_address=", options.metrics_address),
      absl::StrCat("--shm_prefix=", options.shm_prefix)};
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);

  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return ErrnoError("pipe2");
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return ErrnoError("fork");
  if (pid == 0) {  // only async-signal-safe calls from here
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    execv(cargv[0], cargv.data());
    _exit(127);
  }
  close(fds[1]);
  server->pid_ = pid;
  const int read_fd = fds[0];
  LaunchedServer* raw = server.get();
  server->reader_ = std::thread([raw, read_fd] { raw->ReadLoop(read_fd); });

  const absl::Time deadline = absl::Now() + options.startup_timeout;
  if (!options.metrics_address.empty()) {
    bool exited = false;
    {
      absl::MutexLock lock(&server->mu_);
      auto announced = [raw]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        if (raw->eof_) return true;
        for (const auto& line : raw->lines_) {
          if (absl::StartsWith(line, kMetricsPrefix)) return true;
        }
        return false;
      };
      server->mu_.AwaitWithDeadline(absl::Condition(&announced), deadline);
      for (const auto& line : server->lines_) {
        if (absl::StartsWith(line, kMetricsPrefix)) {
          server->metrics_url_ = line.substr(kMetricsPrefix.size());
        }
      }
      exited = server->eof_;
    }
    // WithOutput takes mu_ itself: decorate only after unlocking.
    if (server->metrics_url_.empty()) {
      return server->WithOutput(absl::DeadlineExceededError(
          exited ? "tokensel-server exited during startup"
                 : "tokensel-server did not announce its metrics address"));
    }
  }
  absl::StatusOr<client::Client> client =
      Connect(server->target_, absl::Seconds(2), /*wait_for_ready=*/true);
  if (!client.ok()) return client.status();
  std::string last = "no attempt";
  while (true) {
    absl::StatusOr<std::string> health = CheckHealth(*client, "");
    if (health.ok() && *health == "SERVING") break;
    last = health.ok() ? *health : health.status().ToString();
    bool exited = false;
    {
      absl::MutexLock lock(&server->mu_);
      exited = server->eof_;
    }
    if (exited) {
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

void LaunchedServer::ReadLoop(int fd) {
  std::string partial;
  char buf[4096];
  while (true) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    partial.append(buf, static_cast<size_t>(n));
    absl::MutexLock lock(&mu_);
    size_t nl;
    while ((nl = partial.find('\n')) != std::string::npos) {
      lines_.push_back(partial.substr(0, nl));
      partial.erase(0, nl + 1);
      if (lines_.size() > 1000) lines_.erase(lines_.begin(), lines_.begin() + 500);
    }
  }
  close(fd);
  absl::MutexLock lock(&mu_);
  if (!partial.empty()) lines_.push_back(partial);
  eof_ = true;
}

absl::StatusOr<int> LaunchedServer::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    int status = 0;
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      return status;
    }
    if (r < 0 && errno != EINTR) return ErrnoError("waitpid");
    if (absl::Now() >= deadline)
      return absl::DeadlineExceededError("tokensel-server still running");
    absl::SleepFor(absl::Milliseconds(10));
  }
}

absl::Status LaunchedServer::Stop() {
  if (pid_ <= 0 || reaped_) return absl::FailedPreconditionError("tokensel-server not running");
  if (kill(pid_, SIGTERM) != 0) return ErrnoError("kill");
  absl::StatusOr<int> status = Wait(absl::Seconds(10));
  if (!status.ok()) return WithOutput(status.status());
  if (reader_.joinable()) reader_.join();
  if (WIFEXITED(*status) && WEXITSTATUS(*status) == 0) return absl::OkStatus();
  return WithOutput(absl::InternalError(
      WIFEXITED(*status) ? absl::StrCat("tokensel-server exited with ", WEXITSTATUS(*status))
                         : absl::StrCat("tokensel-server killed by signal ", WTERMSIG(*status))));
}

LaunchedServer::~LaunchedServer() {
  if (pid_ > 0 && !reaped_) {
    kill(pid_, SIGTERM);
    if (!Wait(absl::Seconds(10)).ok()) {
      kill(pid_, SIGKILL);
      (void)Wait(absl::InfiniteDuration());
    }
  }
  if (reader_.joinable()) reader_.join();
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

std::string LaunchedServer::OutputTail(size_t max_lines) const {
  absl::MutexLock lock(&mu_);
  const size_t start = lines_.size() > max_lines ? lines_.size() - max_lines : 0;
  return absl::StrJoin(lines_.begin() + static_cast<std::ptrdiff_t>(start), lines_.end(), "\n");
}

absl::Status LaunchedServer::WithOutput(const absl::Status& status) const {
  return absl::Status(status.code(),
                      absl::StrCat(status.message(), "\n--- tokensel-server output (tail) ---\n",
                                   OutputTail(), "\n---"));
}

}  // namespace tokensel::cli
