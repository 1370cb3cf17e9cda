// Twin tensors for the GPU conformance suites: one logical tensor held twice
// with equal bytes (the CPU oracle's copy and the one mirrored to the
// device), the comparison of a CUDA op with its CPU twin on them, and random
// index rows with an injected error.
#ifndef TOKENSEL_TESTS_KERNELS_CUDA_GPU_TWINS_H_
#define TOKENSEL_TESTS_KERNELS_CUDA_GPU_TWINS_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_ops.h"
#include "tests/kernels/cuda/gpu_test_util.h"
#include "tests/testing/test_tensor.h"

namespace tokensel::gputest {

using kernels::DType;
using kernels::TensorView;
using kernels::cuda::Stream;
using kernels::cuda::Workspace;
using testing::Layout;
using testing::TestTensor;

// One logical tensor twice (cpu oracle / gpu mirror), equal bytes. `step` > 1
// makes the last dim strided (every step-th element of a wider buffer).
struct Twin {
  TestTensor cpu;
  TestTensor gpu;
  int64_t step = 1;

  TensorView View(TestTensor& t) const {
    TensorView v = t.view();
    v.shape[v.rank - 1] /= step;
    v.strides[v.rank - 1] *= step;
    return v;
  }
};

inline std::unique_ptr<Twin> MakeTwin(DType dtype, std::vector<int64_t> shape, Layout layout,
                                      int64_t step, std::mt19937_64& rng) {
  auto twin = std::make_unique<Twin>();
  shape.back() *= step;
  twin->cpu = TestTensor(dtype, shape, layout);
  twin->gpu = TestTensor(dtype, shape, layout);
  twin->step = step;
  const uint64_t seed = rng();
  std::mt19937_64 a(seed), b(seed);
  twin->cpu.FillRandom(a);
  twin->gpu.FillRandom(b);
  return twin;
}

// An index twin [rows..., n] holding `values` (row-major).
inline std::unique_ptr<Twin> MakeIndices(DType dtype, std::vector<int64_t> shape,
                                         const std::vector<int64_t>& values, Layout layout,
                                         std::mt19937_64& rng) {
  auto twin = MakeTwin(dtype, std::move(shape), layout, 1, rng);
  for (TestTensor* t : {&twin->cpu, &twin->gpu}) {
    for (size_t i = 0; i < values.size(); ++i) t->SetIndex(static_cast<int64_t>(i), values[i]);
  }
  return twin;
}

// Runs the CPU op on the cpu views and the CUDA op on device mirrors of the
// gpu views, then compares statuses and every twin's bytes.
template <typename Args>
void Compare(const std::function<Args(const std::vector<TensorView>&)>& make_args,
             const std::vector<Twin*>& twins,
             const std::function<absl::Status(const Args&)>& run_cpu,
             size_t (*ws_bytes)(const Args&), absl::Status (*async)(const Args&, Workspace, Stream),
             absl::Status (*finish)(const Args&, Workspace, Stream)) {
  std::vector<TensorView> cpu_views, dev_views;
  std::vector<std::unique_ptr<DeviceMirror>> mirrors;
  for (Twin* t : twins) {
    cpu_views.push_back(t->View(t->cpu));
    mirrors.push_back(std::make_unique<DeviceMirror>(t->View(t->gpu)));
    dev_views.push_back(mirrors.back()->view());
  }
  const absl::Status cpu_status = run_cpu(make_args(cpu_views));
  const Args dev_args = make_args(dev_views);
  TestStream stream;
  DeviceBuffer ws(std::max<size_t>(ws_bytes(dev_args), 256));
  // The server's pool hands out used workspaces: a section the op forgets to
  // initialize must not read as zeros here either.
  TOKENSEL_EXPECT_CUDA(cudaMemset(ws.data(), 0xA5, ws.bytes()));
  absl::Status gpu_status = async(dev_args, ws.workspace(), stream.get());
  if (gpu_status.ok()) gpu_status = finish(dev_args, ws.workspace(), stream.get());
  for (auto& m : mirrors) m->CopyBack();
  EXPECT_EQ(gpu_status, cpu_status);
  for (size_t i = 0; i < twins.size(); ++i) {
    EXPECT_TRUE(twins[i]->cpu.Bytes() == twins[i]->gpu.Bytes()) << "tensor " << i << " differs";
  }
}

enum class IndexError { kNone, kOutOfRange, kNegative, kDuplicate };

// One `error` at a random position of `values` (rows of n ids in [0, s)):
// a duplicate of an earlier id of its row, a negative id, or one >= s.
inline void InjectIndexError(std::vector<int64_t>* values, int64_t n, int64_t s, IndexError error,
                             std::mt19937_64& rng) {
  std::vector<int64_t>& v = *values;
  if (error == IndexError::kNone || v.empty()) return;
  const size_t at = rng() % v.size();
  const int64_t pos = static_cast<int64_t>(at) % n;
  if (error == IndexError::kDuplicate && pos > 0) {
    v[at] = v[at - 1 - rng() % pos];
  } else if (error == IndexError::kNegative) {
    v[at] = -1 - static_cast<int64_t>(rng() % 7);
  } else {
    v[at] = s + static_cast<int64_t>(rng() % 3);
  }
}

// `rows` rows of `n` indices in [0, s): unique per row when `unique` (n <= s),
// then one error injected at a random position.
inline std::vector<int64_t> RandomIndices(int64_t rows, int64_t n, int64_t s, bool unique,
                                          IndexError error, std::mt19937_64& rng) {
  std::vector<int64_t> values;
  std::vector<int64_t> perm;
  if (unique) perm.resize(static_cast<size_t>(s));
  for (int64_t row = 0; row < rows; ++row) {
    if (unique) std::iota(perm.begin(), perm.end(), 0);
    for (int64_t i = 0; i < n; ++i) {
      if (unique) {
        std::swap(perm[i], perm[i + static_cast<int64_t>(rng() % (s - i))]);
        values.push_back(perm[i]);
      } else {
        values.push_back(static_cast<int64_t>(rng() % s));
      }
    }
  }
  InjectIndexError(&values, n, s, error, rng);
  return values;
}

}  // namespace tokensel::gputest

#endif  // TOKENSEL_TESTS_KERNELS_CUDA_GPU_TWINS_H_
