// Checked CUDA runtime calls for host code (nvcc or g++ against
// cuda_runtime_api.h). Every CUDA call in tokensel goes through one of these:
//
//   CUDA_RETURN_IF_ERROR(cudaMemsetAsync(p, 0, n, stream));
//   MyKernel<<<grid, block, 0, stream>>>(...);
//   CUDA_RETURN_IF_LAUNCH_ERROR("MyKernel");
//
// Both return absl INTERNAL from the enclosing function (which must return
// absl::Status or absl::StatusOr<T>) with a message naming the expression (or
// kernel), the CUDA error name and cudaGetErrorString, and file:line:
//   "CUDA error: cudaMemsetAsync(p, 0, n, stream) failed: cudaErrorInvalidValue
//    (invalid argument) at kernels/cuda/foo.cu:42"
// CUDA_RETURN_IF_LAUNCH_ERROR uses cudaPeekAtLastError(); when it reports an
// error it also clears it with cudaGetLastError() so that a non-sticky launch
// error (bad configuration) does not poison later, unrelated checks. Sticky
// errors (a kernel fault) stay sticky whatever we do.
#ifndef TOKENSEL_KERNELS_CUDA_CUDA_CHECK_CUH_
#define TOKENSEL_KERNELS_CUDA_CUDA_CHECK_CUH_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace tokensel::kernels::cuda {

// INTERNAL status for a failed CUDA call. `what` is the expression or a
// description ("launch of MyKernel").
inline absl::Status CudaError(cudaError_t err, absl::string_view what, const char* file, int line) {
  return absl::InternalError(absl::StrCat("CUDA error: ", what, " failed: ", cudaGetErrorName(err),
                                          " (", cudaGetErrorString(err), ") at ", file, ":", line));
}

// OK or CudaError(); a function form for call sites that want a Status value.
inline absl::Status CudaStatus(cudaError_t err, absl::string_view what, const char* file,
                               int line) {
  return err == cudaSuccess ? absl::OkStatus() : CudaError(err, what, file, line);
}

}  // namespace tokensel::kernels::cuda

#define CUDA_RETURN_IF_ERROR(expr)                                                                \
  do {                                                                                            \
    const cudaError_t tokensel_cuda_err_ = (expr);                                                \
    if (tokensel_cuda_err_ != cudaSuccess) {                                                      \
      return ::tokensel::kernels::cuda::CudaError(tokensel_cuda_err_, #expr, __FILE__, __LINE__); \
    }                                                                                             \
  } while (false)

// `kernel_name` is a string literal naming the kernel just launched.
#define CUDA_RETURN_IF_LAUNCH_ERROR(kernel_name)                                                \
  do {                                                                                          \
    const cudaError_t tokensel_cuda_err_ = cudaPeekAtLastError();                               \
    if (tokensel_cuda_err_ != cudaSuccess) {                                                    \
      (void)cudaGetLastError();                                                                 \
      return ::tokensel::kernels::cuda::CudaError(tokensel_cuda_err_, "launch of " kernel_name, \
                                                  __FILE__, __LINE__);                          \
    }                                                                                           \
  } while (false)

#endif  // TOKENSEL_KERNELS_CUDA_CUDA_CHECK_CUH_
