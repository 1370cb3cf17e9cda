// The real CudaVmmDriver (CUDA build). See cuda_vmm_driver.h.
//
// Every driver function is looked up once with cudaGetDriverEntryPointByVersion
// (the runtime is linked statically; libcuda is loaded by the runtime at run
// time), so the server has no link-time dependency on libcuda and starts
// without a driver. Each call runs with its device current (RunOnDevice,
// cuda_vmm_device_scope.h: cudaSetDevice, which also makes the device's
// primary context current, the context the backend's kernels run in), and
// restores the caller's device only if the caller had a current context.
#include "server/memory/cuda_vmm_driver.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "kernels/cuda/device.h"
#include "server/memory/cuda_vmm_device_scope.h"

namespace tokensel::memory {
namespace {

static_assert(CudaVmmDriver::kInvalidValue == CUDA_ERROR_INVALID_VALUE);
static_assert(CudaVmmDriver::kOutOfMemory == CUDA_ERROR_OUT_OF_MEMORY);
static_assert(CudaVmmDriver::kInvalidDevice == CUDA_ERROR_INVALID_DEVICE);
static_assert(CudaVmmDriver::kInvalidHandle == CUDA_ERROR_INVALID_HANDLE);
static_assert(CudaVmmDriver::kNotSupported == CUDA_ERROR_NOT_SUPPORTED);
static_assert(sizeof(CUmemGenericAllocationHandle) == sizeof(CudaVmmDriver::Handle));

template <typename Fn>
bool Resolve(const char* name, int version, Fn* out, std::string* missing) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult query = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t err =
      cudaGetDriverEntryPointByVersion(name, &p, version, cudaEnableDefault, &query);
  if (err != cudaSuccess || query != cudaDriverEntryPointSuccess || p == nullptr) {
    cudaGetLastError();
    absl::StrAppend(missing, missing->empty() ? "" : ", ", name);
    return false;
  }
  *out = reinterpret_cast<Fn>(p);
  return true;
}

CUmemLocation DeviceLocation(int device) {
  CUmemLocation location{};
  location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  location.id = device;
  return location;
}

// The runtime's side of RunOnDevice.
class RuntimeOps final : public DeviceSwitchOps {
 public:
  explicit RuntimeOps(PFN_cuCtxGetCurrent_v4000 get_current) : get_current_(get_current) {}
  bool HasCurrentContext() override {
    CUcontext ctx = nullptr;
    return get_current_ != nullptr && get_current_(&ctx) == CUDA_SUCCESS && ctx != nullptr;
  }
  bool GetDevice(int* device) override { return Ok(cudaGetDevice(device)); }
  bool SetDevice(int device) override { return Ok(cudaSetDevice(device)); }
  void RestoreFailed(int device) override {
    TS_LOG(ERROR) << "cudaSetDevice(" << device << ") after a cuda_vmm or cuda_ipc call failed";
  }

 private:
  static bool Ok(cudaError_t err) {
    if (err == cudaSuccess) return true;
    cudaGetLastError();
    return false;
  }
  PFN_cuCtxGetCurrent_v4000 get_current_;
};

class RealDriver final : public CudaVmmDriver {
 public:
  absl::Status Available() override {
    std::call_once(once_, [this] { Init(); });
    return available_;
  }
  absl::StatusOr<std::vector<VmmDevice>> Devices() override {
    RETURN_IF_ERROR(Available());
    return devices_;
  }

  Result Import(int device, int fd, Handle* handle) override {
    return OnDevice(device, [&] {
      CUmemGenericAllocationHandle h = 0;
      // The driver API takes a POSIX fd by value in its void* osHandle.
      // NOLINTNEXTLINE(performance-no-int-to-ptr)
      const CUresult r = import_(&h, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                                 CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
      *handle = h;
      return r;
    });
  }
  Result Location(int device, Handle handle, VmmLocation* location) override {
    return OnDevice(device, [&] {
      CUmemAllocationProp prop{};
      const CUresult r = properties_(&prop, handle);
      if (r == CUDA_SUCCESS) {
        location->on_device = prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE;
        location->type = static_cast<int>(prop.location.type);
        location->ordinal = prop.location.id;
      }
      return r;
    });
  }
  Result Granularity(int device, Handle handle, uint64_t* bytes) override {
    return OnDevice(device, [&] {
      // The allocation's own properties: a made-up prop (pinned, POSIX fd,
      // this device) could differ from what the exporter created (other
      // handle types, compression, ...) and so give another granule.
      CUmemAllocationProp prop{};
      CUresult r = properties_(&prop, handle);
      if (r != CUDA_SUCCESS) return r;
      size_t g = 0;
      r = granularity_(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
      *bytes = g;
      return r;
    });
  }
  Result Reserve(int device, uint64_t size, uint64_t alignment, uint64_t* va) override {
    return OnDevice(device, [&] {
      CUdeviceptr p = 0;
      const CUresult r = reserve_(&p, size, alignment, 0, 0);
      *va = p;
      return r;
    });
  }
  Result Map(int device, uint64_t va, uint64_t size, Handle handle) override {
    return OnDevice(device, [&] { return map_(va, size, 0, handle, 0); });
  }
  Result SetAccess(int device, uint64_t va, uint64_t size) override {
    return OnDevice(device, [&] {
      CUmemAccessDesc desc{};
      desc.location = DeviceLocation(device);
      desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      return set_access_(va, size, &desc, 1);
    });
  }
  Result Unmap(int device, uint64_t va, uint64_t size) override {
    return OnDevice(device, [&] { return unmap_(va, size); });
  }
  Result Free(int device, uint64_t va, uint64_t size) override {
    return OnDevice(device, [&] { return free_(va, size); });
  }
  Result Release(int device, Handle handle) override {
    return OnDevice(device, [&] { return release_(handle); });
  }

  std::string ErrorName(Result result) override {
    const char* name = nullptr;
    if (error_name_ != nullptr &&
        error_name_(static_cast<CUresult>(result), &name) == CUDA_SUCCESS && name != nullptr) {
      return absl::StrCat(name, " (", result, ")");
    }
    return absl::StrCat("CUresult ", result);
  }

 private:
  void Init() {
    // No device is the common case on a CPU-only machine: say that first.
    absl::StatusOr<std::vector<kernels::cuda::DeviceInfo>> devices = kernels::cuda::ListDevices();
    if (!devices.ok()) {
      available_ = absl::FailedPreconditionError(
          absl::StrCat("cuda_vmm: cannot list the CUDA devices: ", devices.status().message()));
      return;
    }
    if (devices->empty()) {
      available_ = absl::FailedPreconditionError(
          "cuda_vmm: the server sees no CUDA device, so it cannot map CUDA VMM memory");
      return;
    }
    for (const auto& d : *devices) devices_.push_back({d.ordinal, d.uuid, d.total_memory_bytes});
    std::string missing;
    Resolve("cuGetErrorName", 6000, &error_name_, &missing);
    Resolve("cuCtxGetCurrent", 4000, &ctx_get_current_, &missing);
    missing.clear();  // optional: ErrorName falls back to the number; no
                      // cuCtxGetCurrent means "no context": nothing restored
    Resolve("cuMemImportFromShareableHandle", 10020, &import_, &missing);
    Resolve("cuMemGetAllocationPropertiesFromHandle", 10020, &properties_, &missing);
    Resolve("cuMemGetAllocationGranularity", 10020, &granularity_, &missing);
    Resolve("cuMemAddressReserve", 10020, &reserve_, &missing);
    Resolve("cuMemMap", 10020, &map_, &missing);
    Resolve("cuMemSetAccess", 10020, &set_access_, &missing);
    Resolve("cuMemUnmap", 10020, &unmap_, &missing);
    Resolve("cuMemAddressFree", 10020, &free_, &missing);
    Resolve("cuMemRelease", 10020, &release_, &missing);
    if (!missing.empty()) {
      available_ = absl::FailedPreconditionError(absl::StrCat(
          "cuda_vmm: the CUDA driver does not provide ", missing, " (driver too old?)"));
    }
  }

  // Runs `f` with `device` current (see cuda_vmm_device_scope.h).
  template <typename F>
  Result OnDevice(int device, F f) {
    RuntimeOps ops(ctx_get_current_);
    return RunOnDevice(ops, device, CUDA_ERROR_INVALID_DEVICE,
                       [&] { return static_cast<Result>(f()); });
  }

  std::once_flag once_;
  absl::Status available_;          // set once by Init
  std::vector<VmmDevice> devices_;  // set once by Init
  PFN_cuGetErrorName_v6000 error_name_ = nullptr;
  PFN_cuCtxGetCurrent_v4000 ctx_get_current_ = nullptr;
  PFN_cuMemImportFromShareableHandle_v10020 import_ = nullptr;
  PFN_cuMemGetAllocationPropertiesFromHandle_v10020 properties_ = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 granularity_ = nullptr;
  PFN_cuMemAddressReserve_v10020 reserve_ = nullptr;
  PFN_cuMemMap_v10020 map_ = nullptr;
  PFN_cuMemSetAccess_v10020 set_access_ = nullptr;
  PFN_cuMemUnmap_v10020 unmap_ = nullptr;
  PFN_cuMemAddressFree_v10020 free_ = nullptr;
  PFN_cuMemRelease_v10020 release_ = nullptr;
};

}  // namespace

DeviceSwitchOps& RuntimeDeviceSwitchOps() {
  // Stateless but for the entry point: shared, never destroyed.
  static RuntimeOps* const ops = [] {
    PFN_cuCtxGetCurrent_v4000 get_current = nullptr;
    std::string missing;  // without it: "no context", nothing restored
    Resolve("cuCtxGetCurrent", 4000, &get_current, &missing);
    return new RuntimeOps(get_current);
  }();
  return *ops;
}

CudaVmmDriver* RealCudaVmmDriver() {
  static RealDriver* const driver = new RealDriver();  // never destroyed: regions may outlive main
  return driver;
}

}  // namespace tokensel::memory
