#include "tests/testing/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace tokensel::testing {
namespace {

absl::Status ErrnoError(absl::string_view what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Start(
    const std::vector<std::string>& argv) {
  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC) != 0) return ErrnoError("pipe2");
  if (pipe2(out, O_CLOEXEC) != 0) {
    close(in[0]);
    close(in[1]);
    return ErrnoError("pipe2");
  }
  // Everything the child needs is prepared before fork: after it only
  // async-signal-safe calls.
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    for (int fd : {in[0], in[1], out[0], out[1]}) close(fd);
    return ErrnoError("fork");
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    dup2(in[0], STDIN_FILENO);  // dup2 clears O_CLOEXEC on the copies
    dup2(out[1], STDOUT_FILENO);
    execv(cargv[0], cargv.data());
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  std::unique_ptr<ChildProcess> child(new ChildProcess());
  child->pid_ = pid;
  child->stdin_fd_ = in[1];
  const int read_fd = out[0];
  child->reader_ = std::thread([c = child.get(), read_fd] { c->ReadLoop(read_fd); });
  return child;
}

ChildProcess::~ChildProcess() {
  CloseStdin();
  if (pid_ > 0 && !wait_status_.has_value()) {
    kill(pid_, SIGKILL);
    int status = 0;
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
  }
  if (reader_.joinable()) reader_.join();
}

void ChildProcess::ReadLoop(int fd) {
  std::string partial;
  char buf[4096];
  while (true) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    partial.append(buf, static_cast<size_t>(n));
    size_t nl;
    while ((nl = partial.find('\n')) != std::string::npos) {
      absl::MutexLock lock(&mu_);
      lines_.push_back(partial.substr(0, nl));
      partial.erase(0, nl + 1);
    }
  }
  close(fd);
  absl::MutexLock lock(&mu_);
  if (!partial.empty()) lines_.push_back(std::move(partial));
  eof_ = true;
}

absl::StatusOr<std::string> ChildProcess::WaitForLine(absl::string_view prefix,
                                                      absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  size_t seen = 0;
  while (true) {
    for (; seen < lines_.size(); ++seen) {
      if (absl::StartsWith(lines_[seen], prefix)) return lines_[seen];
    }
    if (eof_) {
      return absl::NotFoundError(
          absl::StrCat("child ", pid_, " ended stdout without \"", prefix, "\""));
    }
    struct Waiter {
      const ChildProcess* w;
      size_t seen;
      bool Ready() const ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return w->lines_.size() > seen || w->eof_;
      }
    } waiter{this, seen};
    if (!mu_.AwaitWithDeadline(absl::Condition(&waiter, &Waiter::Ready), deadline)) {
      return absl::DeadlineExceededError(
          absl::StrCat("child ", pid_, " printed no \"", prefix, "\" in time"));
    }
  }
}

std::vector<std::string> ChildProcess::Lines() const {
  absl::MutexLock lock(&mu_);
  return lines_;
}

absl::Status ChildProcess::Signal(int signo) const {
  if (wait_status_.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat("child ", pid_, " was already reaped"));
  }
  if (kill(pid_, signo) != 0) return ErrnoError("kill");
  return absl::OkStatus();
}

void ChildProcess::CloseStdin() {
  if (stdin_fd_ >= 0) close(stdin_fd_);
  stdin_fd_ = -1;
}

absl::StatusOr<int> ChildProcess::WaitForExit(absl::Time deadline) {
  while (!wait_status_.has_value()) {
    int status = 0;
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      wait_status_ = status;
      break;
    }
    if (r < 0 && errno != EINTR) return ErrnoError("waitpid");
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("child ", pid_, " still running"));
    }
    absl::SleepFor(absl::Milliseconds(20));  // polling the exit with a deadline
  }
  if (WIFEXITED(*wait_status_)) return WEXITSTATUS(*wait_status_);
  return absl::InternalError(
      absl::StrCat("child ", pid_, " killed by signal ",
                   WIFSIGNALED(*wait_status_) ? WTERMSIG(*wait_status_) : 0));
}

}  // namespace tokensel::testing
