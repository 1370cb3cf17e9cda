// RunOnDevice: the device switch around each CudaVmmDriver call, over a small
// seam (DeviceSwitchOps) so its rule is unit-tested without a GPU. No CUDA
// header here; the real ops (cuCtxGetCurrent, cudaGetDevice, cudaSetDevice)
// are in cuda_vmm_driver.cc.
//
// Rule: make `device` current (cudaSetDevice, which also makes its primary
// context current, the one the backend's kernels run in), run the call, and
// restore the caller's device only when the caller HAD a current context on
// entry. cudaGetDevice on a thread without one (a fresh gRPC worker) answers
// 0; "restoring" that would create GPU 0's primary context in a server that
// never uses GPU 0 (device memory and a context on someone else's GPU). So
// without a context on entry nothing is restored: the thread keeps `device`
// current, which is harmless (every call sets its own device first).
#ifndef TOKENSEL_SERVER_MEMORY_CUDA_VMM_DEVICE_SCOPE_H_
#define TOKENSEL_SERVER_MEMORY_CUDA_VMM_DEVICE_SCOPE_H_

namespace tokensel::memory {

class DeviceSwitchOps {
 public:
  virtual ~DeviceSwitchOps() = default;
  // Whether the calling thread has a current context (cuCtxGetCurrent non-null).
  virtual bool HasCurrentContext() = 0;
  // cudaGetDevice / cudaSetDevice; false on failure.
  virtual bool GetDevice(int* device) = 0;
  virtual bool SetDevice(int device) = 0;
  // The restore failed (logged by the real ops).
  virtual void RestoreFailed(int device) = 0;
};

// The runtime's ops (cuda_vmm_driver.cc; CUDA builds only): the VMM
// driver's and the IPC mapper's (cuda_ipc_mapper.cu). Thread-safe.
DeviceSwitchOps& RuntimeDeviceSwitchOps();

// Runs `f` (returning a CUresult) with `device` current; `invalid_device` is
// returned, without running `f`, when `device` cannot be made current.
template <typename F>
int RunOnDevice(DeviceSwitchOps& ops, int device, int invalid_device, F f) {
  int previous = -1;
  if (ops.HasCurrentContext() && !ops.GetDevice(&previous)) previous = -1;
  if (!ops.SetDevice(device)) return invalid_device;
  const int r = static_cast<int>(f());
  if (previous >= 0 && previous != device && !ops.SetDevice(previous)) ops.RestoreFailed(previous);
  return r;
}

}  // namespace tokensel::memory

#endif  // TOKENSEL_SERVER_MEMORY_CUDA_VMM_DEVICE_SCOPE_H_
