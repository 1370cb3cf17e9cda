// Execute with CUDA IPC events, without a device: the error paths, session
// end and the per-session event cache (fixture: stream_chain_test.h).
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "tests/server/backends/stream_chain_test.h"

namespace tokensel::testing {
namespace {

using ::absl::StatusCode;
using ::testing::HasSubstr;

TEST_F(ChainTest, AHandleTheDriverRefusesIsInvalidArgumentAndNothingIsHeld) {
  AddBuffer("acts", kChainActs);
  AddBuffer("idx", kChainIdx);
  AddBuffer("out", std::vector<float>(8, 0.f));
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
  AddBuffer("acts", kChainActs);
  AddBuffer("idx", kChainIdx);
  float* out = AddBuffer("out", std::vector<float>(8, 0.f));
  absl::StatusOr<std::vector<core::OpResult>> r = Execute(
      {Gather("acts", "idx", "out"), Gather("acts", "missing", "out")}, Handle('w'), Handle('r'));
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr("ops[1] (GatherTokens): "));
  const StreamDevice::Stream s = LastStream();
  EXPECT_THAT(device_.log, ::testing::ElementsAre(Call{"wait", s}, Call{"kernel", s},
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

TEST_F(ChainTest, WithoutACompletionEventTheRequestWaitsAndStillCompletes) {
  AddBuffer("acts", kChainActs);
  AddBuffer("idx", kChainIdx);
  float* out = AddBuffer("out", std::vector<float>(8, 0.f));
  device_.fail_create_event = true;
  EXPECT_THAT(Execute({Gather("acts", "idx", "out")}, "", Handle('r')).status(),
              StatusIs(StatusCode::kInternal));
  EXPECT_EQ(device_.log.back().what, "sync") << "drained, then the op's Finish";
  EXPECT_EQ(out[0], 4.f);
  EXPECT_EQ(async_.inflight(), 0u);
  EXPECT_EQ(pools_.InUse(), 0u);
}

TEST_F(ChainTest, AFailedCompletionQueryDrainsAndIsTheDeferredError) {
  AddBuffer("acts", kChainActs);
  AddBuffer("idx", kChainIdx);
  AddBuffer("out", std::vector<float>(8, 0.f));
  ASSERT_OK(Execute({Gather("acts", "idx", "out")}, "", Handle('r')));
  device_.fail_event_query = true;
  EXPECT_EQ(backend_.queue().Poll(), 1);
  EXPECT_EQ(device_.log.back().what, "drain");
  const absl::Status deferred = async_.TakeDeferred("s");
  EXPECT_EQ(deferred.code(), StatusCode::kInternal);
  EXPECT_THAT(deferred.message(), HasSubstr("the request's device work failed"));
  EXPECT_EQ(pools_.InUse(), 0u);
}

TEST_F(ChainTest, ASessionEndingInFlightKeepsItsMemoryUntilTheWorkCompletes) {
  AddBuffer("acts", kChainActs);
  AddBuffer("idx", kChainIdx);
  float* out = AddBuffer("out", std::vector<float>(8, 0.f));
  ASSERT_OK(Execute({Gather("acts", "idx", "out")}, Handle('w'), Handle('r')));
  // What the server's session end does (server/app/server.cc).
  registry_.UnregisterAll("s");
  async_.EndSession("s");
  backend_.EndSession("s");
  EXPECT_EQ(device_mapper_.live_mappings(), 3);
  EXPECT_EQ(backend_.events().cached("s"), 0u);
  device_.Progress(LastStream());
  EXPECT_EQ(backend_.queue().Poll(), 1);
  EXPECT_EQ(out[0], 4.f) << "read before the mapping went";
  EXPECT_EQ(device_mapper_.live_mappings(), 0);
  EXPECT_EQ(device_.live_events(), 0u);
  EXPECT_EQ(async_.inflight(), 0u);
}

TEST_F(ChainTest, AChainThatIsNotCommittedDrainsAndReturnsEverything) {
  absl::StatusOr<std::unique_ptr<core::RequestChain>> chain =
      backend_.BeginChain("s", core::IpcEvents{Handle('w'), Handle('r')}, /*async=*/true);
  ASSERT_OK(chain);
  absl::StatusOr<std::unique_ptr<core::RequestLease>> lease = (*chain)->BeginOp("ops[0] (X)");
  ASSERT_OK(lease);
  const std::vector<float> data(4, 1.f);
  ASSERT_OK((*lease)->StageInput(data.data(), 16, false));
  lease->reset();
  EXPECT_EQ(pools_.InUse(), 2u) << "handed to the chain, not drained";
  chain->reset();
  const StreamDevice::Stream s = device_.log.front().stream;
  EXPECT_THAT(device_.log,
              ::testing::ElementsAre(Call{"wait", s}, Call{"h2d", s}, Call{"drain", s}));
  EXPECT_EQ(pools_.InUse(), 0u);
  EXPECT_EQ(device_.free_streams(), 1u);
}

TEST_F(ChainTest, TheEventCacheIsBoundedPerSessionAndSharesAHandle) {
  backends::IpcEventCache& cache = backend_.events();  // 2 per session
  ASSERT_OK(cache.Get("s", Handle('a'), "wait_event"));
  ASSERT_OK(cache.Get("s", Handle('b'), "wait_event"));
  ASSERT_OK(cache.Get("s", Handle('a'), "wait_event"));  // a is now the most recent
  EXPECT_EQ(device_.ipc_opens, 2);
  absl::StatusOr<std::shared_ptr<backends::IpcEvent>> b = cache.Get("t", Handle('b'), "x");
  ASSERT_OK(b);
  EXPECT_EQ(device_.ipc_opens, 2) << "the same handle in another session is opened once";
  ASSERT_OK(cache.Get("s", Handle('c'), "wait_event"));  // drops b, the least recent
  EXPECT_EQ(cache.cached("s"), 2u);
  EXPECT_EQ(device_.events_destroyed, 0) << "b is still held by session t";
  b->reset();
  cache.EndSession("t");
  EXPECT_EQ(device_.events_destroyed, 1);
  ASSERT_OK(cache.Get("s", Handle('a'), "wait_event"));
  EXPECT_EQ(device_.ipc_opens, 3) << "a was kept";
  cache.EndSession("s");
  EXPECT_EQ(device_.live_events(), 0u);
  EXPECT_EQ(cache.cached("s"), 0u);
  EXPECT_THAT(cache.Get("s", Handle('\xFF'), "record_event").status(),
              StatusIs(StatusCode::kInvalidArgument));
}

TEST(AsyncRequestsTest, CapsDeferredErrorsAndWaiting) {
  core::AsyncRequests async(core::AsyncLimits{2, 3});
  absl::StatusOr<core::AsyncRequests::Ticket> a = async.Admit("s");
  absl::StatusOr<core::AsyncRequests::Ticket> b = async.Admit("s");
  ASSERT_OK(a);
  ASSERT_OK(b);
  EXPECT_EQ(b->number(), 2u);
  EXPECT_THAT(async.Admit("s").status(), StatusIs(StatusCode::kResourceExhausted));
  a->Complete(absl::InvalidArgumentError("ops[1] (SortTokens): bad ids"));
  b->Complete(absl::InternalError("later"));
  const absl::Status first = async.TakeDeferred("s");
  EXPECT_EQ(first.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(first.message(),
            "deferred from async Execute #1 of this session: ops[1] (SortTokens): bad ids");
  EXPECT_OK(async.TakeDeferred("s"));
  EXPECT_EQ(async.dropped_errors(), 1u);
  // WaitSession returns once the session is idle, or with the check's error.
  absl::StatusOr<core::AsyncRequests::Ticket> c = async.Admit("s");
  ASSERT_OK(c);
  EXPECT_THAT(async.WaitSession("s", [] { return absl::DeadlineExceededError("late"); }),
              StatusIs(StatusCode::kDeadlineExceeded));
  *c = core::AsyncRequests::Ticket();  // completes (no error) as it goes
  EXPECT_OK(async.WaitSession("s", nullptr));
  // A session that ended forgets its error.
  absl::StatusOr<core::AsyncRequests::Ticket> d = async.Admit("s");
  ASSERT_OK(d);
  async.EndSession("s");
  d->Complete(absl::InternalError("too late"));
  EXPECT_OK(async.TakeDeferred("s"));
  EXPECT_TRUE(async.WaitAll(absl::ZeroDuration()));
}

}  // namespace
}  // namespace tokensel::testing
