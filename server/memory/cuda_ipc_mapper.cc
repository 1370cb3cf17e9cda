// CudaIpcMapper's rules, device-free (the driver calls are behind
// IpcHandleOps: cuda_ipc_mapper.cu, or cuda_ipc_mapper_nocuda.cc). See
// cuda_ipc_mapper.h for the contract.
#include "server/memory/cuda_ipc_mapper.h"

#include <string>
#include <utility>
#include <variant>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tokensel::memory {
namespace {

class IpcRegion final : public core::MappedRegion {
 public:
  // `ref` is the region's reference to its open handle: whatever fails
  // before the region exists (this allocation included) drops it.
  IpcRegion(IpcHandleTable::Ref ref, uint64_t size, std::string uuid)
      : ref_(std::move(ref)), size_(size), uuid_(std::move(uuid)) {}
  IpcRegion(const IpcRegion&) = delete;
  IpcRegion& operator=(const IpcRegion&) = delete;

  void* data() const override { return ref_.data(); }
  uint64_t size() const override { return size_; }
  core::MemoryKind memory_kind() const override { return core::MemoryKind::kCudaDevice; }
  std::string device_uuid() const override { return uuid_; }

 private:
  const IpcHandleTable::Ref ref_;
  const uint64_t size_;
  const std::string uuid_;
};

}  // namespace

CudaIpcMapper::CudaIpcMapper(CudaIpcMapperOptions options)
    : options_(std::move(options)),
      table_(IpcHandleTable::Create(options_.ops != nullptr ? options_.ops : RealCudaIpcOps(),
                                    options_.gate_for)) {}
CudaIpcMapper::~CudaIpcMapper() = default;

absl::StatusOr<std::unique_ptr<core::MappedRegion>> CudaIpcMapper::Map(
    const core::RegionSpec& spec) {
  const auto* ipc = std::get_if<core::CudaIpcSpec>(&spec);
  if (ipc == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("the cuda_ipc mapper cannot map a ", core::RegionKindName(spec), " region"));
  }
  RETURN_IF_ERROR(ValidateCudaIpcSpec(*ipc));
  // Only the backend's own devices, before any driver call: a client naming
  // another GPU must not make the server open a handle (and create a
  // context) there.
  const CudaIpcDevice* device = nullptr;
  for (const CudaIpcDevice& d : options_.devices) {
    if (absl::EqualsIgnoreCase(d.uuid, ipc->device_uuid)) device = &d;
  }
  if (device == nullptr) {
    std::string served;
    for (const CudaIpcDevice& d : options_.devices) {
      absl::StrAppend(&served, served.empty() ? "" : ", ", d.uuid);
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "cuda_ipc.device_uuid \"", ipc->device_uuid,
        "\" is not a device of this server's backend (", served.empty() ? "none" : served, ")"));
  }
  // Read once into locals (the spec is server-private already).
  const uint64_t offset = ipc->offset;
  const uint64_t size = ipc->size;
  ASSIGN_OR_RETURN(
      IpcHandleTable::Ref ref,
      table_->Acquire(ipc->handle, device->ordinal, device->uuid, offset, size, ipc->owner));
  if (options_.region_hook) options_.region_hook();
  return std::make_unique<IpcRegion>(std::move(ref), size, device->uuid);
}

size_t CudaIpcMapper::open_handle_count() const { return table_->open_count(); }

std::unique_ptr<core::RegionMapper> MakeCudaIpcMapper(std::vector<CudaIpcDevice> devices) {
  CudaIpcMapperOptions options;
  options.devices = std::move(devices);
  return std::make_unique<CudaIpcMapper>(std::move(options));
}

}  // namespace tokensel::memory
