// Execute with CUDA IPC events, without a device: the wait slots of the
// fifth review (async_requests.h), through the executor, StreamChain and
// the CompletionQueue of the fixture (stream_chain_test.h). The stuck caps
// bound requests that WAIT, not only those already stuck: one peer with
// several sessions whose events never complete can never hold more than
// its caps, even after every wait turned stuck (60 s later); and a wait
// that passes gives its slot back at once, so a long pipeline of waits
// that pass is never refused.
#include <chrono>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "tests/server/backends/stream_chain_test.h"

namespace tokensel::testing {
namespace {

using ::absl::StatusCode;

// A stop token that has fired (the call's deadline passed).
class PastDeadline final : public kernels::StopToken {
 public:
  absl::Status Check() const override { return absl::DeadlineExceededError("deadline passed"); }
};

// A stop token that never fires and notes, at each check (the executor
// checks before each op runs), how many wait slots session s holds.
class SlotsAtEachOp final : public kernels::StopToken {
 public:
  explicit SlotsAtEachOp(const core::AsyncRequests* async) : async_(async) {}
  absl::Status Check() const override {
    seen.push_back(async_->waiting("s"));
    return absl::OkStatus();
  }
  mutable std::vector<uint32_t> seen;

 private:
  const core::AsyncRequests* const async_;
};

class ChainCapsTest : public ChainTest {
 protected:
  // An async Gather of `session` (its buffers added on first use) waiting
  // on `wait`, recording Handle('r'), for `peer` under `async`.
  absl::Status RunAsync(core::AsyncRequests& async, const std::string& session,
                        const std::string& peer, const std::string& wait) {
    if (sessions_.insert(session).second) {
      AddBuffer("acts", kChainActs, session);
      AddBuffer("idx", kChainIdx, session);
      AddBuffer("out", std::vector<float>(8, 0.f), session);
    }
    events_ = core::IpcEvents{wait, Handle('r')};
    core::RunOptions options;
    options.events = &events_;
    options.async = &async;
    options.peer = peer;
    return executor_.RunAll(session, {Gather("acts", "idx", "out")}, options).status();
  }
  // Completes everything still queued (the client's event done at last).
  void FinishAll(const std::string& handle) {
    device_.ClientEventDone(handle);
    std::set<StreamDevice::Stream> streams;
    for (const auto& call : device_.log) streams.insert(call.stream);
    for (StreamDevice::Stream s : streams) device_.Progress(s);
    backend_.queue().Poll();
  }

  std::set<std::string> sessions_;
};

// The review's scenario, scaled down (per session 2, per peer 4, server 8
// waiting or stuck; admission caps far above): one uid, four sessions, each
// sends async Executes whose wait_event never completes until refused.
// Before the fix each session got its per-session admission (16 here), and
// after the stuck bound (60 s; 0 here) all of them turned stuck: 48 stuck
// for one peer, the server's stuck cap taken from every other peer.
TEST_F(ChainCapsTest, OnePeersWaitsNeverExceedTheStuckCaps) {
  core::AsyncLimits limits;
  limits.per_session = 16;
  limits.per_peer = 64;
  limits.total = 256;
  limits.stuck_per_session = 2;
  limits.stuck_per_peer = 4;
  limits.stuck_total = 8;
  core::AsyncRequests async(limits);
  backend_.set_max_host_wait(std::chrono::milliseconds(0));  // stuck at the first poll
  device_.pending_handles.insert(Handle('p'));
  int admitted = 0;
  for (const char* s : {"a1", "a2", "a3", "a4"}) {
    for (int i = 0; i < 16; ++i) {
      const absl::Status st = RunAsync(async, s, "uid:1", Handle('p'));
      if (!st.ok()) {
        EXPECT_THAT(st, StatusIs(StatusCode::kResourceExhausted, "wait_event")) << s;
        break;
      }
      ++admitted;
      EXPECT_LE(async.peer_stuck("uid:1") + async.peer_waiting("uid:1"), limits.stuck_per_peer);
    }
  }
  EXPECT_EQ(admitted, 4) << "the peer's waits are capped at admission";
  EXPECT_THAT(RunAsync(async, "a4", "uid:1", Handle('p')),
              StatusIs(StatusCode::kResourceExhausted,
                       "(4 waiting on it, 0 abandoned while waiting on a wait_event) for peer "
                       "uid:1 (all its sessions), the limit is 4"));
  // Another peer still gets its wait slots (per session 2).
  ASSERT_OK(RunAsync(async, "b1", "uid:2", Handle('p')));
  ASSERT_OK(RunAsync(async, "b1", "uid:2", Handle('p')));
  // The bound passes: every wait turns stuck, and no cap is exceeded.
  backend_.queue().Poll();
  EXPECT_EQ(async.peer_stuck("uid:1"), 4u);
  EXPECT_EQ(async.stuck(), 6u);
  EXPECT_LE(async.stuck(), limits.stuck_total);
  EXPECT_EQ(async.inflight(), 0u) << "stuck ones count as stuck, not in flight";
  // A third peer is served: the server-wide stuck cap is not one peer's.
  ASSERT_OK(RunAsync(async, "c1", "uid:3", Handle('p')));
  ASSERT_OK(RunAsync(async, "c1", "uid:3", Handle('p')));
  EXPECT_THAT(RunAsync(async, "c2", "uid:3", Handle('p')),
              StatusIs(StatusCode::kResourceExhausted, "in the server, the limit is 8"));
  backend_.queue().Poll();
  EXPECT_EQ(async.stuck(), limits.stuck_total);
  FinishAll(Handle('p'));
  EXPECT_EQ(async.stuck(), 0u);
  EXPECT_EQ(async.inflight(), 0u);
}

// A wait seen passed by the completion queue gives its slot back at once,
// long before the request's work completes: a client that keeps many
// steps in flight, each waiting on its own event that does pass, is never
// refused by the stuck caps (2 per session here), only by the admission
// caps (16 in flight per session).
TEST_F(ChainCapsTest, AWaitThatPassesGivesItsSlotBackAtOnce) {
  core::AsyncLimits limits;
  limits.per_session = 16;
  limits.stuck_per_session = 2;
  core::AsyncRequests async(limits);
  for (int i = 0; i < 15; ++i) {
    // The client's event is done (its producer finished): the stream's wait
    // passes by itself; the kernels after it wait for the device.
    ASSERT_OK(RunAsync(async, "s", "uid:1", Handle('w'))) << "step " << i;
    EXPECT_EQ(async.waiting("s"), 1u);
    EXPECT_EQ(backend_.queue().Poll(), 0) << "the work is still queued";
    EXPECT_EQ(async.waiting("s"), 0u) << "step " << i << ": the slot went back";
  }
  EXPECT_EQ(async.inflight("s"), 15u);
  EXPECT_EQ(async.stuck(), 0u);
  FinishAll(Handle('w'));
  EXPECT_EQ(async.inflight(), 0u);
  EXPECT_EQ(async.waiting(), 0u);
}

// Sync requests take a wait slot too, given back when the host saw the
// wait pass, before the ops run (they may be long): many sync Executes in
// a row are never refused, and a sync request abandoned at its deadline
// keeps its slot as a stuck one.
TEST_F(ChainCapsTest, SyncWaitsGiveTheirSlotBackOrKeepItStuck) {
  AddGatherBuffers();
  const std::vector<core::OpRequest> ops = {Gather("acts", "idx", "out")};
  const SlotsAtEachOp watch(&async_);
  stop_ = &watch;
  for (uint32_t i = 0; i < 3 * core::AsyncLimits().stuck_per_session; ++i) {
    ASSERT_OK(Execute(ops, Handle('w'), "")) << i;
    EXPECT_EQ(async_.waiting(), 0u);
    EXPECT_EQ(async_.inflight(), 0u);
  }
  ASSERT_FALSE(watch.seen.empty());
  EXPECT_THAT(watch.seen, ::testing::Each(0u)) << "a slot held while the ops ran";
  device_.pending_handles.insert(Handle('p'));
  const PastDeadline expired;
  stop_ = &expired;  // (replaces the watch)
  EXPECT_THAT(Execute(ops, Handle('p'), "").status(), StatusIs(StatusCode::kDeadlineExceeded));
  stop_ = nullptr;
  EXPECT_EQ(async_.stuck("s"), 1u);
  EXPECT_EQ(async_.waiting("s"), 0u);
  FinishAll(Handle('p'));
  EXPECT_EQ(async_.stuck(), 0u);
}

// The fifth review: the event cache's tombstones (the last 4096 ended
// sessions) could be evicted by session churn, and a Get delayed past 4096
// other session ends cached again (for a session nothing would end again:
// its events leaked). Now it caches only for live sessions (BeginSession ..
// EndSession): exact whatever the churn, and bounded by the live sessions.
TEST_F(ChainCapsTest, ADelayedGetAfterAnySessionChurnNeverCaches) {
  backends::IpcEventCache& cache = backend_.events();
  ASSERT_OK(cache.Get("s", Handle('a'), "wait_event"));
  EXPECT_EQ(cache.cached("s"), 1u);
  cache.EndSession("s");
  // More than 4096 other sessions begin, cache an event and end while the
  // late request of s is delayed between its session check and its Get.
  for (int i = 0; i < 5000; ++i) {
    const std::string other = "churn" + std::to_string(i);
    cache.BeginSession(other);
    ASSERT_OK(cache.Get(other, Handle('c'), "wait_event"));
    cache.EndSession(other);
  }
  {
    absl::StatusOr<std::shared_ptr<backends::IpcEvent>> late =
        cache.Get("s", Handle('b'), "wait_event");
    ASSERT_OK(late);
    EXPECT_EQ(cache.cached("s"), 0u) << "cached for a session that ended";
    EXPECT_EQ(device_.live_events(), 1u) << "the request's own event";
  }
  EXPECT_EQ(device_.live_events(), 0u) << "destroyed with the request's reference";
  // A session never begun caches nothing either; one entry per live session.
  ASSERT_OK(cache.Get("never", Handle('a'), "wait_event"));
  EXPECT_EQ(cache.cached("never"), 0u);
  EXPECT_EQ(cache.live_sessions(), 1u) << "only t (begun by the fixture) is live";
  ASSERT_OK(cache.Get("t", Handle('a'), "wait_event"));
  EXPECT_EQ(cache.cached("t"), 1u) << "a live session caches as before";
  cache.BeginSession("t");  // idempotent: its events stay
  EXPECT_EQ(cache.cached("t"), 1u);
  cache.EndSession("t");
  EXPECT_EQ(device_.live_events(), 0u);
  EXPECT_EQ(cache.live_sessions(), 0u);
}

}  // namespace
}  // namespace tokensel::testing
