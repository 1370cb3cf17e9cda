// CudaIpcMapper's driver, CUDA build: RealCudaIpcOps(). See cuda_ipc_mapper.h for
// the contract; the mapper's rules are device-free (cuda_ipc_mapper.cc).
#include "server/memory/cuda_ipc_mapper.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
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

// An aliased handle (other bytes naming an allocation this process has open
// already): CUDA 13 documents a reference count (the same pointer again,
// balanced by the table's one close per entry); older drivers answered
// "already mapped" (cudaErrorAlreadyMapped), which is the client's doing,
// not the device's: INVALID_ARGUMENT naming the field. Not verified on a
// device (no device here).
bool IsAliasedHandle(cudaError_t err) { return err == cudaErrorAlreadyMapped; }

// The runtime documents cudaIpcMemLazyEnablePeerAccess as the one value the
// flags "must be specified as"; 0 is undocumented, and if a driver refused it
// every IPC registration would fail. So the documented flag, and memory of
// another GPU is refused after the open instead (CheckOpened on the pointer's
// device, then closed through the gate). The cost of such a refused open: the
// driver may have enabled peer access from our context to that GPU (bounded
// by the device count, harmless to other clients; no mapping is kept).
constexpr unsigned kIpcOpenFlags = cudaIpcMemLazyEnablePeerAccess;

// The real IpcHandleOps: cudaIpcOpenMemHandle / cudaIpcCloseMemHandle.
class RuntimeIpcOps final : public IpcHandleOps {
 public:
  absl::StatusOr<Opened> Open(const std::string& handle, int device) override;
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

absl::StatusOr<IpcHandleOps::Opened> RuntimeIpcOps::Open(const std::string& handle, int device) {
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.data(), sizeof(h));
  void* base = nullptr;
  // The allocation's extent and the pointer's device are asked in the same
  // device scope as the open: after it the caller's device is restored, and
  // a query from another context could fail, or answer for another mapping.
  const PFN_cuMemGetAddressRange_v3020 get_range = AddressRangeFn();
  CUresult range = CUDA_ERROR_NOT_SUPPORTED;
  CUdeviceptr range_base = 0;
  size_t range_size = 0;
  int lives_on = -1;
  const int opened = OnIpcDevice(device, [&] {
    const cudaError_t err = cudaIpcOpenMemHandle(&base, h, kIpcOpenFlags);
    if (err != cudaSuccess) return err;
    if (get_range != nullptr) {
      range = get_range(&range_base, &range_size, reinterpret_cast<CUdeviceptr>(base));
    }
    cudaPointerAttributes attributes{};
    if (cudaPointerGetAttributes(&attributes, base) == cudaSuccess &&
        attributes.type == cudaMemoryTypeDevice) {
      lives_on = attributes.device;
    }
    cudaGetLastError();  // a failed query is answered by CheckOpened, not here
    return err;
  });
  if (opened == kSwitchFailed) {
    return absl::InternalError(absl::StrCat("cuda_ipc: cudaSetDevice(", device, ") failed"));
  }
  if (const auto err = static_cast<cudaError_t>(opened); err != cudaSuccess) {
    cudaGetLastError();
    if (IsBadHandle(err)) {
      return absl::InvalidArgumentError(
          absl::StrCat("cuda_ipc.handle cannot be opened: ", cudaGetErrorString(err)));
    }
    if (IsAliasedHandle(err)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cuda_ipc.handle names an allocation this server has open under other handle bytes "
          "(register the handle cudaIpcGetMemHandle gave): ",
          cudaGetErrorString(err)));
    }
    return CudaError("cudaIpcOpenMemHandle", err);
  }
  Opened result;
  result.base = base;
  result.device = lives_on;
  const auto at = reinterpret_cast<CUdeviceptr>(base);
  if (range == CUDA_SUCCESS && at >= range_base && at - range_base <= range_size) {
    result.extent_known = true;
    result.extent = range_size - (at - range_base);
  } else {
    TS_LOG(WARNING) << "cuda_ipc: cuMemGetAddressRange "
                    << (get_range == nullptr ? "unavailable" : "failed") << " ("
                    << static_cast<int>(range) << "); the registration is refused";
  }
  // Refused or not, the table decides (CheckOpened) and closes it through
  // the device's gate like any refused registration.
  return result;
}

}  // namespace

IpcHandleOps* RealCudaIpcOps() {
  static RuntimeIpcOps* const ops = new RuntimeIpcOps();  // never destroyed: deferred closes
  return ops;
}

}  // namespace tokensel::memory
