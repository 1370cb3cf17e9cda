// IpcEventCache (server/backends/ipc_event_cache.h) with SessionManager
// wired as the server wires them (on_begin -> BeginSession, on_end ->
// EndSession), over a thread-safe fake device whose event opens can be held
// inside the "driver": the seventh review's lock edge (no driver call under
// a lock SessionManager waits for) and the race of two opens of one
// session's handle.
#include "server/backends/ipc_event_cache.h"

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "server/core/session_manager.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::testing {
namespace {

using backends::IpcEvent;
using backends::StreamDevice;

// Only the event calls are used; the first open of a handle starting with
// 'S' (slow) stays inside the driver until `release`. Thread-safe.
class HeldOpenDevice final : public StreamDevice {
 public:
  absl::StatusOr<Event> OpenIpcEvent(absl::string_view handle, absl::string_view) override {
    if (handle[0] == 'S' && !held_once_.exchange(true)) {
      inside.Notify();
      release.WaitForNotification();
    }
    return reinterpret_cast<Event>(uintptr_t{0x1000} + next_.fetch_add(1));
  }
  void DestroyEvent(Event) override { destroyed.fetch_add(1); }

  absl::StatusOr<Stream> AcquireStream() override { return Unused(); }
  void ReleaseStream(Stream) override {}
  absl::Status CopyToDevice(void*, const void*, uint64_t, Stream) override { return Unused(); }
  absl::Status CopyToHost(void*, const void*, uint64_t, Stream) override { return Unused(); }
  absl::Status Zero(void*, uint64_t, Stream) override { return Unused(); }
  uint64_t WorkspaceBytes(core::OpArgs) const override { return 0; }
  absl::Status Launch(core::OpArgs, kernels::cuda::Workspace, Stream) override { return Unused(); }
  absl::Status Finish(core::OpArgs, kernels::cuda::Workspace, Stream) override { return Unused(); }
  absl::Status Drain(Stream, absl::Status status) override { return status; }
  absl::Status CheckUsable() const override { return absl::OkStatus(); }
  absl::StatusOr<bool> QueryStream(Stream) override { return Unused(); }
  void MarkOutOfService(absl::string_view) override {}
  bool ContextFailed() const override { return false; }
  absl::StatusOr<Event> CreateEvent() override { return Unused(); }
  absl::Status WaitEvent(Stream, Event, absl::string_view) override { return Unused(); }
  absl::Status RecordEvent(Event, Stream, absl::string_view) override { return Unused(); }
  absl::StatusOr<bool> EventDone(Event) override { return Unused(); }

  absl::Notification inside;   // the held open is in the driver
  absl::Notification release;  // lets it return
  std::atomic<int> destroyed{0};

 private:
  static absl::Status Unused() { return absl::UnimplementedError("not used by the cache"); }
  std::atomic<bool> held_once_{false};
  std::atomic<uintptr_t> next_{0};
};

class IpcEventCacheLockTest : public ::testing::Test {
 protected:
  IpcEventCacheLockTest()
      : sessions_(
            core::SessionLimits(), [this](const std::string& id) { cache_.EndSession(id); },
            nullptr) {
    sessions_.set_on_begin([this](const std::string& id) { cache_.BeginSession(id); });
  }
  ~IpcEventCacheLockTest() override {
    // Never leave a thread inside the driver.
    if (!device_.release.HasBeenNotified()) device_.release.Notify();
    for (std::thread* t : {&held_, &other_}) {
      if (t->joinable()) t->join();
    }
  }

  HeldOpenDevice device_;
  backends::IpcEventCache cache_{&device_};
  core::SessionManager sessions_;
  std::thread held_;
  std::thread other_;
};

// Get held the cache's lock across OpenIpcEvent (cudaIpcOpenEventHandle and
// the probe); SessionManager::Open ran BeginSession (which takes that lock)
// under its own lock, and every request's Touch takes that one: one
// client's slow open stalled every session Open, every request's session
// check, and every other session's event open on the device. Seen failing
// before the fix (the other thread did not finish while the open was held).
TEST_F(IpcEventCacheLockTest, AnOpenHeldInTheDriverBlocksNoOtherSessionOrRequest) {
  absl::StatusOr<core::SessionInfo> a = sessions_.Open("a", absl::ZeroDuration());
  ASSERT_OK(a);
  absl::StatusOr<std::shared_ptr<IpcEvent>> slow;
  held_ = std::thread([&] { slow = cache_.Get(a->id, std::string(64, 'S'), "wait_event"); });
  device_.inside.WaitForNotification();

  absl::Notification done;
  absl::StatusOr<core::SessionInfo> b;
  absl::Status touched_a;
  absl::Status touched_b;
  absl::StatusOr<std::shared_ptr<IpcEvent>> fast;
  other_ = std::thread([&] {
    b = sessions_.Open("b", absl::ZeroDuration());
    touched_a = sessions_.Touch(a->id).status();
    if (b.ok()) {
      touched_b = sessions_.Touch(b->id).status();
      fast = cache_.Get(b->id, std::string(64, 'f'), "record_event");
    }
    done.Notify();
  });
  const bool in_time = done.WaitForNotificationWithTimeout(absl::Seconds(5));
  device_.release.Notify();
  held_.join();
  other_.join();
  EXPECT_TRUE(in_time) << "a session Open / Touch / another session's event open waited for a "
                          "driver call held by another session";
  ASSERT_OK(b);
  EXPECT_OK(touched_a);
  EXPECT_OK(touched_b);
  ASSERT_OK(fast);
  ASSERT_OK(slow);
  EXPECT_EQ(cache_.cached(a->id), 1u);
  EXPECT_EQ(cache_.cached(b->id), 1u);
  EXPECT_EQ(cache_.live_sessions(), 2u);
  ASSERT_OK(sessions_.Close(a->id));
  EXPECT_EQ(cache_.live_sessions(), 1u);
}

// Two Gets of one session and handle, the first held in the driver: the
// second opens too and caches its event; the first, back, keeps the cached
// one and destroys its own (unused). One entry, both requests share one
// event, nothing leaks.
TEST_F(IpcEventCacheLockTest, OfTwoOpensOfOneHandleTheFirstCachedIsKept) {
  absl::StatusOr<core::SessionInfo> a = sessions_.Open("a", absl::ZeroDuration());
  ASSERT_OK(a);
  const std::string handle(64, 'S');
  absl::StatusOr<std::shared_ptr<IpcEvent>> first;
  held_ = std::thread([&] { first = cache_.Get(a->id, handle, "wait_event"); });
  device_.inside.WaitForNotification();
  absl::Notification done;
  absl::StatusOr<std::shared_ptr<IpcEvent>> second;
  size_t cached_then = 0;
  other_ = std::thread([&] {
    second = cache_.Get(a->id, handle, "wait_event");
    cached_then = cache_.cached(a->id);
    done.Notify();
  });
  EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(5)))
      << "the second open waited for the first";
  device_.release.Notify();
  held_.join();
  other_.join();
  ASSERT_OK(second);
  EXPECT_EQ(cached_then, 1u);
  ASSERT_OK(first);
  EXPECT_EQ((*first)->get(), (*second)->get()) << "the first cached event is everyone's";
  EXPECT_EQ(cache_.opens(), 2u);
  EXPECT_EQ(device_.destroyed.load(), 1) << "the extra event is destroyed";
  EXPECT_EQ(cache_.cached(a->id), 1u);
  // A later Get hits the cache: no third open.
  ASSERT_OK(cache_.Get(a->id, handle, "wait_event"));
  EXPECT_EQ(cache_.opens(), 2u);
  first->reset();
  second->reset();
  ASSERT_OK(sessions_.Close(a->id));
  EXPECT_EQ(device_.destroyed.load(), 2);
}

}  // namespace
}  // namespace tokensel::testing
