// RuntimeDeviceSwitch: the CUDA runtime's side of the device switch
// (server/core/device_switch.h: cuCtxGetCurrent, cudaGetDevice,
// cudaSetDevice), and
// OnOwnDevice, the checked call every CudaBackend path that may run on a
// foreign thread uses: the event calls (cuda_backend_events.cc) and the
// frees (FreeOnDevice: cuda_backend.cc, cuda_backend_staging.cc), which the
// pools' trims and the FreeGate's drainer run.
// Without cuCtxGetCurrent the caller is taken to have no context: nothing
// is restored (never GPU 0's context created by a "restore"). No CUDA
// header here; the implementation is cuda_device_switch.cc (CUDA builds).
#ifndef TOKENSEL_SERVER_BACKENDS_CUDA_DEVICE_SWITCH_H_
#define TOKENSEL_SERVER_BACKENDS_CUDA_DEVICE_SWITCH_H_

#include "server/core/device_switch.h"

namespace tokensel::backends {

using core::DeviceCall;
using core::DeviceSwitch;
using core::OnDeviceChecked;

class RuntimeDeviceSwitch final : public DeviceSwitch {
 public:
  bool HasCurrentContext() override;
  bool GetDevice(int* device) override;
  bool SetDevice(int device) override;
  void RestoreFailed(int device) override;  // logged
};

// `f` (returning a cudaError_t) with device `ordinal` current, checked, and
// the caller's device restored after it (server/core/device_switch.h).
template <typename F>
DeviceCall OnOwnDevice(int ordinal, F f) {
  RuntimeDeviceSwitch ops;
  return OnDeviceChecked(ops, ordinal, f);
}

// Logs what a free run through OnOwnDevice came to (`call` names it): a
// failed switch (nothing freed: leaked) or the free's own error.
void ReportFree(int ordinal, const char* call, const DeviceCall& done);

// Runs `free` (a cudaError_t(), named `call`) with device `ordinal`
// current: the pools' trims, the FreeGate's drainer and a backend's
// shutdown run these on any thread. The switch is checked (a failed
// cudaSetDevice would free with another device current: then nothing is
// freed, leaked and logged) and the caller's device restored only if it
// had one (never GPU 0's context made by a "restore"); a failed free is
// logged (ReportFree).
template <typename F>
void FreeOnDevice(int ordinal, const char* call, F free) {
  ReportFree(ordinal, call, OnOwnDevice(ordinal, free));
}

// A stream's synchronization (`sync`, returning a cudaError_t) with device
// `ordinal` current, checked (CudaBackend::Drain; the sixth review: a failed
// cudaSetDevice was ignored there). Unlike OnDeviceChecked, `sync` runs
// even when the switch failed (then without it, `switched` false): the
// caller returns the stream, its staging and its workspaces to their pools
// after the drain, so skipping the synchronization could hand out memory
// the stream's kernels still use. The stream names its own context, and
// synchronizing a stream of another device than the current one is
// allowed (assumed from the CUDA multi-device rules, as for events; not
// verified on a device here). The caller reports the failed switch.
template <typename F>
DeviceCall SynchronizeOnDevice(DeviceSwitch& ops, int ordinal, F sync) {
  DeviceCall call = OnDeviceChecked(ops, ordinal, sync);
  if (!call.switched) call.result = static_cast<int>(sync());
  return call;
}

}  // namespace tokensel::backends

#endif  // TOKENSEL_SERVER_BACKENDS_CUDA_DEVICE_SWITCH_H_
