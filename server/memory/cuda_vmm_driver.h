// CudaVmmDriver: the CUDA driver calls CudaVmmMapper makes, behind one small
// interface, so the import / map / set-access / unmap / release sequence and
// its cleanup on every error path are unit-tested without a GPU (a fake
// driver counts every acquire and release). No CUDA header here.
//
// The real driver (RealCudaVmmDriver(), cuda_vmm_driver.cc) reaches the
// driver API through the runtime's cudaGetDriverEntryPointByVersion, which
// the server already links: the server does not link libcuda at build time
// and still starts on a machine without a driver (Available() then says why
// VMM memory cannot be mapped). A build without CUDA gets a driver whose
// Available() is FAILED_PRECONDITION "built without CUDA".
//
// Results are CUresult values (0 = CUDA_SUCCESS); ErrorName() names them.
// Every call that acts on a device takes the device's ordinal (in this
// process's numbering) and makes it current for the call.
#ifndef TOKENSEL_SERVER_MEMORY_CUDA_VMM_DRIVER_H_
#define TOKENSEL_SERVER_MEMORY_CUDA_VMM_DRIVER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tokensel::memory {

struct VmmDevice {
  int ordinal = 0;
  std::string uuid;  // FormatGpuUuid spelling
  uint64_t total_memory_bytes = 0;
};

// Where an allocation lives (CUmemLocation of its properties).
struct VmmLocation {
  bool on_device = false;  // CU_MEM_LOCATION_TYPE_DEVICE
  int type = 0;            // the CUmemLocationType, for messages
  int ordinal = -1;        // the device, when on_device
};

class CudaVmmDriver {
 public:
  using Handle = uint64_t;  // CUmemGenericAllocationHandle
  using Result = int;       // CUresult

  // Result codes the mapper tells apart (CUresult values).
  static constexpr Result kSuccess = 0;
  static constexpr Result kInvalidValue = 1;     // CUDA_ERROR_INVALID_VALUE
  static constexpr Result kOutOfMemory = 2;      // CUDA_ERROR_OUT_OF_MEMORY
  static constexpr Result kInvalidDevice = 101;  // CUDA_ERROR_INVALID_DEVICE
  static constexpr Result kInvalidHandle = 400;  // CUDA_ERROR_INVALID_HANDLE
  static constexpr Result kNotSupported = 801;   // CUDA_ERROR_NOT_SUPPORTED

  virtual ~CudaVmmDriver() = default;

  // OK when VMM memory can be mapped here; else FAILED_PRECONDITION saying
  // why (no CUDA in the build, no driver or entry point, no device).
  virtual absl::Status Available() = 0;
  virtual absl::StatusOr<std::vector<VmmDevice>> Devices() = 0;

  // cuMemImportFromShareableHandle(POSIX_FILE_DESCRIPTOR), on `device`.
  virtual Result Import(int device, int fd, Handle* handle) = 0;
  // cuMemGetAllocationPropertiesFromHandle: the allocation's location.
  virtual Result Location(int device, Handle handle, VmmLocation* location) = 0;
  // cuMemGetAllocationGranularity(MINIMUM) for the imported allocation's
  // own properties (cuMemGetAllocationPropertiesFromHandle of `handle`), not
  // made-up ones: its handle types, location and flags decide the granule.
  virtual Result Granularity(int device, Handle handle, uint64_t* bytes) = 0;
  // cuMemAddressReserve(size, alignment).
  virtual Result Reserve(int device, uint64_t size, uint64_t alignment, uint64_t* va) = 0;
  // cuMemMap(va, size, offset 0, handle).
  virtual Result Map(int device, uint64_t va, uint64_t size, Handle handle) = 0;
  // cuMemSetAccess(va, size, read-write for `device`).
  virtual Result SetAccess(int device, uint64_t va, uint64_t size) = 0;
  // cuMemUnmap, cuMemAddressFree, cuMemRelease.
  virtual Result Unmap(int device, uint64_t va, uint64_t size) = 0;
  virtual Result Free(int device, uint64_t va, uint64_t size) = 0;
  virtual Result Release(int device, Handle handle) = 0;

  // "CUDA_ERROR_INVALID_VALUE (1)".
  virtual std::string ErrorName(Result result) = 0;
};

// The process's driver (a static instance; never destroyed).
CudaVmmDriver* RealCudaVmmDriver();

}  // namespace tokensel::memory

#endif  // TOKENSEL_SERVER_MEMORY_CUDA_VMM_DRIVER_H_
