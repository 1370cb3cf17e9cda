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
using backends::StreamPools;
using kernels::DType;
using kernels::TensorView;
using ::testing::ElementsAre;

class StreamLeaseErrorsTest : public ::testing::Test {
 protected:
  StreamPools pools() { return StreamPools{&pinned_.pool, &staging_.pool, &workspaces_.pool}; }
  std::unique_ptr<StreamLease> Begin() {
    absl::StatusOr<std::unique_ptr<StreamLease>> lease = StreamLease::Begin(&device_, pools());
    EXPECT_OK(lease);
    return lease.ok() ? *std::move(lease) : nullptr;
  }
  size_t InUse() {
    return pinned_.pool.blocks_in_use() + staging_.pool.blocks_in_use() +
           workspaces_.pool.blocks_in_use();
  }
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
  CountingPool pinned_{"pinned", 4096, 64 << 10};
  CountingPool staging_{"staging", 4096, 64 << 10};
  CountingPool workspaces_{"workspaces", 1 << 20, 4 << 20};
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
  EXPECT_EQ(workspaces_.pool.blocks_in_use(), 0u);
  EXPECT_EQ(device_.queued(s), 0u);
  EXPECT_THAT(device_.log, ElementsAre(Call{"h2d", s}, Call{"h2d", s}, Call{"zero", s},
                                       Call{"kernel", s}, Call{"d2h", s}, Call{"drain", s}));
  lease.reset();
  EXPECT_EQ(InUse(), 0u);
  EXPECT_EQ(device_.free_streams(), 1u);
}

}  // namespace
}  // namespace tokensel::testing
