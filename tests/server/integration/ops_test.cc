// Every operator through a real tokensel-server: by reference (inputs and
// outputs inside a registered shm region, unix socket only: memory is
// registered by descriptor, which only a local client can pass) and inline
// (unix socket and loopback TCP), compared with the CPU oracle run on copies
// in this process. By-reference tests compare the whole region byte for byte, so
// they also prove nothing outside the outputs was written.
#include <cstring>
#include <string>
#include <vector>

#include "tests/server/integration/ops_fixture.h"

namespace tokensel::itest {
namespace {

TEST_P(OpsByReferenceTest, SortTokensByReference) {
  Arena a(kArenaBytes);
  const int64_t kS = 16;
  const Placed ids = a.Place(DType::kInt32, {2, 3, 5}, {.pad = {0, 1, 2}});
  const Placed out = a.Place(DType::kInt32, {2, 3, 5}, {.pad = {0, 0, 3}, .misalign = 4});
  const Placed inv = a.Place(DType::kInt32, {2, 3, kS});
  FillIndices(ids.View(shm_.data()), kS, /*unique=*/true, rng_);
  auto oracle = Snapshot();
  ASSERT_OK(kernels::cpu::SortTokens(
      {ids.View(oracle.data()), kS, out.View(oracle.data()), inv.View(oracle.data())}, nullptr));
  v1::SortTokensRequest req;
  *req.mutable_ids() = ids.Ref("arena");
  req.set_original_tokens(kS);
  *req.mutable_out() = out.Ref("arena");
  *req.mutable_inverse() = inv.Ref("arena");
  v1::OpResponse resp;
  ASSERT_OK(client_->Call(&Stub::SortTokens, req, &resp));
  EXPECT_EQ(resp.outputs_size(), 0);
  ExpectShmEquals(oracle);

  // In place (no `out`).
  FillIndices(ids.View(shm_.data()), kS, true, rng_);
  oracle = Snapshot();
  ASSERT_OK(kernels::cpu::SortTokens({ids.View(oracle.data()), kS, {}, {}}, nullptr));
  req.clear_out();
  req.clear_inverse();
  ASSERT_OK(client_->Call(&Stub::SortTokens, req, &resp));
  ExpectShmEquals(oracle);
}

TEST_P(OpsTest, SortTokensInline) {
  auto local = Local();
  Arena a(local.size());
  const int64_t kS = 20;
  const Placed ids = a.Place(DType::kInt64, {3, 7});
  const Placed out = a.Place(DType::kInt64, {3, 7});
  const Placed inv = a.Place(DType::kInt32, {3, kS});
  FillIndices(ids.View(local.data()), kS, true, rng_);
  v1::SortTokensRequest req;
  *req.mutable_ids() = Inline(ids, local);
  req.set_original_tokens(kS);
  *req.mutable_out() = InlineOutput();
  *req.mutable_inverse() = InlineOutput();
  ASSERT_OK(kernels::cpu::SortTokens(
      {ids.View(local.data()), kS, out.View(local.data()), inv.View(local.data())}, nullptr));
  v1::OpResponse resp;
  ASSERT_OK(client_->Call(&Stub::SortTokens, req, &resp));
  ExpectInline(resp, "out", out, local);
  ExpectInline(resp, "inverse", inv, local);
}

TEST_P(OpsByReferenceTest, GatherTokensByReference) {
  for (const bool batch_first : {true, false}) {
    SCOPED_TRACE(batch_first ? "batch_first" : "seq_first");
    Arena a(kArenaBytes);
    const int64_t kB = 3, kS = 40, kC = 24, kR = 11;
    const std::vector<int64_t> act_shape =
        batch_first ? std::vector<int64_t>{kB, kS, kC} : std::vector<int64_t>{kS, kB, kC};
    const std::vector<int64_t> out_shape =
        batch_first ? std::vector<int64_t>{kB, kR, kC} : std::vector<int64_t>{kR, kB, kC};
    const Placed act = a.Place(DType::kBFloat16, act_shape, {.pad = {0, 1, 3}, .misalign = 2});
    const Placed idx = a.Place(DType::kInt64, {kB, kR}, {.pad = {0, 2}});
    const Placed out = a.Place(DType::kBFloat16, out_shape, {.pad = {0, 0, 5}, .misalign = 6});
    FillIndices(idx.View(shm_.data()), kS, /*unique=*/false, rng_);
    const auto oracle_before = Snapshot();
    auto oracle = oracle_before;
    ASSERT_OK(kernels::cpu::GatherTokens(
        {act.View(oracle.data()), idx.View(oracle.data()), out.View(oracle.data()), batch_first},
        nullptr));
    ASSERT_NE(oracle, oracle_before) << "the oracle wrote nothing: test bug";
    v1::GatherTokensRequest req;
    *req.mutable_activations() = act.Ref("arena");
    *req.mutable_indices() = idx.Ref("arena");
    *req.mutable_out() = out.Ref("arena");
    req.set_batch_first(batch_first);
    v1::OpResponse resp;
    ASSERT_OK(client_->Call(&Stub::GatherTokens, req, &resp));
    ExpectShmEquals(oracle);
  }
}

TEST_P(OpsTest, GatherTokensInline) {
  auto local = Local();
  Arena a(local.size());
  const Placed act = a.Place(DType::kFloat16, {2, 30, 12});
  const Placed idx = a.Place(DType::kInt32, {2, 9});
  const Placed out = a.Place(DType::kFloat16, {2, 9, 12});
  FillIndices(idx.View(local.data()), 30, false, rng_);
  v1::GatherTokensRequest req;
  *req.mutable_activations() = Inline(act, local);
  *req.mutable_indices() = Inline(idx, local);
  req.set_batch_first(true);  // `out` absent: inline
  ASSERT_OK(kernels::cpu::GatherTokens(
      {act.View(local.data()), idx.View(local.data()), out.View(local.data()), true}, nullptr));
  v1::OpResponse resp;
  ASSERT_OK(client_->Call(&Stub::GatherTokens, req, &resp));
  ExpectInline(resp, "out", out, local);
}

TEST_P(OpsByReferenceTest, ScatterTokensByReference) {
  Arena a(kArenaBytes);
  const Placed all = a.Place(DType::kFloat32, {2, 30, 8}, {.pad = {0, 0, 1}});
  const Placed layer = a.Place(DType::kFloat32, {2, 6, 8}, {.misalign = 4});
  const Placed idx = a.Place(DType::kInt32, {2, 6});
  FillIndices(idx.View(shm_.data()), 30, /*unique=*/true, rng_);
  auto oracle = Snapshot();
  ASSERT_OK(kernels::cpu::ScatterTokens(
      {all.View(oracle.data()), layer.View(oracle.data()), idx.View(oracle.data()), true},
      nullptr));
  v1::ScatterTokensRequest req;
  *req.mutable_all() = all.Ref("arena");
  *req.mutable_layer() = layer.Ref("arena");
  *req.mutable_indices() = idx.Ref("arena");
  req.set_batch_first(true);
  v1::OpResponse resp;
  ASSERT_OK(client_->Call(&Stub::ScatterTokens, req, &resp));
  ExpectShmEquals(oracle);
}

TEST_P(OpsByReferenceTest, ScatterTokensInlineSources) {
  // `all` is written in place, so it is a buffer; layer and indices inline.
  auto local = Local();
  Arena la(local.size());
  const Placed layer = la.Place(DType::kInt16, {5, 2, 8});  // seq-first [R,B,C]
  const Placed idx = la.Place(DType::kInt64, {2, 5});
  FillIndices(idx.View(local.data()), 9, true, rng_);
  Arena a(kArenaBytes);
  const Placed all = a.Place(DType::kInt16, {9, 2, 8});
  auto oracle = Snapshot();
  // The oracle reads the local layer/indices and writes the oracle copy.
  ASSERT_OK(kernels::cpu::ScatterTokens(
      {all.View(oracle.data()), layer.View(local.data()), idx.View(local.data()), false}, nullptr));
  v1::ScatterTokensRequest req;
  *req.mutable_all() = all.Ref("arena");
  *req.mutable_layer() = Inline(layer, local);
  *req.mutable_indices() = Inline(idx, local);
  req.set_batch_first(false);
  v1::OpResponse resp;
  ASSERT_OK(client_->Call(&Stub::ScatterTokens, req, &resp));
  ExpectShmEquals(oracle);
}

TEST_P(OpsByReferenceTest, GatherBertMaskByReference) {
  Arena a(kArenaBytes);
  const Placed mask = a.Place(DType::kUInt8, {2, 2, 20, 20}, {.pad = {0, 0, 0, 3}});
  const Placed idx = a.Place(DType::kInt32, {3, 2, 6});
  const Placed out = a.Place(DType::kUInt8, {3, 2, 2, 6, 6}, {.misalign = 1});
  FillIndices(idx.View(shm_.data()), 20, true, rng_);
  auto oracle = Snapshot();
  ASSERT_OK(kernels::cpu::GatherBertMask(
      {mask.View(oracle.data()), idx.View(oracle.data()), out.View(oracle.data())}, nullptr));
  v1::GatherBertMaskRequest req;
  *req.mutable_mask() = mask.Ref("arena");
  *req.mutable_indices() = idx.Ref("arena");
  *req.mutable_out() = out.Ref("arena");
  v1::OpResponse resp;
  ASSERT_OK(client_->Call(&Stub::GatherBertMask, req, &resp));
  ExpectShmEquals(oracle);
}

TEST_P(OpsTest, GatherBertMaskInline) {
  auto local = Local();
  Arena a(local.size());
  const Placed mask = a.Place(DType::kFloat16, {2, 1, 1, 20});  // Sq = 1: padding mask
  const Placed idx = a.Place(DType::kInt64, {2, 2, 7});
  const Placed out = a.Place(DType::kFloat16, {2, 2, 1, 7, 7});
  FillIndices(idx.View(local.data()), 20, true, rng_);
  v1::GatherBertMaskRequest req;
  *req.mutable_mask() = Inline(mask, local);
  *req.mutable_indices() = Inline(idx, local);
  *req.mutable_out() = InlineOutput();
  ASSERT_OK(kernels::cpu::GatherBertMask(
      {mask.View(local.data()), idx.View(local.data()), out.View(local.data())}, nullptr));
  v1::OpResponse resp;
  ASSERT_OK(client_->Call(&Stub::GatherBertMask, req, &resp));
  ExpectInline(resp, "out", out, local);
}

TEST_P(OpsByReferenceTest, SliceGptMaskByReference) {
  Arena a(kArenaBytes);
  const Placed mask = a.Place(DType::kFloat32, {2, 2, 12, 12}, {.pad = {0, 0, 1, 0}});
  const Placed out = a.Place(DType::kFloat32, {2, 2, 5, 5});
  auto oracle = Snapshot();
  ASSERT_OK(
      kernels::cpu::SliceGptMask({mask.View(oracle.data()), out.View(oracle.data())}, nullptr));
  v1::SliceGptMaskRequest req;
  *req.mutable_mask() = mask.Ref("arena");
  *req.mutable_out() = out.Ref("arena");
  v1::OpResponse resp;
  ASSERT_OK(client_->Call(&Stub::SliceGptMask, req, &resp));
  ExpectShmEquals(oracle);
}

TEST_P(OpsTest, SliceGptMaskInline) {
  auto local = Local();
  Arena a(local.size());
  const Placed mask = a.Place(DType::kBool, {1, 3, 9, 9});
  const Placed out = a.Place(DType::kBool, {1, 3, 4, 4});
  v1::SliceGptMaskRequest req;
  *req.mutable_mask() = Inline(mask, local);
  req.set_retained_tokens(4);
  *req.mutable_out() = InlineOutput();
  ASSERT_OK(kernels::cpu::SliceGptMask({mask.View(local.data()), out.View(local.data())}, nullptr));
  v1::OpResponse resp;
  ASSERT_OK(client_->Call(&Stub::SliceGptMask, req, &resp));
  ExpectInline(resp, "out", out, local);
}

TEST_P(OpsByReferenceTest, SegmentSeqlensByReference) {
  Arena a(kArenaBytes);
  const int64_t kB = 3, kT = 40, kNS = 4;
  const Placed ids = a.Place(DType::kInt32, {kB, kT}, {.pad = {0, 3}});
  const Placed seqlen = a.Place(DType::kInt32, {kB, kNS});
  const Placed offset = a.Place(DType::kInt32, {kB, kNS + 1});
  const Placed pseq = a.Place(DType::kInt32, {kB * kNS});
  const Placed poff = a.Place(DType::kInt32, {kB * (kNS + 1)});
  const Placed cu = a.Place(DType::kInt32, {kB * kNS + 1});
  FillSegments(ids.View(shm_.data()), kNS, rng_);
  auto oracle = Snapshot();
  kernels::SegmentSeqlensArgs args;
  args.segment_ids_q = ids.View(oracle.data());
  args.max_segments = kNS;
  args.q = {seqlen.View(oracle.data()), offset.View(oracle.data()),
            kernels::PackedSeqlens{pseq.View(oracle.data()), poff.View(oracle.data()),
                                   cu.View(oracle.data())}};
  ASSERT_OK(kernels::cpu::SegmentSeqlens(args, nullptr));
  v1::SegmentSeqlensRequest req;
  *req.mutable_segment_ids_q() = ids.Ref("arena");
  req.set_max_segments(kNS);
  req.set_packed(true);
  *req.mutable_q_seqlen() = seqlen.Ref("arena");
  *req.mutable_q_offset() = offset.Ref("arena");
  *req.mutable_q_packed_seqlens() = pseq.Ref("arena");
  *req.mutable_q_packed_offsets() = poff.Ref("arena");
  *req.mutable_q_cu_seqlens() = cu.Ref("arena");
  v1::OpResponse resp;
  ASSERT_OK(client_->Call(&Stub::SegmentSeqlens, req, &resp));
  ExpectShmEquals(oracle);
}

TEST_P(OpsTest, SegmentSeqlensCrossAttentionInline) {
  auto local = Local();
  Arena a(local.size());
  const int64_t kB = 2, kTq = 24, kTkv = 30, kNS = 3;
  const Placed qids = a.Place(DType::kInt64, {kB, kTq});
  const Placed kvids = a.Place(DType::kInt64, {kB, kTkv});
  FillSegments(qids.View(local.data()), kNS, rng_);
  FillSegments(kvids.View(local.data()), kNS, rng_);
  std::vector<Placed> q, kv;
  for (auto* side : {&q, &kv}) {
    side->push_back(a.Place(DType::kInt32, {kB, kNS}));
    side->push_back(a.Place(DType::kInt32, {kB, kNS + 1}));
  }
  kernels::SegmentSeqlensArgs args;
  args.segment_ids_q = qids.View(local.data());
  args.segment_ids_kv = kvids.View(local.data());
  args.max_segments = kNS;
  args.mask = kernels::AttnMaskType::kPadding;
  args.q = {q[0].View(local.data()), q[1].View(local.data()), std::nullopt};
  args.kv =
      kernels::SegmentSeqlensSide{kv[0].View(local.data()), kv[1].View(local.data()), std::nullopt};
  ASSERT_OK(kernels::cpu::SegmentSeqlens(args, nullptr));
  v1::SegmentSeqlensRequest req;
  *req.mutable_segment_ids_q() = Inline(qids, local);
  *req.mutable_segment_ids_kv() = Inline(kvids, local);
  req.set_max_segments(kNS);
  req.set_mask(v1::ATTN_MASK_PADDING);
  *req.mutable_q_seqlen() = InlineOutput();
  *req.mutable_q_offset() = InlineOutput();
  *req.mutable_kv_seqlen() = InlineOutput();
  *req.mutable_kv_offset() = InlineOutput();
  v1::OpResponse resp;
  ASSERT_OK(client_->Call(&Stub::SegmentSeqlens, req, &resp));
  ExpectInline(resp, "q_seqlen", q[0], local);
  ExpectInline(resp, "q_offset", q[1], local);
  ExpectInline(resp, "kv_seqlen", kv[0], local);
  ExpectInline(resp, "kv_offset", kv[1], local);
}

TEST_P(OpsByReferenceTest, SampleTokensByReference) {
  Arena a(kArenaBytes);
  const int64_t kL = 2, kB = 3, kS = 50, kR = 12, kH = 2;
  const Placed ids = a.Place(DType::kInt64, {kL, kB, kR}, {.pad = {0, 0, 1}});
  const Placed inv = a.Place(DType::kInt32, {kL, kB, kS});
  const Placed mask = a.Place(DType::kUInt8, {kB, kH, 1, kS});
  const Placed bert = a.Place(DType::kUInt8, {kL, kB, kH, kR, kR});
  auto oracle = Snapshot();
  kernels::SampleTokensArgs args{kL,
                                 kB,
                                 kS,
                                 kR,
                                 777,
                                 41,
                                 ids.View(oracle.data()),
                                 inv.View(oracle.data()),
                                 mask.View(oracle.data()),
                                 bert.View(oracle.data()),
                                 std::nullopt};
  ASSERT_OK(kernels::cpu::SampleTokens(args, nullptr));
  v1::SampleTokensRequest req;
  req.set_layers(kL);
  req.set_batch(kB);
  req.set_original_tokens(kS);
  req.set_retained_tokens(kR);
  req.set_seed(777);
  req.set_step(41);
  *req.mutable_ids() = ids.Ref("arena");
  *req.mutable_inverse() = inv.Ref("arena");
  *req.mutable_mask() = mask.Ref("arena");
  *req.mutable_bert_mask() = bert.Ref("arena");
  v1::OpResponse resp;
  ASSERT_OK(client_->Call(&Stub::SampleTokens, req, &resp));
  ExpectShmEquals(oracle);
}

TEST_P(OpsTest, SampleTokensInline) {
  std::vector<uint8_t> local(1 << 16);
  Arena a(local.size());
  const int64_t kL = 3, kB = 2, kS = 33, kR = 9;
  const Placed ids = a.Place(DType::kInt32, {kL, kB, kR});
  const Placed inv = a.Place(DType::kInt32, {kL, kB, kS});
  kernels::SampleTokensArgs args{
      kL, kB, kS, kR, 5, 6, ids.View(local.data()), inv.View(local.data())};
  ASSERT_OK(kernels::cpu::SampleTokens(args, nullptr));
  v1::SampleTokensRequest req;
  req.set_layers(kL);
  req.set_batch(kB);
  req.set_original_tokens(kS);
  req.set_retained_tokens(kR);
  req.set_seed(5);
  req.set_step(6);
  *req.mutable_inverse() = InlineOutput();  // `ids` absent: inline int32
  v1::OpResponse resp;
  ASSERT_OK(client_->Call(&Stub::SampleTokens, req, &resp));
  ExpectInline(resp, "ids", ids, local);
  ExpectInline(resp, "inverse", inv, local);
}

TEST_P(OpsByReferenceTest, TopKTokensByReference) {
  Arena a(kArenaBytes);
  const Placed scores = a.Place(DType::kFloat32, {4, 64}, {.pad = {0, 2}});
  const Placed ids = a.Place(DType::kInt64, {4, 10});
  auto oracle = Snapshot();
  ASSERT_OK(
      kernels::cpu::TopKTokens({scores.View(oracle.data()), ids.View(oracle.data())}, nullptr));
  v1::TopKTokensRequest req;
  *req.mutable_scores() = scores.Ref("arena");
  req.set_retained_tokens(10);
  *req.mutable_ids() = ids.Ref("arena");
  v1::OpResponse resp;
  ASSERT_OK(client_->Call(&Stub::TopKTokens, req, &resp));
  ExpectShmEquals(oracle);
}

TEST_P(OpsTest, TopKTokensInline) {
  auto local = Local();
  Arena a(local.size());
  const Placed scores = a.Place(DType::kBFloat16, {3, 33});
  const Placed ids = a.Place(DType::kInt32, {3, 8});
  ASSERT_OK(kernels::cpu::TopKTokens({scores.View(local.data()), ids.View(local.data())}, nullptr));
  v1::TopKTokensRequest req;
  *req.mutable_scores() = Inline(scores, local);
  req.set_retained_tokens(8);  // `ids` absent: inline int32
  v1::OpResponse resp;
  ASSERT_OK(client_->Call(&Stub::TopKTokens, req, &resp));
  ExpectInline(resp, "ids", ids, local);
}

INSTANTIATE_TEST_SUITE_P(Unix, OpsByReferenceTest, ::testing::Values(Transport::kUnix),
                         TransportName);
INSTANTIATE_TEST_SUITE_P(Transports, OpsTest, ::testing::Values(Transport::kUnix, Transport::kTcp),
                         TransportName);

}  // namespace
}  // namespace tokensel::itest
