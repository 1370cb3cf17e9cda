// CudaIpcMapper: maps device allocations that co-located workers export with
// cudaIpcGetMemHandle (RegionSpec = core::CudaIpcSpec). This header includes
// no CUDA headers; the mapper's rules are device-free (cuda_ipc_mapper.cc,
// unit-tested over a fake IpcHandleOps), the driver calls are in
// cuda_ipc_mapper.cu (nvcc) or, in a build without CUDA,
// cuda_ipc_mapper_nocuda.cc, whose open fails with FAILED_PRECONDITION
// "this server was built without CUDA".
//
// The mapper serves only the devices it is given (the backend's: the server
// creates it only for a backend that accesses CUDA device memory, so a CPU
// backend on a GPU host never opens a handle, nor creates a context). A spec
// naming any other device_uuid is FAILED_PRECONDITION before any driver
// call (FAILED_PRECONDITION, as for cuda_vmm: the request is well formed,
// this server does not serve that GPU).
//
// A spec names the 64-byte handle of an allocation *base* plus an offset
// (caching allocators sub-allocate inside one cudaMalloc block), so many
// registrations share a handle. The table of open handles is
// IpcHandleTable (ipc_handle_table.h, device-free and unit-tested): each
// distinct handle is opened once with cudaIpcOpenMemHandle on the device
// the spec names, with cudaIpcMemLazyEnablePeerAccess (the one flag value
// the runtime documents; so the open of another device's memory may
// succeed as a peer mapping, which is refused right after the open, below);
// in the same device scope the driver is asked the allocation's extent
// (cuMemGetAddressRange, through cudaGetDriverEntryPointByVersion, so the
// server does not link libcuda) and the pointer's device
// (cudaPointerGetAttributes). Memory on another device, or an unknown
// extent or device, is refused (CheckOpened) and closed through the gate;
// until that close ran, a spec naming another device for the same handle
// waits for it or is UNAVAILABLE (retry), never "already open"
// (ipc_handle_table.h).
// Handles are refcounted across registrations, and closed
// (cudaIpcCloseMemHandle) when the last region using it is destroyed,
// through that device's FreeGate (server/core/free_gate.h); the gate room
// of a handle is reserved in the share of the peer whose registration
// opened it (CudaIpcSpec::owner: its closes refuse only that peer past its
// share). Regions keep
// the mapper's state alive, so they may outlive the mapper. Every CUDA call
// runs with its device current, restoring the caller's device only if the
// caller had a context (cuda_vmm_device_scope.h).
//
// Errors (messages name the field; RESOURCE_EXHAUSTED when the device has
// too many handles open or waiting to be closed, FreeGate::kMaxPending, or
// the registering peer holds more than its share of them):
//   INVALID_ARGUMENT    not a CudaIpcSpec; handle not exactly 64 bytes;
//                       empty device_uuid; size == 0; a handle the driver
//                       rejects as invalid or as already mapped (an alias)
//   OUT_OF_RANGE        offset + size overflows, or exceeds the allocation
//   FAILED_PRECONDITION a device_uuid the backend does not serve; memory
//                       that lives on another device than device_uuid; the
//                       handle is already open (not refused) on another
//                       device; a build
//                       without CUDA
//   UNAVAILABLE         the handle was opened and refused on another device
//                       and that close has not run yet (its gate closed,
//                       or not within IpcHandleTable::kRefusedCloseWait):
//                       retry
//   INTERNAL            the allocation's extent or device unknown; any other
//                       CUDA failure (with cudaGetErrorString)
//
// Thread-safe (IpcHandleTable: the driver's open runs outside its lock).
#ifndef TOKENSEL_SERVER_MEMORY_CUDA_IPC_MAPPER_H_
#define TOKENSEL_SERVER_MEMORY_CUDA_IPC_MAPPER_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/core/region.h"
#include "server/memory/ipc_handle_table.h"

namespace tokensel::memory {

// Size of a cudaIpcMemHandle_t (CUDA_IPC_HANDLE_SIZE).
inline constexpr size_t kCudaIpcHandleBytes = 64;

// The checks that need no device: handle length, device_uuid present,
// size > 0, offset + size does not overflow. Both builds apply them first.
absl::Status ValidateCudaIpcSpec(const core::CudaIpcSpec& spec);

// A device Map opens handles on (one of the backend's): `ordinal` is the
// CUDA runtime's device number, `uuid` what specs name. (Not
// core::DeviceDescription: this header is compiled by nvcc as C++17.)
struct CudaIpcDevice {
  int ordinal = 0;
  std::string uuid;
};

struct CudaIpcMapperOptions {
  std::vector<CudaIpcDevice> devices;
  // Tests: a fake driver (null: the real one, RealCudaIpcOps()), and a hook
  // run where the region is allocated (it may throw).
  IpcHandleOps* ops = nullptr;
  IpcHandleTable::GateFor gate_for;
  std::function<void()> region_hook;
};

class CudaIpcMapper final : public core::RegionMapper {
 public:
  explicit CudaIpcMapper(CudaIpcMapperOptions options);
  ~CudaIpcMapper() override;
  CudaIpcMapper(const CudaIpcMapper&) = delete;
  CudaIpcMapper& operator=(const CudaIpcMapper&) = delete;

  absl::StatusOr<std::unique_ptr<core::MappedRegion>> Map(const core::RegionSpec& spec) override;

  // Distinct handles currently in the table (opening, open or closing).
  size_t open_handle_count() const;

 private:
  const CudaIpcMapperOptions options_;
  const std::shared_ptr<IpcHandleTable> table_;
};

// The real driver calls (never destroyed: deferred closes use them).
IpcHandleOps* RealCudaIpcOps();

std::unique_ptr<core::RegionMapper> MakeCudaIpcMapper(std::vector<CudaIpcDevice> devices);

}  // namespace tokensel::memory

#endif  // TOKENSEL_SERVER_MEMORY_CUDA_IPC_MAPPER_H_
