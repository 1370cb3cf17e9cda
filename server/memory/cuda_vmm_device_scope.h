// RunOnDevice: the device switch around each CudaVmmDriver and IPC mapper
// call: the server's one rule, core::OnDeviceChecked
// (server/core/device_switch.h: make `device` current, run the call, restore
// the caller's device only when it had a current context), answering
// `invalid_device` when the switch fails. No CUDA header here; the real ops
// (cuCtxGetCurrent, cudaGetDevice, cudaSetDevice) are in cuda_vmm_driver.cc.
#ifndef TOKENSEL_SERVER_MEMORY_CUDA_VMM_DEVICE_SCOPE_H_
#define TOKENSEL_SERVER_MEMORY_CUDA_VMM_DEVICE_SCOPE_H_

#include "server/core/device_switch.h"

namespace tokensel::memory {

using DeviceSwitchOps = core::DeviceSwitch;

// The runtime's ops (cuda_vmm_driver.cc; CUDA builds only): the VMM
// driver's and the IPC mapper's (cuda_ipc_mapper.cu). Thread-safe.
DeviceSwitchOps& RuntimeDeviceSwitchOps();

// Runs `f` (returning a CUresult) with `device` current; `invalid_device` is
// returned, without running `f`, when `device` cannot be made current.
template <typename F>
int RunOnDevice(DeviceSwitchOps& ops, int device, int invalid_device, F f) {
  const core::DeviceCall call = core::OnDeviceChecked(ops, device, f);
  return call.switched ? call.result : invalid_device;
}

}  // namespace tokensel::memory

#endif  // TOKENSEL_SERVER_MEMORY_CUDA_VMM_DEVICE_SCOPE_H_
