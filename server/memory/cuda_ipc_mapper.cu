// CudaIpcMapper, CUDA build. See cuda_ipc_mapper.h for the contract.
#include "server/memory/cuda_ipc_mapper.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstring>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "kernels/cuda/device.h"
#include "server/memory/cuda_vmm_device_scope.h"
#include "server/memory/ipc_handle_table.h"

namespace tokensel::memory {
namespace {

static_assert(sizeof(cudaIpcMemHandle_t) == kCudaIpcHandleBytes,
              "cudaIpcMemHandle_t is not 64 bytes");

absl::Status CudaError(absl::string_view what, cudaError_t err) {
  cudaGetLastError();  // clear a non-sticky error so the next call starts clean
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(err)));
}

// Runs `f` (a cudaError_t()) with `device` current: the rule of
// cuda_vmm_device_scope.h (the caller's device restored only if it had a
// context: the deferred close runs on the FreeGate's drainer, a thread with
// no context, where "restoring" device 0 would create GPU 0's context).
// kSwitchFailed when `device` cannot be made current (nothing ran).
constexpr int kSwitchFailed = -1;
template <typename F>
int OnIpcDevice(int device, F f) {
  return RunOnDevice(RuntimeDeviceSwitchOps(), device, kSwitchFailed,
                     [&] { return static_cast<int>(f()); });
}

// cuMemGetAddressRange through the runtime's driver entry point (null when
// the driver does not provide it).
PFN_cuMemGetAddressRange_v3020 AddressRangeFn() {
  static const PFN_cuMemGetAddressRange_v3020 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult query = cudaDriverEntryPointSymbolNotFound;
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &p, 3020,
                                                             cudaEnableDefault, &query);
    if (err != cudaSuccess || query != cudaDriverEntryPointSuccess || p == nullptr) {
      cudaGetLastError();
      TS_LOG(WARNING) << "cuMemGetAddressRange is unavailable; cuda_ipc registrations are "
                         "refused (no region can be bounded)";
      return static_cast<PFN_cuMemGetAddressRange_v3020>(nullptr);
    }
    return reinterpret_cast<PFN_cuMemGetAddressRange_v3020>(p);
  }();
  return fn;
}

// Errors of cudaIpcOpenMemHandle that mean the client sent a bad handle.
bool IsBadHandle(cudaError_t err) {
  return err == cudaErrorInvalidValue || err == cudaErrorInvalidResourceHandle ||
         err == cudaErrorMapBufferObjectFailed || err == cudaErrorInvalidDevicePointer;
}

// The real IpcHandleOps: cudaIpcOpenMemHandle / cudaIpcCloseMemHandle.
class RuntimeIpcOps final : public IpcHandleOps {
 public:
  absl::StatusOr<Opened> Open(const std::string& handle, int device,
                              uint64_t device_memory) override;
  void Close(void* base, int device) noexcept override {
    const int err = OnIpcDevice(device, [base] { return cudaIpcCloseMemHandle(base); });
    if (err == kSwitchFailed) {
      TS_LOG(ERROR) << "closing a cuda_ipc handle: cudaSetDevice(" << device
                    << ") failed; not closed";
    } else if (err != cudaSuccess) {
      cudaGetLastError();
      TS_LOG(ERROR) << "cudaIpcCloseMemHandle: "
                    << cudaGetErrorString(static_cast<cudaError_t>(err));
    }
  }
};

IpcHandleOps* RealIpcOps() {
  static RuntimeIpcOps* const ops = new RuntimeIpcOps();  // never destroyed: deferred closes
  return ops;
}

}  // namespace

struct CudaIpcMapper::State {
  std::shared_ptr<IpcHandleTable> table;
};

namespace {

class IpcRegion final : public core::MappedRegion {
 public:
  IpcRegion(std::shared_ptr<IpcHandleTable> table, std::string handle, void* data, uint64_t size,
            std::string uuid)
      : table_(std::move(table)),
        handle_(std::move(handle)),
        data_(data),
        size_(size),
        uuid_(std::move(uuid)) {}
  ~IpcRegion() override { table_->Release(handle_); }
  IpcRegion(const IpcRegion&) = delete;
  IpcRegion& operator=(const IpcRegion&) = delete;

  void* data() const override { return data_; }
  uint64_t size() const override { return size_; }
  core::MemoryKind memory_kind() const override { return core::MemoryKind::kCudaDevice; }
  std::string device_uuid() const override { return uuid_; }

 private:
  const std::shared_ptr<IpcHandleTable> table_;
  const std::string handle_;
  void* const data_;
  const uint64_t size_;
  const std::string uuid_;
};

}  // namespace

absl::StatusOr<IpcHandleOps::Opened> RuntimeIpcOps::Open(const std::string& handle, int device,
                                                         uint64_t /*device_memory*/) {
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.data(), sizeof(h));
  void* base = nullptr;
  // The allocation's extent is asked in the same device scope as the open:
  // after it the caller's device is restored, and a query from another
  // context could fail, or answer for another mapping.
  const PFN_cuMemGetAddressRange_v3020 get_range = AddressRangeFn();
  CUresult range = CUDA_ERROR_NOT_SUPPORTED;
  CUdeviceptr range_base = 0;
  size_t range_size = 0;
  const int opened = OnIpcDevice(device, [&] {
    const cudaError_t err = cudaIpcOpenMemHandle(&base, h, cudaIpcMemLazyEnablePeerAccess);
    if (err == cudaSuccess && get_range != nullptr) {
      range = get_range(&range_base, &range_size, reinterpret_cast<CUdeviceptr>(base));
    }
    return err;
  });
  if (opened == kSwitchFailed) {
    return absl::InternalError(absl::StrCat("cuda_ipc: cudaSetDevice(", device, ") failed"));
  }
  if (const auto err = static_cast<cudaError_t>(opened); err != cudaSuccess) {
    if (IsBadHandle(err)) {
      cudaGetLastError();
      return absl::InvalidArgumentError(
          absl::StrCat("cuda_ipc.handle cannot be opened: ", cudaGetErrorString(err)));
    }
    return CudaError("cudaIpcOpenMemHandle", err);
  }
  const auto at = reinterpret_cast<CUdeviceptr>(base);
  if (range != CUDA_SUCCESS || at < range_base || at - range_base > range_size) {
    // Without the allocation's extent no client offset + size can be
    // bounded: fail closed (never "trust up to the device memory"). A rare
    // driver failure, so the handle is closed here, on this thread.
    (void)OnIpcDevice(device, [&] { return cudaIpcCloseMemHandle(base); });
    cudaGetLastError();
    return absl::InternalError(absl::StrCat(
        "cuda_ipc: cannot bound the opened allocation (cuMemGetAddressRange ",
        get_range == nullptr ? "unavailable" : "failed", ", ", static_cast<int>(range), ")"));
  }
  return Opened{base, range_size - (at - range_base)};
}

CudaIpcMapper::CudaIpcMapper()
    : state_(std::make_shared<State>(State{IpcHandleTable::Create(RealIpcOps())})) {}
CudaIpcMapper::~CudaIpcMapper() = default;

absl::StatusOr<std::unique_ptr<core::MappedRegion>> CudaIpcMapper::Map(
    const core::RegionSpec& spec) {
  const auto* ipc = std::get_if<core::CudaIpcSpec>(&spec);
  if (ipc == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("the cuda_ipc mapper cannot map a ", core::RegionKindName(spec), " region"));
  }
  RETURN_IF_ERROR(ValidateCudaIpcSpec(*ipc));

  ASSIGN_OR_RETURN(const std::vector<kernels::cuda::DeviceInfo> devices,
                   kernels::cuda::ListDevices());
  if (devices.empty()) {
    return absl::FailedPreconditionError("cuda_ipc: the server sees no CUDA device");
  }
  const kernels::cuda::DeviceInfo* device = nullptr;
  for (const auto& d : devices) {
    if (absl::EqualsIgnoreCase(d.uuid, ipc->device_uuid)) device = &d;
  }
  if (device == nullptr) {
    std::string visible;
    for (const auto& d : devices) absl::StrAppend(&visible, visible.empty() ? "" : ", ", d.uuid);
    return absl::FailedPreconditionError(absl::StrCat("cuda_ipc.device_uuid \"", ipc->device_uuid,
                                                      "\" is not a device visible to the server (",
                                                      visible, ")"));
  }

  // Read once into locals (the spec is server-private already).
  const uint64_t offset = ipc->offset;
  const uint64_t size = ipc->size;
  ASSIGN_OR_RETURN(void* const data,
                   state_->table->Acquire(ipc->handle, device->ordinal, device->uuid,
                                          device->total_memory_bytes, offset, size));
  return std::make_unique<IpcRegion>(state_->table, ipc->handle, data, size, device->uuid);
}

size_t CudaIpcMapper::open_handle_count() const { return state_->table->open_count(); }

std::unique_ptr<core::RegionMapper> MakeCudaIpcMapper() {
  return std::make_unique<CudaIpcMapper>();
}

}  // namespace tokensel::memory
