// Subprocess: one child process with its output captured line by line. The
// single spawn/wait/kill facility behind the CLI's `tokensel demo` server
// (client/cli/server_launcher.h) and the tests' ServerProcess and
// ChildProcess (tests/testing/).
//
//   ASSIGN_OR_RETURN(auto child, Subprocess::Spawn({.argv = {path, "--flag"},
//                                                   .merge_stderr = true}));
//   child->AwaitOutput([](const Subprocess::OutputView& out) { ... }, deadline);
//   RETURN_IF_ERROR(child->Signal(SIGTERM));
//   ASSIGN_OR_RETURN(int code, child->WaitForExitCode(deadline));
//
// Spawn() forks and execs argv[0] (a path: no PATH search). The child gets
// PR_SET_PDEATHSIG=SIGKILL, so it dies with the *thread* that spawned it:
// spawn from a thread that outlives the child (a test's or the CLI's main
// thread). The child inherits only its stdio: every pipe end is O_CLOEXEC,
// so no child keeps another child's stdin or stdout open. Its stdout (and
// with `merge_stderr` its stderr) goes to a pipe drained for the child's
// whole life by a reader thread, which splits it into lines; stderr is
// otherwise inherited, and stdin is inherited unless `pipe_stdin`.
//
// The destructor closes stdin, SIGKILLs a child not yet reaped, reaps it
// and joins the reader. For a gentler end call Terminate() first.
//
// Errors: INTERNAL with errno text for failed system calls;
// DEADLINE_EXCEEDED "<name> still running" from the waits.
// Thread-safety: Signal, pid, reaped and the output accessors may be called
// from any thread; Wait*, Terminate, CloseStdin and destruction from the
// owning thread only.
#ifndef TOKENSEL_COMMON_SUBPROCESS_H_
#define TOKENSEL_COMMON_SUBPROCESS_H_

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "common/unique_fd.h"

namespace tokensel {

struct SpawnOptions {
  // argv[0] is the binary's path.
  std::vector<std::string> argv;
  // Names the child in error messages; empty = "child <pid>".
  std::string name;
  // stdin is a pipe the parent holds (see CloseStdin); else inherited.
  bool pipe_stdin = false;
  // stderr goes into the same pipe as stdout; else inherited.
  bool merge_stderr = false;
  // Also copy the child's output to this process' stderr as it arrives.
  bool echo_output = false;
  // Keep about the latest `max_lines` lines (older ones are dropped in
  // batches); 0 keeps everything.
  size_t max_lines = 0;
  // RLIMIT_NOFILE (soft = hard) set in the child before exec; nullopt = inherit.
  // The child exits with 126 if it cannot be set, 127 if exec fails.
  std::optional<uint64_t> rlimit_nofile;
};

class Subprocess {
 public:
  // What the child printed so far, as AwaitOutput predicates see it (under
  // the output lock: a predicate must not call back into the Subprocess).
  struct OutputView {
    const std::vector<std::string>& lines;  // complete lines, without '\n'
    absl::string_view partial;              // the unterminated rest
    bool ended;                             // the output pipe reached EOF
  };

  static absl::StatusOr<std::unique_ptr<Subprocess>> Spawn(SpawnOptions options);
  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& name() const { return name_; }
  // True once a Wait* has collected the child's exit.
  bool reaped() const { return reaped_.load(); }

  // kill(pid, signo); FAILED_PRECONDITION once the child was reaped.
  absl::Status Signal(int signo) const;
  // Closes the child's stdin (EOF). Idempotent; no-op without pipe_stdin.
  void CloseStdin() { stdin_.reset(); }

  // Polls waitpid until the child exits; the raw wait status (also on later
  // calls). DEADLINE_EXCEEDED "<name> still running" at `deadline`.
  absl::StatusOr<int> Wait(absl::Time deadline);
  // Wait, then the exit code; INTERNAL "<name> killed by signal N" if killed.
  absl::StatusOr<int> WaitForExitCode(absl::Time deadline);
  // SIGTERM, wait up to `grace`, then SIGKILL and wait; the raw wait status.
  absl::StatusOr<int> Terminate(absl::Duration grace);

  // Every complete line so far.
  std::vector<std::string> Lines() const;
  // The lines joined with '\n', plus the unterminated rest.
  std::string Output() const;
  // The last `max_lines` complete lines joined with '\n'.
  std::string OutputTail(size_t max_lines) const;
  bool output_ended() const;
  // Blocks until `ready` returns true (re-evaluated whenever output arrives)
  // or the output ends or `deadline` passes; returns `ready`'s last answer.
  bool AwaitOutput(absl::FunctionRef<bool(const OutputView&)> ready, absl::Time deadline) const;

 private:
  Subprocess() = default;
  void ReadLoop(int fd);

  pid_t pid_ = -1;
  std::string name_;
  UniqueFd stdin_;
  std::atomic<bool> reaped_{false};
  int wait_status_ = 0;  // valid once reaped_
  bool echo_ = false;
  size_t max_lines_ = 0;
  std::thread reader_;

  mutable tokensel::Mutex mu_;  // pthread-based: TSan sees it (common/mutex.h)
  std::vector<std::string> lines_ ABSL_GUARDED_BY(mu_);
  std::string partial_ ABSL_GUARDED_BY(mu_);
  bool eof_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tokensel

#endif  // TOKENSEL_COMMON_SUBPROCESS_H_
