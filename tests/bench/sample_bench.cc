// SampleTokens benchmarks. Case "sample.L12.B16.S2048.R1536.t<threads>":
//   op               cpu::SampleTokens into int32 ids [L,B,R]
//   op_inverse       the same plus the int32 inverse [L,B,S]
//   baseline_fy_sort what a user writes: per row a partial Fisher-Yates shuffle
//                    of iota(S) with std::mt19937_64, then std::sort of the R
//                    ids (rows on the same pool, so only the algorithm differs)
#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "kernels/cpu/cpu_ops.h"

namespace tokensel::kernels {
namespace {

constexpr int64_t kL = 12, kB = 16, kS = 2048, kR = 1536;

enum class Variant { kOp, kOpInverse, kBaseline };

void BM_Sample(benchmark::State& state, Variant variant, int threads) {
  cpu::ThreadPool pool(threads);
  std::vector<int32_t> ids(kL * kB * kR);
  std::vector<int32_t> inverse(kL * kB * kS);
  SampleTokensArgs args;
  args.layers = kL;
  args.batch = kB;
  args.original_tokens = kS;
  args.retained_tokens = kR;
  args.seed = 1234;
  args.ids = TensorView::Contiguous(ids.data(), DType::kInt32, {kL, kB, kR});
  if (variant == Variant::kOpInverse) {
    args.inverse = TensorView::Contiguous(inverse.data(), DType::kInt32, {kL, kB, kS});
  }
  uint64_t step = 0;
  for (auto _ : state) {
    if (variant == Variant::kBaseline) {
      cpu::ParallelFor(&pool, kL * kB, 1, [&](int64_t begin, int64_t end) {
        std::vector<int32_t> perm(kS);
        for (int64_t row = begin; row < end; ++row) {
          std::mt19937_64 rng(args.seed ^ (step << 40) ^ static_cast<uint64_t>(row));
          std::iota(perm.begin(), perm.end(), 0);
          for (int64_t i = 0; i < kR; ++i) {
            std::uniform_int_distribution<int64_t> pick(i, kS - 1);
            std::swap(perm[i], perm[pick(rng)]);
          }
          std::sort(perm.begin(), perm.begin() + kR);
          std::copy(perm.begin(), perm.begin() + kR, ids.begin() + row * kR);
        }
      });
    } else {
      args.step = step;
      const absl::Status status = cpu::SampleTokens(args, &pool);
      if (!status.ok()) {
        state.SkipWithError(std::string(status.message()).c_str());
        break;
      }
    }
    step = (step + 1) & 0xFFFF;
    benchmark::DoNotOptimize(ids.data());
    benchmark::ClobberMemory();
  }
  const int64_t written =
      kL * kB * kR * 4 + (variant == Variant::kOpInverse ? kL * kB * kS * 4 : 0);
  state.SetBytesProcessed(state.iterations() * written);
  state.SetItemsProcessed(state.iterations() * kL * kB * kS);  // positions considered
}

[[maybe_unused]] const bool kRegistered = [] {
  for (int threads : {1, 2}) {
    const std::string name = "sample.L12.B16.S2048.R1536.t" + std::to_string(threads) + "/";
    const std::pair<const char*, Variant> variants[] = {
        {"op", Variant::kOp},
        {"op_inverse", Variant::kOpInverse},
        {"baseline_fy_sort", Variant::kBaseline},
    };
    for (const auto& [suffix, variant] : variants) {
      benchmark::RegisterBenchmark((name + suffix).c_str(), BM_Sample, variant, threads)
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
    }
  }
  return true;
}();

}  // namespace
}  // namespace tokensel::kernels
