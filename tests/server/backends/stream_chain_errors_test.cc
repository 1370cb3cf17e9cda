// Execute with CUDA IPC events, without a device: the error paths, session
// end and the per-session event cache (fixture: stream_chain_test.h).
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "tests/server/backends/stream_chain_test.h"

namespace tokensel::testing {
namespace {

using ::absl::StatusCode;
using ::testing::HasSubstr;

TEST_F(ChainTest, AHandleTheDriverRefusesIsInvalidArgumentAndNothingIsHeld) {
  AddGatherBuffers();
  absl::StatusOr<std::vector<core::OpResult>> r =
      Execute({Gather("acts", "idx", "out")}, Handle('w'), Handle('\xFF'));
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("record_event"));
  EXPECT_OK(device_.CheckUsable()) << "a client's bad handle does not fail the device";
  EXPECT_EQ(device_.streams_created, 0);
  EXPECT_EQ(async_.inflight(), 0u);
  EXPECT_OK(async_.TakeDeferred("s"));
  // A handle of the wrong size never reaches the driver.
  r = Execute({Gather("acts", "idx", "out")}, std::string(63, 'w'), "");
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("wait_event is 63 bytes"));
  // The server goes on.
  EXPECT_OK(Execute({Gather("acts", "idx", "out")}, Handle('w'), ""));
}

TEST_F(ChainTest, AHostErrorInALaterOpIsReturnedAndTheLaunchedOpsStillComplete) {
  float* out = AddGatherBuffers();
  absl::StatusOr<std::vector<core::OpResult>> r = Execute(
      {Gather("acts", "idx", "out"), Gather("acts", "missing", "out")}, Handle('w'), Handle('r'));
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr("ops[1] (GatherTokens): "));
  const StreamDevice::Stream s = LastStream();
  EXPECT_THAT(device_.log,
              ::testing::ElementsAre(Call{"wait", s}, Call{"waited", s}, Call{"kernel", s},
                                     Call{"record", s}, Call{"complete", s}))
      << "the event is recorded after what did run; the reply did not wait";
  EXPECT_EQ(backend_.queue().pending(), 1u);
  device_.Progress(s);
  EXPECT_EQ(backend_.queue().Poll(), 1);
  EXPECT_EQ(out[0], 4.f) << "ops[0] ran";
  EXPECT_OK(async_.TakeDeferred("s")) << "the request answered its error already";
  EXPECT_EQ(pools_.InUse(), 0u);
  EXPECT_EQ(budget_.used_bytes(), 0u);
}

TEST_F(ChainTest, WithoutACompletionEventTheRequestFailsBeforeAnythingRuns) {
  float* out = AddGatherBuffers();
  device_.fail_create_event = true;
  EXPECT_THAT(Execute({Gather("acts", "idx", "out")}, Handle('w'), Handle('r')).status(),
              StatusIs(StatusCode::kInternal));
  EXPECT_TRUE(device_.log.empty()) << "the event is made before the stream waits";
  EXPECT_EQ(out[0], 0.f);
  EXPECT_EQ(async_.inflight(), 0u);
  EXPECT_EQ(pools_.InUse(), 0u);
  EXPECT_EQ(device_.free_streams(), 0u);
}

// The completion event cannot be recorded while the stream still waits on
// a client event that has not completed: no host synchronization (it would
// block for ever); the queue watches the stream itself.
TEST_F(ChainTest, ACompletionEventThatCannotBeRecordedIsReplacedByQueryingTheStream) {
  float* out = AddGatherBuffers();
  device_.pending_handles.insert(Handle('p'));
  device_.fail_record_private = true;
  EXPECT_THAT(Execute({Gather("acts", "idx", "out")}, Handle('p'), Handle('r')).status(),
              StatusIs(StatusCode::kInternal, "injected private record failure"));
  const StreamDevice::Stream s = LastStream();
  EXPECT_THAT(device_.log, ::testing::ElementsAre(Call{"wait", s}, Call{"waited", s},
                                                  Call{"kernel", s}, Call{"record", s}));
  EXPECT_EQ(backend_.queue().Poll(), 0);
  EXPECT_GT(device_.stream_queries, 0);
  EXPECT_EQ(pools_.InUse(), 1u) << "the workspace is held while the kernel may run";
  device_.ClientEventDone(Handle('p'));
  device_.Progress(s);
  EXPECT_EQ(backend_.queue().Poll(), 1);
  EXPECT_EQ(out[0], 4.f);
  EXPECT_OK(async_.TakeDeferred("s")) << "answered by the request, not deferred again";
  EXPECT_EQ(pools_.InUse(), 0u);
  EXPECT_EQ(async_.inflight(), 0u);
}

TEST_F(ChainTest, AFailedCompletionQueryWatchesTheStreamAndIsTheDeferredError) {
  AddGatherBuffers();
  ASSERT_OK(Execute({Gather("acts", "idx", "out")}, "", Handle('r')));
  device_.fail_event_query = true;
  EXPECT_EQ(backend_.queue().Poll(), 0) << "the stream still has work: not drained";
  EXPECT_NE(device_.log.back().what, "drain");
  device_.Progress(LastStream());
  EXPECT_EQ(backend_.queue().Poll(), 1);
  const absl::Status deferred = async_.TakeDeferred("s");
  EXPECT_EQ(deferred.code(), StatusCode::kInternal);
  EXPECT_THAT(deferred.message(), HasSubstr("the request's device work failed"));
  EXPECT_EQ(pools_.InUse(), 0u);
}

// An exception while completing an item (here std::bad_alloc returning its
// stream) must not escape the completion thread (it would end the
// process), and the request's ticket must still complete.
TEST_F(ChainTest, AnExceptionCompletingAnItemStillCompletesItsTicket) {
  AddGatherBuffers();
  ASSERT_OK(Execute({Gather("acts", "idx", "out")}, "", Handle('r')));
  device_.Progress(LastStream());
  device_.throw_in_release_stream = true;
  EXPECT_EQ(backend_.queue().Poll(), 1);
  device_.throw_in_release_stream = false;
  EXPECT_EQ(async_.inflight(), 0u) << "the ticket completed";
  EXPECT_THAT(async_.TakeDeferred("s"),
              StatusIs(StatusCode::kInternal, "an exception completing the request's device work"));
  EXPECT_EQ(pools_.InUse(), 0u);
  EXPECT_EQ(budget_.used_bytes(), 0u) << "the holds were dropped";
}

TEST_F(ChainTest, AFailedStreamQueryCompletesOnlyOnceTheContextFailed) {
  AddGatherBuffers();
  ASSERT_OK(Execute({Gather("acts", "idx", "out")}, "", Handle('r')));
  device_.fail_event_query = true;
  device_.fail_stream_query = true;
  EXPECT_EQ(backend_.queue().Poll(), 0) << "the device works: asked again later";
  device_.FailContext();  // a sticky error: the context runs nothing more
  EXPECT_EQ(backend_.queue().Poll(), 1);
  EXPECT_EQ(async_.TakeDeferred("s").code(), StatusCode::kInternal);
  EXPECT_EQ(pools_.InUse(), 0u);
}

// A query that keeps failing while the device claims to be usable is not
// asked for ever (the item and its ticket would stay pending for good):
// after kMinFailedQueries failures in a row spanning the limit (0 here),
// the device is marked out of service and the item abandoned: its ticket
// completes with the query's error, nothing goes back to a pool (its work
// may still run).
TEST_F(ChainTest, AStreamQueryThatKeepsFailingMarksTheDeviceFailedAndEndsTheItem) {
  AddGatherBuffers();
  ASSERT_OK(Execute({Gather("acts", "idx", "out")}, "", Handle('r')));
  const size_t in_use = pools_.InUse();
  backend_.queue().set_failed_query_limit(std::chrono::milliseconds(0));
  device_.fail_event_query = true;
  device_.fail_stream_query = true;
  for (int i = 1; i < backends::CompletionQueue::kMinFailedQueries; ++i) {
    EXPECT_EQ(backend_.queue().Poll(), 0) << "failure " << i << ": asked again";
    EXPECT_TRUE(device_.usable);
  }
  EXPECT_EQ(backend_.queue().Poll(), 1) << "given up";
  EXPECT_FALSE(device_.usable) << "marked out of service";
  EXPECT_THAT(device_.out_of_service_why, ::testing::HasSubstr("without a sticky error"));
  EXPECT_EQ(backend_.queue().pending(), 0u);
  EXPECT_EQ(backend_.queue().abandoned(), 1u);
  EXPECT_EQ(async_.inflight(), 0u) << "the ticket completed";
  EXPECT_EQ(async_.TakeDeferred("s").code(), StatusCode::kInternal);
  EXPECT_EQ(pools_.InUse(), in_use) << "leaked, not returned: the stream's work may still run";
}

TEST_F(ChainTest, ASessionEndingInFlightKeepsItsMemoryUntilTheWorkCompletes) {
  float* out = AddGatherBuffers();
  ASSERT_OK(Execute({Gather("acts", "idx", "out")}, Handle('w'), Handle('r')));
  // What the server's session end does (server/app/server.cc).
  registry_.UnregisterAll("s");
  async_.EndSession("s");
  backend_.EndSession("s");
  EXPECT_EQ(device_mapper_.live_mappings(), 3);
  EXPECT_EQ(backend_.events().cached("s"), 0u);
  EXPECT_EQ(device_.live_events(), 4u)
      << "the client's two events (and the private ones: completion, marker) outlive the "
         "session while queued work waits on and records them";
  device_.Progress(LastStream());
  EXPECT_EQ(backend_.queue().Poll(), 1);
  EXPECT_EQ(out[0], 4.f) << "read before the mapping went";
  EXPECT_EQ(device_mapper_.live_mappings(), 0);
  EXPECT_EQ(device_.live_events(), 0u);
  EXPECT_EQ(async_.inflight(), 0u);
}

TEST_F(ChainTest, AChainThatIsNotCommittedNeverSynchronizesAStreamThatWaitsOnTheClient) {
  device_.pending_handles.insert(Handle('p'));
  for (const bool async : {true, false}) {
    SCOPED_TRACE(async ? "async" : "sync");
    absl::StatusOr<std::unique_ptr<core::RequestChain>> chain =
        backend_.BeginChain("s", core::IpcEvents{Handle('p'), Handle('r')}, async);
    ASSERT_OK(chain);
    if (async) {
      absl::StatusOr<std::unique_ptr<core::RequestLease>> lease = (*chain)->BeginOp("ops[0] (X)");
      ASSERT_OK(lease);
      const std::vector<float> data(4, 1.f);
      ASSERT_OK((*lease)->StageInput(data.data(), 16, false));
      lease->reset();
      EXPECT_EQ(pools_.InUse(), 2u) << "handed to the chain, not drained";
    }
    chain->reset();  // e.g. std::bad_alloc between BeginChain and Commit
    for (const Call& c : device_.log) EXPECT_NE(c.what, "drain");
    EXPECT_EQ(backend_.queue().pending(), async ? 1u : 2u) << "handed to the completion queue";
    EXPECT_EQ(backend_.queue().Poll(), 0);
  }
  device_.ClientEventDone(Handle('p'));
  for (const Call& c : device_.log) device_.Progress(c.stream);
  EXPECT_EQ(backend_.queue().Poll(), 2);
  EXPECT_EQ(pools_.InUse(), 0u);
  EXPECT_EQ(device_.free_streams(), 2u);
  // Without a client wait, a chain that is not committed drains at once.
  absl::StatusOr<std::unique_ptr<core::RequestChain>> chain =
      backend_.BeginChain("s", core::IpcEvents{"", Handle('r')}, /*async=*/true);
  ASSERT_OK(chain);
  chain->reset();
  EXPECT_EQ(device_.log.back().what, "drain");
  EXPECT_EQ(backend_.queue().pending(), 0u);
}

// An exception after an async op was launched (here from inside the launch,
// after its kernel was queued), with its buffers unregistered meanwhile:
// the request's buffer leases must outlive the device work the chain's
// destructor still waits for, or the kernel uses unmapped memory.
TEST_F(ChainTest, AnExceptionKeepsTheBuffersMappedUntilTheLaunchedWorkIsDone) {
  AddGatherBuffers();
  device_.on_launch = [this] {
    registry_.UnregisterAll("s");  // a concurrent UnregisterBuffer / session end
    throw std::bad_alloc();
  };
  int syncs = 0;
  device_.on_sync = [&] {
    ++syncs;
    EXPECT_EQ(device_mapper_.live_mappings(), 3) << "buffers unmapped under queued kernels";
  };
  EXPECT_THROW((void)Execute({Gather("acts", "idx", "out")}, "", Handle('r')), std::bad_alloc);
  EXPECT_EQ(syncs, 1);
  EXPECT_EQ(device_mapper_.live_mappings(), 0);
  EXPECT_EQ(pools_.InUse(), 0u);
  EXPECT_EQ(budget_.used_bytes(), 0u);
  EXPECT_EQ(async_.inflight(), 0u);
}

// A failed call on the client's event is the request's error; the device is
// marked failed only when a call on an object of the server's own confirms
// it (client_event_error.h): a client that destroyed its event controls
// the code.
TEST_F(ChainTest, AClientEventErrorFailsTheDeviceOnlyIfTheProbeConfirms) {
  AddGatherBuffers();
  struct Case {
    const char* call;
    int code;
    StatusCode want;
    const char* field;
    int probes;
  };
  for (const Case& c : {Case{"open", 2, StatusCode::kFailedPrecondition, "wait_event", 1},
                        Case{"open", 1, StatusCode::kInvalidArgument, "wait_event", 0},
                        Case{"wait", 2, StatusCode::kFailedPrecondition, "wait_event", 1},
                        Case{"wait", 1, StatusCode::kInvalidArgument, "wait_event", 0},
                        Case{"record", 2, StatusCode::kFailedPrecondition, "record_event", 1},
                        // The client's code as is (not rewrapped: the fourth review's 11).
                        Case{"record", 1, StatusCode::kInvalidArgument, "record_event", 0}}) {
    SCOPED_TRACE(absl::StrCat(c.call, " code ", c.code));
    backend_.EndSession("s");  // not cached: opened again
    device_.probes = 0;
    device_.fail_client_call = c.call;
    device_.client_event_error = c.code;
    absl::StatusOr<std::vector<core::OpResult>> r =
        Execute({Gather("acts", "idx", "out")}, Handle('w'), Handle('r'));
    EXPECT_THAT(r.status(), StatusIs(c.want, c.field));
    EXPECT_EQ(device_.probes, c.probes);
    EXPECT_OK(device_.CheckUsable()) << "the client's error does not fail the device";
    for (const Call& call : device_.log) device_.Progress(call.stream);
    (void)backend_.queue().Poll();
    (void)async_.TakeDeferred("s");
  }
  EXPECT_EQ(pools_.InUse(), 0u);
  EXPECT_EQ(async_.inflight(), 0u);
  // The probe finds the device dead: then it is out of service.
  backend_.EndSession("s");
  device_.fail_client_call = "wait";
  device_.client_event_error = 2;
  device_.probe_fails = true;
  EXPECT_THAT(Execute({Gather("acts", "idx", "out")}, Handle('w'), "").status(),
              StatusIs(StatusCode::kUnavailable));
  EXPECT_FALSE(device_.CheckUsable().ok());
}

// A record_event the driver will not record (an event of another device,
// if the driver refuses those at all, or a destroyed one) is NOT detected
// before the ops run (the fourth review dropped the check in Begin:
// stream_chain.h): it fails at Commit, after the ops were launched, with
// the client event's classified error as is (the client's code:
// INVALID_ARGUMENT naming record_event, no probe, not rewrapped); the work
// still completes, no deferred error is kept, the device stays usable.
TEST_F(ChainTest, ARecordEventTheDriverRefusesFailsAtCommitAfterTheOps) {
  float* out = AddGatherBuffers();
  for (const bool async : {true, false}) {
    SCOPED_TRACE(async ? "async" : "sync (inline output)");
    device_.log.clear();
    device_.fail_client_call = "record";
    device_.client_event_error = 1;
    absl::StatusOr<std::vector<core::OpResult>> r =
        Execute({Gather("acts", "idx", async ? "out" : "")}, Handle('w'), Handle('r'));
    EXPECT_THAT(r.status(), StatusIs(StatusCode::kInvalidArgument, "record_event"));
    EXPECT_THAT(r.status().message(), HasSubstr("cudaEventRecord refused the client's event"));
    bool launched = false;
    for (const Call& call : device_.log) launched = launched || call.what == "kernel";
    EXPECT_TRUE(launched) << "the ops ran before the record was refused";
    EXPECT_OK(device_.CheckUsable());
    EXPECT_EQ(device_.probes, 0) << "the client's code: no probe";
    for (const Call& call : device_.log) device_.Progress(call.stream);
    (void)backend_.queue().Poll();
    EXPECT_OK(async_.TakeDeferred("s")) << "answered already, not deferred";
    EXPECT_EQ(async_.inflight(), 0u);
    EXPECT_EQ(async_.stuck(), 0u);
    EXPECT_EQ(pools_.InUse(), 0u);
  }
  EXPECT_EQ(out[0], 4.f) << "the async op wrote its output";
}

// On a server of several devices, an evented Execute must name a buffer
// (on the event's device): else it would run on any device, which opens
// and records events of another one.
TEST_F(ChainTest, SeveralDevicesRefuseAnEventedExecuteThatNamesNoBuffer) {
  backend_.set_two_devices(true);
  core::SortTokensRequest sort;
  sort.ids.source = core::TensorSpec::Source::kInline;
  sort.ids.dtype = kernels::DType::kInt32;
  sort.ids.shape = {1, 2};
  const std::vector<int32_t> ids = {1, 0};
  sort.ids.inline_data = absl::string_view(reinterpret_cast<const char*>(ids.data()), 8);
  EXPECT_THAT(
      Execute({sort}, Handle('w'), Handle('r')).status(),
      StatusIs(StatusCode::kFailedPrecondition, "must name a buffer on the event's device"));
  EXPECT_THAT(Execute({}, "", Handle('r')).status(), StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_TRUE(device_.log.empty()) << "refused before anything ran";
  EXPECT_EQ(device_.ipc_opens, 0);
  EXPECT_EQ(async_.inflight(), 0u);
  // With a buffer it runs; on one device, without one too.
  AddGatherBuffers();
  EXPECT_OK(Execute({Gather("acts", "idx", "out")}, Handle('w'), ""));
  backend_.set_two_devices(false);
  EXPECT_OK(Execute({}, Handle('w'), ""));
}

TEST_F(ChainTest, TheEventCacheIsBoundedPerSessionAndKeyedBySession) {
  backends::IpcEventCache& cache = backend_.events();  // 2 per session
  absl::StatusOr<std::shared_ptr<backends::IpcEvent>> sa =
      cache.Get("s", Handle('a'), "wait_event");
  ASSERT_OK(sa);
  ASSERT_OK(cache.Get("s", Handle('b'), "wait_event"));
  ASSERT_OK(cache.Get("s", Handle('a'), "wait_event"));  // a is now the most recent
  EXPECT_EQ(device_.ipc_opens, 2);
  // Another session naming the same bytes gets its own event: it can never
  // use, observe or destroy the one session s opened.
  absl::StatusOr<std::shared_ptr<backends::IpcEvent>> b = cache.Get("t", Handle('b'), "x");
  ASSERT_OK(b);
  EXPECT_EQ(device_.ipc_opens, 3) << "opened again for session t";
  absl::StatusOr<std::shared_ptr<backends::IpcEvent>> ta = cache.Get("t", Handle('a'), "x");
  ASSERT_OK(ta);
  EXPECT_NE((*ta)->get(), (*sa)->get()) << "session t was handed session s's event";
  ASSERT_OK(cache.Get("s", Handle('c'), "wait_event"));  // drops s's b, the least recent
  EXPECT_EQ(cache.cached("s"), 2u);
  EXPECT_EQ(device_.events_destroyed, 1) << "s's b went; t's b is its own";
  sa->reset();
  ta->reset();
  cache.EndSession("t");  // t's events go; none of s's
  EXPECT_EQ(device_.events_destroyed, 2) << "t's a went; t's b is still held here";
  b->reset();
  EXPECT_EQ(device_.events_destroyed, 3);
  EXPECT_EQ(cache.cached("s"), 2u);
  ASSERT_OK(cache.Get("s", Handle('a'), "wait_event"));
  EXPECT_EQ(device_.ipc_opens, 5) << "s's a was kept by s";
  cache.EndSession("s");
  EXPECT_EQ(device_.live_events(), 0u);
  EXPECT_EQ(cache.cached("s"), 0u);
  EXPECT_THAT(cache.Get("s", Handle('\xFF'), "record_event").status(),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_EQ(cache.cached("s"), 0u) << "a failed open adds nothing";
}

}  // namespace
}  // namespace tokensel::testing
