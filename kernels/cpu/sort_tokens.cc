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
// bitmaps of all rows fit in kKeptBitmapBytes and a row's bitmap has no more
// words than the row has ids (so they cost at most 8 bytes per id, like the
// snapshot) they are kept between the passes; otherwise each pass marks a
// per-chunk bitmap and clears it again (re-marking R ids is cheaper than the
// S/64 words the emission scans anyway).
//
// Read once: pass 1 copies each row of the client's ids into private memory
// (snapshot.h) and validates the copy; the error message is built from the
// copy of the lowest invalid row. Pass 2 reads no ids when the bitmaps are
// kept (pass 1 copies rows into a per-chunk buffer), and only a snapshot of
// all rows otherwise (re-marking, and the sparse path's sort). An id that
// decides a bitmap word or an inverse slot is therefore always the id that
// was checked, and in-place sorting cannot disturb it either.
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
#include <mutex>
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

// Kept bitmaps: one per row, shared by both passes, when they all fit and
// are no larger than the rows' ids.
bool KeepBitmaps(int64_t rows, int64_t words, int64_t r) {
  return words <= r && rows <= kKeptBitmapBytes / (words * 8);
}

RowPtr RowOf(const TensorView& v, int64_t row) {
  return {v.At(RowOffset(v, row)), v.strides[v.rank - 1] * v.elem_size()};
}

// Marks the ids of one row of client memory in `bits` (all clear on entry),
// reading each id once and keeping what it read in `copy` (contiguous).
// Returns the first offending position (out of range or duplicate; copy[0,
// position] is filled), or -1 when the row is valid (copy[0, r) is).
template <typename T>
int64_t CopyAndMarkRow(RowPtr row, int64_t r, int64_t s, uint64_t* bits, T* copy) {
  const char* p = row.base;
  for (int64_t i = 0; i < r; ++i, p += row.stride) {
    const T value = LoadAt<T>(p);
    copy[i] = value;
    const int64_t id = value;
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

// The lowest invalid row pass 1 found, with the private copy of the ids it
// checked there (the message describes exactly what was validated).
class FirstBadRow {
 public:
  explicit FirstBadRow(int64_t rows) : lowest_(rows), recorded_(rows) {}

  // The lowest invalid row recorded so far, `rows` if none (for early exits).
  int64_t lowest() const { return lowest_.load(std::memory_order_relaxed); }

  // Row `row` was found invalid in its private copy `ids` (the first `r`
  // values of T, up to and including an offence).
  template <typename T>
  void Record(int64_t row, const char* ids, int64_t r) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (row < recorded_) {
        recorded_ = row;
        LoadRow<T>(RowPtr{const_cast<char*>(ids), sizeof(T)}, r, &values_);
      }
    }
    StoreMin(lowest_, row);
  }

  // The error of the recorded row, in O(R log R) time and O(R) memory
  // whatever S is. Requires a recorded row and a finished pass.
  SortIdError Error(int64_t s) const {
    const BadPosition bad = FirstBadPosition(values_, s);
    return {recorded_, bad.position, values_[static_cast<size_t>(bad.position)], bad.first};
  }

 private:
  std::atomic<int64_t> lowest_;
  std::mutex mu_;
  int64_t recorded_;             // guarded by mu_
  std::vector<int64_t> values_;  // guarded by mu_
};

// SortTyped for sparse rows (PreferSortingToBitmap): the same two passes, by
// comparison.
template <typename T>
absl::Status SortSparseTyped(const SortTokensArgs& args, const IndexSnapshot& snapshot,
                             ThreadPool* pool) {  // snapshot: storage, filled by pass 1
  const TensorView& ids = args.ids;
  const TensorView& copy = snapshot.view();
  const TensorView& out = args.out.has_value() ? *args.out : ids;
  const bool has_inverse = args.inverse.has_value();
  const int64_t s = args.original_tokens;
  const int64_t r = ids.shape[ids.rank - 1];
  const int64_t rows = ids.NumRows();
  const int64_t row_cost = r * 32 + (has_inverse ? s : 0);
  const int64_t grain = std::max<int64_t>(1, kChunkWork / std::max<int64_t>(row_cost, 1));

  FirstBadRow bad(rows);
  ParallelFor(pool, rows, grain, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> row_ids;
    for (int64_t row = begin; row < end; ++row) {
      if (row > bad.lowest()) return;
      snapshot.CopyRow(row);
      LoadRow<T>(RowOf(copy, row), r, &row_ids);
      if (!SortAndCheckUniqueInRange(&row_ids, s)) {
        bad.Record<T>(row, snapshot.Row(row), r);
        return;
      }
    }
  });
  // Skipped chunks left rows unchecked: stop before using the snapshot.
  RETURN_IF_ERROR(CheckStop());
  if (bad.lowest() < rows) return SortIdStatus(ids, s, bad.Error(s));
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
  if (PreferSortingToBitmap(r, s)) return SortSparseTyped<T>(args, IndexSnapshot(ids), pool);
  const int64_t words = BitmapWords(s);
  const int64_t grain = std::max<int64_t>(1, kChunkWork / SortRowCost(r, s, has_inverse));
  const bool keep = KeepBitmaps(rows, words, r);
  // Kept bitmaps, zeroed per row by pass 1 (in parallel), not here; else a
  // snapshot of the ids, filled by pass 1, for pass 2 to mark again.
  std::unique_ptr<uint64_t[]> kept;
  IndexSnapshot snapshot;
  if (keep) {
    kept.reset(new uint64_t[static_cast<size_t>(rows * words)]);
  } else {
    snapshot = IndexSnapshot(ids);
  }
  const TensorView& copy = snapshot.view();

  // Pass 1: validate a private copy of every row; record the lowest invalid.
  FirstBadRow bad(rows);
  ParallelFor(pool, rows, grain, [&](int64_t begin, int64_t end) {
    std::vector<uint64_t> local;
    std::unique_ptr<T[]> row_copy;
    if (keep) {
      row_copy.reset(new T[static_cast<size_t>(r)]);
    } else {
      local.assign(static_cast<size_t>(words), 0);
    }
    for (int64_t row = begin; row < end; ++row) {
      if (row > bad.lowest()) return;
      uint64_t* bits = keep ? kept.get() + row * words : local.data();
      if (keep) std::memset(bits, 0, static_cast<size_t>(words) * sizeof(uint64_t));
      T* private_row = keep ? row_copy.get() : reinterpret_cast<T*>(snapshot.Row(row));
      const int64_t pos = CopyAndMarkRow<T>(RowOf(ids, row), r, s, bits, private_row);
      if (!keep) std::fill(local.begin(), local.end(), 0);
      if (pos >= 0) {  // the row up to its first offence is enough for the message
        bad.Record<T>(row, reinterpret_cast<const char*>(private_row), pos + 1);
        return;
      }
    }
  });
  // Skipped chunks left rows unchecked: stop before using any result.
  RETURN_IF_ERROR(CheckStop());
  if (bad.lowest() < rows) return SortIdStatus(ids, s, bad.Error(s));

  // Pass 2: write, from the kept bitmaps or the snapshot (never from `ids`,
  // which in place is also the output).
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
  uint64_t fixed;      // for the whole call
  uint64_t per_chunk;  // per live chunk of either pass
  if (PreferSortingToBitmap(r, s)) {
    fixed = IndexSnapshot::BytesFor(ids);
    per_chunk = SatMul3(r, sizeof(int64_t), 1);  // the row's ids
  } else {
    const int64_t words = BitmapWords(s);
    if (KeepBitmaps(rows, words, r)) {
      fixed = SatMul3(rows, words, sizeof(uint64_t));
      per_chunk = SatMul3(r, ids.elem_size(), 1);  // the row's private copy
    } else {
      fixed = IndexSnapshot::BytesFor(ids);
      per_chunk = SatMul3(words, sizeof(uint64_t), 1);
    }
  }
  // The lowest invalid row's values (recorded during pass 1), and for its
  // message their (value, position) pairs.
  const uint64_t recorded = SatMul3(r, sizeof(int64_t), 1);
  const uint64_t message = SatMul3(r, 2 * sizeof(int64_t), 1);
  const uint64_t phases =
      SatAdd(recorded, std::max(SatMul(LiveChunks(threads, rows), per_chunk), message));
  return SatAdd(SatAdd(fixed, phases), kStatusScratchBytes);
}

}  // namespace tokensel::kernels::cpu
