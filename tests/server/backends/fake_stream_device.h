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
// ("wait" and "record" are logged on their stream, a private event's record
// "complete", or "waited" for the chain's marker after its wait; a handle
// whose first byte is 0xFF is refused as the driver refuses a bad one). As
// in CUDA, each record is a separate completion: a stream's wait captures
// the event's record of that moment (a later record of the event does not
// release it), and EventDone reports the latest record. The client's
// records are kept apart from the server's: pending_handles (the client's
// first record not completed), ClientEventDone (every client record
// completes; never a server's), ClientRerecord (the client records the
// event again on an idle stream), ClientRecord; ClientEventQuery.
// Progress(stream) is the device doing the stream's queued work WITHOUT any
// host synchronization (nothing is logged): what a completion thread
// observes through EventDone / QueryStream. Waits and event records at the
// head of a stream run by themselves (the device gets there without the
// host); copies and kernels only at Progress or a host synchronization.
// Progress stops at a wait whose record is pending; a host synchronization
// (Finish, Drain) of such a stream FAILS the test: on a device it would
// block for ever. Each kernel's status is kept per workspace (as the
// DeviceStatus word), read by that op's Finish.
// Not thread-safe (the tests drive it from one thread).
#ifndef TOKENSEL_TESTS_SERVER_BACKENDS_FAKE_STREAM_DEVICE_H_
#define TOKENSEL_TESTS_SERVER_BACKENDS_FAKE_STREAM_DEVICE_H_

#include <algorithm>
#include <cstddef>
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

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "server/backends/block_pool.h"
#include "server/backends/client_event_error.h"
#include "server/backends/stream_lease.h"
#include "tests/server/backends/counting_pool.h"

namespace tokensel::testing {

using backends::BlockPool;
using backends::StreamDevice;

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
  void ReleaseStream(Stream s) override {
    // As the real pool's push_back running out of host memory.
    if (throw_in_release_stream) throw std::bad_alloc();
    free_.push_back(s);
  }
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
    RETURN_IF_ERROR(Enqueue("kernel", s, [this, copy, ws] {
      kernel_status =
          std::visit([](const auto& a) { return kernels::cpu::Run(a, nullptr); }, *copy);
      ws_status_[ws.data] = kernel_status;
    }));
    if (on_launch) on_launch();  // after the kernel is queued (may throw)
    return absl::OkStatus();
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
  absl::StatusOr<bool> QueryStream(Stream s) override {
    ++stream_queries;
    if (fail_stream_query) return absl::InternalError("injected stream query failure");
    return queue_[s].empty();
  }
  absl::Status CheckUsable() const override {
    return usable ? absl::OkStatus() : absl::UnavailableError("fake device out of service");
  }
  void MarkOutOfService(absl::string_view why) override {
    usable = false;
    out_of_service_why = std::string(why);
  }
  bool ContextFailed() const override { return sticky; }
  // A sticky error: out of service, and the context runs nothing more.
  void FailContext() {
    usable = false;
    sticky = true;
  }

  // Events.
  using Record = std::shared_ptr<bool>;  // one record of an event: done?
  struct FakeEvent {
    std::string handle;  // empty: a private (completion) event
    Record record;       // private: the latest; null: never recorded (complete, as in CUDA)
    bool destroyed = false;
  };
  absl::StatusOr<Event> OpenIpcEvent(absl::string_view handle, absl::string_view field) override {
    RETURN_IF_ERROR(CheckUsable());
    if (!handle.empty() && static_cast<uint8_t>(handle[0]) == 0xFF) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": refused by the fake driver"));
    }
    if (client_event_error != 0 && fail_client_call == "open") {
      return ClientEventFailure(field, "cudaIpcOpenEventHandle");
    }
    ++ipc_opens;
    events_.push_back(std::make_unique<FakeEvent>(FakeEvent{std::string(handle)}));
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
  // A failed call on the client's event, classified as CudaBackend does
  // (client_event_error.h): client_event_error 1 = a client-fault code, 2 =
  // another code (cudaErrorUnknown); the probe finds the device dead when
  // probe_fails (then the device is out of service).
  absl::Status ClientEventFailure(absl::string_view field, absl::string_view call) {
    const bool client_code = client_event_error == 1;
    client_event_error = 0;
    return backends::ClientEventError(field, call, "injected", client_code, [this] {
      ++probes;
      if (!probe_fails) return absl::OkStatus();
      FailContext();  // the probe's sticky error
      return absl::UnavailableError("fake device out of service (probe)");
    });
  }
  absl::Status WaitEvent(Stream s, Event e, absl::string_view field) override {
    RETURN_IF_ERROR(CheckUsable());
    if (client_event_error != 0 && fail_client_call == "wait") {
      return ClientEventFailure(field, "cudaStreamWaitEvent");
    }
    EXPECT_FALSE(static_cast<FakeEvent*>(e)->destroyed) << "waited on a destroyed event";
    // The record of this moment, not a later one.
    return Enqueue(
        "wait", s, [] {}, RecordOf(static_cast<FakeEvent*>(e)));
  }
  absl::Status RecordEvent(Event e, Stream s, absl::string_view field) override {
    RETURN_IF_ERROR(CheckUsable());
    auto* ev = static_cast<FakeEvent*>(e);
    EXPECT_FALSE(ev->destroyed) << "recorded a destroyed event";
    // The completion event's record (not the wait's marker).
    if (ev->handle.empty() && fail_record_private && !absl::StartsWith(field, "the wait's")) {
      return absl::InternalError("injected private record failure");
    }
    if (!ev->handle.empty() && client_event_error != 0 && fail_client_call == "record") {
      return ClientEventFailure(field, "cudaEventRecord");
    }
    // A server record: a record of its own, completed only by this stream
    // (never by the client's ClientEventDone); the event's latest from now.
    Record r = std::make_shared<bool>(false);
    RecordOf(ev) = r;
    const char* what = !ev->handle.empty()                     ? "record"
                       : absl::StartsWith(field, "the wait's") ? "waited"
                                                               : "complete";
    return Enqueue(what, s, [r] { *r = true; });
  }
  absl::StatusOr<bool> EventDone(Event e) override {
    if (fail_event_query) return absl::InternalError("injected event query failure");
    const Record& r = RecordOf(static_cast<FakeEvent*>(e));
    return r == nullptr || *r;
  }
  // The device runs `s`'s queued work (no host call, nothing logged), up to
  // a wait whose record is pending.
  void Progress(Stream s) { Run(s, /*all=*/true); }
  // The client's work before its records of the event completed: every
  // record the CLIENT made of it (not the server's records, which complete
  // when their stream gets there).
  void ClientEventDone(const std::string& handle) {
    pending_handles.erase(handle);
    LatestOf(handle);  // its first record, if none yet
    for (Record& r : client_records_[handle]) *r = true;
    RunReady();
  }
  // The client records its event again, on an idle stream: the new record
  // is complete at once; the previous one (a wait may hold it) is not.
  void ClientRerecord(const std::string& handle) { ClientRecord(handle, /*done=*/true); }
  // The client records its event behind work of its own (not done until
  // ClientEventDone).
  void ClientRecord(const std::string& handle, bool done = false) {
    pending_handles.erase(handle);
    LatestOf(handle);
    Record r = std::make_shared<bool>(done);
    client_records_[handle].push_back(r);
    latest_[handle] = r;
  }
  // What cudaEventQuery of the client's event reports: its latest record
  // (the client's or the server's) completed.
  bool ClientEventQuery(const std::string& handle) { return *LatestOf(handle); }
  size_t live_events() const {
    size_t n = 0;
    for (const auto& e : events_) n += e->destroyed ? 0 : 1;
    return n;
  }

  std::vector<Call> log;
  int ipc_opens = 0;
  std::set<std::string> pending_handles;  // opened as not completed
  int events_destroyed = 0;
  int stream_queries = 0;
  std::function<void()> on_launch;  // in each Launch, after its kernel is queued
  std::function<void()> on_sync;    // at a host sync of a stream with work queued
  int client_event_error = 0;       // the next client-event call fails: 1 client code, 2 other
  std::string fail_client_call;     // which: "open" "wait" "record"
  bool probe_fails = false;
  int probes = 0;
  bool fail_create_event = false;
  bool fail_record_private = false;  // the completion event's record fails
  bool fail_stream_query = false;
  bool fail_event_query = false;
  int streams_created = 0;
  int h2d_count = 0;
  int fail_h2d_at = 0;  // 1-based; 0 = never
  bool fail_launch = false;
  bool throw_in_finish = false;
  bool throw_in_release_stream = false;
  bool fail_finish_before_sync = false;
  bool usable = true;              // false: out of service (CheckUsable fails)
  bool sticky = false;             // the context failed (ContextFailed); see FailContext
  std::string out_of_service_why;  // MarkOutOfService
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
  struct Item {
    std::function<void()> run;
    Record blocker;  // a wait: runs once this record completed
    bool light;      // a wait or an event record: the device runs it alone
    bool ready() const { return blocker == nullptr || *blocker; }
  };
  Record& RecordOf(FakeEvent* ev) { return ev->handle.empty() ? ev->record : LatestOf(ev->handle); }
  // The latest record of a client's event; before any, the client's first
  // record (pending when the handle is in pending_handles).
  Record& LatestOf(const std::string& handle) {
    Record& r = latest_[handle];
    if (r == nullptr) {
      r = std::make_shared<bool>(pending_handles.count(handle) == 0);
      client_records_[handle].push_back(r);
    }
    return r;
  }
  absl::Status Enqueue(const char* what, Stream s, std::function<void()> f,
                       Record blocker = nullptr) {
    ExpectHeld(s);
    log.push_back(Call{what, s});
    const std::string w = what;
    const bool light = w == "wait" || w == "record" || w == "complete" || w == "waited";
    queue_[s].push_back(Item{std::move(f), std::move(blocker), light});
    RunReady();
    return absl::OkStatus();
  }
  // Runs `s`'s work from its head: all of it (up to a blocked wait), or
  // only the waits and records.
  void Run(Stream s, bool all) {
    auto& q = queue_[s];
    size_t i = 0;
    for (; i < q.size() && q[i].ready() && (all || q[i].light); ++i) q[i].run();
    q.erase(q.begin(), q.begin() + static_cast<std::ptrdiff_t>(i));
  }
  void RunReady() {
    for (int round = 0; round < 4; ++round) {
      for (auto& [s, q] : queue_) Run(s, /*all=*/false);
    }
  }
  void RunQueue(const char* what, Stream s) {
    log.push_back(Call{what, s});
    if (on_sync && !queue_[s].empty()) on_sync();
    Run(s, /*all=*/true);
    EXPECT_TRUE(queue_[s].empty()) << what << " of a stream that waits on a pending client event: "
                                   << "host sync would block forever";
    queue_[s].clear();
  }
  std::vector<Stream> free_;
  std::map<Stream, std::vector<Item>> queue_;
  // Per handle: the latest record (the client's or the server's), and every
  // record the client made (the server's are not there: a wait captures
  // exactly the record of its moment, and ClientEventDone completes only
  // the client's: the fourth review found a ping-pong event, where the
  // server's record came last, completing the server's record instead).
  std::map<std::string, Record> latest_;
  std::map<std::string, std::vector<Record>> client_records_;
  std::map<void*, absl::Status> ws_status_;
  std::vector<std::unique_ptr<FakeEvent>> events_;
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
