// SamplePackedTokens benchmarks (issue 15), against memcpy of the kept bytes
// measured in the same run.
//
// "packed.T128k.N64.C1024.bf16.t<threads>/op": cpu::SamplePackedTokens of a
//   pack of T = 131072 tokens in N = 64 sequences of mixed lengths (seeded;
//   from 1 to about 2*T/N tokens), keep 1/2, L = 1, with cu_seqlens_kept, ids,
//   positions and the fused gather of the kept rows of [T,C] bf16 into
//   [T',C]; ".../ids_only": the same without the gather (the sampling's
//   share); ".../baseline_memcpy": one std::memcpy of the T'*C*2 kept bytes.
// "packed.scale.T<8k..128k>.N64.C1024.bf16.t1/op" and baseline: the same at
//   T = 8k, 16k, 32k, 64k, 128k with N = 64 (sequences grow with T):
//   items_per_second counts tokens of the pack, so a flat per-token cost is a
//   flat items_per_second (and a flat ratio to memcpy).
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/ops.h"

namespace tokensel::bench {
namespace {

using kernels::DType;
using kernels::TensorView;
using kernels::cpu::ThreadPool;

constexpr int64_t kMaxT = 131072, kN = 64, kC = 1024;

struct PackedBuffers {
  std::vector<uint16_t> activations = std::vector<uint16_t>(kMaxT * kC, 0x3f80);  // bf16 1.0
  std::vector<uint16_t> out = std::vector<uint16_t>(kMaxT * kC, 0);
  std::vector<uint16_t> copy_dst = std::vector<uint16_t>(kMaxT * kC, 0);
  std::vector<int32_t> ids = std::vector<int32_t>(kMaxT);
  std::vector<int32_t> positions = std::vector<int32_t>(kMaxT);
  std::vector<int32_t> cu_kept = std::vector<int32_t>(kN + 1);

  static PackedBuffers& Get() {
    static PackedBuffers* buffers = new PackedBuffers();
    return *buffers;
  }
};

// N sequence boundaries over exactly T tokens, lengths in [1, ~2T/N].
std::vector<int32_t> MixedCuSeqlens(int64_t total) {
  std::mt19937_64 rng(20261126);
  std::uniform_real_distribution<double> weight(0.05, 1.0);
  std::vector<double> w(kN);
  double sum = 0;
  for (double& v : w) sum += (v = weight(rng));
  std::vector<int32_t> cu(kN + 1, 0);
  double acc = 0;
  for (int64_t i = 0; i < kN; ++i) {
    acc += w[i];
    const auto end = static_cast<int64_t>(acc / sum * static_cast<double>(total));
    cu[i + 1] = static_cast<int32_t>(std::max<int64_t>(cu[i] + 1, std::min(end, total)));
  }
  cu[kN] = static_cast<int32_t>(total);
  return cu;
}

kernels::SamplePackedTokensArgs Args(const std::vector<int32_t>& cu, int64_t total, int64_t* kept) {
  PackedBuffers& buf = PackedBuffers::Get();
  kernels::SamplePackedTokensArgs a;
  a.cu_seqlens = TensorView::Contiguous(const_cast<int32_t*>(cu.data()), DType::kInt32, {kN + 1});
  a.total_tokens = total;
  a.keep_num = 1;
  a.keep_den = 2;
  a.layers = 1;
  a.seed = 1234;
  *kept = kernels::PackedKeptTokens(cu.data(), kN + 1, a);
  a.cu_seqlens_kept = TensorView::Contiguous(buf.cu_kept.data(), DType::kInt32, {kN + 1});
  a.ids = TensorView::Contiguous(buf.ids.data(), DType::kInt32, {1, *kept});
  a.positions = TensorView::Contiguous(buf.positions.data(), DType::kInt32, {1, *kept});
  a.activations = TensorView::Contiguous(buf.activations.data(), DType::kBFloat16, {total, kC});
  a.out = TensorView::Contiguous(buf.out.data(), DType::kBFloat16, {*kept, kC});
  return a;
}

enum class Variant { kOp, kIdsOnly, kBaseline };

void BM_Packed(benchmark::State& state, int64_t total, int threads, Variant variant) {
  PackedBuffers& buf = PackedBuffers::Get();
  const std::vector<int32_t> cu = MixedCuSeqlens(total);
  int64_t kept = 0;
  kernels::SamplePackedTokensArgs args = Args(cu, total, &kept);
  if (variant == Variant::kIdsOnly) {
    args.activations.reset();
    args.out.reset();
  }
  const auto kept_bytes = static_cast<size_t>(kept * kC * 2);
  ThreadPool pool(threads);
  uint64_t step = 0;
  for (auto _ : state) {
    if (variant == Variant::kBaseline) {
      std::memcpy(buf.copy_dst.data(), buf.activations.data(), kept_bytes);
    } else {
      args.step = step;
      step = (step + 1) & 0xFFFF;
      const absl::Status status = kernels::cpu::SamplePackedTokens(args, &pool);
      if (!status.ok()) {
        state.SkipWithError(std::string(status.message()).c_str());
        break;
      }
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(kept_bytes));
  state.SetItemsProcessed(state.iterations() * total);  // tokens of the pack
  state.counters["kept_tokens"] = static_cast<double>(kept);
}

void Register(const std::string& name, int64_t total, int threads) {
  const std::pair<const char*, Variant> variants[] = {{"/op", Variant::kOp},
                                                      {"/ids_only", Variant::kIdsOnly},
                                                      {"/baseline_memcpy", Variant::kBaseline}};
  for (const auto& [suffix, variant] : variants) {
    benchmark::RegisterBenchmark((name + suffix).c_str(), BM_Packed, total, threads, variant)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
  }
}

[[maybe_unused]] const bool kRegistered = [] {
  for (int threads : {1, 2}) {
    Register("packed.T128k.N64.C1024.bf16.t" + std::to_string(threads), kMaxT, threads);
  }
  for (int64_t k : {8, 16, 32, 64, 128}) {
    Register("packed.scale.T" + std::to_string(k) + "k.N64.C1024.bf16.t1", k * 1024, 1);
  }
  return true;
}();

}  // namespace
}  // namespace tokensel::bench
