// The CPU row-copy engine of the gather/scatter/mask operators, and the
// shared index-tensor check they run before writing anything.
//
// Every op here is a pure byte copy, so copies dispatch on the ELEMENT SIZE
// (1, 2, 4, 8 bytes) only, never on the dtype: NaN payloads, -0 and
// subnormals are copied bit for bit. Loads and stores go through memcpy, so
// views may have any byte alignment.
#ifndef TOKENSEL_KERNELS_CPU_COPY_ROWS_H_
#define TOKENSEL_KERNELS_CPU_COPY_ROWS_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "absl/status/status.h"
#include "kernels/cpu/row_check.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/gather_math.h"
#include "kernels/tensor_view.h"
#include "kernels/validate_gather_scatter.h"

namespace tokensel::kernels::cpu {

// Bytes each ParallelFor chunk should move at least, so thread hand-off cost
// stays small against the copy.
inline constexpr int64_t kMinChunkBytes = 64 * 1024;

// Rows per chunk for rows of `row_bytes` bytes.
inline int64_t RowGrain(int64_t row_bytes) {
  return std::max<int64_t>(1, kMinChunkBytes / std::max<int64_t>(row_bytes, 1));
}

// Outputs at least this large are written with non-temporal stores: they do
// not fit in the per-core caches anyway, and streaming stores skip the
// read-for-ownership of every destination line (~1.5x less memory traffic).
inline constexpr int64_t kStreamMinTotalBytes = 8 << 20;
inline constexpr int64_t kStreamMinRowBytes = 256;

// Every copier: operator()(dst, src) copies one row; Finish() must run after
// a thread's last row (it orders streaming stores before the hand-off).

// Copies one row whose elements are contiguous on both sides: one memcpy.
struct ContiguousRowCopy {
  int64_t bytes = 0;
  void operator()(char* dst, const char* src) const {
    std::memcpy(dst, src, static_cast<size_t>(bytes));
  }
  void Finish() const {}
};

// Contiguous row copy with non-temporal 16-byte stores (memcpy for the
// unaligned head and the tail). Loads are unaligned-safe.
struct StreamingRowCopy {
  int64_t bytes = 0;
  void operator()(char* dst, const char* src) const {
#if defined(__SSE2__)
    int64_t head = static_cast<int64_t>((16 - (reinterpret_cast<uintptr_t>(dst) & 15)) & 15);
    head = std::min(head, bytes);
    std::memcpy(dst, src, static_cast<size_t>(head));
    int64_t i = head;
    for (; i + 64 <= bytes; i += 64) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
      const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
    }
    std::memcpy(dst + i, src + i, static_cast<size_t>(bytes - i));
#else
    std::memcpy(dst, src, static_cast<size_t>(bytes));
#endif
  }
  void Finish() const {
#if defined(__SSE2__)
    _mm_sfence();
#endif
  }
};

// Copies one row of `count` elements of kElemSize bytes with arbitrary element
// strides (in bytes; 0 allowed on the source).
template <int kElemSize>
struct StridedRowCopy {
  int64_t count = 0;
  int64_t dst_stride = 0;  // bytes
  int64_t src_stride = 0;  // bytes
  void operator()(char* dst, const char* src) const {
    for (int64_t c = 0; c < count; ++c) {
      std::memcpy(dst + c * dst_stride, src + c * src_stride, kElemSize);
    }
  }
  void Finish() const {}
};

// Calls body(copier) once with the row copier for `rows` rows of `count`
// elements of `elem_size` bytes, element strides `dst_stride` / `src_stride`
// (elements). `body` is instantiated per copier type, so its row loop has no
// dispatch; it must call copier.Finish() at the end of each thread's rows.
template <typename Body>
void DispatchRowCopy(int64_t elem_size, int64_t count, int64_t dst_stride, int64_t src_stride,
                     int64_t rows, const Body& body) {
  if ((dst_stride == 1 && src_stride == 1) || count <= 1) {
    const int64_t bytes = count * elem_size;
    if (bytes >= kStreamMinRowBytes && rows * bytes >= kStreamMinTotalBytes) {
      body(StreamingRowCopy{bytes});
    } else {
      body(ContiguousRowCopy{bytes});
    }
    return;
  }
  const int64_t ds = dst_stride * elem_size;
  const int64_t ss = src_stride * elem_size;
  switch (elem_size) {
    case 1:
      body(StridedRowCopy<1>{count, ds, ss});
      break;
    case 2:
      body(StridedRowCopy<2>{count, ds, ss});
      break;
    case 4:
      body(StridedRowCopy<4>{count, ds, ss});
      break;
    default:
      body(StridedRowCopy<8>{count, ds, ss});
      break;
  }
}

namespace internal {

// Position of the first offending index of row `row` (out of [0, limit), or
// with `bitmap` non-null, a repeat within the row), or -1. `bitmap` holds
// `limit` bits, all clear on entry and on return.
template <typename IndexT>
int64_t FirstBadIndexInRow(const TensorView& indices, int64_t row, int64_t limit,
                           uint64_t* bitmap) {
  const int64_t n = indices.shape[indices.rank - 1];
  const char* base = indices.At(IndexOffset(indices, row, 0));
  const int64_t stride = indices.strides[indices.rank - 1] * static_cast<int64_t>(sizeof(IndexT));
  int64_t bad = -1;
  int64_t pos = 0;
  for (; pos < n; ++pos) {
    IndexT v;
    std::memcpy(&v, base + pos * stride, sizeof(IndexT));
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
      std::memcpy(&v, base + p * stride, sizeof(IndexT));
      bitmap[static_cast<int64_t>(v) >> 6] = 0;
    }
  }
  return bad;
}

// The status for the known-bad element at (row, pos).
inline absl::Status IndexError(const TensorView& indices, int64_t row, int64_t pos, int64_t limit) {
  const int64_t n = indices.shape[indices.rank - 1];
  const int64_t value = LoadIndex(indices, IndexOffset(indices, row, pos));
  if (value < 0 || value >= limit) {
    return TokenIndexOutOfRange(indices, row * n + pos, value, limit);
  }
  int64_t first = 0;
  while (LoadIndex(indices, IndexOffset(indices, row, first)) != value) ++first;
  return TokenIndexDuplicate(indices, row * n + pos, value, row * n + first);
}

}  // namespace internal

// Checks every element of `indices` (int32|int64; rows = all leading dims,
// the last dim is the row) is in [0, limit) and, when `unique`, occurs once in
// its row. Returns INVALID_ARGUMENT naming the FIRST offending element (lowest
// row, then lowest position), whatever the thread count. Reads only.
//
// Uniqueness is checked with a bitmap of `limit` bits per thread, or, when
// that would be far larger than a row (PreferSortingToBitmap: e.g. a
// zero-strided `all` with a huge S), by sorting each row: memory stays O(n).
inline absl::Status CheckIndexRows(const TensorView& indices, int64_t limit, bool unique,
                                   ThreadPool* pool) {
  const int64_t rows = indices.NumRows();
  const int64_t n = indices.shape[indices.rank - 1];
  if (rows == 0 || n == 0) return absl::OkStatus();
  std::atomic<int64_t> first_bad_row{rows};
  const bool is64 = indices.dtype == DType::kInt64;
  const bool by_sorting = unique && PreferSortingToBitmap(n, limit);
  const int64_t bitmap_words = unique && !by_sorting ? (limit + 63) / 64 : 0;
  auto load_row = [&](int64_t row, std::vector<int64_t>* values) {
    values->resize(static_cast<size_t>(n));
    for (int64_t pos = 0; pos < n; ++pos) {
      (*values)[static_cast<size_t>(pos)] = LoadIndex(indices, IndexOffset(indices, row, pos));
    }
  };
  ParallelFor(pool, rows, std::max<int64_t>(1, 16384 / n), [&](int64_t begin, int64_t end) {
    std::vector<uint64_t> bitmap(static_cast<size_t>(bitmap_words), 0);
    uint64_t* bits = bitmap_words > 0 ? bitmap.data() : nullptr;
    std::vector<int64_t> values;
    for (int64_t row = begin; row < end; ++row) {
      if (row >= first_bad_row.load(std::memory_order_relaxed)) return;
      int64_t pos = -1;
      if (by_sorting) {
        load_row(row, &values);
        pos = SortAndCheckUniqueInRange(&values, limit) ? -1 : 0;
      } else {
        pos = is64 ? internal::FirstBadIndexInRow<int64_t>(indices, row, limit, bits)
                   : internal::FirstBadIndexInRow<int32_t>(indices, row, limit, bits);
      }
      if (pos < 0) continue;
      StoreMin(first_bad_row, row);
      return;
    }
  });
  const int64_t bad_row = first_bad_row.load();
  if (bad_row == rows) return absl::OkStatus();
  // Re-scan the one bad row serially for its position and message.
  if (by_sorting) {
    std::vector<int64_t> values;
    load_row(bad_row, &values);
    return internal::IndexError(indices, bad_row, FirstBadPosition(values, limit).position, limit);
  }
  std::vector<uint64_t> bitmap(static_cast<size_t>(bitmap_words), 0);
  uint64_t* bits = bitmap_words > 0 ? bitmap.data() : nullptr;
  const int64_t pos = is64 ? internal::FirstBadIndexInRow<int64_t>(indices, bad_row, limit, bits)
                           : internal::FirstBadIndexInRow<int32_t>(indices, bad_row, limit, bits);
  return internal::IndexError(indices, bad_row, pos, limit);
}

}  // namespace tokensel::kernels::cpu

#endif  // TOKENSEL_KERNELS_CPU_COPY_ROWS_H_
