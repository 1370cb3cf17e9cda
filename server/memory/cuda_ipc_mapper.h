// CudaIpcMapper: maps device allocations that co-located workers export with
// cudaIpcGetMemHandle (RegionSpec = core::CudaIpcSpec). This header includes
// no CUDA headers; the implementation is cuda_ipc_mapper.cu (nvcc) or, in a
// build without CUDA, cuda_ipc_mapper_nocuda.cc, whose Map validates the
// spec and then fails with FAILED_PRECONDITION "this server was built
// without CUDA".
//
// A spec names the 64-byte handle of an allocation *base* plus an offset
// (caching allocators sub-allocate inside one cudaMalloc block), so many
// registrations share a handle. The table of open handles is
// IpcHandleTable (ipc_handle_table.h, device-free and unit-tested): each
// distinct handle is opened once with cudaIpcOpenMemHandle on the device
// whose UUID the spec names, refcounted across registrations, and closed
// (cudaIpcCloseMemHandle) when the last region using it is destroyed,
// through that device's FreeGate (server/core/free_gate.h): deferred while
// a stream of the device waits on a client's event; meanwhile the handle
// stays open and a new registration of it reuses it. Regions keep the
// mapper's state alive, so they may outlive the mapper. Every CUDA call
// runs with its device current, restoring the caller's device only if the
// caller had a context (cuda_vmm_device_scope.h).
//
// Bounds: offset + size is checked for overflow, then against the size of
// the allocation behind the handle, which is read with the driver's
// cuMemGetAddressRange (reached through cudaGetDriverEntryPointByVersion,
// so the server does not link libcuda). If the driver cannot provide it,
// the client-provided size is trusted up to the device's total memory (a
// sanity bound) and a warning is logged once.
//
// Errors (messages name the field; RESOURCE_EXHAUSTED when the device has
// too many handles open or waiting to be closed, FreeGate::kMaxPending):
//   INVALID_ARGUMENT    not a CudaIpcSpec; handle not exactly 64 bytes;
//                       empty device_uuid; size == 0; a handle the driver
//                       rejects as invalid
//   OUT_OF_RANGE        offset + size overflows, or exceeds the allocation
//                       (or, without the allocation size, the device memory)
//   FAILED_PRECONDITION no CUDA device; no visible device with that UUID;
//                       the handle is already open on another device; a
//                       build without CUDA
//   INTERNAL            any other CUDA failure (with cudaGetErrorString)
//
// Thread-safe: one mutex guards the table of open handles; it is held
// across cudaIpcOpenMemHandle so a handle is never opened twice, and never
// across a close.
#ifndef TOKENSEL_SERVER_MEMORY_CUDA_IPC_MAPPER_H_
#define TOKENSEL_SERVER_MEMORY_CUDA_IPC_MAPPER_H_

#include <cstddef>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/core/region.h"

namespace tokensel::memory {

// Size of a cudaIpcMemHandle_t (CUDA_IPC_HANDLE_SIZE).
inline constexpr size_t kCudaIpcHandleBytes = 64;

// The checks that need no device: handle length, device_uuid present,
// size > 0, offset + size does not overflow. Both builds apply them first.
absl::Status ValidateCudaIpcSpec(const core::CudaIpcSpec& spec);

class CudaIpcMapper final : public core::RegionMapper {
 public:
  CudaIpcMapper();
  ~CudaIpcMapper() override;
  CudaIpcMapper(const CudaIpcMapper&) = delete;
  CudaIpcMapper& operator=(const CudaIpcMapper&) = delete;

  absl::StatusOr<std::unique_ptr<core::MappedRegion>> Map(const core::RegionSpec& spec) override;

  // Distinct handles currently open (always 0 without CUDA).
  size_t open_handle_count() const;

  struct State;  // defined by the implementation file

 private:
  std::shared_ptr<State> state_;
};

std::unique_ptr<core::RegionMapper> MakeCudaIpcMapper();

}  // namespace tokensel::memory

#endif  // TOKENSEL_SERVER_MEMORY_CUDA_IPC_MAPPER_H_
