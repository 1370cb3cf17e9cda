// Ops through tokensel::client against a real tokensel-server, checked
// against the CPU operators (kernels/cpu) run on local copies: by reference
// on a SharedRegion, inline through TensorRef, Execute and Stream; error
// statuses and deadlines as absl codes.
#include <signal.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/tensor_view.h"
#include "tests/kernels/gather_reference.h"
#include "tests/testing/server_process.h"
#include "tests/testing/status_matchers.h"
#include "tokensel/client/client.h"
#include "tokensel/client/session.h"
#include "tokensel/client/shared_region.h"
#include "tokensel/client/tensor_ref.h"

namespace tokensel::client {
namespace {

using kernels::DType;
using kernels::TensorView;
using ::tokensel::testing::ServerProcess;
using ::tokensel::testing::StatusIs;

constexpr uint64_t kRegionBytes = 1 << 20;

class ClientOpsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<std::unique_ptr<ServerProcess>> server = ServerProcess::Start();
    ASSERT_OK(server.status());
    server_ = std::move(server).value().release();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }

  void SetUp() override {
    ASSERT_NE(server_, nullptr);
    absl::StatusOr<Client> client = Client::Connect(server_->unix_target());
    ASSERT_OK(client.status());
    client_ = *client;
    absl::StatusOr<std::unique_ptr<Session>> session = Session::Open(*client_);
    ASSERT_OK(session.status());
    session_ = std::move(session).value();
    absl::StatusOr<SharedRegion> region =
        SharedRegion::Create(SharedRegion::UniqueName(server_->shm_prefix(), "ops"), kRegionBytes,
                             {.required_prefix = server_->shm_prefix()});
    ASSERT_OK(region.status());
    region_ = std::make_unique<SharedRegion>(std::move(region).value());
    std::uniform_int_distribution<int> byte(0, 255);
    for (uint64_t i = 0; i < kRegionBytes; ++i) {
      region_->data()[i] = static_cast<uint8_t>(byte(rng_));
    }
    ASSERT_OK(session_->RegisterBuffer(region_->RegisterRequest("region")).status());
  }

  // Unique ids in [0, range) for each of `rows` rows of `r`.
  std::vector<int64_t> UniqueRows(int64_t rows, int64_t r, int64_t range) {
    std::vector<int64_t> all(range), out;
    for (int64_t i = 0; i < rows; ++i) {
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng_);
      out.insert(out.end(), all.begin(), all.begin() + r);
    }
    return out;
  }

  static ServerProcess* server_;
  std::optional<Client> client_;
  std::unique_ptr<Session> session_;
  std::unique_ptr<SharedRegion> region_;
  std::mt19937_64 rng_{20240611};
};
ServerProcess* ClientOpsTest::server_ = nullptr;

// Strided fp32 activations, misaligned int64 indices and a row-major output,
// all inside one registered region; the oracle runs on a copy of the region
// and the whole region must match byte for byte afterwards.
TEST_F(ClientOpsTest, GatherByReferenceMatchesCpuOracle) {
  for (bool batch_first : {true, false}) {
    SCOPED_TRACE(batch_first ? "batch_first" : "seq_first");
    const int64_t B = 3, S = 37, C = 19, R = 11;
    const int64_t d0 = batch_first ? B : S, d1 = batch_first ? S : B;
    const std::vector<int64_t> act_shape = {d0, d1, C};
    const std::vector<int64_t> act_strides = {d1 * (C + 1) + 5, C + 1, 1};
    const uint64_t act_offset = 64;
    const uint64_t idx_offset = 64 * 1024 + 4;  // not 8-byte aligned
    const uint64_t out_offset = 128 * 1024;
    const std::vector<int64_t> out_shape = {batch_first ? B : R, batch_first ? R : B, C};

    const std::vector<int64_t> ids = UniqueRows(B, R, S);
    std::memcpy(region_->data() + idx_offset, ids.data(), ids.size() * sizeof(int64_t));
    std::vector<uint8_t> oracle(region_->data(), region_->data() + kRegionBytes);
    ASSERT_OK(kernels::cpu::GatherTokens(
        {TensorView::Strided(oracle.data() + act_offset, DType::kFloat32, act_shape, act_strides),
         TensorView::Contiguous(oracle.data() + idx_offset, DType::kInt64, {B, R}),
         TensorView::Contiguous(oracle.data() + out_offset, DType::kFloat32, out_shape),
         batch_first},
        nullptr));

    v1::GatherTokensRequest req;
    *req.mutable_activations() = TensorRef::InBuffer("region", act_offset)
                                     .Dtype(v1::DTYPE_FLOAT32)
                                     .Shape(act_shape)
                                     .Strides(act_strides)
                                     .ToProto();
    *req.mutable_indices() =
        TensorRef::InBuffer("region", idx_offset).Dtype(v1::DTYPE_INT64).Shape({B, R}).ToProto();
    *req.mutable_out() = TensorRef::InBuffer("region", out_offset)
                             .Dtype(v1::DTYPE_FLOAT32)
                             .Shape(out_shape)
                             .ToProto();
    req.set_batch_first(batch_first);
    absl::StatusOr<v1::OpResponse> resp = session_->client().GatherTokens(req);
    ASSERT_OK(resp.status());
    EXPECT_EQ(resp->outputs_size(), 0);  // written in place
    EXPECT_EQ(std::memcmp(oracle.data(), region_->data(), kRegionBytes), 0);
  }
}

// The same through the naive reference of tests/kernels (independent of
// kernels/), so a CPU kernel bug cannot make the oracle agree with the
// server; batch_first left unset (documented default: true).
TEST_F(ClientOpsTest, GatherByReferenceMatchesNaiveReference) {
  const int64_t B = 2, S = 13, C = 7, R = 5;
  const std::vector<int64_t> act_strides = {S * (C + 2), C + 2, 1};
  const uint64_t act_offset = 256 + 2, idx_offset = 32 * 1024, out_offset = 64 * 1024 + 6;
  const std::vector<int64_t> ids = UniqueRows(B, R, S);
  std::memcpy(region_->data() + idx_offset, ids.data(), ids.size() * sizeof(int64_t));
  std::vector<uint8_t> want(region_->data(), region_->data() + kRegionBytes);
  testing::RefGather(
      TensorView::Strided(want.data() + act_offset, DType::kFloat16, {B, S, C}, act_strides),
      TensorView::Contiguous(want.data() + idx_offset, DType::kInt64, {B, R}),
      TensorView::Contiguous(want.data() + out_offset, DType::kFloat16, {B, R, C}), true);
  v1::GatherTokensRequest req;
  *req.mutable_activations() = TensorRef::InBuffer("region", act_offset)
                                   .Dtype(v1::DTYPE_FLOAT16)
                                   .Shape({B, S, C})
                                   .Strides(act_strides)
                                   .ToProto();
  *req.mutable_indices() =
      TensorRef::InBuffer("region", idx_offset).Dtype(v1::DTYPE_INT64).Shape({B, R}).ToProto();
  *req.mutable_out() =
      TensorRef::InBuffer("region", out_offset).Dtype(v1::DTYPE_FLOAT16).Shape({B, R, C}).ToProto();
  absl::StatusOr<v1::OpResponse> resp = session_->client().GatherTokens(req);
  ASSERT_OK(resp.status());
  EXPECT_EQ(std::memcmp(want.data(), region_->data(), kRegionBytes), 0);
}

TEST_F(ClientOpsTest, InlineSortScatterTopKMatchCpuOracle) {
  const Client client = session_->client();
  {  // SortTokens: inline ids, inline out and inverse.
    const int64_t rows = 4, R = 9, S = 50;
    const std::vector<int64_t> wide = UniqueRows(rows, R, S);
    const std::vector<int32_t> ids(wide.begin(), wide.end());
    std::vector<int32_t> out(ids.size()), inverse(rows * S);
    ASSERT_OK(kernels::cpu::SortTokens(
        {TensorView::Contiguous(const_cast<int32_t*>(ids.data()), DType::kInt32, {rows, R}), S,
         TensorView::Contiguous(out.data(), DType::kInt32, {rows, R}),
         TensorView::Contiguous(inverse.data(), DType::kInt32, {rows, S})},
        nullptr));
    v1::SortTokensRequest req;
    *req.mutable_ids() = TensorRef::InlineValues<int32_t>(ids, {rows, R}).ToProto();
    req.set_original_tokens(S);
    *req.mutable_out() = TensorRef::InlineOutput().ToProto();
    *req.mutable_inverse() = TensorRef::InlineOutput().ToProto();
    absl::StatusOr<v1::OpResponse> resp = client.SortTokens(req);
    ASSERT_OK(resp.status());
    EXPECT_EQ(OutputValues<int32_t>(*resp, "out").value_or(std::vector<int32_t>{}), out);
    EXPECT_EQ(OutputValues<int32_t>(*resp, "inverse").value_or(std::vector<int32_t>{}), inverse);
  }
  {  // ScatterTokens: inline all (returned as "all"), layer and indices.
    const int64_t B = 2, S = 13, C = 5, R = 6;
    std::normal_distribution<float> normal;
    std::vector<float> all(B * S * C), layer(B * R * C);
    for (float& v : all) v = normal(rng_);
    for (float& v : layer) v = normal(rng_);
    const std::vector<int64_t> idx = UniqueRows(B, R, S);
    v1::ScatterTokensRequest req;
    *req.mutable_all() = TensorRef::InlineValues<float>(all, {B, S, C}).ToProto();
    *req.mutable_layer() = TensorRef::InlineValues<float>(layer, {B, R, C}).ToProto();
    *req.mutable_indices() = TensorRef::InlineValues<int64_t>(idx, {B, R}).ToProto();
    ASSERT_OK(kernels::cpu::ScatterTokens(
        {TensorView::Contiguous(all.data(), DType::kFloat32, {B, S, C}),
         TensorView::Contiguous(layer.data(), DType::kFloat32, {B, R, C}),
         TensorView::Contiguous(const_cast<int64_t*>(idx.data()), DType::kInt64, {B, R}), true},
        nullptr));
    absl::StatusOr<v1::OpResponse> resp = client.ScatterTokens(req);
    ASSERT_OK(resp.status());
    EXPECT_EQ(OutputValues<float>(*resp, "all").value_or(std::vector<float>{}), all);
  }
  {  // TopKTokens: ids absent -> inline int32.
    const int64_t rows = 3, S = 40, R = 7;
    std::vector<float> scores(rows * S);
    std::uniform_int_distribution<int> small(0, 9);  // ties on purpose
    for (float& v : scores) v = static_cast<float>(small(rng_));
    std::vector<int32_t> ids(rows * R);
    ASSERT_OK(
        kernels::cpu::TopKTokens({TensorView::Contiguous(scores.data(), DType::kFloat32, {rows, S}),
                                  TensorView::Contiguous(ids.data(), DType::kInt32, {rows, R})},
                                 nullptr));
    v1::TopKTokensRequest req;
    *req.mutable_scores() = TensorRef::InlineValues<float>(scores, {rows, S}).ToProto();
    req.set_retained_tokens(R);
    absl::StatusOr<v1::OpResponse> resp = client.TopKTokens(req);
    ASSERT_OK(resp.status());
    EXPECT_EQ(OutputValues<int32_t>(*resp, "ids").value_or(std::vector<int32_t>{}), ids);

    // The same op through Execute, RunOp and a Stream gives the same ids.
    v1::Op op;
    *op.mutable_top_k_tokens() = req;
    v1::ExecuteRequest exec;
    *exec.add_ops() = op;
    *exec.add_ops() = op;
    absl::StatusOr<v1::ExecuteResponse> executed = client.Execute(exec);
    ASSERT_OK(executed.status());
    ASSERT_EQ(executed->results_size(), 2);
    EXPECT_EQ(OutputValues<int32_t>(executed->results(1), "ids").value_or(std::vector<int32_t>{}),
              ids);
    // CUDA IPC events travel in the request the client passes; this (CPU)
    // server refuses them naming the field, before running anything.
    v1::ExecuteRequest with_event = exec;
    with_event.set_record_event(std::string(64, '\x01'));
    EXPECT_THAT(client.Execute(with_event).status(),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         "record_event: CUDA IPC events need the cuda backend"));
    absl::StatusOr<v1::OpResponse> ran = client.RunOp(op);
    ASSERT_OK(ran.status());
    EXPECT_EQ(OutputValues<int32_t>(*ran, "ids").value_or(std::vector<int32_t>{}), ids);

    absl::StatusOr<std::unique_ptr<OpStream>> stream = client.OpenStream();
    ASSERT_OK(stream.status());
    v1::StreamRequest sreq;
    sreq.set_request_id(41);
    *sreq.mutable_op() = op;
    absl::StatusOr<v1::StreamResponse> sresp = (*stream)->Call(sreq);
    ASSERT_OK(sresp.status());
    EXPECT_EQ(sresp->request_id(), 41u);
    EXPECT_EQ(sresp->code(), 0) << sresp->message();
    EXPECT_EQ(OutputValues<int32_t>(sresp->op(), "ids").value_or(std::vector<int32_t>{}), ids);
    sreq.set_request_id(42);
    sreq.mutable_op()->mutable_top_k_tokens()->set_retained_tokens(S + 1);  // R > S
    sresp = (*stream)->Call(sreq);
    ASSERT_OK(sresp.status());
    EXPECT_EQ(sresp->code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
    EXPECT_OK((*stream)->Finish());
    EXPECT_OK((*stream)->Finish());
  }
  EXPECT_THAT(client.RunOp(v1::Op()).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "no operator"));
}

// The server's codes and messages come back unchanged as absl statuses.
TEST_F(ClientOpsTest, ErrorsAreAbslStatusesWithTheServerMessage) {
  const Client client = session_->client();
  const std::vector<float> acts(2 * 4 * 3, 1.0f);
  v1::GatherTokensRequest req;
  *req.mutable_activations() = TensorRef::InlineValues<float>(acts, {2, 4, 3}).ToProto();
  *req.mutable_indices() = TensorRef::InlineValues<float>({0, 1, 2, 3}, {2, 2}).ToProto();
  EXPECT_THAT(client.GatherTokens(req).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "indices"));

  *req.mutable_indices() =
      TensorRef::InBuffer("nope", 0).Dtype(v1::DTYPE_INT32).Shape({2, 2}).ToProto();
  EXPECT_THAT(client.GatherTokens(req).status(), StatusIs(absl::StatusCode::kNotFound, "nope"));

  *req.mutable_indices() = TensorRef::InBuffer("region", kRegionBytes - 8)
                               .Dtype(v1::DTYPE_INT32)
                               .Shape({2, 2})
                               .ToProto();
  EXPECT_THAT(client.GatherTokens(req).status(), StatusIs(absl::StatusCode::kOutOfRange));

  EXPECT_THAT(session_->RegisterBuffer(region_->RegisterRequest("region")).status(),
              StatusIs(absl::StatusCode::kAlreadyExists, "region"));
  // A name this process cannot open: the library says so before any RPC.
  v1::RegisterBufferRequest missing;
  missing.set_name("missing");
  missing.mutable_host_shm()->set_shm_name("/tokensel-no-such-object");
  missing.mutable_host_shm()->set_size(64);
  EXPECT_THAT(session_->RegisterBuffer(missing).status(),
              StatusIs(absl::StatusCode::kNotFound, "No such file"));
  EXPECT_TRUE(session_->registrations().size() == 1);
}

// True once /proc/<pid>/stat shows state T (stopped): kill(SIGSTOP) returns
// before every thread of the process has stopped.
bool WaitUntilStopped(pid_t pid, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  const std::string path = absl::StrCat("/proc/", pid, "/stat");
  while (absl::Now() < deadline) {
    std::ifstream stat(path);
    std::string content((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    const size_t paren = content.rfind(')');  // "pid (comm) state ..."
    if (paren != std::string::npos && paren + 2 < content.size() && content[paren + 2] == 'T') {
      return true;
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  return false;
}

// A server that accepts but does not answer (SIGSTOP): the call ends at its
// deadline with DEADLINE_EXCEEDED, and the same channel works once it runs.
TEST_F(ClientOpsTest, DeadlineExceededIsAbslDeadlineExceeded) {
  const Client hurried = session_->client().WithDeadline(absl::Milliseconds(300));
  ASSERT_OK(hurried.Ping());  // connected
  ASSERT_OK(server_->Signal(SIGSTOP));
  struct Resume {
    ~Resume() { server->Signal(SIGCONT).IgnoreError(); }
    ServerProcess* server;
  } resume{server_};
  ASSERT_TRUE(WaitUntilStopped(server_->pid(), absl::Seconds(5)));
  const absl::Time start = absl::Now();
  EXPECT_THAT(hurried.Ping(), StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_THAT(hurried.ListBuffers().status(), StatusIs(absl::StatusCode::kDeadlineExceeded));
  const absl::Duration waited = absl::Now() - start;
  EXPECT_GE(waited, absl::Milliseconds(550));
  // The deadline ended the calls (not the 300 s test timeout); how close to
  // it is a latency question for a benchmark, not a bound to gate CI on.
  EXPECT_LT(waited, absl::Seconds(60));
  ASSERT_OK(server_->Signal(SIGCONT));
  EXPECT_OK(hurried.WithDeadline(absl::Seconds(20)).Ping());
}

TEST_F(ClientOpsTest, TcpTargetWorks) {
  absl::StatusOr<Client> tcp = Client::Connect(server_->tcp_target());
  ASSERT_OK(tcp.status());
  absl::StatusOr<v1::ServerInfo> info = tcp->GetServerInfo();
  ASSERT_OK(info.status());
  EXPECT_EQ(info->shm_prefix(), server_->shm_prefix());
  // A session belongs to its opener: the unix session's id is refused on the
  // TCP connection (another peer), and a TCP session cannot be handed memory.
  EXPECT_THAT(tcp->WithSession(session_->id()).ListBuffers().status(),
              StatusIs(absl::StatusCode::kPermissionDenied, "another peer"));
  absl::StatusOr<v1::OpenSessionResponse> own = tcp->OpenSession({});
  ASSERT_OK(own.status());
  EXPECT_OK(tcp->WithSession(own->session_id()).ListBuffers().status());
  EXPECT_THAT(
      tcp->WithSession(own->session_id()).RegisterBuffer(region_->RegisterRequest("x")).status(),
      StatusIs(absl::StatusCode::kFailedPrecondition, "not a unix socket"));
}

}  // namespace
}  // namespace tokensel::client
