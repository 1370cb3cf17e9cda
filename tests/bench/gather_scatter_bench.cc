// Benchmarks of GatherTokens, ScatterTokens and GatherBertMask against the
// honest yardstick: one single-threaded std::memcpy of the same number of
// bytes the op moves, between two separate buffers.
//
// Cases "<op>.<dtype>.<layout>.t<threads>/op" and ".../baseline_memcpy":
//   gather/scatter: B=16, S=2048, C=1024, R=1536, random sorted unique int64
//   indices per row; bf16 and fp32; batch_first and seq_first; 1 and 2 threads.
//   The t2 cases also have ".../baseline_memcpy_t2": the same memcpy split
//   over the two threads of the op's pool, the bound a 2-thread op meets.
//   bert_mask.fp16: L=12, B=8, H=1, S=Sq=512, R=256.
//   merge/split: the gather/scatter shape; the baseline is a memcpy of the
//   B*S*C elements the op writes (merge: out; split: rest_grad, plus the
//   B*R*C of layer_grad), and merge also runs "clone_scatter", what DeepSpeed
//   does instead (a copy of x, then ScatterTokens into it).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "kernels/cpu/cpu_ops.h"

namespace tokensel::bench {
namespace {

using kernels::DType;
using kernels::TensorView;
using kernels::cpu::ThreadPool;

constexpr int64_t kB = 16, kS = 2048, kC = 1024, kR = 1536;

// Buffers shared by every case, sized for fp32 and touched once.
struct TokenBuffers {
  std::vector<char> tokens;      // [B,S,C] / [S,B,C]
  std::vector<char> retained;    // [B,R,C] / [R,B,C]
  std::vector<char> copy_dst;    // baseline destination
  std::vector<int64_t> indices;  // [B,R]

  static TokenBuffers& Get() {
    static TokenBuffers* buffers = new TokenBuffers();
    return *buffers;
  }

 private:
  TokenBuffers()
      : tokens(kB * kS * kC * 4, 1),
        retained(kB * kR * kC * 4, 2),
        copy_dst(kB * kR * kC * 4, 3),
        indices(kB * kR) {
    std::mt19937_64 rng(2024);
    std::vector<int64_t> perm(kS);
    for (int64_t b = 0; b < kB; ++b) {
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      std::sort(perm.begin(), perm.begin() + kR);
      std::copy(perm.begin(), perm.begin() + kR, indices.begin() + b * kR);
    }
  }
};

ThreadPool* PoolFor(int threads) {
  static ThreadPool* one = new ThreadPool(1);
  static ThreadPool* two = new ThreadPool(2);
  return threads == 1 ? one : two;
}

void SetMoved(benchmark::State& state, int64_t bytes, int64_t rows) {
  state.SetBytesProcessed(state.iterations() * bytes);
  state.SetItemsProcessed(state.iterations() * rows);
}

void BaselineMemcpy(benchmark::State& state, int64_t bytes) {
  TokenBuffers& buf = TokenBuffers::Get();
  for (auto _ : state) {
    std::memcpy(buf.copy_dst.data(), buf.tokens.data(), static_cast<size_t>(bytes));
    benchmark::ClobberMemory();
  }
  SetMoved(state, bytes, 0);
}

// The same copy split over `threads` threads of the ops' pool (chunks of
// whole 64-byte lines): the yardstick of the t2 cases, which run on as many
// threads.
void BaselineMemcpyThreads(benchmark::State& state, int64_t bytes, int threads) {
  TokenBuffers& buf = TokenBuffers::Get();
  ThreadPool* pool = PoolFor(threads);
  const int64_t lines = (bytes + 63) / 64;
  for (auto _ : state) {
    pool->ParallelFor(lines, 1024, [&](int64_t begin, int64_t end) {
      const int64_t lo = begin * 64;
      const int64_t hi = std::min(end * 64, bytes);
      std::memcpy(buf.copy_dst.data() + lo, buf.tokens.data() + lo, static_cast<size_t>(hi - lo));
    });
    benchmark::ClobberMemory();
  }
  SetMoved(state, bytes, 0);
}

void TokenOp(benchmark::State& state, bool gather, DType dtype, bool batch_first, int threads) {
  TokenBuffers& buf = TokenBuffers::Get();
  const TensorView tokens =
      TensorView::Contiguous(buf.tokens.data(), dtype,
                             batch_first ? std::initializer_list<int64_t>{kB, kS, kC}
                                         : std::initializer_list<int64_t>{kS, kB, kC});
  const TensorView retained =
      TensorView::Contiguous(buf.retained.data(), dtype,
                             batch_first ? std::initializer_list<int64_t>{kB, kR, kC}
                                         : std::initializer_list<int64_t>{kR, kB, kC});
  const TensorView indices = TensorView::Contiguous(buf.indices.data(), DType::kInt64, {kB, kR});
  ThreadPool* pool = PoolFor(threads);
  for (auto _ : state) {
    const absl::Status status =
        gather ? kernels::cpu::GatherTokens({tokens, indices, retained, batch_first}, pool)
               : kernels::cpu::ScatterTokens({tokens, retained, indices, batch_first}, pool);
    if (!status.ok()) {
      state.SkipWithError(std::string(status.message()).c_str());
      break;
    }
    benchmark::ClobberMemory();
  }
  SetMoved(state, kB * kR * kC * ElementSize(dtype), kB * kR);
}

// A second [B,S,C] buffer (merge's out, split's rest_grad), fp32-sized.
std::vector<char>& TokensOut() {
  static std::vector<char>* out = new std::vector<char>(kB * kS * kC * 4, 4);
  return *out;
}

// memcpy of `bytes` [B,S,C] bytes, plus `retained_bytes` into the [B,R,C] buffer.
void MemcpyTokens(benchmark::State& state, int64_t bytes, int64_t retained_bytes) {
  TokenBuffers& buf = TokenBuffers::Get();
  for (auto _ : state) {
    std::memcpy(TokensOut().data(), buf.tokens.data(), static_cast<size_t>(bytes));
    std::memcpy(buf.copy_dst.data(), buf.retained.data(), static_cast<size_t>(retained_bytes));
    benchmark::ClobberMemory();
  }
  SetMoved(state, bytes + retained_bytes, 0);
}

// kind 0: MergeTokens; 1: the clone + ScatterTokens it replaces; 2: SplitTokens.
void MergeSplitOp(benchmark::State& state, int kind, DType dtype, bool batch_first, int threads) {
  TokenBuffers& buf = TokenBuffers::Get();
  auto tokens_view = [&](void* data, int64_t n) {
    return TensorView::Contiguous(data, dtype,
                                  batch_first ? std::initializer_list<int64_t>{kB, n, kC}
                                              : std::initializer_list<int64_t>{n, kB, kC});
  };
  const TensorView x = tokens_view(buf.tokens.data(), kS);
  const TensorView out = tokens_view(TokensOut().data(), kS);
  const TensorView retained = tokens_view(buf.retained.data(), kR);
  const TensorView indices = TensorView::Contiguous(buf.indices.data(), DType::kInt64, {kB, kR});
  const int64_t elem = ElementSize(dtype);
  ThreadPool* pool = PoolFor(threads);
  for (auto _ : state) {
    absl::Status status;
    if (kind == 0) {
      status = kernels::cpu::MergeTokens({x, retained, indices, out, batch_first}, pool);
    } else if (kind == 1) {
      std::memcpy(out.data, x.data, static_cast<size_t>(kB * kS * kC * elem));
      status = kernels::cpu::ScatterTokens({out, retained, indices, batch_first}, pool);
    } else {
      status = kernels::cpu::SplitTokens({x, indices, retained, out, batch_first}, pool);
    }
    if (!status.ok()) {
      state.SkipWithError(std::string(status.message()).c_str());
      break;
    }
    benchmark::ClobberMemory();
  }
  SetMoved(state, (kind == 2 ? kB * (kS + kR) : kB * kS) * kC * elem, kB * kS);
}

constexpr int64_t kMaskL = 12, kMaskB = 8, kMaskH = 1, kMaskS = 512, kMaskR = 256;

void BertMaskOp(benchmark::State& state, int threads) {
  static std::vector<char>* mask = new std::vector<char>(kMaskB * kMaskH * kMaskS * kMaskS * 2, 1);
  static std::vector<char>* out =
      new std::vector<char>(kMaskL * kMaskB * kMaskH * kMaskR * kMaskR * 2, 0);
  static std::vector<int32_t>* ids = [] {
    auto* v = new std::vector<int32_t>(kMaskL * kMaskB * kMaskR);
    std::mt19937_64 rng(7);
    std::vector<int32_t> perm(kMaskS);
    for (int64_t row = 0; row < kMaskL * kMaskB; ++row) {
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      std::sort(perm.begin(), perm.begin() + kMaskR);
      std::copy(perm.begin(), perm.begin() + kMaskR, v->begin() + row * kMaskR);
    }
    return v;
  }();
  const kernels::GatherBertMaskArgs args{
      TensorView::Contiguous(mask->data(), DType::kFloat16, {kMaskB, kMaskH, kMaskS, kMaskS}),
      TensorView::Contiguous(ids->data(), DType::kInt32, {kMaskL, kMaskB, kMaskR}),
      TensorView::Contiguous(out->data(), DType::kFloat16,
                             {kMaskL, kMaskB, kMaskH, kMaskR, kMaskR})};
  ThreadPool* pool = PoolFor(threads);
  for (auto _ : state) {
    const absl::Status status = kernels::cpu::GatherBertMask(args, pool);
    if (!status.ok()) {
      state.SkipWithError(std::string(status.message()).c_str());
      break;
    }
    benchmark::ClobberMemory();
  }
  SetMoved(state, static_cast<int64_t>(out->size()), kMaskL * kMaskB * kMaskH * kMaskR);
}

int RegisterAll() {
  for (bool gather : {true, false}) {
    for (DType dtype : {DType::kBFloat16, DType::kFloat32}) {
      for (bool batch_first : {true, false}) {
        for (int threads : {1, 2}) {
          const std::string name = std::string(gather ? "gather." : "scatter.") +
                                   (dtype == DType::kBFloat16 ? "bf16." : "fp32.") +
                                   (batch_first ? "batch_first" : "seq_first") + ".t" +
                                   std::to_string(threads);
          const int64_t bytes = kB * kR * kC * ElementSize(dtype);
          benchmark::RegisterBenchmark((name + "/op").c_str(), TokenOp, gather, dtype, batch_first,
                                       threads)
              ->UseRealTime()
              ->Unit(benchmark::kMillisecond);
          benchmark::RegisterBenchmark((name + "/baseline_memcpy").c_str(), BaselineMemcpy, bytes)
              ->UseRealTime()
              ->Unit(benchmark::kMillisecond);
          if (threads > 1) {
            benchmark::RegisterBenchmark(
                (name + "/baseline_memcpy_t" + std::to_string(threads)).c_str(),
                BaselineMemcpyThreads, bytes, threads)
                ->UseRealTime()
                ->Unit(benchmark::kMillisecond);
          }
        }
      }
    }
  }
  for (DType dtype : {DType::kBFloat16, DType::kFloat32}) {
    for (bool batch_first : {true, false}) {
      for (int threads : {1, 2}) {
        const std::string suffix = std::string(dtype == DType::kBFloat16 ? "bf16." : "fp32.") +
                                   (batch_first ? "batch_first" : "seq_first") + ".t" +
                                   std::to_string(threads);
        const int64_t elem = ElementSize(dtype);
        for (int kind : {0, 1, 2}) {
          const std::string name = std::string(kind == 2 ? "split." : "merge.") + suffix +
                                   (kind == 1 ? "/clone_scatter" : "/op");
          benchmark::RegisterBenchmark(name.c_str(), MergeSplitOp, kind, dtype, batch_first,
                                       threads)
              ->UseRealTime()
              ->Unit(benchmark::kMillisecond);
        }
        // The bytes each op writes: merge B*S*C, split B*S*C + B*R*C.
        benchmark::RegisterBenchmark(("merge." + suffix + "/baseline_memcpy").c_str(), MemcpyTokens,
                                     kB * kS * kC * elem, int64_t{0})
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond);
        benchmark::RegisterBenchmark(("split." + suffix + "/baseline_memcpy").c_str(), MemcpyTokens,
                                     kB * kS * kC * elem, kB * kR * kC * elem)
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond);
      }
    }
  }
  for (int threads : {1, 2}) {
    const std::string name = "bert_mask.fp16.t" + std::to_string(threads);
    const int64_t bytes = kMaskL * kMaskB * kMaskH * kMaskR * kMaskR * 2;
    benchmark::RegisterBenchmark((name + "/op").c_str(), BertMaskOp, threads)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark((name + "/baseline_memcpy").c_str(), BaselineMemcpy, bytes)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  return 0;
}

const int kRegistered = RegisterAll();

}  // namespace
}  // namespace tokensel::bench
