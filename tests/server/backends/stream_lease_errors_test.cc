// StreamLease error paths over FakeStreamDevice (fake_stream_device.h):
// exceptions, device errors before the synchronization, an unusable device,
// and the order of the drain and the return of the blocks, made visible by
// pools that cache nothing and poison and log every block they free.
#include <cstdint>
#include <memory>
#include <new>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/backends/block_pool.h"
#include "server/backends/stream_lease.h"
#include "tests/server/backends/fake_stream_device.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::testing {
namespace {

using ::absl::StatusCode;
using backends::StreamLease;
using kernels::DType;
using kernels::TensorView;
using ::testing::ElementsAre;

class StreamLeaseErrorsTest : public ::testing::Test {
 protected:
  std::unique_ptr<StreamLease> Begin() { return BeginLease(&device_, *active_); }
  size_t InUse() { return active_->InUse(); }
  // GatherTokens [2,3,2] fp32 by R=2 rows, all staged; the args.
  kernels::GatherTokensArgs StageGather(StreamLease& lease) {
    absl::StatusOr<core::RequestLease::Staged> a = lease.StageInput(acts_.data(), 48, false);
    absl::StatusOr<core::RequestLease::Staged> i = lease.StageInput(idx_.data(), 16, false);
    absl::StatusOr<core::RequestLease::Staged> o = lease.StageOutput(32);
    EXPECT_OK(a);
    EXPECT_OK(i);
    EXPECT_OK(o);
    return kernels::GatherTokensArgs{TensorView::Contiguous(a->data, DType::kFloat32, {2, 3, 2}),
                                     TensorView::Contiguous(i->data, DType::kInt32, {2, 2}),
                                     TensorView::Contiguous(o->data, DType::kFloat32, {2, 2, 2}),
                                     true};
  }

  FakeStreamDevice device_;
  LeasePools pools_{64 << 10, 4 << 20};
  // Pools that cache nothing, so every Release frees the block, poisoning
  // it and logging "release" in the device's log, after the device's calls.
  LeasePools logged_{0, 0, &device_.log};
  LeasePools* active_ = &pools_;  // the pools Begin uses
  std::vector<float> acts_ = {0, 1, 2, 3, 4, 5, 10, 11, 12, 13, 14, 15};
  std::vector<int32_t> idx_ = {2, 0, 1, 2};
};

TEST_F(StreamLeaseErrorsTest, AnExceptionInFinishDrainsAndReturnsTheWorkspace) {
  device_.throw_in_finish = true;
  std::unique_ptr<StreamLease> lease = Begin();
  const StreamDevice::Stream s = lease->stream();
  const kernels::GatherTokensArgs args = StageGather(*lease);
  EXPECT_THROW((void)lease->Run(args), std::bad_alloc);
  // The kernel (and the copy back) were queued and never synchronized: the
  // workspace went back only after a drain, before the exception left RunOp.
  EXPECT_EQ(pools_.workspaces.pool.blocks_in_use(), 0u);
  EXPECT_EQ(device_.queued(s), 0u);
  EXPECT_THAT(device_.log, ElementsAre(Call{"h2d", s}, Call{"h2d", s}, Call{"zero", s},
                                       Call{"kernel", s}, Call{"d2h", s}, Call{"drain", s}));
  lease.reset();
  EXPECT_EQ(InUse(), 0u);
  EXPECT_EQ(device_.free_streams(), 1u);
}

// Over the logged pools (StreamLeaseErrorsTest::logged_).
class StreamLeaseReleaseOrderTest : public StreamLeaseErrorsTest {
 protected:
  StreamLeaseReleaseOrderTest() { active_ = &logged_; }
};

const Call kRelease{"release", nullptr};

TEST_F(StreamLeaseReleaseOrderTest, ALeaseEndedWithWorkQueuedDrainsBeforeAnyRelease) {
  std::unique_ptr<StreamLease> lease = Begin();
  const StreamDevice::Stream s = lease->stream();
  (void)StageGather(*lease);  // queued, never run: the op fails before it
  lease.reset();
  EXPECT_THAT(device_.log,
              ElementsAre(Call{"h2d", s}, Call{"h2d", s}, Call{"zero", s}, Call{"drain", s},
                          kRelease, kRelease, kRelease, kRelease, kRelease, kRelease));
  EXPECT_EQ(InUse(), 0u);
}

TEST_F(StreamLeaseReleaseOrderTest, AFailedLaunchDrainsBeforeTheWorkspaceGoes) {
  device_.fail_launch = true;
  std::unique_ptr<StreamLease> lease = Begin();
  const StreamDevice::Stream s = lease->stream();
  EXPECT_THAT(lease->Run(StageGather(*lease)),
              StatusIs(StatusCode::kInternal, "injected launch failure"));
  EXPECT_THAT(device_.log, ElementsAre(Call{"h2d", s}, Call{"h2d", s}, Call{"zero", s},
                                       Call{"drain", s}, kRelease));
  EXPECT_EQ(logged_.workspaces.pool.blocks_in_use(), 0u);
}

TEST_F(StreamLeaseReleaseOrderTest, AFinishFailingBeforeItsSyncIsDrainedBeforeRunReturns) {
  // Finish stops at a CUDA error before it synchronized (as status.cu when
  // the status word's copy fails to enqueue): the kernel and the copy back
  // are still queued, and RunOp must drain them before it returns anything
  // or gives the workspace back.
  device_.fail_finish_before_sync = true;
  std::unique_ptr<StreamLease> lease = Begin();
  const StreamDevice::Stream s = lease->stream();
  EXPECT_THAT(lease->Run(StageGather(*lease)),
              StatusIs(StatusCode::kInternal, "injected finish failure"));
  EXPECT_EQ(device_.queued(s), 0u);
  EXPECT_THAT(device_.log,
              ElementsAre(Call{"h2d", s}, Call{"h2d", s}, Call{"zero", s}, Call{"kernel", s},
                          Call{"d2h", s}, Call{"drain", s}, kRelease));
  lease.reset();
  EXPECT_EQ(InUse(), 0u);
}

TEST_F(StreamLeaseReleaseOrderTest, AnExceptionInFinishDrainsBeforeTheWorkspaceGoes) {
  device_.throw_in_finish = true;
  std::unique_ptr<StreamLease> lease = Begin();
  const StreamDevice::Stream s = lease->stream();
  const kernels::GatherTokensArgs args = StageGather(*lease);
  EXPECT_THROW((void)lease->Run(args), std::bad_alloc);
  EXPECT_THAT(device_.log,
              ElementsAre(Call{"h2d", s}, Call{"h2d", s}, Call{"zero", s}, Call{"kernel", s},
                          Call{"d2h", s}, Call{"drain", s}, kRelease));
}

TEST_F(StreamLeaseReleaseOrderTest, ASuccessfulOpReleasesOnlyAfterItsSync) {
  std::unique_ptr<StreamLease> lease = Begin();
  const StreamDevice::Stream s = lease->stream();
  const kernels::GatherTokensArgs args = StageGather(*lease);
  ASSERT_OK(lease->Run(args));
  std::vector<float> out(8);
  ASSERT_OK(lease->ReadBack(2, out.data(), 32));
  EXPECT_THAT(out, ElementsAre(4, 5, 0, 1, 12, 13, 14, 15));
  lease.reset();
  EXPECT_THAT(device_.log, ElementsAre(Call{"h2d", s}, Call{"h2d", s}, Call{"zero", s},
                                       Call{"kernel", s}, Call{"d2h", s}, Call{"sync", s}, kRelease,
                                       kRelease, kRelease, kRelease, kRelease, kRelease, kRelease));
}

TEST_F(StreamLeaseErrorsTest, CopiesToAnUnusableDeviceAreRefusedAndNothingLeaks) {
  {
    std::unique_ptr<StreamLease> lease = Begin();
    const StreamDevice::Stream s = lease->stream();
    device_.usable = false;
    EXPECT_THAT(lease->StageInput(acts_.data(), 48, false).status(),
                StatusIs(StatusCode::kUnavailable));
    EXPECT_THAT(lease->StageOutput(16).status(), StatusIs(StatusCode::kUnavailable));
    EXPECT_EQ(device_.queued(s), 0u);
  }
  EXPECT_EQ(InUse(), 0u);
  EXPECT_EQ(device_.free_streams(), 1u);
  for (const Call& c : device_.log) EXPECT_EQ(c.what, "drain") << "nothing was issued";
}

}  // namespace
}  // namespace tokensel::testing
