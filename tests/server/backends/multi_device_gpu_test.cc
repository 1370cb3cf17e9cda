// Multi-GPU dispatch on real devices (label `gpu`): the server's CUDA backend
// (MakeBackend("cuda"): a CudaBackend per device under a MultiDeviceBackend)
// runs each op on the device of its buffers. Skips without a GPU
// (tests/testing/gpu_device.h) and with fewer than two devices.
//
// What it catches: the defect of issue 12 item 1 (every op on device 0). A
// GatherTokens on buffers of device k != 0 then runs kernels on device 0
// over memory of device k: an illegal address (no peer access), or, where
// peer access happens to be on, a result from the wrong device, which the
// `device` label of the op metric shows. Buffers are plain cudaMalloc
// allocations registered through a test mapper that reports their device
// (what CudaIpcMapper does for a client's IPC handle).
#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"
#include "server/backends/cuda_devices.h"
#include "server/backends/make_backend.h"
#include "server/core/buffer_registry.h"
#include "server/core/executor.h"
#include "server/core/service_metrics.h"
#include "tests/server/core/fake_region_mapper.h"
#include "tests/testing/gpu_device.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::testing {
namespace {

using kernels::DType;
using ::testing::ElementsAre;

// cudaMalloc'd memory on one device, by name (the spec's handle).
class DeviceMemoryMapper : public core::RegionMapper {
 public:
  ~DeviceMemoryMapper() override {
    for (auto& [name, a] : allocations_) {
      cudaSetDevice(a.ordinal);
      cudaFree(a.data);
    }
  }
  // `floats` float32 0, 1, 2, ... on device `ordinal` (UUID `uuid`).
  void* Add(const std::string& name, int ordinal, const std::string& uuid, int floats) {
    std::vector<float> host(floats);
    for (int i = 0; i < floats; ++i) host[i] = static_cast<float>(i);
    Allocation a{ordinal, uuid, nullptr, uint64_t(floats) * 4};
    EXPECT_EQ(cudaSetDevice(ordinal), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&a.data, a.bytes), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(a.data, host.data(), a.bytes, cudaMemcpyHostToDevice), cudaSuccess);
    // The ops run on non-blocking streams, which do not wait for this copy.
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    allocations_[name] = a;
    return a.data;
  }
  std::vector<float> Read(const std::string& name) {
    const Allocation& a = allocations_.at(name);
    std::vector<float> host(a.bytes / 4);
    EXPECT_EQ(cudaSetDevice(a.ordinal), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(host.data(), a.data, a.bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }
  absl::StatusOr<std::unique_ptr<core::MappedRegion>> Map(const core::RegionSpec& spec) override {
    const auto& ipc = std::get<core::CudaIpcSpec>(spec);
    auto it = allocations_.find(ipc.handle);
    if (it == allocations_.end()) return absl::NotFoundError(ipc.handle);
    return std::unique_ptr<core::MappedRegion>(new Region(it->second));
  }

 private:
  struct Allocation {
    int ordinal = 0;
    std::string uuid;
    void* data = nullptr;
    uint64_t bytes = 0;
  };
  class Region : public core::MappedRegion {
   public:
    explicit Region(Allocation a) : a_(std::move(a)) {}
    void* data() const override { return a_.data; }
    uint64_t size() const override { return a_.bytes; }
    core::MemoryKind memory_kind() const override { return core::MemoryKind::kCudaDevice; }
    std::string device_uuid() const override { return a_.uuid; }

   private:
    Allocation a_;
  };
  std::map<std::string, Allocation> allocations_;
};

std::string Handle(const std::string& name) { return name + std::string(64 - name.size(), 'h'); }

core::TensorSpec Buf(const std::string& name, std::vector<int64_t> shape) {
  core::TensorSpec spec;
  spec.source = core::TensorSpec::Source::kBuffer;
  spec.buffer = name;
  spec.dtype = DType::kFloat32;
  spec.shape = std::move(shape);
  return spec;
}

core::TensorSpec Indices() {  // int32 [1, 2] = {2, 0}, inline
  core::TensorSpec spec;
  spec.source = core::TensorSpec::Source::kInline;
  spec.dtype = DType::kInt32;
  spec.shape = {1, 2};
  static const int32_t values[2] = {2, 0};  // inline_data is a view
  spec.inline_data = absl::string_view(reinterpret_cast<const char*>(values), sizeof(values));
  return spec;
}

double GatherCount(const core::ServiceMetrics& metrics, const std::string& device) {
  for (const prometheus::MetricFamily& f : metrics.registry()->Collect()) {
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

class MultiDeviceGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TOKENSEL_REQUIRE_GPU();
    devices_ = backends::ListCudaDevices();
    if (devices_.size() < 2) {
      GTEST_SKIP() << "needs two CUDA devices, this machine has " << devices_.size();
    }
    absl::StatusOr<std::unique_ptr<core::Backend>> backend = backends::MakeBackend("cuda", 0);
    ASSERT_OK(backend);
    backend_ = *std::move(backend);
    ASSERT_EQ(backend_->devices().size(), devices_.size()) << "one backend context per device";
    std::vector<std::string> labels = backend_->device_labels();
    metrics_ = std::make_unique<core::ServiceMetrics>("v", "cuda", labels);
    registry_ =
        std::make_unique<core::BufferRegistry>(&host_, &memory_, core::RegistryLimits(), nullptr);
    executor_ = std::make_unique<core::Executor>(backend_.get(), registry_.get(), metrics_.get(),
                                                 core::ExecutorLimits());
  }

  void Add(const std::string& name, size_t device, int floats) {
    memory_.Add(Handle(name), devices_[device].ordinal, devices_[device].uuid, floats);
    ASSERT_OK(registry_->Register(
        "s", name,
        core::CudaIpcSpec{Handle(name), devices_[device].uuid, 0, uint64_t(floats) * 4}));
  }

  std::vector<core::DeviceDescription> devices_;
  FakeRegionMapper host_;
  DeviceMemoryMapper memory_;
  std::unique_ptr<core::Backend> backend_;
  std::unique_ptr<core::ServiceMetrics> metrics_;
  std::unique_ptr<core::BufferRegistry> registry_;
  std::unique_ptr<core::Executor> executor_;
};

TEST_F(MultiDeviceGpuTest, EachOpRunsOnTheDeviceOfItsBuffers) {
  // The last device first: the one the old server never used.
  for (size_t d = devices_.size(); d-- > 0;) {
    const std::string acts = "acts" + std::to_string(d);
    const std::string out = "out" + std::to_string(d);
    Add(acts, d, 6);
    Add(out, d, 4);
    core::GatherTokensRequest req;
    req.activations = Buf(acts, {1, 3, 2});
    req.indices = Indices();
    req.out = Buf(out, {1, 2, 2});
    ASSERT_OK(executor_->Run("s", req)) << "device " << d;
    EXPECT_THAT(memory_.Read(Handle(out)), ElementsAre(4, 5, 0, 1)) << "device " << d;
    EXPECT_EQ(GatherCount(*metrics_, "cuda:" + std::to_string(devices_[d].ordinal)), 1)
        << "device " << d;
  }
  EXPECT_TRUE(backend_->healthy()) << "no device faulted";
}

TEST_F(MultiDeviceGpuTest, BuffersOnTwoDevicesAreRefusedAndNothingIsWritten) {
  Add("acts", 0, 6);
  Add("out", 1, 4);
  core::GatherTokensRequest req;
  req.activations = Buf("acts", {1, 3, 2});
  req.indices = Indices();
  req.out = Buf("out", {1, 2, 2});
  EXPECT_THAT(executor_->Run("s", req),
              StatusIs(absl::StatusCode::kFailedPrecondition, "on different devices"));
  EXPECT_THAT(memory_.Read(Handle("out")), ElementsAre(0, 1, 2, 3));
  EXPECT_TRUE(backend_->healthy());
}

}  // namespace
}  // namespace tokensel::testing
