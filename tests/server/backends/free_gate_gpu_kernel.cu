// LaunchTrivialKernel (contract: free_gate_gpu_kernel.h).
#include "tests/server/backends/free_gate_gpu_kernel.h"

namespace tokensel::testing {
namespace {

__global__ void TrivialKernel() {}

}  // namespace

cudaError_t LaunchTrivialKernel(cudaStream_t stream) {
  TrivialKernel<<<1, 1, 0, stream>>>();
  return cudaGetLastError();
}

}  // namespace tokensel::testing
