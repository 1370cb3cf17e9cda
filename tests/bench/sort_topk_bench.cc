// SortTokens and TopKTokens against the std:: algorithms a caller would use
// otherwise. Cases are "<case>/<variant>"; the baseline of each case is
// single-threaded whatever the op's thread count.
//   sort.i32.12x16x1536.s2048.tN: op vs copy rows + std::sort per row.
//   topk.{f32,bf16}.12x16x2048.r1536.tN: op vs per row (score, pos) array +
//     std::nth_element + std::sort of the top R positions.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "benchmark/benchmark.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/thread_pool.h"

namespace tokensel::bench {
namespace {

using kernels::DType;
using kernels::TensorView;
using kernels::cpu::ThreadPool;

constexpr int64_t kL = 12;
constexpr int64_t kB = 16;
constexpr int64_t kRows = kL * kB;
constexpr int64_t kSortR = 1536;
constexpr int64_t kSortS = 2048;
constexpr int64_t kTopS = 2048;
constexpr int64_t kTopR = 1536;

std::vector<int32_t> UniqueIds() {
  std::mt19937_64 rng(7);
  std::vector<int32_t> ids;
  std::vector<int32_t> perm(kSortS);
  for (int64_t row = 0; row < kRows; ++row) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    ids.insert(ids.end(), perm.begin(), perm.begin() + kSortR);
  }
  return ids;
}

void SetCounters(benchmark::State& state, int64_t items, int64_t bytes) {
  state.SetItemsProcessed(state.iterations() * items);
  state.SetBytesProcessed(state.iterations() * bytes);
}

void SortOp(benchmark::State& state, int threads) {
  std::vector<int32_t> ids = UniqueIds();
  std::vector<int32_t> out(ids.size());
  ThreadPool pool(threads);
  kernels::SortTokensArgs args;
  args.ids = TensorView::Contiguous(ids.data(), DType::kInt32, {kL, kB, kSortR});
  args.original_tokens = kSortS;
  args.out = TensorView::Contiguous(out.data(), DType::kInt32, {kL, kB, kSortR});
  for (auto _ : state) {
    if (!kernels::cpu::SortTokens(args, &pool).ok()) state.SkipWithError("SortTokens failed");
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  SetCounters(state, kRows * kSortR, kRows * kSortR * 8);
}

void SortBaseline(benchmark::State& state) {
  const std::vector<int32_t> ids = UniqueIds();
  std::vector<int32_t> out(ids.size());
  for (auto _ : state) {
    std::memcpy(out.data(), ids.data(), ids.size() * sizeof(int32_t));
    for (int64_t row = 0; row < kRows; ++row) {
      std::sort(out.begin() + row * kSortR, out.begin() + (row + 1) * kSortR);
    }
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  SetCounters(state, kRows * kSortR, kRows * kSortR * 8);
}

// Scores: fp32 normal(0,1), or the same rounded to bf16 (raw bits).
std::vector<float> Scores() {
  std::mt19937_64 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(kRows * kTopS));
  for (float& f : v) f = normal(rng);
  return v;
}

std::vector<uint16_t> ToBF16(const std::vector<float>& f) {
  std::vector<uint16_t> out(f.size());
  for (size_t i = 0; i < f.size(); ++i) {
    uint32_t u;
    std::memcpy(&u, &f[i], sizeof(u));
    out[i] = static_cast<uint16_t>(u >> 16);
  }
  return out;
}

float BF16ToFloat(uint16_t h) {
  const uint32_t u = uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

void TopKOp(benchmark::State& state, DType dtype, int threads) {
  const std::vector<float> f32 = Scores();
  std::vector<uint16_t> bf16 = ToBF16(f32);
  void* data = dtype == DType::kFloat32 ? static_cast<void*>(const_cast<float*>(f32.data()))
                                        : static_cast<void*>(bf16.data());
  std::vector<int32_t> ids(static_cast<size_t>(kRows * kTopR));
  ThreadPool pool(threads);
  kernels::TopKTokensArgs args;
  args.scores = TensorView::Contiguous(data, dtype, {kL, kB, kTopS});
  args.ids = TensorView::Contiguous(ids.data(), DType::kInt32, {kL, kB, kTopR});
  for (auto _ : state) {
    if (!kernels::cpu::TopKTokens(args, &pool).ok()) state.SkipWithError("TopKTokens failed");
    benchmark::DoNotOptimize(ids.data());
    benchmark::ClobberMemory();
  }
  SetCounters(state, kRows * kTopS, kRows * (kTopS * kernels::ElementSize(dtype) + kTopR * 4));
}

// What a caller writes without the op: (score, pos) pairs, nth_element with
// "higher score first, ties to the lower position", then sort the positions.
void TopKBaseline(benchmark::State& state, DType dtype) {
  const std::vector<float> f32 = Scores();
  const std::vector<uint16_t> bf16 = ToBF16(f32);
  std::vector<int32_t> ids(static_cast<size_t>(kRows * kTopR));
  std::vector<std::pair<float, int32_t>> pairs(static_cast<size_t>(kTopS));
  auto better = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  for (auto _ : state) {
    for (int64_t row = 0; row < kRows; ++row) {
      for (int32_t i = 0; i < kTopS; ++i) {
        const size_t at = static_cast<size_t>(row * kTopS + i);
        pairs[static_cast<size_t>(i)] = {dtype == DType::kFloat32 ? f32[at] : BF16ToFloat(bf16[at]),
                                         i};
      }
      std::nth_element(pairs.begin(), pairs.begin() + (kTopR - 1), pairs.end(), better);
      int32_t* out = ids.data() + row * kTopR;
      for (int64_t k = 0; k < kTopR; ++k) out[k] = pairs[static_cast<size_t>(k)].second;
      std::sort(out, out + kTopR);
    }
    benchmark::DoNotOptimize(ids.data());
    benchmark::ClobberMemory();
  }
  SetCounters(state, kRows * kTopS, kRows * (kTopS * kernels::ElementSize(dtype) + kTopR * 4));
}

int Register() {
  for (int threads : {1, 2}) {
    const std::string t = "t" + std::to_string(threads);
    const std::string sort_case = "sort.i32.12x16x1536.s2048." + t;
    benchmark::RegisterBenchmark((sort_case + "/op").c_str(),
                                 [threads](benchmark::State& s) { SortOp(s, threads); })
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark((sort_case + "/baseline_std_sort").c_str(), SortBaseline)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      const std::string topk_case = std::string("topk.") +
                                    (dtype == DType::kFloat32 ? "f32" : "bf16") +
                                    ".12x16x2048.r1536." + t;
      benchmark::RegisterBenchmark(
          (topk_case + "/op").c_str(),
          [dtype, threads](benchmark::State& s) { TopKOp(s, dtype, threads); })
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark((topk_case + "/baseline_nth_element").c_str(),
                                   [dtype](benchmark::State& s) { TopKBaseline(s, dtype); })
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
    }
  }
  return 0;
}

const int kRegistered = Register();

}  // namespace
}  // namespace tokensel::bench
