// A trivial kernel for free_gate_gpu_test.cc (compiled by nvcc in
// free_gate_gpu_kernel.cu; the test itself is host C++): launched on a
// second stream of a device to show that its work is not held up behind a
// stuck stream of that (or another) device.
#ifndef TOKENSEL_TESTS_SERVER_BACKENDS_FREE_GATE_GPU_KERNEL_H_
#define TOKENSEL_TESTS_SERVER_BACKENDS_FREE_GATE_GPU_KERNEL_H_

#include <cuda_runtime_api.h>

namespace tokensel::testing {

// Queues one empty kernel (one thread) on `stream` (its device current);
// returns the launch's error.
cudaError_t LaunchTrivialKernel(cudaStream_t stream);

}  // namespace tokensel::testing

#endif  // TOKENSEL_TESTS_SERVER_BACKENDS_FREE_GATE_GPU_KERNEL_H_
