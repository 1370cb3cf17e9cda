#include "tests/client/cli/cli_runner.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/util/json_util.h"

#ifndef TOKENSEL_CLI_BINARY
#error "TOKENSEL_CLI_BINARY must be defined to the tokensel CLI path"
#endif

namespace tokensel::cli::testing {

std::string CliResult::Describe() const {
  return absl::StrCat("exit ", exit_code, "\n--- stdout ---\n", out, "\n--- stderr ---\n", err);
}

CliResult RunCli(const std::vector<std::string>& args, int timeout_seconds,
                 const std::vector<std::string>& env) {
  CliResult result;
  std::vector<std::string> argv = {TOKENSEL_CLI_BINARY};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> cargv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  // This process' environment without the CLI's token variables, then `env`
  // (built before fork: the child only execs).
  std::vector<std::string> envs;
  for (char** e = environ; *e != nullptr; ++e) {
    const absl::string_view entry = *e;
    if (absl::StartsWith(entry, "TOKENSEL_AUTH_TOKEN")) continue;
    envs.emplace_back(entry);
  }
  envs.insert(envs.end(), env.begin(), env.end());
  std::vector<char*> cenv;
  for (auto& e : envs) cenv.push_back(e.data());
  cenv.push_back(nullptr);
  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0) {
    result.err = "pipe2 failed";
    return result;
  }
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(out_pipe[1], STDOUT_FILENO);
    dup2(err_pipe[1], STDERR_FILENO);
    execve(cargv[0], cargv.data(), cenv.data());
    _exit(127);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_seconds);
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* sinks[2] = {&result.out, &result.err};
  int open_fds = 2;
  bool killed = false;
  while (open_fds > 0) {
    if (std::chrono::steady_clock::now() > deadline && !killed) {
      kill(pid, SIGKILL);
      killed = true;
    }
    const int n = poll(fds, 2, 200);
    if (n < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      char buf[8192];
      const ssize_t r = read(fds[i].fd, buf, sizeof(buf));
      if (r > 0) {
        sinks[i]->append(buf, static_cast<size_t>(r));
      } else if (r == 0 || errno != EINTR) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

TempDir::TempDir() {
  char tmpl[] = "/tmp/tokensel-cli-test-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) std::abort();
  dir_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

absl::StatusOr<google::protobuf::Value> ParseJson(const std::string& json) {
  google::protobuf::Value value;
  const auto status = google::protobuf::util::JsonStringToMessage(json, &value);
  if (!status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("not JSON (", status.ToString(), "): ", json));
  }
  return value;
}

}  // namespace tokensel::cli::testing
