// What the FreeGate (server/core/free_gate.h) assumes of the CUDA runtime,
// on real devices (label `gpu`; skips without a GPU, the cross-device cases
// with fewer than two devices). A stream that never completes stands for a
// stream waiting on a client's event that is never recorded: a host
// function that blocks until the test releases it. Each call runs on its
// own thread under a watchdog: past kLimit the stream is released (so the
// call returns) and the call counts as blocked.
//
//  - Request-thread calls (docs/gpu.md, "Calls on request threads"): on the
//    stuck stream's own device, cudaMalloc, cudaHostAlloc, and the direct
//    staging API's synchronous copies (cudaMemset / cudaMemcpy and
//    cudaStreamSynchronize(cudaStreamLegacy): our streams are non-blocking,
//    so the legacy stream does not wait for them) must return. Asserted: the
//    server relies on it.
//  - Frees on device 0 with a stuck stream on device 1: cudaFree and the VMM
//    teardown (cuMemUnmap, cuMemAddressFree, cuMemRelease) must return (the
//    gates are per device: asserted); whether cudaFreeHost returns is
//    recorded only (pinned frees wait for every device's gate anyway).
//  - Frees on the stuck device itself: recorded only (the gate defers them).
// Not here: cudaIpcCloseMemHandle (needs a second process's handle; the IPC
// device tests' exporter could provide one).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/cuda_driver_entry.h"
#include "tests/testing/gpu_device.h"

namespace tokensel::testing {
namespace {

constexpr std::chrono::seconds kLimit(5);

// A non-blocking stream of `device` stuck in a host function until Release.
class StuckStream {
 public:
  explicit StuckStream(int device) : device_(device) {
    EXPECT_EQ(cudaSetDevice(device), cudaSuccess);
    EXPECT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
    EXPECT_EQ(cudaLaunchHostFunc(stream_, &Block, this), cudaSuccess);
  }
  ~StuckStream() {
    Release();
    (void)cudaSetDevice(device_);
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    EXPECT_EQ(cudaStreamDestroy(stream_), cudaSuccess);
  }
  StuckStream(const StuckStream&) = delete;
  StuckStream& operator=(const StuckStream&) = delete;
  void Release() { released_ = true; }

 private:
  static void CUDART_CB Block(void* self) {
    while (!static_cast<StuckStream*>(self)->released_.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  const int device_;
  cudaStream_t stream_ = nullptr;
  std::atomic<bool> released_{false};
};

// Runs `call` on its own thread; true if it returned within kLimit. If not,
// releases `stuck` (the call then returns) and joins.
bool ReturnsWhileStuck(StuckStream& stuck, const std::function<void()>& call) {
  std::atomic<bool> done{false};
  std::thread t([&] {
    call();
    done = true;
  });
  const auto deadline = std::chrono::steady_clock::now() + kLimit;
  while (!done.load() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const bool returned = done.load();
  if (!returned) stuck.Release();
  t.join();
  return returned;
}

int DeviceCount() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

class FreeGateGpuTest : public ::testing::Test {
 protected:
  void SetUp() override { TOKENSEL_REQUIRE_GPU(); }
};

TEST_F(FreeGateGpuTest, RequestThreadCallsDoNotWaitBehindAStuckStreamOfTheirDevice) {
  std::vector<char> host(1 << 20, 7);
  void* device = nullptr;
  void* pinned = nullptr;
  void* staging = nullptr;
  {
    StuckStream stuck(0);
    EXPECT_TRUE(ReturnsWhileStuck(stuck, [&] {
      (void)cudaSetDevice(0);
      EXPECT_EQ(cudaMalloc(&device, 1 << 20), cudaSuccess);
    })) << "cudaMalloc waited behind a stuck stream of its device";
    EXPECT_TRUE(ReturnsWhileStuck(stuck, [&] {
      (void)cudaSetDevice(0);
      EXPECT_EQ(cudaHostAlloc(&pinned, 1 << 20, cudaHostAllocDefault), cudaSuccess);
    })) << "cudaHostAlloc waited behind a stuck stream of its device";
    // CudaBackend::AllocateStaging / CopyToStaging / CopyFromStaging.
    EXPECT_TRUE(ReturnsWhileStuck(stuck, [&] {
      (void)cudaSetDevice(0);
      EXPECT_EQ(cudaMalloc(&staging, host.size()), cudaSuccess);
      EXPECT_EQ(cudaMemset(staging, 0, host.size()), cudaSuccess);
      EXPECT_EQ(cudaStreamSynchronize(cudaStreamLegacy), cudaSuccess);
      EXPECT_EQ(cudaMemcpy(staging, host.data(), host.size(), cudaMemcpyHostToDevice), cudaSuccess);
      EXPECT_EQ(cudaStreamSynchronize(cudaStreamLegacy), cudaSuccess);
      EXPECT_EQ(cudaMemcpy(host.data(), staging, host.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    })) << "the staging API's legacy-stream copies waited behind a stuck non-blocking stream";
    // Recorded only: the gate keeps these away from a stuck device.
    const bool free_returned = ReturnsWhileStuck(stuck, [&] {
      (void)cudaSetDevice(0);
      (void)cudaFree(device);
    });
    RecordProperty("cudaFree_on_the_stuck_device_returned", free_returned ? 1 : 0);
  }
  (void)cudaSetDevice(0);
  EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess);
  EXPECT_EQ(cudaFree(staging), cudaSuccess);
}

TEST_F(FreeGateGpuTest, FreesOnOneDeviceDoNotWaitForAStuckStreamOnAnother) {
  if (DeviceCount() < 2) GTEST_SKIP() << "needs two CUDA devices";
  const auto create = DriverEntry<PFN_cuMemCreate_v10020>("cuMemCreate");
  const auto granularity_of =
      DriverEntry<PFN_cuMemGetAllocationGranularity_v10020>("cuMemGetAllocationGranularity");
  const auto reserve = DriverEntry<PFN_cuMemAddressReserve_v10020>("cuMemAddressReserve");
  const auto map = DriverEntry<PFN_cuMemMap_v10020>("cuMemMap");
  const auto unmap = DriverEntry<PFN_cuMemUnmap_v10020>("cuMemUnmap");
  const auto address_free = DriverEntry<PFN_cuMemAddressFree_v10020>("cuMemAddressFree");
  const auto release = DriverEntry<PFN_cuMemRelease_v10020>("cuMemRelease");
  ASSERT_TRUE(create && granularity_of && reserve && map && unmap && address_free && release);

  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  void* device = nullptr;
  void* pinned = nullptr;
  ASSERT_EQ(cudaMalloc(&device, 1 << 20), cudaSuccess);
  ASSERT_EQ(cudaHostAlloc(&pinned, 1 << 20, cudaHostAllocDefault), cudaSuccess);
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  size_t granularity = 0;
  ASSERT_EQ(granularity_of(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), CUDA_SUCCESS);
  CUmemGenericAllocationHandle handle = 0;
  ASSERT_EQ(create(&handle, granularity, &prop, 0), CUDA_SUCCESS);
  CUdeviceptr va = 0;
  ASSERT_EQ(reserve(&va, granularity, granularity, 0, 0), CUDA_SUCCESS);
  ASSERT_EQ(map(va, granularity, 0, handle, 0), CUDA_SUCCESS);

  StuckStream stuck(1);  // a client's wait on device 1 that never completes
  EXPECT_TRUE(ReturnsWhileStuck(stuck, [&] {
    (void)cudaSetDevice(0);
    EXPECT_EQ(cudaFree(device), cudaSuccess);
  })) << "cudaFree on device 0 waited for device 1's stuck stream: the gates cannot be per device";
  EXPECT_TRUE(ReturnsWhileStuck(stuck, [&] {
    (void)cudaSetDevice(0);
    EXPECT_EQ(unmap(va, granularity), CUDA_SUCCESS);
    EXPECT_EQ(address_free(va, granularity), CUDA_SUCCESS);
    EXPECT_EQ(release(handle), CUDA_SUCCESS);
  })) << "the VMM teardown on device 0 waited for device 1's stuck stream";
  // Recorded only: pinned frees pass the host gate (every device's).
  const bool pinned_returned = ReturnsWhileStuck(stuck, [&] {
    (void)cudaSetDevice(0);
    EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess);
  });
  RecordProperty("cudaFreeHost_with_another_device_stuck_returned", pinned_returned ? 1 : 0);
}

}  // namespace
}  // namespace tokensel::testing
