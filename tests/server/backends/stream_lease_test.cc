// StreamLease and BlockPool without a device (issue 12 item 2), over
// FakeStreamDevice (fake_stream_device.h: records every call with its
// stream, runs queued work only when the stream is synchronized). So a lease
// that read the caller's memory late, read pinned memory before the sync,
// or issued anything off the op's stream gives wrong results or a wrong log
// here.
#include "server/backends/stream_lease.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/backends/block_pool.h"
#include "server/core/buffer_registry.h"
#include "server/core/executor.h"
#include "tests/server/backends/fake_stream_device.h"
#include "tests/server/core/fake_region_mapper.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::testing {
namespace {

using ::absl::StatusCode;
using backends::BlockPool;
using backends::StreamDevice;
using backends::StreamLease;
using backends::StreamPools;
using kernels::DType;
using kernels::TensorView;
using ::testing::ElementsAre;

class StreamLeaseTest : public ::testing::Test {
 protected:
  StreamPools pools() { return pools_.pools(); }
  std::unique_ptr<StreamLease> Begin() { return BeginLease(&device_, pools_); }
  size_t InUse() { return pools_.InUse(); }

  FakeStreamDevice device_;
  LeasePools pools_{64 << 10, 4 << 20};
  CountingPool& pinned_ = pools_.pinned;
  CountingPool& staging_ = pools_.staging;
  CountingPool& workspaces_ = pools_.workspaces;
};

// GatherTokens [B=2,S=3,C=2] fp32 with R=2: staged activations and indices,
// output staged and read back. Returns the output the lease read back.
std::vector<float> RunGather(StreamLease& lease, std::vector<float> acts, std::vector<int32_t> idx,
                             absl::Status* status) {
  absl::StatusOr<core::RequestLease::Staged> a =
      lease.StageInput(acts.data(), acts.size() * 4, false);
  absl::StatusOr<core::RequestLease::Staged> i =
      lease.StageInput(idx.data(), idx.size() * 4, false);
  absl::StatusOr<core::RequestLease::Staged> o = lease.StageOutput(2 * 2 * 2 * 4);
  if (!a.ok() || !i.ok() || !o.ok()) {
    *status = !a.ok() ? a.status() : !i.ok() ? i.status() : o.status();
    return {};
  }
  // The caller's memory changes right after staging (the client owns it):
  // the lease read it once, at StageInput.
  std::fill(acts.begin(), acts.end(), -7.f);
  std::fill(idx.begin(), idx.end(), 99);
  kernels::GatherTokensArgs args{TensorView::Contiguous(a->data, DType::kFloat32, {2, 3, 2}),
                                 TensorView::Contiguous(i->data, DType::kInt32, {2, 2}),
                                 TensorView::Contiguous(o->data, DType::kFloat32, {2, 2, 2}), true};
  *status = lease.Run(args);
  if (!status->ok()) return {};
  std::vector<float> out(8, -1.f);
  *status = lease.ReadBack(o->slot, out.data(), out.size() * 4);
  return out;
}

const std::vector<float> kActs = {0, 1, 2, 3, 4, 5, 10, 11, 12, 13, 14, 15};
const std::vector<int32_t> kIdx = {2, 0, 1, 1 + 1};
// out[b,r,:] = acts[b, idx[b,r], :]
const std::vector<float> kGathered = {4, 5, 0, 1, 12, 13, 14, 15};

TEST_F(StreamLeaseTest, EveryCallIsOnTheOpStreamInOrder) {
  std::unique_ptr<StreamLease> lease = Begin();
  ASSERT_NE(lease, nullptr);
  const StreamDevice::Stream s = lease->stream();
  absl::Status status;
  EXPECT_THAT(RunGather(*lease, kActs, kIdx, &status), ::testing::ElementsAreArray(kGathered));
  ASSERT_OK(status);
  EXPECT_THAT(device_.log, ElementsAre(Call{"h2d", s}, Call{"h2d", s}, Call{"zero", s},
                                       Call{"kernel", s}, Call{"d2h", s}, Call{"sync", s}));
}

TEST_F(StreamLeaseTest, AnInOutTensorIsCopiedBackAfterTheKernel) {
  std::unique_ptr<StreamLease> lease = Begin();
  const StreamDevice::Stream s = lease->stream();
  // SortTokens in place on ids [1,3] (S = 5): sorted ascending.
  std::vector<int32_t> ids = {4, 0, 2};
  absl::StatusOr<core::RequestLease::Staged> staged = lease->StageInput(ids.data(), 12, true);
  ASSERT_OK(staged);
  kernels::SortTokensArgs args;
  args.ids = TensorView::Contiguous(staged->data, DType::kInt32, {1, 3});
  args.original_tokens = 5;
  ASSERT_OK(lease->Run(args));
  std::vector<int32_t> out(3);
  ASSERT_OK(lease->ReadBack(staged->slot, out.data(), 12));
  EXPECT_THAT(out, ElementsAre(0, 2, 4));
  EXPECT_THAT(device_.log,
              ElementsAre(Call{"h2d", s}, Call{"kernel", s}, Call{"d2h", s}, Call{"sync", s}));
}

TEST_F(StreamLeaseTest, ConcurrentLeasesHaveTheirOwnStreams) {
  std::unique_ptr<StreamLease> a = Begin();
  std::unique_ptr<StreamLease> b = Begin();
  EXPECT_NE(a->stream(), b->stream());
  const StreamDevice::Stream sa = a->stream();
  a.reset();
  std::unique_ptr<StreamLease> c = Begin();
  EXPECT_EQ(c->stream(), sa) << "the stream went back to the pool";
  EXPECT_EQ(device_.streams_created, 2);
}

TEST_F(StreamLeaseTest, TheSteadyStateAllocatesNothing) {
  for (int round = 0; round < 5; ++round) {
    std::unique_ptr<StreamLease> lease = Begin();
    absl::Status status;
    EXPECT_THAT(RunGather(*lease, kActs, kIdx, &status), ::testing::ElementsAreArray(kGathered));
    ASSERT_OK(status);
  }
  EXPECT_EQ(pinned_.mallocs, 3);  // one block per staged tensor, the first time only
  EXPECT_EQ(staging_.mallocs, 3);
  EXPECT_EQ(workspaces_.mallocs, 1);
  EXPECT_EQ(InUse(), 0u);
  EXPECT_EQ(pinned_.frees + staging_.frees + workspaces_.frees, 0);
}

TEST_F(StreamLeaseTest, AnOutputIsZeroedOnTheStreamNotAtOnce) {
  // A reused block holds stale bytes; the zero fill is queued on the stream
  // (before the kernel), so it lands when the stream runs, not on the host
  // at once: here the stale bytes written after StageOutput are cleared when
  // the lease drains its stream at the end.
  void* data = nullptr;
  {
    std::unique_ptr<StreamLease> lease = Begin();
    absl::StatusOr<core::RequestLease::Staged> o = lease->StageOutput(16);
    ASSERT_OK(o);
    data = o->data;
    EXPECT_EQ(static_cast<unsigned char*>(data)[0], 0xAB) << "nothing ran on the host";
    std::memset(data, 0x5A, 16);
  }
  // The block is idle in the pool (still allocated): the queued fill ran.
  EXPECT_EQ(std::vector<char>(static_cast<char*>(data), static_cast<char*>(data) + 16),
            std::vector<char>(16, 0));
}

TEST_F(StreamLeaseTest, StagingCostIsBothBlocksRounded) {
  std::unique_ptr<StreamLease> lease = Begin();
  EXPECT_EQ(lease->StagingCost(0), 2u * 4096);
  EXPECT_EQ(lease->StagingCost(4097), 2u * 8192);
  EXPECT_EQ(lease->StagingCost(UINT64_MAX), UINT64_MAX);
  EXPECT_THAT(lease->StageInput("", uint64_t{1} << 63 | 1, false).status(),
              StatusIs(StatusCode::kResourceExhausted));
}

TEST_F(StreamLeaseTest, IdleStagingIsTrimmedToTheCap) {
  // 128 KiB tensors: each alone exceeds the 64 KiB cap, so each is freed on
  // release; small ones stay cached.
  std::vector<char> big(128 << 10, 1);
  {
    std::unique_ptr<StreamLease> lease = Begin();
    ASSERT_OK(lease->StageInput(big.data(), big.size(), false));
    ASSERT_OK(lease->StageInput(big.data(), 100, false));
  }
  // The pools trim on their gate's drainer, after the releases.
  ASSERT_EQ(pools_.gate.AwaitDrained(absl::Seconds(10)), 0u);
  EXPECT_LE(pinned_.pool.cached_bytes(), pinned_.pool.max_cached_bytes());
  EXPECT_LE(staging_.pool.cached_bytes(), staging_.pool.max_cached_bytes());
  EXPECT_EQ(pinned_.frees, 1);
  EXPECT_EQ(staging_.frees, 1);
  EXPECT_EQ(pinned_.pool.cached_blocks(), 1u);
  EXPECT_EQ(InUse(), 0u);
}

TEST_F(StreamLeaseTest, AFailedCopyDrainsAndReturnsEverything) {
  device_.fail_h2d_at = 2;
  {
    std::unique_ptr<StreamLease> lease = Begin();
    absl::Status status;
    RunGather(*lease, kActs, kIdx, &status);
    EXPECT_THAT(status, StatusIs(StatusCode::kInternal, "injected h2d failure"));
    EXPECT_EQ(device_.free_streams(), 0u);
  }
  const StreamDevice::Stream s = reinterpret_cast<StreamDevice::Stream>(0x1000);
  // The first copy and the output's fill were queued (RunGather stages all
  // three before it looks at the errors): the lease drained them before
  // their blocks went back to the pools.
  EXPECT_THAT(device_.log, ElementsAre(Call{"h2d", s}, Call{"zero", s}, Call{"drain", s}));
  EXPECT_EQ(device_.queued(s), 0u);
  EXPECT_EQ(InUse(), 0u);
  EXPECT_EQ(device_.free_streams(), 1u);
}

TEST_F(StreamLeaseTest, AFailedLaunchDrainsAndReturnsEverything) {
  device_.fail_launch = true;
  {
    std::unique_ptr<StreamLease> lease = Begin();
    const StreamDevice::Stream s = lease->stream();
    absl::Status status;
    RunGather(*lease, kActs, kIdx, &status);
    EXPECT_THAT(status, StatusIs(StatusCode::kInternal, "injected launch failure"));
    EXPECT_THAT(device_.log,
                ElementsAre(Call{"h2d", s}, Call{"h2d", s}, Call{"zero", s}, Call{"drain", s}));
    EXPECT_EQ(workspaces_.pool.blocks_in_use(), 0u) << "the workspace is back once drained";
  }
  EXPECT_EQ(InUse(), 0u);
  EXPECT_EQ(device_.free_streams(), 1u);
}

TEST_F(StreamLeaseTest, BadDataIsTheKernelsErrorAndNothingIsReadBack) {
  std::unique_ptr<StreamLease> lease = Begin();
  absl::Status status;
  RunGather(*lease, kActs, {2, 0, 3, 1}, &status);  // 3 is out of [0, S=3)
  EXPECT_THAT(status, StatusIs(StatusCode::kInvalidArgument));
  std::vector<float> out(8);
  EXPECT_THAT(lease->ReadBack(2, out.data(), 32), StatusIs(StatusCode::kFailedPrecondition));
  lease.reset();
  EXPECT_EQ(InUse(), 0u);
}

TEST_F(StreamLeaseTest, AFailedAllocationReturnsTheOtherBlock) {
  staging_.fail = true;
  std::unique_ptr<StreamLease> lease = Begin();
  EXPECT_THAT(lease->StageOutput(64).status(), StatusIs(StatusCode::kResourceExhausted));
  EXPECT_EQ(pinned_.pool.blocks_in_use(), 0u);
  EXPECT_EQ(pinned_.pool.cached_blocks(), 1u);
}

TEST_F(StreamLeaseTest, AnUnusableDeviceRunsNothingAndDrainsTheStaging) {
  {
    std::unique_ptr<StreamLease> lease = Begin();
    const StreamDevice::Stream s = lease->stream();
    ASSERT_OK(lease->StageInput(kActs.data(), 48, false));
    device_.usable = false;
    kernels::SliceGptMaskArgs args;
    EXPECT_THAT(lease->Run(args), StatusIs(StatusCode::kUnavailable));
    EXPECT_THAT(lease->Run(args), StatusIs(StatusCode::kFailedPrecondition, "one op"));
    lease.reset();
    EXPECT_THAT(device_.log, ElementsAre(Call{"h2d", s}, Call{"drain", s}));
  }
  EXPECT_EQ(InUse(), 0u);
  EXPECT_THAT(StreamLease::Begin(&device_, pools()).status(), StatusIs(StatusCode::kUnavailable));
}

TEST_F(StreamLeaseTest, ReadBackChecksItsSlotAndSize) {
  std::unique_ptr<StreamLease> lease = Begin();
  absl::StatusOr<core::RequestLease::Staged> in = lease->StageInput(kActs.data(), 48, false);
  ASSERT_OK(in);
  char buf[64];
  EXPECT_THAT(lease->ReadBack(in->slot, buf, 4), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(lease->ReadBack(7, buf, 4), StatusIs(StatusCode::kInvalidArgument));
}

// The executor over a backend whose requests run under a StreamLease on the
// fake device: the resolver's staging and the op share one lease, in order,
// and the inline result comes back.
// (StreamBackend: fake_stream_device.h)
TEST_F(StreamLeaseTest, TheExecutorStagesAndRunsThroughOneLease) {
  FakeRegionMapper host_mapper;
  FakeRegionMapper device_mapper(core::MemoryKind::kCudaDevice);
  core::BufferRegistry registry(&host_mapper, &device_mapper, core::RegistryLimits(), nullptr);
  StreamBackend backend(&device_, pools());
  core::MemoryBudget budget(uint64_t{1} << 30, uint64_t{1} << 30, nullptr);
  core::Executor executor(&backend, &registry, nullptr, core::ExecutorLimits(), &budget);
  core::GatherTokensRequest req;
  req.activations.source = core::TensorSpec::Source::kInline;
  req.activations.dtype = DType::kFloat32;
  req.activations.shape = {2, 3, 2};
  req.activations.inline_data =
      absl::string_view(reinterpret_cast<const char*>(kActs.data()), kActs.size() * 4);
  req.indices.source = core::TensorSpec::Source::kInline;
  req.indices.dtype = DType::kInt32;
  req.indices.shape = {2, 2};
  req.indices.inline_data =
      absl::string_view(reinterpret_cast<const char*>(kIdx.data()), kIdx.size() * 4);
  for (int round = 0; round < 3; ++round) {
    device_.log.clear();
    absl::StatusOr<core::OpResult> result = executor.Run("s", req);
    ASSERT_OK(result);
    ASSERT_EQ(result->outputs.size(), 1u);
    std::vector<float> out(8);
    ASSERT_EQ(result->outputs[0].data.size(), 32u);
    std::memcpy(out.data(), result->outputs[0].data.data(), 32);
    EXPECT_THAT(out, ::testing::ElementsAreArray(kGathered));
    const StreamDevice::Stream s = device_.log.front().stream;
    EXPECT_THAT(device_.log, ElementsAre(Call{"h2d", s}, Call{"h2d", s}, Call{"zero", s},
                                         Call{"kernel", s}, Call{"d2h", s}, Call{"sync", s}));
    EXPECT_EQ(budget.used_bytes(), 0u) << "staging and scratch given back";
  }
  EXPECT_EQ(InUse(), 0u);
  EXPECT_EQ(staging_.mallocs, 3) << "later requests reuse the pooled blocks";
}

}  // namespace
}  // namespace tokensel::testing
