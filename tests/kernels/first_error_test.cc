// "The first error is the lowest bad row, whatever the thread count"
// (docs/ops.md, "Which error"), for every op that reads data it can refuse:
// SortTokens (dense kept-bitmap, dense snapshot and sparse paths),
// GatherTokens, ScatterTokens, GatherBertMask and SegmentSeqlens.
//
// The single-chunk tests elsewhere cannot see a race between chunks: here
// the sizes are picked from each op's grain (kernels/cpu/index_check.h
// IndexCheckGrain, sort_tokens.cc kChunkWork, segment_seqlens.cc) so a call
// is cut into 16 or more chunks, bad rows are spread over different chunks
// (a few, or every row past the lowest bad one, see BadLayout), and every
// call runs inline, on pools of 1-4 threads and with a
// (never firing) stop token installed, which cuts calls into as many chunks
// as the grain allows (thread_pool.h kStopChunks). 40 seeded repetitions
// each; the expected message comes from a naive scan of the rows in order.
// Outputs must be byte-identical after every failed call.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/stop.h"
#include "tests/kernels/segment_reference.h"
#include "tests/testing/sanitizers.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_tensor.h"

namespace tokensel::testing {
namespace {

using kernels::DType;
using kernels::cpu::ThreadPool;
using Rows = std::vector<std::vector<int64_t>>;

// Repetitions of each random case: the case's options cycle with rep % 2,
// % 3 and % 4, so any 12 consecutive repetitions cover every combination.
// Under a sanitizer (3-10x slower) the suite runs those 12 once: it is there
// for memory and race errors, which do not depend on the random rows.
constexpr int kRepetitions = kSanitized ? 12 : 40;

class NeverStop : public kernels::StopToken {
 public:
  absl::Status Check() const override { return absl::OkStatus(); }
};

// Every way a call is run: inline, 1..4 threads, each with and without a
// stop token installed (which forces many more, smaller chunks).
struct Runner {
  ThreadPool* pool;
  bool token;
  std::string Name() const {
    return absl::StrCat(pool == nullptr ? 0 : pool->threads(), " threads",
                        token ? " + stop token" : "");
  }
};

std::vector<Runner> Runners() {
  static ThreadPool* pools[] = {new ThreadPool(1), new ThreadPool(2), new ThreadPool(3),
                                new ThreadPool(4)};
  std::vector<Runner> runners;
  for (bool token : {false, true}) {
    runners.push_back({nullptr, token});
    for (ThreadPool* p : pools) runners.push_back({p, token});
  }
  return runners;
}

template <typename Fn>
absl::Status RunWith(const Runner& r, Fn fn) {
  NeverStop never;
  kernels::ScopedStopToken scope(r.token ? &never : nullptr);
  return fn(r.pool);
}

// "a,b,c" of row `row` of a tensor whose leading dims are `lead`, then `pos`.
std::string MultiIndex(const std::vector<int64_t>& lead, int64_t row, int64_t pos) {
  std::vector<int64_t> idx(lead.size());
  for (size_t d = lead.size(); d-- > 0;) {
    idx[d] = row % lead[d];
    row /= lead[d];
  }
  idx.push_back(pos);
  return absl::StrJoin(idx, ",");
}

// The naive reference: scan rows in order, positions in order; the first
// value outside [0, limit) or (when `unique`) repeating an earlier one.
std::string NaiveFirstError(const std::string& field, const std::vector<int64_t>& lead,
                            const Rows& rows, int64_t limit, bool unique) {
  for (size_t row = 0; row < rows.size(); ++row) {
    const std::vector<int64_t>& v = rows[row];
    for (size_t p = 0; p < v.size(); ++p) {
      const std::string at = absl::StrCat(field, "[", MultiIndex(lead, row, p), "] = ", v[p]);
      if (v[p] < 0 || v[p] >= limit) return absl::StrCat(at, " is out of range [0, ", limit, ")");
      if (!unique) continue;
      for (size_t f = 0; f < p; ++f) {
        if (v[f] == v[p]) {
          return absl::StrCat(at, " duplicates ", field, "[", MultiIndex(lead, row, f), "]");
        }
      }
    }
  }
  return "";
}

// Valid rows: `unique` ones are random distinct ids in [0, limit).
Rows ValidRows(int64_t count, int64_t n, int64_t limit, bool unique, std::mt19937_64& rng) {
  Rows rows(static_cast<size_t>(count), std::vector<int64_t>(static_cast<size_t>(n)));
  for (auto& row : rows) {
    if (unique && limit <= 4 * n) {
      std::vector<int64_t> all(static_cast<size_t>(limit));
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng);
      std::copy(all.begin(), all.begin() + n, row.begin());
    } else {
      for (size_t p = 0; p < row.size(); ++p) {
        int64_t v;
        do {
          v = static_cast<int64_t>(rng() % static_cast<uint64_t>(limit));
        } while (unique && std::find(row.begin(), row.begin() + p, v) != row.begin() + p);
        row[p] = v;
      }
    }
  }
  return rows;
}

// Which rows PlantBadRows corrupts. kSpread: 3-6 rows, one in each of as
// many equal slices of the rows (so in different chunks). kTail: one row in
// the second quarter and every row after it, so every chunk past the lowest bad
// row starts on a bad row and finds it at once, while the chunk holding the
// lowest one must scan up to it first: a call that lets any chunk's error
// end the search (or keeps the last one found) reports a higher row.
enum class BadLayout { kSpread, kTail };

std::vector<int64_t> BadRowNumbers(int64_t count, BadLayout layout, std::mt19937_64& rng) {
  std::vector<int64_t> bad;
  if (layout == BadLayout::kTail) {
    // Past the first quarter: the pool's workers have joined by then.
    const int64_t lowest = count / 4 + static_cast<int64_t>(rng() % (count / 4));
    for (int64_t row = lowest; row < count; ++row) {
      bad.push_back(row);
    }
    return bad;
  }
  const int64_t k = 3 + static_cast<int64_t>(rng() % 4);
  for (int64_t i = 0; i < k; ++i) {
    const int64_t lo = count * i / k, hi = count * (i + 1) / k;
    bad.push_back(lo + static_cast<int64_t>(rng() % (hi - lo)));
  }
  return bad;
}

BadLayout LayoutOf(int rep) { return rep % 2 == 0 ? BadLayout::kSpread : BadLayout::kTail; }

// Corrupts the rows BadRowNumbers picks with 1-3 bad values each: out of
// range low or high, or (for `unique`) a copy of another value of the row.
void PlantBadRows(Rows* rows, int64_t limit, bool unique, BadLayout layout, std::mt19937_64& rng) {
  for (int64_t r : BadRowNumbers(static_cast<int64_t>(rows->size()), layout, rng)) {
    std::vector<int64_t>& row = (*rows)[r];
    const int64_t n = static_cast<int64_t>(row.size());
    for (int k = 1 + static_cast<int>(rng() % 3); k > 0; --k) {
      const int64_t p = static_cast<int64_t>(rng() % n);
      switch (rng() % (unique && n > 1 ? 3 : 2)) {
        case 0:
          row[p] = limit + static_cast<int64_t>(rng() % 3);
          break;
        case 1:
          row[p] = -1 - static_cast<int64_t>(rng() % 3);
          break;
        default:
          row[p] = row[(p + 1 + rng() % (n - 1)) % n];
      }
    }
  }
}

TestTensor IndexTensor(DType dtype, std::vector<int64_t> shape, const Rows& rows) {
  TestTensor t(dtype, std::move(shape));
  int64_t i = 0;
  for (const auto& row : rows) {
    for (int64_t v : row) t.SetIndex(i++, v);
  }
  return t;
}

// Runs `op` with every runner and expects `expected` and no byte written.
template <typename Op>
void ExpectFirstError(const std::string& expected, std::vector<TestTensor*> written, Op op) {
  ASSERT_FALSE(expected.empty());
  std::vector<std::vector<uint8_t>> before;
  for (TestTensor* t : written) before.push_back(t->Bytes());
  for (const Runner& r : Runners()) {
    SCOPED_TRACE(r.Name());
    EXPECT_THAT(RunWith(r, op), StatusIs(absl::StatusCode::kInvalidArgument, expected));
    for (size_t i = 0; i < written.size(); ++i) {
      ASSERT_TRUE(written[i]->Bytes() == before[i]) << "a failed call wrote output " << i;
    }
  }
}

// ------------------------------------------------------------------ SortTokens

struct SortShape {
  const char* path;
  int64_t layers, batch, r, s;  // ids [layers, batch, r]
};

// Rows per chunk: 32768 / (R + S/64 (+ S with inverse)); >= 16 chunks each.
constexpr SortShape kSortShapes[] = {
    {"kept bitmaps", 2, 1024, 256, 512},             // grain 124 rows
    {"snapshot + bitmap", 4, 2048, 16, 4096},        // S > 64 R: grain 409 rows
    {"sparse, by comparison", 2, 2048, 4, 1 << 20},  // S/64 > 16 R: grain 256 rows
};

TEST(FirstErrorManyChunks, SortTokens) {
  std::mt19937_64 rng(1801);
  for (const SortShape& shape : kSortShapes) {
    SCOPED_TRACE(shape.path);
    for (int rep = 0; rep < kRepetitions; ++rep) {
      SCOPED_TRACE(absl::StrCat("repetition ", rep));
      const DType dtype = rep % 2 == 0 ? DType::kInt32 : DType::kInt64;
      Rows rows = ValidRows(shape.layers * shape.batch, shape.r, shape.s, true, rng);
      PlantBadRows(&rows, shape.s, /*unique=*/true, LayoutOf(rep), rng);
      const std::string expected =
          NaiveFirstError("ids", {shape.layers, shape.batch}, rows, shape.s, true);
      TestTensor ids = IndexTensor(dtype, {shape.layers, shape.batch, shape.r}, rows);
      TestTensor out(dtype, {shape.layers, shape.batch, shape.r});
      const bool separate_out = rep % 3 == 0;  // else in place: ids is the output
      ExpectFirstError(expected, {&ids, &out}, [&](ThreadPool* pool) {
        return kernels::cpu::SortTokens(
            {ids.view(), shape.s, separate_out ? std::optional(out.view()) : std::nullopt,
             std::nullopt},
            pool);
      });
    }
  }
}

// ------------------------------------------- GatherTokens, ScatterTokens

// The index check takes 16384 / R rows per chunk: 64 at R = 256, so B = 1024
// rows make 16 chunks.
constexpr int64_t kB = 1024, kR = 256, kS = 512;

TEST(FirstErrorManyChunks, GatherTokens) {
  std::mt19937_64 rng(1802);
  for (int rep = 0; rep < kRepetitions; ++rep) {
    SCOPED_TRACE(absl::StrCat("repetition ", rep));
    const DType dtype = rep % 2 == 0 ? DType::kInt32 : DType::kInt64;
    const bool batch_first = rep % 4 < 2;
    Rows rows = ValidRows(kB, kR, kS, false, rng);
    PlantBadRows(&rows, kS, /*unique=*/false, LayoutOf(rep), rng);
    const std::string expected = NaiveFirstError("indices", {kB}, rows, kS, false);
    TestTensor idx = IndexTensor(dtype, {kB, kR}, rows);
    TestTensor act(DType::kUInt8,
                   batch_first ? std::vector<int64_t>{kB, kS, 1} : std::vector<int64_t>{kS, kB, 1});
    TestTensor out(DType::kUInt8,
                   batch_first ? std::vector<int64_t>{kB, kR, 1} : std::vector<int64_t>{kR, kB, 1});
    act.FillRandom(rng);
    out.FillRandom(rng);
    ExpectFirstError(expected, {&out}, [&](ThreadPool* pool) {
      return kernels::cpu::GatherTokens({act.view(), idx.view(), out.view(), batch_first}, pool);
    });
  }
}

TEST(FirstErrorManyChunks, ScatterTokens) {
  std::mt19937_64 rng(1803);
  for (int rep = 0; rep < kRepetitions; ++rep) {
    SCOPED_TRACE(absl::StrCat("repetition ", rep));
    const DType dtype = rep % 2 == 0 ? DType::kInt32 : DType::kInt64;
    const bool batch_first = rep % 4 < 2;
    Rows rows = ValidRows(kB, kR, kS, true, rng);
    PlantBadRows(&rows, kS, /*unique=*/true, LayoutOf(rep), rng);
    const std::string expected = NaiveFirstError("indices", {kB}, rows, kS, true);
    TestTensor idx = IndexTensor(dtype, {kB, kR}, rows);
    TestTensor all(DType::kUInt8,
                   batch_first ? std::vector<int64_t>{kB, kS, 1} : std::vector<int64_t>{kS, kB, 1});
    TestTensor layer(DType::kUInt8, batch_first ? std::vector<int64_t>{kB, kR, 1}
                                                : std::vector<int64_t>{kR, kB, 1});
    all.FillRandom(rng);
    layer.FillRandom(rng);
    ExpectFirstError(expected, {&all}, [&](ThreadPool* pool) {
      return kernels::cpu::ScatterTokens({all.view(), layer.view(), idx.view(), batch_first}, pool);
    });
  }
}

// ------------------------------------------------------------- GatherBertMask

TEST(FirstErrorManyChunks, GatherBertMask) {
  // indices [L,B,R] = [16,1024,16]: 16384 rows, 1024 per chunk.
  constexpr int64_t kLayers = 16, kBatch = 1024, kRetained = 16, kSeq = 32;
  std::mt19937_64 rng(1804);
  for (int rep = 0; rep < kRepetitions; ++rep) {
    SCOPED_TRACE(absl::StrCat("repetition ", rep));
    const DType dtype = rep % 2 == 0 ? DType::kInt32 : DType::kInt64;
    const int64_t sq = rep % 4 < 2 ? 1 : kSeq;
    Rows rows = ValidRows(kLayers * kBatch, kRetained, kSeq, false, rng);
    PlantBadRows(&rows, kSeq, /*unique=*/false, LayoutOf(rep), rng);
    const std::string expected = NaiveFirstError("indices", {kLayers, kBatch}, rows, kSeq, false);
    TestTensor idx = IndexTensor(dtype, {kLayers, kBatch, kRetained}, rows);
    TestTensor mask(DType::kUInt8, {kBatch, 1, sq, kSeq});
    TestTensor out(DType::kUInt8, {kLayers, kBatch, 1, kRetained, kRetained});
    mask.FillRandom(rng);
    out.FillRandom(rng);
    ExpectFirstError(expected, {&out}, [&](ThreadPool* pool) {
      return kernels::cpu::GatherBertMask({mask.view(), idx.view(), out.view()}, pool);
    });
  }
}

// ------------------------------------------------------------- SegmentSeqlens

// A valid self-attention row of length t over ids 1..ns: runs in increasing
// id order (some ids skipped), padding before, between and after.
std::vector<int64_t> ValidSegmentRow(int64_t t, int64_t ns, std::mt19937_64& rng) {
  std::vector<int64_t> row;
  for (int64_t id = 1; id <= ns && static_cast<int64_t>(row.size()) < t; ++id) {
    if (rng() % 4 == 0) continue;
    row.insert(row.end(), rng() % 3 == 0 ? rng() % 8 : 0, 0);
    row.insert(row.end(), 1 + rng() % (2 * t / ns), id);
  }
  row.resize(static_cast<size_t>(t), 0);
  return row;
}

TEST(FirstErrorManyChunks, SegmentSeqlens) {
  // Rows per chunk: 65536 / (Tq + Tkv + NS) = 31 here; B = 512 is 16 chunks.
  constexpr int64_t kBatch = 512, kT = 2048, kNs = 16;
  std::mt19937_64 rng(1805);
  for (int rep = 0; rep < kRepetitions; ++rep) {
    SCOPED_TRACE(absl::StrCat("repetition ", rep));
    const DType dtype = rep % 2 == 0 ? DType::kInt32 : DType::kInt64;
    Rows rows(kBatch);
    for (auto& row : rows) row = ValidSegmentRow(kT, kNs, rng);
    // A corruption may happen to be valid: the naive finder decides.
    for (int64_t b : BadRowNumbers(kBatch, LayoutOf(rep), rng)) {
      for (int k = 1 + static_cast<int>(rng() % 3); k > 0; --k) {
        rows[b][rng() % kT] = static_cast<int64_t>(rng() % (kNs + 3)) - 1;
      }
    }
    std::string expected;
    for (int64_t b = 0; b < kBatch && expected.empty(); ++b) {
      const int64_t t = segref::NaiveFirstBadId(rows[b], kNs);
      if (t >= 0) expected = absl::StrCat("segment_ids_q[", b, ",", t, "] = ", rows[b][t]);
    }
    if (expected.empty()) continue;  // every corruption happened to be valid
    TestTensor ids = IndexTensor(dtype, {kBatch, kT}, rows);
    TestTensor seqlen(DType::kInt32, {kBatch, kNs});
    TestTensor offset(DType::kInt32, {kBatch, kNs + 1});
    seqlen.FillRandom(rng);
    offset.FillRandom(rng);
    kernels::SegmentSeqlensArgs args;
    args.segment_ids_q = ids.view();
    args.max_segments = kNs;
    args.q = {seqlen.view(), offset.view(), std::nullopt};
    ExpectFirstError(expected, {&seqlen, &offset},
                     [&](ThreadPool* pool) { return kernels::cpu::SegmentSeqlens(args, pool); });
  }
}

}  // namespace
}  // namespace tokensel::testing
