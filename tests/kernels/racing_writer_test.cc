// Racing clients: a thread rewrites the index / id / position tensors of an op
// as fast as it can while the op runs on them again and again (the server
// runs kernels in place on memory its clients keep mapped). Every tensor lives
// in a GuardedArena: inputs are mapped read-only for the kernel, every tensor
// ends at a PROT_NONE page and its leading slack is checked after each run,
// so a stray read or write past any tensor crashes or fails the test.
//
// Each call must return OK or INVALID_ARGUMENT; OK results are checked for
// what a racing client cannot change (every gathered row is a real row, the
// sorted/top-k ids are increasing and in range).
//
// The race is deliberate (the kernels read client memory with plain loads),
// so a ThreadSanitizer build does not build this suite (tests/kernels/
// CMakeLists.txt; TSan reports the race in the first run); dev and ASan run it.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "tests/kernels/guarded_arena.h"

namespace tokensel::testing {
namespace {

using kernels::AttnMaskType;
using kernels::DType;
using kernels::TensorView;
using kernels::cpu::ThreadPool;

constexpr auto kBudget = std::chrono::milliseconds(400);  // per case and thread count
constexpr int kMinRuns = 20;

// One int32/int64 tensor the client rewrites (through its read-write alias,
// contiguous, `count` elements in rows of `row`).
struct Target {
  char* alias;
  DType dtype;
  int64_t count;
  int64_t row;
  std::vector<int64_t> bad;  // values to flip to; neighbours' values are used too

  int64_t Load(int64_t e) const {
    if (dtype == DType::kInt64) {
      return __atomic_load_n(reinterpret_cast<int64_t*>(alias) + e, __ATOMIC_RELAXED);
    }
    return __atomic_load_n(reinterpret_cast<int32_t*>(alias) + e, __ATOMIC_RELAXED);
  }
  void Store(int64_t e, int64_t v) const {
    if (dtype == DType::kInt64) {
      __atomic_store_n(reinterpret_cast<int64_t*>(alias) + e, v, __ATOMIC_RELAXED);
    } else {
      __atomic_store_n(reinterpret_cast<int32_t*>(alias) + e, static_cast<int32_t>(v),
                       __ATOMIC_RELAXED);
    }
  }
};

// The racing client: flips a random element to a bad value (out of range,
// negative, a neighbour's value: duplicates, padding inside a segment,
// decreasing ids), spins a little, flips it back; forever until destroyed.
class RacingWriter {
 public:
  explicit RacingWriter(std::vector<Target> targets) : targets_(std::move(targets)) {
    thread_ = std::thread([this] { Loop(); });
  }
  ~RacingWriter() {
    stop_.store(true);
    thread_.join();
  }

 private:
  void Loop() {
    std::mt19937_64 rng(42);
    while (!stop_.load(std::memory_order_relaxed)) {
      const Target& t = targets_[rng() % targets_.size()];
      const int64_t e = static_cast<int64_t>(rng() % static_cast<uint64_t>(t.count));
      const int64_t old = t.Load(e);
      int64_t v;
      if (rng() % 3 == 0) {  // a neighbour's value in the same row
        const int64_t col = e % t.row;
        v = t.Load(e - col + (col + 1 + static_cast<int64_t>(rng() % 3)) % t.row);
      } else {
        v = t.bad[rng() % t.bad.size()];
      }
      t.Store(e, v);
      for (uint64_t spin = rng() % 256; spin > 0; --spin) asm volatile("" ::: "memory");
      t.Store(e, old);
    }
  }

  std::vector<Target> targets_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

std::vector<int64_t> BadIndices(int64_t limit) {
  return {-1,
          -2,
          limit,
          limit + 1,
          2 * limit,
          int64_t{INT32_MAX},
          int64_t{INT32_MIN},
          int64_t{1} << 40,
          INT64_MIN,
          INT64_MAX};
}

void Put(char* p, DType dtype, int64_t e, int64_t v) { Target{p, dtype, e + 1, 1, {}}.Store(e, v); }

// Runs `op` repeatedly (refill() first each time) while the writer races;
// every status is OK or INVALID_ARGUMENT, guards stay intact, OK results
// pass check_ok().
void Race(const GuardedArena& arena, const std::function<void()>& refill,
          const std::function<absl::Status()>& op, const std::function<void()>& check_ok) {
  int ok = 0, invalid = 0;
  const auto end = std::chrono::steady_clock::now() + kBudget;
  for (int run = 0; run < kMinRuns || std::chrono::steady_clock::now() < end; ++run) {
    refill();
    const absl::Status status = op();
    ASSERT_TRUE(status.ok() || absl::IsInvalidArgument(status)) << status;
    ASSERT_TRUE(arena.GuardsIntact()) << "a write landed outside the outputs, run " << run;
    if (status.ok()) {
      ++ok;
      check_ok();
      if (::testing::Test::HasFatalFailure()) return;
    } else {
      ++invalid;
    }
  }
  ::testing::Test::RecordProperty("ok", ok);
  ::testing::Test::RecordProperty("invalid_argument", invalid);
}

class RacingWriterTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    if (GetParam() > 1) pool_ = std::make_unique<ThreadPool>(GetParam());
  }
  ThreadPool* pool() { return pool_.get(); }

  GuardedArena arena_;
  std::unique_ptr<ThreadPool> pool_;
};

// Token rows: act[b, s, :] = b * 1000 + s (fp32), so a gathered row names
// its source.
float TokenValue(int64_t b, int64_t s) { return static_cast<float>(b * 1000 + s); }

TEST_P(RacingWriterTest, GatherTokens) {
  constexpr int64_t B = 2, S = 64, C = 32, R = 48;
  for (DType idx_dtype : {DType::kInt32, DType::kInt64}) {
    for (bool batch_first : {true, false}) {
      auto act = arena_.Add(B * S * C * 4, GuardedArena::kReadOnly);
      auto idx = arena_.Add(B * R * ElementSize(idx_dtype), GuardedArena::kReadOnly);
      auto out = arena_.Add(B * R * C * 4, GuardedArena::kReadWrite);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t s = 0; s < S; ++s)
          for (int64_t c = 0; c < C; ++c) {
            const int64_t at = batch_first ? (b * S + s) * C + c : (s * B + b) * C + c;
            reinterpret_cast<float*>(act.alias)[at] = TokenValue(b, s);
          }
      const kernels::GatherTokensArgs args{
          TensorView::Contiguous(act.data, DType::kFloat32,
                                 batch_first ? std::initializer_list<int64_t>{B, S, C}
                                             : std::initializer_list<int64_t>{S, B, C}),
          TensorView::Contiguous(idx.data, idx_dtype, {B, R}),
          TensorView::Contiguous(out.data, DType::kFloat32,
                                 batch_first ? std::initializer_list<int64_t>{B, R, C}
                                             : std::initializer_list<int64_t>{R, B, C}),
          batch_first};
      RacingWriter writer({{idx.alias, idx_dtype, B * R, R, BadIndices(S)}});
      Race(
          arena_,
          [&] {
            for (int64_t e = 0; e < B * R; ++e) Put(idx.alias, idx_dtype, e, (e * 7) % S);
          },
          [&] { return kernels::cpu::GatherTokens(args, pool()); },
          [&] {
            const float* o = reinterpret_cast<const float*>(out.data);
            for (int64_t b = 0; b < B; ++b)
              for (int64_t r = 0; r < R; ++r) {
                const float* row = o + (batch_first ? (b * R + r) * C : (r * B + b) * C);
                const float v = row[0];
                ASSERT_TRUE(v >= TokenValue(b, 0) && v <= TokenValue(b, S - 1)) << v;
                for (int64_t c = 1; c < C; ++c) ASSERT_EQ(row[c], v);
              }
          });
    }
  }
}

TEST_P(RacingWriterTest, ScatterTokens) {
  constexpr int64_t B = 2, S = 64, C = 32, R = 48;
  auto all = arena_.Add(B * S * C * 4, GuardedArena::kReadWrite);
  auto layer = arena_.Add(B * R * C * 4, GuardedArena::kReadOnly);
  auto idx = arena_.Add(B * R * 8, GuardedArena::kReadOnly);
  for (int64_t e = 0; e < B * R * C; ++e) reinterpret_cast<float*>(layer.alias)[e] = -1.0f;
  const kernels::ScatterTokensArgs args{
      TensorView::Contiguous(all.data, DType::kFloat32, {B, S, C}),
      TensorView::Contiguous(layer.data, DType::kFloat32, {B, R, C}),
      TensorView::Contiguous(idx.data, DType::kInt64, {B, R}), true};
  RacingWriter writer({{idx.alias, DType::kInt64, B * R, R, BadIndices(S)}});
  Race(
      arena_,
      [&] {
        for (int64_t e = 0; e < B * S * C; ++e) reinterpret_cast<float*>(all.alias)[e] = 1.0f;
        for (int64_t e = 0; e < B * R; ++e) Put(idx.alias, DType::kInt64, e, (e % R) + 3);
      },
      [&] { return kernels::cpu::ScatterTokens(args, pool()); },
      [&] {
        int64_t written = 0;
        for (int64_t e = 0; e < B * S * C; ++e) {
          const float v = reinterpret_cast<const float*>(all.data)[e];
          ASSERT_TRUE(v == 1.0f || v == -1.0f) << v;
          written += v == -1.0f;
        }
        ASSERT_EQ(written, B * R * C);  // unique indices: R whole rows per batch
      });
}

TEST_P(RacingWriterTest, GatherBertMask) {
  constexpr int64_t L = 2, B = 2, H = 2, S = 32, R = 16;
  for (int64_t sq : {S, int64_t{1}}) {
    auto mask = arena_.Add(B * H * sq * S * 4, GuardedArena::kReadOnly);
    auto idx = arena_.Add(L * B * R * 4, GuardedArena::kReadOnly);
    auto out = arena_.Add(L * B * H * R * R * 4, GuardedArena::kReadWrite);
    for (int64_t e = 0; e < B * H * sq * S; ++e) reinterpret_cast<float*>(mask.alias)[e] = 2.0f;
    const kernels::GatherBertMaskArgs args{
        TensorView::Contiguous(mask.data, DType::kFloat32, {B, H, sq, S}),
        TensorView::Contiguous(idx.data, DType::kInt32, {L, B, R}),
        TensorView::Contiguous(out.data, DType::kFloat32, {L, B, H, R, R})};
    RacingWriter writer({{idx.alias, DType::kInt32, L * B * R, R, BadIndices(S)}});
    Race(
        arena_,
        [&] {
          for (int64_t e = 0; e < L * B * R; ++e) Put(idx.alias, DType::kInt32, e, (e * 5) % S);
        },
        [&] { return kernels::cpu::GatherBertMask(args, pool()); },
        [&] {
          for (int64_t e = 0; e < L * B * H * R * R; ++e) {
            ASSERT_EQ(reinterpret_cast<const float*>(out.data)[e], 2.0f) << e;
          }
        });
  }
}

// Rows of `r` ascending ids in [0, s), each strictly increasing.
void ExpectSortedRows(const char* p, DType dtype, int64_t rows, int64_t r, int64_t s) {
  for (int64_t row = 0; row < rows; ++row) {
    int64_t prev = -1;
    for (int64_t i = 0; i < r; ++i) {
      const int64_t v = Target{const_cast<char*>(p), dtype, rows * r, r, {}}.Load(row * r + i);
      ASSERT_TRUE(v > prev && v < s) << "row " << row << " pos " << i << " = " << v;
      prev = v;
    }
  }
}

struct SortCase {
  const char* name;
  int64_t rows, r, s;
  bool in_place, inverse;
};

TEST_P(RacingWriterTest, SortTokens) {
  const SortCase cases[] = {
      {"dense, bitmaps kept", 8, 48, 64, false, true},
      {"dense, in place", 8, 48, 64, true, true},
      {"dense, bitmaps not kept (> 64 MiB)", 520, 1024, int64_t{1} << 20, false, false},
      {"sparse (sorted by comparison)", 4, 8, int64_t{1} << 20, false, true},
      {"sparse, in place", 4, 8, int64_t{1} << 20, true, false}};
  for (const SortCase& c : cases) {
    SCOPED_TRACE(c.name);
    GuardedArena arena;
    const int64_t n = c.rows * c.r;
    auto ids = arena.Add(n * 4, c.in_place ? GuardedArena::kReadWrite : GuardedArena::kReadOnly);
    auto out = arena.Add(n * 4, GuardedArena::kReadWrite);
    kernels::SortTokensArgs args;
    args.ids = TensorView::Contiguous(ids.data, DType::kInt32, {c.rows, c.r});
    args.original_tokens = c.s;
    if (!c.in_place) args.out = TensorView::Contiguous(out.data, DType::kInt32, {c.rows, c.r});
    if (c.inverse) {
      auto inv = arena.Add(c.rows * c.s * 4, GuardedArena::kReadWrite);
      args.inverse = TensorView::Contiguous(inv.data, DType::kInt32, {c.rows, c.s});
    }
    RacingWriter writer({{ids.alias, DType::kInt32, n, c.r, BadIndices(c.s)}});
    Race(
        arena,
        [&] {
          for (int64_t e = 0; e < n; ++e) {
            Put(ids.alias, DType::kInt32, e, (c.r - 1 - e % c.r) * (c.s / c.r));
          }
        },
        [&] { return kernels::cpu::SortTokens(args, pool()); },
        [&] {
          // In place, the client keeps rewriting the result: nothing to check.
          if (!c.in_place) ExpectSortedRows(out.data, DType::kInt32, c.rows, c.r, c.s);
        });
  }
}

// Valid packed rows: segments 1..k of length len with one padding token
// between them; positions count up within a segment.
void FillSegments(char* ids, char* pos, DType dtype, int64_t batch, int64_t t, int64_t len) {
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < t; ++i) {
      const int64_t seg = i / (len + 1);
      const bool padding = i % (len + 1) == len;
      Put(ids, dtype, b * t + i, padding ? 0 : seg + 1);
      Put(pos, dtype, b * t + i, padding ? 0 : i % (len + 1));
    }
  }
}

TEST_P(RacingWriterTest, SegmentSeqlens) {
  constexpr int64_t B = 4, T = 256, TKV = 300, NS = 40;
  for (AttnMaskType mask :
       {AttnMaskType::kPadding, AttnMaskType::kCausal, AttnMaskType::kCausalBottomRight}) {
    for (bool cross : {false, true}) {
      const DType dtype = mask == AttnMaskType::kCausal ? DType::kInt64 : DType::kInt32;
      const int64_t es = ElementSize(dtype);
      GuardedArena arena;
      auto ids_q = arena.Add(B * T * es, GuardedArena::kReadOnly);
      auto pos_q = arena.Add(B * T * es, GuardedArena::kReadOnly);
      auto ids_kv = arena.Add(B * TKV * es, GuardedArena::kReadOnly);
      auto pos_kv = arena.Add(B * TKV * es, GuardedArena::kReadOnly);
      auto side = [&] {
        kernels::SegmentSeqlensSide s;
        s.seqlen = TensorView::Contiguous(arena.Add(B * NS * 4, GuardedArena::kReadWrite).data,
                                          DType::kInt32, {B, NS});
        s.offset = TensorView::Contiguous(
            arena.Add(B * (NS + 1) * 4, GuardedArena::kReadWrite).data, DType::kInt32, {B, NS + 1});
        s.packed = kernels::PackedSeqlens{
            TensorView::Contiguous(arena.Add(B * NS * 4, GuardedArena::kReadWrite).data,
                                   DType::kInt32, {B * NS}),
            TensorView::Contiguous(arena.Add(B * (NS + 1) * 4, GuardedArena::kReadWrite).data,
                                   DType::kInt32, {B * (NS + 1)}),
            TensorView::Contiguous(arena.Add((B * NS + 1) * 4, GuardedArena::kReadWrite).data,
                                   DType::kInt32, {B * NS + 1})};
        return s;
      };
      kernels::SegmentSeqlensArgs args;
      args.segment_ids_q = TensorView::Contiguous(ids_q.data, dtype, {B, T});
      args.segment_pos_q = TensorView::Contiguous(pos_q.data, dtype, {B, T});
      args.max_segments = NS;
      args.mask = mask;
      args.q = side();
      std::vector<Target> targets = {{ids_q.alias, dtype, B * T, T, {-1, NS + 1, 0, 1, INT32_MIN}},
                                     {pos_q.alias, dtype, B * T, T, {-1, INT32_MIN, INT32_MAX}}};
      if (cross) {
        args.segment_ids_kv = TensorView::Contiguous(ids_kv.data, dtype, {B, TKV});
        args.segment_pos_kv = TensorView::Contiguous(pos_kv.data, dtype, {B, TKV});
        args.kv = side();
        targets.push_back({ids_kv.alias, dtype, B * TKV, TKV, {-1, NS + 1, 0, 2, INT32_MAX}});
        targets.push_back({pos_kv.alias, dtype, B * TKV, TKV, {-1, INT32_MIN, -1000000}});
        if (dtype == DType::kInt64) targets.back().bad.push_back(INT64_MIN);
      }
      RacingWriter writer(targets);
      Race(
          arena,
          [&] {
            FillSegments(ids_q.alias, pos_q.alias, dtype, B, T, 7);
            FillSegments(ids_kv.alias, pos_kv.alias, dtype, B, TKV, 8);
          },
          [&] { return kernels::cpu::SegmentSeqlens(args, pool()); }, [] {});
    }
  }
}

TEST_P(RacingWriterTest, SampleTokensWithBertMask) {
  // The op writes ids, then gathers the mask with them: a client can rewrite
  // the ids in between.
  constexpr int64_t L = 2, B = 2, H = 2, S = 64, R = 16;
  auto ids = arena_.Add(L * B * R * 4, GuardedArena::kReadWrite);
  auto mask = arena_.Add(B * H * S * S * 4, GuardedArena::kReadOnly);
  auto bert = arena_.Add(L * B * H * R * R * 4, GuardedArena::kReadWrite);
  kernels::SampleTokensArgs args;
  args.layers = L;
  args.batch = B;
  args.original_tokens = S;
  args.retained_tokens = R;
  args.ids = TensorView::Contiguous(ids.data, DType::kInt32, {L, B, R});
  args.mask = TensorView::Contiguous(mask.data, DType::kFloat32, {B, H, S, S});
  args.bert_mask = TensorView::Contiguous(bert.data, DType::kFloat32, {L, B, H, R, R});
  RacingWriter writer({{ids.alias, DType::kInt32, L * B * R, R, BadIndices(S)}});
  Race(
      arena_, [&] { ++args.step; }, [&] { return kernels::cpu::SampleTokens(args, pool()); },
      [] {});
}

TEST_P(RacingWriterTest, TopKTokensScoresAreOnlyData) {
  constexpr int64_t rows = 8, S = 300, R = 100;
  auto scores = arena_.Add(rows * S * 4, GuardedArena::kReadOnly);
  auto ids = arena_.Add(rows * R * 8, GuardedArena::kReadWrite);
  const kernels::TopKTokensArgs args{
      TensorView::Contiguous(scores.data, DType::kFloat32, {rows, S}),
      TensorView::Contiguous(ids.data, DType::kInt64, {rows, R})};
  // Scores as int32 bit patterns: NaNs, infinities, -0, equal values.
  RacingWriter writer({{scores.alias,
                        DType::kInt32,
                        rows * S,
                        S,
                        {0x7FC00000, 0x7F800000, static_cast<int32_t>(0xFF800000),
                         static_cast<int32_t>(0x80000000), 0, 0x3F800000}}});
  Race(
      arena_,
      [&] {
        for (int64_t e = 0; e < rows * S; ++e)
          reinterpret_cast<float*>(scores.alias)[e] = static_cast<float>(e % 17);
      },
      [&] { return kernels::cpu::TopKTokens(args, pool()); },
      [&] { ExpectSortedRows(ids.data, DType::kInt64, rows, R, S); });
}

INSTANTIATE_TEST_SUITE_P(Threads, RacingWriterTest, ::testing::Values(1, 3),
                         [](const ::testing::TestParamInfo<int>& param) {
                           return "t" + std::to_string(param.param);
                         });

}  // namespace
}  // namespace tokensel::testing
