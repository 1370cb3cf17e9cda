// The CPU row-copy engine of the gather/scatter/mask operators (their index
// check is index_check.h).
//
// Every op here is a pure byte copy, so copies dispatch on the ELEMENT SIZE
// (1, 2, 4, 8 bytes) only, never on the dtype: NaN payloads, -0 and
// subnormals are copied bit for bit. Loads and stores go through memcpy, so
// views may have any byte alignment.
#ifndef TOKENSEL_KERNELS_CPU_COPY_ROWS_H_
#define TOKENSEL_KERNELS_CPU_COPY_ROWS_H_

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#include <xmmintrin.h>
#endif

#include "kernels/cpu/thread_pool.h"

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

// Gathers read their source rows in an order the hardware prefetchers do not
// follow (seq-first: every row from another token of another sequence; even
// batch-first skips the dropped tokens), so each new row starts with a miss
// the L2 streamer has not seen coming. The gather loops therefore prefetch the
// HEAD of the source row kPrefetchAheadBytes (at least two rows) ahead, into
// L2 (T1: the row is read once, so it need not displace L1). The head is
// enough: once the copy walks the row's first lines, the streamer follows it
// to the row's end, and prefetching every line of the row only duplicated the
// streamer's requests and cost instructions (bf16 t2: 2.2-2.3 ms with the
// head, 2.4-2.7 ms with the whole row). Chosen by A/B runs of the gather
// benchmark (docs/development.md, "CPU gather"): distances of 4, 8 and 16 KiB,
// heads of 2, 4, 8 lines and the whole row, hints T0, T1 and NTA, none.
inline constexpr int64_t kPrefetchAheadBytes = 4096;
inline constexpr int64_t kPrefetchMaxRows = 64;
inline constexpr int64_t kPrefetchHeadBytes = 256;  // 4 cache lines

inline int64_t PrefetchRowsAhead(int64_t row_bytes) {
  const int64_t rows =
      (kPrefetchAheadBytes + std::max<int64_t>(row_bytes, 1) - 1) / std::max<int64_t>(row_bytes, 1);
  return std::clamp<int64_t>(rows, 2, kPrefetchMaxRows);
}

// Asks for the first lines of the row [p, p + bytes) in L2: all of it when
// the row is no longer than kPrefetchHeadBytes, else its head (see above).
// A hint only: never faults, so it may run on any address the copy itself is
// about to read.
inline void PrefetchRowHead(const char* p, int64_t bytes) {
#if defined(__SSE2__)
  const int64_t head = std::min(bytes, kPrefetchHeadBytes);
  for (int64_t i = 0; i < head; i += 64) _mm_prefetch(p + i, _MM_HINT_T1);
  if (head > 0) _mm_prefetch(p + head - 1, _MM_HINT_T1);  // an unaligned head's last line
#else
  (void)p;
  (void)bytes;
#endif
}

// Every copier: operator()(dst, src) copies one row; Prefetch(src) hints the
// head of the row at src into the cache (a no-op where a row is not one byte range);
// Finish() must run after a thread's last row (it orders streaming stores
// before the hand-off).

// Copies one row whose elements are contiguous on both sides: one memcpy.
struct ContiguousRowCopy {
  int64_t bytes = 0;
  void operator()(char* dst, const char* src) const {
    std::memcpy(dst, src, static_cast<size_t>(bytes));
  }
  void Prefetch(const char* src) const { PrefetchRowHead(src, bytes); }
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
  void Prefetch(const char* src) const { PrefetchRowHead(src, bytes); }
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
  void Prefetch(const char* /*src*/) const {}  // elements spread over many lines
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

// The row loop of a gather: copy(dst_of(row), src_of(row)) for every row in
// [begin, end), in order, prefetching the source row PrefetchRowsAhead rows
// ahead (see kPrefetchAheadBytes). src_of is called twice per row (prefetch,
// copy), so it must be pure: it reads private index snapshots only.
template <typename Copy, typename DstOf, typename SrcOf>
void GatherRowRange(const Copy& copy, int64_t row_bytes, int64_t begin, int64_t end,
                    const DstOf& dst_of, const SrcOf& src_of) {
  const int64_t ahead = PrefetchRowsAhead(row_bytes);
  for (int64_t row = begin; row < std::min(end, begin + ahead); ++row) copy.Prefetch(src_of(row));
  for (int64_t row = begin; row < end; ++row) {
    if (row + ahead < end) copy.Prefetch(src_of(row + ahead));
    copy(dst_of(row), src_of(row));
  }
}

}  // namespace tokensel::kernels::cpu

#endif  // TOKENSEL_KERNELS_CPU_COPY_ROWS_H_
