// CPU SortTokens: comparison-free sort of each row of unique ids in [0, S).
//
// Per row the ids are marked in a bitmap of S bits; a bit already set is a
// duplicate, an id outside [0, S) is out of range. The sorted row is the set
// bits in ascending order (a ctz scan of the words), written to `out` (or
// back to `ids`) together with the optional inverse (rank of each set bit).
// O(R + S/64) per row, plus O(S) for the inverse.
//
// Nothing is written unless every row is valid, so rows are processed in two
// parallel passes: validate (marking the bitmaps), then write. When the
// bitmaps of all rows fit in kKeptBitmapBytes they are kept between the
// passes; otherwise each pass marks a per-chunk bitmap and clears it again.
//
// Read once: pass 1 copies each row of the client's ids into a private
// snapshot (snapshot.h) and validates the copy; the error message, the
// second marking and the sparse path's sort read only the snapshot. An id
// that decides a bitmap word or an inverse slot is therefore always the id
// that was checked, and in-place sorting cannot disturb it either.
//
// Sparse rows (S/64 bitmap words far more than R ids, e.g. R = 1 and
// S = 2^31) would make a tiny request scan and allocate S bits per row, so
// they are sorted by comparison instead: O(R log R) per row and O(R) memory
// (plus O(S) for the inverse, which is output).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/row_check.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/snapshot.h"
#include "kernels/cpu/unaligned.h"
#include "kernels/ops.h"
#include "kernels/sort_math.h"
#include "kernels/validate_sort.h"

namespace tokensel::kernels::cpu {
namespace {

constexpr int64_t kKeptBitmapBytes = int64_t{64} << 20;
// Target work units (ids + bitmap words + inverse entries) per parallel chunk.
constexpr int64_t kChunkWork = int64_t{1} << 15;

// A row of an int32/int64 view: base pointer and byte stride of the last dim.
struct RowPtr {
  char* base;
  int64_t stride;  // bytes
};

// Kept bitmaps: one per row, shared by both passes, when they all fit.
bool KeepBitmaps(int64_t rows, int64_t words) { return rows <= kKeptBitmapBytes / (words * 8); }

RowPtr RowOf(const TensorView& v, int64_t row) {
  return {v.At(RowOffset(v, row)), v.strides[v.rank - 1] * v.elem_size()};
}

// Marks the ids of one row in `bits` (all clear on entry). Returns the first
// offending position (out of range or duplicate), or -1 when the row is valid.
template <typename T>
int64_t MarkRow(RowPtr row, int64_t r, int64_t s, uint64_t* bits) {
  const char* p = row.base;
  for (int64_t i = 0; i < r; ++i, p += row.stride) {
    const int64_t id = LoadAt<T>(p);
    if (!IdInRange(id, s) || TestAndSetBit(bits, id)) return i;
  }
  return -1;
}

// Marks a row already known to be valid.
template <typename T>
void MarkValidRow(RowPtr row, int64_t r, uint64_t* bits) {
  const char* p = row.base;
  for (int64_t i = 0; i < r; ++i, p += row.stride) {
    const int64_t id = LoadAt<T>(p);
    bits[BitmapWord(id)] |= BitmapMask(id);
  }
}

// Emits the set bits of `bits` in ascending order to `out` (and their ranks
// to `inv`, whose entries for absent ids are set to -1), clearing the words.
template <typename T, bool kInverse>
void EmitRow(uint64_t* bits, int64_t words, RowPtr out, RowPtr inv, int64_t s) {
  if constexpr (kInverse) {
    if (inv.stride == static_cast<int64_t>(sizeof(int32_t))) {
      std::memset(inv.base, 0xFF, static_cast<size_t>(s) * sizeof(int32_t));
    } else {
      for (int64_t i = 0; i < s; ++i) StoreAt<int32_t>(inv.base + i * inv.stride, -1);
    }
  }
  int64_t rank = 0;
  char* o = out.base;
  for (int64_t w = 0; w < words; ++w) {
    uint64_t word = bits[w];
    if (word == 0) continue;
    bits[w] = 0;
    const int64_t base = w * kBitmapWordBits;
    do {
      const int64_t id = base + __builtin_ctzll(word);
      StoreAt<T>(o, static_cast<T>(id));
      o += out.stride;
      if constexpr (kInverse)
        StoreAt<int32_t>(inv.base + id * inv.stride, static_cast<int32_t>(rank));
      ++rank;
      word &= word - 1;
    } while (word != 0);
  }
}

// The ids of one row, loaded (so in-place writes cannot disturb them).
template <typename T>
void LoadRow(RowPtr row, int64_t r, std::vector<int64_t>* ids) {
  ids->resize(static_cast<size_t>(r));
  const char* p = row.base;
  for (int64_t i = 0; i < r; ++i, p += row.stride) (*ids)[static_cast<size_t>(i)] = LoadAt<T>(p);
}

// Writes sorted unique ids to `out` and their ranks to `inv` (absent ids -1).
template <typename T, bool kInverse>
void EmitSorted(const std::vector<int64_t>& ids, RowPtr out, RowPtr inv, int64_t s) {
  if constexpr (kInverse) {
    for (int64_t i = 0; i < s; ++i) StoreAt<int32_t>(inv.base + i * inv.stride, -1);
  }
  char* o = out.base;
  int32_t rank = 0;
  for (const int64_t id : ids) {
    StoreAt<T>(o, static_cast<T>(id));
    o += out.stride;
    if constexpr (kInverse) StoreAt<int32_t>(inv.base + id * inv.stride, rank);
    ++rank;
  }
}

// Builds the error of row `row` (known to be invalid) of the private
// snapshot `copy` serially, in O(R log R) time and O(R) memory whatever S is.
template <typename T>
SortIdError RowError(const TensorView& copy, int64_t row, int64_t s) {
  std::vector<int64_t> values;
  LoadRow<T>(RowOf(copy, row), copy.shape[copy.rank - 1], &values);
  const BadPosition bad = FirstBadPosition(values, s);
  return {row, bad.position, values[static_cast<size_t>(bad.position)], bad.first};
}

// SortTyped for sparse rows (PreferSortingToBitmap): the same two passes, by
// comparison.
template <typename T>
absl::Status SortSparseTyped(const SortTokensArgs& args, const IndexSnapshot& snapshot,
                             ThreadPool* pool) {
  const TensorView& ids = args.ids;
  const TensorView& copy = snapshot.view();
  const TensorView& out = args.out.has_value() ? *args.out : ids;
  const bool has_inverse = args.inverse.has_value();
  const int64_t s = args.original_tokens;
  const int64_t r = ids.shape[ids.rank - 1];
  const int64_t rows = ids.NumRows();
  const int64_t row_cost = r * 32 + (has_inverse ? s : 0);
  const int64_t grain = std::max<int64_t>(1, kChunkWork / std::max<int64_t>(row_cost, 1));

  std::atomic<int64_t> first_bad{rows};
  ParallelFor(pool, rows, grain, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> row_ids;
    for (int64_t row = begin; row < end; ++row) {
      if (row > first_bad.load(std::memory_order_relaxed)) return;
      snapshot.CopyRow(row);
      LoadRow<T>(RowOf(copy, row), r, &row_ids);
      if (!SortAndCheckUniqueInRange(&row_ids, s)) {
        StoreMin(first_bad, row);
        return;
      }
    }
  });
  // Skipped chunks left rows unchecked: stop before using the snapshot.
  RETURN_IF_ERROR(CheckStop());
  if (const int64_t bad = first_bad.load(); bad < rows) {
    return SortIdStatus(ids, s, RowError<T>(copy, bad, s));
  }
  ParallelFor(pool, rows, grain, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> row_ids;
    for (int64_t row = begin; row < end; ++row) {
      LoadRow<T>(RowOf(copy, row), r, &row_ids);
      std::sort(row_ids.begin(), row_ids.end());
      const RowPtr o = RowOf(out, row);
      if (has_inverse) {
        EmitSorted<T, true>(row_ids, o, RowOf(*args.inverse, row), s);
      } else {
        EmitSorted<T, false>(row_ids, o, RowPtr{nullptr, 0}, s);
      }
    }
  });
  return CheckStop();
}

template <typename T>
absl::Status SortTyped(const SortTokensArgs& args, ThreadPool* pool) {
  const TensorView& ids = args.ids;
  const TensorView& out = args.out.has_value() ? *args.out : ids;
  const bool has_inverse = args.inverse.has_value();
  const int64_t s = args.original_tokens;
  const int64_t r = ids.shape[ids.rank - 1];
  const int64_t rows = ids.NumRows();
  if (rows == 0) return absl::OkStatus();
  const IndexSnapshot snapshot(ids);  // filled row by row in pass 1
  const TensorView& copy = snapshot.view();
  if (PreferSortingToBitmap(r, s)) return SortSparseTyped<T>(args, snapshot, pool);
  const int64_t words = BitmapWords(s);
  const int64_t grain = std::max<int64_t>(1, kChunkWork / SortRowCost(r, s, has_inverse));
  const bool keep = KeepBitmaps(rows, words);
  // Zeroed per row by pass 1 (in parallel), not here.
  std::unique_ptr<uint64_t[]> kept;
  if (keep) kept.reset(new uint64_t[static_cast<size_t>(rows * words)]);

  // Pass 1: validate every row; remember the lowest invalid row.
  std::atomic<int64_t> first_bad{rows};
  ParallelFor(pool, rows, grain, [&](int64_t begin, int64_t end) {
    std::vector<uint64_t> local;
    if (!keep) local.assign(static_cast<size_t>(words), 0);
    for (int64_t row = begin; row < end; ++row) {
      if (row > first_bad.load(std::memory_order_relaxed)) return;
      uint64_t* bits = keep ? kept.get() + row * words : local.data();
      if (keep) std::memset(bits, 0, static_cast<size_t>(words) * sizeof(uint64_t));
      snapshot.CopyRow(row);
      const bool bad = MarkRow<T>(RowOf(copy, row), r, s, bits) >= 0;
      if (!keep) std::fill(local.begin(), local.end(), 0);
      if (bad) {
        StoreMin(first_bad, row);
        return;
      }
    }
  });
  // Skipped chunks left rows unchecked: stop before using the snapshot.
  RETURN_IF_ERROR(CheckStop());
  if (const int64_t bad = first_bad.load(); bad < rows) {
    return SortIdStatus(ids, s, RowError<T>(copy, bad, s));
  }

  // Pass 2: write, from the bitmaps or the snapshot (never from `ids`, which
  // in place is also the output).
  ParallelFor(pool, rows, grain, [&](int64_t begin, int64_t end) {
    std::vector<uint64_t> local;
    if (!keep) local.assign(static_cast<size_t>(words), 0);
    for (int64_t row = begin; row < end; ++row) {
      uint64_t* bits = keep ? kept.get() + row * words : local.data();
      if (!keep) MarkValidRow<T>(RowOf(copy, row), r, bits);
      const RowPtr o = RowOf(out, row);
      if (has_inverse) {
        EmitRow<T, true>(bits, words, o, RowOf(*args.inverse, row), s);
      } else {
        EmitRow<T, false>(bits, words, o, RowPtr{nullptr, 0}, s);
      }
    }
  });
  return CheckStop();
}

}  // namespace

absl::Status SortTokens(const SortTokensArgs& args, ThreadPool* pool) {
  RETURN_IF_ERROR(ValidateSortTokens(args));
  if (args.ids.dtype == DType::kInt64) return SortTyped<int64_t>(args, pool);
  return SortTyped<int32_t>(args, pool);
}

uint64_t ScratchBytes(const SortTokensArgs& args, int threads) {
  if (!ValidateSortTokens(args).ok()) return kStatusScratchBytes;
  const TensorView& ids = args.ids;
  const int64_t s = args.original_tokens;
  const int64_t r = ids.shape[ids.rank - 1];
  const int64_t rows = ids.NumRows();
  if (rows == 0) return kStatusScratchBytes;
  uint64_t fixed = IndexSnapshot::BytesFor(ids);
  uint64_t per_chunk;  // per live chunk of either pass
  if (PreferSortingToBitmap(r, s)) {
    per_chunk = SatMul3(r, sizeof(int64_t), 1);  // the row's ids
  } else {
    const int64_t words = BitmapWords(s);
    const bool keep = KeepBitmaps(rows, words);
    if (keep) fixed = SatAdd(fixed, SatMul3(rows, words, sizeof(uint64_t)));
    per_chunk = keep ? 0 : SatMul3(words, sizeof(uint64_t), 1);
  }
  // The error of a bad row: its values and (value, position) pairs.
  const uint64_t row_error = SatMul3(r, sizeof(int64_t) + 2 * sizeof(int64_t), 1);
  const uint64_t phase = std::max(SatMul(LiveChunks(threads, rows), per_chunk), row_error);
  return SatAdd(SatAdd(fixed, phase), kStatusScratchBytes);
}

}  // namespace tokensel::kernels::cpu
