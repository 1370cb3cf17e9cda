// TopKTokens: hand-made vectors (ties, NaN, +-inf, -0/+0, R = 0, R = S) for
// fp32/fp16/bf16, metadata errors, and randomized comparison with a naive
// stable-sort reference over dtypes, layouts, sizes and thread counts.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/kernels/sort_reference.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_tensor.h"

namespace tokensel::kernels::cpu::topk_test {
namespace {

namespace tt = ::tokensel::testing;
using ::testing::ElementsAreArray;
using tt::Layout;
using tt::StatusIs;
using tt::TestTensor;

constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;
constexpr float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::nanf("");

// Raw bits of well-known fp16 values.
constexpr uint16_t kH0 = 0x0000, kHNeg0 = 0x8000, kH1 = 0x3C00, kH2 = 0x4000, kHNeg1 = 0xBC00,
                   kHInf = 0x7C00, kHNegInf = 0xFC00, kHNaN = 0x7E00, kHNegNaN = 0xFE01,
                   kHTiny = 0x0001;

uint16_t BF16Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return static_cast<uint16_t>(u >> 16);
}

TestTensor Fp32Scores(std::vector<int64_t> shape, const std::vector<float>& v, Layout l = {}) {
  TestTensor t(DType::kFloat32, std::move(shape), l);
  for (size_t i = 0; i < v.size(); ++i) t.Set<float>(static_cast<int64_t>(i), v[i]);
  return t;
}

TestTensor Bits16Scores(DType dtype, std::vector<int64_t> shape, const std::vector<uint16_t>& v) {
  TestTensor t(dtype, std::move(shape));
  for (size_t i = 0; i < v.size(); ++i) t.Set<uint16_t>(static_cast<int64_t>(i), v[i]);
  return t;
}

std::vector<int64_t> RunTopK(TestTensor& scores, int64_t r, DType id_dtype = DType::kInt32) {
  std::vector<int64_t> shape = scores.shape();
  shape.back() = r;
  TestTensor ids(id_dtype, shape);
  ids.Fill(0x77);
  const absl::Status st = TopKTokens({scores.view(), ids.view()}, nullptr);
  EXPECT_OK(st);
  return tt::ReadIndices(ids);
}

TEST(TopKTokensTest, Fp32Vectors) {
  for (DType id : {DType::kInt32, DType::kInt64}) {
    auto s = Fp32Scores({5}, {1, 3, 2, 3, 0});
    EXPECT_THAT(RunTopK(s, 2, id), ElementsAreArray({1, 3}));
    EXPECT_THAT(RunTopK(s, 3, id), ElementsAreArray({1, 2, 3}));
    EXPECT_THAT(RunTopK(s, 1, id), ElementsAreArray({1}));  // tie -> lower position
    EXPECT_THAT(RunTopK(s, 5, id), ElementsAreArray({0, 1, 2, 3, 4}));
    EXPECT_THAT(RunTopK(s, 0, id), ElementsAreArray(std::vector<int64_t>{}));
    auto equal = Fp32Scores({6}, {5, 5, 5, 5, 5, 5});
    EXPECT_THAT(RunTopK(equal, 4, id), ElementsAreArray({0, 1, 2, 3}));
    auto nan = Fp32Scores({4}, {kNaN, 1, -kNaN, -kInf});
    EXPECT_THAT(RunTopK(nan, 2, id), ElementsAreArray({1, 3}));
    EXPECT_THAT(RunTopK(nan, 3, id), ElementsAreArray({0, 1, 3}));
    auto all_nan = Fp32Scores({4}, {kNaN, -kNaN, kNaN, kNaN});
    EXPECT_THAT(RunTopK(all_nan, 2, id), ElementsAreArray({0, 1}));
    auto zeros = Fp32Scores({4}, {-1.0f, -0.0f, 0.0f, -0.0f});
    EXPECT_THAT(RunTopK(zeros, 1, id), ElementsAreArray({1}));  // -0 == +0
    EXPECT_THAT(RunTopK(zeros, 2, id), ElementsAreArray({1, 2}));
    auto inf = Fp32Scores({5}, {kInf, -kInf, 3e38f, kNaN, -3e38f});
    EXPECT_THAT(RunTopK(inf, 2, id), ElementsAreArray({0, 2}));
    EXPECT_THAT(RunTopK(inf, 4, id), ElementsAreArray({0, 1, 2, 4}));
    auto tiny = Fp32Scores({4}, {1e-45f, 0.0f, -1e-45f, 1e-44f});  // subnormals
    EXPECT_THAT(RunTopK(tiny, 2, id), ElementsAreArray({0, 3}));
    // Rows are independent: [2,3].
    auto rows = Fp32Scores({2, 3}, {0, 2, 1, 9, -9, 9});
    EXPECT_THAT(RunTopK(rows, 2, id), ElementsAreArray({1, 2, 0, 2}));
  }
}

TEST(TopKTokensTest, Fp16Vectors) {
  auto s =
      Bits16Scores(DType::kFloat16, {8}, {kH1, kHNaN, kHNeg0, kHInf, kH2, kH0, kHNegInf, kHNegNaN});
  EXPECT_THAT(RunTopK(s, 2), ElementsAreArray({3, 4}));
  EXPECT_THAT(RunTopK(s, 4), ElementsAreArray({0, 2, 3, 4}));  // -0 ties +0, lower wins
  EXPECT_THAT(RunTopK(s, 6), ElementsAreArray({0, 2, 3, 4, 5, 6}));
  EXPECT_THAT(RunTopK(s, 7), ElementsAreArray({0, 1, 2, 3, 4, 5, 6}));
  auto t = Bits16Scores(DType::kFloat16, {4}, {kHNeg1, kHTiny, kH0, kHNeg0});
  EXPECT_THAT(RunTopK(t, 1), ElementsAreArray({1}));
  EXPECT_THAT(RunTopK(t, 3), ElementsAreArray({1, 2, 3}));
}

TEST(TopKTokensTest, BF16Vectors) {
  auto s = Bits16Scores(DType::kBFloat16, {7},
                        {BF16Bits(1.5f), BF16Bits(kNaN), BF16Bits(-0.0f), BF16Bits(kInf),
                         BF16Bits(-2.0f), BF16Bits(1.5f), BF16Bits(-kInf)});
  EXPECT_THAT(RunTopK(s, 1), ElementsAreArray({3}));
  EXPECT_THAT(RunTopK(s, 2), ElementsAreArray({0, 3}));
  EXPECT_THAT(RunTopK(s, 3), ElementsAreArray({0, 3, 5}));
  EXPECT_THAT(RunTopK(s, 6), ElementsAreArray({0, 2, 3, 4, 5, 6}));
}

TEST(TopKTokensTest, MetadataErrors) {
  TestTensor scores(DType::kFloat32, {2, 5});
  TestTensor i32scores(DType::kInt32, {2, 5});
  TestTensor ids(DType::kInt32, {2, 3});
  TestTensor ids_f(DType::kFloat32, {2, 3});
  TestTensor ids_rows(DType::kInt32, {3, 3});
  TestTensor ids_rank(DType::kInt32, {6});
  TestTensor ids_big(DType::kInt64, {2, 6});
  ids.Fill(0x11);
  ids_big.Fill(0x22);
  const auto ids_before = ids.Bytes();
  const auto big_before = ids_big.Bytes();
  EXPECT_THAT(TopKTokens({i32scores.view(), ids.view()}, nullptr),
              StatusIs(kInvalid, "scores: dtype int32 is not supported"));
  EXPECT_THAT(TopKTokens({scores.view(), ids_f.view()}, nullptr),
              StatusIs(kInvalid, "ids: dtype float32 is not supported"));
  EXPECT_THAT(TopKTokens({scores.view(), ids_rows.view()}, nullptr),
              StatusIs(kInvalid, "ids: dim 0 (row) is 3, expected 2"));
  EXPECT_THAT(TopKTokens({scores.view(), ids_rank.view()}, nullptr),
              StatusIs(kInvalid, "ids: rank is 1"));
  EXPECT_THAT(TopKTokens({scores.view(), ids_big.view()}, nullptr),
              StatusIs(kInvalid, "ids: R = 6 exceeds S = 5"));
  TensorView bcast = TensorView::Strided(ids.data(), DType::kInt32, {2, 3}, {0, 1});
  EXPECT_THAT(TopKTokens({scores.view(), bcast}, nullptr),
              StatusIs(kInvalid, "ids: output strides [0,1]"));
  TensorView on_scores = TensorView::Contiguous(scores.ElementPtr(2), DType::kInt32, {2, 3});
  EXPECT_THAT(TopKTokens({scores.view(), on_scores}, nullptr),
              StatusIs(kInvalid, "ids: overlaps scores"));
  TensorView huge =
      TensorView::Strided(scores.data(), DType::kFloat32, {1, int64_t{1} << 31}, {0, 0});
  EXPECT_THAT(TopKTokens({huge, ids.view()}, nullptr),
              StatusIs(kInvalid, "scores: S = 2147483648 exceeds 2147483647"));
  EXPECT_EQ(ids.Bytes(), ids_before);
  EXPECT_EQ(ids_big.Bytes(), big_before);
}

// Random scores of one dtype as raw bits plus their float values.
enum class Mode { kFloats, kFewValues, kRawBits };

struct Row {
  std::vector<uint32_t> bits;
  std::vector<float> values;
};

Row RandomScores(DType dtype, int64_t n, Mode mode, std::mt19937_64& rng) {
  Row row;
  const std::vector<float> few = {-kInf, -1.0f, -0.0f, 0.0f, 0.5f, 1.0f, kInf, kNaN, -kNaN};
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits = 0;
    if (mode == Mode::kRawBits) {
      bits = static_cast<uint32_t>(rng());
    } else {
      const float f = mode == Mode::kFewValues ? few[rng() % few.size()] : normal(rng);
      std::memcpy(&bits, &f, sizeof(bits));
      if (dtype != DType::kFloat32) bits >>= 16;  // as bf16 bits (fp16 below)
      if (dtype == DType::kFloat16) {
        const uint16_t half[] = {kHNegInf, kHNeg1, kHNeg0, kH0,     0x3800,
                                 kH1,      kHInf,  kHNaN,  kHNegNaN};
        bits = mode == Mode::kFewValues ? half[rng() % 9] : static_cast<uint32_t>(rng() & 0x7BFF);
      }
    }
    if (dtype != DType::kFloat32) bits &= 0xFFFF;
    row.bits.push_back(bits);
    row.values.push_back(dtype == DType::kFloat32 ? tt::RefF32FromBits(bits)
                         : dtype == DType::kBFloat16
                             ? tt::RefBF16ToFloat(static_cast<uint16_t>(bits))
                             : tt::RefF16ToFloat(static_cast<uint16_t>(bits)));
  }
  return row;
}

void RunRandom(DType dtype, DType id_dtype, std::vector<int64_t> shape, int64_t r, Mode mode,
               Layout score_layout, Layout id_layout, std::mt19937_64& rng) {
  const int64_t s = shape.back();
  int64_t rows = 1;
  for (size_t d = 0; d + 1 < shape.size(); ++d) rows *= shape[d];
  const Row all = RandomScores(dtype, rows * s, mode, rng);
  std::vector<int64_t> want;
  for (int64_t row = 0; row < rows; ++row) {
    const auto best = tt::RefTopKRow(
        std::vector<float>(all.values.begin() + row * s, all.values.begin() + (row + 1) * s), r);
    want.insert(want.end(), best.begin(), best.end());
  }
  TestTensor scores(dtype, shape, score_layout);
  scores.FillRandom(rng);
  for (size_t i = 0; i < all.bits.size(); ++i) {
    if (dtype == DType::kFloat32) {
      scores.Set<uint32_t>(static_cast<int64_t>(i), all.bits[i]);
    } else {
      scores.Set<uint16_t>(static_cast<int64_t>(i), static_cast<uint16_t>(all.bits[i]));
    }
  }
  const auto scores_before = scores.Bytes();
  std::vector<int64_t> id_shape = shape;
  id_shape.back() = r;
  ThreadPool pool1(1);
  ThreadPool pool3(3);
  for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool1, &pool3}) {
    SCOPED_TRACE(pool == nullptr ? 0 : pool->threads());
    TestTensor ids(id_dtype, id_shape, id_layout);
    ids.FillRandom(rng);
    const auto ids_bytes = ids.Bytes();
    const auto ids_elems = tt::SnapshotElements(ids);
    ASSERT_OK(TopKTokens({scores.view(), ids.view()}, pool));
    ASSERT_EQ(tt::ReadIndices(ids), want);
    tt::ExpectOnlyElementsWritten(ids, ids_bytes, ids_elems);
    EXPECT_EQ(scores.Bytes(), scores_before);
  }
}

TEST(TopKTokensTest, RandomAgainstReference) {
  std::mt19937_64 rng(4321);
  struct Size {
    std::vector<int64_t> shape;
    std::vector<int64_t> rs;
  };
  const std::vector<Size> sizes = {
      {{0, 4}, {0, 2}},          {{3, 0}, {0}},          {{1}, {0, 1}},
      {{2, 3, 7}, {0, 1, 3, 7}}, {{5, 64}, {1, 31, 63}}, {{3, 257}, {1, 128, 256, 257}},
      {{2, 2048}, {1536, 7}},    {{1, 4099}, {2000}},    {{1, 100000}, {1, 99999, 31337}},
  };
  const std::vector<Layout> layouts = {{}, {{1, 3}, 0}, {{}, 1}, {{2, 1, 5}, 3}};
  int iteration = 0;
  for (const Size& size : sizes) {
    for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      for (Mode mode : {Mode::kFloats, Mode::kFewValues, Mode::kRawBits}) {
        for (int64_t r : size.rs) {
          ++iteration;
          const DType id_dtype = iteration % 2 == 0 ? DType::kInt32 : DType::kInt64;
          auto fit = [&](Layout l) {
            if (l.pad.size() > size.shape.size()) {
              l.pad.erase(l.pad.begin(), l.pad.end() - size.shape.size());
            }
            return l;
          };
          SCOPED_TRACE(::testing::Message() << "shape " << ::testing::PrintToString(size.shape)
                                            << " R=" << r << " dtype=" << static_cast<int>(dtype)
                                            << " mode=" << static_cast<int>(mode));
          RunRandom(dtype, id_dtype, size.shape, r, mode, fit(layouts[iteration % 4]),
                    fit(layouts[(iteration + 1) % 4]), rng);
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
    }
  }
}

}  // namespace
}  // namespace tokensel::kernels::cpu::topk_test
