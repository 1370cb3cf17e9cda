// CudaIpcMapper, CUDA build. See cuda_ipc_mapper.h for the contract.
#include "server/memory/cuda_ipc_mapper.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "kernels/cuda/device.h"
#include "server/core/free_gate.h"

namespace tokensel::memory {
namespace {

static_assert(sizeof(cudaIpcMemHandle_t) == kCudaIpcHandleBytes,
              "cudaIpcMemHandle_t is not 64 bytes");

absl::Status CudaError(absl::string_view what, cudaError_t err) {
  cudaGetLastError();  // clear a non-sticky error so the next call starts clean
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(err)));
}

// Makes `device` current for the scope and restores the previous device.
class ScopedDevice {
 public:
  static absl::StatusOr<std::unique_ptr<ScopedDevice>> Enter(int device) {
    int previous = 0;
    cudaError_t err = cudaGetDevice(&previous);
    if (err != cudaSuccess) return CudaError("cudaGetDevice", err);
    err = cudaSetDevice(device);
    if (err != cudaSuccess) return CudaError(absl::StrCat("cudaSetDevice(", device, ")"), err);
    return std::unique_ptr<ScopedDevice>(new ScopedDevice(previous));
  }
  ~ScopedDevice() {
    const cudaError_t err = cudaSetDevice(previous_);
    if (err != cudaSuccess) {
      TS_LOG(ERROR) << "cudaSetDevice(" << previous_ << "): " << cudaGetErrorString(err);
    }
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

 private:
  explicit ScopedDevice(int previous) : previous_(previous) {}
  const int previous_;
};

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
      TS_LOG(WARNING) << "cuMemGetAddressRange is unavailable; cuda_ipc sizes are trusted up "
                         "to the device memory size";
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

}  // namespace

struct CudaIpcMapper::State {
  struct Opened {
    void* base = nullptr;
    int device = 0;
    uint64_t extent = 0;  // bytes usable from `base`: the allocation, or the device memory
    uint32_t refs = 0;
  };

  using Table = std::map<std::string, Opened>;  // key: the 64 handle bytes

  // Drops one reference to `handle`; closes it with the last one.
  void Release(const std::string& handle) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = opened.find(handle);
    if (it != opened.end() && --it->second.refs == 0) CloseLocked(it);
  }

  // Forgets the handle and closes it. Requires `mu`. cudaIpcCloseMemHandle
  // may synchronize the device, so it goes through the process's FreeGate
  // (server/core/free_gate.h): deferred while a stream waits on a client's
  // event (the last region may go on a backend's completion thread, or on
  // a request thread). A Map of the same handle before a deferred close ran
  // opens it anew (the driver may refuse that: the Map then fails; not
  // verified on a device).
  void CloseLocked(Table::iterator it) {
    const Opened closing = it->second;
    opened.erase(it);
    core::FreeGate::Process().FreeOrDefer({&Close, closing.base, closing.device, 0});
  }

  // A FreeGate::Deferred function: `base` was opened on device `device`.
  static void Close(void* base, intptr_t device) {
    auto scope = ScopedDevice::Enter(static_cast<int>(device));
    if (!scope.ok()) TS_LOG(ERROR) << "closing a cuda_ipc handle: " << scope.status();
    const cudaError_t err = cudaIpcCloseMemHandle(base);
    if (err != cudaSuccess) {
      cudaGetLastError();
      TS_LOG(ERROR) << "cudaIpcCloseMemHandle: " << cudaGetErrorString(err);
    }
  }

  std::mutex mu;
  Table opened;  // guarded by mu
};

namespace {

class IpcRegion final : public core::MappedRegion {
 public:
  IpcRegion(std::shared_ptr<CudaIpcMapper::State> state, std::string handle, void* data,
            uint64_t size, std::string uuid)
      : state_(std::move(state)),
        handle_(std::move(handle)),
        data_(data),
        size_(size),
        uuid_(std::move(uuid)) {}
  ~IpcRegion() override { state_->Release(handle_); }
  IpcRegion(const IpcRegion&) = delete;
  IpcRegion& operator=(const IpcRegion&) = delete;

  void* data() const override { return data_; }
  uint64_t size() const override { return size_; }
  core::MemoryKind memory_kind() const override { return core::MemoryKind::kCudaDevice; }
  std::string device_uuid() const override { return uuid_; }

 private:
  const std::shared_ptr<CudaIpcMapper::State> state_;
  const std::string handle_;
  void* const data_;
  const uint64_t size_;
  const std::string uuid_;
};

// Opens `handle` on `device` and measures what it maps.
absl::StatusOr<CudaIpcMapper::State::Opened> Open(const std::string& handle, int device,
                                                  uint64_t device_memory) {
  ASSIGN_OR_RETURN(auto scope, ScopedDevice::Enter(device));
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.data(), sizeof(h));
  void* base = nullptr;
  const cudaError_t err = cudaIpcOpenMemHandle(&base, h, cudaIpcMemLazyEnablePeerAccess);
  if (err != cudaSuccess) {
    if (IsBadHandle(err)) {
      cudaGetLastError();
      return absl::InvalidArgumentError(
          absl::StrCat("cuda_ipc.handle cannot be opened: ", cudaGetErrorString(err)));
    }
    return CudaError("cudaIpcOpenMemHandle", err);
  }
  CudaIpcMapper::State::Opened opened{base, device, device_memory, /*refs=*/0};
  if (const auto get_range = AddressRangeFn(); get_range != nullptr) {
    CUdeviceptr range_base = 0;
    size_t range_size = 0;
    const CUresult res = get_range(&range_base, &range_size, reinterpret_cast<CUdeviceptr>(base));
    if (res == CUDA_SUCCESS) {
      opened.extent = range_size - (reinterpret_cast<CUdeviceptr>(base) - range_base);
    } else {
      TS_LOG(WARNING) << "cuMemGetAddressRange failed (" << static_cast<int>(res)
                      << "); bounding a cuda_ipc region by the device memory size";
    }
  }
  return opened;
}

}  // namespace

CudaIpcMapper::CudaIpcMapper() : state_(std::make_shared<State>()) {}
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

  std::lock_guard<std::mutex> lock(state_->mu);
  auto it = state_->opened.find(ipc->handle);
  if (it != state_->opened.end()) {
    if (it->second.device != device->ordinal) {
      return absl::FailedPreconditionError(
          absl::StrCat("cuda_ipc.handle is already open on device ", it->second.device, ", not on ",
                       device->uuid));
    }
  } else {
    ASSIGN_OR_RETURN(State::Opened opened,
                     Open(ipc->handle, device->ordinal, device->total_memory_bytes));
    it = state_->opened.emplace(ipc->handle, opened).first;
  }
  const uint64_t end = ipc->offset + ipc->size;  // no overflow: ValidateCudaIpcSpec
  if (end > it->second.extent) {
    const uint64_t extent = it->second.extent;
    if (it->second.refs == 0) state_->CloseLocked(it);  // opened just now for this spec
    return absl::OutOfRangeError(absl::StrCat("cuda_ipc.offset ", ipc->offset, " + cuda_ipc.size ",
                                              ipc->size, " = ", end, " exceeds the ", extent,
                                              " bytes of the allocation behind cuda_ipc.handle"));
  }
  ++it->second.refs;
  void* data = static_cast<char*>(it->second.base) + ipc->offset;
  return std::make_unique<IpcRegion>(state_, ipc->handle, data, ipc->size, device->uuid);
}

size_t CudaIpcMapper::open_handle_count() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->opened.size();
}

std::unique_ptr<core::RegionMapper> MakeCudaIpcMapper() {
  return std::make_unique<CudaIpcMapper>();
}

}  // namespace tokensel::memory
