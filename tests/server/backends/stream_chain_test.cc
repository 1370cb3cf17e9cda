// Execute with CUDA IPC events, without a device (issue 12 item 8): the
// executor's RunChain over StreamChain / StreamLease / CompletionQueue on
// FakeStreamDevice (stream_chain_test.h). The fake runs queued work only at
// a host synchronization (logged "sync" / "drain") or when the test lets the
// device progress (nothing logged): so an async reply that waited, a record
// issued before an op, a block or buffer released before the device work
// completed, all show here as a wrong log, stale memory or a wrong count.
#include "tests/server/backends/stream_chain_test.h"

#include <chrono>
#include <cstring>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"

namespace tokensel::testing {
namespace {

using ::absl::StatusCode;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

std::vector<float> Floats(const float* p, size_t n) { return std::vector<float>(p, p + n); }

TEST_F(ChainTest, AnAsyncExecuteRepliesBeforeTheWorkAndHoldsEverythingUntilItCompletes) {
  float* out = AddGatherBuffers();
  absl::StatusOr<std::vector<core::OpResult>> r =
      Execute({Gather("acts", "idx", "out")}, Handle('w'), Handle('r'));
  ASSERT_OK(r);
  ASSERT_EQ(r->size(), 1u);
  EXPECT_TRUE((*r)[0].outputs.empty());
  const StreamDevice::Stream s = LastStream();
  // Replied with the work still queued: no host synchronization, the wait
  // and its marker, the client event recorded after the op (only there),
  // then the private completion event.
  EXPECT_THAT(device_.log, ElementsAre(Call{"wait", s}, Call{"waited", s}, Call{"kernel", s},
                                       Call{"record", s}, Call{"complete", s}));
  EXPECT_THAT(Floats(out, 8), ElementsAreArray(std::vector<float>(8, 0.f))) << "not run yet";
  // Held: the workspace, the scratch reservation, the stream, the buffers
  // (unregistering them now only drops the names), the async slot.
  EXPECT_EQ(pools_.InUse(), 1u);
  EXPECT_GT(budget_.used_bytes(), 0u);
  EXPECT_EQ(device_.free_streams(), 0u);
  ASSERT_OK(registry_.Unregister("s", "acts"));
  ASSERT_OK(registry_.Unregister("s", "out"));
  EXPECT_EQ(device_mapper_.live_mappings(), 3) << "the in-flight request leases its buffers";
  EXPECT_EQ(async_.inflight("s"), 1u);
  EXPECT_EQ(backend_.queue().Poll(), 0) << "the device has not got there";
  EXPECT_EQ(pools_.InUse(), 1u);

  device_.Progress(s);
  EXPECT_EQ(backend_.queue().Poll(), 1);
  EXPECT_THAT(Floats(out, 8), ElementsAreArray(kChainGathered));
  EXPECT_EQ(pools_.InUse(), 0u);
  EXPECT_EQ(budget_.used_bytes(), 0u);
  EXPECT_EQ(device_.free_streams(), 1u);
  EXPECT_EQ(device_mapper_.live_mappings(), 1) << "only idx is still registered";
  EXPECT_EQ(async_.inflight("s"), 0u);
  EXPECT_OK(async_.TakeDeferred("s"));
  EXPECT_EQ(device_.live_events(), 2u)
      << "the client's events stay cached; the private ones (completion, marker) went";
}

TEST_F(ChainTest, AllOpsRunOnOneStreamBetweenTheWaitAndTheRecord) {
  AddGatherBuffers();
  float* out2 = AddBuffer("out2", std::vector<float>(8, 0.f));
  // The second op reads an inline copy of the indices: staged after the
  // wait, on the same stream, its blocks held until completion.
  core::GatherTokensRequest second =
      std::get<core::GatherTokensRequest>(Gather("acts", "", "out2"));
  second.indices.source = core::TensorSpec::Source::kInline;
  second.indices.buffer.clear();
  second.indices.inline_data =
      absl::string_view(reinterpret_cast<const char*>(kChainIdx.data()), kChainIdx.size() * 4);
  ASSERT_OK(Execute({Gather("acts", "idx", "out"), second}, Handle('w'), Handle('r')));
  const StreamDevice::Stream s = LastStream();
  EXPECT_THAT(device_.log,
              ElementsAre(Call{"wait", s}, Call{"waited", s}, Call{"kernel", s}, Call{"h2d", s},
                          Call{"kernel", s}, Call{"record", s}, Call{"complete", s}));
  EXPECT_EQ(pools_.InUse(), 4u) << "two workspaces, a pinned and a device staging block";
  device_.Progress(s);
  EXPECT_EQ(backend_.queue().Poll(), 1);
  EXPECT_THAT(Floats(out2, 8), ElementsAreArray(kChainGathered));
  EXPECT_EQ(pools_.InUse(), 0u);
  EXPECT_EQ(budget_.used_bytes(), 0u);
}

TEST_F(ChainTest, ABadIndexOnTheDeviceIsTheSessionsDeferredError) {
  AddBuffer("acts", kChainActs);
  AddBuffer("bad", std::vector<int32_t>{2, 0, 7, 1});  // 7 >= S = 3
  AddBuffer("idx", kChainIdx);
  float* out = AddBuffer("out", std::vector<float>(8, -1.f));
  float* out2 = AddBuffer("out2", std::vector<float>(8, -1.f));
  // ops[0] fails on the device; ops[1] runs all the same (documented).
  ASSERT_OK(
      Execute({Gather("acts", "bad", "out"), Gather("acts", "idx", "out2")}, "", Handle('r')));
  EXPECT_OK(async_.TakeDeferred("s")) << "nothing is known before completion";
  device_.Progress(LastStream());
  EXPECT_EQ(backend_.queue().Poll(), 1);
  const absl::Status deferred = async_.TakeDeferred("s");
  EXPECT_EQ(deferred.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(deferred.message(),
              HasSubstr("deferred from async Execute #1 of this session: ops[0] (GatherTokens): "));
  EXPECT_THAT(Floats(out, 8), ElementsAreArray(std::vector<float>(8, -1.f)))
      << "the failed op wrote nothing";
  EXPECT_THAT(Floats(out2, 8), ElementsAreArray(kChainGathered)) << "the later op ran";
  EXPECT_OK(async_.TakeDeferred("s")) << "reported once";
  EXPECT_EQ(pools_.InUse(), 0u);
}

TEST_F(ChainTest, InlineOutputsMakeTheEventedExecuteSynchronous) {
  AddBuffer("acts", kChainActs);
  AddBuffer("idx", kChainIdx);
  absl::StatusOr<std::vector<core::OpResult>> r =
      Execute({Gather("acts", "idx", "")}, Handle('w'), Handle('r'));
  ASSERT_OK(r);
  ASSERT_EQ((*r)[0].outputs.size(), 1u);
  std::vector<float> got(8);
  std::memcpy(got.data(), (*r)[0].outputs[0].data.data(), 32);
  EXPECT_THAT(got, ElementsAreArray(kChainGathered));
  const StreamDevice::Stream s = LastStream();
  // The output is zeroed and copied back on the stream, the op synchronized
  // (the reply needs the bytes), and the client's event still recorded.
  EXPECT_THAT(device_.log,
              ElementsAre(Call{"wait", s}, Call{"waited", s}, Call{"zero", s}, Call{"kernel", s},
                          Call{"d2h", s}, Call{"sync", s}, Call{"record", s}, Call{"drain", s}));
  EXPECT_EQ(async_.inflight(), 0u);
  EXPECT_EQ(backend_.queue().pending(), 0u);
  EXPECT_EQ(pools_.InUse(), 0u);
}

TEST_F(ChainTest, WaitEventAloneWaitsThenRunsSynchronously) {
  float* out = AddGatherBuffers();
  ASSERT_OK(Execute({Gather("acts", "idx", "out")}, Handle('w'), ""));
  const StreamDevice::Stream s = LastStream();
  EXPECT_THAT(device_.log, ElementsAre(Call{"wait", s}, Call{"waited", s}, Call{"kernel", s},
                                       Call{"sync", s}, Call{"drain", s}));
  EXPECT_THAT(Floats(out, 8), ElementsAreArray(kChainGathered));
  EXPECT_EQ(async_.inflight(), 0u);
  EXPECT_EQ(device_.free_streams(), 1u);
}

TEST_F(ChainTest, ZeroOpsWaitAndRecordOnly) {
  ASSERT_OK(Execute({}, Handle('w'), Handle('r')));
  const StreamDevice::Stream s = LastStream();
  EXPECT_THAT(device_.log, ElementsAre(Call{"wait", s}, Call{"waited", s}, Call{"record", s},
                                       Call{"complete", s}));
  EXPECT_EQ(async_.inflight("s"), 1u);
  device_.Progress(s);
  EXPECT_EQ(backend_.queue().Poll(), 1);
  EXPECT_EQ(async_.inflight("s"), 0u);
}

TEST_F(ChainTest, TheAsyncCapsRefuseBeforeAnythingRuns) {
  AddGatherBuffers();
  ASSERT_OK(Execute({Gather("acts", "idx", "out")}, "", Handle('r')));
  ASSERT_OK(Execute({Gather("acts", "idx", "out")}, "", Handle('r')));
  const size_t calls = device_.log.size();
  absl::StatusOr<std::vector<core::OpResult>> third =
      Execute({Gather("acts", "idx", "out")}, "", Handle('r'));
  EXPECT_EQ(third.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(third.status().message(), HasSubstr("in this session"));
  EXPECT_EQ(device_.log.size(), calls) << "a refused request touches nothing";
  // Another session: one more fits the server's 3, the next does not.
  AddBuffer("acts", kChainActs, "t");
  AddBuffer("idx", kChainIdx, "t");
  AddBuffer("out", std::vector<float>(8, 0.f), "t");
  ASSERT_OK(Execute({Gather("acts", "idx", "out")}, "", Handle('r'), "t"));
  absl::StatusOr<std::vector<core::OpResult>> fourth =
      Execute({Gather("acts", "idx", "out")}, "", Handle('r'), "t");
  EXPECT_EQ(fourth.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(fourth.status().message(), HasSubstr("in the server"));
  EXPECT_EQ(async_.rejected(), 2u);
  // Neither answered early nor waiting on the client: not capped.
  ASSERT_OK(Execute({Gather("acts", "idx", "")}, "", Handle('r'), "t"));
  // A request that waits on a client event is capped too (its stream may
  // be left waiting).
  EXPECT_THAT(Execute({Gather("acts", "idx", "")}, Handle('w'), "", "t").status(),
              StatusIs(StatusCode::kResourceExhausted));
  backend_.queue().Shutdown();  // completes the three (drains their streams)
  EXPECT_EQ(async_.inflight(), 0u);
  EXPECT_EQ(pools_.InUse(), 0u);
}

// A stop token that has fired (the call's deadline passed).
class Expired final : public kernels::StopToken {
 public:
  absl::Status Check() const override { return absl::DeadlineExceededError("deadline passed"); }
};

TEST_F(ChainTest, ASyncRequestWaitsForTheClientOnlyUntilItsDeadline) {
  float* out = AddGatherBuffers();
  device_.pending_handles.insert(Handle('p'));
  const Expired expired;
  stop_ = &expired;
  const std::vector<core::OpRequest> ops = {Gather("acts", "idx", "out")};
  EXPECT_THAT(Execute(ops, Handle('p'), "").status(),
              StatusIs(StatusCode::kDeadlineExceeded, "wait_event: not completed by the client"));
  const StreamDevice::Stream s = LastStream();
  // Nothing ran, nothing synchronized on the host: the stream (still
  // waiting on the client's event) went to the completion queue.
  EXPECT_THAT(device_.log, ElementsAre(Call{"wait", s}, Call{"waited", s}, Call{"complete", s}));
  EXPECT_EQ(backend_.queue().Poll(), 0) << "the stream still waits on the client";
  EXPECT_EQ(backend_.queue().pending(), 1u);
  EXPECT_EQ(async_.inflight("s"), 0u) << "abandoned: not counted against the admission";
  EXPECT_EQ(async_.stuck("s"), 1u) << "counted as stuck while it waits";
  EXPECT_EQ(out[0], 0.f);
  // The same request without a deadline problem, once the client is done:
  // it runs (the host poll saw the event complete).
  device_.ClientEventDone(Handle('p'));
  stop_ = nullptr;
  ASSERT_OK(Execute(ops, Handle('p'), ""));
  EXPECT_THAT(Floats(out, 8), ElementsAreArray(kChainGathered));
  device_.Progress(s);
  EXPECT_EQ(backend_.queue().Poll(), 1);
  EXPECT_EQ(async_.inflight(), 0u);
  EXPECT_OK(async_.TakeDeferred("s")) << "the request answered its error itself";
  EXPECT_EQ(pools_.InUse(), 0u);
  EXPECT_EQ(device_.free_streams(), 2u);
}

// Sync requests abandoned at their deadline leave their streams waiting on
// the client's event, maybe for ever. They count as stuck, not in flight,
// under the wait caps (8 per session by default), and keep their admission
// (per session 2, server 3 here): in flight + stuck stays within the
// admission caps, so what stuck requests pin is no more than what
// admission lets requests in flight pin (the second read of the seventh
// review, finding 3: they left the admission caps, and one peer held its
// in-flight cap's worth stuck plus as many more in flight).
TEST_F(ChainTest, AbandonedSyncRequestsCountAsStuckAndKeepTheirAdmission) {
  AddGatherBuffers();
  AddBuffer("acts", kChainActs, "t");
  AddBuffer("idx", kChainIdx, "t");
  AddBuffer("out", std::vector<float>(8, 0.f), "t");
  device_.pending_handles.insert(Handle('p'));
  const Expired expired;
  const std::vector<core::OpRequest> ops = {Gather("acts", "idx", "out")};
  const uint32_t per_session = async_.limits().per_session;
  ASSERT_LT(per_session, async_.limits().stuck_per_session);  // the admission cap binds
  for (uint32_t i = 1; i <= per_session; ++i) {
    stop_ = &expired;
    EXPECT_THAT(Execute(ops, Handle('p'), "").status(), StatusIs(StatusCode::kDeadlineExceeded))
        << "abandoned request " << i;
    EXPECT_EQ(async_.inflight(), 0u) << "an abandoned request is stuck, not in flight";
    EXPECT_EQ(async_.stuck("s"), i);
  }
  stop_ = nullptr;
  // The session's admission is taken by its stuck requests, with or
  // without a wait_event.
  EXPECT_THAT(Execute(ops, Handle('p'), "").status(),
              StatusIs(StatusCode::kResourceExhausted, "2 stuck"));
  EXPECT_THAT(Execute(ops, "", Handle('r')).status(),
              StatusIs(StatusCode::kResourceExhausted, "in this session, the limit is 2"));
  // Another session gets what is left of the server's (3 - 2).
  device_.ClientEventDone(Handle('q'));
  ASSERT_OK(Execute(ops, Handle('q'), Handle('r'), "t"));
  EXPECT_THAT(Execute(ops, Handle('q'), Handle('r'), "t").status(),
              StatusIs(StatusCode::kResourceExhausted, "in the server, the limit is 3"));
  EXPECT_EQ(async_.inflight("t"), 1u);
  // The client's event completes at last: every stuck request completes.
  device_.ClientEventDone(Handle('p'));
  std::set<StreamDevice::Stream> streams;
  for (const auto& call : device_.log) streams.insert(call.stream);
  for (StreamDevice::Stream s : streams) device_.Progress(s);
  EXPECT_EQ(backend_.queue().Poll(), static_cast<int>(per_session) + 1);
  EXPECT_EQ(async_.stuck(), 0u);
  EXPECT_EQ(async_.inflight(), 0u);
  ASSERT_OK(Execute(ops, Handle('p'), "")) << "s is admitted again";
}

// While a stream waits on a client's event the pools free nothing: a
// cudaFree / cudaFreeHost would synchronize the device behind that event
// (block_pool.h, FreeGate). The gate reopens when the stream is released.
TEST_F(ChainTest, ThePoolsFreeNothingWhileAStreamWaitsOnAClientEvent) {
  AddGatherBuffers();
  device_.pending_handles.insert(Handle('p'));
  const Expired expired;
  stop_ = &expired;
  const std::vector<core::OpRequest> ops = {Gather("acts", "idx", "out")};
  EXPECT_THAT(Execute(ops, Handle('p'), "").status(), StatusIs(StatusCode::kDeadlineExceeded));
  EXPECT_FALSE(pools_.gate.open()) << "a stream still waits on the client";
  device_.ClientEventDone(Handle('p'));
  device_.Progress(LastStream());
  EXPECT_EQ(backend_.queue().Poll(), 1);
  EXPECT_TRUE(pools_.gate.open());
}

// The client records its wait event again (on an idle stream) while the
// server's stream still waits on the previous record: the client's event
// then reports done, but the stream would block a host synchronization for
// ever. The host must watch what the stream waits on (the marker).
class RerecordThenExpire final : public kernels::StopToken {
 public:
  RerecordThenExpire(FakeStreamDevice* device, std::string handle)
      : device_(device), handle_(std::move(handle)) {}
  absl::Status Check() const override {
    if (++checks_ == 1) {
      device_->ClientRerecord(handle_);
      return absl::OkStatus();
    }
    return checks_ > 50 ? absl::DeadlineExceededError("deadline passed") : absl::OkStatus();
  }

 private:
  FakeStreamDevice* const device_;
  const std::string handle_;
  mutable int checks_ = 0;
};

TEST_F(ChainTest, AClientThatRecordsItsWaitEventAgainDoesNotReleaseTheSyncWait) {
  float* out = AddGatherBuffers();
  device_.pending_handles.insert(Handle('p'));
  const RerecordThenExpire stop(&device_, Handle('p'));
  stop_ = &stop;
  EXPECT_THAT(Execute({Gather("acts", "idx", "out")}, Handle('p'), "").status(),
              StatusIs(StatusCode::kDeadlineExceeded, "wait_event: not completed by the client"));
  const StreamDevice::Stream s = LastStream();
  EXPECT_THAT(device_.log, ElementsAre(Call{"wait", s}, Call{"waited", s}, Call{"complete", s}))
      << "no op ran, nothing synchronized";
  EXPECT_EQ(out[0], 0.f);
  // The original record completes: the stream's wait ends, the queue sees it.
  device_.ClientEventDone(Handle('p'));
  EXPECT_EQ(backend_.queue().Poll(), 1);
  EXPECT_EQ(async_.inflight(), 0u);
  EXPECT_EQ(pools_.InUse(), 0u);
  EXPECT_EQ(device_.free_streams(), 1u);
}

TEST_F(ChainTest, ASyncWaitWithoutADeadlineEndsAtTheServersMaximum) {
  AddGatherBuffers();
  device_.pending_handles.insert(Handle('p'));
  backend_.set_max_host_wait(std::chrono::milliseconds(30));
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::vector<core::OpResult>> r =
      Execute({Gather("acts", "idx", "out")}, Handle('p'), "");
  EXPECT_THAT(r.status(), StatusIs(StatusCode::kDeadlineExceeded, "wait_event"));
  EXPECT_THAT(r.status().message(), HasSubstr("the server's maximum wait of 30 ms"));
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(30));
  EXPECT_EQ(backend_.queue().pending(), 1u) << "abandoned: the stream waits off-thread";
  device_.ClientEventDone(Handle('p'));
  EXPECT_EQ(backend_.queue().Poll(), 1);
  EXPECT_EQ(async_.inflight(), 0u);
}

}  // namespace
}  // namespace tokensel::testing
