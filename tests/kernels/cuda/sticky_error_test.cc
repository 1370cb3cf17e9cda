// IsStickyError: the CUDA errors after which the server stops using a device
// (kernels/cuda/sticky_error.h). No device needed.
#include "kernels/cuda/sticky_error.h"

#include <cuda_runtime_api.h>

#include "gtest/gtest.h"

namespace tokensel::kernels::cuda {
namespace {

TEST(StickyErrorTest, KernelFaultsAreSticky) {
  for (cudaError_t err :
       {cudaErrorIllegalAddress, cudaErrorLaunchFailure, cudaErrorHardwareStackError,
        cudaErrorIllegalInstruction, cudaErrorMisalignedAddress, cudaErrorInvalidAddressSpace,
        cudaErrorInvalidPc, cudaErrorAssert, cudaErrorLaunchTimeout, cudaErrorTensorMemoryLeak,
        cudaErrorContained, cudaErrorMpsClientTerminated, cudaErrorExternalDevice,
        cudaErrorECCUncorrectable, cudaErrorNvlinkUncorrectable, cudaErrorUnknown}) {
    EXPECT_TRUE(IsStickyError(err)) << cudaGetErrorName(err);
  }
}

TEST(StickyErrorTest, RecoverableErrorsAreNot) {
  for (cudaError_t err :
       {cudaSuccess, cudaErrorMemoryAllocation, cudaErrorInvalidValue,
        cudaErrorInvalidConfiguration, cudaErrorLaunchOutOfResources, cudaErrorNotReady,
        cudaErrorInvalidDevice, cudaErrorNoDevice, cudaErrorInsufficientDriver,
        cudaErrorInvalidResourceHandle, cudaErrorPeerAccessNotEnabled, cudaErrorNotSupported}) {
    EXPECT_FALSE(IsStickyError(err)) << cudaGetErrorName(err);
  }
}

static_assert(IsStickyError(cudaErrorIllegalAddress), "usable in constant expressions");

}  // namespace
}  // namespace tokensel::kernels::cuda
