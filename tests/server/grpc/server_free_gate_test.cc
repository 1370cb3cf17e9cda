// The Server's destruction stops the FreeGates' drainers (FreeGate::StopAll,
// server/core/free_gate.h): after the backend and the mappers are gone, no
// drainer is left inside a close while cudart tears down; a teardown that
// comes later is kept and counted, not run. In-process, CPU backend.
#include <atomic>
#include <cstdint>

#include "gtest/gtest.h"
#include "server/core/free_gate.h"
#include "tests/server/grpc/grpc_test_util.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::server {
namespace {

using ::tokensel::server::testing::StartServer;

bool CountRun(void* data, intptr_t /*arg*/) {
  ++*static_cast<std::atomic<int64_t>*>(data);
  return true;
}

TEST(ServerFreeGateTest, DestroyingTheServerStopsTheDrainers) {
  core::FreeGate& gate = core::FreeGate::ForDevice(12);
  ASSERT_OK(gate.Reserve("a resource of the server's lifetime"));  // starts its drainer
  std::atomic<int64_t> runs{0};
  {
    auto s = StartServer(ServerOptions());
    ASSERT_NE(s, nullptr);
    ASSERT_OK(gate.Reserve("test"));
    gate.FreeOrDefer({&CountRun, &runs, 0, 1});  // while serving: the drainer runs it
    EXPECT_EQ(gate.AwaitDrained(absl::Seconds(10)), 0u);
    EXPECT_EQ(runs, 1);
  }
  // Stopped: a teardown after the server is gone is kept (reachable) and
  // counted, never run.
  const int64_t leaked = gate.leaked();
  gate.FreeOrDefer({&CountRun, &runs, 0, 1});
  EXPECT_EQ(gate.AwaitDrained(absl::Milliseconds(100)), 1u);
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(gate.leaked(), leaked + 1);
  // A new server in this process (Reserve) starts it again.
  ASSERT_OK(gate.Reserve("test"));
  EXPECT_EQ(gate.AwaitDrained(absl::Seconds(10)), 0u);
  EXPECT_EQ(runs, 2);
  gate.Unreserve();
  EXPECT_EQ(gate.reserved(), 0u);
}

}  // namespace
}  // namespace tokensel::server
