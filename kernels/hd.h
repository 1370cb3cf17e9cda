// TOKENSEL_HD marks functions that both the host compiler and nvcc compile, so
// the CPU oracle executes exactly the index arithmetic of the CUDA kernels.
// This is the only place in shared headers that looks at __CUDACC__.
#ifndef TOKENSEL_KERNELS_HD_H_
#define TOKENSEL_KERNELS_HD_H_

#if defined(__CUDACC__)
#define TOKENSEL_HD __host__ __device__ __forceinline__
#else
#define TOKENSEL_HD inline
#endif

#endif  // TOKENSEL_KERNELS_HD_H_
