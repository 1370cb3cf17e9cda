// ChildProcess: a helper process of a test (the load worker, the fault
// tests' client) whose stdin is a pipe the parent holds and whose stdout is
// read line by line by a reader thread; stderr is inherited, so the child's
// diagnostics land in the test log.
//
//   ASSIGN_OR_RETURN(auto w, ChildProcess::Start({binary, "--hold", ...}));
//   ASSIGN_OR_RETURN(std::string line, w->WaitForLine("LOAD-WORKER ready", deadline));
//   w->CloseStdin();                                  // EOF: the worker goes on
//   ASSIGN_OR_RETURN(int code, w->WaitForExit(deadline));
//
// A tokensel::Subprocess (common/subprocess.h) underneath: the child gets
// PR_SET_PDEATHSIG=SIGKILL (call Start from a thread that outlives it) and
// only the two pipe ends (O_CLOEXEC elsewhere), so no child keeps another
// child's stdin open. The destructor SIGKILLs a child still
// running, reaps it and joins the reader. Thread-safety: WaitForLine and
// Lines may be called from any thread; the rest from the owning thread.
#ifndef TOKENSEL_TESTS_TESTING_CHILD_PROCESS_H_
#define TOKENSEL_TESTS_TESTING_CHILD_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/subprocess.h"

namespace tokensel::testing {

class ChildProcess {
 public:
  // argv[0] is the binary's path.
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Start(const std::vector<std::string>& argv);
  ~ChildProcess() = default;  // Subprocess: SIGKILL, reap, join
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return process_->pid(); }

  // The first stdout line starting with `prefix` (waiting for it);
  // DEADLINE_EXCEEDED at `deadline`, NOT_FOUND if stdout ended without it.
  absl::StatusOr<std::string> WaitForLine(absl::string_view prefix, absl::Time deadline) const;
  // Every stdout line so far.
  std::vector<std::string> Lines() const;

  // Closes the child's stdin (EOF). Idempotent.
  void CloseStdin() { process_->CloseStdin(); }
  // kill(pid, signo); FAILED_PRECONDITION once the child was reaped.
  absl::Status Signal(int signo) const;
  // The exit code; INTERNAL naming the signal if killed; DEADLINE_EXCEEDED
  // if still running at `deadline` (polls waitpid).
  absl::StatusOr<int> WaitForExit(absl::Time deadline);

 private:
  explicit ChildProcess(std::unique_ptr<Subprocess> process) : process_(std::move(process)) {}

  std::unique_ptr<Subprocess> process_;
};

}  // namespace tokensel::testing

#endif  // TOKENSEL_TESTS_TESTING_CHILD_PROCESS_H_
