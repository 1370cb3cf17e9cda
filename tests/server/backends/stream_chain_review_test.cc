// Execute with CUDA IPC events, without a device: the fourth review's event
// findings (docs/gpu.md, "Fourth review"), over the fixture of
// stream_chain_test.h: record_event touched only after the ops, one event
// as wait and record (ping-pong), async requests whose wait never passes
// counted as stuck, the caps per peer, a device merely marked out of
// service, the event cache after a session's end.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "tests/server/backends/stream_chain_test.h"

namespace tokensel::testing {
namespace {

using ::absl::StatusCode;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;

std::vector<float> FloatsAt(const float* p, size_t n) { return std::vector<float>(p, p + n); }

// A chain must not record the client's record_event before its ops: its
// latest record would then be one already complete, and a consumer waiting
// on the event (after the reply of an EARLIER request with that
// record_event) would read before the earlier request's kernels ran; a
// request failing after Begin would leave the event complete too. (The
// old check in Begin did exactly that.)
TEST_F(ChainTest, ABegunChainRecordsNothingOnItsRecordEventBeforeItsOps) {
  // The event's latest record (an earlier request's, or the client's) is
  // still pending.
  device_.pending_handles.insert(Handle('r'));
  for (const bool async : {true, false}) {
    SCOPED_TRACE(async ? "async" : "sync");
    absl::StatusOr<std::unique_ptr<core::RequestChain>> chain =
        backend_.BeginChain("s", core::IpcEvents{Handle('w'), Handle('r')}, async);
    ASSERT_OK(chain);
    for (const Call& c : device_.log) EXPECT_NE(c.what, "record") << "recorded before any op";
    EXPECT_FALSE(device_.ClientEventQuery(Handle('r')))
        << "record_event shows complete while nothing of the request ran";
    chain->reset();  // the request failed before Commit
    EXPECT_FALSE(device_.ClientEventQuery(Handle('r'))) << "a failed request completed the event";
  }
  for (const Call& c : device_.log) device_.Progress(c.stream);
  EXPECT_EQ(backend_.queue().Poll(), 2) << "both handed to the queue (waits not seen passed)";
  EXPECT_FALSE(device_.ClientEventQuery(Handle('r')));
  EXPECT_EQ(pools_.InUse(), 0u);
}

// One event as wait_event and record_event (ping-pong): the stream waits on
// the client's record of that moment; the server's record comes after the
// ops and is the event's latest; it neither releases the request's own
// wait (on the client's record) nor is released by the client's work. A
// second request that waits on the event captures the first request's
// record: it runs after the first request's op, not after the client's.
TEST_F(ChainTest, OneEventAsWaitAndRecordPingPongs) {
  float* out = AddGatherBuffers();
  float* out2 = AddBuffer("out2", std::vector<float>(8, 0.f));
  const std::string e = Handle('e');
  device_.pending_handles.insert(e);  // the client's record: its work still runs
  ASSERT_OK(Execute({Gather("acts", "idx", "out")}, e, e));
  const StreamDevice::Stream s1 = LastStream();
  EXPECT_THAT(device_.log, ElementsAre(Call{"wait", s1}, Call{"waited", s1}, Call{"kernel", s1},
                                       Call{"record", s1}, Call{"complete", s1}))
      << "the server's record only after the op";
  EXPECT_FALSE(device_.ClientEventQuery(e)) << "the latest record is the server's, pending";
  ASSERT_OK(Execute({Gather("acts", "idx", "out2")}, e, e));
  const StreamDevice::Stream s2 = LastStream();
  ASSERT_NE(s1, s2);
  device_.Progress(s1);
  device_.Progress(s2);
  EXPECT_EQ(out[0], 0.f) << "ran before the client's work completed";
  EXPECT_EQ(out2[0], 0.f);
  // The client's work completes: the first request's wait is released
  // (the fake used to complete the server's record instead, and this wait
  // never ended); the second still waits on the first's record.
  device_.ClientEventDone(e);
  device_.Progress(s2);
  EXPECT_EQ(out2[0], 0.f) << "the second request ran before the first request's op";
  EXPECT_FALSE(device_.ClientEventQuery(e)) << "the server's record is not the client's";
  device_.Progress(s1);
  EXPECT_THAT(FloatsAt(out, 8), ElementsAreArray(kChainGathered));
  device_.Progress(s2);
  EXPECT_THAT(FloatsAt(out2, 8), ElementsAreArray(kChainGathered));
  EXPECT_TRUE(device_.ClientEventQuery(e)) << "the last record (the second request's) ran";
  EXPECT_EQ(backend_.queue().Poll(), 2);
  EXPECT_EQ(async_.inflight(), 0u);
  EXPECT_EQ(pools_.InUse(), 0u);
}

// An async request whose stream's wait has not passed after the bound (60
// s; 0 here) moves from in flight to stuck (the admission caps are for
// requests that will complete), like an abandoned sync one; one whose
// wait passed but whose work is slow does not.
TEST_F(ChainTest, AnAsyncRequestWhoseWaitDoesNotPassCountsAsStuck) {
  float* out = AddGatherBuffers();
  AddBuffer("out2", std::vector<float>(8, 0.f));
  backend_.set_max_host_wait(std::chrono::milliseconds(0));
  device_.pending_handles.insert(Handle('p'));
  ASSERT_OK(Execute({Gather("acts", "idx", "out")}, Handle('p'), Handle('r')));
  const StreamDevice::Stream stuck = LastStream();
  ASSERT_OK(Execute({Gather("acts", "idx", "out2")}, Handle('w'), Handle('r')));
  const StreamDevice::Stream slow = LastStream();
  EXPECT_EQ(async_.inflight("s"), 2u);
  EXPECT_EQ(backend_.queue().Poll(), 0);
  EXPECT_EQ(async_.inflight("s"), 1u) << "the slow one (its wait passed) stays in flight";
  EXPECT_EQ(async_.stuck("s"), 1u) << "the one still waiting on the client counts as stuck";
  EXPECT_EQ(backend_.queue().Poll(), 0);
  EXPECT_EQ(async_.stuck("s"), 1u) << "moved once";
  // Its event completes at last: it completes from the stuck count.
  device_.ClientEventDone(Handle('p'));
  device_.Progress(stuck);
  device_.Progress(slow);
  EXPECT_EQ(backend_.queue().Poll(), 2);
  EXPECT_THAT(FloatsAt(out, 8), ElementsAreArray(kChainGathered));
  EXPECT_EQ(async_.stuck(), 0u);
  EXPECT_EQ(async_.inflight(), 0u);
  EXPECT_EQ(pools_.InUse(), 0u);
  EXPECT_EQ(device_.live_events(), 2u)
      << "the client's events cached (2 per session here); every private one went";
}

// The caps count per peer too (RunOptions::peer, the caller's principal):
// one peer cannot take the server's admission by opening more sessions
// (AsyncRequests; here 2 per session, 2 per peer, 4 in all).
TEST_F(ChainTest, TheCapsCountPerPeerAcrossItsSessions) {
  core::AsyncRequests async(core::AsyncLimits{2, 4, 4, 64, /*per_peer=*/2, /*stuck_per_peer=*/16});
  for (const char* s : {"a1", "a2", "a3", "b1"}) {
    AddBuffer("acts", kChainActs, s);
    AddBuffer("idx", kChainIdx, s);
    AddBuffer("out", std::vector<float>(8, 0.f), s);
  }
  auto run = [&](const std::string& session, const std::string& peer) {
    events_ = core::IpcEvents{"", Handle('r')};
    core::RunOptions options;
    options.events = &events_;
    options.async = &async;
    options.peer = peer;
    return executor_.RunAll(session, {Gather("acts", "idx", "out")}, options).status();
  };
  EXPECT_OK(run("a1", "uid:1"));
  EXPECT_OK(run("a2", "uid:1"));
  EXPECT_THAT(run("a3", "uid:1"),
              StatusIs(StatusCode::kResourceExhausted, "for peer uid:1 (all its sessions)"));
  EXPECT_EQ(async.peer_inflight("uid:1"), 2u);
  EXPECT_OK(run("b1", "uid:2")) << "another peer is served";
  backend_.queue().Shutdown();  // completes them (drains their streams)
  EXPECT_EQ(async.inflight(), 0u);
  EXPECT_EQ(async.peer_inflight("uid:1"), 0u);
}

// A device merely marked out of service (MarkOutOfService: another item's
// queries kept failing, no sticky error) may still run an item's work: a
// failed query then abandons the item (ticket completed, everything its
// work may use leaked, the FreeGate kept closed), never completes it
// (blocks back to the pools, the stream to the idle list, the gate left).
TEST_F(ChainTest, AnItemOnADeviceMarkedOutOfServiceIsAbandonedNotReleased) {
  AddGatherBuffers();
  device_.pending_handles.insert(Handle('p'));
  ASSERT_OK(Execute({Gather("acts", "idx", "out")}, Handle('p'), Handle('r')));
  const size_t in_use = pools_.InUse();
  EXPECT_FALSE(pools_.gate.open());
  device_.MarkOutOfService("another item's queries kept failing");
  device_.fail_event_query = true;
  device_.fail_stream_query = true;
  EXPECT_EQ(backend_.queue().Poll(), 1) << "given up at once";
  EXPECT_EQ(backend_.queue().abandoned(), 1u);
  EXPECT_EQ(pools_.InUse(), in_use) << "returned to a pool while its kernels may still run";
  EXPECT_EQ(device_.free_streams(), 0u) << "the stream went back to the idle list";
  EXPECT_FALSE(pools_.gate.open()) << "the gate was left: a free may synchronize behind it";
  EXPECT_EQ(async_.inflight(), 0u) << "the ticket completed";
  EXPECT_EQ(async_.TakeDeferred("s").code(), StatusCode::kInternal);
  // After a sticky error the context runs nothing more: completed, released.
  device_.usable = true;
  device_.ClientEventDone(Handle('p'));
  ASSERT_OK(Execute({Gather("acts", "idx", "out")}, "", Handle('r')));
  device_.FailContext();
  EXPECT_EQ(backend_.queue().Poll(), 1);
  EXPECT_EQ(backend_.queue().abandoned(), 1u) << "not abandoned";
  EXPECT_EQ(device_.free_streams(), 1u);
}

// IpcEventCache::Get after EndSession (a request that passed its session
// check as the client disconnected): the event is opened for that request
// alone; the session's entry is not recreated (nothing would remove it:
// up to 64 opened events leaked per race).
TEST_F(ChainTest, TheEventCacheDoesNotRecreateAnEndedSession) {
  backends::IpcEventCache& cache = backend_.events();
  ASSERT_OK(cache.Get("s", Handle('a'), "wait_event"));
  cache.EndSession("s");
  EXPECT_EQ(device_.live_events(), 0u);
  {
    absl::StatusOr<std::shared_ptr<backends::IpcEvent>> late =
        cache.Get("s", Handle('b'), "wait_event");
    ASSERT_OK(late);
    EXPECT_EQ(cache.cached("s"), 0u) << "the ended session's entry was recreated";
    EXPECT_EQ(device_.live_events(), 1u) << "the request's own event";
  }
  EXPECT_EQ(device_.live_events(), 0u) << "destroyed with the request's reference";
  ASSERT_OK(cache.Get("t", Handle('a'), "wait_event"));
  EXPECT_EQ(cache.cached("t"), 1u) << "a session that did not end caches as before";
}

}  // namespace
}  // namespace tokensel::testing
