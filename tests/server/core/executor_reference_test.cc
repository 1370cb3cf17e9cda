// The Executor against the naive references of tests/kernels (written
// independently of kernels/), not against kernels::cpu: executor_ops_test.cc
// uses the CPU kernels as its oracle, which proves the plumbing but lets a
// kernel bug make both sides agree. These cases would catch it.
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "tests/kernels/gather_reference.h"
#include "tests/kernels/segment_reference.h"
#include "tests/kernels/sort_reference.h"
#include "tests/server/core/executor_test_util.h"

namespace tokensel::testing {
namespace {

using kernels::DType;

// Element values of a contiguous int32|int64 host tensor.
std::vector<int64_t> IndexValues(const HostTensor& t) {
  std::vector<int64_t> v;
  const int64_t size = kernels::ElementSize(t.dtype);
  for (size_t i = 0; i < t.bytes.size(); i += static_cast<size_t>(size)) {
    if (t.dtype == DType::kInt64) {
      int64_t x;
      std::memcpy(&x, t.bytes.data() + i, 8);
      v.push_back(x);
    } else {
      int32_t x;
      std::memcpy(&x, t.bytes.data() + i, 4);
      v.push_back(x);
    }
  }
  return v;
}

TEST_F(ExecutorTest, GatherTokensByBufferMatchesNaiveReference) {
  for (bool batch_first : {true, false}) {
    SCOPED_TRACE(batch_first ? "batch_first" : "seq_first");
    registry_.UnregisterAll(session_);
    buffers_.clear();
    AddBuffer("acts", 4096);
    AddBuffer("idx", 256);
    AddBuffer("out", 2048);
    core::GatherTokensRequest req;
    req.batch_first = batch_first;
    // fp32 [3,9,5] / [9,3,5] with padded channels, misaligned by 2 bytes.
    req.activations = batch_first ? Buf("acts", 2, DType::kFloat32, {3, 9, 5}, {63, 7, 1})
                                  : Buf("acts", 2, DType::kFloat32, {9, 3, 5}, {21, 7, 1});
    req.indices = Buf("idx", 0, DType::kInt32, {3, 6});
    req.out = batch_first ? Buf("out", 4, DType::kFloat32, {3, 6, 5})
                          : Buf("out", 4, DType::kFloat32, {6, 3, 5});
    FillIds(View(req.indices), 9, /*unique_rows=*/false, rng_);
    Memory expected = Snapshot();
    RefGather(View(req.activations, &expected), View(req.indices, &expected),
              View(*req.out, &expected), batch_first);
    ASSERT_OK(Run(req));
    EXPECT_EQ(Snapshot(), expected);
  }
}

TEST_F(ExecutorTest, ScatterTokensByBufferMatchesNaiveReference) {
  AddBuffer("all", 4 * 2 * 8 * 3);
  AddBuffer("layer", 4 * 2 * 4 * 3);
  AddBuffer("idx", 8 * 2 * 4);
  core::ScatterTokensRequest req;
  req.all = Buf("all", 0, DType::kFloat32, {2, 8, 3});
  req.layer = Buf("layer", 0, DType::kFloat32, {2, 4, 3});
  req.indices = Buf("idx", 0, DType::kInt64, {2, 4});
  FillIds(View(req.indices), 8, /*unique_rows=*/true, rng_);
  Memory expected = Snapshot();
  RefScatter(View(req.all, &expected), View(req.layer, &expected), View(req.indices, &expected),
             true);
  ASSERT_OK(Run(req));
  EXPECT_EQ(Snapshot(), expected);
}

TEST_F(ExecutorTest, SortTokensInlineMatchesNaiveReference) {
  constexpr int64_t kRows = 5, kR = 7, kS = 20;
  HostTensor ids = RandomHost(DType::kInt64, {kRows, kR}, rng_);
  FillIds(ids.view(), kS, /*unique_rows=*/true, rng_);
  core::SortTokensRequest req;
  req.ids = Inline(ids);
  req.original_tokens = kS;
  core::TensorSpec inverse;  // inline output
  req.inverse = inverse;
  const std::vector<int64_t> in = IndexValues(ids);
  std::vector<int64_t> want_sorted, want_inverse;
  for (int64_t row = 0; row < kRows; ++row) {
    const std::vector<int64_t> sorted =
        RefSortRow(std::vector<int64_t>(in.begin() + row * kR, in.begin() + (row + 1) * kR));
    const std::vector<int64_t> inv = RefInverseRow(sorted, kS);
    want_sorted.insert(want_sorted.end(), sorted.begin(), sorted.end());
    want_inverse.insert(want_inverse.end(), inv.begin(), inv.end());
  }
  absl::StatusOr<core::OpResult> result = Run(req);
  ASSERT_OK(result);
  const core::InlineOutput* out = FindOutput(*result, "out");
  ASSERT_NE(out, nullptr);
  EXPECT_EQ(IndexValues({out->dtype, out->shape, out->data}), want_sorted);
  const core::InlineOutput* inv = FindOutput(*result, "inverse");
  ASSERT_NE(inv, nullptr);
  const std::vector<int32_t> got_inverse = AsInt32(inv->data);
  EXPECT_EQ(std::vector<int64_t>(got_inverse.begin(), got_inverse.end()), want_inverse);
}

TEST_F(ExecutorTest, SegmentSeqlensInlineMatchesNaiveReference) {
  const std::vector<segref::Row> rows = {{1, 1, 0, 2, 2, 2, 3, 0}, {0, 1, 2, 2, 2, 2, 0, 0}};
  constexpr int64_t kNs = 3;
  HostTensor ids = RandomHost(DType::kInt32, {2, 8}, rng_);
  for (size_t b = 0; b < rows.size(); ++b) {
    for (size_t t = 0; t < rows[b].size(); ++t) {
      const int32_t v = static_cast<int32_t>(rows[b][t]);
      std::memcpy(ids.bytes.data() + (b * 8 + t) * 4, &v, 4);
    }
  }
  core::SegmentSeqlensRequest req;
  req.segment_ids_q = Inline(ids);
  req.max_segments = kNs;
  req.q_seqlen = core::TensorSpec{};
  req.q_offset = core::TensorSpec{};
  const segref::SideResult want = segref::NaiveSide(rows, kNs);
  absl::StatusOr<core::OpResult> result = Run(req);
  ASSERT_OK(result);
  const core::InlineOutput* seqlen = FindOutput(*result, "q_seqlen");
  const core::InlineOutput* offset = FindOutput(*result, "q_offset");
  ASSERT_NE(seqlen, nullptr);
  ASSERT_NE(offset, nullptr);
  std::vector<int32_t> want_seqlen, want_offset;
  for (size_t b = 0; b < rows.size(); ++b) {
    want_seqlen.insert(want_seqlen.end(), want.seqlen[b].begin(), want.seqlen[b].end());
    want_offset.insert(want_offset.end(), want.offset[b].begin(), want.offset[b].end());
  }
  EXPECT_EQ(AsInt32(seqlen->data), want_seqlen);
  EXPECT_EQ(AsInt32(offset->data), want_offset);
}

}  // namespace
}  // namespace tokensel::testing
