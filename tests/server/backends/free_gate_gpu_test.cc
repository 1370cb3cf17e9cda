// What the FreeGate (server/core/free_gate.h) assumes of the CUDA runtime,
// on real devices (label `gpu`; skips without a GPU, the cross-device cases
// with fewer than two devices). A stream that never completes stands for a
// stream waiting on a client's event that is never recorded: a host
// function that blocks until the test releases it. Each call runs on its
// own thread under a watchdog: past kLimit the stream is released (so the
// call returns) and the call counts as blocked.
//
//  - Request-thread calls (docs/gpu.md, "Calls on request threads"), on the
//    stuck stream's own device and, with two devices, on another device:
//    cudaMalloc, cudaHostAlloc, the VMM Map's sequence
//    (cuMemImportFromShareableHandle of an exported POSIX fd,
//    cuMemAddressReserve, cuMemMap, cuMemSetAccess) and CudaBackend's direct
//    staging API (AllocateStaging, CopyToStaging, CopyFromStaging: on a
//    pooled non-blocking stream, synchronized). Asserted, after EACH of them:
//    the call returned on the host, AND a trivial kernel on a second
//    non-blocking stream of the stuck device (and of the other device)
//    completes (cudaStreamSynchronize under the watchdog): an allocation
//    that ordered later work of other streams behind the stuck one (the
//    Programming Guide's implicit synchronization) would block the next
//    op's own stream synchronization, which the host return alone cannot
//    show (the seventh review's item 6). Not here: cudaIpcOpenMemHandle
//    (reviewed only; needs a second process's handle).
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
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "server/backends/cuda_backend.h"
#include "server/backends/cuda_devices.h"
#include "server/core/free_gate.h"
#include "tests/server/backends/free_gate_gpu_kernel.h"
#include "tests/testing/cuda_driver_entry.h"
#include "tests/testing/gpu_device.h"
#include "tests/testing/status_matchers.h"

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
  bool released() const { return released_.load(); }
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
  // After a timeout released the stream, a later check would pass without
  // testing anything: it fails instead.
  if (stuck.released()) {
    ADD_FAILURE() << "the stuck stream was released by an earlier timeout";
    return false;
  }
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

// A second non-blocking stream on each of some devices, made before
// anything is stuck: after a call under test, a trivial kernel on each must
// complete while the stuck stream still waits.
class Probe {
 public:
  explicit Probe(const std::vector<int>& devices) {
    for (int d : devices) {
      cudaStream_t s = nullptr;
      EXPECT_EQ(cudaSetDevice(d), cudaSuccess);
      EXPECT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
      streams_.emplace_back(d, s);
    }
  }
  ~Probe() {
    for (const auto& [d, s] : streams_) {
      (void)cudaSetDevice(d);
      EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
    }
  }
  Probe(const Probe&) = delete;
  Probe& operator=(const Probe&) = delete;

  void ExpectOthersFlow(StuckStream& stuck, const std::string& after) {
    for (const auto& [d, s] : streams_) {
      const int device = d;
      cudaStream_t const stream = s;
      EXPECT_TRUE(ReturnsWhileStuck(stuck,
                                    [device, stream] {
                                      (void)cudaSetDevice(device);
                                      EXPECT_EQ(LaunchTrivialKernel(stream), cudaSuccess);
                                      EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
                                    }))
          << "after " << after << ", a kernel on another stream of device " << device
          << " waited behind the stuck stream";
    }
  }

 private:
  std::vector<std::pair<int, cudaStream_t>> streams_;
};

// The VMM calls: the client's side (create, export) and the server's Map
// (import, reserve, map, set access) and teardown.
struct Vmm {
  Vmm()
      : create(DriverEntry<PFN_cuMemCreate_v10020>("cuMemCreate")),
        granularity_of(
            DriverEntry<PFN_cuMemGetAllocationGranularity_v10020>("cuMemGetAllocationGranularity")),
        export_fd(
            DriverEntry<PFN_cuMemExportToShareableHandle_v10020>("cuMemExportToShareableHandle")),
        import(DriverEntry<PFN_cuMemImportFromShareableHandle_v10020>(
            "cuMemImportFromShareableHandle")),
        reserve(DriverEntry<PFN_cuMemAddressReserve_v10020>("cuMemAddressReserve")),
        map(DriverEntry<PFN_cuMemMap_v10020>("cuMemMap")),
        set_access(DriverEntry<PFN_cuMemSetAccess_v10020>("cuMemSetAccess")),
        unmap(DriverEntry<PFN_cuMemUnmap_v10020>("cuMemUnmap")),
        address_free(DriverEntry<PFN_cuMemAddressFree_v10020>("cuMemAddressFree")),
        release(DriverEntry<PFN_cuMemRelease_v10020>("cuMemRelease")) {}
  bool ok() const {
    return create && granularity_of && export_fd && import && reserve && map && set_access &&
           unmap && address_free && release;
  }
  PFN_cuMemCreate_v10020 create;
  PFN_cuMemGetAllocationGranularity_v10020 granularity_of;
  PFN_cuMemExportToShareableHandle_v10020 export_fd;
  PFN_cuMemImportFromShareableHandle_v10020 import;
  PFN_cuMemAddressReserve_v10020 reserve;
  PFN_cuMemMap_v10020 map;
  PFN_cuMemSetAccess_v10020 set_access;
  PFN_cuMemUnmap_v10020 unmap;
  PFN_cuMemAddressFree_v10020 address_free;
  PFN_cuMemRelease_v10020 release;
};

CUmemAllocationProp PinnedOn(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

// The request-thread calls on `device` while a stream of `stuck_device`
// waits for ever; after each, the other streams of both devices must flow.
void RequestThreadCallsWhileStuck(int stuck_device, int device) {
  const Vmm vmm;
  ASSERT_TRUE(vmm.ok());
  std::string uuid;
  for (const core::DeviceDescription& d : backends::ListCudaDevices()) {
    if (d.ordinal == device) uuid = d.uuid;
  }
  ASSERT_FALSE(uuid.empty()) << "device " << device;
  // Before anything is stuck: the client's exported allocation, the
  // backend (its streams), the probe streams.
  ASSERT_EQ(cudaSetDevice(device), cudaSuccess);
  const CUmemAllocationProp prop = PinnedOn(device);
  size_t granularity = 0;
  ASSERT_EQ(vmm.granularity_of(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
            CUDA_SUCCESS);
  CUmemGenericAllocationHandle exported = 0;
  ASSERT_EQ(vmm.create(&exported, granularity, &prop, 0), CUDA_SUCCESS);
  int fd = -1;
  ASSERT_EQ(vmm.export_fd(&fd, exported, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
            CUDA_SUCCESS);
  absl::StatusOr<std::unique_ptr<backends::CudaBackend>> backend =
      backends::CudaBackend::Create(uuid);
  ASSERT_OK(backend);
  std::vector<int> probed = {stuck_device};
  if (device != stuck_device) probed.push_back(device);
  Probe probe(probed);

  std::vector<char> host(size_t{1} << 20);
  std::mt19937 rng(device * 31 + stuck_device);
  for (char& c : host) c = static_cast<char>(rng());
  std::vector<char> back(host.size(), 0);
  void* dmem = nullptr;
  void* pinned = nullptr;
  CUmemGenericAllocationHandle imported = 0;
  CUdeviceptr va = 0;
  std::unique_ptr<core::Backend::Staging> staging;
  const std::string on = " on device " + std::to_string(device);
  {
    StuckStream stuck(stuck_device);
    EXPECT_TRUE(ReturnsWhileStuck(stuck,
                                  [&] {
                                    (void)cudaSetDevice(device);
                                    EXPECT_EQ(cudaMalloc(&dmem, 1 << 20), cudaSuccess);
                                  }))
        << "cudaMalloc" << on << " waited behind the stuck stream";
    probe.ExpectOthersFlow(stuck, "cudaMalloc" + on);
    // Pinned memory is mapped into every context: also against a stuck
    // stream of another device.
    EXPECT_TRUE(ReturnsWhileStuck(stuck,
                                  [&] {
                                    (void)cudaSetDevice(device);
                                    EXPECT_EQ(cudaHostAlloc(&pinned, 1 << 20, cudaHostAllocDefault),
                                              cudaSuccess);
                                  }))
        << "cudaHostAlloc" << on << " waited behind the stuck stream";
    probe.ExpectOthersFlow(stuck, "cudaHostAlloc" + on);
    // CudaVmmMapper::Map's driver calls (cuda_vmm_driver.cc).
    EXPECT_TRUE(ReturnsWhileStuck(
        stuck,
        [&] {
          (void)cudaSetDevice(device);
          // The driver API takes a POSIX fd by value in its void* osHandle.
          // NOLINTNEXTLINE(performance-no-int-to-ptr)
          EXPECT_EQ(vmm.import(&imported, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                               CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                    CUDA_SUCCESS);
          EXPECT_EQ(vmm.reserve(&va, granularity, granularity, 0, 0), CUDA_SUCCESS);
          EXPECT_EQ(vmm.map(va, granularity, 0, imported, 0), CUDA_SUCCESS);
          CUmemAccessDesc access{};
          access.location = prop.location;
          access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
          EXPECT_EQ(vmm.set_access(va, granularity, &access, 1), CUDA_SUCCESS);
        }))
        << "the VMM Map's calls" << on << " waited behind the stuck stream";
    probe.ExpectOthersFlow(stuck, "the VMM Map's calls" + on);
    // CudaBackend's direct staging API: its cudaMalloc, zero fill and
    // copies, on a pooled stream (cuda_backend_staging.cc).
    EXPECT_TRUE(
        ReturnsWhileStuck(stuck,
                          [&] {
                            absl::StatusOr<std::unique_ptr<core::Backend::Staging>> s =
                                (*backend)->AllocateStaging(host.size());
                            ASSERT_OK(s);
                            EXPECT_OK((*backend)->CopyToStaging(**s, host.data(), host.size()));
                            EXPECT_OK((*backend)->CopyFromStaging(back.data(), **s, back.size()));
                            staging = *std::move(s);
                          }))
        << "the direct staging API" << on << " waited behind the stuck stream";
    EXPECT_EQ(back, host);
    probe.ExpectOthersFlow(stuck, "the direct staging API" + on);
    if (device == stuck_device) {
      // Recorded only: the gate keeps this away from a stuck device.
      const bool free_returned = ReturnsWhileStuck(stuck, [&] {
        (void)cudaSetDevice(device);
        (void)cudaFree(dmem);
      });
      dmem = nullptr;
      ::testing::Test::RecordProperty("cudaFree_on_the_stuck_device_returned",
                                      free_returned ? 1 : 0);
    }
  }
  (void)cudaSetDevice(device);
  if (dmem != nullptr) {
    EXPECT_EQ(cudaFree(dmem), cudaSuccess);
  }
  EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess);
  if (va != 0) {
    EXPECT_EQ(vmm.unmap(va, granularity), CUDA_SUCCESS);
    EXPECT_EQ(vmm.address_free(va, granularity), CUDA_SUCCESS);
  }
  if (imported != 0) {
    EXPECT_EQ(vmm.release(imported), CUDA_SUCCESS);
  }
  EXPECT_EQ(vmm.release(exported), CUDA_SUCCESS);
  close(fd);
  staging.reset();  // its cudaFree goes to the device gate's drainer
  backend->reset();
  EXPECT_EQ(core::FreeGate::ForDevice(device).AwaitDrained(absl::Seconds(30)), 0u);
}

TEST_F(FreeGateGpuTest, RequestThreadCallsDoNotHoldUpTheirDevice) {
  RequestThreadCallsWhileStuck(0, 0);
}

TEST_F(FreeGateGpuTest, RequestThreadCallsDoNotHoldUpAnotherDevice) {
  if (DeviceCount() < 2) GTEST_SKIP() << "needs two CUDA devices";
  RequestThreadCallsWhileStuck(0, 1);
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
