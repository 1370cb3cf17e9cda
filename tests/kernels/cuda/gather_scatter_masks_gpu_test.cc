// GPU conformance of GatherTokens, ScatterTokens, GatherBertMask and
// SliceGptMask: the CUDA op and the CPU op (the oracle) run on byte-identical
// host tensors (random bytes, every element size, both layouts, both index
// dtypes, padded / channel-strided / misaligned views with base pointers
// offset by 1..15 bytes, large S, C in {1, 3, 8, 4100}); the whole backing
// stores must end up byte-identical, gaps included, and the statuses equal
// (code and message). Error cases therefore also prove the CUDA path wrote
// nothing. Skips with "no CUDA device: ..." when there is no device.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_ops.h"
#include "tests/kernels/cuda/gpu_test_util.h"
#include "tests/kernels/cuda/gpu_twins.h"
#include "tests/testing/test_tensor.h"

namespace tokensel::kernels::cuda {
namespace {

using gputest::IndexError;
using gputest::MakeIndices;
using gputest::MakeTwin;
using gputest::RandomIndices;
using testing::Layout;

constexpr DType kElemDTypes[] = {DType::kUInt8, DType::kBFloat16, DType::kFloat32, DType::kFloat64};

struct TokenCase {
  DType dtype;
  DType index_dtype;
  bool batch_first;
  int64_t b, s, r, c;
  Layout tokens_layout;    // act (gather) / all (scatter)
  Layout retained_layout;  // out (gather) / layer (scatter)
  int64_t step = 1;        // channel step of the tokens side (step > 1: strided path)
  IndexError error = IndexError::kNone;
};

std::vector<int64_t> TokenShape(bool bf, int64_t b, int64_t s, int64_t c) {
  return bf ? std::vector<int64_t>{b, s, c} : std::vector<int64_t>{s, b, c};
}

void RunGather(const TokenCase& k, std::mt19937_64& rng) {
  auto act =
      MakeTwin(k.dtype, TokenShape(k.batch_first, k.b, k.s, k.c), k.tokens_layout, k.step, rng);
  auto out = MakeTwin(k.dtype, TokenShape(k.batch_first, k.b, k.r, k.c), k.retained_layout, 1, rng);
  auto idx = MakeIndices(k.index_dtype, {k.b, k.r},
                         RandomIndices(k.b, k.r, k.s, false, k.error, rng), {}, rng);
  const bool bf = k.batch_first;
  gputest::Compare<GatherTokensArgs>(
      [&](const std::vector<TensorView>& v) {
        return GatherTokensArgs{v[0], v[1], v[2], bf};
      },
      {act.get(), idx.get(), out.get()},
      [](const GatherTokensArgs& a) { return cpu::GatherTokens(a, nullptr); },
      GatherTokensWorkspaceBytes, GatherTokensAsync, GatherTokensFinish);
}

void RunScatter(const TokenCase& k, std::mt19937_64& rng) {
  auto all =
      MakeTwin(k.dtype, TokenShape(k.batch_first, k.b, k.s, k.c), k.tokens_layout, k.step, rng);
  auto layer =
      MakeTwin(k.dtype, TokenShape(k.batch_first, k.b, k.r, k.c), k.retained_layout, 1, rng);
  auto idx = MakeIndices(k.index_dtype, {k.b, k.r},
                         RandomIndices(k.b, k.r, k.s, true, k.error, rng), {}, rng);
  const bool bf = k.batch_first;
  gputest::Compare<ScatterTokensArgs>(
      [&](const std::vector<TensorView>& v) {
        return ScatterTokensArgs{v[0], v[1], v[2], bf};
      },
      {all.get(), layer.get(), idx.get()},
      [](const ScatterTokensArgs& a) { return cpu::ScatterTokens(a, nullptr); },
      ScatterTokensWorkspaceBytes, ScatterTokensAsync, ScatterTokensFinish);
}

class GatherScatterMasksGpuTest : public ::testing::Test {
 protected:
  void SetUp() override { TOKENSEL_REQUIRE_GPU(); }
  std::mt19937_64 rng_{20240612};
};

// Every element size x layout x index dtype x C, aligned and misaligned.
TEST_F(GatherScatterMasksGpuTest, TokensRandom) {
  for (DType dtype : kElemDTypes) {
    for (bool bf : {true, false}) {
      for (DType index_dtype : {DType::kInt32, DType::kInt64}) {
        for (int64_t c : {1, 3, 8, 4100}) {
          const int64_t mis = 1 + static_cast<int64_t>(rng_() % 15);
          SCOPED_TRACE(::testing::Message()
                       << "dtype " << static_cast<int>(dtype) << " bf " << bf << " idx "
                       << static_cast<int>(index_dtype) << " C " << c << " misalign " << mis);
          const TokenCase aligned{dtype, index_dtype, bf, 3, 37, 11, c, {}, {}};
          // Both sides misaligned by the same amount: still 16-byte vectors.
          const TokenCase same{dtype, index_dtype, bf, 2, 20, 7, c, {{0, 1, 0}, mis}, {{}, mis}};
          // Different misalignment and padded rows: narrower vectors / bytes.
          const TokenCase mixed{
              dtype, index_dtype, bf, 2, 19, 19, c, {{1, 3, 0}, mis}, {{0, 1, 0}, (mis * 7) % 16}};
          const TokenCase strided{dtype, index_dtype, bf, 2, 9, 4, c, {{}, mis}, {}, 2};
          for (const TokenCase& k : {aligned, same, mixed, strided}) {
            RunGather(k, rng_);
            RunScatter(k, rng_);
          }
        }
      }
    }
  }
}

TEST_F(GatherScatterMasksGpuTest, TokensLargeS) {
  // S = 70000: indices far beyond the original's 2048/65535 limits.
  RunGather({DType::kBFloat16, DType::kInt32, true, 2, 70000, 1500, 8, {}, {}}, rng_);
  RunScatter({DType::kBFloat16, DType::kInt64, false, 2, 70000, 1500, 8, {}, {}}, rng_);
  // The foundation benchmark shape (B=16, S=2048, R=1536, C=1024), bf16.
  RunGather({DType::kBFloat16, DType::kInt32, true, 16, 2048, 1536, 1024, {}, {}}, rng_);
  RunScatter({DType::kBFloat16, DType::kInt32, true, 16, 2048, 1536, 1024, {}, {}}, rng_);
}

TEST_F(GatherScatterMasksGpuTest, TokensEmpty) {
  RunGather({DType::kFloat32, DType::kInt32, true, 2, 5, 0, 4, {}, {}}, rng_);
  RunGather({DType::kFloat32, DType::kInt32, true, 2, 5, 3, 0, {}, {}}, rng_);
  RunScatter({DType::kFloat32, DType::kInt64, false, 0, 5, 3, 4, {}, {}}, rng_);
  RunScatter({DType::kFloat32, DType::kInt64, false, 2, 5, 3, 0, {}, {}}, rng_);
}

// Every data error: same message as the CPU, and nothing written.
TEST_F(GatherScatterMasksGpuTest, TokensErrors) {
  for (IndexError e : {IndexError::kOutOfRange, IndexError::kNegative}) {
    for (DType index_dtype : {DType::kInt32, DType::kInt64}) {
      RunGather({DType::kFloat16, index_dtype, true, 3, 50, 20, 16, {}, {}, 1, e}, rng_);
      RunScatter({DType::kFloat16, index_dtype, false, 3, 50, 20, 16, {}, {}, 1, e}, rng_);
    }
  }
  for (int i = 0; i < 8; ++i) {
    RunScatter({DType::kFloat32,
                DType::kInt32,
                i % 2 == 0,
                4,
                64,
                30,
                5,
                {},
                {},
                1,
                IndexError::kDuplicate},
               rng_);
  }
}

// ---------------------------------------------------------------- masks

struct BertCase {
  DType dtype;
  DType index_dtype;
  int64_t l, b, h, sq, s, r;
  Layout mask_layout;
  Layout out_layout;
  IndexError error = IndexError::kNone;
};

void RunBert(const BertCase& k, std::mt19937_64& rng) {
  auto mask = MakeTwin(k.dtype, {k.b, k.h, k.sq, k.s}, k.mask_layout, 1, rng);
  auto out = MakeTwin(k.dtype, {k.l, k.b, k.h, k.r, k.r}, k.out_layout, 1, rng);
  auto idx = MakeIndices(k.index_dtype, {k.l, k.b, k.r},
                         RandomIndices(k.l * k.b, k.r, k.s, false, k.error, rng), {}, rng);
  gputest::Compare<GatherBertMaskArgs>(
      [&](const std::vector<TensorView>& v) {
        return GatherBertMaskArgs{v[0], v[1], v[2]};
      },
      {mask.get(), idx.get(), out.get()},
      [](const GatherBertMaskArgs& a) { return cpu::GatherBertMask(a, nullptr); },
      GatherBertMaskWorkspaceBytes, GatherBertMaskAsync, GatherBertMaskFinish);
}

void RunGpt(DType dtype, int64_t b, int64_t h, int64_t s, int64_t r, Layout mask_layout,
            Layout out_layout, std::mt19937_64& rng) {
  auto mask = MakeTwin(dtype, {b, h, s, s}, mask_layout, 1, rng);
  auto out = MakeTwin(dtype, {b, h, r, r}, out_layout, 1, rng);
  gputest::Compare<SliceGptMaskArgs>(
      [&](const std::vector<TensorView>& v) {
        return SliceGptMaskArgs{v[0], v[1]};
      },
      {mask.get(), out.get()},
      [](const SliceGptMaskArgs& a) { return cpu::SliceGptMask(a, nullptr); },
      SliceGptMaskWorkspaceBytes, SliceGptMaskAsync, SliceGptMaskFinish);
}

TEST_F(GatherScatterMasksGpuTest, BertMaskRandom) {
  for (DType dtype : {DType::kBool, DType::kFloat16, DType::kFloat32, DType::kFloat64}) {
    for (DType index_dtype : {DType::kInt32, DType::kInt64}) {
      const int64_t mis = 1 + static_cast<int64_t>(rng_() % 15);
      SCOPED_TRACE(::testing::Message()
                   << "dtype " << static_cast<int>(dtype) << " misalign " << mis);
      RunBert({dtype, index_dtype, 3, 2, 1, 1, 40, 13, {}, {}}, rng_);   // [B,1,1,S]
      RunBert({dtype, index_dtype, 2, 2, 3, 40, 40, 17, {}, {}}, rng_);  // [B,H,S,S]
      RunBert({dtype, index_dtype, 2, 1, 2, 33, 33, 33, {{0, 1, 2, 3}, mis}, {{}, (mis * 3) % 16}},
              rng_);
      // R > the 2048-column shared-memory tile: several tiles per row.
      RunBert({dtype, index_dtype, 1, 1, 1, 1, 5000, 2100, {}, {}}, rng_);
    }
  }
  // Foundation shape: [16,1,1,2048] bf16 padding mask, R = 1536.
  RunBert({DType::kBFloat16, DType::kInt32, 1, 16, 1, 1, 2048, 1536, {}, {}}, rng_);
}

TEST_F(GatherScatterMasksGpuTest, BertMaskErrors) {
  for (IndexError e : {IndexError::kOutOfRange, IndexError::kNegative}) {
    RunBert({DType::kBool, DType::kInt32, 2, 3, 1, 1, 30, 10, {}, {}, e}, rng_);
    RunBert({DType::kFloat32, DType::kInt64, 2, 3, 2, 30, 30, 10, {}, {}, e}, rng_);
  }
}

TEST_F(GatherScatterMasksGpuTest, GptMaskRandom) {
  for (DType dtype : kElemDTypes) {
    const int64_t mis = 1 + static_cast<int64_t>(rng_() % 15);
    RunGpt(dtype, 2, 3, 40, 17, {}, {}, rng_);
    RunGpt(dtype, 1, 2, 64, 64, {{0, 0, 1, 0}, mis}, {{}, mis}, rng_);
    RunGpt(dtype, 2, 1, 50, 1, {{}, mis}, {}, rng_);
    RunGpt(dtype, 1, 1, 5000, 4100, {}, {{}, (mis * 5) % 16}, rng_);
  }
  RunGpt(DType::kBFloat16, 16, 1, 2048, 1536, {}, {}, rng_);
}

}  // namespace
}  // namespace tokensel::kernels::cuda
