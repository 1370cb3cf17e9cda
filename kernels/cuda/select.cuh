// Block-wide radix select and in-order compaction, shared by the CUDA
// TopKTokens (16/32-bit score keys) and SampleTokens (64-bit Philox keys).
// Device code only (include from .cu files). The index I/O helpers of the
// three ops (LoadId / StoreId / StoreI32) are in view_access.cuh.
//
// One thread block handles one row of n keys. The keys are not stored: a
// KeyFn recomputes them on every pass (TopK reloads the scores, which stay in
// L1/L2; SampleTokens re-runs Philox, cheaper than spilling S*8 bytes).
//
//   KeyFn: __device__ void operator()(int64_t first, K* keys) const
//          writes the keys of positions first .. first+kItems-1 (first is a
//          multiple of kItems); entries at positions >= n may be garbage and
//          are ignored, but the functor must not read memory beyond n.
//
// Selection rule (the same as kernels/select.h and kernels/cpu/radix_select.h):
// the r LARGEST keys, ties to the lower position. SampleTokens wants the r
// smallest and passes ~key, which reverses the order and keeps the tie rule.
//
// BlockSelectThreshold: 8-bit digits, most significant first
// (kSelectDigitBits). Each pass builds the digit histogram of the current
// candidates in shared memory (atomicAdd), picks the bucket holding the
// need-th largest candidate with one BlockScan over the 256 buckets taken in
// descending order (the parallel form of FindSelectBucket), and stops early
// when the whole bucket is taken, exactly like the CPU RadixSelect.
// BlockEmitSelected: one pass over the row in tiles of kThreads*kItems
// positions; a BlockScan of the packed pair (#keys == T, #keys > T) gives
// every position its output slot (EmitSlot, emit_slot.h):
//   slot = gt_before + min(eq_before, ties),
//   taken = (key > T || (key == T && eq_before < ties)) && slot < r.
// The emission reads every key exactly once (the scan and the decision use
// the same registers), so slots are distinct; `slot < r` keeps the writes in
// the row even when the keys changed since the threshold passes (TopK
// re-reads client scores on every pass; a racing client then gets a wrong
// but in-bounds selection, never a write past the row).
#ifndef TOKENSEL_KERNELS_CUDA_SELECT_CUH_
#define TOKENSEL_KERNELS_CUDA_SELECT_CUH_

#include <cstdint>
#include <cub/cub.cuh>

#include "kernels/cuda/emit_slot.h"
#include "kernels/cuda/view_access.cuh"
#include "kernels/select.h"
#include "kernels/tensor_view.h"

namespace tokensel::kernels::cuda {

// The keys taken are every key > key plus the first `ties` keys == key.
template <typename K>
struct BlockThreshold {
  K key;
  int64_t ties;
};

template <int kThreads>
struct SelectShared {
  static_assert(kThreads >= kSelectBuckets, "one bucket per thread");
  using CountScan = cub::BlockScan<uint32_t, kThreads>;
  using PairScan = cub::BlockScan<unsigned long long, kThreads>;
  union {
    typename CountScan::TempStorage count_scan;
    typename PairScan::TempStorage pair_scan;
  } scan;
  uint32_t hist[kSelectBuckets];
  uint32_t bucket;  // chosen bucket of the current pass
  uint32_t need;    // keys still to take, from the chosen bucket on
  uint32_t whole;   // 1 when the chosen bucket is taken whole
};

// key >> (shift + kSelectDigitBits), or 0 when that shifts out every bit.
template <typename K>
__device__ __forceinline__ K DigitsAbove(K key, int shift) {
  constexpr int kBits = static_cast<int>(sizeof(K)) * 8;
  const int s = shift + kSelectDigitBits;
  return s >= kBits ? K{0} : static_cast<K>(key >> s);
}

// Threshold of the r largest of the n keys of `key_of`, 0 <= r <= n. Every
// thread of the block must call it; every thread gets the result.
template <typename K, int kThreads, int kItems, typename KeyFn>
__device__ BlockThreshold<K> BlockSelectThreshold(const KeyFn& key_of, int64_t n, int64_t r,
                                                  SelectShared<kThreads>& sh) {
  constexpr int kBits = static_cast<int>(sizeof(K)) * 8;
  constexpr int64_t kTile = int64_t{kThreads} * kItems;
  if (r == n) return BlockThreshold<K>{K{0}, n};                   // take everything
  if (r == 0) return BlockThreshold<K>{static_cast<K>(~K{0}), 0};  // take nothing
  const int tid = threadIdx.x;
  K prefix = 0;  // digits chosen so far
  uint32_t need = static_cast<uint32_t>(r);
  for (int shift = kBits - kSelectDigitBits;; shift -= kSelectDigitBits) {
    if (tid < kSelectBuckets) sh.hist[tid] = 0;
    // Defaults for a pass where no bucket reaches `need`: impossible when every
    // pass sees the same keys, possible when a client rewrites its scores
    // between passes (TopK); the emission's slot < r bound keeps that safe.
    if (tid == 0) {
      sh.bucket = 0;
      sh.need = need;
      sh.whole = 1;
    }
    __syncthreads();
    for (int64_t first = int64_t{tid} * kItems; first < n; first += kTile) {
      K keys[kItems];
      key_of(first, keys);
#pragma unroll
      for (int j = 0; j < kItems; ++j) {
        if (first + j < n && DigitsAbove(keys[j], shift) == prefix) {
          atomicAdd(&sh.hist[(keys[j] >> shift) & (kSelectBuckets - 1)], 1u);
        }
      }
    }
    __syncthreads();
    // Thread t owns bucket 255 - t: an inclusive scan counts the candidates
    // at or above each bucket; the chosen one is where that reaches `need`.
    const int bucket = kSelectBuckets - 1 - tid;
    const uint32_t count = tid < kSelectBuckets ? sh.hist[bucket] : 0u;
    uint32_t at_or_above;
    typename SelectShared<kThreads>::CountScan(sh.scan.count_scan).InclusiveSum(count, at_or_above);
    const uint32_t above = at_or_above - count;
    if (tid < kSelectBuckets && above < need && at_or_above >= need) {
      sh.bucket = static_cast<uint32_t>(bucket);
      sh.need = need - above;
      sh.whole = (need - above == count) ? 1u : 0u;
    }
    __syncthreads();
    prefix = static_cast<K>((prefix << kSelectDigitBits) | sh.bucket);
    need = sh.need;
    const bool whole = sh.whole != 0;
    __syncthreads();  // sh.* is rewritten by the next pass
    // Whole bucket: everything >= its lowest key, which is > 0 because
    // r < n leaves some key below the bucket.
    if (whole) return BlockThreshold<K>{static_cast<K>((prefix << shift) - 1), 0};
    if (shift == 0) return BlockThreshold<K>{prefix, need};
  }
}

// Emits the selected positions in ascending order: emit(position, slot) for
// every taken position, skip(position) for every other one (SampleTokens uses
// it for the inverse; TopK passes a no-op). Every thread must call it.
// `before_part` is the packed (#keys == T) << 32 | (#keys > T) of the row's keys
// before key_of's position 0, when the n keys are one part of a longer row
// (SamplePackedTokens' chunks of a long sequence): slots then count from the
// row's start, and r is the whole row's.
template <typename K, int kThreads, int kItems, typename KeyFn, typename Emit, typename Skip>
__device__ void BlockEmitSelected(const KeyFn& key_of, int64_t n, int64_t r,
                                  const BlockThreshold<K>& t, SelectShared<kThreads>& sh,
                                  const Emit& emit, const Skip& skip, bool visit_all,
                                  unsigned long long before_part = 0) {
  constexpr int64_t kTile = int64_t{kThreads} * kItems;
  constexpr unsigned long long kEq = 1ull << 32;  // packed (eq << 32) | gt
  unsigned long long running = before_part;       // totals of earlier tiles
  for (int64_t tile = 0; tile < n; tile += kTile) {
    const int64_t first = tile + int64_t{threadIdx.x} * kItems;
    K keys[kItems];
    if (first < n) key_of(first, keys);
    unsigned long long mine = 0;
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      if (first + j < n) mine += keys[j] > t.key ? 1ull : (keys[j] == t.key ? kEq : 0ull);
    }
    unsigned long long before, total;
    typename SelectShared<kThreads>::PairScan(sh.scan.pair_scan).ExclusiveSum(mine, before, total);
    __syncthreads();  // the scan storage is reused by the next tile
    before += running;
    running += total;
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      if (first + j >= n) break;
      const int64_t gt = static_cast<int64_t>(before & 0xFFFFFFFFull);
      const int64_t eq = static_cast<int64_t>(before >> 32);
      const bool is_gt = keys[j] > t.key;
      const bool is_eq = keys[j] == t.key;
      // Bounded by r (emit_slot.h): keys read again here may differ from the
      // ones that set t, and no slot may leave the output row.
      const int64_t slot = EmitSlot(is_gt, is_eq, gt, eq, t.ties, r);
      if (slot >= 0) {
        emit(first + j, slot);
      } else {
        skip(first + j);
      }
      before += is_gt ? 1ull : (is_eq ? kEq : 0ull);
    }
    // Every slot is filled once the running count reaches r (uniform).
    const int64_t taken =
        static_cast<int64_t>(running & 0xFFFFFFFFull) +
        (static_cast<int64_t>(running >> 32) < t.ties ? static_cast<int64_t>(running >> 32)
                                                      : t.ties);
    if (!visit_all && taken >= r) break;
  }
}

}  // namespace tokensel::kernels::cuda

#endif  // TOKENSEL_KERNELS_CUDA_SELECT_CUH_
