// CudaVmmMapper: see cuda_vmm_mapper.h for the contract. Device-free: every
// CUDA call goes through CudaVmmDriver, so this file builds (and is tested)
// without CUDA.
#include "server/memory/cuda_vmm_mapper.h"

#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <algorithm>
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
#include "server/memory/cuda_vmm_mapping.h"
#include "server/memory/file_type.h"

namespace tokensel::memory {
namespace {

// A device's mapped bytes are counted in the slot of its FreeGate, whose
// deferred teardowns hold them (device_slot.h).
static_assert(core::kMaxSlotDevices == core::FreeGate::kMaxDevices);

using Result = CudaVmmDriver::Result;
using Handle = CudaVmmDriver::Handle;

// One allocation as the spec gives it: the single form's fd and
// allocation_size (0 = unknown), or one of fd.segments (named `field`).
struct Piece {
  const UniqueFd* fd = nullptr;
  uint64_t declared = 0;
  std::string field;  // "fd" or "fd.segments[i]", for messages
};

// A FreeGate::Deferred function: undoes and deletes the VmmMapping at `m`.
bool UndoLater(void* m, intptr_t /*unused*/) {
  std::unique_ptr<VmmMapping> mapping(static_cast<VmmMapping*>(m));
  mapping->Undo();
  return true;
}

// The one way a mapping is torn down, a region's or a failed Map's:
// cuMemUnmap / cuMemAddressFree / cuMemRelease may synchronize the device,
// so through the device's FreeGate (server/core/free_gate.h): queued for
// the gate's drainer, which runs it while no stream of that device waits on
// a client's event (its bytes stay counted against the device's cap on mapped
// bytes until then). `gate` holds a reservation for it, which the entry consumes. The
// mapping was allocated when its Map began, so this allocates nothing: no
// out-of-memory path can undo it here, on this thread, past a closed gate.
void UndoThroughGate(std::unique_ptr<VmmMapping> m, core::FreeGate& gate) noexcept {
  const uint64_t bytes = m->counted_bytes;
  const uint64_t owner = m->gate_owner;  // its share counts the entry (FreeGate::ReserveFor)
  // Owned by the entry from here: UndoLater deletes it.
  gate.FreeOrDefer({&UndoLater, m.release(), 0, bytes, owner});
}  // NOLINT(clang-analyzer-cplusplus.NewDeleteLeaks): the entry owns it

// A Map in progress, owning its mapping: on any failure its partial mapping
// (imports, the reservation, the mapped segments) goes through
// UndoThroughGate, never torn down inline on the request thread behind a
// client's wait.
class PendingMapping {
 public:
  PendingMapping(std::unique_ptr<VmmMapping> m, core::FreeGate* gate)
      : m_(std::move(m)), gate_(gate) {}
  ~PendingMapping() {
    if (m_ == nullptr) return;
    if (!m_->HoldsDeviceResources()) {
      // Failed before anything of the device was acquired (the first
      // import refused, say): nothing to defer. Undo only gives the counted
      // bytes back (no driver call), and the room goes back now; queuing a
      // no-op entry held the room until the gate opened, so failing Maps
      // behind a stuck wait filled the gate for every tenant (the seventh
      // review's item 2a).
      const uint64_t owner = m_->gate_owner;
      m_->Undo();
      m_.reset();
      gate_->Unreserve(owner);
      return;
    }
    UndoThroughGate(std::move(m_), *gate_);
  }
  VmmMapping& mapping() { return *m_; }
  // To the region, which undoes the mapping from now on and holds the room.
  std::unique_ptr<VmmMapping> Release() noexcept { return std::move(m_); }
  PendingMapping(const PendingMapping&) = delete;
  PendingMapping& operator=(const PendingMapping&) = delete;

 private:
  std::unique_ptr<VmmMapping> m_;
  core::FreeGate* gate_;
};

class VmmRegion final : public core::MappedRegion {
 public:
  // `gate`: the FreeGate of the mapping's device, holding a reservation
  // for its teardown (Map). Takes the pending mapping last, once nothing
  // can throw: until then the PendingMapping tears it down.
  VmmRegion(PendingMapping* pending, uint64_t offset, uint64_t size, std::string uuid,
            core::FreeGate* gate)
      : offset_(offset), size_(size), uuid_(std::move(uuid)), gate_(gate) {
    mapping_ = pending->Release();
  }
  // Through the device's FreeGate (UndoThroughGate; a stuck wait on another
  // device does not hold it back). Its bytes stay counted against its
  // device's cap on mapped bytes until then, and its reservation of the gate's room too
  // (both bound what a client can leave pending). The driver outlives the
  // deferral (the real one is never destroyed).
  ~VmmRegion() override { UndoThroughGate(std::move(mapping_), *gate_); }
  VmmRegion(const VmmRegion&) = delete;
  VmmRegion& operator=(const VmmRegion&) = delete;

  void* data() const override {
    // The mapping's device virtual address (a CUdeviceptr) as a pointer.
    // NOLINTNEXTLINE(performance-no-int-to-ptr)
    return reinterpret_cast<void*>(static_cast<uintptr_t>(mapping_->va + offset_));
  }
  uint64_t size() const override { return size_; }
  core::MemoryKind memory_kind() const override { return core::MemoryKind::kCudaDevice; }
  std::string device_uuid() const override { return uuid_; }

 private:
  std::unique_ptr<VmmMapping> mapping_;  // never null once made
  const uint64_t offset_;
  const uint64_t size_;
  const std::string uuid_;
  core::FreeGate* const gate_;
};

// Gives a FreeGate reservation back unless released to a region.
absl::Status DriverError(CudaVmmDriver* driver, absl::string_view what, Result r) {
  const std::string name = driver->ErrorName(r);
  if (r == CudaVmmDriver::kOutOfMemory) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cuda_vmm: ", what, ": out of device memory or address space (", name, ")"));
  }
  return absl::InternalError(absl::StrCat("cuda_vmm: ", what, " failed: ", name));
}

// The spec's allocations: the single form (fd, allocation_size) as one
// piece, or fd.segments (1..kMaxVmmSegments, each allocation_size > 0).
absl::StatusOr<std::vector<Piece>> PiecesOf(const core::FdRegionSpec& spec) {
  std::vector<Piece> pieces;
  if (spec.segments.empty()) {
    pieces.push_back(Piece{spec.fd.get(), spec.allocation_size, "fd"});
    return pieces;
  }
  if (spec.fd != nullptr || spec.allocation_size != 0) {
    return absl::InvalidArgumentError(
        "fd.segments supersedes fd.ticket and fd.allocation_size, which must be empty / 0 "
        "with it");
  }
  if (spec.segments.size() > core::kMaxVmmSegments) {
    return absl::InvalidArgumentError(absl::StrCat("fd.segments has ", spec.segments.size(),
                                                   " entries; a buffer spans at most ",
                                                   core::kMaxVmmSegments, " allocations"));
  }
  for (size_t i = 0; i < spec.segments.size(); ++i) {
    const core::VmmSegmentSpec& seg = spec.segments[i];
    if (seg.allocation_size == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("fd.segments[", i, "].allocation_size must be > 0, got 0"));
    }
    pieces.push_back(
        Piece{seg.fd.get(), seg.allocation_size, absl::StrCat("fd.segments[", i, "]")});
  }
  return pieces;
}

// Imports `piece` into `seg` and checks where the allocation lives and its
// granularity against what the piece declares. Returns the granularity.
absl::StatusOr<uint64_t> ImportOne(CudaVmmDriver* driver, const Piece& piece,
                                   const std::vector<VmmDevice>& devices, const VmmDevice& device,
                                   VmmMappedSegment& seg) {
  const int ordinal = device.ordinal;
  if (Result r = driver->Import(ordinal, piece.fd->get(), &seg.handle);
      r != CudaVmmDriver::kSuccess) {
    // Whatever the driver's reason: the descriptor passed the type check
    // (an NVIDIA node), so it is the client's descriptor that does not
    // import (another NVIDIA fd, not an exported allocation, one exported
    // on a device this process cannot use, ...), not a server fault.
    return absl::InvalidArgumentError(absl::StrCat(
        piece.field, ": the driver cannot import the descriptor as a CUDA VMM allocation on ",
        device.uuid, " (cuMemImportFromShareableHandle: ", driver->ErrorName(r),
        "); pass the descriptor of cuMemExportToShareableHandle(POSIX_FILE_DESCRIPTOR)"));
  }
  seg.imported = true;

  VmmLocation location;
  if (Result r = driver->Location(ordinal, seg.handle, &location); r != CudaVmmDriver::kSuccess) {
    return DriverError(driver, "cuMemGetAllocationPropertiesFromHandle", r);
  }
  if (!location.on_device) {
    return absl::FailedPreconditionError(
        absl::StrCat(piece.field, ": the allocation is not device memory (CUmemLocationType ",
                     location.type, "), fd.device_uuid says ", device.uuid));
  }
  if (location.ordinal != ordinal) {
    std::string actual = absl::StrCat("device ordinal ", location.ordinal);
    for (const VmmDevice& d : devices) {
      if (d.ordinal == location.ordinal) actual = d.uuid;
    }
    return absl::FailedPreconditionError(
        absl::StrCat(piece.field == "fd" ? "" : absl::StrCat(piece.field, ": "),
                     "fd.device_uuid is ", device.uuid, " but the allocation lives on ", actual));
  }

  uint64_t granularity = 0;
  if (Result r = driver->Granularity(ordinal, seg.handle, &granularity);
      r != CudaVmmDriver::kSuccess) {
    return DriverError(driver, "cuMemGetAllocationGranularity", r);
  }
  if (granularity == 0) granularity = 1;
  if (piece.declared % granularity != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(piece.field, ".allocation_size ", piece.declared,
                     " is not a multiple of the allocation's granularity ", granularity,
                     " (an allocation is whole granules)"));
  }
  // The whole allocation when its size is stated (some drivers refuse a
  // partial map of an imported allocation); the single form without it
  // maps the least whole granules covering offset + size (set by Map).
  seg.length = piece.declared;
  return granularity;
}

// cuMemMap refused `piece`. Not checked here which of the causes it is:
// the driver says nothing of an imported allocation's size.
absl::Status MapError(CudaVmmDriver* driver, const Piece& piece, uint64_t length, uint64_t offset,
                      uint64_t size, Result r) {
  if (r != CudaVmmDriver::kInvalidValue) return DriverError(driver, "cuMemMap", r);
  if (piece.field != "fd") {
    return absl::InvalidArgumentError(
        absl::StrCat("cuMemMap refused to map ", length, " bytes of ", piece.field,
                     " (its allocation_size ", piece.declared, "): ", driver->ErrorName(r),
                     "; the allocation may be smaller than its stated allocation_size"));
  }
  const uint64_t end = offset + size;
  return absl::InvalidArgumentError(absl::StrCat(
      "cuMemMap refused to map ", length, " bytes from the start of the allocation (fd.offset ",
      offset, " + fd.size ", size, " = ", end, ", fd.allocation_size ", piece.declared,
      "): ", driver->ErrorName(r),
      piece.declared != 0
          ? "; fd.allocation_size or fd.offset + fd.size may exceed the allocation"
          : "; fd.offset + fd.size may exceed the allocation, or the driver does not map "
            "part of an imported allocation (set fd.allocation_size to its size)"));
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
      mapped_bytes_(std::make_shared<std::array<std::atomic<uint64_t>, core::kDeviceSlots>>()) {}

uint64_t CudaVmmMapper::CapOf(const VmmDevice& d) const {
  const uint64_t multiple = options_.mapped_device_memory_multiple;
  uint64_t by_memory = UINT64_MAX;
  if (multiple != 0 && d.total_memory_bytes <= UINT64_MAX / multiple) {
    by_memory = multiple * d.total_memory_bytes;
  }
  return std::min(options_.max_mapped_bytes_per_device, by_memory);
}

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
  const std::string owner = fd_spec->owner;
  ASSIGN_OR_RETURN(const std::vector<Piece> pieces, PiecesOf(*fd_spec));
  const bool multi = !fd_spec->segments.empty();
  if (uuid.empty()) return absl::InvalidArgumentError("fd.device_uuid is empty (cuda_vmm)");
  if (size == 0) return absl::InvalidArgumentError("fd.size must be > 0");
  if (size > UINT64_MAX - offset) {
    return absl::OutOfRangeError(
        absl::StrCat("fd.offset ", offset, " + fd.size ", size, " overflows a 64-bit integer"));
  }
  const uint64_t end = offset + size;
  // The declared total: the single form's allocation_size (0 = unknown), or
  // the segments' sum, overflow-checked.
  uint64_t declared_total = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (pieces[i].declared > UINT64_MAX - declared_total) {
      return absl::InvalidArgumentError(
          absl::StrCat("fd.segments: the allocation_size sum overflows a 64-bit integer at ",
                       pieces[i].field, ".allocation_size ", pieces[i].declared));
    }
    declared_total += pieces[i].declared;
  }
  if (declared_total != 0 && declared_total < end) {
    return absl::InvalidArgumentError(
        absl::StrCat(multi ? "the sum of fd.segments[].allocation_size " : "fd.allocation_size ",
                     declared_total, " is less than fd.offset ", offset, " + fd.size ", size, " = ",
                     end, " (the memory must lie in the allocation", multi ? "s)" : ")"));
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
  for (const Piece& piece : pieces) {
    absl::Status s = Inspect(piece.fd != nullptr ? piece.fd->get() : -1).status();
    if (!s.ok() && multi) s = absl::Status(s.code(), absl::StrCat(piece.field, ": ", s.message()));
    RETURN_IF_ERROR(s);
  }

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
  if (declared_total > device->total_memory_bytes) {
    return absl::OutOfRangeError(absl::StrCat(
        multi ? "the sum of fd.segments[].allocation_size " : "fd.allocation_size ", declared_total,
        " exceeds the ", device->total_memory_bytes, " bytes of device ", device->uuid));
  }

  // Room for the teardown to be deferred on the device's FreeGate, taken
  // before the first import (a failure from there on defers its partial
  // teardown too): counts live mappings and pending teardowns together
  // (free_gate.h), so that register / unregister churn while the gate is
  // closed ends in RESOURCE_EXHAUSTED, never in a teardown that cannot be
  // queued.
  // In the registering peer's share too (the seventh review's item 2b):
  // one peer's failing or churned registrations behind its own stuck wait
  // fill at most its share of device k's room and deferred bytes, and the
  // other peers still map on k (free_gate.h).
  // The mapping is allocated first (its teardown then allocates nothing).
  core::FreeGate& gate = core::FreeGate::ForDevice(device->ordinal);
  auto owned = std::make_unique<VmmMapping>();
  ASSIGN_OR_RETURN(const uint64_t owner_id, gate.ReserveFor("cuda_vmm: a mapping", owner));
  owned->gate_owner = owner_id;
  PendingMapping pending(std::move(owned), &gate);
  VmmMapping& m = pending.mapping();
  m.driver = driver_;
  m.device = device->ordinal;
  m.segments.reserve(pieces.size());
  // Import and check every allocation before anything is reserved.
  uint64_t alignment = 1;
  for (const Piece& piece : pieces) {
    m.segments.push_back(VmmMappedSegment{});  // reserved: `seg` stays valid
    VmmMappedSegment& seg = m.segments.back();
    seg.at = m.length;
    ASSIGN_OR_RETURN(const uint64_t granularity, ImportOne(driver_, piece, devices, *device, seg));
    alignment = std::max(alignment, granularity);
    // Each allocation maps at the sum of the ones before it: cuMemMap takes
    // only granule-aligned addresses.
    if (seg.at % granularity != 0) {
      return absl::InvalidArgumentError(absl::StrCat(piece.field, " maps at offset ", seg.at,
                                                     " of the buffer (the allocations before it), "
                                                     "not a multiple of its granularity ",
                                                     granularity));
    }
    if (piece.declared == 0) {                     // the single form without a stated size
      if (end > UINT64_MAX - (granularity - 1)) {  // unreachable under the device bound
        return absl::OutOfRangeError(
            absl::StrCat("fd.offset + fd.size = ", end, " cannot be rounded"));
      }
      seg.length = (end + granularity - 1) / granularity * granularity;
    }
    m.length = seg.at + seg.length;  // no overflow: the declared sum was checked
  }
  const uint64_t length = m.length;

  // The device's cap on mapped bytes (the whole reservation), counted
  // before anything is reserved, in the device's own share: a teardown
  // deferred behind a stuck wait on another device (its bytes counted
  // until it ran) does not refuse this one (cuda_vmm_mapper.h).
  const uint64_t cap = CapOf(*device);
  std::atomic<uint64_t>& counter = (*mapped_bytes_)[core::DeviceSlot(device->ordinal)];
  uint64_t now = counter.load();
  do {
    if (length > cap || now > cap - length) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "cuda_vmm: mapping ", length, " more bytes (fd.offset + fd.size = ", end,
          multi ? absl::StrCat(", ", pieces.size(), " fd.segments")
                : absl::StrCat(", fd.allocation_size ", declared_total),
          ") would pass the server's cap of ", cap, " mapped VMM bytes on device ", device->uuid,
          " (", now, " mapped now, teardowns still waiting for the device included)"));
    }
  } while (!counter.compare_exchange_weak(now, now + length));
  // The slot's counter, kept alive by the array it is part of.
  m.counted = std::shared_ptr<std::atomic<uint64_t>>(mapped_bytes_, &counter);
  m.counted_bytes = length;

  const int ordinal = device->ordinal;
  if (Result r = driver_->Reserve(ordinal, length, alignment, &m.va);
      r != CudaVmmDriver::kSuccess) {
    return DriverError(driver_, absl::StrCat("cuMemAddressReserve of ", length, " bytes"), r);
  }
  m.reserved = true;
  for (size_t i = 0; i < m.segments.size(); ++i) {
    VmmMappedSegment& seg = m.segments[i];
    if (Result r = driver_->Map(ordinal, m.va + seg.at, seg.length, seg.handle);
        r != CudaVmmDriver::kSuccess) {
      return MapError(driver_, pieces[i], seg.length, offset, size, r);
    }
    seg.mapped = true;
  }
  // One access grant over the whole range (what PyTorch does over its
  // chunks too).
  if (Result r = driver_->SetAccess(ordinal, m.va, length); r != CudaVmmDriver::kSuccess) {
    return DriverError(driver_, "cuMemSetAccess", r);
  }
  // The region takes the mapping and the room once made (VmmRegion).
  return std::make_unique<VmmRegion>(&pending, offset, size, device->uuid, &gate);
}

std::unique_ptr<core::RegionMapper> MakeCudaVmmMapper(CudaVmmMapperOptions options) {
  return std::make_unique<CudaVmmMapper>(RealCudaVmmDriver(), std::move(options));
}

absl::Status CudaVmmAvailable() { return RealCudaVmmDriver()->Available(); }

}  // namespace tokensel::memory
