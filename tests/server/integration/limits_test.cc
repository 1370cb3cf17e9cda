// Server limits, each against its own real server started with a small
// limit: message size (RESOURCE_EXHAUSTED from gRPC), session expiry
// (NOT_FOUND), buffers per session, requests in flight (RESOURCE_EXHAUSTED
// immediately), work per op (RESOURCE_EXHAUSTED before it runs), and tiny
// requests whose metadata asks for huge scratch. After each, the server still
// serves a valid request.
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "tests/server/integration/fixture.h"

namespace tokensel::itest {
namespace {

using ::testing::HasSubstr;
using Stub = v1::TokenSelect::Stub;
using Code = absl::StatusCode;

class LimitsTest : public ServerFixture {};

TEST_F(LimitsTest, RequestAboveMaxMessageBytesIsResourceExhausted) {
  StartServer({.extra_args = {"--max_message_bytes=65536"}});
  v1::GatherTokensRequest req;
  *req.mutable_activations() =
      InlineTensor(DType::kFloat32, {1, 64, 512}, std::string(64 * 512 * 4, '\0'));  // 128 KiB
  *req.mutable_indices() = InlineTensor(DType::kInt32, {1, 1}, std::string(4, '\0'));
  v1::OpResponse resp;
  EXPECT_THAT(client_->Call(&Stub::GatherTokens, req, &resp), StatusIs(Code::kResourceExhausted));
  ExpectStillServes();
}

TEST_F(LimitsTest, ExpiredSessionIsNotFound) {
  // 2 s: long enough that the fixture's OpenSession..Register and the first
  // call below fit inside one lease on a loaded machine.
  StartServer({.extra_args = {"--session_ttl=2s"}});
  ExpectStillServes();  // renews the lease
  // Bounded wait past the lease (the reaper or the next call ends it).
  absl::Status s;
  for (int i = 0; i < 60; ++i) {
    absl::SleepFor(absl::Milliseconds(100));
    if (i < 21) continue;  // at least 2.2 s idle
    v1::ListBuffersResponse resp;
    s = client_->Call(&Stub::ListBuffers, v1::ListBuffersRequest(), &resp);
    if (!s.ok()) break;
  }
  EXPECT_THAT(s, StatusIs(Code::kNotFound, "session"));
  // A new session works (and the expired one's buffer was unregistered).
  ASSERT_OK(client_->Open());
  v1::ListBuffersResponse listed;
  ASSERT_OK(client_->Call(&Stub::ListBuffers, v1::ListBuffersRequest(), &listed));
  EXPECT_EQ(listed.buffers_size(), 0);
  ASSERT_OK(client_->Register("arena", shm_.name(), 0, shm_.size()));
  ExpectStillServes();
}

TEST_F(LimitsTest, TooManyBuffersIsResourceExhausted) {
  StartServer({.extra_args = {"--max_buffers=2"}});  // "arena" is the first
  ASSERT_OK(client_->Register("second", shm_.name(), 0, 4096));
  EXPECT_THAT(client_->Register("third", shm_.name(), 4096, 4096),
              StatusIs(Code::kResourceExhausted, "2"));
  // Freeing one makes room again.
  ASSERT_OK(client_->Unregister("second"));
  ASSERT_OK(client_->Register("third", shm_.name(), 4096, 4096));
  ExpectStillServes();
}

TEST_F(LimitsTest, TooManyInFlightIsResourceExhaustedImmediately) {
  StartServer({.extra_args = {"--max_inflight=1"}});
  constexpr int64_t kS = 2048, kC = 128, kR = 2048;  // 1 MiB in, 1 MiB out per gather
  constexpr int kThreads = 6;
  Arena a(kArenaBytes);
  // Every thread writes the same output region with identical values.
  const Placed act = a.Place(DType::kFloat32, {1, kS, kC});
  const Placed idx = a.Place(DType::kInt32, {1, kR});
  const Placed out = a.Place(DType::kFloat32, {1, kR, kC});
  FillIndices(idx.View(shm_.data()), kS, false, rng_);
  v1::ExecuteRequest req;  // 16 gathers: long enough to overlap
  for (int i = 0; i < 16; ++i) {
    auto* g = req.add_ops()->mutable_gather_tokens();
    *g->mutable_activations() = act.Ref("arena");
    *g->mutable_indices() = idx.Ref("arena");
    *g->mutable_out() = out.Ref("arena");
    g->set_batch_first(true);
  }
  std::atomic<int> ok{0}, exhausted{0}, other{0};
  std::string other_error;
  absl::Mutex mu;
  for (int round = 0; round < 5 && (ok == 0 || exhausted == 0); ++round) {
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&] {
        Client c(server_->UnixChannel());
        c.set_session(client_->session());
        v1::ExecuteResponse resp;
        const absl::Status s = c.Call(&Stub::Execute, req, &resp);
        if (s.ok()) {
          ++ok;
        } else if (s.code() == Code::kResourceExhausted) {
          ++exhausted;
        } else {
          ++other;
          absl::MutexLock lock(&mu);
          other_error = s.ToString();
        }
      });
    }
    for (auto& th : threads) th.join();
  }
  EXPECT_GT(ok.load(), 0);
  EXPECT_GT(exhausted.load(), 0) << "max_inflight=1 never refused a concurrent request";
  EXPECT_EQ(other.load(), 0) << other_error;
  ExpectStillServes();
}

TEST_F(LimitsTest, OpAboveMaxOpElementsIsResourceExhaustedBeforeItRuns) {
  StartServer({.extra_args = {"--max_op_elements=1000000"}});
  // A few bytes of request, 2^31 - 1 positions of Philox work.
  v1::SampleTokensRequest sample;
  sample.set_layers(1);
  sample.set_batch(1);
  sample.set_original_tokens((int64_t{1} << 31) - 1);
  sample.set_retained_tokens(1);
  v1::OpResponse resp;
  EXPECT_THAT(
      client_->Call(&Stub::SampleTokens, sample, &resp),
      StatusIs(Code::kResourceExhausted,
               "SampleTokens: about 2147483647 elements of work (what it reads and writes), "
               "above the per-op limit of 1000000 (--max_op_elements)"));
  // A zero-strided view: 4 bytes of the buffer, rows of 2^40 channels.
  Arena a(kArenaBytes);
  const Placed idx = a.Place(DType::kInt32, {1, 2});
  const Placed out = a.Place(DType::kFloat32, {1, 2, 1});
  v1::GatherTokensRequest gather;
  *gather.mutable_activations() = idx.Ref("arena");
  gather.mutable_activations()->set_dtype(v1::DTYPE_FLOAT32);
  gather.mutable_activations()->clear_shape();
  gather.mutable_activations()->clear_strides();
  for (int64_t d : {int64_t{1}, int64_t{1}, int64_t{1} << 40}) {
    gather.mutable_activations()->add_shape(d);
    gather.mutable_activations()->add_strides(0);
  }
  *gather.mutable_indices() = idx.Ref("arena");
  *gather.mutable_out() = out.Ref("arena");
  gather.set_batch_first(true);
  EXPECT_THAT(client_->Call(&Stub::GatherTokens, gather, &resp),
              StatusIs(Code::kResourceExhausted, "GatherTokens: about 2199023255554 elements"));
  ExpectStillServes();
}

// Metadata that used to size scratch memory: S = 2^31 - 1 for SampleTokens
// (24 GiB of keys per thread) and a zero-byte `all` of S = 2^39 for
// ScatterTokens (a 64 GiB uniqueness bitmap): std::bad_alloc took the server
// down. Both now run in memory proportional to their outputs.
TEST_F(LimitsTest, HugeSWithTinyTensorsNeedsNoHugeScratch) {
  // No work bound: the scratch itself is what is under test.
  StartServer({.extra_args = {"--threads=2", "--max_op_elements=0"}});
  Arena a(kArenaBytes);
  const Placed idx = a.Place(DType::kInt64, {1, 3});
  const Placed none = a.Place(DType::kFloat32, {1, 3, 1});
  const int64_t kS = int64_t{1} << 39;  // a 64 GiB bitmap
  int64_t* ids = reinterpret_cast<int64_t*>(shm_.data() + idx.offset);
  ids[0] = kS - 1;
  ids[1] = 0;
  ids[2] = 123456789;
  v1::ScatterTokensRequest scatter;
  auto zero_channels = [&](v1::Tensor* t, std::vector<int64_t> shape) {
    *t = none.Ref("arena");
    t->clear_shape();
    t->clear_strides();
    for (int64_t d : shape) t->add_shape(d);
  };
  zero_channels(scatter.mutable_all(), {1, kS, 0});
  zero_channels(scatter.mutable_layer(), {1, 3, 0});
  *scatter.mutable_indices() = idx.Ref("arena");
  scatter.set_batch_first(true);
  v1::OpResponse resp;
  EXPECT_OK(client_->Call(&Stub::ScatterTokens, scatter, &resp));
  ids[2] = 0;  // a duplicate is still found, by sorting
  EXPECT_THAT(client_->Call(&Stub::ScatterTokens, scatter, &resp),
              StatusIs(Code::kInvalidArgument, "indices[0,2] = 0 duplicates indices[0,1]"));

  // SampleTokens over 2^22 + 1 positions with R = 3: the chunked selection
  // (keys recomputed per pass), checked against the CPU oracle.
  v1::SampleTokensRequest sample;
  sample.set_layers(1);
  sample.set_batch(2);
  sample.set_original_tokens((int64_t{1} << 22) + 1);
  sample.set_retained_tokens(3);
  sample.set_seed(42);
  v1::OpResponse sampled;
  ASSERT_OK(client_->Call(&Stub::SampleTokens, sample, &sampled));
  std::vector<int32_t> want(6);
  kernels::SampleTokensArgs oracle;
  oracle.layers = 1;
  oracle.batch = 2;
  oracle.original_tokens = sample.original_tokens();
  oracle.retained_tokens = 3;
  oracle.seed = 42;
  oracle.ids = kernels::TensorView::Contiguous(want.data(), DType::kInt32, {1, 2, 3});
  ASSERT_OK(kernels::cpu::SampleTokens(oracle, nullptr));
  ASSERT_EQ(sampled.outputs_size(), 1);
  ASSERT_EQ(sampled.outputs(0).tensor().inline_data().size(), want.size() * sizeof(int32_t));
  EXPECT_EQ(0, std::memcmp(sampled.outputs(0).tensor().inline_data().data(), want.data(),
                           want.size() * sizeof(int32_t)));
  ExpectStillServes();
}

// The wait caps' flags (--max_waits_per_session, --max_waits_per_peer,
// --max_waits): caps that do not nest (0 < session <= peer <= server)
// refuse to start, naming the flags; nested ones serve.
TEST_F(LimitsTest, WaitCapFlagsThatDoNotNestRefuseToStart) {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"--max_waits_per_session=0"},
           {"--max_waits_per_session=65"},
           {"--max_waits_per_peer=300"},
           {"--max_waits_per_session=4", "--max_waits_per_peer=16", "--max_waits=15"}}) {
    auto server = ServerProcess::Start({.extra_args = args, .wait_for_startup = false});
    ASSERT_OK(server);
    absl::StatusOr<int> code = (*server)->WaitForExit(absl::Seconds(30));
    ASSERT_OK(code);
    EXPECT_EQ(*code, 1) << args[0];
    EXPECT_THAT((*server)->Output(),
                HasSubstr("0 < --max_waits_per_session <= --max_waits_per_peer <= --max_waits"))
        << args[0];
  }
  StartServer(
      {.extra_args = {"--max_waits_per_session=1", "--max_waits_per_peer=1", "--max_waits=1"}});
  ExpectStillServes();
}

}  // namespace
}  // namespace tokensel::itest
