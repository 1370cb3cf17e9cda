// Cooperative stop (kernels/cpu/stop.h): ParallelFor checks the caller's
// token before every chunk and starts no chunk after a failed check; ops
// return the token's status soon after it fires, never OK, never an error
// from a partial validation, and write nothing when stopped while validating;
// a token that never fires changes no result (bit for bit).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_tensor.h"

namespace tokensel::testing {
namespace {

namespace k = kernels;
using Clock = std::chrono::steady_clock;
using k::DType;
using k::TensorView;
using k::cpu::CheckStop;
using k::cpu::ScopedStopToken;
using k::cpu::StopToken;
using k::cpu::ThreadPool;

// CANCELLED from check number `fire_at` on (or only at that check when not
// sticky); remembers when it first fired.
class CountdownToken : public StopToken {
 public:
  explicit CountdownToken(int64_t fire_at, bool sticky = true)
      : fire_at_(fire_at), sticky_(sticky) {}
  absl::Status Check() const override {
    const int64_t n = checks_.fetch_add(1) + 1;
    if (n < fire_at_ || (!sticky_ && n > fire_at_)) return absl::OkStatus();
    Clock::time_point expected{};
    fired_.compare_exchange_strong(expected, Clock::now());
    return absl::CancelledError("cancelled by the test");
  }
  int64_t checks() const { return checks_.load(); }
  Clock::time_point fired() const { return fired_.load(); }

 private:
  const int64_t fire_at_;
  const bool sticky_;
  mutable std::atomic<int64_t> checks_{0};
  mutable std::atomic<Clock::time_point> fired_{Clock::time_point{}};
};

class DeadlineToken : public StopToken {
 public:
  explicit DeadlineToken(Clock::duration after) : deadline_(Clock::now() + after) {}
  absl::Status Check() const override {
    if (Clock::now() < deadline_) return absl::OkStatus();
    return absl::DeadlineExceededError("deadline passed");
  }
  Clock::time_point deadline() const { return deadline_; }

 private:
  const Clock::time_point deadline_;
};

class NeverToken : public StopToken {
 public:
  absl::Status Check() const override {
    checks_.fetch_add(1, std::memory_order_relaxed);
    return absl::OkStatus();
  }
  int64_t checks() const { return checks_.load(); }

 private:
  mutable std::atomic<int64_t> checks_{0};
};

std::unique_ptr<ThreadPool> MakePool(int threads) {
  return threads == 1 ? nullptr : std::make_unique<ThreadPool>(threads);
}

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

constexpr double kNeverStopped = 60.0;  // s; "soon" is counted in checks, not timed

// ------------------------------------------------------------- ParallelFor

TEST(StopTest, NoChunkStartsAfterAFailedCheck) {
  for (int threads : {1, 3}) {
    for (bool sticky : {true, false}) {
      auto pool = MakePool(threads);
      CountdownToken token(5, sticky);
      std::atomic<int64_t> chunks{0};
      absl::Status after;
      {
        ScopedStopToken scope(&token);
        k::cpu::ParallelFor(pool.get(), 10000, 1, [&](int64_t, int64_t) { chunks.fetch_add(1); });
        after = CheckStop();
      }
      // Checks 1-4 passed and each let one chunk run; check 5 failed. A token
      // that goes back to OK lets other threads' checks pass until the failed
      // one's thread latches the stop: how many is up to the scheduler (13 of
      // 10000 seen under TSan on a loaded machine), so only the floor is fixed.
      if (sticky) {
        EXPECT_EQ(chunks.load(), 4) << threads << " threads";
        EXPECT_LE(token.checks(), 5 + threads) << "checks after the stop";
      } else {
        EXPECT_GE(chunks.load(), 4);
        EXPECT_LT(chunks.load(), 10000) << "the stop never latched";
      }
      EXPECT_THAT(after, StatusIs(absl::StatusCode::kCancelled, "cancelled by the test"));
      EXPECT_OK(CheckStop());  // the scope is gone
    }
  }
}

TEST(StopTest, ChunksSeeTheCallersTokenAndItsLatch) {
  for (int threads : {1, 3}) {
    auto pool = MakePool(threads);
    CountdownToken token(3);
    std::atomic<int64_t> stopped_inside{0};
    absl::Status after;
    {
      ScopedStopToken scope(&token);
      EXPECT_OK(CheckStop());  // check 1
      k::cpu::ParallelFor(pool.get(), 1000, 1, [&](int64_t, int64_t) {
        // Check 2 (before the chunk) passed; this is check 3 (or later).
        if (!CheckStop().ok()) stopped_inside.fetch_add(1);
      });
      after = CheckStop();
    }
    EXPECT_GE(stopped_inside.load(), 1);
    EXPECT_THAT(after, StatusIs(absl::StatusCode::kCancelled));
  }
}

TEST(StopTest, ScopesNestAndRestore) {
  CountdownToken fired(1);
  NeverToken never;
  EXPECT_OK(CheckStop());
  {
    ScopedStopToken outer(&never);
    {
      ScopedStopToken inner(&fired);
      EXPECT_THAT(CheckStop(), StatusIs(absl::StatusCode::kCancelled));
      EXPECT_FALSE(inner.stopped().ok());
      ScopedStopToken none(nullptr);
      EXPECT_OK(CheckStop());
    }
    EXPECT_OK(CheckStop());
    EXPECT_TRUE(outer.stopped().ok());
  }
  EXPECT_OK(CheckStop());
}

// ------------------------------------------------------------------- ops

TEST(StopTest, LongSampleRowStopsSoonAfterTheToken) {
  // One row of S = 2^27 positions, R = 1: seconds of work on a tiny request.
  k::SampleTokensArgs args;
  args.layers = args.batch = 1;
  args.original_tokens = int64_t{1} << 27;
  args.retained_tokens = 1;
  int32_t id = -1;
  args.ids = TensorView::Contiguous(&id, DType::kInt32, {1, 1, 1});
  for (int threads : {1, 3}) {
    auto pool = MakePool(threads);
    {
      CountdownToken token(100);  // the row checks every 2^16 positions
      ScopedStopToken scope(&token);
      const absl::Status status = k::cpu::SampleTokens(args, pool.get());
      EXPECT_THAT(status, StatusIs(absl::StatusCode::kCancelled));
      EXPECT_LE(token.checks(), 100 + threads) << "work went on after the stop";
    }
    {
      DeadlineToken token(std::chrono::milliseconds(30));
      ScopedStopToken scope(&token);
      const absl::Status status = k::cpu::SampleTokens(args, pool.get());
      const Clock::time_point end = Clock::now();
      EXPECT_THAT(status, StatusIs(absl::StatusCode::kDeadlineExceeded));
      EXPECT_LT(Seconds(end - token.deadline()), kNeverStopped);
    }
  }
  EXPECT_EQ(id, -1);  // the row never finished
}

TEST(StopTest, LongGatherStopsSoonAfterTheTokenAndLeavesRowsUnwritten) {
  constexpr int64_t B = 4, S = 512, R = 4096, C = 4096;  // 64 MiB of int8 output
  std::vector<int8_t> act(B * S * C, 1);
  std::vector<int64_t> idx(B * R);
  for (int64_t e = 0; e < B * R; ++e) idx[e] = (e * 7) % S;
  std::vector<int8_t> out(B * R * C * 2);
  // A strided output (element stride 2): element-wise copies, the slow path.
  const k::GatherTokensArgs args{
      TensorView::Contiguous(act.data(), DType::kInt8, {B, S, C}),
      TensorView::Contiguous(idx.data(), DType::kInt64, {B, R}),
      TensorView::Strided(out.data(), DType::kInt8, {B, R, C}, {R * C * 2, C * 2, 2}), true};
  for (int threads : {1, 3}) {
    auto pool = MakePool(threads);
    for (int fire_at : {1, 20}) {
      std::fill(out.begin(), out.end(), 0);
      CountdownToken token(fire_at);
      ScopedStopToken scope(&token);
      const absl::Status status = k::cpu::GatherTokens(args, pool.get());
      EXPECT_THAT(status, StatusIs(absl::StatusCode::kCancelled));
      EXPECT_LE(token.checks(), fire_at + threads) << "work went on after the stop";
      const int64_t written = std::count(out.begin(), out.end(), 1);
      if (fire_at == 1) {
        EXPECT_EQ(written, 0);  // stopped while validating: nothing written
      } else {
        EXPECT_GT(written, 0);
        EXPECT_LT(written, B * R * C / 2) << "most rows must be left unwritten";
      }
    }
    // A deadline in the middle of the copy.
    DeadlineToken token(std::chrono::milliseconds(5));
    ScopedStopToken scope(&token);
    const absl::Status status = k::cpu::GatherTokens(args, pool.get());
    EXPECT_TRUE(status.ok() || absl::IsDeadlineExceeded(status)) << status;
    EXPECT_LT(Seconds(Clock::now() - token.deadline()), kNeverStopped);
  }
}

TEST(StopTest, LongSegmentRunsAreExactAndStopSoonAfterTheToken) {
  // A zero-strided id view: one run as long as the row, from 4 bytes.
  int32_t one = 1;
  int32_t seqlen = -7, offset[2] = {-7, -7};
  k::SegmentSeqlensArgs args;
  args.max_segments = 1;
  args.q.seqlen = TensorView::Contiguous(&seqlen, DType::kInt32, {1, 1});
  args.q.offset = TensorView::Contiguous(offset, DType::kInt32, {1, 2});
  for (int threads : {1, 3}) {
    auto pool = MakePool(threads);
    constexpr int64_t kT = 300000;  // several stop spans
    args.segment_ids_q = TensorView::Strided(&one, DType::kInt32, {1, kT}, {1, 0});
    NeverToken never;
    {
      ScopedStopToken scope(&never);
      ASSERT_OK(k::cpu::SegmentSeqlens(args, pool.get()));
    }
    EXPECT_EQ(seqlen, kT);
    EXPECT_EQ(offset[0], 0);
    EXPECT_EQ(offset[1], -1);
    EXPECT_GE(never.checks(), kT >> 16);  // polled between spans
    seqlen = -7;
    args.segment_ids_q = TensorView::Strided(&one, DType::kInt32, {1, INT32_MAX}, {1, 0});
    CountdownToken token(5);
    ScopedStopToken scope(&token);
    EXPECT_THAT(k::cpu::SegmentSeqlens(args, pool.get()), StatusIs(absl::StatusCode::kCancelled));
    EXPECT_LE(token.checks(), 5 + threads) << "work went on after the stop";
    EXPECT_EQ(seqlen, -7);  // stopped before writing
  }
}

// A stop during validation is the stop, not the (later) data error and not a
// write based on the rows checked so far; also for a token that goes back to
// OK after firing once.
TEST(StopTest, StopWhileValidatingWritesNothing) {
  constexpr int64_t B = 256, S = 512, R = 256, C = 4;  // validation runs in 4 chunks
  TestTensor all(DType::kFloat32, {B, S, C}), layer(DType::kFloat32, {B, R, C});
  TestTensor idx(DType::kInt32, {B, R});
  for (int64_t e = 0; e < B * R; ++e) idx.SetIndex(e, e % R);
  idx.SetIndex(B * R - 1, 0);  // a duplicate in the last row
  std::mt19937_64 rng(1);
  all.FillRandom(rng);
  layer.FillRandom(rng);
  const std::vector<uint8_t> before = all.Bytes();
  const k::ScatterTokensArgs args{all.view(), layer.view(), idx.view(), true};
  EXPECT_THAT(k::cpu::ScatterTokens(args, nullptr), StatusIs(absl::StatusCode::kInvalidArgument));
  for (int threads : {1, 3}) {
    auto pool = MakePool(threads);
    for (bool sticky : {true, false}) {
      CountdownToken token(2, sticky);
      ScopedStopToken scope(&token);
      EXPECT_THAT(k::cpu::ScatterTokens(args, pool.get()), StatusIs(absl::StatusCode::kCancelled));
      EXPECT_EQ(all.Bytes(), before);
    }
  }
}

// Every op, with a token that never fires, gives the same bytes as without.
TEST(StopTest, NeverFiringTokenChangesNoResult) {
  std::mt19937_64 rng(7);
  struct Case {
    const char* name;
    std::function<absl::Status(ThreadPool*)> run;
    std::vector<TestTensor*> outputs;
  };
  // Inputs.
  TestTensor act(DType::kBFloat16, {4, 300, 40}), idx(DType::kInt64, {4, 200});
  for (int64_t e = 0; e < 800; ++e) idx.SetIndex(e, (e * 3) % 300);
  act.FillRandom(rng);
  TestTensor scores(DType::kFloat32, {6, 5000});
  scores.FillRandom(rng);
  TestTensor ids(DType::kInt32, {6, 1000});
  for (int64_t e = 0; e < 6000; ++e) ids.SetIndex(e, 4999 - (e % 1000) * 5);
  TestTensor mask(DType::kInt8, {4, 2, 300, 300});
  mask.FillRandom(rng);
  TestTensor seg_ids(DType::kInt32, {3, 4000}), seg_pos(DType::kInt32, {3, 4000});
  for (int64_t e = 0; e < 12000; ++e) {
    seg_ids.SetIndex(e, (e % 4000) / 100 + 1);
    seg_pos.SetIndex(e, e % 100);
  }
  // Outputs.
  TestTensor gathered(DType::kBFloat16, {4, 200, 40}), scattered(DType::kBFloat16, {4, 300, 40});
  TestTensor sorted(DType::kInt32, {6, 1000}), inverse(DType::kInt32, {6, 5000});
  TestTensor topk(DType::kInt64, {6, 700}), sampled(DType::kInt32, {3, 4, 200});
  TestTensor sample_inv(DType::kInt32, {3, 4, 300}), bert(DType::kInt8, {3, 4, 2, 200, 200});
  TestTensor long_ids(DType::kInt64, {1, 1, 3}), gpt(DType::kInt8, {4, 2, 100, 100});
  TestTensor seqlen(DType::kInt32, {3, 50}), offset(DType::kInt32, {3, 51});
  k::SortTokensArgs sort_args{ids.view(), 5000, sorted.view(), inverse.view()};
  k::SampleTokensArgs sample_args;
  sample_args.layers = 3;
  sample_args.batch = 4;
  sample_args.original_tokens = 300;
  sample_args.retained_tokens = 200;
  sample_args.seed = 99;
  sample_args.ids = sampled.view();
  sample_args.inverse = sample_inv.view();
  sample_args.mask =
      TensorView::Strided(mask.data(), DType::kInt8, {4, 2, 300, 300}, {180000, 90000, 300, 1});
  sample_args.bert_mask = bert.view();
  k::SampleTokensArgs long_args;
  long_args.layers = long_args.batch = 1;
  long_args.original_tokens = (int64_t{1} << 20) + 77;  // chunked rows
  long_args.retained_tokens = 3;
  long_args.ids = long_ids.view();
  k::SegmentSeqlensArgs seg_args;
  seg_args.segment_ids_q = seg_ids.view();
  seg_args.max_segments = 50;
  seg_args.q = k::SegmentSeqlensSide{seqlen.view(), offset.view(), std::nullopt};
  std::vector<Case> cases = {
      {"gather",
       [&](ThreadPool* p) {
         return k::cpu::GatherTokens({act.view(), idx.view(), gathered.view(), true}, p);
       },
       {&gathered}},
      {"scatter",
       [&](ThreadPool* p) {
         TestTensor uniq(DType::kInt64, {4, 40});
         for (int64_t e = 0; e < 160; ++e) uniq.SetIndex(e, (e % 40) * 7);
         TestTensor lay(DType::kBFloat16, {4, 40, 40});
         std::mt19937_64 r(3);
         lay.FillRandom(r);
         return k::cpu::ScatterTokens({scattered.view(), lay.view(), uniq.view(), true}, p);
       },
       {&scattered}},
      {"sort",
       [&](ThreadPool* p) { return k::cpu::SortTokens(sort_args, p); },
       {&sorted, &inverse}},
      {"topk",
       [&](ThreadPool* p) {
         return k::cpu::TopKTokens({scores.view(), topk.view()}, p);
       },
       {&topk}},
      {"sample+bert",
       [&](ThreadPool* p) { return k::cpu::SampleTokens(sample_args, p); },
       {&sampled, &sample_inv, &bert}},
      {"sample, chunked rows",
       [&](ThreadPool* p) { return k::cpu::SampleTokens(long_args, p); },
       {&long_ids}},
      {"gpt",
       [&](ThreadPool* p) {
         return k::cpu::SliceGptMask({sample_args.mask.value(), gpt.view()}, p);
       },
       {&gpt}},
      {"segments",
       [&](ThreadPool* p) { return k::cpu::SegmentSeqlens(seg_args, p); },
       {&seqlen, &offset}},
  };
  for (Case& c : cases) {
    for (int threads : {1, 3}) {
      auto pool = MakePool(threads);
      for (TestTensor* t : c.outputs) t->Fill(0x5A);
      ASSERT_OK(c.run(pool.get())) << c.name;
      std::vector<std::vector<uint8_t>> reference;
      for (TestTensor* t : c.outputs) reference.push_back(t->Bytes());
      for (TestTensor* t : c.outputs) t->Fill(0x5A);
      NeverToken token;
      {
        ScopedStopToken scope(&token);
        ASSERT_OK(c.run(pool.get())) << c.name;
      }
      EXPECT_GT(token.checks(), 0) << c.name;
      for (size_t i = 0; i < c.outputs.size(); ++i) {
        EXPECT_EQ(c.outputs[i]->Bytes(), reference[i]) << c.name << " output " << i;
      }
    }
  }
}

}  // namespace
}  // namespace tokensel::testing
