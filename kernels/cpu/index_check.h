// The index-tensor check of GatherTokens, ScatterTokens and GatherBertMask:
// snapshot the client's indices (snapshot.h) and validate the snapshot, in one
// parallel pass over the rows. Everything after it (the error message, the
// copies) reads only the snapshot, so a client rewriting its indices during
// the op cannot make a checked index differ from a used one.
#ifndef TOKENSEL_KERNELS_CPU_INDEX_CHECK_H_
#define TOKENSEL_KERNELS_CPU_INDEX_CHECK_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "kernels/cpu/row_check.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/snapshot.h"
#include "kernels/cpu/stop.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/gather_math.h"
#include "kernels/tensor_view.h"
#include "kernels/validate_gather_scatter.h"

namespace tokensel::kernels::cpu {
namespace internal {

// Rows per chunk of the check: about 16K indices.
inline int64_t IndexCheckGrain(int64_t n) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1));
}

// Position of the first offending index of a private contiguous row of `n`
// ids (out of [0, limit), or with `bitmap` non-null, a repeat within the
// row), or -1. `bitmap` holds `limit` bits, all clear on entry and on return.
template <typename IndexT>
int64_t FirstBadIndexInRow(const char* row, int64_t n, int64_t limit, uint64_t* bitmap) {
  int64_t bad = -1;
  int64_t pos = 0;
  for (; pos < n; ++pos) {
    IndexT v;
    std::memcpy(&v, row + pos * static_cast<int64_t>(sizeof(IndexT)), sizeof(IndexT));
    const int64_t value = v;
    if (value < 0 || value >= limit) {
      bad = pos;
      break;
    }
    if (bitmap != nullptr) {
      uint64_t& word = bitmap[value >> 6];
      const uint64_t bit = uint64_t{1} << (value & 63);
      if (word & bit) {
        bad = pos;
        break;
      }
      word |= bit;
    }
  }
  if (bitmap != nullptr) {  // clear what this row set: O(R), not O(limit)
    for (int64_t p = 0; p < pos; ++p) {
      IndexT v;
      std::memcpy(&v, row + p * static_cast<int64_t>(sizeof(IndexT)), sizeof(IndexT));
      bitmap[static_cast<int64_t>(v) >> 6] = 0;  // private: the values checked above
    }
  }
  return bad;
}

// The status for the known-bad element at (row, pos) of the private snapshot.
inline absl::Status IndexError(const TensorView& snapshot, int64_t row, int64_t pos,
                               int64_t limit) {
  const int64_t n = snapshot.shape[snapshot.rank - 1];
  const int64_t value = LoadIndex(snapshot, row * n + pos);
  if (value < 0 || value >= limit) {
    return TokenIndexOutOfRange(snapshot, row * n + pos, value, limit);
  }
  int64_t first = 0;
  while (first < pos && LoadIndex(snapshot, row * n + first) != value) ++first;
  return TokenIndexDuplicate(snapshot, row * n + pos, value, row * n + first);
}

// Bitmap words per chunk of the uniqueness check (0: none, or by sorting).
inline int64_t IndexBitmapWords(int64_t n, int64_t limit, bool unique) {
  return unique && !PreferSortingToBitmap(n, limit) ? (limit + 63) / 64 : 0;
}

}  // namespace internal

// Copies `indices` (int32|int64; rows = all leading dims, the last dim is the
// row) into `*snapshot`, reading each element once, and checks the copy:
// every element in [0, limit) and, when `unique`, occurring once in its row.
// Returns INVALID_ARGUMENT naming the FIRST offending element (lowest row,
// then lowest position), whatever the thread count, or the stop status
// (stop.h) when stopped; on OK the whole snapshot is filled and valid.
//
// Uniqueness is checked with a bitmap of `limit` bits per chunk, or, when
// that would be far larger than a row (PreferSortingToBitmap: e.g. a
// zero-strided `all` with a huge S), by sorting each row: memory stays O(n).
inline absl::Status SnapshotIndexRows(const TensorView& indices, int64_t limit, bool unique,
                                      ThreadPool* pool, IndexSnapshot* snapshot) {
  *snapshot = IndexSnapshot(indices);
  const TensorView& copy = snapshot->view();
  const int64_t rows = indices.NumRows();
  const int64_t n = indices.shape[indices.rank - 1];
  if (rows == 0 || n == 0) return absl::OkStatus();
  std::atomic<int64_t> first_bad_row{rows};
  const bool is64 = indices.dtype == DType::kInt64;
  const bool by_sorting = unique && PreferSortingToBitmap(n, limit);
  const int64_t bitmap_words = internal::IndexBitmapWords(n, limit, unique);
  auto load_row = [&](int64_t row, std::vector<int64_t>* values) {
    values->resize(static_cast<size_t>(n));
    for (int64_t pos = 0; pos < n; ++pos) {
      (*values)[static_cast<size_t>(pos)] = LoadIndex(copy, row * n + pos);
    }
  };
  auto first_bad = [&](int64_t row, uint64_t* bits) {
    return is64 ? internal::FirstBadIndexInRow<int64_t>(snapshot->Row(row), n, limit, bits)
                : internal::FirstBadIndexInRow<int32_t>(snapshot->Row(row), n, limit, bits);
  };
  ParallelFor(pool, rows, internal::IndexCheckGrain(n), [&](int64_t begin, int64_t end) {
    std::vector<uint64_t> bitmap(static_cast<size_t>(bitmap_words), 0);
    uint64_t* bits = bitmap_words > 0 ? bitmap.data() : nullptr;
    std::vector<int64_t> values;
    for (int64_t row = begin; row < end; ++row) {
      if (row >= first_bad_row.load(std::memory_order_relaxed)) return;
      snapshot->CopyRow(row);
      bool bad;
      if (by_sorting) {
        load_row(row, &values);
        bad = !SortAndCheckUniqueInRange(&values, limit);
      } else {
        bad = first_bad(row, bits) >= 0;
      }
      if (!bad) continue;
      StoreMin(first_bad_row, row);
      return;
    }
  });
  // Skipped chunks left rows unchecked (and uncopied): stop before using any.
  RETURN_IF_ERROR(CheckStop());
  const int64_t bad_row = first_bad_row.load();
  if (bad_row == rows) return absl::OkStatus();
  // Re-scan the one bad row of the snapshot serially for its position.
  if (by_sorting) {
    std::vector<int64_t> values;
    load_row(bad_row, &values);
    return internal::IndexError(copy, bad_row, FirstBadPosition(values, limit).position, limit);
  }
  std::vector<uint64_t> bitmap(static_cast<size_t>(bitmap_words), 0);
  return internal::IndexError(
      copy, bad_row, first_bad(bad_row, bitmap_words > 0 ? bitmap.data() : nullptr), limit);
}

// Heap bytes SnapshotIndexRows allocates for `indices` (validated) on a pool
// of `threads` threads: the snapshot, plus per live chunk a bitmap or a row
// of values, or the serial re-scan of a bad row (not the error status).
inline uint64_t SnapshotIndexRowsScratchBytes(const TensorView& indices, int64_t limit, bool unique,
                                              int threads) {
  const int64_t rows = indices.NumRows();
  const int64_t n = indices.shape[indices.rank - 1];
  if (rows == 0 || n == 0) return 0;
  uint64_t per_chunk = 0;
  uint64_t rescan = 0;
  if (unique && PreferSortingToBitmap(n, limit)) {
    per_chunk = SatMul3(n, sizeof(int64_t), 1);
    rescan = SatMul3(n, sizeof(int64_t) + sizeof(std::pair<int64_t, int64_t>), 1);
  } else {
    per_chunk = SatMul3(internal::IndexBitmapWords(n, limit, unique), sizeof(uint64_t), 1);
    rescan = per_chunk;
  }
  const uint64_t check = std::max(SatMul(LiveChunks(threads, rows), per_chunk), rescan);
  return SatAdd(IndexSnapshot::BytesFor(indices), check);
}

}  // namespace tokensel::kernels::cpu

#endif  // TOKENSEL_KERNELS_CPU_INDEX_CHECK_H_
