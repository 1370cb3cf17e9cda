// Multi-op traffic through a real server: a whole Random-LTD layer step in
// two Executes (sample -> gather -> [the test's stand-in layer edits the
// gathered rows in shm] -> scatter -> bert mask), a THD batch, and a Stream
// with 200 requests in flight.
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tests/server/integration/fixture.h"

namespace tokensel::itest {
namespace {

using Stub = v1::TokenSelect::Stub;

class PipelineTest : public ServerFixture {
 protected:
  void SetUp() override { StartServer(); }

  std::vector<uint8_t> Snapshot() const {
    return std::vector<uint8_t>(shm_.data(), shm_.data() + shm_.size());
  }
  bool ShmEquals(const std::vector<uint8_t>& oracle) const {
    return std::memcmp(oracle.data(), shm_.data(), shm_.size()) == 0;
  }
};

// The stand-in transformer layer: flips bits of every retained row, the
// same way in shm (what the worker would do) and in the oracle copy.
void StandInLayer(const kernels::TensorView& rows) {
  const int64_t esize = rows.elem_size();
  for (int64_t i = 0; i < rows.NumElements(); ++i) {
    char* p = rows.At(kernels::LinearToOffset(rows, i));
    for (int64_t b = 0; b < esize; ++b) p[b] = static_cast<char>(p[b] ^ 0x5A);
  }
}

TEST_F(PipelineTest, RandomLtdLayerStepInTwoExecutes) {
  constexpr int64_t kB = 2, kS = 64, kC = 32, kR = 20, kH = 2;
  Arena a(kArenaBytes);
  const Placed acts = a.Place(DType::kBFloat16, {kB, kS, kC}, {.pad = {0, 0, 8}});
  const Placed mask = a.Place(DType::kUInt8, {kB, kH, kS, kS});
  const Placed ids = a.Place(DType::kInt32, {1, kB, kR});
  const Placed gathered = a.Place(DType::kBFloat16, {kB, kR, kC});
  const Placed bert = a.Place(DType::kUInt8, {1, kB, kH, kR, kR});
  // The same ids memory viewed as the [B,R] indices of gather/scatter.
  Placed ids_br = ids;
  ids_br.shape = {kB, kR};
  ids_br.strides = {kR, 1};

  auto oracle = Snapshot();
  uint8_t* o = oracle.data();
  ASSERT_OK(
      kernels::cpu::SampleTokens({1, kB, kS, kR, /*seed=*/99, /*step=*/7, ids.View(o)}, nullptr));
  ASSERT_OK(
      kernels::cpu::GatherTokens({acts.View(o), ids_br.View(o), gathered.View(o), true}, nullptr));

  v1::ExecuteRequest forward;
  auto* sample = forward.add_ops()->mutable_sample_tokens();
  sample->set_layers(1);
  sample->set_batch(kB);
  sample->set_original_tokens(kS);
  sample->set_retained_tokens(kR);
  sample->set_seed(99);
  sample->set_step(7);
  *sample->mutable_ids() = ids.Ref("arena");
  auto* gather = forward.add_ops()->mutable_gather_tokens();
  *gather->mutable_activations() = acts.Ref("arena");
  *gather->mutable_indices() = ids_br.Ref("arena");
  *gather->mutable_out() = gathered.Ref("arena");
  gather->set_batch_first(true);
  v1::ExecuteResponse resp;
  ASSERT_OK(client_->Call(&Stub::Execute, forward, &resp));
  ASSERT_EQ(resp.results_size(), 2);
  ASSERT_TRUE(ShmEquals(oracle)) << "after sample + gather";

  StandInLayer(gathered.View(shm_.data()));
  StandInLayer(gathered.View(o));
  ASSERT_OK(
      kernels::cpu::ScatterTokens({acts.View(o), gathered.View(o), ids_br.View(o), true}, nullptr));
  ASSERT_OK(kernels::cpu::GatherBertMask({mask.View(o), ids.View(o), bert.View(o)}, nullptr));

  v1::ExecuteRequest backward;
  auto* scatter = backward.add_ops()->mutable_scatter_tokens();
  *scatter->mutable_all() = acts.Ref("arena");
  *scatter->mutable_layer() = gathered.Ref("arena");
  *scatter->mutable_indices() = ids_br.Ref("arena");
  scatter->set_batch_first(true);
  auto* bert_op = backward.add_ops()->mutable_gather_bert_mask();
  *bert_op->mutable_mask() = mask.Ref("arena");
  *bert_op->mutable_indices() = ids.Ref("arena");
  *bert_op->mutable_out() = bert.Ref("arena");
  ASSERT_OK(client_->Call(&Stub::Execute, backward, &resp));
  ASSERT_EQ(resp.results_size(), 2);
  EXPECT_TRUE(ShmEquals(oracle)) << "after scatter + bert mask";
}

TEST_F(PipelineTest, ThdBatchPackedSeqlens) {
  constexpr int64_t kB = 4, kT = 128, kNS = 6;
  Arena a(kArenaBytes);
  const Placed seg = a.Place(DType::kInt32, {kB, kT});
  const Placed seqlen = a.Place(DType::kInt32, {kB, kNS});
  const Placed offset = a.Place(DType::kInt32, {kB, kNS + 1});
  const Placed pseq = a.Place(DType::kInt32, {kB * kNS});
  const Placed poff = a.Place(DType::kInt32, {kB * (kNS + 1)});
  const Placed cu = a.Place(DType::kInt32, {kB * kNS + 1});
  FillSegments(seg.View(shm_.data()), kNS, rng_);
  auto oracle = Snapshot();
  uint8_t* o = oracle.data();
  kernels::SegmentSeqlensArgs args;
  args.segment_ids_q = seg.View(o);
  args.max_segments = kNS;
  args.mask = kernels::AttnMaskType::kCausal;
  args.q = {seqlen.View(o), offset.View(o),
            kernels::PackedSeqlens{pseq.View(o), poff.View(o), cu.View(o)}};
  ASSERT_OK(kernels::cpu::SegmentSeqlens(args, nullptr));

  v1::ExecuteRequest req;
  auto* op = req.add_ops()->mutable_segment_seqlens();
  *op->mutable_segment_ids_q() = seg.Ref("arena");
  op->set_max_segments(kNS);
  op->set_mask(v1::ATTN_MASK_CAUSAL);
  op->set_packed(true);
  *op->mutable_q_seqlen() = seqlen.Ref("arena");
  *op->mutable_q_offset() = offset.Ref("arena");
  *op->mutable_q_packed_seqlens() = pseq.Ref("arena");
  *op->mutable_q_packed_offsets() = poff.Ref("arena");
  *op->mutable_q_cu_seqlens() = cu.Ref("arena");
  // The same batch again with every output inline.
  auto* inline_op = req.add_ops()->mutable_segment_seqlens();
  *inline_op->mutable_segment_ids_q() = seg.Ref("arena");
  inline_op->set_max_segments(kNS);
  inline_op->set_mask(v1::ATTN_MASK_CAUSAL);
  inline_op->set_packed(true);
  for (auto* t : {inline_op->mutable_q_seqlen(), inline_op->mutable_q_offset(),
                  inline_op->mutable_q_packed_seqlens(), inline_op->mutable_q_packed_offsets(),
                  inline_op->mutable_q_cu_seqlens()}) {
    *t = InlineOutput();
  }
  v1::ExecuteResponse resp;
  ASSERT_OK(client_->Call(&Stub::Execute, req, &resp));
  ASSERT_EQ(resp.results_size(), 2);
  EXPECT_TRUE(ShmEquals(oracle));
  const std::vector<std::pair<std::string, const Placed*>> outputs = {{"q_seqlen", &seqlen},
                                                                      {"q_offset", &offset},
                                                                      {"q_packed_seqlens", &pseq},
                                                                      {"q_packed_offsets", &poff},
                                                                      {"q_cu_seqlens", &cu}};
  for (const auto& [name, placed] : outputs) {
    const v1::Tensor* t = FindOutput(resp.results(1), name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_TRUE(t->inline_data() == placed->PackedBytes(o)) << name;
  }
}

TEST_F(PipelineTest, StreamWith200RequestsInFlight) {
  constexpr int kRequests = 200;
  constexpr int64_t kB = 2, kS = 48, kC = 16, kR = 6;
  constexpr int kBad = 77;  // this one has an index out of range
  Arena a(kArenaBytes);
  const Placed acts = a.Place(DType::kFloat32, {kB, kS, kC});
  std::vector<uint8_t> local(1 << 20);
  Arena la(local.size());
  std::vector<Placed> idx, out;
  std::vector<v1::StreamRequest> requests(kRequests);
  for (int i = 0; i < kRequests; ++i) {
    idx.push_back(la.Place(DType::kInt32, {kB, kR}));
    out.push_back(la.Place(DType::kFloat32, {kB, kR, kC}));
    const Placed& ix = idx.back();
    FillIndices(ix.View(local.data()), kS, false, rng_);
    if (i == kBad) kernels::StoreIndex(ix.View(local.data()), 3, kS + 5);
    requests[i].set_request_id(1000 + i);
    v1::GatherTokensRequest* g =
        i % 2 == 0 ? requests[i].mutable_op()->mutable_gather_tokens()
                   : requests[i].mutable_execute()->add_ops()->mutable_gather_tokens();
    *g->mutable_activations() = acts.Ref("arena");
    *g->mutable_indices() = InlineTensor(ix.dtype, ix.shape, ix.PackedBytes(local.data()));
    g->set_batch_first(true);
  }
  // The oracle: acts from shm (read-only here), outputs in local memory.
  for (int i = 0; i < kRequests; ++i) {
    if (i == kBad) continue;
    ASSERT_OK(kernels::cpu::GatherTokens(
        {acts.View(shm_.data()), idx[i].View(local.data()), out[i].View(local.data()), true},
        nullptr));
  }

  auto ctx = client_->Context();
  auto stream = client_->stub().Stream(ctx.get());
  std::thread writer([&] {
    for (const auto& r : requests) {
      if (!stream->Write(r)) break;
    }
    stream->WritesDone();
  });
  // On an early ASSERT return: cancel the call so the writer stops, then join.
  struct JoinOnExit {
    grpc::ClientContext* ctx;
    std::thread* thread;
    ~JoinOnExit() {
      if (thread->joinable()) {
        ctx->TryCancel();
        thread->join();
      }
    }
  } join_on_exit{ctx.get(), &writer};
  v1::StreamResponse resp;
  int received = 0;
  while (received < kRequests && stream->Read(&resp)) {
    const int i = received++;
    ASSERT_EQ(resp.request_id(), 1000u + i) << "responses out of order";
    if (i == kBad) {
      EXPECT_EQ(resp.code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
      EXPECT_THAT(resp.message(), ::testing::HasSubstr("indices")) << resp.message();
      continue;
    }
    ASSERT_EQ(resp.code(), 0) << "request " << i << ": " << resp.message();
    const v1::OpResponse& op = i % 2 == 0 ? resp.op() : resp.execute().results(0);
    const v1::Tensor* t = FindOutput(op, "out");
    ASSERT_NE(t, nullptr) << "request " << i;
    ASSERT_TRUE(t->inline_data() == out[i].PackedBytes(local.data())) << "request " << i;
  }
  writer.join();
  EXPECT_EQ(received, kRequests);
  EXPECT_OK(ToAbsl(stream->Finish()));
  ExpectStillServes();
}

}  // namespace
}  // namespace tokensel::itest
