// The row-copy engine (kernels/cpu/copy_rows.h) on its own: the gather loop's
// order and prefetch bounds with a recording copier, the prefetch distance,
// and every copier against a byte-by-byte reference at odd sizes and
// alignments (the operator suites reach the streaming copier only through
// outputs of 8 MiB and more).
#include "kernels/cpu/copy_rows.h"

#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace tokensel::kernels::cpu {
namespace copy_rows_test {

// Records every call; rows are identified by fake addresses base + row.
struct RecordingCopy {
  std::vector<int64_t>* copied;      // dst row of each copy, in call order
  std::vector<int64_t>* prefetched;  // src row of each prefetch
  const char* base;
  void operator()(char* dst, const char* src) const {
    EXPECT_EQ(dst - base, src - base - 1000) << "a row copied to another row's destination";
    copied->push_back(dst - base);
  }
  void Prefetch(const char* src) const { prefetched->push_back(src - base - 1000); }
  void Finish() const {}
};

TEST(CopyRowsTest, GatherRowRangeCopiesEveryRowInOrderAndPrefetchesOnlyItsOwnRows) {
  // Rows [0, 211) at base + row, their sources at base + 1000 + row: every
  // address formed is inside the array (never dereferenced).
  static char base[1000 + 211 + 1];
  for (const int64_t row_bytes : {1, 64, 100, 2048, 4096, 1 << 20}) {
    for (const auto& [begin, end] : std::vector<std::pair<int64_t, int64_t>>{
             {0, 0}, {0, 1}, {3, 4}, {5, 6}, {0, 7}, {10, 211}}) {
      std::vector<int64_t> copied, prefetched;
      const RecordingCopy copy{&copied, &prefetched, base};
      GatherRowRange(
          copy, row_bytes, begin, end, [&](int64_t row) { return base + row; },
          [&](int64_t row) { return static_cast<const char*>(base + 1000 + row); });
      std::vector<int64_t> expected;
      for (int64_t row = begin; row < end; ++row) expected.push_back(row);
      EXPECT_EQ(copied, expected) << row_bytes << " [" << begin << ", " << end << ")";
      // Each row of the range is prefetched exactly once, in order, and no
      // row outside it (a pointer past the range is never formed).
      EXPECT_EQ(prefetched, expected) << row_bytes << " [" << begin << ", " << end << ")";
    }
  }
}

TEST(CopyRowsTest, PrefetchDistanceCoversTheWindowWithinBounds) {
  for (int64_t row_bytes = 0; row_bytes <= (1 << 16); row_bytes += 37) {
    const int64_t ahead = PrefetchRowsAhead(row_bytes);
    EXPECT_GE(ahead, 2) << row_bytes;
    EXPECT_LE(ahead, kPrefetchMaxRows) << row_bytes;
    if (row_bytes > 0 && ahead < kPrefetchMaxRows) {
      EXPECT_GE(ahead * row_bytes, kPrefetchAheadBytes) << row_bytes;
      if (ahead > 2) {
        EXPECT_LT((ahead - 1) * row_bytes, kPrefetchAheadBytes) << row_bytes;
      }
    }
  }
}

// Every copier DispatchRowCopy can pick, on rows of random bytes at every
// destination alignment, against a byte loop; the bytes around each row stay.
TEST(CopyRowsTest, EveryCopierMatchesAByteLoop) {
  std::mt19937_64 rng(16);
  for (const int64_t bytes : {0, 1, 15, 16, 17, 63, 64, 65, 255, 256, 1000, 4099}) {
    for (int64_t misalign = 0; misalign < 16; ++misalign) {
      std::vector<unsigned char> src(static_cast<size_t>(bytes + 16));
      std::vector<unsigned char> dst(static_cast<size_t>(bytes + 48), 0xA5);
      for (auto& b : src) b = static_cast<unsigned char>(rng());
      const char* s = reinterpret_cast<const char*>(src.data()) + (misalign * 7) % 16;
      char* d = reinterpret_cast<char*>(dst.data()) + 16 + misalign;
      // Rows large enough in total for the streaming copier, and too small.
      for (const int64_t rows : {int64_t{1}, kStreamMinTotalBytes}) {
        std::fill(dst.begin(), dst.end(), 0xA5);
        DispatchRowCopy(1, bytes, 1, 1, rows, [&](const auto& copy) {
          copy.Prefetch(s);
          copy(d, s);
          copy.Finish();
        });
        for (int64_t i = 0; i < bytes; ++i) {
          ASSERT_EQ(static_cast<char>(d[i]), s[i])
              << "byte " << i << " of " << bytes << ", misalign " << misalign;
        }
        const auto off = static_cast<size_t>(d - reinterpret_cast<char*>(dst.data()));
        for (size_t i = 0; i < dst.size(); ++i) {
          if (i < off || i >= off + static_cast<size_t>(bytes)) {
            ASSERT_EQ(dst[i], 0xA5) << "byte " << i << " outside the row was written";
          }
        }
      }
    }
  }
}

}  // namespace copy_rows_test
}  // namespace tokensel::kernels::cpu
