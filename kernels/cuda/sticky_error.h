// Which CUDA errors are sticky: after one of them the CUDA context of the
// device is corrupt, every later call in this process on that context fails
// with the same error, and only a new process gets a working context (the
// CUDA runtime's own words for each: "the process must be terminated and
// relaunched"). The server uses this to stop serving a device after a fault
// instead of answering every later op on it with the same error
// (server/backends/cuda_backend.h); the classification needs no device, so it
// is unit-tested anywhere nvcc builds (tests/kernels/cuda/sticky_error_test.cc).
//
// Sticky, from cuda_runtime_api's driver_types.h (CUDA 13) documentation:
// cudaErrorIllegalAddress, cudaErrorLaunchTimeout, cudaErrorAssert,
// cudaErrorHardwareStackError, cudaErrorIllegalInstruction,
// cudaErrorMisalignedAddress, cudaErrorInvalidAddressSpace, cudaErrorInvalidPc,
// cudaErrorLaunchFailure, cudaErrorTensorMemoryLeak, cudaErrorContained,
// cudaErrorMpsClientTerminated, cudaErrorExternalDevice. Added:
// cudaErrorECCUncorrectable (the data on the device is lost and the GPU needs
// a reset; the documentation does not say "sticky", the driver behaves so),
// cudaErrorNvlinkUncorrectable (the same class, on the link) and
// cudaErrorUnknown (what a GPU that fell off the bus tends to return). A
// false positive costs a restart; a false negative leaves a dead device
// answering INTERNAL forever (from the CUDA review).
// Not sticky: everything else, in particular cudaErrorMemoryAllocation and the
// launch configuration errors (cudaErrorInvalidConfiguration,
// cudaErrorLaunchOutOfResources, cudaErrorInvalidValue): the context survives
// them and the next op may succeed.
#ifndef TOKENSEL_KERNELS_CUDA_STICKY_ERROR_H_
#define TOKENSEL_KERNELS_CUDA_STICKY_ERROR_H_

#include <cuda_runtime_api.h>

namespace tokensel::kernels::cuda {

constexpr bool IsStickyError(cudaError_t err) {
  switch (err) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchFailure:
    case cudaErrorTensorMemoryLeak:
    case cudaErrorContained:
    case cudaErrorMpsClientTerminated:
    case cudaErrorExternalDevice:
    case cudaErrorECCUncorrectable:
    case cudaErrorNvlinkUncorrectable:
    case cudaErrorUnknown:
      return true;
    default:
      return false;
  }
}

}  // namespace tokensel::kernels::cuda

#endif  // TOKENSEL_KERNELS_CUDA_STICKY_ERROR_H_
