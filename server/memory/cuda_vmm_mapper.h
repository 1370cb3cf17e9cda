// CudaVmmMapper: maps CUDA VMM memory (cuMemCreate, PyTorch
// expandable_segments; the client refuses cudaMallocAsync pool memory) that a co-located client
// handed over as a POSIX file descriptor on the fd channel (RegionSpec = core::FdRegionSpec of kind
// kCudaVmm). Such memory cannot be exported with cudaIpcGetMemHandle.
//
// The client exports the physical allocation behind its tensor with
// cuMemExportToShareableHandle(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) and
// registers [offset, offset + size) of it, offset counted from the start of
// the allocation, on the GPU it names by UUID, which must be one of the
// backend's devices (CudaVmmMapperOptions::device_uuids). Map then, on that
// device:
//   cuMemImportFromShareableHandle -> handle
//   cuMemGetAllocationPropertiesFromHandle: the allocation must live on the
//     device the spec names (compared by UUID: CUDA_VISIBLE_DEVICES may
//     number devices differently in client and server), else
//     FAILED_PRECONDITION naming both; a client cannot make the server map
//     memory on a device other than the one the region claims
//   cuMemGetAllocationGranularity (minimum, for the allocation's own
//     properties from its handle) -> g
//   cuMemAddressReserve(len = fd.allocation_size when given, else
//     AlignUp(offset + size, g))
//   cuMemMap(va, len, handle offset 0)   (the driver takes only offset 0)
//   cuMemSetAccess(va, len, read-write on that device)
// and the region is [va + offset, va + offset + size). The region's
// destructor (the buffer's last lease) runs cuMemUnmap, cuMemAddressFree and
// cuMemRelease through the device's FreeGate (server/core/free_gate.h:
// queued for the gate's drainer, which runs it while no stream of that
// device waits on a client's event; its bytes counted until it ran, so an
// unregister gives them back a moment later; Map reserves the room for it
// and allocates the mapping the teardown takes over); every error path
// releases exactly what was acquired, in reverse order. The descriptor is not kept (the imported
// handle holds the memory).
//
// Sizes: allocations are whole multiples of the granularity, so mapping
// AlignUp(offset + size, g) from offset 0 stays inside the allocation iff
// offset + size does: the client's offset and size need no alignment. Some
// drivers refuse a partial map of an imported allocation, so a client that
// knows the allocation's size states it (fd.allocation_size) and exactly
// that is mapped; it must be >= offset + size and a multiple of g
// (INVALID_ARGUMENT naming the field otherwise). The driver says nothing of
// an imported allocation's size before it is mapped; what can be checked
// first is: size > 0, offset + size (and its rounding up) without overflow,
// offset + size and allocation_size <= the device's memory (OUT_OF_RANGE).
// A length cuMemMap refuses (CUDA_ERROR_INVALID_VALUE: larger than the
// allocation, or a partial map the driver does not do) is INVALID_ARGUMENT
// naming offset, size, allocation_size and the length, without claiming
// which, with nothing left mapped.
//
// Several allocations (spec.segments, PassedFd.segments: PyTorch's
// expandable_segments maps a segment as consecutive chunks, each its own
// cuMemCreate allocation, so a large tensor spans several): 1..
// core::kMaxVmmSegments descriptors, each with its allocation_size (> 0,
// whole granules), superseding fd / allocation_size. Checked before any
// driver call: the count, each size > 0, their sum without overflow and
// >= offset + size, and <= the device's memory; each descriptor's type.
// Then every allocation is imported and checked (device by UUID,
// granularity, its place in the buffer granule-aligned) before ONE range of
// the sum is reserved (aligned to the largest granule); allocation i is
// mapped whole at the sum of the sizes before it, and one cuMemSetAccess
// covers the whole range. An allocation smaller than its stated size is
// refused by cuMemMap (INVALID_ARGUMENT naming fd.segments[i]). The cap on
// mapped bytes (per device) counts the sum. Errors name fd.segments[i] and the value.
// Teardown (cuda_vmm_mapping.h, one function for every path): unmap the
// mapped allocations last first, free the reservation, release the
// imported handles last first.
//
// Descriptors (Inspect, when a descriptor arrives; again in Map): the fd is
// an NVIDIA control-device descriptor (/dev/nvidiactl, character device of
// major 195) onto which the driver exported the allocation. Anything else is
// INVALID_ARGUMENT: a regular file (host memory: FD_KIND_HOST_MEMORY), a
// pipe, socket, directory, or another device. Conversely the host mapper
// refuses every non-regular file, so neither kind passes as the other.
// Before that, Inspect and Map answer FAILED_PRECONDITION when this server
// cannot map VMM memory at all (a build without CUDA, no driver, no device).
//
// Errors: INVALID_ARGUMENT (not a kCudaVmm spec, empty fd.device_uuid,
// size 0, wrong descriptor type, a descriptor the driver cannot import,
// whatever the driver's CUresult; fd.allocation_size below offset + size or
// not whole granules; a length cuMemMap refuses),
// OUT_OF_RANGE (overflow, past the device memory),
// FAILED_PRECONDITION (no CUDA / no device; device_uuid not one of the
// backend's devices or not visible; the
// allocation on another device, or in host memory), RESOURCE_EXHAUSTED (the
// driver is out of memory or address space; the device's cap on mapped
// bytes, max_mapped_bytes_per_device / mapped_device_memory_multiple; the device's
// FreeGate room, server/core/free_gate.h: mappings live or waiting for their
// deferred teardown, or more than its max_deferred_bytes waiting), INTERNAL
// (other driver errors,
// with the CUresult's name).
//
// The driver is reached through CudaVmmDriver (cuda_vmm_driver.h), so the
// sequence and its cleanup are unit-tested with a fake driver. Thread-safe:
// its one mutable state is the atomic counts of mapped bytes, one per device
// slot (server/core/device_slot.h; the driver's calls are thread-safe).
#ifndef TOKENSEL_SERVER_MEMORY_CUDA_VMM_MAPPER_H_
#define TOKENSEL_SERVER_MEMORY_CUDA_VMM_MAPPER_H_

#include <sys/stat.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/core/device_slot.h"
#include "server/core/region.h"
#include "server/memory/cuda_vmm_driver.h"

namespace tokensel::memory {

// The character-device major of the NVIDIA driver's nodes (/dev/nvidia*,
// /dev/nvidiactl), fixed by the driver (NV_MAJOR_DEVICE_NUMBER).
inline constexpr unsigned kNvidiaDeviceMajor = 195;

// The descriptor check of Inspect and Map, on the fstat of the descriptor:
// OK only for a character device of major `nvidia_major`.
absl::Status CheckVmmDescriptor(const struct stat& st, unsigned nvidia_major);

struct CudaVmmMapperOptions {
  // The devices this mapper serves (UUIDs, FormatGpuUuid spelling): the
  // backend's own (Backend::devices()). A spec naming any other device, even
  // one the driver sees, is FAILED_PRECONDITION before any driver call: the
  // server must not create a context on, and map memory of, a GPU its
  // backend does not use.
  std::vector<std::string> device_uuids;
  // Cap on the bytes mapped at once on ONE device (buffer quotas count
  // buffers, not bytes, and each mapping costs page tables in device
  // memory): the sum of the mapped lengths L of the device's live regions
  // and of its teardowns still deferred (their bytes stay counted until
  // they ran, free_gate.h). Per device: register / unregister churn behind
  // a stuck client wait on device k fills k's share only, never another
  // device's. A device's cap is the lesser of max_mapped_bytes_per_device
  // and mapped_device_memory_multiple x its memory (0: no such cap); the
  // mapper maps at most the sum of its devices' caps. A Map that would
  // pass its device's cap is RESOURCE_EXHAUSTED naming both and the
  // device, before any driver call that acquires anything. The server sets
  // the multiple to 4 (4x each device's memory: in sum what one cap of 4x
  // the backend's memory was).
  uint64_t max_mapped_bytes_per_device = UINT64_MAX;
  uint64_t mapped_device_memory_multiple = 0;
  // For tests (which cannot make an NVIDIA descriptor).
  unsigned nvidia_major = kNvidiaDeviceMajor;
};

class CudaVmmMapper final : public core::RegionMapper {
 public:
  // `driver` must outlive the mapper and every region it mapped.
  CudaVmmMapper(CudaVmmDriver* driver, CudaVmmMapperOptions options);

  absl::StatusOr<core::FdInfo> Inspect(int fd) const override;
  absl::StatusOr<std::unique_ptr<core::MappedRegion>> Map(const core::RegionSpec& spec) override;

 private:
  CudaVmmDriver* const driver_;
  const CudaVmmMapperOptions options_;
  // Bytes mapped by live regions and pending teardowns, per device slot
  // (shared: a region may outlive the mapper).
  std::shared_ptr<std::array<std::atomic<uint64_t>, core::kDeviceSlots>> mapped_bytes_;
  // The cap on device `d` (see CudaVmmMapperOptions).
  uint64_t CapOf(const VmmDevice& d) const;
};

// The mapper over the process's real driver (a build without CUDA: every
// Inspect and Map answers FAILED_PRECONDITION). The server makes one only
// for a backend that accesses CUDA device memory, with its devices.
std::unique_ptr<core::RegionMapper> MakeCudaVmmMapper(CudaVmmMapperOptions options);
// Whether the real driver can map VMM memory here (GetServerInfo lists the
// "cuda_vmm" memory kind only then).
absl::Status CudaVmmAvailable();

}  // namespace tokensel::memory

#endif  // TOKENSEL_SERVER_MEMORY_CUDA_VMM_MAPPER_H_
