// RuntimeDeviceSwitch (contract: cuda_device_switch.h). Compiled by the host
// compiler against cuda_runtime_api.h.
#include "server/backends/cuda_device_switch.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include "common/log.h"

namespace tokensel::backends {
namespace {

// cuCtxGetCurrent, looked up once through the runtime (as the VMM driver
// does: no link-time libcuda); null if the driver lacks it.
PFN_cuCtxGetCurrent_v4000 CtxGetCurrent() {
  static const PFN_cuCtxGetCurrent_v4000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult query = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &p, 4000, cudaEnableDefault, &query) !=
            cudaSuccess ||
        query != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      p = nullptr;
    }
    return reinterpret_cast<PFN_cuCtxGetCurrent_v4000>(p);
  }();
  return fn;
}

bool Ok(cudaError_t err) {
  if (err == cudaSuccess) return true;
  (void)cudaGetLastError();
  return false;
}

}  // namespace

bool RuntimeDeviceSwitch::HasCurrentContext() {
  CUcontext ctx = nullptr;
  const PFN_cuCtxGetCurrent_v4000 get = CtxGetCurrent();
  return get != nullptr && get(&ctx) == CUDA_SUCCESS && ctx != nullptr;
}

bool RuntimeDeviceSwitch::GetDevice(int* device) { return Ok(cudaGetDevice(device)); }

bool RuntimeDeviceSwitch::SetDevice(int device) { return Ok(cudaSetDevice(device)); }

void RuntimeDeviceSwitch::RestoreFailed(int device) {
  TS_LOG(ERROR) << "cudaSetDevice(" << device << ") restoring the caller's device after a "
                << "device call failed";
}

void ReportFree(int ordinal, const char* call, const DeviceCall& done) {
  if (!done.switched) {
    TS_LOG(ERROR) << "cuda backend: cudaSetDevice(" << ordinal << ") failed before " << call
                  << "; not freed (leaked)";
    return;
  }
  if (const auto err = static_cast<cudaError_t>(done.result); err != cudaSuccess) {
    (void)cudaGetLastError();
    TS_LOG(ERROR) << "cuda backend: " << call << " on device " << ordinal << ": "
                  << cudaGetErrorString(err);
  }
}

}  // namespace tokensel::backends
