// The fixture of the CUDA IPC event tests without a device
// (stream_chain_test.cc, stream_chain_errors_test.cc): an executor over
// ChainBackend, a backend whose requests run on FakeStreamDevice under
// StreamLease / StreamChain, with a CompletionQueue that only the test polls
// (no thread: a completion is seen exactly when the test lets the device
// progress and polls), device buffers from FakeRegionMapper, and an
// AsyncRequests tracker (caps 2 per session, 3 in all).
#ifndef TOKENSEL_TESTS_SERVER_BACKENDS_STREAM_CHAIN_TEST_H_
#define TOKENSEL_TESTS_SERVER_BACKENDS_STREAM_CHAIN_TEST_H_

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "server/backends/completion_queue.h"
#include "server/backends/ipc_event_cache.h"
#include "server/backends/stream_chain.h"
#include "server/backends/stream_lease.h"
#include "server/core/async_requests.h"
#include "server/core/buffer_registry.h"
#include "server/core/executor.h"
#include "server/core/memory_budget.h"
#include "tests/server/backends/fake_stream_device.h"
#include "tests/server/core/fake_region_mapper.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::testing {

// StreamBackend (fake_stream_device.h) with CUDA IPC events, as
// CudaBackend has them.
class ChainBackend final : public StreamBackend {
 public:
  ChainBackend(FakeStreamDevice* device, backends::StreamPools pools, size_t events_per_session)
      : StreamBackend(device, pools),
        queue_(device, pools, /*own_thread=*/false),
        events_(device, events_per_session) {}
  core::IpcEventSupport ipc_events() const override { return core::IpcEventSupport::kSupported; }
  // As CudaBackend::BeginChain.
  absl::StatusOr<std::unique_ptr<core::RequestChain>> BeginChain(const std::string& session,
                                                                 const core::IpcEvents& events,
                                                                 bool async) override {
    RETURN_IF_ERROR(device_->CheckUsable());
    std::shared_ptr<backends::IpcEvent> wait;
    std::shared_ptr<backends::IpcEvent> record;
    if (!events.wait.empty()) {
      ASSIGN_OR_RETURN(wait, events_.Get(session, events.wait, "wait_event"));
    }
    if (!events.record.empty()) {
      ASSIGN_OR_RETURN(record, events_.Get(session, events.record, "record_event"));
    }
    ASSIGN_OR_RETURN(std::unique_ptr<backends::StreamChain> chain,
                     backends::StreamChain::Begin(device_, pools_, &queue_, std::move(wait),
                                                  std::move(record), async));
    chain->set_max_host_wait(max_host_wait_);
    return std::unique_ptr<core::RequestChain>(std::move(chain));
  }
  void BeginSession(const std::string& session) override { events_.BeginSession(session); }
  void EndSession(const std::string& session) override { events_.EndSession(session); }
  // As CudaBackend's.
  void AbandonPendingWork() override { queue_.Shutdown(backends::CompletionQueue::Clock::now()); }
  // Two devices (multi_device tests): the request's buffers route it.
  std::vector<core::DeviceDescription> devices() const override {
    return std::vector<core::DeviceDescription>(two_devices_ ? 2 : 1);
  }
  absl::StatusOr<core::BackendRoute> Route(
      absl::FunctionRef<std::vector<core::TensorPlacement>()> placements) override {
    (void)placements();
    return core::BackendRoute(this);
  }
  void set_two_devices(bool two) { two_devices_ = two; }
  void set_max_host_wait(std::chrono::milliseconds wait) { max_host_wait_ = wait; }

  backends::CompletionQueue& queue() { return queue_; }
  backends::IpcEventCache& events() { return events_; }

 private:
  backends::CompletionQueue queue_;
  backends::IpcEventCache events_;
  bool two_devices_ = false;
  std::chrono::milliseconds max_host_wait_ = backends::StreamChain::kMaxHostWait;
};

// A by-reference tensor spec.
inline core::TensorSpec DeviceBuf(const std::string& name, kernels::DType dtype,
                                  std::vector<int64_t> shape) {
  core::TensorSpec spec;
  spec.source = core::TensorSpec::Source::kBuffer;
  spec.buffer = name;
  spec.dtype = dtype;
  spec.shape = std::move(shape);
  return spec;
}

inline const std::vector<float> kChainActs = {0, 1, 2, 3, 4, 5, 10, 11, 12, 13, 14, 15};
inline const std::vector<int32_t> kChainIdx = {2, 0, 1, 2};
// out[b,r,:] = acts[b, idx[b,r], :]
inline const std::vector<float> kChainGathered = {4, 5, 0, 1, 12, 13, 14, 15};

class ChainTest : public ::testing::Test {
 protected:
  // The sessions the tests use are live (as the server's SessionManager
  // begins them: IpcEventCache caches only for live sessions); AddBuffer
  // begins any other.
  ChainTest() {
    backend_.BeginSession("s");
    backend_.BeginSession("t");
  }
  static std::string Handle(char c) { return std::string(core::IpcEvents::kHandleBytes, c); }

  // Registers device buffer `name` in session `s` holding `bytes`.
  template <typename T>
  T* AddBuffer(const std::string& name, const std::vector<T>& values, const std::string& s = "s") {
    const std::string handle = name + std::string(64 - name.size(), 'h');
    const uint64_t bytes = values.size() * sizeof(T);
    backend_.BeginSession(s);
    auto* data = reinterpret_cast<T*>(device_mapper_.AddObject(handle, bytes));
    std::memcpy(data, values.data(), bytes);
    EXPECT_OK(registry_.Register(s, name, core::CudaIpcSpec{handle, "GPU-fake", 0, bytes}));
    return data;
  }
  // The buffers of Gather("acts", "idx", "out"); out (8 zeros).
  float* AddGatherBuffers() {
    AddBuffer("acts", kChainActs);
    AddBuffer("idx", kChainIdx);
    return AddBuffer("out", std::vector<float>(8, 0.f));
  }
  static core::TensorSpec Buf(const std::string& name, kernels::DType dtype,
                              std::vector<int64_t> shape) {
    return DeviceBuf(name, dtype, std::move(shape));
  }
  // GatherTokens [2,3,2] fp32 by R=2 indices into `out` (a buffer, or
  // inline when empty).
  static core::OpRequest Gather(const std::string& acts, const std::string& idx,
                                const std::string& out) {
    core::GatherTokensRequest req;
    req.activations = Buf(acts, kernels::DType::kFloat32, {2, 3, 2});
    req.indices = Buf(idx, kernels::DType::kInt32, {2, 2});
    if (!out.empty()) req.out = Buf(out, kernels::DType::kFloat32, {2, 2, 2});
    return req;
  }
  absl::StatusOr<std::vector<core::OpResult>> Execute(const std::vector<core::OpRequest>& ops,
                                                      std::string wait, std::string record,
                                                      const std::string& s = "s") {
    events_ = core::IpcEvents{std::move(wait), std::move(record)};
    core::RunOptions options;
    options.events = &events_;
    options.async = &async_;
    options.stop = stop_;
    return executor_.RunAll(s, ops, options);
  }
  // The stream of the last chain: the one the first "wait" or "kernel" ran on.
  StreamDevice::Stream LastStream() const {
    return device_.log.empty() ? nullptr : device_.log.back().stream;
  }

  FakeStreamDevice device_;
  LeasePools pools_{64 << 10, 4 << 20};
  FakeRegionMapper host_mapper_;
  FakeRegionMapper device_mapper_{core::MemoryKind::kCudaDevice};
  core::BufferRegistry registry_{&host_mapper_, &device_mapper_, core::RegistryLimits(), nullptr};
  core::MemoryBudget budget_{uint64_t{1} << 30, uint64_t{1} << 30, nullptr};
  core::AsyncRequests async_{core::AsyncLimits{2, 3}};
  ChainBackend backend_{&device_, pools_.pools(), 2};
  core::Executor executor_{&backend_, &registry_, nullptr, core::ExecutorLimits(), &budget_};
  core::IpcEvents events_;
  const kernels::StopToken* stop_ = nullptr;  // the calls' stop token (Execute)
};

}  // namespace tokensel::testing

#endif  // TOKENSEL_TESTS_SERVER_BACKENDS_STREAM_CHAIN_TEST_H_
