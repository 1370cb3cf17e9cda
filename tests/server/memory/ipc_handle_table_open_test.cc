// IpcHandleTable (server/memory/ipc_handle_table.h) with a scripted driver
// whose opens and closes can block: the driver's open runs outside the
// table's lock (other handles go on, the same handle waits and shares the
// result), a close never races a fresh open of the same handle, an open
// whose memory lives on another device (or whose device or extent is
// unknown) is refused and closed through the gate (and does not hold the
// handle to that device), and aliased handles stay balanced. The table's other rules:
// ipc_handle_table_test.cc.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "server/memory/ipc_handle_table.h"
#include "tests/testing/status_matchers.h"

// A named namespace: the test binary compiles in unity batches.
namespace tokensel::memory::ipc_open_test {
namespace {

using ::absl::StatusCode;
using core::FreeGate;
using ::tokensel::testing::StatusIs;

constexpr absl::Duration kWait = absl::Seconds(10);
constexpr uint64_t kExtent = 1 << 20;

std::string Handle(char c) { return std::string(64, c); }

// Ops whose open of `block_open` and close wait until let go; results per
// handle are set by the test; every call is logged in order.
class ScriptedIpcOps final : public IpcHandleOps {
 public:
  absl::StatusOr<Opened> Open(const std::string& handle, int device) override {
    std::unique_lock<std::mutex> lock(mu);
    log.push_back("open " + handle.substr(0, 1));
    ++opens;
    changed.notify_all();
    changed.wait(lock, [&] { return !(handle == block_open && hold_open); });
    if (auto it = fail.find(handle); it != fail.end()) return it->second;
    Opened o{&arena[handle[0] % 8], true, kExtent, device};
    opened_as[o.base] = handle[0];
    if (++outstanding[handle[0]] > 1) ++double_opens;
    if (auto it = lives_on.find(handle); it != lives_on.end()) o.device = it->second;
    if (handle == unknown_extent) o.extent_known = false;
    return o;
  }
  void Close(void* base, int /*device*/) noexcept override {
    std::unique_lock<std::mutex> lock(mu);
    if (slow_close) {  // a close that takes a while (the handle is open until it returns)
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(300));
      lock.lock();
    }
    log.push_back("close " + std::string(1, opened_as[base]));
    --outstanding[opened_as[base]];
    changed.notify_all();
    changed.wait(lock, [&] { return !hold_close; });
    log.push_back("closed");
    ++closes;
  }
  // Waits until `n` opens were called.
  bool AwaitOpens(int n) {
    std::unique_lock<std::mutex> lock(mu);
    return changed.wait_for(lock, std::chrono::seconds(10), [&] { return opens >= n; });
  }
  bool AwaitLog(const std::string& line) {
    std::unique_lock<std::mutex> lock(mu);
    return changed.wait_for(lock, std::chrono::seconds(10), [&] {
      for (const auto& l : log)
        if (l == line) return true;
      return false;
    });
  }
  void Let(bool* what) {
    std::lock_guard<std::mutex> lock(mu);
    *what = false;
    changed.notify_all();
  }
  std::mutex mu;
  std::condition_variable changed;
  std::string block_open;
  bool hold_open = false;
  bool hold_close = false;
  bool slow_close = false;
  std::string unknown_extent;
  std::map<std::string, absl::Status> fail;
  std::map<std::string, int> lives_on;
  std::map<void*, char> opened_as;  // the last handle opened at a base
  std::map<char, int> outstanding;  // opens not closed yet, per handle
  int double_opens = 0;             // opens of a handle that was open
  std::vector<std::string> log;
  int opens = 0;
  int closes = 0;
  char arena[256] = {};
};

class IpcHandleTableOpenTest : public ::testing::Test {
 protected:
  IpcHandleTableOpenTest()
      : table_(IpcHandleTable::Create(&ops_, [this](int d) -> FreeGate& { return gates_[d]; })) {}
  // The closes run on the gates' drainers: they must be done before the
  // fake driver below the gates goes.
  ~IpcHandleTableOpenTest() override {
    table_.reset();
    for (FreeGate& gate : gates_) {
      if (gate.open()) (void)gate.AwaitDrained(kWait);
    }
  }
  absl::StatusOr<IpcHandleTable::Ref> Acquire(char c, int device = 0) {
    return table_->Acquire(Handle(c), device, "GPU-test", 0, 16);
  }
  std::future<absl::StatusOr<IpcHandleTable::Ref>> AcquireAsync(char c, int device = 0) {
    return std::async(std::launch::async, [this, c, device] { return Acquire(c, device); });
  }
  FreeGate gates_[2];
  ScriptedIpcOps ops_;
  std::shared_ptr<IpcHandleTable> table_;
};

constexpr auto kBrief = std::chrono::milliseconds(200);

// The sixth review: the table's lock was held across the driver's open (a
// first open on a device creates its context: every registration on every
// device waited). An open that blocks now holds back only its own handle:
// another handle's Acquire completes meanwhile; the same handle's second
// Acquire waits for the first's result and shares the open.
TEST_F(IpcHandleTableOpenTest, ABlockedOpenHoldsBackOnlyItsOwnHandle) {
  ops_.block_open = Handle('a');
  ops_.hold_open = true;
  auto first = AcquireAsync('a');
  ASSERT_TRUE(ops_.AwaitOpens(1));
  auto other = AcquireAsync('b');  // another handle, same device
  const bool other_done = other.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
  auto second = AcquireAsync('a');
  EXPECT_EQ(second.wait_for(kBrief), std::future_status::timeout) << "did not wait for the open";
  EXPECT_EQ(first.wait_for(std::chrono::milliseconds(0)), std::future_status::timeout);
  ops_.Let(&ops_.hold_open);
  EXPECT_TRUE(other_done) << "another handle's open waited behind a blocked open";
  ASSERT_OK(other.get());
  absl::StatusOr<IpcHandleTable::Ref> a1 = first.get();
  absl::StatusOr<IpcHandleTable::Ref> a2 = second.get();
  ASSERT_OK(a1);
  ASSERT_OK(a2);
  EXPECT_EQ(a1->data(), a2->data());
  EXPECT_EQ(ops_.opens, 2);  // 'a' once, 'b' once
  EXPECT_EQ(gates_[0].AwaitDrained(kWait), 0u);
  EXPECT_EQ(table_->open_count(), 1u);  // 'b' was released (closed by the drainer)
}

// A failed open is shared with the Acquires that waited for it, and leaves
// nothing behind (no entry, no room, no close).
TEST_F(IpcHandleTableOpenTest, AFailedOpenIsSharedAndLeavesNothing) {
  ops_.block_open = Handle('a');
  ops_.hold_open = true;
  ops_.fail[Handle('a')] = absl::InvalidArgumentError("cuda_ipc.handle cannot be opened");
  auto first = AcquireAsync('a');
  ASSERT_TRUE(ops_.AwaitOpens(1));
  auto second = AcquireAsync('a');
  EXPECT_EQ(second.wait_for(kBrief), std::future_status::timeout);
  ops_.Let(&ops_.hold_open);
  EXPECT_THAT(first.get(), StatusIs(StatusCode::kInvalidArgument, "cannot be opened"));
  EXPECT_THAT(second.get(), StatusIs(StatusCode::kInvalidArgument, "cannot be opened"));
  EXPECT_EQ(ops_.opens, 1);
  EXPECT_EQ(ops_.closes, 0);
  EXPECT_EQ(table_->open_count(), 0u);
  EXPECT_EQ(gates_[0].reserved(), 0u);
}

// The fifth review's nit: a close racing a fresh open of the same handle.
// The close of the last reference runs (blocked in the driver); an Acquire
// of that handle meanwhile waits until the close returned, then opens
// afresh: the driver sees open, close, open, never two opens at once.
TEST_F(IpcHandleTableOpenTest, AFreshOpenWaitsForTheRunningClose) {
  {
    absl::StatusOr<IpcHandleTable::Ref> a = Acquire('a');
    ASSERT_OK(a);
    ops_.hold_close = true;
    auto closing = std::async(std::launch::async, [ref = *std::move(a)]() mutable {
      IpcHandleTable::Ref drop = std::move(ref);  // the last reference
    });
    ASSERT_TRUE(ops_.AwaitLog("close a"));
    auto reopen = AcquireAsync('a');
    EXPECT_EQ(reopen.wait_for(kBrief), std::future_status::timeout) << "reopened during a close";
    EXPECT_EQ(ops_.opens, 1);
    ops_.Let(&ops_.hold_close);
    closing.get();
    ASSERT_OK(reopen.get());  // released at once: closed again (by the drainer)
  }
  EXPECT_EQ(gates_[0].AwaitDrained(kWait), 0u);
  EXPECT_EQ(ops_.log, (std::vector<std::string>{"open a", "close a", "closed", "open a", "close a",
                                                "closed"}));
  EXPECT_EQ(table_->open_count(), 0u);
  EXPECT_EQ(gates_[0].reserved(), 0u);
}

// The sixth review: memory of another GPU was opened as a peer mapping. It
// is refused (FAILED_PRECONDITION naming the field) and closed through the
// device's gate like any refused registration: deferred while the gate is
// closed, the same answer (no second open) until its close ran.
TEST_F(IpcHandleTableOpenTest, MemoryOfAnotherDeviceIsRefusedAndClosedThroughTheGate) {
  ops_.lives_on[Handle('p')] = 1;
  gates_[0].Enter();
  EXPECT_THAT(Acquire('p', 0),
              StatusIs(StatusCode::kFailedPrecondition,
                       "cuda_ipc.device_uuid is GPU-test (device 0) but the allocation behind "
                       "cuda_ipc.handle lives on device 1"));
  EXPECT_EQ(ops_.closes, 0);
  EXPECT_EQ(gates_[0].deferred(), 1u);
  EXPECT_THAT(Acquire('p', 0), StatusIs(StatusCode::kFailedPrecondition, "lives on device 1"));
  EXPECT_EQ(ops_.opens, 1);
  gates_[0].Leave();
  EXPECT_EQ(gates_[0].AwaitDrained(kWait), 0u);
  EXPECT_EQ(ops_.closes, 1);
  EXPECT_EQ(table_->open_count(), 0u);
  EXPECT_EQ(gates_[0].reserved(), 0u);
}

// The seventh review's item 3: a registration naming the wrong device
// opened the handle there, refused it, and queued its close on that
// device's gate; the registration naming the right device was answered
// "already open on device 1" until that close ran (for ever behind a stuck
// wait). Now it does not block behind a closed gate: UNAVAILABLE naming the
// reason and "retry", nothing opened; and once the gate is open it opens
// on the right device.
TEST_F(IpcHandleTableOpenTest, ARefusedOpenOnAnotherDeviceBehindAClosedGateIsRetried) {
  ops_.lives_on[Handle('p')] = 0;
  gates_[1].Enter();
  EXPECT_THAT(Acquire('p', 1), StatusIs(StatusCode::kFailedPrecondition, "lives on device 0"));
  EXPECT_EQ(gates_[1].deferred(), 1u);
  EXPECT_THAT(Acquire('p', 0),
              StatusIs(StatusCode::kUnavailable,
                       "cuda_ipc.handle was opened on device 1 by an earlier registration"));
  EXPECT_THAT(Acquire('p', 0), StatusIs(StatusCode::kUnavailable, "retry the registration"));
  EXPECT_EQ(ops_.opens, 1);
  EXPECT_EQ(gates_[0].reserved(), 0u);
  gates_[1].Leave();
  EXPECT_EQ(gates_[1].AwaitDrained(kWait), 0u);
  ASSERT_OK(Acquire('p', 0));  // released at once: closed by device 0's drainer
  EXPECT_EQ(gates_[0].AwaitDrained(kWait), 0u);
  EXPECT_EQ(ops_.opens, 2);
  EXPECT_EQ(ops_.closes, 2);
  EXPECT_EQ(table_->open_count(), 0u);
}

// The same with the gate open: the right device's Acquire waits for the
// refused close (running: blocked in the driver), then opens afresh; the
// driver never sees the handle open twice.
TEST_F(IpcHandleTableOpenTest, ARefusedOpenOnAnotherDeviceIsWaitedForThenOpenedAfresh) {
  ops_.lives_on[Handle('p')] = 0;
  ops_.hold_close = true;
  EXPECT_THAT(Acquire('p', 1), StatusIs(StatusCode::kFailedPrecondition, "lives on device 0"));
  ASSERT_TRUE(ops_.AwaitLog("close p"));  // device 1's drainer, blocked in the driver
  auto right = AcquireAsync('p', 0);
  EXPECT_EQ(right.wait_for(kBrief), std::future_status::timeout) << "did not wait for the close";
  ops_.Let(&ops_.hold_close);
  absl::StatusOr<IpcHandleTable::Ref> ref = right.get();
  ASSERT_OK(ref);
  ref = absl::CancelledError();
  EXPECT_EQ(gates_[0].AwaitDrained(kWait), 0u);
  EXPECT_EQ(gates_[1].AwaitDrained(kWait), 0u);
  EXPECT_EQ(ops_.log, (std::vector<std::string>{"open p", "close p", "closed", "open p", "close p",
                                                "closed"}));
  std::lock_guard<std::mutex> lock(ops_.mu);
  EXPECT_EQ(ops_.double_opens, 0);
}

// An open on another device still running is judged once it returned, not
// answered "already open" before its result is known: here it is refused,
// and the Acquire naming the right device then opens afresh.
TEST_F(IpcHandleTableOpenTest, AnOpenOnAnotherDeviceIsJudgedOnceItReturned) {
  ops_.lives_on[Handle('p')] = 0;
  ops_.block_open = Handle('p');
  ops_.hold_open = true;
  auto wrong = AcquireAsync('p', 1);
  ASSERT_TRUE(ops_.AwaitOpens(1));
  auto right = AcquireAsync('p', 0);
  EXPECT_EQ(right.wait_for(kBrief), std::future_status::timeout) << "did not wait for the open";
  ops_.Let(&ops_.hold_open);
  EXPECT_THAT(wrong.get(), StatusIs(StatusCode::kFailedPrecondition, "lives on device 0"));
  ASSERT_OK(right.get());  // released at once
  EXPECT_EQ(gates_[0].AwaitDrained(kWait), 0u);
  EXPECT_EQ(gates_[1].AwaitDrained(kWait), 0u);
  EXPECT_EQ(ops_.log, (std::vector<std::string>{"open p", "close p", "closed", "open p", "close p",
                                                "closed"}));
}

// A refused close queued behind other frees of its (open) gate: the wait is
// bounded (UNAVAILABLE after kRefusedCloseWait, nothing opened), and an
// Acquire that waits while the close starts opens afresh.
TEST_F(IpcHandleTableOpenTest, TheWaitForARefusedCloseIsBounded) {
  ops_.lives_on[Handle('p')] = 0;
  ops_.hold_close = true;
  ASSERT_OK(Acquire('z', 1));  // released at once: its close holds device 1's drainer
  ASSERT_TRUE(ops_.AwaitLog("close z"));
  EXPECT_THAT(Acquire('p', 1), StatusIs(StatusCode::kFailedPrecondition, "lives on device 0"));
  EXPECT_THAT(Acquire('p', 0), StatusIs(StatusCode::kUnavailable, "did not start within 2000 ms"));
  EXPECT_EQ(ops_.opens, 2);  // 'z', 'p' on device 1
  auto right = AcquireAsync('p', 0);
  EXPECT_EQ(right.wait_for(kBrief), std::future_status::timeout) << "did not wait for the close";
  ops_.Let(&ops_.hold_close);
  ASSERT_OK(right.get());  // released at once
  EXPECT_EQ(gates_[0].AwaitDrained(kWait), 0u);
  EXPECT_EQ(gates_[1].AwaitDrained(kWait), 0u);
  EXPECT_EQ(ops_.opens, 3);
  EXPECT_EQ(ops_.closes, 3);
  EXPECT_EQ(table_->open_count(), 0u);
}

// Fail closed: a pointer whose device or extent the driver cannot tell is
// refused (INTERNAL) and closed.
TEST_F(IpcHandleTableOpenTest, AnUnknownDeviceOrExtentIsRefusedAndClosed) {
  ops_.lives_on[Handle('q')] = -1;
  EXPECT_THAT(Acquire('q'), StatusIs(StatusCode::kInternal, "which device"));
  ops_.unknown_extent = Handle('r');
  EXPECT_THAT(Acquire('r'), StatusIs(StatusCode::kInternal, "cannot bound"));
  EXPECT_EQ(gates_[0].AwaitDrained(kWait), 0u);  // closes run on the drainer
  EXPECT_EQ(ops_.closes, 2);
  EXPECT_EQ(table_->open_count(), 0u);
  EXPECT_EQ(gates_[0].reserved(), 0u);
}

// Many threads map and unmap a few handles (one refused: memory of another
// device) while the gate opens and closes: the driver never sees a handle
// opened twice without a close between, and everything is closed at the end.
TEST_F(IpcHandleTableOpenTest, ConcurrentMapsNeverOpenAHandleTwice) {
  ops_.lives_on[Handle('d')] = 1;
  ops_.slow_close = true;
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([this, t] {
      for (int i = 0; i < 300; ++i) {
        const char c = static_cast<char>('a' + (i * 7 + t) % 4);
        absl::StatusOr<IpcHandleTable::Ref> ref = Acquire(c);
        if (c == 'd') {
          EXPECT_THAT(ref, StatusIs(StatusCode::kFailedPrecondition, "lives on device 1"));
        } else {
          EXPECT_OK(ref);
        }
        if (t == 0 && i % 50 == 0) gates_[0].Enter();
        if (t == 0 && i % 50 == 25) gates_[0].Leave();
      }
    });
  }
  for (std::thread& th : threads) th.join();  // every Enter had its Leave
  EXPECT_EQ(gates_[0].AwaitDrained(kWait), 0u);
  std::lock_guard<std::mutex> lock(ops_.mu);
  EXPECT_EQ(ops_.double_opens, 0);
  EXPECT_EQ(ops_.opens, ops_.closes);
  EXPECT_EQ(table_->open_count(), 0u);
  EXPECT_EQ(gates_[0].reserved(), 0u);
}

TEST(CheckOpenedTest, TheDeviceIsJudgedBeforeTheExtent) {
  IpcHandleOps::Opened o{nullptr, false, 0, 2};
  EXPECT_THAT(CheckOpened(o, 0, "GPU-x"), StatusIs(StatusCode::kFailedPrecondition, "GPU-x"));
  o.device = 0;
  EXPECT_THAT(CheckOpened(o, 0, "GPU-x"), StatusIs(StatusCode::kInternal, "cannot bound"));
  o.extent_known = true;
  EXPECT_OK(CheckOpened(o, 0, "GPU-x"));
}

// Aliased handles (the sixth review): other bytes naming an allocation open
// already. With the driver's documented reference count both opens return
// one pointer; each entry closes once, so the driver's count is balanced
// and closing one leaves the other mapped. A driver that refuses the alias
// (INVALID_ARGUMENT from Ops::Open) leaves nothing behind.
TEST_F(IpcHandleTableOpenTest, AliasedHandlesStayBalanced) {
  absl::StatusOr<IpcHandleTable::Ref> a = Acquire('a');
  ASSERT_OK(a);
  {
    absl::StatusOr<IpcHandleTable::Ref> alias = Acquire('i');  // the fake: 'a' % 8 == 'i' % 8
    ASSERT_OK(alias);
    EXPECT_EQ(alias->data(), a->data());
  }
  EXPECT_EQ(gates_[0].AwaitDrained(kWait), 0u);
  EXPECT_EQ(ops_.closes, 1);  // the alias's own open, closed; 'a' still open
  EXPECT_EQ(table_->open_count(), 1u);
  ops_.fail[Handle('b')] = absl::InvalidArgumentError("cuda_ipc.handle names an allocation");
  EXPECT_THAT(Acquire('b'), StatusIs(StatusCode::kInvalidArgument, "cuda_ipc.handle"));
  EXPECT_EQ(ops_.closes, 1);
  EXPECT_EQ(table_->open_count(), 1u);
  EXPECT_EQ(gates_[0].reserved(), 1u);
  a = absl::CancelledError();
  EXPECT_EQ(gates_[0].AwaitDrained(kWait), 0u);
  EXPECT_EQ(ops_.closes, 2);
  EXPECT_EQ(gates_[0].reserved(), 0u);
}

}  // namespace
}  // namespace tokensel::memory::ipc_open_test
