// The prefix sums of CUDA SamplePackedTokens (kept = r_i, chunk_base = the
// long sequences' chunk counts, both N+1 int64 with [0] = 0), spread over
// blocks so that N in the millions costs a few block-waves, not N / 1024
// dependent tiles in one block (reduce, scan the tile sums, apply):
//   1. PackedTileSumKernel: per tile of kPackedScanTile values, its sums
//      (grid-stride over tiles, cub::BlockReduce).
//   2. PackedTileScanKernel, one block: exclusive prefix sums of the tile
//      sums (ceil(N / 4096) values: one 1024-value step up to N = 4 * 10^6),
//      then T' = the kept total, recorded in the report and compared with
//      the caller's dims (a mismatch is invalid data, as on the CPU).
//   3. PackedTileApplyKernel: per tile, a BlockScan of its values started at
//      the tile's offset; writes the inclusive prefix sums in place.
// No cub::Device* call (its kernels do not pass the 0-spill static checks).
// The sums are exact: every r_i and chunk count is >= 0 and their totals
// are at most N * T < 2^63 (invalid lengths count 0, PackedCheckKernel).
#include <cuda_runtime.h>

#include <cstdint>
#include <cub/cub.cuh>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/sample_packed_internal.cuh"
#include "kernels/cuda/status.cuh"

namespace tokensel::kernels::cuda {
namespace {

constexpr int kScanThreads = 256;
constexpr int kScanItems = static_cast<int>(kPackedScanTile / kScanThreads);
constexpr int kSumsScanItems = 4;
constexpr int64_t kMaxBlocks = int64_t{1} << 16;
static_assert(kPackedScanTile % kScanThreads == 0, "whole items per thread");

// Values v[1 + b * tile + t * kScanItems + j], j < kScanItems (0 past n).
__device__ __forceinline__ long long LoadItems(const long long* v, int64_t n, int64_t first,
                                               long long (&items)[kScanItems]) {
  long long sum = 0;
#pragma unroll
  for (int j = 0; j < kScanItems; ++j) {
    items[j] = first + j <= n ? v[first + j] : 0;
    sum += items[j];
  }
  return sum;
}

__device__ __forceinline__ int64_t FirstOf(int64_t tile) {
  return 1 + tile * kPackedScanTile + int64_t{threadIdx.x} * kScanItems;
}

__global__ void __launch_bounds__(kScanThreads)
    PackedTileSumKernel(const long long* __restrict__ kept,
                        const long long* __restrict__ chunk_base, int64_t n, int64_t tiles,
                        long long* __restrict__ sums) {
  using Reduce = cub::BlockReduce<long long, kScanThreads>;
  __shared__ typename Reduce::TempStorage reduce;
  for (int64_t b = blockIdx.x; b < tiles; b += gridDim.x) {
    long long items[kScanItems];
    const long long kept_sum = Reduce(reduce).Sum(LoadItems(kept, n, FirstOf(b), items));
    if (threadIdx.x == 0) sums[b] = kept_sum;
    __syncthreads();  // the reduce storage is reused
    const long long chunk_sum = Reduce(reduce).Sum(LoadItems(chunk_base, n, FirstOf(b), items));
    if (threadIdx.x == 0) sums[tiles + b] = chunk_sum;
    __syncthreads();
  }
}

// Exclusive prefix sums of v[0, count) in place, one block; returns the
// total (every thread).
__device__ long long BlockExclusiveSums(long long* __restrict__ v, int64_t count) {
  using Scan = cub::BlockScan<long long, kScanThreads>;
  __shared__ typename Scan::TempStorage scan;
  constexpr int64_t kTile = int64_t{kScanThreads} * kSumsScanItems;
  long long running = 0;
  for (int64_t tile = 0; tile < count; tile += kTile) {
    const int64_t first = tile + int64_t{threadIdx.x} * kSumsScanItems;
    long long items[kSumsScanItems];
    long long sum = 0;
#pragma unroll
    for (int j = 0; j < kSumsScanItems; ++j) {
      items[j] = first + j < count ? v[first + j] : 0;
      sum += items[j];
    }
    long long before = 0, total = 0;
    Scan(scan).ExclusiveSum(sum, before, total);
    __syncthreads();  // the scan storage is reused by the next tile
    long long value = running + before;
#pragma unroll
    for (int j = 0; j < kSumsScanItems; ++j) {
      if (first + j < count) v[first + j] = value;
      value += items[j];
    }
    running += total;
  }
  return running;
}

__global__ void __launch_bounds__(kScanThreads)
    PackedTileScanKernel(long long* __restrict__ sums, int64_t tiles, int64_t n,
                         PackedKeptDims dims, long long* __restrict__ report, Workspace ws) {
  const long long t_kept = BlockExclusiveSums(sums, tiles);
  BlockExclusiveSums(sums + tiles, tiles);
  if (threadIdx.x == 0) {
    report[kPackedReportKept] = t_kept;
    // The caller sized its outputs with T' (a dim < 0 means "absent").
    if (t_kept != dims.ids || (dims.positions >= 0 && t_kept != dims.positions) ||
        (dims.out >= 0 && t_kept != dims.out)) {
      SetInvalid(ws, n + 1);
    }
  }
}

__global__ void __launch_bounds__(kScanThreads)
    PackedTileApplyKernel(long long* __restrict__ kept, long long* __restrict__ chunk_base,
                          int64_t n, int64_t tiles, const long long* __restrict__ sums) {
  using Scan = cub::BlockScan<long long, kScanThreads>;
  __shared__ typename Scan::TempStorage scan;
  for (int64_t b = blockIdx.x; b < tiles; b += gridDim.x) {
    for (int c = 0; c < 2; ++c) {
      long long* v = c == 0 ? kept : chunk_base;
      const int64_t first = FirstOf(b);
      long long items[kScanItems];
      long long before = 0;
      Scan(scan).ExclusiveSum(LoadItems(v, n, first, items), before);
      __syncthreads();  // the scan storage is reused
      long long value = sums[c * tiles + b] + before;
#pragma unroll
      for (int j = 0; j < kScanItems; ++j) {
        value += items[j];
        if (first + j <= n) v[first + j] = value;
      }
    }
  }
}

}  // namespace

absl::Status LaunchPackedScan(long long* kept, long long* chunk_base, int64_t n,
                              long long* tile_sums, PackedKeptDims dims, long long* report,
                              Workspace ws, Stream stream) {
  const int64_t tiles = PackedScanTiles(n);
  const auto grid = static_cast<unsigned>(tiles < kMaxBlocks ? tiles : kMaxBlocks);
  if (tiles > 0) {
    PackedTileSumKernel<<<grid, kScanThreads, 0, stream>>>(kept, chunk_base, n, tiles, tile_sums);
    CUDA_RETURN_IF_LAUNCH_ERROR("PackedTileSumKernel");
  }
  PackedTileScanKernel<<<1, kScanThreads, 0, stream>>>(tile_sums, tiles, n, dims, report, ws);
  CUDA_RETURN_IF_LAUNCH_ERROR("PackedTileScanKernel");
  if (tiles > 0) {
    PackedTileApplyKernel<<<grid, kScanThreads, 0, stream>>>(kept, chunk_base, n, tiles, tile_sums);
    CUDA_RETURN_IF_LAUNCH_ERROR("PackedTileApplyKernel");
  }
  return absl::OkStatus();
}

}  // namespace tokensel::kernels::cuda
