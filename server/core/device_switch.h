// OnDeviceChecked: one CUDA call with a device current, checked, and the
// caller's device restored after it: the one device-switch rule of the
// server, shared by the device backends (server/backends/cuda_device_switch.h:
// event calls, deferred frees) and the memory mappers
// (server/memory/cuda_vmm_device_scope.h: RunOnDevice). Over a small seam
// (DeviceSwitch) so the rule is unit-tested without a GPU
// (tests/server/backends/device_call_test.cc); no CUDA header here (the
// runtime's ops, cuCtxGetCurrent / cudaGetDevice / cudaSetDevice, are in
// each layer's CUDA-only file).
//
// Rule: make `device` current
// (cudaSetDevice, which also makes its primary context current), run the
// call, and restore the caller's device only when the caller HAD a current
// context on entry: cudaGetDevice on a thread without one answers 0, and
// "restoring" that would create GPU 0's primary context in a server that
// may never use GPU 0.
//
// Why `switched`: a failed cudaSetDevice runs nothing, and it must not be
// mistaken for the call's own answer: cudaErrorInvalidDevice is also what
// the driver answers for a client's event of another device (the client's
// fault), while a failed switch is the server's (INTERNAL). `switched` is
// false exactly when the call did not run.
#ifndef TOKENSEL_SERVER_CORE_DEVICE_SWITCH_H_
#define TOKENSEL_SERVER_CORE_DEVICE_SWITCH_H_

namespace tokensel::core {

class DeviceSwitch {
 public:
  virtual ~DeviceSwitch() = default;
  // Whether the calling thread has a current context (cuCtxGetCurrent).
  virtual bool HasCurrentContext() = 0;
  // cudaGetDevice / cudaSetDevice; false on failure.
  virtual bool GetDevice(int* device) = 0;
  virtual bool SetDevice(int device) = 0;
  // Restoring the caller's device failed (logged by the real ops).
  virtual void RestoreFailed(int device) = 0;
};

struct DeviceCall {
  int result = -1;        // the call's (a cudaError_t); meaningless when !switched
  bool switched = false;  // the device was made current and the call ran
};

// Runs `f` (returning a cudaError_t) with `device` current (the rule above).
template <typename F>
DeviceCall OnDeviceChecked(DeviceSwitch& ops, int device, F f) {
  int previous = -1;
  if (ops.HasCurrentContext() && !ops.GetDevice(&previous)) previous = -1;
  if (!ops.SetDevice(device)) return DeviceCall{};
  const DeviceCall call{static_cast<int>(f()), true};
  if (previous >= 0 && previous != device && !ops.SetDevice(previous)) ops.RestoreFailed(previous);
  return call;
}

}  // namespace tokensel::core

#endif  // TOKENSEL_SERVER_CORE_DEVICE_SWITCH_H_
