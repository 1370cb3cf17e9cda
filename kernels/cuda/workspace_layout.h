// Workspace layouts of the CUDA ops: which section of the caller's workspace
// holds what, at which byte offset (host code without CUDA includes, so host
// unit tests check it without a device; tests/kernels/cuda/
// workspace_layout_test.cc).
//
// Every workspace starts with the status block [0, kDeviceStatusBytes); the
// op's sections follow, each at a multiple of 256 bytes from ws.data. All
// arithmetic is overflow-checked: a layout that does not fit reports
// total == kWorkspaceTooLarge, which no allocation satisfies (and which
// leaves the caller room to round it up without wrapping), so Async fails
// before any section is used.
//
// Layouts may be computed on args that did not pass Validate<Op> (the server
// sizes the workspace before the op validates): then they are empty (total ==
// kDeviceStatusBytes) and Async returns the validation error.
//
// Snapshots (the trust boundary, docs/gpu.md): an index tensor a client can
// rewrite while the op runs is first copied, once, into a compact row-major
// section of the workspace of the same dtype (SnapshotBytes), and every later
// kernel, and the error message of <Op>Finish, reads only that copy.
#ifndef TOKENSEL_KERNELS_CUDA_WORKSPACE_LAYOUT_H_
#define TOKENSEL_KERNELS_CUDA_WORKSPACE_LAYOUT_H_

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/ops.h"
#include "kernels/tensor_view.h"

namespace tokensel::kernels::cuda {

// The total of a layout whose size overflows (or is absurd): SIZE_MAX / 2.
inline constexpr size_t kWorkspaceTooLarge = ~size_t{0} / 2;

// Builds a layout: sections in order, each 256-byte aligned, after the
// status block.
class WorkspaceLayout {
 public:
  // Reserves a section of the product of `factors` bytes (each >= 0, e.g.
  // {rows, words, 4}) and returns its offset. On overflow (or a negative
  // factor) the layout becomes too large; the offset returned is then
  // meaningless, and total() says so.
  size_t Add(std::initializer_list<int64_t> factors);
  // The bytes the workspace needs, or kWorkspaceTooLarge.
  size_t total() const { return overflow_ ? kWorkspaceTooLarge : end_; }

 private:
  size_t end_ = kDeviceStatusBytes;
  bool overflow_ = false;
};

// 32-bit words of a per-row bitmap of `limit` bits (limit >= 0; no overflow
// for any int64).
constexpr int64_t BitmapWordsPerRow(int64_t limit) { return limit / 32 + (limit % 32 != 0); }

// The compact snapshot of `v` (a validated view): same dtype and shape,
// row-major, at `data`. Its byte size is v.NumElements() * element size
// (a section {elements, elem_size}).
TensorView SnapshotView(const TensorView& v, void* data);

// `ws.data + offset` (the section at `offset`).
inline void* SectionAt(Workspace ws, size_t offset) { return static_cast<char*>(ws.data) + offset; }

// Sparse rows (kernels/sparse_rows.h: PreferSortingToBitmap(R, S), the rule
// the CPU twins use): instead of a bitmap of S bits per row, sorted copies of
// the snapshot, O(rows * R) bytes whatever S is (sparse_sort.h):
//   keys[0]: rows * R elements of the ids' dtype (the tile sort's output);
//   keys[1]: the same, the merge passes' other buffer, only when R >
//            kSparseSortTile (passes > 0).
// The sorted rows end in keys[passes % 2].
inline constexpr int64_t kSparseSortTile = 1024;  // ids one block sorts
struct SparseSortLayout {
  bool used = false;
  int64_t rows = 0;
  int64_t r = 0;
  int passes = 0;  // merge passes after the tile sort: ceil(log2(ceil(R / tile)))
  size_t keys[2] = {0, 0};
  size_t sorted() const { return keys[passes % 2]; }
};
// Merge passes that turn sorted tiles of kSparseSortTile ids into sorted rows
// of r ids (r >= 0).
int SparseSortPasses(int64_t r);

// GatherTokens, ScatterTokens, GatherBertMask:
//   [status][snapshot of indices][ScatterTokens: bitmap, B * ceil(S/32)
//   words, or for sparse rows (PreferSortingToBitmap(R, S)) the sorted keys]
struct IndexOpLayout {
  size_t snapshot = 0;      // offset of the indices' snapshot
  size_t bitmap = 0;        // offset of the uniqueness bitmap (ScatterTokens; 0 when sparse)
  SparseSortLayout sparse;  // ScatterTokens with sparse rows
  size_t total = kDeviceStatusBytes;
};
IndexOpLayout GatherTokensLayout(const GatherTokensArgs& args);
IndexOpLayout ScatterTokensLayout(const ScatterTokensArgs& args);
IndexOpLayout GatherBertMaskLayout(const GatherBertMaskArgs& args);
// MergeTokens, SplitTokens:
//   [status][snapshot of indices][bitmap, B * ceil(S/32) words][SplitTokens:
//   8 zero bytes, the source of the rows it zeroes]
// The bitmap is the uniqueness check's, read again after it: bit (b, s) is
// set iff s is retained in row b (the copies of the other rows skip those).
IndexOpLayout MergeTokensLayout(const MergeTokensArgs& args);
struct SplitLayout {
  IndexOpLayout index;
  size_t zeros = 0;  // offset of the zero element
  size_t total = kDeviceStatusBytes;
};
SplitLayout SplitTokensLayout(const SplitTokensArgs& args);

// SortTokens, dense rows:
//   [status][bitmaps: rows * ceil(S/64) uint64][chunk ranks: rows * chunks
//   int64, only when chunks > 1][snapshot of ids]
// The status block and the bitmaps are contiguous (one memset clears both).
// Sparse rows (PreferSortingToBitmap(R, S), as the CPU twin): no bitmaps
// (bitmap_bytes == 0, words == chunks == 0):
//   [status][snapshot of ids][sorted keys (SparseSortLayout)]
inline constexpr int64_t kSortChunkWords = 1024;  // bitmap words per write block
struct SortLayout {
  int64_t rows = 0;
  int64_t r = 0;
  int64_t words = 0;   // bitmap words per row
  int64_t chunks = 0;  // chunks of kSortChunkWords words per row
  size_t bitmaps = kDeviceStatusBytes;
  size_t bitmap_bytes = 0;  // 256-aligned
  size_t ranks = 0;         // 0 when chunks <= 1
  size_t snapshot = 0;
  SparseSortLayout sparse;
  size_t total = kDeviceStatusBytes;
};
SortLayout SortTokensLayout(const SortTokensArgs& args);

// SegmentSeqlens, per side s (q = 0, kv = 1), in this order:
//   seqlen staging [B][NS] int32, offset staging [B][NS+1] int32,
//   packed only: cum [B][NS] int32, totals [B] and bases [B+1] row totals,
//   snapshot of the ids [B][T] (their dtype), and of the positions [B][T]
//   when the mask reads them (cross-attention, causal masks);
// then, for cross-attention when 2*(NS+1) aggregates exceed the shared-memory
// budget, [B][2][NS+1] aggregates.
inline constexpr size_t kSegmentRowTotalsBytes = 24;  // 3 x int64 (RowTotals)
inline constexpr size_t kSegmentAggBytes = 24;        // cnt, minpos, maxpos (DevAgg)
inline constexpr size_t kSegmentMaxAggSmemBytes = 32 * 1024;
struct SegmentLayout {
  int64_t batch = 0;
  int64_t ns = 0;
  int sides = 1;
  bool read_pos = false;
  bool packed[2] = {false, false};
  int64_t row_length[2] = {0, 0};  // T of each side
  size_t seqlen[2] = {0, 0}, offset[2] = {0, 0}, cum[2] = {0, 0};
  size_t totals[2] = {0, 0}, bases[2] = {0, 0};
  size_t ids[2] = {0, 0}, pos[2] = {0, 0};  // snapshots
  size_t agg = 0;
  size_t agg_smem_bytes = 0;
  bool agg_in_smem = true;
  size_t total = kDeviceStatusBytes;
};
SegmentLayout SegmentSeqlensLayout(const SegmentSeqlensArgs& args);

// SamplePackedTokens (the plan: sample_packed_plan.h):
//   [status][report, kPackedReportWords int64][snapshot of cu_seqlens, N+1
//   int32][kept: r_i, then their inclusive prefix sums, N+1 int64]
//   [chunk_base: chunks of each sequence, then their inclusive prefix sums,
//   N+1 int64][scan_sums: the tile sums of both scans, 2 *
//   PackedScanTiles(N) int64][when a long sequence fits (max_chunks > 0): select states
//   L * long_slots * 32 B, histograms L * long_slots * 1 KiB, chunk counts
//   L * max_chunks uint64][with out: the ids the gather reads, ids' dim 1
//   (= T' when the data is valid) int32]
struct SamplePackedLayout {
  int64_t n_plus_1 = 0;
  int64_t max_chunks = 0;  // PackedMaxChunks(T), 0 when N == 0 or L == 0
  int64_t long_slots = 0;  // PackedLongSlots(max_chunks)
  size_t report = 0;
  size_t cu = 0;
  size_t kept = 0;
  size_t chunk_base = 0;
  size_t scan_sums = 0;
  size_t long_state = 0;    // 0 when max_chunks == 0
  size_t long_hist = 0;     // 0 when max_chunks == 0
  size_t chunk_counts = 0;  // 0 when max_chunks == 0
  size_t gather_ids = 0;    // 0 without out
  size_t total = kDeviceStatusBytes;
};
SamplePackedLayout SamplePackedTokensLayout(const SamplePackedTokensArgs& args);

}  // namespace tokensel::kernels::cuda

#endif  // TOKENSEL_KERNELS_CUDA_WORKSPACE_LAYOUT_H_
