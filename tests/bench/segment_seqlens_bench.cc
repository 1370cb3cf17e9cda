// SegmentSeqlens (op 6) benchmarks: self-attention B=4, NS=64 at T = 8k..128k
// (time per token should stay flat: O(T)), and cross-attention
// CAUSAL_BOTTOM_RIGHT at T=128k. Baseline "baseline_read": one pass that reads
// every id (and, for cross, every position) and sums them: the memory-read
// floor of any implementation.
//   tokensel_kernels_bench --benchmark_filter='seqlens\.' --benchmark_repetitions=3
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/segment_math.h"

namespace tokensel::bench {
namespace {

using kernels::AttnMaskType;
using kernels::DType;
using kernels::TensorView;

constexpr int64_t kBatch = 4;
constexpr int64_t kSegments = 64;

// A random valid row of length t: ~kSegments segments of random length with
// some padding between them, ids increasing; standard positions.
void FillRow(std::mt19937_64& rng, int64_t t, int32_t* ids, int32_t* pos) {
  const int64_t mean = t / kSegments;
  int64_t i = 0;
  for (int32_t id = 1; id <= kSegments && i < t; ++id) {
    const int64_t pad = static_cast<int64_t>(rng() % 8);
    for (int64_t k = 0; k < pad && i < t; ++k, ++i) ids[i] = 0, pos[i] = 0;
    const int64_t len = mean / 2 + static_cast<int64_t>(rng() % static_cast<uint64_t>(mean));
    for (int64_t k = 0; k < len && i < t; ++k, ++i) ids[i] = id, pos[i] = static_cast<int32_t>(k);
  }
  for (; i < t; ++i) ids[i] = 0, pos[i] = 0;
}

struct Inputs {
  std::vector<int32_t> ids, pos;
};

Inputs MakeInputs(int64_t t, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Inputs in;
  in.ids.resize(kBatch * t);
  in.pos.resize(kBatch * t);
  for (int64_t b = 0; b < kBatch; ++b) FillRow(rng, t, &in.ids[b * t], &in.pos[b * t]);
  return in;
}

struct Outputs {
  std::vector<int32_t> seqlen, offset, pseq, poff, cu;
  Outputs()
      : seqlen(kBatch * kSegments),
        offset(kBatch * (kSegments + 1)),
        pseq(kBatch * kSegments),
        poff(kBatch * (kSegments + 1)),
        cu(kBatch * kSegments + 1) {}
  kernels::SegmentSeqlensSide Side() {
    kernels::SegmentSeqlensSide s{
        TensorView::Contiguous(seqlen.data(), DType::kInt32, {kBatch, kSegments}),
        TensorView::Contiguous(offset.data(), DType::kInt32, {kBatch, kSegments + 1}),
        std::nullopt};
    s.packed = kernels::PackedSeqlens{
        TensorView::Contiguous(pseq.data(), DType::kInt32, {kBatch * kSegments}),
        TensorView::Contiguous(poff.data(), DType::kInt32, {kBatch * (kSegments + 1)}),
        TensorView::Contiguous(cu.data(), DType::kInt32, {kBatch * kSegments + 1})};
    return s;
  }
};

void SetCounters(benchmark::State& state, int64_t tokens, int64_t bytes, bool cross) {
  state.SetItemsProcessed(state.iterations() * tokens);
  state.SetBytesProcessed(state.iterations() * bytes);
  state.counters["ns_per_token"] =
      benchmark::Counter(static_cast<double>(state.iterations() * tokens) * 1e-9,
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["scratch_bytes_per_row"] =
      static_cast<double>(kernels::SegmentSeqlensScratchBytesPerRow(kSegments, cross));
}

void BM_Self(benchmark::State& state, int64_t t) {
  Inputs in = MakeInputs(t, 1);
  Outputs q;
  kernels::SegmentSeqlensArgs args;
  args.segment_ids_q = TensorView::Contiguous(in.ids.data(), DType::kInt32, {kBatch, t});
  args.max_segments = kSegments;
  args.mask = AttnMaskType::kCausal;
  args.q = q.Side();
  for (auto _ : state) {
    absl::Status s = kernels::cpu::SegmentSeqlens(args, nullptr);
    if (!s.ok()) state.SkipWithError(std::string(s.message()).c_str());
    benchmark::DoNotOptimize(q.cu.data());
    benchmark::ClobberMemory();
  }
  SetCounters(state, kBatch * t, kBatch * t * 4, false);
}

// Reads every byte of `v` once, 32 bytes per step in 4 independent chains.
uint64_t SumWords(const std::vector<int32_t>& v) {
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  const size_t words = v.size() * sizeof(int32_t) / 8;
  uint64_t s[4] = {0, 0, 0, 0};
  size_t i = 0;
  for (; i + 4 <= words; i += 4) {
    for (int k = 0; k < 4; ++k) {
      uint64_t w;
      std::memcpy(&w, p + (i + k) * 8, 8);
      s[k] += w;
    }
  }
  for (; i < words; ++i) {
    uint64_t w;
    std::memcpy(&w, p + i * 8, 8);
    s[0] += w;
  }
  return s[0] + s[1] + s[2] + s[3];
}

// Memory-read floor: sum every id (and position when `with_pos`).
void BM_ReadFloor(benchmark::State& state, int64_t t, bool cross) {
  const Inputs q = MakeInputs(t, 1);
  const Inputs kv = MakeInputs(t, 2);
  for (auto _ : state) {
    uint64_t sum = SumWords(q.ids);
    if (cross) sum += SumWords(q.pos) + SumWords(kv.ids) + SumWords(kv.pos);
    benchmark::DoNotOptimize(sum);
  }
  const int64_t tokens = (cross ? 2 : 1) * kBatch * t;
  SetCounters(state, tokens, tokens * (cross ? 8 : 4), cross);
}

// Cross-attention, CAUSAL_BOTTOM_RIGHT, Tq = Tkv = t, different segmentations.
void BM_CrossBrcm(benchmark::State& state, int64_t t) {
  Inputs qi = MakeInputs(t, 1);
  Inputs kvi = MakeInputs(t, 2);
  Outputs q, kv;
  kernels::SegmentSeqlensArgs args;
  args.segment_ids_q = TensorView::Contiguous(qi.ids.data(), DType::kInt32, {kBatch, t});
  args.segment_pos_q = TensorView::Contiguous(qi.pos.data(), DType::kInt32, {kBatch, t});
  args.segment_ids_kv = TensorView::Contiguous(kvi.ids.data(), DType::kInt32, {kBatch, t});
  args.segment_pos_kv = TensorView::Contiguous(kvi.pos.data(), DType::kInt32, {kBatch, t});
  args.max_segments = kSegments;
  args.mask = AttnMaskType::kCausalBottomRight;
  args.q = q.Side();
  args.kv = kv.Side();
  for (auto _ : state) {
    absl::Status s = kernels::cpu::SegmentSeqlens(args, nullptr);
    if (!s.ok()) state.SkipWithError(std::string(s.message()).c_str());
    benchmark::DoNotOptimize(kv.cu.data());
    benchmark::ClobberMemory();
  }
  SetCounters(state, 2 * kBatch * t, 2 * kBatch * t * 8, true);
}

const bool kRegistered = [] {
  for (int64_t t : {8192, 16384, 32768, 65536, 131072}) {
    const std::string name = "seqlens.self.T" + std::to_string(t);
    benchmark::RegisterBenchmark((name + "/op").c_str(), BM_Self, t)->UseRealTime();
    benchmark::RegisterBenchmark((name + "/baseline_read").c_str(), BM_ReadFloor, t, false)
        ->UseRealTime();
  }
  const int64_t t = 131072;
  const std::string name = "seqlens.cross_brcm.T" + std::to_string(t);
  benchmark::RegisterBenchmark((name + "/op").c_str(), BM_CrossBrcm, t)->UseRealTime();
  benchmark::RegisterBenchmark((name + "/baseline_read").c_str(), BM_ReadFloor, t, true)
      ->UseRealTime();
  return true;
}();

}  // namespace
}  // namespace tokensel::bench
