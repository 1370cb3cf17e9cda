// ScratchBytes (cpu_ops.h) is an upper bound of the heap an op allocates.
//
// This binary replaces the global operator new/delete with versions that
// count live bytes across all threads (the kernels allocate only through
// them: std::vector, new[], std::string in error messages). For many random
// and edge-case arguments (sizes 0/1/odd/large, huge S with tiny R,
// zero-strided inputs, int32/int64, padded views, valid and invalid data)
// the peak live bytes during a call, minus the level before it, must not
// exceed ScratchBytes(args, threads), on 1, 2 and 3 threads. Typical shapes
// also check the bound is not loose (under 2x the peak plus the status
// allowance).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <new>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/scratch.h"
#include "tests/testing/test_tensor.h"

// ------------------------------------------------------- counting allocator

namespace {

std::atomic<int64_t> g_live{0};
std::atomic<int64_t> g_peak{0};

// Every block carries this header right before the pointer handed out.
struct alignas(16) Header {
  size_t size;
  void* block;  // what malloc / aligned_alloc returned
};

void* Allocate(size_t size, size_t align, bool nothrow) {
  align = std::max(align, alignof(Header));
  const size_t front = (sizeof(Header) + align - 1) / align * align;
  const size_t total = (front + size + align - 1) / align * align;
  void* block =
      align <= alignof(std::max_align_t) ? std::malloc(total) : std::aligned_alloc(align, total);
  if (block == nullptr) {
    if (nothrow) return nullptr;
    throw std::bad_alloc();
  }
  char* p = static_cast<char*>(block) + front;
  reinterpret_cast<Header*>(p)[-1] = Header{size, block};
  const int64_t live = g_live.fetch_add(static_cast<int64_t>(size)) + static_cast<int64_t>(size);
  int64_t peak = g_peak.load(std::memory_order_relaxed);
  while (live > peak && !g_peak.compare_exchange_weak(peak, live)) {
  }
  return p;
}

void Release(void* p) {
  if (p == nullptr) return;
  const Header h = static_cast<Header*>(p)[-1];
  g_live.fetch_sub(static_cast<int64_t>(h.size));
  std::free(h.block);
}

}  // namespace

void* operator new(size_t n) { return Allocate(n, 1, false); }
void* operator new[](size_t n) { return Allocate(n, 1, false); }
void* operator new(size_t n, const std::nothrow_t&) noexcept { return Allocate(n, 1, true); }
void* operator new[](size_t n, const std::nothrow_t&) noexcept { return Allocate(n, 1, true); }
void* operator new(size_t n, std::align_val_t a) {
  return Allocate(n, static_cast<size_t>(a), false);
}
void* operator new[](size_t n, std::align_val_t a) {
  return Allocate(n, static_cast<size_t>(a), false);
}
void operator delete(void* p) noexcept { Release(p); }
void operator delete[](void* p) noexcept { Release(p); }
void operator delete(void* p, size_t) noexcept { Release(p); }
void operator delete[](void* p, size_t) noexcept { Release(p); }
void operator delete(void* p, std::align_val_t) noexcept { Release(p); }
void operator delete[](void* p, std::align_val_t) noexcept { Release(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { Release(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept { Release(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { Release(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { Release(p); }

namespace tokensel::testing {
namespace {

namespace k = kernels;
using k::DType;
using k::TensorView;
using k::cpu::ThreadPool;

// Peak live heap bytes above the level at entry while fn() runs.
uint64_t PeakDuring(const std::function<void()>& fn) {
  const int64_t base = g_live.load();
  g_peak.store(base);
  fn();
  return static_cast<uint64_t>(g_peak.load() - base);
}

ThreadPool* Pool(int threads) {
  static ThreadPool* two = new ThreadPool(2);
  static ThreadPool* three = new ThreadPool(3);
  return threads == 1 ? nullptr : threads == 2 ? two : three;
}

struct Stats {
  int calls = 0;
  int errors = 0;
};

// Runs `op` on 1, 2 and 3 threads and checks the peak against the bound.
// Returns the single-thread peak.
template <typename Args>
uint64_t ExpectBounded(const Args& args, absl::Status (*op)(const Args&, ThreadPool*),
                       const std::string& what, Stats* stats = nullptr) {
  uint64_t peak1 = 0;
  for (int threads : {1, 2, 3}) {
    const uint64_t bound = k::cpu::ScratchBytes(args, threads);
    absl::Status status;
    const uint64_t peak = PeakDuring([&] { status = op(args, Pool(threads)); });
    EXPECT_LE(peak, bound) << what << ", threads " << threads << ": " << status;
    if (threads == 1) peak1 = peak;
    if (stats != nullptr) {
      ++stats->calls;
      stats->errors += !status.ok();
    }
  }
  return peak1;
}

// Typical shapes: the bound is not loose either (single thread, OK calls).
template <typename Args>
void ExpectTight(const Args& args, absl::Status (*op)(const Args&, ThreadPool*),
                 const std::string& what) {
  const uint64_t peak = ExpectBounded(args, op, what);
  const uint64_t bound = k::cpu::ScratchBytes(args, 1);
  EXPECT_GT(peak, 0u) << what;
  EXPECT_LE(bound, 2 * peak + k::cpu::kStatusScratchBytes) << what << ": peak " << peak;
}

int64_t Pick(std::mt19937_64& rng, std::initializer_list<int64_t> values) {
  return *(values.begin() + rng() % values.size());
}

Layout RandomLayout(std::mt19937_64& rng, size_t rank) {
  Layout l;
  if (rng() % 2) {
    for (size_t d = 0; d < rank; ++d) l.pad.push_back(static_cast<int64_t>(rng() % 3));
  }
  l.misalign = static_cast<int64_t>(rng() % 2) * 4;
  return l;
}

// Index rows: distinct values in [0, limit) (a random prefix of a
// permutation for small limits), then maybe one fault.
void FillIndices(std::mt19937_64& rng, TestTensor& t, int64_t limit, int fault) {
  const int64_t n = t.shape().back();
  const int64_t rows = n == 0 ? 0 : t.NumElements() / n;
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t i = 0; i < n; ++i) {
      t.SetIndex(row * n + i, limit >= n ? (i * (limit / n) + row) % limit : i % limit);
    }
  }
  if (t.NumElements() == 0 || fault == 0) return;
  const int64_t e = static_cast<int64_t>(rng() % static_cast<uint64_t>(t.NumElements()));
  if (fault == 1) t.SetIndex(e, limit);
  if (fault == 2) t.SetIndex(e, -1);
  if (fault == 3 && e % n > 0) t.SetIndex(e, t.GetIndex(e - 1));  // a duplicate
}

TEST(ScratchBytesTest, GatherAndScatterTokens) {
  std::mt19937_64 rng(1);
  Stats stats;
  for (int iter = 0; iter < 120; ++iter) {
    const int64_t B = Pick(rng, {0, 1, 2, 3, 8}), S = Pick(rng, {1, 2, 7, 64, 300, 5000});
    const int64_t R = std::min(S, Pick(rng, {0, 1, 3, 17, 64})), C = Pick(rng, {0, 1, 3, 16});
    const DType idx_dtype = rng() % 2 ? DType::kInt32 : DType::kInt64;
    const bool batch_first = rng() % 2;
    auto dims = [&](int64_t n) {
      return batch_first ? std::vector<int64_t>{B, n, C} : std::vector<int64_t>{n, B, C};
    };
    TestTensor tokens(DType::kBFloat16, dims(S), RandomLayout(rng, 3));
    TestTensor retained(DType::kBFloat16, dims(R), RandomLayout(rng, 3));
    TestTensor idx(idx_dtype, {B, R}, RandomLayout(rng, 2));
    FillIndices(rng, idx, S, static_cast<int>(rng() % 6));
    const std::string what = "B=" + std::to_string(B) + " S=" + std::to_string(S) +
                             " R=" + std::to_string(R) + " C=" + std::to_string(C);
    ExpectBounded(k::GatherTokensArgs{tokens.view(), idx.view(), retained.view(), batch_first},
                  &k::cpu::GatherTokens, "gather " + what, &stats);
    ExpectBounded(k::ScatterTokensArgs{tokens.view(), retained.view(), idx.view(), batch_first},
                  &k::cpu::ScatterTokens, "scatter " + what, &stats);
  }
  EXPECT_GT(stats.errors, 20);
  EXPECT_LT(stats.errors, stats.calls - 20);
  // Huge S, tiny request: zero-strided activations; a zero-byte `all`
  // (uniqueness by sorting).
  constexpr int64_t kHugeS = int64_t{1} << 40;
  char bytes[64] = {};
  TestTensor idx(DType::kInt64, {2, 3});
  for (int64_t e = 0; e < 6; ++e) idx.SetIndex(e, kHugeS - 1 - e);
  TestTensor out(DType::kFloat32, {2, 3, 4});
  const TensorView act = TensorView::Strided(bytes, DType::kFloat32, {2, kHugeS, 4}, {4, 0, 1});
  ExpectBounded(k::GatherTokensArgs{act, idx.view(), out.view(), true}, &k::cpu::GatherTokens,
                "gather, zero-strided huge S");
  const TensorView all = TensorView::Contiguous(bytes, DType::kFloat32, {2, kHugeS, 0});
  const TensorView layer = TensorView::Contiguous(bytes, DType::kFloat32, {2, 3, 0});
  for (int fault : {0, 3}) {
    if (fault == 3) idx.SetIndex(4, idx.GetIndex(3));
    ExpectBounded(k::ScatterTokensArgs{all, layer, idx.view(), true}, &k::cpu::ScatterTokens,
                  "scatter, huge S sorted, fault " + std::to_string(fault));
  }
  // Typical shapes.
  TestTensor act2(DType::kFloat16, {8, 512, 64}), lay2(DType::kFloat16, {8, 256, 64});
  TestTensor idx2(DType::kInt64, {8, 256});
  FillIndices(rng, idx2, 512, 0);
  ExpectTight(k::GatherTokensArgs{act2.view(), idx2.view(), lay2.view(), true},
              &k::cpu::GatherTokens, "gather typical");
  ExpectTight(k::ScatterTokensArgs{act2.view(), lay2.view(), idx2.view(), true},
              &k::cpu::ScatterTokens, "scatter typical");
}

TEST(ScratchBytesTest, MergeAndSplitTokens) {
  std::mt19937_64 rng(11);
  Stats stats;
  for (int iter = 0; iter < 120; ++iter) {
    const int64_t B = Pick(rng, {0, 1, 2, 3, 8}), S = Pick(rng, {1, 2, 7, 64, 300, 5000});
    const int64_t R = std::min(S, Pick(rng, {0, 1, 3, 17, 64})), C = Pick(rng, {0, 1, 3, 16});
    const DType idx_dtype = rng() % 2 ? DType::kInt32 : DType::kInt64;
    const bool batch_first = rng() % 2;
    const bool in_place = rng() % 2;
    auto dims = [&](int64_t n) {
      return batch_first ? std::vector<int64_t>{B, n, C} : std::vector<int64_t>{n, B, C};
    };
    TestTensor tokens(DType::kBFloat16, dims(S), RandomLayout(rng, 3));
    TestTensor retained(DType::kBFloat16, dims(R), RandomLayout(rng, 3));
    TestTensor out(DType::kBFloat16, dims(S), RandomLayout(rng, 3));
    TestTensor idx(idx_dtype, {B, R}, RandomLayout(rng, 2));
    FillIndices(rng, idx, S, static_cast<int>(rng() % 6));
    const TensorView dst = in_place ? tokens.view() : out.view();
    const std::string what = "B=" + std::to_string(B) + " S=" + std::to_string(S) +
                             " R=" + std::to_string(R) + " C=" + std::to_string(C) +
                             (in_place ? " in place" : "");
    ExpectBounded(k::MergeTokensArgs{tokens.view(), retained.view(), idx.view(), dst, batch_first},
                  &k::cpu::MergeTokens, "merge " + what, &stats);
    ExpectBounded(k::SplitTokensArgs{tokens.view(), idx.view(), retained.view(), dst, batch_first},
                  &k::cpu::SplitTokens, "split " + what, &stats);
  }
  EXPECT_GT(stats.errors, 20);
  EXPECT_LT(stats.errors, stats.calls - 20);
  // Typical shapes: the membership bitmap and the index check.
  TestTensor x(DType::kFloat16, {8, 512, 64}), layer(DType::kFloat16, {8, 256, 64});
  TestTensor out(DType::kFloat16, {8, 512, 64}), idx(DType::kInt64, {8, 256});
  FillIndices(rng, idx, 512, 0);
  ExpectTight(k::MergeTokensArgs{x.view(), layer.view(), idx.view(), out.view(), true},
              &k::cpu::MergeTokens, "merge typical");
  ExpectTight(k::SplitTokensArgs{x.view(), idx.view(), layer.view(), out.view(), true},
              &k::cpu::SplitTokens, "split typical");
}

TEST(ScratchBytesTest, Masks) {
  std::mt19937_64 rng(2);
  Stats stats;
  for (int iter = 0; iter < 80; ++iter) {
    const int64_t L = Pick(rng, {0, 1, 2}), B = Pick(rng, {0, 1, 3}), H = Pick(rng, {1, 2});
    const int64_t S = Pick(rng, {1, 5, 32, 100}), R = std::min(S, Pick(rng, {0, 1, 4, 32}));
    const int64_t sq = rng() % 2 ? S : 1;
    TestTensor mask(DType::kInt8, {B, H, sq, S}, RandomLayout(rng, 4));
    TestTensor idx(rng() % 2 ? DType::kInt32 : DType::kInt64, {L, B, R}, RandomLayout(rng, 3));
    FillIndices(rng, idx, S, static_cast<int>(rng() % 4));
    TestTensor out(DType::kInt8, {L, B, H, R, R}, RandomLayout(rng, 5));
    ExpectBounded(k::GatherBertMaskArgs{mask.view(), idx.view(), out.view()},
                  &k::cpu::GatherBertMask, "bert", &stats);
    TestTensor square(DType::kInt8, {B, H, S, S});
    TestTensor corner(DType::kInt8, {B, H, R, R}, RandomLayout(rng, 4));
    ExpectBounded(k::SliceGptMaskArgs{square.view(), corner.view()}, &k::cpu::SliceGptMask, "gpt",
                  &stats);
  }
  EXPECT_GT(stats.errors, 10);
  constexpr int64_t kHugeS = int64_t{1} << 40;
  char bytes[8] = {};
  const TensorView mask = TensorView::Strided(bytes, DType::kInt8, {2, 1, 1, kHugeS}, {0, 0, 0, 0});
  TestTensor idx(DType::kInt64, {1, 2, 3});
  for (int64_t e = 0; e < 6; ++e) idx.SetIndex(e, kHugeS - 1 - e);
  TestTensor out(DType::kInt8, {1, 2, 1, 3, 3});
  ExpectBounded(k::GatherBertMaskArgs{mask, idx.view(), out.view()}, &k::cpu::GatherBertMask,
                "bert, zero-strided huge S");
  TestTensor mask2(DType::kFloat16, {8, 1, 512, 512}), out2(DType::kFloat16, {12, 8, 1, 256, 256});
  TestTensor idx2(DType::kInt32, {12, 8, 256});
  FillIndices(rng, idx2, 512, 0);
  ExpectTight(k::GatherBertMaskArgs{mask2.view(), idx2.view(), out2.view()},
              &k::cpu::GatherBertMask, "bert typical");
}

TEST(ScratchBytesTest, SortTokens) {
  std::mt19937_64 rng(3);
  Stats stats;
  for (int iter = 0; iter < 120; ++iter) {
    const int64_t S = Pick(rng, {1, 2, 64, 1000, int64_t{1} << 20, INT32_MAX});
    const int64_t R = std::min(S, Pick(rng, {1, 3, 17, 200}));
    const std::vector<int64_t> shape =
        rng() % 2 ? std::vector<int64_t>{Pick(rng, {0, 1, 2, 5}), R}
                  : std::vector<int64_t>{Pick(rng, {1, 3}), Pick(rng, {0, 2}), R};
    TestTensor ids(rng() % 2 ? DType::kInt32 : DType::kInt64, shape, RandomLayout(rng, 3));
    FillIndices(rng, ids, S, static_cast<int>(rng() % 5));
    k::SortTokensArgs args;
    args.ids = ids.view();
    args.original_tokens = S;
    TestTensor out(ids.dtype(), shape, RandomLayout(rng, 3));
    if (rng() % 2) args.out = out.view();
    std::vector<int64_t> inv_shape = shape;
    inv_shape.back() = S;
    TestTensor inv;
    if (S <= 1000 && rng() % 2) {
      inv = TestTensor(DType::kInt32, inv_shape);
      args.inverse = inv.view();
    }
    ExpectBounded(args, &k::cpu::SortTokens, "sort S=" + std::to_string(S), &stats);
  }
  EXPECT_GT(stats.errors, 20);
  // Dense rows whose bitmaps do not fit the kept 64 MiB: per-chunk bitmaps.
  TestTensor big(DType::kInt32, {520, 1024});
  FillIndices(rng, big, int64_t{1} << 20, 0);
  k::SortTokensArgs args;
  args.ids = big.view();
  args.original_tokens = int64_t{1} << 20;
  ExpectBounded(args, &k::cpu::SortTokens, "sort, bitmaps not kept");
  TestTensor typical(DType::kInt32, {12, 16, 1536}), out(DType::kInt32, {12, 16, 1536});
  FillIndices(rng, typical, 2048, 0);
  args.ids = typical.view();
  args.out = out.view();
  args.original_tokens = 2048;
  ExpectTight(args, &k::cpu::SortTokens, "sort typical");
}

// Valid rows (segments of `len` with a padding token after each), or garbage.
void FillSegmentRows(std::mt19937_64& rng, TestTensor& ids, TestTensor& pos, int64_t ns,
                     bool garbage) {
  const int64_t t = ids.shape()[1];
  for (int64_t e = 0; e < ids.NumElements(); ++e) {
    const int64_t i = e % t, len = 3;
    const int64_t seg = std::min(ns, i / (len + 1) + 1);
    const bool padding = i % (len + 1) == len || i / (len + 1) + 1 > ns;
    ids.SetIndex(e, garbage ? static_cast<int64_t>(rng() % (ns + 2)) - 1 : padding ? 0 : seg);
    pos.SetIndex(e, garbage && rng() % 4 == 0 ? -1 : i % (len + 1));
  }
}

TEST(ScratchBytesTest, SegmentSeqlens) {
  std::mt19937_64 rng(4);
  Stats stats;
  for (int iter = 0; iter < 120; ++iter) {
    const int64_t B = Pick(rng, {0, 1, 3, 8}), NS = Pick(rng, {1, 3, 64, 5000});
    const int64_t tq = Pick(rng, {0, 1, 5, 40}), tkv = Pick(rng, {0, 1, 7, 40});
    const bool cross = rng() % 2, packed = rng() % 2, garbage = rng() % 3 == 0;
    const auto mask = static_cast<k::AttnMaskType>(rng() % 3);
    const DType dtype = rng() % 2 ? DType::kInt32 : DType::kInt64;
    TestTensor ids_q(dtype, {B, tq}), pos_q(dtype, {B, tq});
    TestTensor ids_kv(dtype, {B, tkv}), pos_kv(dtype, {B, tkv});
    FillSegmentRows(rng, ids_q, pos_q, NS, garbage);
    FillSegmentRows(rng, ids_kv, pos_kv, NS, garbage);
    std::vector<TestTensor> outs;
    outs.reserve(10);
    auto side = [&]() {
      k::SegmentSeqlensSide s;
      s.seqlen = outs.emplace_back(DType::kInt32, std::vector<int64_t>{B, NS}).view();
      s.offset = outs.emplace_back(DType::kInt32, std::vector<int64_t>{B, NS + 1}).view();
      if (packed) {
        s.packed = k::PackedSeqlens{
            outs.emplace_back(DType::kInt32, std::vector<int64_t>{B * NS}).view(),
            outs.emplace_back(DType::kInt32, std::vector<int64_t>{B * (NS + 1)}).view(),
            outs.emplace_back(DType::kInt32, std::vector<int64_t>{B * NS + 1}).view()};
      }
      return s;
    };
    k::SegmentSeqlensArgs args;
    args.segment_ids_q = ids_q.view();
    args.segment_pos_q = pos_q.view();
    args.max_segments = NS;
    args.mask = mask;
    args.q = side();
    if (cross) {
      args.segment_ids_kv = ids_kv.view();
      args.segment_pos_kv = pos_kv.view();
      args.kv = side();
    }
    ExpectBounded(args, &k::cpu::SegmentSeqlens, "segments iter " + std::to_string(iter), &stats);
  }
  EXPECT_GT(stats.errors, 10);
}

TEST(ScratchBytesTest, SampleTokens) {
  std::mt19937_64 rng(5);
  for (int iter = 0; iter < 60; ++iter) {
    const int64_t L = Pick(rng, {0, 1, 2, 3}), B = Pick(rng, {0, 1, 2});
    const int64_t S = Pick(rng, {0, 1, 5, 100, 2048, (int64_t{1} << 20) + 3});
    const int64_t R = Pick(rng, {0, 1, 2}) == 0 ? S : static_cast<int64_t>(rng() % (S + 1));
    if (S > 4096 && L * B > 2) continue;  // keep the long rows few
    TestTensor ids(rng() % 2 ? DType::kInt32 : DType::kInt64, {L, B, R}, RandomLayout(rng, 3));
    k::SampleTokensArgs args;
    args.layers = L;
    args.batch = B;
    args.original_tokens = S;
    args.retained_tokens = R;
    args.seed = rng();
    args.ids = ids.view();
    TestTensor inv, mask, bert;
    if (S <= 2048 && rng() % 2) {
      inv = TestTensor(DType::kInt32, {L, B, S});
      args.inverse = inv.view();
    }
    if (S <= 100 && rng() % 2) {
      mask = TestTensor(DType::kInt8, {B, 1, S, S});
      bert = TestTensor(DType::kInt8, {L, B, 1, R, R});
      args.mask = mask.view();
      args.bert_mask = bert.view();
    }
    ExpectBounded(args, &k::cpu::SampleTokens,
                  "sample L=" + std::to_string(L) + " B=" + std::to_string(B) +
                      " S=" + std::to_string(S) + " R=" + std::to_string(R));
  }
  TestTensor ids(DType::kInt32, {12, 16, 1536});
  k::SampleTokensArgs args;
  args.layers = 12;
  args.batch = 16;
  args.original_tokens = 2048;
  args.retained_tokens = 1536;
  args.ids = ids.view();
  ExpectTight(args, &k::cpu::SampleTokens, "sample typical");
}

TEST(ScratchBytesTest, SamplePackedTokens) {
  std::mt19937_64 rng(15);
  for (int iter = 0; iter < 60; ++iter) {
    const int64_t N = Pick(rng, {0, 1, 3, 40});
    std::vector<int32_t> cu = {0};
    for (int64_t i = 0; i < N; ++i) {
      const int64_t n =
          iter == 7 && i == 0 ? (int64_t{1} << 20) + 9 : static_cast<int64_t>(rng() % 300);
      cu.push_back(static_cast<int32_t>(cu.back() + n));
    }
    const int64_t T = cu.back() + static_cast<int64_t>(rng() % 3);
    const int64_t den = 1 + static_cast<int64_t>(rng() % 8);
    k::SamplePackedTokensArgs args;
    args.keep_den = den;
    args.keep_num = static_cast<int64_t>(rng() % (den + 1));
    args.min_tokens = static_cast<int64_t>(rng() % 3);
    args.layers = iter == 7 ? 1 : Pick(rng, {1, 2, 3});
    args.total_tokens = T;
    args.seed = rng();
    TestTensor cu_t(DType::kInt32, {N + 1}), kept_t(DType::kInt32, {N + 1});
    for (int64_t i = 0; i <= N; ++i) cu_t.SetIndex(i, cu[i]);
    args.cu_seqlens = cu_t.view();
    args.cu_seqlens_kept = kept_t.view();
    const int64_t kept = k::PackedKeptTokens(cu.data(), N + 1, args);
    TestTensor ids(DType::kInt32, {args.layers, kept}, RandomLayout(rng, 2));
    args.ids = ids.view();
    TestTensor inv, act, out;
    if (rng() % 2) {
      inv = TestTensor(DType::kInt32, {args.layers, T});
      args.inverse = inv.view();
    }
    if (args.layers == 1 && T < 100000 && rng() % 2) {
      act = TestTensor(DType::kFloat32, {T, 8});
      out = TestTensor(DType::kFloat32, {kept, 8});
      args.activations = act.view();
      args.out = out.view();
    }
    ExpectBounded(args, &k::cpu::SamplePackedTokens,
                  "sample packed N=" + std::to_string(N) + " T=" + std::to_string(T));
  }
}

TEST(ScratchBytesTest, TopKTokens) {
  std::mt19937_64 rng(6);
  for (int iter = 0; iter < 80; ++iter) {
    const int64_t S = Pick(rng, {0, 1, 5, 300, 4096}), R = static_cast<int64_t>(rng() % (S + 1));
    const std::vector<int64_t> rows =
        rng() % 2 ? std::vector<int64_t>{Pick(rng, {0, 1, 3})} : std::vector<int64_t>{2, 3};
    std::vector<int64_t> s_shape = rows, r_shape = rows;
    s_shape.push_back(S);
    r_shape.push_back(R);
    const DType dtype = Pick(rng, {0, 1, 2}) == 0 ? DType::kFloat32 : DType::kBFloat16;
    TestTensor scores(dtype, s_shape, RandomLayout(rng, s_shape.size()));
    scores.FillRandom(rng);
    TestTensor ids(rng() % 2 ? DType::kInt32 : DType::kInt64, r_shape);
    ExpectBounded(k::TopKTokensArgs{scores.view(), ids.view()}, &k::cpu::TopKTokens,
                  "topk S=" + std::to_string(S) + " R=" + std::to_string(R));
  }
  TestTensor scores(DType::kFloat32, {12, 16, 2048}), ids(DType::kInt32, {12, 16, 1536});
  ExpectTight(k::TopKTokensArgs{scores.view(), ids.view()}, &k::cpu::TopKTokens, "topk typical");
}

// Arguments that fail metadata validation: a bound for the status only, and
// no crash or overflow whatever the numbers.
TEST(ScratchBytesTest, InvalidMetadataIsSafe) {
  k::GatherTokensArgs gather;
  gather.indices.rank = 2;
  gather.indices.shape[0] = INT64_MAX;
  gather.indices.shape[1] = INT64_MAX;
  EXPECT_EQ(k::cpu::ScratchBytes(gather, 3), k::cpu::kStatusScratchBytes);
  k::SortTokensArgs sort;
  sort.original_tokens = -5;
  EXPECT_EQ(k::cpu::ScratchBytes(sort, 1), k::cpu::kStatusScratchBytes);
  k::SegmentSeqlensArgs seg;
  seg.max_segments = INT64_MAX;
  EXPECT_EQ(k::cpu::ScratchBytes(seg, 64), k::cpu::kStatusScratchBytes);
  k::SampleTokensArgs sample;
  sample.layers = sample.batch = 1 << 30;
  sample.original_tokens = INT32_MAX;
  sample.retained_tokens = 5;
  EXPECT_EQ(k::cpu::ScratchBytes(sample, 8), k::cpu::kStatusScratchBytes);
  EXPECT_EQ(k::cpu::ScratchBytes(k::TopKTokensArgs{}, 0), k::cpu::kStatusScratchBytes);
  EXPECT_EQ(k::cpu::ScratchBytes(k::GatherBertMaskArgs{}, -1), k::cpu::kStatusScratchBytes);
  EXPECT_EQ(k::cpu::ScratchBytes(k::ScatterTokensArgs{}, 2), k::cpu::kStatusScratchBytes);
}

}  // namespace
}  // namespace tokensel::testing
