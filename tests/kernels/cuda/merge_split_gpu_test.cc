// GPU conformance of MergeTokens and SplitTokens against their CPU twins, on
// byte-identical twins (gpu_twins.h): every element size, both layouts and
// index dtypes, aligned / misaligned / channel-strided views, the in-place
// forms (out = x, rest_grad = grad), empty sizes, large S, and every data
// error (the same message, nothing written: whole backing stores compared).
// Skips with "no CUDA device: ..." when there is no device.
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_ops.h"
#include "tests/kernels/cuda/gpu_test_util.h"
#include "tests/kernels/cuda/gpu_twins.h"

namespace tokensel::kernels::cuda::merge_split_test {
namespace {

using gputest::IndexError;
using gputest::MakeIndices;
using gputest::MakeTwin;
using gputest::RandomIndices;
using testing::Layout;

struct PairCase {
  DType dtype;
  DType index_dtype;
  bool batch_first;
  int64_t b, s, r, c;
  Layout tokens_layout;    // x / grad
  Layout retained_layout;  // layer / layer_grad
  Layout out_layout;       // out / rest_grad
  int64_t step = 1;        // channel step of x / grad (> 1: the strided kernel)
  IndexError error = IndexError::kNone;
  bool in_place = false;  // out = x / rest_grad = grad
};

std::vector<int64_t> TokenShape(bool bf, int64_t b, int64_t s, int64_t c) {
  return bf ? std::vector<int64_t>{b, s, c} : std::vector<int64_t>{s, b, c};
}

void RunMerge(const PairCase& k, std::mt19937_64& rng) {
  const bool bf = k.batch_first;
  auto x = MakeTwin(k.dtype, TokenShape(bf, k.b, k.s, k.c), k.tokens_layout, k.step, rng);
  auto layer = MakeTwin(k.dtype, TokenShape(bf, k.b, k.r, k.c), k.retained_layout, 1, rng);
  auto out = MakeTwin(k.dtype, TokenShape(bf, k.b, k.s, k.c), k.out_layout, 1, rng);
  auto idx = MakeIndices(k.index_dtype, {k.b, k.r},
                         RandomIndices(k.b, k.r, k.s, true, k.error, rng), {}, rng);
  const bool in_place = k.in_place;
  gputest::Compare<MergeTokensArgs>(
      [&](const std::vector<TensorView>& v) {
        return MergeTokensArgs{v[0], v[1], v[2], in_place ? v[0] : v[3], bf};
      },
      {x.get(), layer.get(), idx.get(), out.get()},
      [](const MergeTokensArgs& a) { return cpu::MergeTokens(a, nullptr); },
      MergeTokensWorkspaceBytes, MergeTokensAsync, MergeTokensFinish);
}

void RunSplit(const PairCase& k, std::mt19937_64& rng) {
  const bool bf = k.batch_first;
  auto grad = MakeTwin(k.dtype, TokenShape(bf, k.b, k.s, k.c), k.tokens_layout, k.step, rng);
  auto layer_grad = MakeTwin(k.dtype, TokenShape(bf, k.b, k.r, k.c), k.retained_layout, 1, rng);
  auto rest = MakeTwin(k.dtype, TokenShape(bf, k.b, k.s, k.c), k.out_layout, 1, rng);
  auto idx = MakeIndices(k.index_dtype, {k.b, k.r},
                         RandomIndices(k.b, k.r, k.s, true, k.error, rng), {}, rng);
  const bool in_place = k.in_place;
  gputest::Compare<SplitTokensArgs>(
      [&](const std::vector<TensorView>& v) {
        return SplitTokensArgs{v[0], v[1], v[2], in_place ? v[0] : v[3], bf};
      },
      {grad.get(), idx.get(), layer_grad.get(), rest.get()},
      [](const SplitTokensArgs& a) { return cpu::SplitTokens(a, nullptr); },
      SplitTokensWorkspaceBytes, SplitTokensAsync, SplitTokensFinish);
}

class MergeSplitGpuTest : public ::testing::Test {
 protected:
  void SetUp() override { TOKENSEL_REQUIRE_GPU(); }
  std::mt19937_64 rng_{20261126};
};

TEST_F(MergeSplitGpuTest, Random) {
  for (DType dtype : {DType::kUInt8, DType::kBFloat16, DType::kFloat32, DType::kFloat64}) {
    for (bool bf : {true, false}) {
      for (DType index_dtype : {DType::kInt32, DType::kInt64}) {
        for (int64_t c : {1, 3, 8, 4100}) {
          for (bool in_place : {false, true}) {
            const int64_t mis = 1 + static_cast<int64_t>(rng_() % 15);
            SCOPED_TRACE(::testing::Message()
                         << "dtype " << static_cast<int>(dtype) << " bf " << bf << " idx "
                         << static_cast<int>(index_dtype) << " C " << c << " in place " << in_place
                         << " misalign " << mis);
            PairCase aligned{dtype, index_dtype, bf, 3, 37, 11, c, {}, {}, {}};
            PairCase mixed{dtype,
                           index_dtype,
                           bf,
                           2,
                           19,
                           7,
                           c,
                           {{0, 1, 0}, mis},
                           {{}, (mis * 7) % 16},
                           {{1, 3, 0}, (mis * 3) % 16}};
            PairCase strided{dtype, index_dtype, bf, 2, 9, 4, c, {{}, mis}, {}, {}, 2};
            for (PairCase* k : {&aligned, &mixed, &strided}) {
              k->in_place = in_place;
              RunMerge(*k, rng_);
              RunSplit(*k, rng_);
            }
          }
        }
      }
    }
  }
}

TEST_F(MergeSplitGpuTest, LargeSAndEmpty) {
  // S = 70000 (bitmap words across many blocks), and the benchmark shape.
  RunMerge({DType::kBFloat16, DType::kInt32, true, 2, 70000, 1500, 8, {}, {}, {}}, rng_);
  RunSplit({DType::kBFloat16, DType::kInt64, false, 2, 70000, 1500, 8, {}, {}, {}}, rng_);
  RunMerge({DType::kBFloat16, DType::kInt32, true, 16, 2048, 1536, 1024, {}, {}, {}}, rng_);
  RunSplit({DType::kBFloat16, DType::kInt32, true, 16, 2048, 1536, 1024, {}, {}, {}}, rng_);
  // B = 0, R = 0, R = S (every row retained: the other-rows copy skips them
  // all), C = 0, each out of place and in place.
  for (int64_t b : {0, 2}) {
    for (int64_t r : {0, 3, 5}) {
      for (int64_t c : {0, 4}) {
        for (bool in_place : {false, true}) {
          PairCase merge{DType::kFloat32, DType::kInt64, false, b, 5, r, c, {}, {}, {}};
          PairCase split{DType::kFloat32, DType::kInt32, true, b, 5, r, c, {}, {}, {}};
          merge.in_place = split.in_place = in_place;
          RunMerge(merge, rng_);
          RunSplit(split, rng_);
        }
      }
    }
  }
}

TEST_F(MergeSplitGpuTest, Errors) {
  for (IndexError e : {IndexError::kOutOfRange, IndexError::kNegative, IndexError::kDuplicate}) {
    for (int i = 0; i < 4; ++i) {
      PairCase k{
          DType::kFloat16, i % 2 ? DType::kInt64 : DType::kInt32, i < 2, 4, 64, 30, 5, {}, {}, {}};
      k.error = e;
      k.in_place = i % 3 == 0;
      RunMerge(k, rng_);
      RunSplit(k, rng_);
    }
  }
}

}  // namespace
}  // namespace tokensel::kernels::cuda::merge_split_test
