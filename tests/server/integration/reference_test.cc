// A real tokensel-server against the naive references of tests/kernels
// (written independently of kernels/), not against kernels::cpu: ops_test.cc
// runs the CPU kernels in this process as its oracle, which proves the
// transport and the plumbing but lets a kernel bug make both sides agree.
// By-reference cases compare the whole shm region byte for byte.
#include <cstdint>
#include <string>
#include <vector>

#include "tests/kernels/gather_reference.h"
#include "tests/kernels/sort_reference.h"
#include "tests/server/integration/fixture.h"

namespace tokensel::itest {
namespace {

using Stub = v1::TokenSelect::Stub;

class ReferenceTest : public ServerFixture {
 protected:
  void SetUp() override { StartServer({}, Transport::kUnix); }

  std::vector<uint8_t> Snapshot() const {
    return std::vector<uint8_t>(shm_.data(), shm_.data() + shm_.size());
  }
  void ExpectShmEquals(const std::vector<uint8_t>& want) const {
    const auto [a, b] = std::mismatch(want.begin(), want.end(), shm_.data());
    EXPECT_EQ(a, want.end()) << "first difference at byte " << (a - want.begin()) << ": reference "
                             << int{*a} << ", server wrote " << int{*b};
  }
};

TEST_F(ReferenceTest, GatherTokensByReference) {
  for (const bool batch_first : {true, false}) {
    SCOPED_TRACE(batch_first ? "batch_first" : "seq_first");
    Arena a(kArenaBytes);
    const int64_t kB = 3, kS = 17, kC = 6, kR = 9;
    const std::vector<int64_t> act_shape =
        batch_first ? std::vector<int64_t>{kB, kS, kC} : std::vector<int64_t>{kS, kB, kC};
    const std::vector<int64_t> out_shape =
        batch_first ? std::vector<int64_t>{kB, kR, kC} : std::vector<int64_t>{kR, kB, kC};
    const Placed act = a.Place(DType::kFloat16, act_shape, {.pad = {0, 1, 2}, .misalign = 2});
    const Placed idx = a.Place(DType::kInt32, {kB, kR});
    const Placed out = a.Place(DType::kFloat16, out_shape, {.pad = {0, 0, 1}, .misalign = 6});
    FillIndices(idx.View(shm_.data()), kS, /*unique=*/false, rng_);
    auto want = Snapshot();
    testing::RefGather(act.View(want.data()), idx.View(want.data()), out.View(want.data()),
                       batch_first);
    v1::GatherTokensRequest req;
    *req.mutable_activations() = act.Ref("arena");
    *req.mutable_indices() = idx.Ref("arena");
    *req.mutable_out() = out.Ref("arena");
    req.set_batch_first(batch_first);
    v1::OpResponse resp;
    ASSERT_OK(client_->Call(&Stub::GatherTokens, req, &resp));
    ExpectShmEquals(want);
  }
}

TEST_F(ReferenceTest, ScatterTokensByReference) {
  Arena a(kArenaBytes);
  const int64_t kB = 2, kS = 12, kC = 5, kR = 6;
  const Placed all = a.Place(DType::kFloat32, {kB, kS, kC}, {.pad = {0, 0, 3}});
  const Placed layer = a.Place(DType::kFloat32, {kB, kR, kC});
  const Placed idx = a.Place(DType::kInt64, {kB, kR});
  FillIndices(idx.View(shm_.data()), kS, /*unique=*/true, rng_);
  auto want = Snapshot();
  testing::RefScatter(all.View(want.data()), layer.View(want.data()), idx.View(want.data()), true);
  v1::ScatterTokensRequest req;
  *req.mutable_all() = all.Ref("arena");
  *req.mutable_layer() = layer.Ref("arena");
  *req.mutable_indices() = idx.Ref("arena");
  v1::OpResponse resp;
  ASSERT_OK(client_->Call(&Stub::ScatterTokens, req, &resp));
  ExpectShmEquals(want);
}

TEST_F(ReferenceTest, SortTokensInline) {
  constexpr int64_t kRows = 4, kR = 6, kS = 15;
  std::vector<int64_t> values;
  std::string bytes;
  for (int64_t row = 0; row < kRows; ++row) {
    std::vector<int64_t> all(kS);
    for (int64_t s = 0; s < kS; ++s) all[s] = s;
    std::shuffle(all.begin(), all.end(), rng_);
    for (int64_t p = 0; p < kR; ++p) {
      values.push_back(all[p]);
      const int32_t v = static_cast<int32_t>(all[p]);
      bytes.append(reinterpret_cast<const char*>(&v), 4);
    }
  }
  v1::SortTokensRequest req;
  *req.mutable_ids() = InlineTensor(DType::kInt32, {kRows, kR}, bytes);
  req.set_original_tokens(kS);
  *req.mutable_out() = InlineOutput();
  v1::OpResponse resp;
  ASSERT_OK(client_->Call(&Stub::SortTokens, req, &resp));
  const v1::Tensor* out = FindOutput(resp, "out");
  ASSERT_NE(out, nullptr);
  ASSERT_EQ(out->inline_data().size(), static_cast<size_t>(kRows * kR * 4));
  for (int64_t row = 0; row < kRows; ++row) {
    const std::vector<int64_t> want = testing::RefSortRow(
        std::vector<int64_t>(values.begin() + row * kR, values.begin() + (row + 1) * kR));
    for (int64_t p = 0; p < kR; ++p) {
      int32_t got;
      std::memcpy(&got, out->inline_data().data() + (row * kR + p) * 4, 4);
      EXPECT_EQ(got, want[p]) << "row " << row << " position " << p;
    }
  }
}

}  // namespace
}  // namespace tokensel::itest
