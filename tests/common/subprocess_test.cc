// tokensel::Subprocess against /bin/sh: output capture, stdin, waits, kills.
#include "common/subprocess.h"

#include <signal.h>
#include <sys/wait.h>

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tokensel {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::unique_ptr<Subprocess> Sh(const std::string& script, SpawnOptions options = {}) {
  options.argv = {"/bin/sh", "-c", script};
  absl::StatusOr<std::unique_ptr<Subprocess>> child = Subprocess::Spawn(std::move(options));
  EXPECT_TRUE(child.ok()) << child.status();
  return child.ok() ? *std::move(child) : nullptr;
}

bool Ended(const Subprocess::OutputView& out) { return out.ended; }

TEST(SubprocessTest, CapturesLinesAndExitCode) {
  auto child = Sh("echo one; echo two; printf tail; exit 3");
  ASSERT_NE(child, nullptr);
  absl::StatusOr<int> code = child->WaitForExitCode(absl::InfiniteFuture());
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 3);
  EXPECT_TRUE(child->reaped());
  child->AwaitOutput(Ended, absl::InfiniteFuture());
  EXPECT_THAT(child->Lines(), ElementsAre("one", "two", "tail"));
  EXPECT_EQ(child->OutputTail(2), "two\ntail");
}

TEST(SubprocessTest, MergesStderrOnlyWhenAsked) {
  auto merged = Sh("echo out; echo err >&2", {.merge_stderr = true});
  ASSERT_NE(merged, nullptr);
  merged->AwaitOutput(Ended, absl::InfiniteFuture());
  EXPECT_THAT(merged->Output(), HasSubstr("err"));
  auto split = Sh("echo out; echo err >&2");
  ASSERT_NE(split, nullptr);
  split->AwaitOutput(Ended, absl::InfiniteFuture());
  EXPECT_EQ(split->Output(), "out");
}

TEST(SubprocessTest, StdinPipeAndAwaitOutput) {
  auto child = Sh("echo ready; cat; echo done", {.pipe_stdin = true});
  ASSERT_NE(child, nullptr);
  EXPECT_TRUE(
      child->AwaitOutput([](const Subprocess::OutputView& out) { return !out.lines.empty(); },
                         absl::Now() + absl::Seconds(30)));
  // cat waits for EOF on stdin.
  EXPECT_FALSE(
      child->AwaitOutput([](const Subprocess::OutputView& out) { return out.lines.size() > 1; },
                         absl::Now() + absl::Milliseconds(100)));
  child->CloseStdin();
  ASSERT_TRUE(child->WaitForExitCode(absl::Now() + absl::Seconds(30)).ok());
  child->AwaitOutput(Ended, absl::InfiniteFuture());
  EXPECT_THAT(child->Lines(), ElementsAre("ready", "done"));
}

TEST(SubprocessTest, WaitTimesOutThenSignalKills) {
  auto child = Sh("exec sleep 60", {.name = "sleeper"});
  ASSERT_NE(child, nullptr);
  absl::StatusOr<int> early = child->Wait(absl::Now() + absl::Milliseconds(50));
  EXPECT_EQ(early.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(early.status().message(), HasSubstr("sleeper still running"));
  ASSERT_TRUE(child->Signal(SIGKILL).ok());
  absl::StatusOr<int> code = child->WaitForExitCode(absl::InfiniteFuture());
  EXPECT_EQ(code.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(code.status().message(), HasSubstr("sleeper killed by signal 9"));
  EXPECT_EQ(child->Signal(SIGTERM).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(SubprocessTest, TerminateEscalatesToSigkill) {
  auto child = Sh("trap '' TERM; echo armed; while :; do sleep 1; done");
  ASSERT_NE(child, nullptr);
  child->AwaitOutput([](const Subprocess::OutputView& out) { return !out.lines.empty(); },
                     absl::Now() + absl::Seconds(30));
  absl::StatusOr<int> status = child->Terminate(absl::Milliseconds(100));
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE(WIFSIGNALED(*status));
  EXPECT_EQ(WTERMSIG(*status), SIGKILL);
}

TEST(SubprocessTest, KeepsAboutMaxLines) {
  auto child = Sh("i=0; while [ $i -lt 100 ]; do echo $i; i=$((i+1)); done", {.max_lines = 10});
  ASSERT_NE(child, nullptr);
  child->AwaitOutput(Ended, absl::InfiniteFuture());
  const std::vector<std::string> lines = child->Lines();
  EXPECT_LE(lines.size(), 10u);
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.back(), "99");
}

TEST(SubprocessTest, MissingBinaryExits127) {
  absl::StatusOr<std::unique_ptr<Subprocess>> child =
      Subprocess::Spawn({.argv = {"/nonexistent/tokensel-binary"}});
  ASSERT_TRUE(child.ok()) << child.status();
  absl::StatusOr<int> code = (*child)->WaitForExitCode(absl::InfiniteFuture());
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 127);
}

}  // namespace
}  // namespace tokensel
