// The host-decidable part of the CUDA SamplePackedTokens' work balance
// (kernels/cuda/sample_packed.cu, sample_packed_long.cu; docs/gpu.md): which
// sequences take which path, how a long sequence is cut into chunks, which
// sequence owns a chunk, where its select state lives, and the bounds the
// workspace is sized with. TOKENSEL_HD, no CUDA includes: the device uses
// these very functions and tests/kernels/cuda/sample_packed_plan_test.cc
// checks them without a device.
//
// Short sequences (n < kPackedLongMinTokens) run one per 256-thread block
// (PackedSampleKernel): at most 2 * kPackedChunkTokens tokens per block.
// Long ones are cut into chunks of kPackedChunkTokens tokens (the last one
// shorter), one block per (layer, chunk), for every pass of a multi-block
// radix select and for the emission: no block handles more than
// 2 * kPackedChunkTokens tokens, whatever the lengths, so the work is
// balanced by tokens. The host never learns the lengths (no sync): it sizes
// grids and the workspace from T alone with the bounds below, and the
// kernels read the real chunk count from the workspace.
#ifndef TOKENSEL_KERNELS_CUDA_SAMPLE_PACKED_PLAN_H_
#define TOKENSEL_KERNELS_CUDA_SAMPLE_PACKED_PLAN_H_

#include <cstdint>

#include "kernels/hd.h"

namespace tokensel::kernels::cuda {

inline constexpr int64_t kPackedChunkTokens = 4096;
inline constexpr int64_t kPackedLongMinTokens = 2 * kPackedChunkTokens + 1;
// Every long sequence has at least this many chunks.
inline constexpr int64_t kPackedMinLongChunks = 3;
// cu_seqlens is int32: no valid pack covers more tokens.
inline constexpr int64_t kPackedMaxTokens = INT32_MAX;

// Radix select state of one (layer, long sequence) (PackedLongSelect in
// sample_packed_long.cu): 32 bytes, then a 256-bucket uint32 histogram.
struct PackedLongState {
  uint64_t prefix;  // digits chosen so far (of ~key, the select's key)
  uint64_t key;     // the threshold once done
  int64_t ties;     // keys == key taken, once done
  uint32_t need;    // keys still to take from the current prefix on
  uint32_t done;    // 1 once key and ties are final
};
inline constexpr int64_t kPackedLongStateBytes = 32;
inline constexpr int64_t kPackedLongHistBytes = 256 * 4;

// The report section: what Finish needs for the message, written on the
// device so Finish copies a fixed few words (no N-sized host buffer).
// Positions are stored as ~i with atomicMax (the lowest i wins; 0 = none).
enum PackedReportWord : int {
  kPackedReportCu0 = 0,         // cu[0] (int64)
  kPackedReportDecreasing = 1,  // ~first i with cu[i + 1] < cu[i]
  kPackedReportPastEnd = 2,     // ~first i with cu[i + 1] > T
  kPackedReportKept = 3,        // T' = sum of r_i (the scan's total)
  kPackedReportWords = 4,
};

// The prefix sums of r_i and of the chunk counts (sample_packed_scan.cu)
// run over tiles of kPackedScanTile values, one block each: PackedScanTiles
// tile sums are kept in the workspace (per array).
inline constexpr int64_t kPackedScanTile = 4096;
TOKENSEL_HD constexpr int64_t PackedScanTiles(int64_t n) {
  return n <= 0 ? 0 : (n - 1) / kPackedScanTile + 1;
}

TOKENSEL_HD constexpr bool PackedIsLong(int64_t n) { return n >= kPackedLongMinTokens; }

// Chunks of a sequence of n tokens: ceil(n / kPackedChunkTokens) when long,
// else 0 (short sequences are not chunked).
TOKENSEL_HD constexpr int64_t PackedChunks(int64_t n) {
  return PackedIsLong(n) ? (n + kPackedChunkTokens - 1) / kPackedChunkTokens : 0;
}

// An upper bound of the sum of PackedChunks(n_i) over any sequences with
// sum n_i <= tokens (tokens >= 0). At most k = tokens / kPackedLongMinTokens
// sequences are long, and ceil(n / C) <= (n + C - 1) / C, so the sum is at
// most (tokens + k * (C - 1)) / C (0 when k = 0: the workspace then has no
// long-path sections); tight when every sequence has kPackedLongMinTokens
// tokens. Tokens past kPackedMaxTokens count as that.
TOKENSEL_HD constexpr int64_t PackedMaxChunks(int64_t tokens) {
  const int64_t t = tokens < 0 ? 0 : (tokens > kPackedMaxTokens ? kPackedMaxTokens : tokens);
  const int64_t long_seqs = t / kPackedLongMinTokens;
  return long_seqs == 0 ? 0 : (t + long_seqs * (kPackedChunkTokens - 1)) / kPackedChunkTokens;
}

// The select state of the long sequence whose first chunk is `first_chunk`:
// first chunks of two long sequences differ by >= kPackedMinLongChunks, so
// the quotient is unique per sequence and < PackedLongSlots(max_chunks).
TOKENSEL_HD constexpr int64_t PackedLongSlot(int64_t first_chunk) {
  return first_chunk / kPackedMinLongChunks;
}
TOKENSEL_HD constexpr int64_t PackedLongSlots(int64_t max_chunks) {
  return (max_chunks + kPackedMinLongChunks - 1) / kPackedMinLongChunks;
}

// The sequence owning chunk g: the i in [0, n) with chunk_base[i] <= g <
// chunk_base[i + 1], where chunk_base is the exclusive prefix sum of
// PackedChunks(n_i) (n + 1 values, chunk_base[0] = 0) and 0 <= g <
// chunk_base[n]. Binary search: O(log n) per block.
// (Int: the device's long long, or int64_t.)
template <typename Int>
TOKENSEL_HD int64_t PackedChunkOwner(const Int* chunk_base, int64_t n, int64_t g) {
  int64_t lo = 0, hi = n;  // chunk_base[lo] <= g < chunk_base[hi]
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (chunk_base[mid] <= g) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

}  // namespace tokensel::kernels::cuda

#endif  // TOKENSEL_KERNELS_CUDA_SAMPLE_PACKED_PLAN_H_
