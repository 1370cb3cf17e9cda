// Sparse rows of SortTokens and ScatterTokens (contracts: sparse_sort.h;
// layout: SparseSortLayout, workspace_layout.h; docs/gpu.md "Sparse rows").
//
// Launches, in stream order, on the snapshot (rows * R ids, compact):
//   1. SparseTileSortKernel<T>: one block per (row, tile of 1024 ids),
//      grid-stride. 256 threads load 4 ids each (striped, coalesced; the
//      tail padded with T's maximum, which sorts last and is never stored),
//      cub::BlockRadixSort (all bits: negative ids sort first and are caught
//      by the check) and store the tile's valid prefix to keys[0] striped.
//   2. (R > 1024) SparseMergeKernel<T>, once per pass, run = 1024 << pass:
//      one thread per id; pairs of adjacent sorted runs of a row are merged
//      by rank. An id at offset o of its run goes to o + (ids of the partner
//      run < it, or <= it for the right run: ties keep left before right),
//      found by binary search. Ping-pongs keys[0] <-> keys[1].
//   3. SparseCheckKernel<T>: one thread per sorted id: outside [0, limit) or
//      equal to its predecessor in the row -> SetInvalid.
// Then, SortTokens only (LaunchSparseSortWrite), gated on the status word:
//   4. (inverse) SparseInverseFillKernel: inverse[row, :] = -1.
//   5. SparseWriteKernel<T, kInverse>: out[row, k] = sorted[row, k] (and
//      inverse[row, sorted[row, k]] = k), one thread per id.
// Nothing reads client ids: the snapshot was their only read. Every address a
// write kernel forms comes from the sorted keys, which the check accepted.
#include "kernels/cuda/sparse_sort.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <cub/cub.cuh>
#include <limits>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/status.cuh"
#include "kernels/cuda/view_access.cuh"
#include "kernels/cuda/workspace_layout.h"
#include "kernels/sort_math.h"

namespace tokensel::kernels::cuda {
namespace {

constexpr int kTileThreads = 256;
constexpr int kTileItems = 4;
constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = int64_t{1} << 16;  // grid-stride loops cover the rest

static_assert(int64_t{kTileThreads} * kTileItems == kSparseSortTile,
              "workspace_layout.h counts the merge passes from the tile size");

unsigned Blocks(int64_t work, int64_t per_block) {
  const int64_t blocks = (work + per_block - 1) / per_block;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

template <typename T>
__global__ void __launch_bounds__(kTileThreads)
    SparseTileSortKernel(const T* __restrict__ in, T* __restrict__ out, int64_t r, int64_t tiles,
                         int64_t items) {
  using Sort = cub::BlockRadixSort<T, kTileThreads, kTileItems>;
  __shared__ typename Sort::TempStorage temp;
  const int tid = threadIdx.x;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    int64_t row;
    const int64_t t0 = DivMod(item, tiles, &row) * kSparseSortTile;
    const int64_t n = r - t0 < kSparseSortTile ? r - t0 : kSparseSortTile;
    const T* src = in + row * r + t0;
    T keys[kTileItems];
#pragma unroll
    for (int j = 0; j < kTileItems; ++j) {
      const int k = j * kTileThreads + tid;
      keys[j] = k < n ? src[k] : std::numeric_limits<T>::max();
    }
    Sort(temp).SortBlockedToStriped(keys);
    T* dst = out + row * r + t0;
#pragma unroll
    for (int j = 0; j < kTileItems; ++j) {
      const int k = j * kTileThreads + tid;
      if (k < n) dst[k] = keys[j];
    }
    __syncthreads();  // `temp` is reused by the next item
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    SparseMergeKernel(const T* __restrict__ in, T* __restrict__ out, int64_t r, int64_t total,
                      int64_t run) {
  const int64_t step = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total; i += step) {
    int64_t row, k;
    const int64_t pos = DivMod(i, r, &row);
    const int64_t offset = DivMod(pos, run, &k);  // pos = k * run + offset
    const T* row_in = in + row * r;
    const T x = row_in[pos];
    const bool left = (k & 1) == 0;
    const int64_t start = pos - offset;
    const int64_t partner = left ? start + run : start - run;
    const int64_t partner_end = partner + run < r ? partner + run : r;
    int64_t lo = partner;
    int64_t hi = partner_end > partner ? partner_end : partner;  // empty past the row
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      const T v = row_in[mid];
      if (left ? v < x : v <= x) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    const int64_t merged = left ? start : partner;
    out[row * r + merged + offset + (lo - partner)] = x;
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    SparseCheckKernel(const T* __restrict__ sorted, int64_t r, int64_t total, int64_t limit,
                      Workspace ws) {
  const int64_t step = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total; i += step) {
    int64_t row;
    const int64_t pos = DivMod(i, r, &row);
    const T x = sorted[i];
    if (!IdInRange(x, limit) || (pos > 0 && sorted[i - 1] == x)) SetInvalid(ws);
  }
}

__global__ void __launch_bounds__(kThreads)
    SparseInverseFillKernel(TensorView inverse, int64_t s, int64_t total, bool aligned,
                            Workspace ws) {
  if (IsInvalid(ws)) return;
  const int64_t stride = LastStride(inverse);
  const int64_t step = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total; i += step) {
    int64_t row;
    const int64_t p = DivMod(i, s, &row);
    StoreI32(inverse.data, DeviceRowOffset(inverse, row) + p * stride, -1, aligned);
  }
}

template <typename T, bool kInverse>
__global__ void __launch_bounds__(kThreads)
    SparseWriteKernel(const T* __restrict__ sorted, int64_t r, int64_t total, TensorView out,
                      bool out_aligned, TensorView inverse, bool inv_aligned, Workspace ws) {
  if (IsInvalid(ws)) return;
  const int64_t out_stride = LastStride(out);
  const int64_t inv_stride = kInverse ? LastStride(inverse) : 0;
  const int64_t step = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total; i += step) {
    int64_t row;
    const int64_t pos = DivMod(i, r, &row);
    const int64_t id = sorted[i];
    StoreId(out, DeviceRowOffset(out, row) + pos * out_stride, id, out_aligned);
    if constexpr (kInverse) {
      StoreI32(inverse.data, DeviceRowOffset(inverse, row) + id * inv_stride,
               static_cast<int32_t>(pos), inv_aligned);
    }
  }
}

template <typename T>
absl::Status SortAndCheck(const SparseSortLayout& l, const T* snapshot, int64_t limit, Workspace ws,
                          Stream stream) {
  T* keys[2] = {static_cast<T*>(SectionAt(ws, l.keys[0])),
                l.passes > 0 ? static_cast<T*>(SectionAt(ws, l.keys[1])) : nullptr};
  const int64_t tiles = (l.r + kSparseSortTile - 1) / kSparseSortTile;
  const int64_t items = l.rows * tiles;
  SparseTileSortKernel<T>
      <<<Blocks(items, 1), kTileThreads, 0, stream>>>(snapshot, keys[0], l.r, tiles, items);
  CUDA_RETURN_IF_LAUNCH_ERROR("SparseTileSortKernel");
  const int64_t total = l.rows * l.r;
  int64_t run = kSparseSortTile;
  for (int pass = 0; pass < l.passes; ++pass, run *= 2) {
    SparseMergeKernel<T><<<Blocks(total, kThreads), kThreads, 0, stream>>>(
        keys[pass % 2], keys[(pass + 1) % 2], l.r, total, run);
    CUDA_RETURN_IF_LAUNCH_ERROR("SparseMergeKernel");
  }
  SparseCheckKernel<T>
      <<<Blocks(total, kThreads), kThreads, 0, stream>>>(keys[l.passes % 2], l.r, total, limit, ws);
  CUDA_RETURN_IF_LAUNCH_ERROR("SparseCheckKernel");
  return absl::OkStatus();
}

template <typename T>
absl::Status Write(const SparseSortLayout& l, Workspace ws, const TensorView& out,
                   const TensorView* inverse, int64_t s, Stream stream) {
  const T* sorted = static_cast<const T*>(SectionAt(ws, l.sorted()));
  const int64_t total = l.rows * l.r;
  const bool out_aligned = ElementsAligned(out);
  const unsigned blocks = Blocks(total, kThreads);
  if (inverse == nullptr) {
    SparseWriteKernel<T, false><<<blocks, kThreads, 0, stream>>>(
        sorted, l.r, total, out, out_aligned, TensorView{}, true, ws);
    CUDA_RETURN_IF_LAUNCH_ERROR("SparseWriteKernel");
    return absl::OkStatus();
  }
  const bool inv_aligned = ElementsAligned(*inverse);
  const int64_t entries = l.rows * s;  // the inverse's elements (a validated view)
  SparseInverseFillKernel<<<Blocks(entries, kThreads), kThreads, 0, stream>>>(*inverse, s, entries,
                                                                              inv_aligned, ws);
  CUDA_RETURN_IF_LAUNCH_ERROR("SparseInverseFillKernel");
  SparseWriteKernel<T, true><<<blocks, kThreads, 0, stream>>>(sorted, l.r, total, out, out_aligned,
                                                              *inverse, inv_aligned, ws);
  CUDA_RETURN_IF_LAUNCH_ERROR("SparseWriteKernel");
  return absl::OkStatus();
}

}  // namespace

absl::Status LaunchSparseSortAndCheck(const SparseSortLayout& l, DType dtype, const void* snapshot,
                                      int64_t limit, Workspace ws, Stream stream) {
  if (l.rows == 0 || l.r == 0) return absl::OkStatus();
  if (dtype == DType::kInt64) {
    return SortAndCheck(l, static_cast<const long long*>(snapshot), limit, ws, stream);
  }
  return SortAndCheck(l, static_cast<const int32_t*>(snapshot), limit, ws, stream);
}

absl::Status LaunchSparseSortWrite(const SparseSortLayout& l, Workspace ws, const TensorView& out,
                                   const TensorView* inverse, int64_t s, Stream stream) {
  if (l.rows == 0 || l.r == 0) return absl::OkStatus();
  if (out.dtype == DType::kInt64) return Write<long long>(l, ws, out, inverse, s, stream);
  return Write<int32_t>(l, ws, out, inverse, s, stream);
}

}  // namespace tokensel::kernels::cuda
