// CUDA SortTokens: comparison-free bitmap sort, any S (contract: ops.h,
// cuda_ops.h; CPU twin: kernels/cpu/sort_tokens.cc; math: sort_math.h).
//
// Workspace (SortTokensLayout, workspace_layout.h):
//   [status block 256 B][bitmaps: rows * BitmapWords(S) uint64]
//   and, when a row spans several chunks of kChunkBits ids:
//   [chunk ranks: rows * chunks int64]
//   [snapshot of ids: rows * R, their dtype]
//
// Launches, in stream order:
//   1. cudaMemsetAsync of the status block and the bitmaps (one call).
//   2. SnapshotKernel (snapshot.cuh): the only read of the client's ids, into
//      the workspace. (SortMarkKernel alone read each id once, but the error
//      path of Finish re-read the client tensor: a client that changed it
//      meanwhile got a message about other data, or INTERNAL when the CPU
//      oracle found nothing wrong. Both now read the snapshot.)
//   3. SortMarkKernel, grid-stride over all rows*R snapshot ids: id out of
//      range or negative, or its bit already set (atomicOr returns the old
//      word) -> SetInvalid(ws, linear index). Writes only the bitmap.
//   4. (chunks > 1) SortCountKernel, one block per (row, chunk): popcount of
//      the chunk; SortRowScanKernel, one block per row: exclusive
//      cub::BlockScan (running prefix over tiles) of the row's chunk counts =
//      the rank of each chunk's lowest id. (Not cub::DeviceScan: its kernel
//      spills 4 bytes on sm_80 with 64-bit counts.)
//   5. SortWriteKernel<kWalk, kInverse>, one block per (row, chunk), returns
//      at once when the status word is set. Per chunk: each thread loads 4
//      bitmap words, a cub::BlockScan of their popcounts gives every word's
//      rank; id v is written at rank popcount(bitmap[0..v)). With an inverse,
//      or a dense row (R >= S/8), the block walks the chunk's positions in
//      order (coalesced int32 stores of rank or -1; out[rank] = position for
//      set bits); a sparse row without inverse has each thread emit the set
//      bits of its words (ctz loop), O(S/64 + R).
// Sparse rows (PreferSortingToBitmap(R, S), the CPU twin's rule: e.g.
// [192, 3] ids with S = 2^31-1, whose bitmaps would need 48 GiB) skip steps
// 1, 3-5: after the status reset and the snapshot, sparse_sort.cu sorts each
// row by comparison in O(rows * R) workspace, checks the sorted rows and
// writes them (sparse_sort.h).
// In place is safe: step 2 reads every id before step 5 (a later launch)
// writes any. On invalid data only the workspace has been written. Every
// address the write kernel forms comes from the bitmap (server memory): a
// row's bitmap holds at most R bits once the mark kernel accepted it, so
// ranks stay below R.
#include <cuda_runtime.h>

#include <cstdint>
#include <cub/cub.cuh>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/oracle_args.h"
#include "kernels/cuda/snapshot.cuh"
#include "kernels/cuda/sparse_sort.h"
#include "kernels/cuda/status.cuh"
#include "kernels/cuda/view_access.cuh"
#include "kernels/cuda/workspace_layout.h"
#include "kernels/ops.h"
#include "kernels/sort_math.h"

namespace tokensel::kernels::cuda {
namespace {

constexpr int kSortThreads = 256;
constexpr int kWordsPerThread = 4;
constexpr int64_t kChunkWords = int64_t{kSortThreads} * kWordsPerThread;  // 1024 words
constexpr int64_t kChunkBits = kChunkWords * kBitmapWordBits;             // 65536 ids
constexpr int kMarkThreads = 256;
// Rows with R * kDenseIdsPerWord >= S (>= 8 ids per bitmap word on average)
// are written by walking positions, sparser rows by per-word ctz loops.
constexpr int64_t kDenseIdsPerWord = 8;
constexpr int64_t kMaxBlocks = int64_t{1} << 16;  // grid-stride loops cover the rest

static_assert(kChunkWords == kSortChunkWords, "workspace_layout.h sizes the chunk ranks");

unsigned Blocks(int64_t work, int64_t per_block) {
  const int64_t blocks = (work + per_block - 1) / per_block;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

__global__ void __launch_bounds__(kMarkThreads)
    SortMarkKernel(TensorView ids, int64_t total, int64_t r, int64_t s, int64_t words,
                   unsigned long long* bitmaps, bool aligned, Workspace ws) {
  const int64_t step = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total; i += step) {
    int64_t row;
    const int64_t position = DivMod(i, r, &row);
    const int64_t id = LoadId(ids, DeviceRowOffset(ids, row) + position * LastStride(ids), aligned);
    if (!IdInRange(id, s)) {
      SetInvalid(ws, i);
      continue;
    }
    const unsigned long long mask = BitmapMask(id);
    const unsigned long long old = atomicOr(bitmaps + row * words + BitmapWord(id), mask);
    if ((old & mask) != 0) SetInvalid(ws, i);  // duplicate
  }
}

__global__ void __launch_bounds__(kSortThreads)
    SortCountKernel(const unsigned long long* bitmaps, int64_t words, int64_t chunks, int64_t items,
                    long long* counts, Workspace ws) {
  using Reduce = cub::BlockReduce<long long, kSortThreads>;
  __shared__ typename Reduce::TempStorage reduce;
  if (IsInvalid(ws)) return;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    int64_t row;
    const int64_t w0 = DivMod(item, chunks, &row) * kChunkWords;
    const int64_t nw = words - w0 < kChunkWords ? words - w0 : kChunkWords;
    const unsigned long long* bits = bitmaps + row * words + w0;
    long long count = 0;
    for (int64_t w = threadIdx.x; w < nw; w += kSortThreads) count += __popcll(bits[w]);
    const long long sum = Reduce(reduce).Sum(count);
    if (threadIdx.x == 0) counts[item] = sum;
    __syncthreads();  // `reduce` is reused by the next item
  }
}

// counts[row, 0..chunks) <- exclusive prefix sums, per row.
__global__ void __launch_bounds__(kSortThreads)
    SortRowScanKernel(long long* counts, int64_t rows, int64_t chunks, Workspace ws) {
  using Scan = cub::BlockScan<long long, kSortThreads>;
  __shared__ typename Scan::TempStorage scan;
  if (IsInvalid(ws)) return;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    long long* c = counts + row * chunks;
    long long running = 0;
    for (int64_t tile = 0; tile < chunks; tile += kSortThreads) {
      const int64_t i = tile + threadIdx.x;
      const long long value = i < chunks ? c[i] : 0;
      long long before, total;
      Scan(scan).ExclusiveSum(value, before, total);
      if (i < chunks) c[i] = running + before;
      running += total;
      __syncthreads();  // `scan` is reused by the next tile
    }
  }
}

struct SortWriteShared {
  cub::BlockScan<uint32_t, kSortThreads>::TempStorage scan;
  unsigned long long words[kChunkWords];
  uint32_t ranks[kChunkWords];  // chunk-local rank of each word's lowest id
};

// kWalk: the block walks the chunk's positions in order (coalesced; needed
// for the inverse, and faster for dense rows); else each thread emits the set
// bits of its own words (O(words + R), for sparse rows: R << S).
template <bool kWalk, bool kInverse>
__global__ void __launch_bounds__(kSortThreads)
    SortWriteKernel(const unsigned long long* bitmaps, int64_t words, int64_t chunks, int64_t items,
                    int64_t s, const long long* chunk_ranks, TensorView out, bool out_aligned,
                    TensorView inverse, bool inv_aligned, Workspace ws) {
  __shared__ SortWriteShared sh;
  if (IsInvalid(ws)) return;
  const int tid = threadIdx.x;
  const int64_t out_stride = LastStride(out);
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    int64_t row;
    const int64_t w0 = DivMod(item, chunks, &row) * kChunkWords;
    const int64_t nw = words - w0 < kChunkWords ? words - w0 : kChunkWords;
    const unsigned long long* bits = bitmaps + row * words + w0;
    const int64_t base = chunk_ranks == nullptr ? 0 : chunk_ranks[item];
    unsigned long long w[kWordsPerThread];
    uint32_t count = 0;
#pragma unroll
    for (int j = 0; j < kWordsPerThread; ++j) {
      const int64_t lw = int64_t{tid} * kWordsPerThread + j;
      w[j] = lw < nw ? bits[lw] : 0ull;
      count += __popcll(w[j]);
    }
    uint32_t rank;
    cub::BlockScan<uint32_t, kSortThreads>(sh.scan).ExclusiveSum(count, rank);
    const int64_t out_row = DeviceRowOffset(out, row);
    if constexpr (kWalk) {
#pragma unroll
      for (int j = 0; j < kWordsPerThread; ++j) {
        sh.words[tid * kWordsPerThread + j] = w[j];
        sh.ranks[tid * kWordsPerThread + j] = rank;
        rank += __popcll(w[j]);
      }
      __syncthreads();
      const int64_t inv_row = kInverse ? DeviceRowOffset(inverse, row) : 0;
      const int64_t inv_stride = kInverse ? LastStride(inverse) : 0;
      const int64_t p0 = w0 * kBitmapWordBits;
      const int64_t np = s - p0 < kChunkBits ? s - p0 : kChunkBits;
      for (int64_t lp = tid; lp < np; lp += kSortThreads) {
        const unsigned long long word = sh.words[lp >> 6];
        const int bit = static_cast<int>(lp & 63);
        int32_t value = -1;
        if ((word >> bit) & 1ull) {
          const int64_t r = base + sh.ranks[lp >> 6] + __popcll(word & ((1ull << bit) - 1));
          StoreId(out, out_row + r * out_stride, p0 + lp, out_aligned);
          value = static_cast<int32_t>(r);
        }
        if (kInverse) StoreI32(inverse.data, inv_row + (p0 + lp) * inv_stride, value, inv_aligned);
      }
    } else {
      int64_t r = base + rank;
#pragma unroll
      for (int j = 0; j < kWordsPerThread; ++j) {
        const int64_t id0 = (w0 + int64_t{tid} * kWordsPerThread + j) * kBitmapWordBits;
        for (unsigned long long word = w[j]; word != 0; word &= word - 1, ++r) {
          StoreId(out, out_row + r * out_stride, id0 + __ffsll(word) - 1, out_aligned);
        }
      }
    }
    __syncthreads();  // shared memory is reused by the next item
  }
}

}  // namespace

size_t SortTokensWorkspaceBytes(const SortTokensArgs& args) { return SortTokensLayout(args).total; }

absl::Status SortTokensAsync(const SortTokensArgs& args, Workspace ws, Stream stream) {
  RETURN_IF_ERROR(ValidateSortTokens(args));
  const SortLayout l = SortTokensLayout(args);
  RETURN_IF_ERROR(CheckWorkspace(ws, l.total, "SortTokens"));
  const TensorView& out = args.out.has_value() ? *args.out : args.ids;
  if (l.sparse.used) {
    RETURN_IF_ERROR(ResetStatusAsync(ws, stream));
    if (l.rows == 0) return absl::OkStatus();
    void* snapshot = SectionAt(ws, l.snapshot);
    RETURN_IF_ERROR(LaunchSnapshot(args.ids, snapshot, stream));
    RETURN_IF_ERROR(LaunchSparseSortAndCheck(l.sparse, args.ids.dtype, snapshot,
                                             args.original_tokens, ws, stream));
    return LaunchSparseSortWrite(l.sparse, ws, out,
                                 args.inverse.has_value() ? &*args.inverse : nullptr,
                                 args.original_tokens, stream);
  }
  // The status block and the bitmaps are contiguous: one memset clears both.
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(ws.data, 0, l.bitmaps + l.bitmap_bytes, stream));
  if (l.rows == 0) return absl::OkStatus();
  const int64_t s = args.original_tokens;
  auto* bitmaps = static_cast<unsigned long long*>(SectionAt(ws, l.bitmaps));
  const TensorView ids = SnapshotView(args.ids, SectionAt(ws, l.snapshot));
  RETURN_IF_ERROR(LaunchSnapshot(args.ids, ids.data, stream));
  const int64_t total = l.rows * l.r;
  SortMarkKernel<<<Blocks(total, kMarkThreads), kMarkThreads, 0, stream>>>(
      ids, total, l.r, s, l.words, bitmaps, /*aligned=*/true, ws);
  CUDA_RETURN_IF_LAUNCH_ERROR("SortMarkKernel");

  const int64_t items = l.rows * l.chunks;
  long long* ranks = nullptr;
  if (l.chunks > 1) {
    ranks = static_cast<long long*>(SectionAt(ws, l.ranks));
    SortCountKernel<<<Blocks(items, 1), kSortThreads, 0, stream>>>(bitmaps, l.words, l.chunks,
                                                                   items, ranks, ws);
    CUDA_RETURN_IF_LAUNCH_ERROR("SortCountKernel");
    SortRowScanKernel<<<Blocks(l.rows, 1), kSortThreads, 0, stream>>>(ranks, l.rows, l.chunks, ws);
    CUDA_RETURN_IF_LAUNCH_ERROR("SortRowScanKernel");
  }
  const bool aligned = ElementsAligned(out);
  if (args.inverse.has_value()) {
    SortWriteKernel<true, true><<<Blocks(items, 1), kSortThreads, 0, stream>>>(
        bitmaps, l.words, l.chunks, items, s, ranks, out, aligned, *args.inverse,
        ElementsAligned(*args.inverse), ws);
  } else if (l.r * kDenseIdsPerWord >= s) {
    SortWriteKernel<true, false><<<Blocks(items, 1), kSortThreads, 0, stream>>>(
        bitmaps, l.words, l.chunks, items, s, ranks, out, aligned, TensorView{}, true, ws);
  } else {
    SortWriteKernel<false, false><<<Blocks(items, 1), kSortThreads, 0, stream>>>(
        bitmaps, l.words, l.chunks, items, s, ranks, out, aligned, TensorView{}, true, ws);
  }
  CUDA_RETURN_IF_LAUNCH_ERROR("SortWriteKernel");
  return absl::OkStatus();
}

absl::Status SortTokensFinish(const SortTokensArgs& args, Workspace ws, Stream stream) {
  // The message is computed from the snapshot the device validated, without
  // the inverse (oracle_args.h: no host buffer of rows * S int32). With
  // out == ids (in place) host.ids now differs from host.out: the CPU op then
  // validates them as separate views, which they are.
  SortTokensArgs host = SortTokensOracleArgs(args, SectionAt(ws, SortTokensLayout(args).snapshot));
  std::vector<TensorView*> scratch;
  if (host.out.has_value()) scratch.push_back(&*host.out);
  TensorView* inputs[] = {&host.ids};
  return FinishWithCpuOracle(ws, stream, "SortTokens", inputs, scratch,
                             [&] { return cpu::SortTokens(host, nullptr); });
}

}  // namespace tokensel::kernels::cuda
