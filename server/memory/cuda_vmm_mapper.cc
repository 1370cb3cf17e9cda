// CudaVmmMapper: see cuda_vmm_mapper.h for the contract. Device-free: every
// CUDA call goes through CudaVmmDriver, so this file builds (and is tested)
// without CUDA.
#include "server/memory/cuda_vmm_mapper.h"

#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <atomic>
#include <cerrno>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/errno_string.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "server/core/free_gate.h"
#include "server/memory/file_type.h"

namespace tokensel::memory {
namespace {

using Result = CudaVmmDriver::Result;
using Handle = CudaVmmDriver::Handle;

// The acquired parts of one mapping, released in reverse order by Undo():
// the one cleanup of every error path and of the region's destructor.
struct Mapping {
  CudaVmmDriver* driver = nullptr;
  int device = 0;
  Handle handle = 0;
  bool imported = false;
  uint64_t va = 0;
  uint64_t length = 0;
  bool reserved = false;
  bool mapped = false;
  std::shared_ptr<std::atomic<uint64_t>> counted;  // holds `length` of the cap
  uint64_t counted_bytes = 0;

  void Undo() {
    if (mapped) Log("cuMemUnmap", driver->Unmap(device, va, length));
    if (reserved) Log("cuMemAddressFree", driver->Free(device, va, length));
    if (imported) Log("cuMemRelease", driver->Release(device, handle));
    if (counted != nullptr) counted->fetch_sub(counted_bytes);
    counted = nullptr;
    mapped = reserved = imported = false;
  }
  void Log(absl::string_view what, Result r) const {
    if (r != CudaVmmDriver::kSuccess) {
      TS_LOG(ERROR) << what << " of a cuda_vmm region: " << driver->ErrorName(r);
    }
  }
};

// Undoes a Mapping unless released to a region.
class MappingGuard {
 public:
  explicit MappingGuard(Mapping* m) : m_(m) {}
  ~MappingGuard() {
    if (m_ != nullptr) m_->Undo();
  }
  void Dismiss() { m_ = nullptr; }
  MappingGuard(const MappingGuard&) = delete;
  MappingGuard& operator=(const MappingGuard&) = delete;

 private:
  Mapping* m_;
};

// A FreeGate::Deferred function: undoes and deletes the Mapping at `m`.
void UndoLater(void* m, intptr_t /*unused*/) {
  std::unique_ptr<Mapping> mapping(static_cast<Mapping*>(m));
  mapping->Undo();
}

class VmmRegion final : public core::MappedRegion {
 public:
  VmmRegion(Mapping mapping, uint64_t offset, uint64_t size, std::string uuid)
      : mapping_(std::move(mapping)), offset_(offset), size_(size), uuid_(std::move(uuid)) {}
  // cuMemUnmap / cuMemRelease may synchronize the device: through the
  // process's FreeGate (server/core/free_gate.h), deferred while a stream
  // waits on a client's event; its bytes stay counted against
  // max_mapped_bytes until then. The driver outlives the deferral (the
  // real one is never destroyed). Should the copy fail to allocate, the
  // mapping is undone now.
  ~VmmRegion() override {
    std::unique_ptr<Mapping> later(new (std::nothrow) Mapping(std::move(mapping_)));
    if (later == nullptr) {
      mapping_.Undo();
      return;
    }
    const uint64_t bytes = later->counted_bytes;
    // Owned by the entry from here: UndoLater deletes it (a dropped entry,
    // beyond the gate's bound, leaks it: free_gate.h).
    core::FreeGate::Process().FreeOrDefer({&UndoLater, later.release(), 0, bytes});
  }  // NOLINT(clang-analyzer-cplusplus.NewDeleteLeaks): the entry owns it
  VmmRegion(const VmmRegion&) = delete;
  VmmRegion& operator=(const VmmRegion&) = delete;

  void* data() const override {
    // The mapping's device virtual address (a CUdeviceptr) as a pointer.
    // NOLINTNEXTLINE(performance-no-int-to-ptr)
    return reinterpret_cast<void*>(static_cast<uintptr_t>(mapping_.va + offset_));
  }
  uint64_t size() const override { return size_; }
  core::MemoryKind memory_kind() const override { return core::MemoryKind::kCudaDevice; }
  std::string device_uuid() const override { return uuid_; }

 private:
  Mapping mapping_;
  const uint64_t offset_;
  const uint64_t size_;
  const std::string uuid_;
};

absl::Status DriverError(CudaVmmDriver* driver, absl::string_view what, Result r) {
  const std::string name = driver->ErrorName(r);
  if (r == CudaVmmDriver::kOutOfMemory) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cuda_vmm: ", what, ": out of device memory or address space (", name, ")"));
  }
  return absl::InternalError(absl::StrCat("cuda_vmm: ", what, " failed: ", name));
}

}  // namespace

absl::Status CheckVmmDescriptor(const struct stat& st, unsigned nvidia_major) {
  if (S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        "fd: a regular file is not a CUDA VMM descriptor (host memory is sent as "
        "FD_KIND_HOST_MEMORY; FD_KIND_CUDA_VMM takes the descriptor of "
        "cuMemExportToShareableHandle(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))");
  }
  if (!S_ISCHR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fd: a ", FileTypeName(st.st_mode),
        " is not a CUDA VMM descriptor (pass the descriptor of cuMemExportToShareableHandle)"));
  }
  if (major(st.st_rdev) != nvidia_major) {
    return absl::InvalidArgumentError(
        absl::StrCat("fd: character device ", major(st.st_rdev), ":", minor(st.st_rdev),
                     " is not an NVIDIA device (major ", nvidia_major,
                     "); pass the descriptor of cuMemExportToShareableHandle"));
  }
  return absl::OkStatus();
}

CudaVmmMapper::CudaVmmMapper(CudaVmmDriver* driver, CudaVmmMapperOptions options)
    : driver_(driver),
      options_(std::move(options)),
      mapped_bytes_(std::make_shared<std::atomic<uint64_t>>(0)) {}

absl::StatusOr<core::FdInfo> CudaVmmMapper::Inspect(int fd) const {
  RETURN_IF_ERROR(driver_->Available());
  if (fd < 0) return absl::InvalidArgumentError("fd: no file descriptor");
  struct stat st;
  if (fstat(fd, &st) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("fd: fstat failed: ", ErrnoString(errno)));
  }
  RETURN_IF_ERROR(CheckVmmDescriptor(st, options_.nvidia_major));
  // The driver tells an imported allocation's size only once it is mapped:
  // FdChannelReply.object_size is 0 for VMM descriptors.
  return core::FdInfo{};
}

absl::StatusOr<std::unique_ptr<core::MappedRegion>> CudaVmmMapper::Map(
    const core::RegionSpec& spec) {
  const auto* fd_spec = std::get_if<core::FdRegionSpec>(&spec);
  if (fd_spec == nullptr || fd_spec->kind != core::FdKind::kCudaVmm) {
    return absl::InvalidArgumentError(
        absl::StrCat("the cuda_vmm mapper cannot map a ", core::RegionKindName(spec), " region"));
  }
  // Read once: the spec is server-private already, but every value that
  // decides an address is taken into a local here and used from it.
  const uint64_t offset = fd_spec->offset;
  const uint64_t size = fd_spec->size;
  const std::string uuid = fd_spec->device_uuid;
  const uint64_t allocation_size = fd_spec->allocation_size;  // 0 = unknown
  if (uuid.empty()) return absl::InvalidArgumentError("fd.device_uuid is empty (cuda_vmm)");
  if (size == 0) return absl::InvalidArgumentError("fd.size must be > 0");
  if (size > UINT64_MAX - offset) {
    return absl::OutOfRangeError(
        absl::StrCat("fd.offset ", offset, " + fd.size ", size, " overflows a 64-bit integer"));
  }
  const uint64_t end = offset + size;
  if (allocation_size != 0 && allocation_size < end) {
    return absl::InvalidArgumentError(
        absl::StrCat("fd.allocation_size ", allocation_size, " is less than fd.offset ", offset,
                     " + fd.size ", size, " = ", end, " (the memory must lie in the allocation)"));
  }
  // Only the backend's own devices, before any driver call: a client naming
  // another GPU must not make the server create a context there.
  bool served = false;
  for (const std::string& u : options_.device_uuids) served |= absl::EqualsIgnoreCase(u, uuid);
  if (!served) {
    return absl::FailedPreconditionError(absl::StrCat(
        "fd.device_uuid \"", uuid, "\" is not a device of this server's backend (",
        options_.device_uuids.empty() ? "none" : absl::StrJoin(options_.device_uuids, ", "), ")"));
  }
  RETURN_IF_ERROR(Inspect(fd_spec->fd != nullptr ? fd_spec->fd->get() : -1).status());

  ASSIGN_OR_RETURN(const std::vector<VmmDevice> devices, driver_->Devices());
  const VmmDevice* device = nullptr;
  for (const VmmDevice& d : devices) {
    if (absl::EqualsIgnoreCase(d.uuid, uuid)) device = &d;
  }
  if (device == nullptr) {
    std::string visible;
    for (const VmmDevice& d : devices)
      absl::StrAppend(&visible, visible.empty() ? "" : ", ", d.uuid);
    return absl::FailedPreconditionError(absl::StrCat(
        "fd.device_uuid \"", uuid, "\" is not a device visible to the server (", visible, ")"));
  }
  if (end > device->total_memory_bytes) {
    return absl::OutOfRangeError(absl::StrCat("fd.offset ", offset, " + fd.size ", size, " = ", end,
                                              " exceeds the ", device->total_memory_bytes,
                                              " bytes of device ", device->uuid));
  }
  if (allocation_size > device->total_memory_bytes) {
    return absl::OutOfRangeError(absl::StrCat("fd.allocation_size ", allocation_size,
                                              " exceeds the ", device->total_memory_bytes,
                                              " bytes of device ", device->uuid));
  }
  const int ordinal = device->ordinal;

  Mapping m;
  m.driver = driver_;
  m.device = ordinal;
  MappingGuard guard(&m);
  const int fd = fd_spec->fd->get();  // non-null: Inspect checked it
  if (Result r = driver_->Import(ordinal, fd, &m.handle); r != CudaVmmDriver::kSuccess) {
    // Whatever the driver's reason: the descriptor passed the type check
    // (an NVIDIA node), so it is the client's descriptor that does not
    // import (another NVIDIA fd, not an exported allocation, one exported
    // on a device this process cannot use, ...), not a server fault.
    return absl::InvalidArgumentError(absl::StrCat(
        "fd: the driver cannot import the descriptor as a CUDA VMM allocation on ", uuid,
        " (cuMemImportFromShareableHandle: ", driver_->ErrorName(r),
        "); pass the descriptor of cuMemExportToShareableHandle(POSIX_FILE_DESCRIPTOR)"));
  }
  m.imported = true;

  VmmLocation location;
  if (Result r = driver_->Location(ordinal, m.handle, &location); r != CudaVmmDriver::kSuccess) {
    return DriverError(driver_, "cuMemGetAllocationPropertiesFromHandle", r);
  }
  if (!location.on_device) {
    return absl::FailedPreconditionError(
        absl::StrCat("fd: the allocation is not device memory (CUmemLocationType ", location.type,
                     "), fd.device_uuid says ", device->uuid));
  }
  if (location.ordinal != ordinal) {
    std::string actual = absl::StrCat("device ordinal ", location.ordinal);
    for (const VmmDevice& d : devices) {
      if (d.ordinal == location.ordinal) actual = d.uuid;
    }
    return absl::FailedPreconditionError(
        absl::StrCat("fd.device_uuid is ", device->uuid, " but the allocation lives on ", actual));
  }

  uint64_t granularity = 0;
  if (Result r = driver_->Granularity(ordinal, m.handle, &granularity);
      r != CudaVmmDriver::kSuccess) {
    return DriverError(driver_, "cuMemGetAllocationGranularity", r);
  }
  if (granularity == 0) granularity = 1;
  if (end > UINT64_MAX - (granularity - 1)) {  // unreachable under the device bound
    return absl::OutOfRangeError(absl::StrCat("fd.offset + fd.size = ", end, " cannot be rounded"));
  }
  if (allocation_size % granularity != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("fd.allocation_size ", allocation_size,
                     " is not a multiple of the allocation's granularity ", granularity,
                     " (an allocation is whole granules)"));
  }
  // The whole allocation when the client stated its size (some drivers
  // refuse a partial map of an imported allocation), else the least whole
  // granules covering offset + size.
  const uint64_t length =
      allocation_size != 0 ? allocation_size : (end + granularity - 1) / granularity * granularity;

  // The cap on mapped bytes, counted before anything is reserved.
  uint64_t now = mapped_bytes_->load();
  do {
    if (length > options_.max_mapped_bytes || now > options_.max_mapped_bytes - length) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "cuda_vmm: mapping ", length, " more bytes (fd.offset + fd.size = ", end,
          ", fd.allocation_size ", allocation_size, ") would pass the server's cap of ",
          options_.max_mapped_bytes, " mapped VMM bytes (", now, " mapped now)"));
    }
  } while (!mapped_bytes_->compare_exchange_weak(now, now + length));
  m.counted = mapped_bytes_;
  m.counted_bytes = length;

  if (Result r = driver_->Reserve(ordinal, length, granularity, &m.va);
      r != CudaVmmDriver::kSuccess) {
    return DriverError(driver_, absl::StrCat("cuMemAddressReserve of ", length, " bytes"), r);
  }
  m.reserved = true;
  m.length = length;
  if (Result r = driver_->Map(ordinal, m.va, length, m.handle); r != CudaVmmDriver::kSuccess) {
    if (r == CudaVmmDriver::kInvalidValue) {
      // Not checked here which of the causes it is: the driver says nothing
      // of an imported allocation's size.
      return absl::InvalidArgumentError(absl::StrCat(
          "cuMemMap refused to map ", length, " bytes from the start of the allocation (fd.offset ",
          offset, " + fd.size ", size, " = ", end, ", fd.allocation_size ", allocation_size,
          ", granularity ", granularity, "): ", driver_->ErrorName(r),
          allocation_size != 0
              ? "; fd.allocation_size or fd.offset + fd.size may exceed the allocation"
              : "; fd.offset + fd.size may exceed the allocation, or the driver does not map "
                "part of an imported allocation (set fd.allocation_size to its size)"));
    }
    return DriverError(driver_, "cuMemMap", r);
  }
  m.mapped = true;
  if (Result r = driver_->SetAccess(ordinal, m.va, length); r != CudaVmmDriver::kSuccess) {
    return DriverError(driver_, "cuMemSetAccess", r);
  }
  auto region = std::make_unique<VmmRegion>(m, offset, size, device->uuid);
  guard.Dismiss();  // the region undoes the mapping from now on
  return region;
}

std::unique_ptr<core::RegionMapper> MakeCudaVmmMapper(CudaVmmMapperOptions options) {
  return std::make_unique<CudaVmmMapper>(RealCudaVmmDriver(), std::move(options));
}

absl::Status CudaVmmAvailable() { return RealCudaVmmDriver()->Available(); }

}  // namespace tokensel::memory
