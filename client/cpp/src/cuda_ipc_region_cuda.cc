// CudaIpcRegion in CUDA builds (runtime API; cuMemGetAddressRange through the
// runtime's driver entry point, so no libcuda link is needed).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/gpu_uuid.h"
#include "tokensel/client/cuda_ipc_region.h"

namespace tokensel::client {
namespace {

static_assert(sizeof(cudaIpcMemHandle_t) == CudaIpcRegion::kHandleBytes,
              "cudaIpcMemHandle_t is not 64 bytes");

absl::Status CudaError(absl::string_view what, cudaError_t err) {
  cudaGetLastError();  // clear a non-sticky error
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(err)));
}

PFN_cuMemGetAddressRange_v3020 AddressRangeFn() {
  static const PFN_cuMemGetAddressRange_v3020 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult query = cudaDriverEntryPointSymbolNotFound;
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &p, 3020,
                                                             cudaEnableDefault, &query);
    if (err != cudaSuccess || query != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return static_cast<PFN_cuMemGetAddressRange_v3020>(nullptr);
    }
    return reinterpret_cast<PFN_cuMemGetAddressRange_v3020>(p);
  }();
  return fn;
}

// Makes `device` current and restores the previous one on destruction.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) {
    ok_ = cudaGetDevice(&previous_) == cudaSuccess;
    if (ok_ && previous_ != device) ok_ = cudaSetDevice(device) == cudaSuccess;
  }
  ~ScopedDevice() {
    if (ok_) cudaSetDevice(previous_);
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;
  bool ok() const { return ok_; }

 private:
  int previous_ = 0;
  bool ok_ = false;
};

}  // namespace

bool CudaIpcRegion::BuiltWithCuda() { return true; }

absl::StatusOr<CudaIpcRegion> CudaIpcRegion::FromDevicePointer(const void* ptr, uint64_t size) {
  if (ptr == nullptr) return absl::InvalidArgumentError("CudaIpcRegion: null device pointer");
  cudaPointerAttributes attributes{};
  cudaError_t err = cudaPointerGetAttributes(&attributes, ptr);
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) {
    cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat("CudaIpcRegion: no usable CUDA device: ", cudaGetErrorString(err)));
  }
  if (err != cudaSuccess) return CudaError("cudaPointerGetAttributes", err);
  if (attributes.type != cudaMemoryTypeDevice) {
    return absl::InvalidArgumentError(
        "CudaIpcRegion: the pointer is not device memory from cudaMalloc");
  }
  ScopedDevice scope(attributes.device);
  if (!scope.ok()) {
    cudaGetLastError();
    return absl::InternalError(absl::StrCat("cudaSetDevice(", attributes.device, ") failed"));
  }
  const PFN_cuMemGetAddressRange_v3020 address_range = AddressRangeFn();
  if (address_range == nullptr) {
    return absl::FailedPreconditionError(
        "CudaIpcRegion: the driver does not provide cuMemGetAddressRange");
  }
  CUdeviceptr base = 0;
  size_t extent = 0;
  const CUresult cu = address_range(&base, &extent, reinterpret_cast<CUdeviceptr>(ptr));
  if (cu != CUDA_SUCCESS) {
    return absl::InvalidArgumentError(
        absl::StrCat("CudaIpcRegion: cuMemGetAddressRange failed (CUresult ", cu,
                     "): not a cudaMalloc allocation"));
  }
  const uint64_t offset = reinterpret_cast<uintptr_t>(ptr) - static_cast<uint64_t>(base);
  if (size > extent - offset) {
    return absl::InvalidArgumentError(absl::StrCat("CudaIpcRegion: offset ", offset, " + size ",
                                                   size, " is past the allocation of ", extent,
                                                   " bytes"));
  }
  cudaIpcMemHandle_t handle;
  err = cudaIpcGetMemHandle(&handle, reinterpret_cast<void*>(base));
  if (err != cudaSuccess) return CudaError("cudaIpcGetMemHandle", err);
  cudaDeviceProp prop;
  err = cudaGetDeviceProperties(&prop, attributes.device);
  if (err != cudaSuccess) return CudaError("cudaGetDeviceProperties", err);

  CudaIpcRegion region;
  region.handle_.assign(reinterpret_cast<const char*>(&handle), sizeof(handle));
  region.device_uuid_ = FormatGpuUuid(prop.uuid.bytes);
  region.offset_ = offset;
  region.size_ = size;
  return region;
}

}  // namespace tokensel::client
