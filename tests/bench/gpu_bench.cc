// tokensel_gpu_bench: the foundation issue's benchmark shapes on the GPU.
// Each case is timed with cudaEvents over back-to-back <Op>Async calls on one
// stream (one <Op>Finish at the end checks the status word), and compared
// with a cudaMemcpyAsync device-to-device copy of the same number of bytes
// (bytes moved = bytes read + bytes written, docs/gpu.md). Prints
// "no CUDA device: <reason>" and exits 0 when there is no device.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_ops.h"

namespace tokensel {
namespace {

namespace kc = kernels::cuda;
using kernels::DType;
using kernels::TensorView;

#define BENCH_CHECK(expr)                                                     \
  do {                                                                        \
    const cudaError_t e_ = (expr);                                            \
    if (e_ != cudaSuccess) {                                                  \
      std::fprintf(stderr, "%s failed: %s\n", #expr, cudaGetErrorString(e_)); \
      std::exit(1);                                                           \
    }                                                                         \
  } while (false)

void CheckOk(const absl::Status& st, const std::string& what) {
  if (!st.ok()) {
    std::fprintf(stderr, "%s: %s\n", what.c_str(), st.ToString().c_str());
    std::exit(1);
  }
}

// Device allocations live until exit (the bench is one process).
void* Alloc(size_t bytes) {
  void* p = nullptr;
  BENCH_CHECK(cudaMalloc(&p, bytes == 0 ? 1 : bytes));
  BENCH_CHECK(cudaMemset(p, 0, bytes == 0 ? 1 : bytes));
  return p;
}
template <typename T>
void* Upload(const std::vector<T>& v) {
  void* p = Alloc(v.size() * sizeof(T));
  BENCH_CHECK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}

// Per row: R distinct ids in [0, S), shuffled (sorted when `sorted`).
std::vector<int32_t> RandomRows(int64_t rows, int64_t s, int64_t r, bool sorted) {
  std::mt19937_64 rng(42);
  std::vector<int32_t> perm(s), out;
  for (int64_t i = 0; i < rows; ++i) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    if (sorted) std::sort(perm.begin(), perm.begin() + r);
    out.insert(out.end(), perm.begin(), perm.begin() + r);
  }
  return out;
}

struct Case {
  std::string name;
  double bytes;  // read + written
  std::function<absl::Status(kc::Workspace, kc::Stream)> async;
  std::function<absl::Status(kc::Workspace, kc::Stream)> finish;
  size_t workspace;
};

float TimeMs(cudaStream_t stream, int iters, const std::function<void()>& body) {
  cudaEvent_t start, stop;
  BENCH_CHECK(cudaEventCreate(&start));
  BENCH_CHECK(cudaEventCreate(&stop));
  body();  // warm-up
  BENCH_CHECK(cudaEventRecord(start, stream));
  for (int i = 0; i < iters; ++i) body();
  BENCH_CHECK(cudaEventRecord(stop, stream));
  BENCH_CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  BENCH_CHECK(cudaEventElapsedTime(&ms, start, stop));
  BENCH_CHECK(cudaEventDestroy(start));
  BENCH_CHECK(cudaEventDestroy(stop));
  return ms / iters;
}

void Run(const Case& c, cudaStream_t stream) {
  const kc::Workspace ws{Alloc(c.workspace), c.workspace};
  const int iters = 20;
  const float op_ms = TimeMs(stream, iters, [&] { CheckOk(c.async(ws, stream), c.name); });
  CheckOk(c.finish(ws, stream), c.name);
  const size_t half = static_cast<size_t>(c.bytes / 2);  // memcpy reads + writes `half`
  void* src = Alloc(half);
  void* dst = Alloc(half);
  const float cp_ms = TimeMs(stream, iters, [&] {
    BENCH_CHECK(cudaMemcpyAsync(dst, src, half, cudaMemcpyDeviceToDevice, stream));
  });
  const double op_gbs = c.bytes / (op_ms * 1e6);
  const double cp_gbs = 2.0 * half / (cp_ms * 1e6);
  std::printf("%-44s %10.1f us %9.1f GB/s   memcpy %9.1f GB/s   ratio %.2f\n", c.name.c_str(),
              op_ms * 1e3, op_gbs, cp_gbs, op_gbs / cp_gbs);
}

void GatherScatterCases(std::vector<Case>* cases) {
  constexpr int64_t kB = 16, kS = 2048, kC = 1024, kR = 1536;
  for (DType dt : {DType::kBFloat16, DType::kFloat32}) {
    for (bool bf : {true, false}) {
      const int64_t es = kernels::ElementSize(dt);
      void* act = Alloc(kB * kS * kC * es);
      void* out = Alloc(kB * kR * kC * es);
      void* idx = Upload(RandomRows(kB, kS, kR, false));
      TensorView a = bf ? TensorView::Contiguous(act, dt, {kB, kS, kC})
                        : TensorView::Contiguous(act, dt, {kS, kB, kC});
      TensorView o = bf ? TensorView::Contiguous(out, dt, {kB, kR, kC})
                        : TensorView::Contiguous(out, dt, {kR, kB, kC});
      TensorView i = TensorView::Contiguous(idx, DType::kInt32, {kB, kR});
      const std::string tag = std::string(dt == DType::kFloat32 ? "fp32" : "bf16") +
                              (bf ? " batch_first" : " seq_first");
      const double moved = 2.0 * kB * kR * kC * es + kB * kR * 4.0;
      kernels::GatherTokensArgs g{a, i, o, bf};
      cases->push_back(
          {"GatherTokens " + tag, moved,
           [g](kc::Workspace w, kc::Stream s) { return kc::GatherTokensAsync(g, w, s); },
           [g](kc::Workspace w, kc::Stream s) { return kc::GatherTokensFinish(g, w, s); },
           kc::GatherTokensWorkspaceBytes(g)});
      kernels::ScatterTokensArgs sc{a, o, i, bf};
      cases->push_back(
          {"ScatterTokens " + tag, moved,
           [sc](kc::Workspace w, kc::Stream s) { return kc::ScatterTokensAsync(sc, w, s); },
           [sc](kc::Workspace w, kc::Stream s) { return kc::ScatterTokensFinish(sc, w, s); },
           kc::ScatterTokensWorkspaceBytes(sc)});
    }
  }
}

void OtherCases(std::vector<Case>* cases) {
  {  // SortTokens [12,16,1536], S = 2048, out + inverse
    constexpr int64_t kRows = 12 * 16, kS = 2048, kR = 1536;
    void* ids = Upload(RandomRows(kRows, kS, kR, false));
    void* out = Alloc(kRows * kR * 4);
    void* inv = Alloc(kRows * kS * 4);
    kernels::SortTokensArgs a;
    a.ids = TensorView::Contiguous(ids, DType::kInt32, {12, 16, kR});
    a.original_tokens = kS;
    a.out = TensorView::Contiguous(out, DType::kInt32, {12, 16, kR});
    a.inverse = TensorView::Contiguous(inv, DType::kInt32, {12, 16, kS});
    cases->push_back({"SortTokens [12,16,1536] S=2048 +inverse", kRows * (2.0 * kR + kS) * 4,
                      [a](kc::Workspace w, kc::Stream s) { return kc::SortTokensAsync(a, w, s); },
                      [a](kc::Workspace w, kc::Stream s) { return kc::SortTokensFinish(a, w, s); },
                      kc::SortTokensWorkspaceBytes(a)});
  }
  {  // TopKTokens fp32 [12,16,2048], R = 1536
    constexpr int64_t kRows = 12 * 16, kS = 2048, kR = 1536;
    std::vector<float> scores(kRows * kS);
    std::mt19937 rng(7);
    for (float& x : scores) x = std::uniform_real_distribution<float>(-1, 1)(rng);
    kernels::TopKTokensArgs a{
        TensorView::Contiguous(Upload(scores), DType::kFloat32, {12, 16, kS}),
        TensorView::Contiguous(Alloc(kRows * kR * 4), DType::kInt32, {12, 16, kR})};
    cases->push_back({"TopKTokens fp32 [12,16,2048] R=1536", kRows * (kS + kR) * 4.0,
                      [a](kc::Workspace w, kc::Stream s) { return kc::TopKTokensAsync(a, w, s); },
                      [a](kc::Workspace w, kc::Stream s) { return kc::TopKTokensFinish(a, w, s); },
                      kc::TopKTokensWorkspaceBytes(a)});
  }
  for (int64_t t : {int64_t{8192}, int64_t{131072}}) {  // SegmentSeqlens B=4, NS=64, self
    constexpr int64_t kB = 4, kNs = 64;
    std::vector<int32_t> ids(kB * t);
    for (int64_t b = 0; b < kB; ++b) {
      for (int64_t i = 0; i < t; ++i) ids[b * t + i] = static_cast<int32_t>(1 + i * kNs / t);
    }
    kernels::SegmentSeqlensArgs a;
    a.segment_ids_q = TensorView::Contiguous(Upload(ids), DType::kInt32, {kB, t});
    a.max_segments = kNs;
    a.q.seqlen = TensorView::Contiguous(Alloc(kB * kNs * 4), DType::kInt32, {kB, kNs});
    a.q.offset = TensorView::Contiguous(Alloc(kB * (kNs + 1) * 4), DType::kInt32, {kB, kNs + 1});
    const double moved = kB * t * 4.0 + kB * (2 * kNs + 1) * 4.0;
    cases->push_back(
        {"SegmentSeqlens self B=4 NS=64 T=" + std::to_string(t), moved,
         [a](kc::Workspace w, kc::Stream s) { return kc::SegmentSeqlensAsync(a, w, s); },
         [a](kc::Workspace w, kc::Stream s) { return kc::SegmentSeqlensFinish(a, w, s); },
         kc::SegmentSeqlensWorkspaceBytes(a)});
  }
}

}  // namespace
}  // namespace tokensel

int main() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    std::printf("no CUDA device: %s\n",
                err != cudaSuccess ? cudaGetErrorString(err) : "cudaGetDeviceCount found 0");
    return 0;
  }
  cudaDeviceProp prop{};
  BENCH_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device 0: %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
  cudaStream_t stream;
  BENCH_CHECK(cudaStreamCreate(&stream));
  std::vector<tokensel::Case> cases;
  tokensel::GatherScatterCases(&cases);
  tokensel::OtherCases(&cases);
  for (const auto& c : cases) tokensel::Run(c, stream);
  BENCH_CHECK(cudaStreamDestroy(stream));
  return 0;
}
