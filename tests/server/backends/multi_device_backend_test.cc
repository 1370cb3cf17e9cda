// MultiDeviceBackend's dispatch decision over N fake devices (no GPU): the
// device of the tensors, mixed devices, the inline-only rule, health, and
// concurrent routing. The executor end of it: executor_devices_test.cc.
#include "server/backends/multi_device_backend.h"

#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/barrier.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/backends/fake_device_backend.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::testing {
namespace {

using ::absl::StatusCode;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Fake devices 0..n-1 with UUIDs "GPU-<i>", handed over in reverse ordinal
// order (the router sorts them).
struct Node {
  explicit Node(int n) {
    std::vector<std::unique_ptr<core::Backend>> devices;
    for (int i = n - 1; i >= 0; --i) {
      devices.push_back(std::make_unique<FakeDevice>(i, "GPU-" + std::to_string(i)));
    }
    absl::StatusOr<std::unique_ptr<backends::MultiDeviceBackend>> created =
        backends::MultiDeviceBackend::Create(std::move(devices));
    EXPECT_OK(created);
    router = *std::move(created);
  }
  FakeDevice& device(int i) const { return static_cast<FakeDevice&>(router->device(i)); }
  absl::StatusOr<core::BackendRoute> Route(std::vector<core::TensorPlacement> placements) {
    return router->Route([&] { return placements; });
  }
  std::vector<int> Inflight() const {
    std::vector<int> out;
    for (size_t i = 0; i < router->device_count(); ++i) out.push_back(router->inflight(i));
    return out;
  }
  std::unique_ptr<backends::MultiDeviceBackend> router;
};

TEST(MultiDeviceBackendTest, DevicesInOrdinalOrder) {
  Node node(3);
  std::vector<int> ordinals;
  for (const core::DeviceDescription& d : node.router->devices()) ordinals.push_back(d.ordinal);
  EXPECT_THAT(ordinals, ElementsAre(0, 1, 2));
  EXPECT_THAT(node.router->device_labels(), ElementsAre("fake:0", "fake:1", "fake:2"));
  EXPECT_TRUE(node.router->OnDevice("gpu-2")) << "UUIDs compare case-insensitively";
  EXPECT_FALSE(node.router->OnDevice("GPU-3"));
}

TEST(MultiDeviceBackendTest, CreateRejectsNoDeviceAndDuplicates) {
  EXPECT_THAT(backends::MultiDeviceBackend::Create({}), StatusIs(StatusCode::kInvalidArgument));
  std::vector<std::unique_ptr<core::Backend>> twice;
  twice.push_back(std::make_unique<FakeDevice>(0, "GPU-0"));
  twice.push_back(std::make_unique<FakeDevice>(1, "gpu-0"));
  EXPECT_THAT(backends::MultiDeviceBackend::Create(std::move(twice)),
              StatusIs(StatusCode::kInvalidArgument, "given twice"));
}

TEST(MultiDeviceBackendTest, RoutesToTheDeviceOfTheByReferenceTensors) {
  Node node(4);
  for (int d = 0; d < 4; ++d) {
    absl::StatusOr<core::BackendRoute> route =
        node.Route({{"activations", "GPU-" + std::to_string(d)},
                    {"indices", ""},  // host memory takes no part
                    {"out", "gpu-" + std::to_string(d)}});
    ASSERT_OK(route);
    EXPECT_EQ(&route->backend(), &node.device(d)) << d;
  }
}

TEST(MultiDeviceBackendTest, MixedDevicesAreFailedPreconditionNamingEveryTensor) {
  Node node(3);
  absl::StatusOr<core::BackendRoute> route =
      node.Route({{"activations", "GPU-0"}, {"indices", ""}, {"out", "GPU-2"}});
  EXPECT_THAT(route, StatusIs(StatusCode::kFailedPrecondition,
                              "the op's tensors are on different devices: activations on GPU-0 "
                              "(fake:0), out on GPU-2 (fake:2)"));
  EXPECT_THAT(node.Inflight(), ElementsAre(0, 0, 0)) << "a refused request counts nowhere";
}

TEST(MultiDeviceBackendTest, ADeviceNotServedIsFailedPrecondition) {
  Node node(2);
  EXPECT_THAT(node.Route({{"scores", "GPU-7"}}),
              StatusIs(StatusCode::kFailedPrecondition,
                       "scores: its buffer is on device GPU-7, which this server does not serve"));
}

TEST(MultiDeviceBackendTest, InlineOnlyGoesToTheLeastBusyDeviceTiesToTheLowestOrdinal) {
  Node node(3);
  std::vector<core::BackendRoute> held;
  auto route_inline = [&]() -> core::Backend* {
    absl::StatusOr<core::BackendRoute> r = node.Route({});
    EXPECT_OK(r);
    core::Backend* b = &r->backend();
    held.push_back(*std::move(r));
    return b;
  };
  EXPECT_EQ(route_inline(), &node.device(0)) << "all idle: the lowest ordinal";
  EXPECT_EQ(route_inline(), &node.device(1));
  EXPECT_EQ(route_inline(), &node.device(2));
  EXPECT_EQ(route_inline(), &node.device(0)) << "all at one: the lowest ordinal again";
  EXPECT_THAT(node.Inflight(), ElementsAre(2, 1, 1));
  held.erase(held.begin() + 1);  // device 1's request ends
  EXPECT_THAT(node.Inflight(), ElementsAre(2, 0, 1));
  EXPECT_EQ(route_inline(), &node.device(1));
  held.clear();
  EXPECT_THAT(node.Inflight(), ElementsAre(0, 0, 0));

  // By-reference requests count too: device 0 busy with its worker's op.
  absl::StatusOr<core::BackendRoute> worker = node.Route({{"activations", "GPU-0"}});
  ASSERT_OK(worker);
  EXPECT_EQ(route_inline(), &node.device(1));
}

TEST(MultiDeviceBackendTest, InlineOnlySkipsFailedDevicesAndHealthNeedsEveryDevice) {
  Node node(3);
  EXPECT_TRUE(node.router->healthy());
  node.device(0).set_healthy(false);
  EXPECT_FALSE(node.router->healthy());
  absl::StatusOr<core::BackendRoute> r = node.Route({});
  ASSERT_OK(r);
  EXPECT_EQ(&r->backend(), &node.device(1)) << "a failed device takes no inline work";
  // Its own tensors still go there (it answers them itself: UNAVAILABLE).
  absl::StatusOr<core::BackendRoute> own = node.Route({{"ids", "GPU-0"}});
  ASSERT_OK(own);
  EXPECT_EQ(&own->backend(), &node.device(0));
  node.device(1).set_healthy(false);
  node.device(2).set_healthy(false);
  absl::StatusOr<core::BackendRoute> none = node.Route({});
  ASSERT_OK(none);
  EXPECT_EQ(&none->backend(), &node.device(0)) << "none healthy: the lowest ordinal";
}

TEST(MultiDeviceBackendTest, ConcurrentInlineRequestsSpreadEvenly) {
  // Choosing and counting are one step: 3 * k requests routed at the same
  // time land k per device, whatever the interleaving.
  constexpr int kDevices = 3;
  constexpr int kPerDevice = 4;
  constexpr int kThreads = kDevices * kPerDevice;
  for (int round = 0; round < 20; ++round) {
    Node node(kDevices);
    absl::Barrier* all_routed = new absl::Barrier(kThreads + 1);
    absl::Barrier* checked = new absl::Barrier(kThreads + 1);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&] {
        absl::StatusOr<core::BackendRoute> r = node.Route({});
        EXPECT_OK(r);
        if (all_routed->Block()) delete all_routed;
        if (checked->Block()) delete checked;
      });
    }
    if (all_routed->Block()) delete all_routed;
    EXPECT_THAT(node.Inflight(), ElementsAre(kPerDevice, kPerDevice, kPerDevice));
    if (checked->Block()) delete checked;
    for (std::thread& t : threads) t.join();
    EXPECT_THAT(node.Inflight(), ElementsAre(0, 0, 0));
  }
}

TEST(MultiDeviceBackendTest, DirectUseNeedsARouteWithSeveralDevices) {
  Node node(2);
  EXPECT_THAT(node.router->AllocateStaging(16),
              StatusIs(StatusCode::kInternal, "AllocateStaging without Route"));
  kernels::SortTokensArgs args;
  EXPECT_THAT(node.router->Run(args), StatusIs(StatusCode::kInternal, "RunOp without Route"));
  EXPECT_EQ(node.device(0).calls() + node.device(1).calls(), 0);

  Node single(1);
  absl::StatusOr<std::unique_ptr<core::Backend::Staging>> staging =
      single.router->AllocateStaging(16);
  ASSERT_OK(staging);
  EXPECT_EQ(single.device(0).staging_allocations.load(), 1) << "one device: forwarded";
}

}  // namespace
}  // namespace tokensel::testing
