#include "tests/testing/child_process.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace tokensel::testing {

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Start(
    const std::vector<std::string>& argv) {
  absl::StatusOr<std::unique_ptr<Subprocess>> process =
      Subprocess::Spawn({.argv = argv, .pipe_stdin = true});
  if (!process.ok()) return process.status();
  return std::unique_ptr<ChildProcess>(new ChildProcess(*std::move(process)));
}

absl::StatusOr<std::string> ChildProcess::WaitForLine(absl::string_view prefix,
                                                      absl::Time deadline) const {
  std::string found;
  size_t seen = 0;
  const bool ok = process_->AwaitOutput(
      [&](const Subprocess::OutputView& out) {
        for (; seen < out.lines.size(); ++seen) {
          if (absl::StartsWith(out.lines[seen], prefix)) {
            found = out.lines[seen];
            return true;
          }
        }
        return false;
      },
      deadline);
  if (ok) return found;
  if (process_->output_ended()) {
    return absl::NotFoundError(
        absl::StrCat("child ", pid(), " ended stdout without \"", prefix, "\""));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("child ", pid(), " printed no \"", prefix, "\" in time"));
}

std::vector<std::string> ChildProcess::Lines() const { return process_->Lines(); }

absl::Status ChildProcess::Signal(int signo) const { return process_->Signal(signo); }

absl::StatusOr<int> ChildProcess::WaitForExit(absl::Time deadline) {
  return process_->WaitForExitCode(deadline);
}

}  // namespace tokensel::testing
