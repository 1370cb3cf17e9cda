// The long sequences of CUDA SamplePackedTokens (n_i >= kPackedLongMinTokens;
// plan and bounds: sample_packed_plan.h), balanced by tokens: a long
// sequence is cut into chunks of kPackedChunkTokens tokens and every pass
// runs one 256-thread block's task per (layer, chunk), grid-stride over
// L * G tasks (G = chunk_base[N], read on the device; the grid is GridFor's
// resident capacity of the device, at most the host bound L *
// PackedMaxChunks(T) tasks). The same select as the
// short path (select.cuh), spread over blocks:
//   1. PackedLongInitKernel: per (layer, long sequence) its state (r == 0
//      and r == n are final at once, as in BlockSelectThreshold) and a zero
//      256-bucket histogram.
//   2. kPackedLongPasses x (PackedLongHistKernel(shift),
//      PackedLongDecideKernel(shift)): each chunk block adds the digit
//      histogram of its candidates (keys whose digits above `shift` equal the
//      prefix) to its sequence's histogram (shared memory, then one global
//      atomicAdd per bucket); then the sequence's first-chunk block picks the
//      bucket exactly as BlockSelectThreshold does (the same descending
//      BlockScan, the same early exit on a whole bucket) and clears the
//      histogram. A pass after a sequence is done returns at once.
//   3. PackedLongCountKernel: per chunk, its (#keys == T, #keys > T) pair.
//   4. PackedLongScanKernel: per layer, exclusive prefix sums of those pairs
//      over the layer's chunks (one block per layer, tiles of 1024).
//   5. PackedLongEmitKernel<kInverse>: per chunk, BlockEmitSelected started
//      at its sequence's pairs before the chunk (the pair sum at g minus the
//      one at the sequence's first chunk), so every token gets the slot
//      gt_before + min(eq_before, ties) over the whole sequence: the rule of
//      the CPU and of the short path, hence the same bytes.
// Keys are recomputed from Philox on every pass (SampleKeyFn, the CPU's
// generator): nothing of T size is stored. Pair halves stay below 2^31: a
// layer's chunks cover at most cu[N] <= INT32_MAX tokens.
#include <cuda_runtime.h>

#include <cstdint>
#include <cub/cub.cuh>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "kernels/cuda/copy_kernels.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/sample_keys.cuh"
#include "kernels/cuda/sample_packed_internal.cuh"
#include "kernels/cuda/select.cuh"
#include "kernels/cuda/status.cuh"
#include "kernels/select.h"

namespace tokensel::kernels::cuda {
namespace {

constexpr int kLongThreads = 256;
constexpr int kLongItems = 2;  // one Philox draw = one position pair
constexpr int kLongScanItems = 4;
constexpr int kPackedLongPasses = 64 / kSelectDigitBits;
constexpr int64_t kMaxBlocks = int64_t{1} << 16;
constexpr unsigned long long kEq = 1ull << 32;  // packed (eq << 32) | gt
static_assert(sizeof(PackedLongState) == kPackedLongStateBytes, "state layout");
static_assert(kPackedLongHistBytes == kSelectBuckets * 4, "one uint32 per bucket");
static_assert(kPackedChunkTokens % (kLongThreads * kLongItems) == 0, "whole tiles");

// Chunk g of layer l: its sequence and where the chunk lies in it.
struct ChunkTask {
  int64_t l, i, g;
  int64_t first_chunk;  // chunk_base[i]
  int64_t start;        // first position of the chunk in the sequence (even)
  int64_t len;          // tokens of the chunk
  int64_t seq_len;      // n_i
  int64_t slot;         // state / histogram index, [L][long_slots]
};

__device__ __forceinline__ ChunkTask LocateChunk(const PackedLongArgs& a, int64_t chunks,
                                                 int64_t task) {
  ChunkTask t;
  t.g = DivMod(task, chunks, &t.l);
  t.i = PackedChunkOwner(a.chunk_base, a.n, t.g);
  t.first_chunk = a.chunk_base[t.i];
  t.start = (t.g - t.first_chunk) * kPackedChunkTokens;
  t.seq_len = int64_t{a.cu[t.i + 1]} - a.cu[t.i];
  const int64_t rest = t.seq_len - t.start;
  t.len = rest < kPackedChunkTokens ? rest : kPackedChunkTokens;
  t.slot = t.l * a.long_slots + PackedLongSlot(t.first_chunk);
  return t;
}

// The keys of a chunk: chunk-local positions, the sequence's generator.
struct ChunkKeyFn {
  SampleKeyFn seq;
  int64_t start;
  __device__ __forceinline__ void operator()(int64_t first, uint64_t* keys) const {
    seq(start + first, keys);
  }
};

__device__ __forceinline__ ChunkKeyFn KeysOf(const PackedLongArgs& a, const ChunkTask& t) {
  return ChunkKeyFn{SampleKeyFn{SampleKey(a.seed), t.l, t.i, a.step}, t.start};
}

// G, at most max_chunks for valid data (PackedMaxChunks); the clamp keeps
// every index inside the workspace regardless.
__device__ __forceinline__ int64_t ChunkCount(const PackedLongArgs& a) {
  const int64_t g = a.chunk_base[a.n];
  return g < a.max_chunks ? g : a.max_chunks;
}

__global__ void __launch_bounds__(kLongThreads)
    PackedLongInitKernel(PackedLongArgs a, Workspace ws) {
  if (IsInvalid(ws)) return;
  const int64_t chunks = ChunkCount(a);
  for (int64_t task = blockIdx.x; task < a.layers * chunks; task += gridDim.x) {
    const ChunkTask t = LocateChunk(a, chunks, task);
    if (t.g != t.first_chunk) continue;
    if (threadIdx.x < kSelectBuckets) a.hist[t.slot * kSelectBuckets + threadIdx.x] = 0;
    if (threadIdx.x != 0) continue;
    const int64_t r = a.kept[t.i + 1] - a.kept[t.i];
    PackedLongState s{0, 0, 0, static_cast<uint32_t>(r), 0};
    if (r == t.seq_len) s = PackedLongState{0, 0, t.seq_len, 0, 1};  // take everything
    if (r == 0) s = PackedLongState{0, ~uint64_t{0}, 0, 0, 1};       // take nothing
    a.state[t.slot] = s;
  }
}

__global__ void __launch_bounds__(kLongThreads)
    PackedLongHistKernel(PackedLongArgs a, int shift, Workspace ws) {
  __shared__ uint32_t hist[kSelectBuckets];
  if (IsInvalid(ws)) return;
  const int64_t chunks = ChunkCount(a);
  for (int64_t task = blockIdx.x; task < a.layers * chunks; task += gridDim.x) {
    const ChunkTask t = LocateChunk(a, chunks, task);
    const PackedLongState s = a.state[t.slot];
    if (s.done != 0) continue;  // uniform over the block
    if (threadIdx.x < kSelectBuckets) hist[threadIdx.x] = 0;
    __syncthreads();
    const ChunkKeyFn key_of = KeysOf(a, t);
    for (int64_t first = int64_t{threadIdx.x} * kLongItems; first < t.len;
         first += int64_t{kLongThreads} * kLongItems) {
      uint64_t keys[kLongItems];
      key_of(first, keys);
#pragma unroll
      for (int j = 0; j < kLongItems; ++j) {
        if (first + j < t.len && DigitsAbove(keys[j], shift) == s.prefix) {
          atomicAdd(&hist[(keys[j] >> shift) & (kSelectBuckets - 1)], 1u);
        }
      }
    }
    __syncthreads();
    if (threadIdx.x < kSelectBuckets && hist[threadIdx.x] != 0) {
      atomicAdd(&a.hist[t.slot * kSelectBuckets + threadIdx.x], hist[threadIdx.x]);
    }
    __syncthreads();  // hist is cleared by the next task
  }
}

__global__ void __launch_bounds__(kLongThreads)
    PackedLongDecideKernel(PackedLongArgs a, int shift, Workspace ws) {
  using CountScan = cub::BlockScan<uint32_t, kLongThreads>;
  __shared__ typename CountScan::TempStorage scan;
  __shared__ uint32_t chosen_bucket, chosen_need, chosen_whole;
  if (IsInvalid(ws)) return;
  const int64_t chunks = ChunkCount(a);
  const int tid = threadIdx.x;
  for (int64_t task = blockIdx.x; task < a.layers * chunks; task += gridDim.x) {
    const ChunkTask t = LocateChunk(a, chunks, task);
    if (t.g != t.first_chunk) continue;
    PackedLongState s = a.state[t.slot];
    if (s.done != 0) continue;
    uint32_t* hist = a.hist + t.slot * kSelectBuckets;
    // BlockSelectThreshold's pass, on the sequence's histogram: thread t
    // owns bucket 255 - t; the chosen one is where the count reaches need.
    if (tid == 0) {
      chosen_bucket = 0;
      chosen_need = s.need;
      chosen_whole = 1;
    }
    const int bucket = kSelectBuckets - 1 - tid;
    const uint32_t count = tid < kSelectBuckets ? hist[bucket] : 0u;
    __syncthreads();
    uint32_t at_or_above;
    CountScan(scan).InclusiveSum(count, at_or_above);
    const uint32_t above = at_or_above - count;
    if (tid < kSelectBuckets && above < s.need && at_or_above >= s.need) {
      chosen_bucket = static_cast<uint32_t>(bucket);
      chosen_need = s.need - above;
      chosen_whole = (s.need - above == count) ? 1u : 0u;
    }
    __syncthreads();
    if (tid < kSelectBuckets) hist[tid] = 0;  // for the next pass
    if (tid == 0) {
      s.prefix = (s.prefix << kSelectDigitBits) | chosen_bucket;
      s.need = chosen_need;
      if (chosen_whole != 0) {
        s = PackedLongState{s.prefix, (s.prefix << shift) - 1, 0, s.need, 1};
      } else if (shift == 0) {
        s = PackedLongState{s.prefix, s.prefix, s.need, s.need, 1};
      }
      a.state[t.slot] = s;
    }
    __syncthreads();  // the shared words are rewritten by the next task
  }
}

__global__ void __launch_bounds__(kLongThreads)
    PackedLongCountKernel(PackedLongArgs a, Workspace ws) {
  using Reduce = cub::BlockReduce<unsigned long long, kLongThreads>;
  __shared__ typename Reduce::TempStorage reduce;
  if (IsInvalid(ws)) return;
  const int64_t chunks = ChunkCount(a);
  for (int64_t task = blockIdx.x; task < a.layers * chunks; task += gridDim.x) {
    const ChunkTask t = LocateChunk(a, chunks, task);
    const PackedLongState s = a.state[t.slot];
    const ChunkKeyFn key_of = KeysOf(a, t);
    unsigned long long mine = 0;
    for (int64_t first = int64_t{threadIdx.x} * kLongItems; first < t.len;
         first += int64_t{kLongThreads} * kLongItems) {
      uint64_t keys[kLongItems];
      key_of(first, keys);
#pragma unroll
      for (int j = 0; j < kLongItems; ++j) {
        if (first + j < t.len) mine += keys[j] > s.key ? 1ull : (keys[j] == s.key ? kEq : 0ull);
      }
    }
    const unsigned long long total = Reduce(reduce).Sum(mine);
    if (threadIdx.x == 0) a.counts[t.l * a.max_chunks + t.g] = total;
    __syncthreads();  // the reduce storage is reused by the next task
  }
}

// counts[l][0..G) <- their exclusive prefix sums, one block per layer.
__global__ void __launch_bounds__(kLongThreads)
    PackedLongScanKernel(PackedLongArgs a, Workspace ws) {
  using Scan = cub::BlockScan<unsigned long long, kLongThreads>;
  __shared__ typename Scan::TempStorage scan;
  if (IsInvalid(ws)) return;
  const int64_t chunks = ChunkCount(a);
  constexpr int64_t kTile = int64_t{kLongThreads} * kLongScanItems;
  for (int64_t l = blockIdx.x; l < a.layers && chunks > 0; l += gridDim.x) {
    unsigned long long* row = a.counts + l * a.max_chunks;
    unsigned long long running = 0;
    for (int64_t tile = 0; tile < chunks; tile += kTile) {
      const int64_t first = tile + int64_t{threadIdx.x} * kLongScanItems;
      unsigned long long items[kLongScanItems];
      unsigned long long sum = 0;
#pragma unroll
      for (int j = 0; j < kLongScanItems; ++j) {
        items[j] = first + j < chunks ? row[first + j] : 0ull;
        sum += items[j];
      }
      unsigned long long before = 0, total = 0;
      Scan(scan).ExclusiveSum(sum, before, total);
      __syncthreads();  // the scan storage is reused by the next tile
      unsigned long long value = running + before;
#pragma unroll
      for (int j = 0; j < kLongScanItems; ++j) {
        if (first + j < chunks) row[first + j] = value;
        value += items[j];
      }
      running += total;
    }
  }
}

template <bool kInverse>
__global__ void __launch_bounds__(kLongThreads)
    PackedLongEmitKernel(PackedLongArgs a, PackedOutputs o, Workspace ws) {
  __shared__ SelectShared<kLongThreads> sh;
  if (IsInvalid(ws)) return;
  const int64_t chunks = ChunkCount(a);
  for (int64_t task = blockIdx.x; task < a.layers * chunks; task += gridDim.x) {
    const ChunkTask t = LocateChunk(a, chunks, task);
    const PackedLongState s = a.state[t.slot];
    const unsigned long long* row = a.counts + t.l * a.max_chunks;
    // Both halves are non-decreasing along the row: no borrow between them.
    const unsigned long long before = row[t.g] - row[t.first_chunk];
    const int64_t base = a.kept[t.i];
    const int64_t r = a.kept[t.i + 1] - base;
    const PackedWriter<kInverse> w{o, t.l, a.cu[t.i], base};
    const int64_t start = t.start;  // emission positions are chunk-local
    BlockEmitSelected<uint64_t, kLongThreads, kLongItems>(
        KeysOf(a, t), t.len, r, BlockThreshold<uint64_t>{s.key, s.ties}, sh,
        [&](int64_t position, int64_t slot) { w.Kept(start + position, slot); },
        [&](int64_t position) { w.Dropped(start + position); }, /*visit_all=*/kInverse, before);
    __syncthreads();  // shared memory is reused by the next task
  }
}

}  // namespace

absl::Status LaunchPackedLong(const PackedLongArgs& a, const PackedOutputs& o, bool inverse,
                              Workspace ws, Stream stream) {
  // Fits: the workspace (checked by the caller) holds L * max_chunks counts.
  // The kernels grid-stride over the tasks, so the grid is the device's
  // resident capacity (GridFor), not one block per possible chunk: most
  // calls have few or no long sequences, and an idle block still pays its
  // launch and its owner search.
  const int64_t tasks = a.layers * a.max_chunks;
  ASSIGN_OR_RETURN(const unsigned grid, GridFor(tasks, 1));
  PackedLongInitKernel<<<grid, kLongThreads, 0, stream>>>(a, ws);
  CUDA_RETURN_IF_LAUNCH_ERROR("PackedLongInitKernel");
  for (int pass = 0; pass < kPackedLongPasses; ++pass) {
    const int shift = 64 - kSelectDigitBits * (pass + 1);
    PackedLongHistKernel<<<grid, kLongThreads, 0, stream>>>(a, shift, ws);
    CUDA_RETURN_IF_LAUNCH_ERROR("PackedLongHistKernel");
    PackedLongDecideKernel<<<grid, kLongThreads, 0, stream>>>(a, shift, ws);
    CUDA_RETURN_IF_LAUNCH_ERROR("PackedLongDecideKernel");
  }
  PackedLongCountKernel<<<grid, kLongThreads, 0, stream>>>(a, ws);
  CUDA_RETURN_IF_LAUNCH_ERROR("PackedLongCountKernel");
  const auto layer_grid = static_cast<unsigned>(a.layers < kMaxBlocks ? a.layers : kMaxBlocks);
  PackedLongScanKernel<<<layer_grid, kLongThreads, 0, stream>>>(a, ws);
  CUDA_RETURN_IF_LAUNCH_ERROR("PackedLongScanKernel");
  if (inverse) {
    PackedLongEmitKernel<true><<<grid, kLongThreads, 0, stream>>>(a, o, ws);
  } else {
    PackedLongEmitKernel<false><<<grid, kLongThreads, 0, stream>>>(a, o, ws);
  }
  CUDA_RETURN_IF_LAUNCH_ERROR("PackedLongEmitKernel");
  return absl::OkStatus();
}

}  // namespace tokensel::kernels::cuda
