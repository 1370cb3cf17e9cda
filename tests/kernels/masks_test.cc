// GatherBertMask / SliceGptMask: spec vectors (docs/ops.md sections 4-5),
// randomized comparison with the naive references in gather_reference.h over
// element sizes, index dtypes, Sq in {1, S}, layouts and thread counts, and
// every error (with the output byte-identical afterwards).
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "tests/kernels/gather_reference.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_tensor.h"

namespace tokensel::testing::masks_test {
namespace {

using kernels::DType;
using kernels::GatherBertMaskArgs;
using kernels::SliceGptMaskArgs;
using kernels::cpu::ThreadPool;

constexpr DType kMaskDTypes[] = {DType::kBool,     DType::kUInt8,   DType::kFloat16,
                                 DType::kBFloat16, DType::kFloat32, DType::kFloat64,
                                 DType::kInt64};
constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;

ThreadPool* Pool3() {
  static ThreadPool* pool = new ThreadPool(3);
  return pool;
}

TEST(GatherBertMaskSpec, Vector) {
  for (DType dtype : {DType::kFloat32, DType::kUInt8}) {
    TestTensor mask(dtype, {1, 1, 4, 4});
    for (int i = 0; i < 4; ++i) {
      for (int j = 0; j < 4; ++j) {
        if (dtype == DType::kFloat32) {
          mask.Set<float>(i * 4 + j, 4 * i + j);
        } else {
          mask.Set<uint8_t>(i * 4 + j, static_cast<uint8_t>(4 * i + j));
        }
      }
    }
    TestTensor idx(DType::kInt32, {2, 1, 2});
    const int ids[] = {0, 2, 1, 3};
    for (int i = 0; i < 4; ++i) idx.SetIndex(i, ids[i]);
    TestTensor out(dtype, {2, 1, 1, 2, 2});
    ASSERT_OK(kernels::cpu::GatherBertMask({mask.view(), idx.view(), out.view()}, nullptr));
    const int expected[] = {0, 2, 8, 10, 5, 7, 13, 15};
    for (int i = 0; i < 8; ++i) {
      const double got = dtype == DType::kFloat32 ? out.Get<float>(i) : out.Get<uint8_t>(i);
      EXPECT_EQ(got, expected[i]) << i;
    }
  }
}

TEST(SliceGptMaskSpec, Vector) {
  TestTensor mask(DType::kFloat32, {1, 1, 4, 4});
  for (int i = 0; i < 16; ++i) mask.Set<float>(i, i);  // 4i + j
  TestTensor out(DType::kFloat32, {1, 1, 2, 2});
  ASSERT_OK(kernels::cpu::SliceGptMask({mask.view(), out.view()}, Pool3()));
  const float expected[] = {0, 1, 4, 5};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(out.Get<float>(i), expected[i]) << i;
}

ViewKind PickOutKind(std::mt19937_64& rng) {
  const ViewKind kinds[] = {ViewKind::kContiguous, ViewKind::kPadded, ViewKind::kMisaligned,
                            ViewKind::kChannelStride2, ViewKind::kChannelOffset};
  return kinds[rng() % 5];
}

TEST(GatherBertMaskRandom, MatchesReference) {
  std::mt19937_64 rng(11);
  for (DType dtype : kMaskDTypes) {
    for (DType idx_dtype : {DType::kInt32, DType::kInt64}) {
      for (bool broadcast_rows : {true, false}) {
        for (ViewKind mask_kind : kAllViewKinds) {
          const int64_t layers = rng() % 4, batch = rng() % 4, heads = 1 + rng() % 3;
          const int64_t seq = 1 + rng() % 9, retained = rng() % (seq + 3);
          const int64_t sq = broadcast_rows ? 1 : seq;
          const ViewKind out_kind = PickOutKind(rng);
          SCOPED_TRACE(::testing::PrintToString(std::vector<int64_t>{
              static_cast<int>(dtype), static_cast<int>(idx_dtype), layers, batch, heads, sq, seq,
              retained, static_cast<int>(mask_kind), static_cast<int>(out_kind)}));
          HeldView mask = MakeHeld(dtype, {batch, heads, sq, seq}, mask_kind, rng);
          HeldView idx = MakeHeld(idx_dtype, {layers, batch, retained},
                                  rng() % 2 ? ViewKind::kMisaligned : ViewKind::kPadded, rng);
          for (int64_t i = 0; i < layers * batch * retained; ++i) {
            idx.tensor.SetIndex(i, static_cast<int64_t>(rng() % seq));
          }
          HeldView out = MakeHeld(dtype, {layers, batch, heads, retained, retained}, out_kind, rng);
          HeldView expected = out.Clone();
          RefGatherBertMask(mask.view, idx.view, expected.view);
          for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), Pool3()}) {
            HeldView got = out.Clone();
            ASSERT_OK(kernels::cpu::GatherBertMask({mask.view, idx.view, got.view}, pool));
            ASSERT_EQ(got.tensor.Bytes(), expected.tensor.Bytes());
          }
        }
      }
    }
  }
}

TEST(GatherBertMaskRandom, LargeRowsAcrossThreads) {
  std::mt19937_64 rng(12);
  for (DType dtype : {DType::kFloat16, DType::kFloat32}) {
    HeldView mask = MakeHeld(dtype, {2, 2, 300, 300}, ViewKind::kPadded, rng);
    HeldView idx = MakeHeld(DType::kInt64, {3, 2, 150}, ViewKind::kContiguous, rng);
    for (int64_t i = 0; i < 3 * 2 * 150; ++i) idx.tensor.SetIndex(i, rng() % 300);
    HeldView out = MakeHeld(dtype, {3, 2, 2, 150, 150}, ViewKind::kContiguous, rng);
    HeldView expected = out.Clone();
    RefGatherBertMask(mask.view, idx.view, expected.view);
    ASSERT_OK(kernels::cpu::GatherBertMask({mask.view, idx.view, out.view}, Pool3()));
    ASSERT_EQ(out.tensor.Bytes(), expected.tensor.Bytes());
  }
}

TEST(SliceGptMaskRandom, MatchesReference) {
  std::mt19937_64 rng(13);
  for (DType dtype : kMaskDTypes) {
    for (ViewKind mask_kind : kAllViewKinds) {
      for (int rep = 0; rep < 2; ++rep) {
        const int64_t batch = rng() % 4, heads = 1 + rng() % 3, seq = rng() % 9;
        const int64_t retained = rep == 0 ? seq : rng() % (seq + 1);
        const ViewKind out_kind = PickOutKind(rng);
        SCOPED_TRACE(::testing::PrintToString(
            std::vector<int64_t>{static_cast<int>(dtype), batch, heads, seq, retained,
                                 static_cast<int>(mask_kind), static_cast<int>(out_kind)}));
        HeldView mask = MakeHeld(dtype, {batch, heads, seq, seq}, mask_kind, rng);
        HeldView out = MakeHeld(dtype, {batch, heads, retained, retained}, out_kind, rng);
        HeldView expected = out.Clone();
        RefSliceGptMask(mask.view, expected.view);
        for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), Pool3()}) {
          HeldView got = out.Clone();
          ASSERT_OK(kernels::cpu::SliceGptMask({mask.view, got.view}, pool));
          ASSERT_EQ(got.tensor.Bytes(), expected.tensor.Bytes());
        }
      }
    }
  }
}

// Runs the op with null, 1- and 3-thread pools; each must fail with the same
// message containing `substr` and leave `written` byte-identical.
template <typename ArgsT, typename Op>
void ExpectError(Op op, const ArgsT& args, TestTensor& written, const std::string& substr) {
  const std::vector<uint8_t> before = written.Bytes();
  ThreadPool pool1(1);
  std::string first_message;
  for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool1, Pool3()}) {
    const absl::Status status = op(args, pool);
    EXPECT_THAT(status, StatusIs(kInvalid, substr));
    if (first_message.empty()) first_message = std::string(status.message());
    EXPECT_EQ(status.message(), first_message);
    EXPECT_EQ(written.Bytes(), before);
  }
}

struct BertSetup {
  TestTensor mask{DType::kBFloat16, {2, 1, 4, 4}};
  TestTensor idx{DType::kInt32, {200, 2, 3}};
  TestTensor out{DType::kBFloat16, {200, 2, 1, 3, 3}};
  BertSetup() {
    std::mt19937_64 rng(3);
    mask.FillRandom(rng);
    out.FillRandom(rng);
    for (int64_t i = 0; i < 200 * 2 * 3; ++i) idx.SetIndex(i, i % 4);
  }
  GatherBertMaskArgs Args() { return {mask.view(), idx.view(), out.view()}; }
};

TEST(GatherBertMaskErrors, Indices) {
  BertSetup s;
  s.idx.SetIndex((150 * 2 + 0) * 3 + 0, 4);
  s.idx.SetIndex((90 * 2 + 1) * 3 + 2, 4);
  s.idx.SetIndex((90 * 2 + 1) * 3 + 1, 17);
  ExpectError(kernels::cpu::GatherBertMask, s.Args(), s.out,
              "indices[90,1,1] = 17 is out of range [0, 4)");
  s.idx.SetIndex(1, -3);
  ExpectError(kernels::cpu::GatherBertMask, s.Args(), s.out,
              "indices[0,0,1] = -3 is out of range [0, 4)");
}

TEST(GatherBertMaskErrors, Metadata) {
  BertSetup s;
  GatherBertMaskArgs a = s.Args();
  a.mask.shape[2] = 2;
  ExpectError(kernels::cpu::GatherBertMask, a, s.out, "mask: dim 2 (Sq) is 2, expected 1 or 4");
  a = s.Args();
  a.mask.shape[1] = 0;
  ExpectError(kernels::cpu::GatherBertMask, a, s.out, "mask: dim 1 (H) is 0, expected >= 1");
  a = s.Args();
  a.out.dtype = DType::kFloat16;
  ExpectError(kernels::cpu::GatherBertMask, a, s.out, "out: dtype float16 differs from mask");
  a = s.Args();
  a.indices.dtype = DType::kInt16;
  ExpectError(kernels::cpu::GatherBertMask, a, s.out, "indices: dtype int16 is not supported");
  a = s.Args();
  a.indices.shape[1] = 1;
  ExpectError(kernels::cpu::GatherBertMask, a, s.out, "indices: dim 1 (B) is 1, expected 2");
  a = s.Args();
  a.out.shape[4] = 2;
  ExpectError(kernels::cpu::GatherBertMask, a, s.out, "out: dim 4 (R) is 2, expected 3");
  a = s.Args();
  a.out.shape[0] = 7;
  ExpectError(kernels::cpu::GatherBertMask, a, s.out, "out: dim 0 (L) is 7, expected 200");
  a = s.Args();
  a.out.rank = 4;
  ExpectError(kernels::cpu::GatherBertMask, a, s.out, "out: rank is 4");
  a = s.Args();
  a.out.strides[3] = 1;
  ExpectError(kernels::cpu::GatherBertMask, a, s.out, "out: output strides");
  a = s.Args();
  a.mask.data = s.out.data();
  ExpectError(kernels::cpu::GatherBertMask, a, s.out, "out: overlaps mask");
}

TEST(SliceGptMaskErrors, Metadata) {
  TestTensor mask(DType::kFloat16, {2, 3, 4, 4});
  TestTensor out(DType::kFloat16, {2, 3, 2, 2});
  std::mt19937_64 rng(4);
  mask.FillRandom(rng);
  out.FillRandom(rng);
  const SliceGptMaskArgs good{mask.view(), out.view()};
  SliceGptMaskArgs a = good;
  a.out.shape[2] = a.out.shape[3] = 5;
  ExpectError(kernels::cpu::SliceGptMask, a, out, "out: R = 5 exceeds mask S = 4");
  a = good;
  a.mask.shape[2] = 3;
  ExpectError(kernels::cpu::SliceGptMask, a, out, "mask: dim 2 (S) is 3, expected 4");
  a = good;
  a.out.shape[2] = 1;
  ExpectError(kernels::cpu::SliceGptMask, a, out, "out: dim 2 (R) is 1, expected 2");
  a = good;
  a.out.shape[1] = 1;
  ExpectError(kernels::cpu::SliceGptMask, a, out, "out: dim 1 (H) is 1, expected 3");
  a = good;
  a.out.dtype = DType::kBFloat16;
  ExpectError(kernels::cpu::SliceGptMask, a, out, "out: dtype bfloat16 differs from mask");
  a = good;
  a.out = a.mask;
  a.out.shape[2] = a.out.shape[3] = 2;
  ExpectError(kernels::cpu::SliceGptMask, a, mask, "out: overlaps mask");
}

}  // namespace
}  // namespace tokensel::testing::masks_test
