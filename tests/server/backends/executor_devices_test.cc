// The Executor over a MultiDeviceBackend of fake devices (no GPU): every call
// of a request (staging, copies, RunOp, copies back) reaches the one device
// its buffers live on; mixed devices fail before anything is staged; inline-
// only requests follow the least-busy rule; the op metric carries the device.
// FakeRegionMapper's kCudaDevice regions report the device of their spec.
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"
#include "server/backends/multi_device_backend.h"
#include "server/core/buffer_registry.h"
#include "server/core/executor.h"
#include "server/core/service_metrics.h"
#include "tests/server/backends/fake_device_backend.h"
#include "tests/server/core/fake_region_mapper.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::testing {
namespace {

using ::absl::StatusCode;
using kernels::DType;
using ::testing::ElementsAre;

constexpr int kDevices = 3;

std::string Uuid(int d) { return "GPU-" + std::to_string(d); }

class ExecutorDevicesTest : public ::testing::Test {
 protected:
  ExecutorDevicesTest()
      : device_mapper_(core::MemoryKind::kCudaDevice),
        registry_(&host_mapper_, &device_mapper_, core::RegistryLimits(), nullptr) {
    std::vector<std::unique_ptr<core::Backend>> devices;
    std::vector<std::string> labels;
    for (int d = 0; d < kDevices; ++d) {
      devices.push_back(std::make_unique<FakeDevice>(d, Uuid(d)));
      labels.push_back("fake:" + std::to_string(d));
    }
    router_ = *backends::MultiDeviceBackend::Create(std::move(devices));
    metrics_ = std::make_unique<core::ServiceMetrics>("v", "fake", labels);
    executor_ = std::make_unique<core::Executor>(router_.get(), &registry_, metrics_.get(),
                                                 core::ExecutorLimits());
  }

  FakeDevice& device(int d) { return static_cast<FakeDevice&>(router_->device(d)); }
  std::vector<int> Calls() {
    std::vector<int> out;
    for (int d = 0; d < kDevices; ++d) out.push_back(device(d).calls());
    return out;
  }
  std::vector<int> Runs() {
    std::vector<int> out;
    for (int d = 0; d < kDevices; ++d) out.push_back(device(d).runs.load());
    return out;
  }

  // Registers `name` (float32 0, 1, 2, ... `floats` of them) on device `d`.
  float* AddDeviceBuffer(const std::string& name, int d, int floats) {
    const std::string handle = name + std::string(64 - name.size(), 'h');
    auto* data = reinterpret_cast<float*>(device_mapper_.AddObject(handle, floats * 4));
    for (int i = 0; i < floats; ++i) data[i] = static_cast<float>(i);
    EXPECT_OK(registry_.Register(session_, name,
                                 core::CudaIpcSpec{handle, Uuid(d), 0, uint64_t(floats) * 4}));
    return data;
  }

  static core::TensorSpec Buf(const std::string& name, std::vector<int64_t> shape) {
    core::TensorSpec spec;
    spec.source = core::TensorSpec::Source::kBuffer;
    spec.buffer = name;
    spec.dtype = DType::kFloat32;
    spec.shape = std::move(shape);
    return spec;
  }
  // Inline int32 indices [1, 2] = {2, 0}.
  static core::TensorSpec Indices() {
    core::TensorSpec spec;
    spec.source = core::TensorSpec::Source::kInline;
    spec.dtype = DType::kInt32;
    spec.shape = {1, 2};
    static const int32_t values[2] = {2, 0};  // inline_data is a view
    spec.inline_data = absl::string_view(reinterpret_cast<const char*>(values), sizeof(values));
    return spec;
  }
  // activations [1, 3, 2] float32 in buffer `acts`, rows 2 and 0 gathered.
  static core::GatherTokensRequest Gather(const std::string& acts) {
    core::GatherTokensRequest req;
    req.activations = Buf(acts, {1, 3, 2});
    req.indices = Indices();
    return req;
  }

  // Observations of GatherTokens on device label `device`.
  double GatherCount(const std::string& device) {
    for (const prometheus::MetricFamily& f : metrics_->registry()->Collect()) {
      if (f.name != "tokensel_op_duration_seconds") continue;
      for (const prometheus::ClientMetric& m : f.metric) {
        bool op = false;
        bool dev = false;
        for (const auto& l : m.label) {
          op |= l.name == "op" && l.value == "GatherTokens";
          dev |= l.name == "device" && l.value == device;
        }
        if (op && dev) return static_cast<double>(m.histogram.sample_count);
      }
    }
    return -1;
  }

  std::string session_ = "s";
  FakeRegionMapper host_mapper_;
  FakeRegionMapper device_mapper_;
  core::BufferRegistry registry_;
  std::unique_ptr<backends::MultiDeviceBackend> router_;
  std::unique_ptr<core::ServiceMetrics> metrics_;
  std::unique_ptr<core::Executor> executor_;
};

TEST_F(ExecutorDevicesTest, TheWholeRequestRunsOnTheDeviceOfItsBuffers) {
  for (int d = 0; d < kDevices; ++d) {
    const std::string acts = "acts" + std::to_string(d);
    AddDeviceBuffer(acts, d, 6);
    absl::StatusOr<core::OpResult> result = executor_->Run(session_, Gather(acts));
    ASSERT_OK(result);
    ASSERT_EQ(result->outputs.size(), 1u);
    float out[4];
    ASSERT_EQ(result->outputs[0].data.size(), sizeof(out));
    std::memcpy(out, result->outputs[0].data.data(), sizeof(out));
    EXPECT_THAT(out, ElementsAre(4, 5, 0, 1)) << "rows 2 and 0";
    // Staged indices and output, a copy in, the op, a copy out: all on d.
    EXPECT_EQ(device(d).staging_allocations.load(), 2) << d;
    EXPECT_EQ(device(d).copies_to_staging.load(), 1) << d;
    EXPECT_EQ(device(d).runs.load(), 1) << d;
    EXPECT_EQ(device(d).copies_from_staging.load(), 1) << d;
    EXPECT_EQ(GatherCount("fake:" + std::to_string(d)), 1) << d;
  }
  EXPECT_THAT(Calls(), ElementsAre(5, 5, 5)) << "no device saw another's request";
}

TEST_F(ExecutorDevicesTest, MixedDevicesFailBeforeAnythingIsStagedOrWritten) {
  AddDeviceBuffer("acts", 0, 6);
  float* out = AddDeviceBuffer("out", 2, 4);
  core::GatherTokensRequest req = Gather("acts");
  req.out = Buf("out", {1, 2, 2});
  EXPECT_THAT(executor_->Run(session_, req),
              StatusIs(StatusCode::kFailedPrecondition,
                       "tensors are on different devices: activations on GPU-0 (fake:0), out on "
                       "GPU-2 (fake:2)"));
  EXPECT_THAT(Calls(), ElementsAre(0, 0, 0)) << "nothing staged, nothing run";
  EXPECT_THAT(std::vector<float>(out, out + 4), ElementsAre(0, 1, 2, 3)) << "nothing written";
  // In an Execute, with the op's position.
  std::vector<core::OpRequest> ops = {Gather("acts"), req};
  EXPECT_THAT(executor_->RunAll(session_, ops),
              StatusIs(StatusCode::kFailedPrecondition, "ops[1] (GatherTokens): the op's tensors"));
}

TEST_F(ExecutorDevicesTest, ABufferOnTheSameDeviceAsTheOthersRuns) {
  AddDeviceBuffer("acts", 1, 6);
  float* out = AddDeviceBuffer("out", 1, 4);
  core::GatherTokensRequest req = Gather("acts");
  req.out = Buf("out", {1, 2, 2});
  ASSERT_OK(executor_->Run(session_, req));
  EXPECT_THAT(std::vector<float>(out, out + 4), ElementsAre(4, 5, 0, 1));
  EXPECT_THAT(Runs(), ElementsAre(0, 1, 0));
}

TEST_F(ExecutorDevicesTest, InlineOnlyRequestsGoToTheLeastBusyDevice) {
  core::GatherTokensRequest req;
  req.activations.source = core::TensorSpec::Source::kInline;
  req.activations.dtype = DType::kFloat32;
  req.activations.shape = {1, 3, 2};
  static const float acts[6] = {0, 1, 2, 3, 4, 5};
  req.activations.inline_data =
      absl::string_view(reinterpret_cast<const char*>(acts), sizeof(acts));
  req.indices = Indices();
  ASSERT_OK(executor_->Run(session_, req));
  EXPECT_THAT(Runs(), ElementsAre(1, 0, 0)) << "all idle: the lowest ordinal";
  EXPECT_EQ(device(0).staging_allocations.load(), 3) << "its staging on the same device";

  // Device 0 and 1 busy with a request each (their workers' ops, held in
  // flight): the inline request goes to device 2.
  absl::StatusOr<core::BackendRoute> busy0 = router_->Route([] {
    return std::vector<core::TensorPlacement>{{"activations", Uuid(0)}};
  });
  absl::StatusOr<core::BackendRoute> busy1 = router_->Route([] {
    return std::vector<core::TensorPlacement>{{"activations", Uuid(1)}};
  });
  ASSERT_OK(busy0);
  ASSERT_OK(busy1);
  ASSERT_OK(executor_->Run(session_, req));
  EXPECT_THAT(Runs(), ElementsAre(1, 0, 1));
  EXPECT_EQ(device(2).staging_allocations.load(), 3);
}

TEST_F(ExecutorDevicesTest, AFailedDeviceTakesNoInlineWork) {
  device(0).set_healthy(false);
  core::SampleTokensRequest req;  // no input, ids returned inline
  req.layers = 1;
  req.batch = 2;
  req.original_tokens = 8;
  req.retained_tokens = 4;
  ASSERT_OK(executor_->Run(session_, req));
  EXPECT_THAT(Runs(), ElementsAre(0, 1, 0));
}

TEST_F(ExecutorDevicesTest, ConcurrentRequestsEachStayOnTheirDevice) {
  // Every device checks, inside RunOp, that it is the only one running ops of
  // its workers' buffers; the counts must add up per device.
  for (int d = 0; d < kDevices; ++d) AddDeviceBuffer("acts" + std::to_string(d), d, 6);
  constexpr int kThreads = 6;
  constexpr int kOps = 40;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([this, t] {
      const core::GatherTokensRequest req = Gather("acts" + std::to_string(t % kDevices));
      for (int i = 0; i < kOps; ++i) EXPECT_OK(executor_->Run(session_, req));
    });
  }
  for (std::thread& t : threads) t.join();
  constexpr int kPerDevice = kThreads / kDevices * kOps;
  EXPECT_THAT(Runs(), ElementsAre(kPerDevice, kPerDevice, kPerDevice));
  for (int d = 0; d < kDevices; ++d) {
    EXPECT_EQ(device(d).staging_allocations.load(), 2 * kPerDevice) << d;
    EXPECT_EQ(router_->inflight(d), 0) << d;
  }
}

TEST_F(ExecutorDevicesTest, ABackendOfOneDeviceRefusesBuffersOfAnother) {
  // The resolver's own check (Backend::OnDevice), for a buffer re-registered
  // on another device between routing and resolution, or a single-device
  // backend: here device 0 alone is handed a buffer of device 1.
  AddDeviceBuffer("acts", 1, 6);
  core::Executor device0_only(&device(0), &registry_, nullptr, core::ExecutorLimits());
  EXPECT_THAT(device0_only.Run(session_, Gather("acts")),
              StatusIs(StatusCode::kFailedPrecondition,
                       "activations: buffer 'acts' is on device GPU-1, not on fake:0"));
  EXPECT_EQ(device(0).runs.load(), 0);
}

}  // namespace
}  // namespace tokensel::testing
