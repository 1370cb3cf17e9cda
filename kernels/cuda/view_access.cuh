// Element access to TensorViews in device code, shared by the CUDA ops:
// index loads/stores that allow any alignment (LoadId / StoreId / StoreI32)
// and the device forms of the row-major view math of tensor_view.h
// (DeviceRowOffset / LastStride) that keep views in kernel-parameter space.
// Device code only (include from .cu / .cuh files compiled by nvcc).
#ifndef TOKENSEL_KERNELS_CUDA_VIEW_ACCESS_CUH_
#define TOKENSEL_KERNELS_CUDA_VIEW_ACCESS_CUH_

#include <cstdint>
#include <cstring>

#include "kernels/tensor_view.h"

namespace tokensel::kernels::cuda {

// Index element I/O for the CUDA ops: `aligned` (uniform, computed on the
// host: base pointer aligned to the element size; strides are in elements so
// then every element is) selects a plain load/store, otherwise the
// byte-wise LoadIndex/StoreIndex of tensor_view.h (views may be unaligned).
__device__ __forceinline__ int64_t LoadId(const TensorView& v, int64_t offset, bool aligned) {
  if (!aligned) return LoadIndex(v, offset);
  if (v.dtype == DType::kInt64) return static_cast<const int64_t*>(v.data)[offset];
  return static_cast<const int32_t*>(v.data)[offset];
}
__device__ __forceinline__ void StoreId(const TensorView& v, int64_t offset, int64_t value,
                                        bool aligned) {
  if (!aligned) return StoreIndex(v, offset, value);
  if (v.dtype == DType::kInt64) {
    static_cast<int64_t*>(v.data)[offset] = value;
  } else {
    static_cast<int32_t*>(v.data)[offset] = static_cast<int32_t>(value);
  }
}
// Device forms of the view index math of tensor_view.h (RowOffset, the
// last stride): the same row-major unravel, but with a
// constant trip count (kMaxRank) so the loops unroll and the view's arrays
// are read straight from the kernel parameters. A loop bounded by the
// run-time rank indexes them dynamically and makes nvcc copy the view to
// local memory (a 112-byte stack frame per view).
__device__ __forceinline__ int64_t ViewDim(const int64_t (&a)[kMaxRank], int d) {
  int64_t x = a[0];
#pragma unroll
  for (int i = 1; i < kMaxRank; ++i) x = i == d ? a[i] : x;
  return x;
}
__device__ __forceinline__ int64_t LastStride(const TensorView& v) {
  return ViewDim(v.strides, v.rank - 1);
}
// q = a / n, returns a % n. Inline 32-bit division when both fit (always in
// practice); the 64-bit division is a called subroutine whose ABI makes ptxas
// spill registers around the call sites in some kernels.
__device__ __forceinline__ int64_t DivMod(int64_t a, int64_t n, int64_t* q) {
  if (((static_cast<uint64_t>(a) | static_cast<uint64_t>(n)) >> 32) == 0) {
    const uint32_t a32 = static_cast<uint32_t>(a), n32 = static_cast<uint32_t>(n);
    const uint32_t q32 = a32 / n32;
    *q = q32;
    return a32 - q32 * n32;
  }
  *q = a / n;
  return a - *q * n;
}
__device__ __forceinline__ int64_t DeviceRowOffset(const TensorView& v, int64_t row) {
  int64_t offset = 0;
#pragma unroll
  for (int d = kMaxRank - 2; d >= 0; --d) {
    if (d <= v.rank - 2) offset += DivMod(row, v.shape[d], &row) * v.strides[d];
  }
  return offset;
}

// Host side: true when every element of `v` is naturally aligned.
inline bool ElementsAligned(const TensorView& v) {
  return reinterpret_cast<uintptr_t>(v.data) % static_cast<uintptr_t>(v.elem_size()) == 0;
}
// int32 element (inverse maps).
__device__ __forceinline__ void StoreI32(void* base, int64_t offset, int32_t value, bool aligned) {
  if (aligned) {
    static_cast<int32_t*>(base)[offset] = value;
  } else {
    memcpy(static_cast<char*>(base) + offset * 4, &value, sizeof(value));
  }
}

}  // namespace tokensel::kernels::cuda

#endif  // TOKENSEL_KERNELS_CUDA_VIEW_ACCESS_CUH_
