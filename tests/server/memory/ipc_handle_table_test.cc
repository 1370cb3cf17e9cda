// IpcHandleTable (server/memory/ipc_handle_table.h), the CUDA IPC mapper's
// table of open handles, over fake open/close functions and test gates:
// a closing handle is reused (no second open, no second deferred close),
// the close runs outside the table's lock, the gate's room bounds what is
// open or closing, and each device has its own gate. Blocking opens and
// closes, refused opens, aliases: ipc_handle_table_open_test.cc.
#include "server/memory/ipc_handle_table.h"

#include <chrono>
#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::memory {
namespace {

using ::absl::StatusCode;
using core::FreeGate;
using ::tokensel::testing::StatusIs;

constexpr absl::Duration kWait = absl::Seconds(10);
constexpr uint64_t kExtent = 1 << 20;

std::string Handle(char c) { return std::string(64, c); }

// Opens give distinct bases of `arena`; counts opens and closes per handle.
class FakeIpcOps final : public IpcHandleOps {
 public:
  absl::StatusOr<Opened> Open(const std::string& handle, int device) override {
    if (handle == Handle('x'))
      return absl::InvalidArgumentError("cuda_ipc.handle cannot be opened");
    ++opens[handle];
    return Opened{&arena[next++ % 16], true, kExtent, device};
  }
  void Close(void* base, int /*device*/) noexcept override {
    ++closes;
    // The table's lock must be free while a close runs (the review's item
    // 7): another thread can read the table meanwhile.
    if (table != nullptr) {
      auto other = std::async(std::launch::async, [this] { return table->open_count(); });
      if (other.wait_for(std::chrono::seconds(2)) != std::future_status::ready) {
        ++locked_closes;
        pending.push_back(std::move(other));  // completes once the lock is free
      }
    }
    closed.push_back(base);
  }
  std::map<std::string, int> opens;
  int closes = 0;
  int locked_closes = 0;
  std::vector<void*> closed;
  IpcHandleTable* table = nullptr;
  std::vector<std::future<size_t>> pending;
  char arena[16] = {};
  int next = 0;
};

class IpcHandleTableTest : public ::testing::Test {
 protected:
  IpcHandleTableTest()
      : table_(IpcHandleTable::Create(&ops_, [this](int d) -> FreeGate& { return gates_[d]; })) {
    ops_.table = table_.get();
  }
  // The closes run on the gates' drainers: they must be done before the
  // fake driver below the gates goes.
  ~IpcHandleTableTest() override {
    table_.reset();
    for (FreeGate& gate : gates_) {
      if (gate.open()) (void)gate.AwaitDrained(kWait);
    }
  }
  absl::StatusOr<IpcHandleTable::Ref> Acquire(char c, int device = 0, uint64_t offset = 0,
                                              uint64_t size = 16) {
    return table_->Acquire(Handle(c), device, "GPU-test", offset, size);
  }
  FreeGate gates_[2];  // first: outlives the table and its deferred closes
  FakeIpcOps ops_;
  std::shared_ptr<IpcHandleTable> table_;
};

TEST_F(IpcHandleTableTest, OneOpenPerHandleClosedWithTheLastReference) {
  absl::StatusOr<IpcHandleTable::Ref> a = Acquire('a', 0, 0, 16);
  absl::StatusOr<IpcHandleTable::Ref> b = Acquire('a', 0, 100, 16);
  ASSERT_OK(a);
  ASSERT_OK(b);
  EXPECT_EQ(static_cast<char*>(b->data()) - static_cast<char*>(a->data()), 100);
  EXPECT_EQ(ops_.opens[Handle('a')], 1);
  EXPECT_EQ(gates_[0].reserved(), 1u);  // room for its close
  a = absl::CancelledError();           // drops a reference
  EXPECT_EQ(ops_.closes, 0);
  b = absl::CancelledError();  // gate open: its drainer closes it (free_gate.h)
  EXPECT_EQ(gates_[0].AwaitDrained(kWait), 0u);
  EXPECT_EQ(ops_.closes, 1);
  EXPECT_EQ(ops_.locked_closes, 0);
  EXPECT_EQ(table_->open_count(), 0u);
  EXPECT_EQ(gates_[0].reserved(), 0u);
  EXPECT_THAT(Acquire('a', 1), ::tokensel::testing::IsOk());  // gone: may open on another device
}

// The review's item 1: register / unregister churn of one handle while the
// device's gate is closed queues one close, not one per round, and reuses
// the open handle (no second open).
TEST_F(IpcHandleTableTest, AClosingHandleIsReusedNotReopened) {
  gates_[0].Enter();
  for (int round = 0; round < 100; ++round) {
    ASSERT_OK(Acquire('a'));  // released at once
  }
  EXPECT_EQ(ops_.opens[Handle('a')], 1);
  EXPECT_EQ(ops_.closes, 0);
  EXPECT_EQ(gates_[0].deferred(), 1u);
  EXPECT_EQ(gates_[0].deferred_bytes(), kExtent);  // item 13: its bytes
  EXPECT_EQ(table_->closing_count(), 1u);
  EXPECT_EQ(gates_[0].reserved(), 1u);
  // Taken again while its close waits: the close, when it runs, leaves it.
  absl::StatusOr<IpcHandleTable::Ref> again = Acquire('a');
  ASSERT_OK(again);
  gates_[0].Leave();
  EXPECT_EQ(gates_[0].AwaitDrained(kWait), 0u);
  EXPECT_EQ(ops_.closes, 0);
  EXPECT_EQ(table_->open_count(), 1u);
  EXPECT_EQ(table_->closing_count(), 0u);
  EXPECT_EQ(gates_[0].reserved(), 1u);
  again = absl::CancelledError();  // open: its drainer closes it
  EXPECT_EQ(gates_[0].AwaitDrained(kWait), 0u);
  EXPECT_EQ(ops_.closes, 1);
  EXPECT_EQ(gates_[0].reserved(), 0u);
  EXPECT_EQ(ops_.locked_closes, 0);
}

// The review's item 1: failing registrations (offset + size beyond the
// allocation) of a valid handle open it once; its close is queued once.
TEST_F(IpcHandleTableTest, FailingRegistrationsOpenAndQueueOnce) {
  gates_[0].Enter();
  for (int i = 0; i < 50; ++i) {
    EXPECT_THAT(Acquire('b', 0, kExtent - 8, 16),
                StatusIs(StatusCode::kOutOfRange, "exceeds the 1048576 bytes"));
  }
  EXPECT_EQ(ops_.opens[Handle('b')], 1);
  EXPECT_EQ(gates_[0].deferred(), 1u);
  EXPECT_EQ(gates_[0].dropped(), 0);
  gates_[0].Leave();
  EXPECT_EQ(gates_[0].AwaitDrained(kWait), 0u);
  EXPECT_EQ(ops_.closes, 1);
  EXPECT_EQ(table_->open_count(), 0u);
  EXPECT_EQ(gates_[0].reserved(), 0u);
  EXPECT_EQ(ops_.locked_closes, 0);
  // A handle the driver refuses holds nothing.
  EXPECT_THAT(Acquire('x'), StatusIs(StatusCode::kInvalidArgument, "cannot be opened"));
  EXPECT_EQ(gates_[0].reserved(), 0u);
  EXPECT_EQ(table_->open_count(), 0u);
}

// The review's item 1: distinct handles opened and released while the gate
// is closed count against the device's room; past it a new handle is
// RESOURCE_EXHAUSTED naming the limit (nothing opened), never a close that
// cannot be queued.
TEST_F(IpcHandleTableTest, PendingClosesCountAgainstTheDevicesRoom) {
  for (size_t i = 0; i + 2 < FreeGate::kMaxPending; ++i) ASSERT_OK(gates_[0].Reserve("filler"));
  gates_[0].Enter();
  ASSERT_OK(Acquire('a'));  // released: closing, still holds its room
  absl::StatusOr<IpcHandleTable::Ref> b = Acquire('b');
  ASSERT_OK(b);
  EXPECT_THAT(Acquire('c'), StatusIs(StatusCode::kResourceExhausted, "kMaxPending"));
  EXPECT_EQ(ops_.opens.count(Handle('c')), 0u);
  // The other device is not affected.
  EXPECT_OK(Acquire('c', 1));
  EXPECT_EQ(gates_[1].AwaitDrained(kWait), 0u);
  EXPECT_EQ(ops_.closes, 1);  // device 1's gate is open: its drainer closed it
  // Device 0 still reuses what it has open or closing.
  EXPECT_OK(Acquire('a'));
  b = absl::CancelledError();
  gates_[0].Leave();
  EXPECT_EQ(gates_[0].AwaitDrained(kWait), 0u);
  EXPECT_EQ(ops_.closes, 3);
  for (size_t i = 0; i + 2 < FreeGate::kMaxPending; ++i) gates_[0].Unreserve();
  EXPECT_EQ(gates_[0].reserved(), 0u);
  EXPECT_EQ(gates_[0].dropped(), 0);
}

// A handle open on one device is refused on another.
TEST_F(IpcHandleTableTest, AHandleOpenOnOneDeviceIsRefusedOnAnother) {
  {
    absl::StatusOr<IpcHandleTable::Ref> a = Acquire('a', 0);
    ASSERT_OK(a);
    EXPECT_THAT(Acquire('a', 1), StatusIs(StatusCode::kFailedPrecondition, "open on device 0"));
  }
  EXPECT_EQ(gates_[0].AwaitDrained(kWait), 0u);
  EXPECT_EQ(ops_.closes, 1);
}

// Review2 of the seventh session, finding 1 (IPC half): peer P's handle is
// larger than the gate's whole byte limit; P holds the gate closed and
// drops it, so its close queues more bytes than the limit. The room was
// reserved for P (the opening registration's peer): the close counts in
// P's share, and toward the gate's limit only up to that share, so peer Q
// still opens a handle on the device; P itself is refused, by its share.
TEST_F(IpcHandleTableTest, OnePeersBigCloseRefusesOnlyThatPeer) {
  gates_[0].set_max_deferred_bytes(kExtent / 2);  // a share of kExtent / 8
  absl::StatusOr<IpcHandleTable::Ref> p =
      table_->Acquire(Handle('a'), 0, "GPU-test", 0, 16, "uid:1001");
  ASSERT_OK(p);
  EXPECT_EQ(gates_[0].reserved_by("uid:1001"), 1u);
  gates_[0].Enter();                               // P's wait, never recorded
  p = absl::CancelledError();                      // P unregisters: its close waits
  EXPECT_EQ(gates_[0].deferred_bytes(), kExtent);  // the true total
  EXPECT_EQ(gates_[0].deferred_bytes_by("uid:1001"), kExtent);
  absl::StatusOr<IpcHandleTable::Ref> q =
      table_->Acquire(Handle('b'), 0, "GPU-test", 0, 16, "uid:1002");
  EXPECT_OK(q);
  EXPECT_EQ(gates_[0].reserved_by("uid:1002"), 1u);
  EXPECT_THAT(table_->Acquire(Handle('c'), 0, "GPU-test", 0, 16, "uid:1001"),
              StatusIs(StatusCode::kResourceExhausted,
                       "peer uid:1001 has 1048576 bytes on this gate waiting for their deferred "
                       "teardown, more than its share of 131072"));
  EXPECT_EQ(ops_.opens.count(Handle('c')), 0u);
  // Unowned bytes still count in full: the gate's bound stays.
  EXPECT_THAT(Acquire('d'), ::tokensel::testing::IsOk());  // 128 KiB counted: below the limit
  EXPECT_THAT(Acquire('e'), StatusIs(StatusCode::kResourceExhausted,
                                     "has 1179648 bytes waiting for their deferred teardown"));
  q = absl::CancelledError();
  gates_[0].Leave();
  EXPECT_EQ(gates_[0].AwaitDrained(kWait), 0u);
  EXPECT_EQ(ops_.closes, 3);
  EXPECT_EQ(gates_[0].reserved(), 0u);
  EXPECT_EQ(gates_[0].reserved_by("uid:1001"), 0u);
  EXPECT_EQ(gates_[0].deferred_bytes_by("uid:1001"), 0u);
}

// A deferred close keeps the table alive: the mapper and every region may
// be gone when it runs.
TEST(IpcHandleTableLifetimeTest, ADeferredCloseOutlivesItsOwners) {
  FreeGate gate;
  FakeIpcOps ops;
  std::weak_ptr<IpcHandleTable> weak;
  {
    std::shared_ptr<IpcHandleTable> table =
        IpcHandleTable::Create(&ops, [&](int) -> FreeGate& { return gate; });
    weak = table;
    gate.Enter();
    ASSERT_OK(table->Acquire(Handle('a'), 0, "GPU-test", 0, 16));  // released at once
  }
  EXPECT_FALSE(weak.expired());
  gate.Leave();
  EXPECT_EQ(gate.AwaitDrained(kWait), 0u);
  EXPECT_EQ(ops.closes, 1);
  EXPECT_TRUE(weak.expired());
}

}  // namespace
}  // namespace tokensel::memory
