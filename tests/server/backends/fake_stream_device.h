// FakeStreamDevice: a backends::StreamDevice without a device, for the
// StreamLease tests (stream_lease_test.cc). It records every call with the
// stream it was issued on (`log`) and is lazy like a real stream: copies,
// fills and kernels are queued per stream and run only when the stream is
// synchronized (Finish / Drain), so a caller that read memory before the
// synchronization sees stale bytes. Its "device memory" is host memory and
// its kernels are the CPU's. Failures are injectable. CountingPool: a
// BlockPool over malloc that counts allocations and frees (new blocks are
// filled with 0xAB, stale bytes as a reused block has) and can fail.
// LeasePools: the three pools of a lease over CountingPool; BeginLease;
// StreamBackend.
// Events (stream_chain_test.cc): OpenIpcEvent / CreateEvent make FakeEvents
// ("wait" and "record" are logged on their stream; a handle whose first
// byte is 0xFF is refused as the driver refuses a bad one); a record is
// queued work like the rest, so EventDone turns true only once the device
// got there. Progress(stream) is the device doing the stream's queued work
// WITHOUT any host synchronization (nothing is logged): what a completion
// thread observes through EventDone. Each kernel's status is kept per
// workspace (as the DeviceStatus word), read by that op's Finish.
// Not thread-safe (the tests drive it from one thread).
#ifndef TOKENSEL_TESTS_SERVER_BACKENDS_FAKE_STREAM_DEVICE_H_
#define TOKENSEL_TESTS_SERVER_BACKENDS_FAKE_STREAM_DEVICE_H_

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <new>
#include <ostream>
#include <set>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "server/backends/block_pool.h"
#include "server/backends/stream_lease.h"

namespace tokensel::testing {

using backends::BlockPool;
using backends::StreamDevice;

// One recorded device call: what, and on which stream.
struct Call {
  std::string what;  // "h2d" "zero" "kernel" "d2h" "sync" "drain" "release"
  StreamDevice::Stream stream;
  bool operator==(const Call& o) const { return what == o.what && stream == o.stream; }
};
inline std::ostream& operator<<(std::ostream& os, const Call& c) {
  return os << c.what << "@" << reinterpret_cast<uintptr_t>(c.stream);
}

class FakeStreamDevice final : public StreamDevice {
 public:
  absl::StatusOr<Stream> AcquireStream() override {
    if (!usable) return absl::UnavailableError("fake device out of service");
    if (free_.empty()) {
      ++streams_created;
      return reinterpret_cast<Stream>(uintptr_t{0x1000} * streams_created);
    }
    Stream s = free_.back();
    free_.pop_back();
    return s;
  }
  void ReleaseStream(Stream s) override { free_.push_back(s); }
  // Like the real ones, the copies and fills answer UNAVAILABLE, issuing
  // nothing, once the device is out of service.
  absl::Status CopyToDevice(void* dst, const void* src, uint64_t n, Stream s) override {
    RETURN_IF_ERROR(CheckUsable());
    if (++h2d_count == fail_h2d_at) return absl::InternalError("injected h2d failure");
    return Enqueue("h2d", s, [=] { std::memcpy(dst, src, n); });
  }
  absl::Status CopyToHost(void* dst, const void* src, uint64_t n, Stream s) override {
    RETURN_IF_ERROR(CheckUsable());
    return Enqueue("d2h", s, [=] { std::memcpy(dst, src, n); });
  }
  absl::Status Zero(void* dst, uint64_t n, Stream s) override {
    RETURN_IF_ERROR(CheckUsable());
    return Enqueue("zero", s, [=] { std::memset(dst, 0, n); });
  }
  uint64_t WorkspaceBytes(core::OpArgs) const override { return workspace_bytes; }
  absl::Status Launch(core::OpArgs args, kernels::cuda::Workspace ws, Stream s) override {
    EXPECT_NE(ws.data, nullptr);
    if (fail_launch) return absl::InternalError("injected launch failure");
    // The kernels run later (at a sync or Progress): they read the args then,
    // so a copy is kept, as the device keeps the launch's parameters.
    auto copy = std::make_shared<core::OpArgsValue>(core::CopyArgs(args));
    ws_status_[ws.data] = absl::UnknownError("the op's kernels have not run");
    return Enqueue("kernel", s, [this, copy, ws] {
      kernel_status =
          std::visit([](const auto& a) { return kernels::cpu::Run(a, nullptr); }, *copy);
      ws_status_[ws.data] = kernel_status;
    });
  }
  absl::Status Finish(core::OpArgs, kernels::cuda::Workspace ws, Stream s) override {
    // As a host allocation failing while Finish formats a bad-data message,
    // before the stream was synchronized.
    if (throw_in_finish) throw std::bad_alloc();
    // As kernels::cuda::Finish when its status-word copy fails to enqueue:
    // an error before the synchronization, the stream's work still queued.
    if (fail_finish_before_sync) return absl::InternalError("injected finish failure");
    ExpectHeld(s);
    RunQueue("sync", s);
    auto it = ws_status_.find(ws.data);
    return it != ws_status_.end() ? it->second : kernel_status;
  }
  absl::Status Drain(Stream s, absl::Status status) override {
    RunQueue("drain", s);
    return status;
  }
  absl::Status CheckUsable() const override {
    return usable ? absl::OkStatus() : absl::UnavailableError("fake device out of service");
  }

  // Events.
  struct FakeEvent {
    std::string handle;  // empty: a private (completion) event
    bool done = true;    // never recorded counts as complete, as in CUDA
    bool destroyed = false;
  };
  absl::StatusOr<Event> OpenIpcEvent(absl::string_view handle, absl::string_view field) override {
    RETURN_IF_ERROR(CheckUsable());
    if (!handle.empty() && static_cast<uint8_t>(handle[0]) == 0xFF) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": refused by the fake driver"));
    }
    ++ipc_opens;
    events_.push_back(std::make_unique<FakeEvent>(FakeEvent{std::string(handle)}));
    // A client event whose work has not completed (the client's stream is
    // busy): until ClientEventDone.
    if (pending_handles.count(std::string(handle)) > 0) events_.back()->done = false;
    return static_cast<Event>(events_.back().get());
  }
  absl::StatusOr<Event> CreateEvent() override {
    RETURN_IF_ERROR(CheckUsable());
    if (fail_create_event) return absl::InternalError("injected event creation failure");
    events_.push_back(std::make_unique<FakeEvent>());
    return static_cast<Event>(events_.back().get());
  }
  void DestroyEvent(Event e) override {
    auto* ev = static_cast<FakeEvent*>(e);
    EXPECT_FALSE(ev->destroyed) << "an event destroyed twice";
    ev->destroyed = true;
    ++events_destroyed;
  }
  absl::Status WaitEvent(Stream s, Event e, absl::string_view) override {
    RETURN_IF_ERROR(CheckUsable());
    EXPECT_FALSE(static_cast<FakeEvent*>(e)->destroyed) << "waited on a destroyed event";
    return Enqueue("wait", s, [] {});
  }
  absl::Status RecordEvent(Event e, Stream s, absl::string_view) override {
    RETURN_IF_ERROR(CheckUsable());
    auto* ev = static_cast<FakeEvent*>(e);
    EXPECT_FALSE(ev->destroyed) << "recorded a destroyed event";
    ev->done = false;
    return Enqueue(ev->handle.empty() ? "complete" : "record", s, [ev] { ev->done = true; });
  }
  absl::StatusOr<bool> EventDone(Event e) override {
    if (fail_event_query) return absl::InternalError("injected event query failure");
    return static_cast<FakeEvent*>(e)->done;
  }
  // The device runs `s`'s queued work (no host call, nothing logged).
  void Progress(Stream s) {
    for (auto& f : queue_[s]) f();
    queue_[s].clear();
  }
  // The client's work before its event completed.
  void ClientEventDone(const std::string& handle) {
    pending_handles.erase(handle);
    for (auto& e : events_) {
      if (e->handle == handle) e->done = true;
    }
  }
  size_t live_events() const {
    size_t n = 0;
    for (const auto& e : events_) n += e->destroyed ? 0 : 1;
    return n;
  }

  std::vector<Call> log;
  int ipc_opens = 0;
  std::set<std::string> pending_handles;  // opened as not completed
  int events_destroyed = 0;
  bool fail_create_event = false;
  bool fail_event_query = false;
  int streams_created = 0;
  int h2d_count = 0;
  int fail_h2d_at = 0;  // 1-based; 0 = never
  bool fail_launch = false;
  bool throw_in_finish = false;
  bool fail_finish_before_sync = false;
  bool usable = true;
  uint64_t workspace_bytes = 256;
  absl::Status kernel_status;
  size_t free_streams() const { return free_.size(); }
  size_t queued(Stream s) { return queue_[s].size(); }

 private:
  // Work on a stream that is back in the pool (or none) would share it
  // with the next request.
  void ExpectHeld(Stream s) const {
    EXPECT_NE(s, nullptr) << "work on no stream";
    EXPECT_TRUE(std::find(free_.begin(), free_.end(), s) == free_.end())
        << "work on a stream already back in the pool";
  }
  absl::Status Enqueue(const char* what, Stream s, std::function<void()> f) {
    ExpectHeld(s);
    log.push_back(Call{what, s});
    queue_[s].push_back(std::move(f));
    return absl::OkStatus();
  }
  void RunQueue(const char* what, Stream s) {
    log.push_back(Call{what, s});
    for (auto& f : queue_[s]) f();
    queue_[s].clear();
  }
  std::vector<Stream> free_;
  std::map<Stream, std::vector<std::function<void()>>> queue_;
  std::map<void*, absl::Status> ws_status_;
  std::vector<std::unique_ptr<FakeEvent>> events_;
};

// A pool over malloc that counts, and can be told to fail. With `log` set,
// every block it frees is first poisoned (0xAB), kept (not returned to the
// heap) until the pool ends, and a "release" (stream null) is recorded there: with a cap of 0 every
// Release frees, so the log shows whether a block went back before the drain of work still using
// it, and such work would read or write the poison.
struct CountingPool {
  CountingPool(const char* name, size_t granule, size_t cap,
               std::vector<Call>* release_log = nullptr)
      : log(release_log),
        pool(
            name, granule, cap,
            [this](size_t bytes) -> absl::StatusOr<void*> {
              if (fail || bytes > (size_t{1} << 30)) {
                return absl::ResourceExhaustedError("injected allocation failure");
              }
              ++mallocs;
              void* p = std::malloc(bytes);
              std::memset(p, 0xAB, bytes);  // stale bytes, as a reused block has
              sizes[p] = bytes;
              return p;
            },
            [this](void* p) {
              ++frees;
              if (log != nullptr) {
                log->push_back(Call{"release", nullptr});
                std::memset(p, 0xAB, sizes[p]);
                // Freed for the pool, but the memory is kept until the test
                // ends: work drained after the release (the bug the log
                // shows) then scribbles on poison, not on the heap.
                quarantine.emplace_back(p, &std::free);
              } else {
                std::free(p);
              }
              sizes.erase(p);
            }) {}
  int mallocs = 0;
  int frees = 0;
  bool fail = false;
  std::vector<Call>* const log;
  std::map<void*, size_t> sizes;
  std::vector<std::unique_ptr<void, decltype(&std::free)>> quarantine;
  BlockPool pool;  // last: destroyed first, while the above still exist
};

// The three pools of a lease over CountingPool: pinned and device staging
// (4 KiB granule, `staging_cap` idle each), workspaces (1 MiB granule,
// `workspace_cap` idle); all logging their frees into `log` when set.
struct LeasePools {
  LeasePools(size_t staging_cap, size_t workspace_cap, std::vector<Call>* log = nullptr)
      : pinned("pinned", 4096, staging_cap, log),
        staging("staging", 4096, staging_cap, log),
        workspaces("workspaces", 1 << 20, workspace_cap, log) {}
  backends::StreamPools pools() {
    return backends::StreamPools{&pinned.pool, &staging.pool, &workspaces.pool};
  }
  size_t InUse() const {
    return pinned.pool.blocks_in_use() + staging.pool.blocks_in_use() +
           workspaces.pool.blocks_in_use();
  }
  CountingPool pinned;
  CountingPool staging;
  CountingPool workspaces;
};

// A lease on `device` over `pools`; null (and a test failure) if Begin fails.
inline std::unique_ptr<backends::StreamLease> BeginLease(StreamDevice* device, LeasePools& pools) {
  absl::StatusOr<std::unique_ptr<backends::StreamLease>> lease =
      backends::StreamLease::Begin(device, pools.pools());
  EXPECT_TRUE(lease.ok()) << lease.status();
  return lease.ok() ? *std::move(lease) : nullptr;
}

// A backend whose requests run under a StreamLease on `device` (the
// executor tests); its direct staging and RunOp refuse (a request must go
// through its lease).
class StreamBackend : public core::Backend {
 public:
  StreamBackend(StreamDevice* device, backends::StreamPools pools)
      : device_(device), pools_(pools) {}
  absl::string_view name() const override { return "fake-stream"; }
  bool CanAccess(core::MemoryKind) const override { return true; }
  absl::StatusOr<std::unique_ptr<core::RequestLease>> BeginRequest() override {
    ASSIGN_OR_RETURN(std::unique_ptr<backends::StreamLease> lease,
                     backends::StreamLease::Begin(device_, pools_));
    return std::unique_ptr<core::RequestLease>(std::move(lease));
  }
  absl::StatusOr<std::unique_ptr<Staging>> AllocateStaging(uint64_t) override {
    return absl::InternalError("the executor must stage through its lease");
  }
  absl::Status CopyToStaging(const Staging&, const void*, uint64_t) override {
    return absl::InternalError("the executor must stage through its lease");
  }
  absl::Status CopyFromStaging(void*, const Staging&, uint64_t) override {
    return absl::InternalError("the executor must stage through its lease");
  }
  absl::Status RunOp(core::OpArgs) override {
    return absl::InternalError("the executor must run through its lease");
  }
  uint64_t OpScratchBytes(core::OpArgs) const override { return 1 << 20; }

 protected:
  StreamDevice* const device_;
  const backends::StreamPools pools_;
};

}  // namespace tokensel::testing

#endif  // TOKENSEL_TESTS_SERVER_BACKENDS_FAKE_STREAM_DEVICE_H_
