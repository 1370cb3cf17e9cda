#include "common/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/errno_string.h"

namespace tokensel {
namespace {

absl::Status ErrnoError(absl::string_view what) {
  return absl::InternalError(absl::StrCat(what, ": ", ErrnoString(errno)));
}

// A pipe whose ends are both O_CLOEXEC: the child's copies come from dup2,
// which clears the flag on the copy only.
absl::Status MakePipe(UniqueFd* read_end, UniqueFd* write_end) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return ErrnoError("pipe2");
  read_end->reset(fds[0]);
  write_end->reset(fds[1]);
  return absl::OkStatus();
}

void WriteAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    data += n;
    size -= static_cast<size_t>(n);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Spawn(SpawnOptions options) {
  if (options.argv.empty()) return absl::InvalidArgumentError("Spawn: empty argv");
  UniqueFd in_read, in_write, out_read, out_write;
  if (options.pipe_stdin) {
    if (absl::Status s = MakePipe(&in_read, &in_write); !s.ok()) return s;
  }
  if (absl::Status s = MakePipe(&out_read, &out_write); !s.ok()) return s;

  // Everything the child needs is prepared before fork: after it only
  // async-signal-safe calls.
  std::vector<char*> cargv;
  for (const auto& a : options.argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  std::optional<rlimit> nofile;
  if (options.rlimit_nofile.has_value()) {
    const auto n = static_cast<rlim_t>(*options.rlimit_nofile);
    nofile = rlimit{n, n};
  }
  const int child_in = in_read.get();
  const int child_out = out_write.get();
  const bool merge_stderr = options.merge_stderr;
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return ErrnoError("fork");
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // the parent died before prctl
    if (child_in >= 0) dup2(child_in, STDIN_FILENO);
    dup2(child_out, STDOUT_FILENO);
    if (merge_stderr) dup2(child_out, STDERR_FILENO);
    if (nofile.has_value() && setrlimit(RLIMIT_NOFILE, &*nofile) != 0) _exit(126);
    execv(cargv[0], cargv.data());
    _exit(127);
  }

  std::unique_ptr<Subprocess> child(new Subprocess());
  child->pid_ = pid;
  child->name_ = options.name.empty() ? absl::StrCat("child ", pid) : std::move(options.name);
  child->stdin_ = std::move(in_write);
  child->echo_ = options.echo_output;
  child->max_lines_ = options.max_lines;
  const int read_fd = out_read.release();
  child->reader_ = std::thread([c = child.get(), read_fd] { c->ReadLoop(read_fd); });
  return child;  // in_read and out_write close here: the child holds its copies
}

Subprocess::~Subprocess() {
  CloseStdin();
  if (pid_ > 0 && !reaped()) {
    kill(pid_, SIGKILL);
    (void)Wait(absl::InfiniteFuture());
  }
  if (reader_.joinable()) reader_.join();
}

void Subprocess::ReadLoop(int fd) {
  UniqueFd owned(fd);
  char buf[4096];
  while (true) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (echo_) WriteAll(STDERR_FILENO, buf, static_cast<size_t>(n));
    tokensel::MutexLock lock(&mu_);
    partial_.append(buf, static_cast<size_t>(n));
    size_t nl;
    while ((nl = partial_.find('\n')) != std::string::npos) {
      lines_.push_back(partial_.substr(0, nl));
      partial_.erase(0, nl + 1);
    }
    if (max_lines_ > 0 && lines_.size() > max_lines_) {
      lines_.erase(lines_.begin(),
                   lines_.begin() + static_cast<std::ptrdiff_t>(lines_.size() - max_lines_ / 2));
    }
  }
  tokensel::MutexLock lock(&mu_);
  if (!partial_.empty()) lines_.push_back(std::move(partial_));
  partial_.clear();
  eof_ = true;
}

absl::Status Subprocess::Signal(int signo) const {
  if (reaped()) {
    return absl::FailedPreconditionError(absl::StrCat(name_, " was already reaped"));
  }
  if (kill(pid_, signo) != 0) return ErrnoError("kill");
  return absl::OkStatus();
}

absl::StatusOr<int> Subprocess::Wait(absl::Time deadline) {
  while (!reaped()) {
    int status = 0;
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      wait_status_ = status;
      reaped_.store(true);
      break;
    }
    if (r < 0 && errno != EINTR) return ErrnoError("waitpid");
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(name_, " still running"));
    }
    absl::SleepFor(absl::Milliseconds(10));  // waitpid has no timeout: poll
  }
  return wait_status_;
}

absl::StatusOr<int> Subprocess::WaitForExitCode(absl::Time deadline) {
  absl::StatusOr<int> status = Wait(deadline);
  if (!status.ok()) return status.status();
  if (WIFEXITED(*status)) return WEXITSTATUS(*status);
  return absl::InternalError(
      absl::StrCat(name_, " killed by signal ", WIFSIGNALED(*status) ? WTERMSIG(*status) : 0));
}

absl::StatusOr<int> Subprocess::Terminate(absl::Duration grace) {
  if (!reaped()) {
    if (kill(pid_, SIGTERM) != 0) return ErrnoError("kill");
    absl::StatusOr<int> status = Wait(absl::Now() + grace);
    if (status.ok() || !absl::IsDeadlineExceeded(status.status())) return status;
    kill(pid_, SIGKILL);
  }
  return Wait(absl::InfiniteFuture());
}

std::vector<std::string> Subprocess::Lines() const {
  tokensel::MutexLock lock(&mu_);
  return lines_;
}

std::string Subprocess::Output() const {
  tokensel::MutexLock lock(&mu_);
  std::string out = absl::StrJoin(lines_, "\n");
  if (!partial_.empty()) absl::StrAppend(&out, "\n", partial_);
  return out;
}

std::string Subprocess::OutputTail(size_t max_lines) const {
  tokensel::MutexLock lock(&mu_);
  const size_t start = lines_.size() > max_lines ? lines_.size() - max_lines : 0;
  return absl::StrJoin(lines_.begin() + static_cast<std::ptrdiff_t>(start), lines_.end(), "\n");
}

bool Subprocess::output_ended() const {
  tokensel::MutexLock lock(&mu_);
  return eof_;
}

bool Subprocess::AwaitOutput(absl::FunctionRef<bool(const OutputView&)> ready,
                             absl::Time deadline) const {
  struct Waiter {
    const Subprocess* self;
    absl::FunctionRef<bool(const OutputView&)> ready;
    bool Ask() const ABSL_NO_THREAD_SAFETY_ANALYSIS {
      return ready(OutputView{self->lines_, self->partial_, self->eof_});
    }
    bool Done() const ABSL_NO_THREAD_SAFETY_ANALYSIS { return self->eof_ || Ask(); }
  } waiter{this, ready};
  tokensel::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout([&waiter] { return waiter.Done(); }, deadline - absl::Now());
  return waiter.Ask();
}

}  // namespace tokensel
