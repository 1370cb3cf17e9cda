// The Stream RPC in-process: pipelining, ordering, per-request errors,
// stream-scoped sessions and admission inside a stream.
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/grpc/grpc_test_util.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::server {
namespace {

using ::tokensel::server::testing::Bytes;
using ::tokensel::server::testing::FromBytes;
using ::tokensel::server::testing::InlineTensor;
using ::tokensel::server::testing::InProcessServer;
using ::tokensel::server::testing::StartServer;
using ::tokensel::server::testing::ToAbsl;
using ::tokensel::testing::StatusIs;

// Request i gathers row i % S of act[s,c] = 1000 i + 10 s + c (B = 1,
// S = 8, C = 4, R = 1), so every response is distinct and checkable.
constexpr int64_t kS = 8, kC = 4;

std::vector<int32_t> ActFor(int i) {
  std::vector<int32_t> act;
  for (int64_t s = 0; s < kS; ++s)
    for (int64_t c = 0; c < kC; ++c) act.push_back(static_cast<int32_t>(1000 * i + 10 * s + c));
  return act;
}

v1::StreamRequest GatherRequest(int i) {
  v1::StreamRequest req;
  req.set_request_id(1000 + i);
  v1::GatherTokensRequest* g = req.mutable_op()->mutable_gather_tokens();
  *g->mutable_activations() = InlineTensor(v1::DTYPE_INT32, {1, kS, kC}, Bytes(ActFor(i)));
  *g->mutable_indices() =
      InlineTensor(v1::DTYPE_INT64, {1, 1}, Bytes(std::vector<int64_t>{i % kS}));
  g->set_batch_first(true);
  return req;
}

std::vector<int32_t> ExpectedFor(int i) {
  const std::vector<int32_t> act = ActFor(i);
  const int64_t s = i % kS;
  return std::vector<int32_t>(act.begin() + s * kC, act.begin() + (s + 1) * kC);
}

// Writes `requests` from a separate thread while this one reads, so the
// server has many requests in flight; returns every response and the status.
struct StreamResult {
  std::vector<v1::StreamResponse> responses;
  absl::Status status;
};
StreamResult RunStream(v1::TokenSelect::Stub& stub, grpc::ClientContext* ctx,
                       const std::vector<v1::StreamRequest>& requests) {
  StreamResult result;
  auto stream = stub.Stream(ctx);
  std::thread writer([&] {
    for (const v1::StreamRequest& r : requests) {
      if (!stream->Write(r)) break;
    }
    stream->WritesDone();
  });
  v1::StreamResponse response;
  while (stream->Read(&response)) result.responses.push_back(response);
  writer.join();
  result.status = ToAbsl(stream->Finish());
  return result;
}

TEST(StreamTest, HundredPipelinedRequestsAnsweredInOrder) {
  auto s = StartServer();
  ASSERT_NE(s, nullptr);
  constexpr int kN = 100;
  std::vector<v1::StreamRequest> requests;
  for (int i = 0; i < kN; ++i) requests.push_back(GatherRequest(i));
  grpc::ClientContext ctx;  // no session: the stream gets its own
  StreamResult result = RunStream(s->stub(), &ctx, requests);
  ASSERT_OK(result.status);
  ASSERT_EQ(result.responses.size(), static_cast<size_t>(kN));
  for (int i = 0; i < kN; ++i) {
    const v1::StreamResponse& r = result.responses[i];
    SCOPED_TRACE(i);
    EXPECT_EQ(r.request_id(), 1000u + i);
    ASSERT_EQ(r.code(), 0) << r.message();
    ASSERT_TRUE(r.has_op());
    ASSERT_EQ(r.op().outputs_size(), 1);
    EXPECT_EQ(FromBytes<int32_t>(r.op().outputs(0).tensor().inline_data()), ExpectedFor(i));
  }
}

TEST(StreamTest, ErrorsAreAnsweredInPlaceAndTheStreamGoesOn) {
  auto s = StartServer();
  ASSERT_NE(s, nullptr);
  std::vector<v1::StreamRequest> requests;
  requests.push_back(GatherRequest(0));
  v1::StreamRequest empty;
  empty.set_request_id(7);
  requests.push_back(empty);
  v1::StreamRequest bad = GatherRequest(2);
  bad.mutable_op()->mutable_gather_tokens()->mutable_indices()->set_inline_data(
      Bytes(std::vector<int64_t>{kS}));  // out of range
  requests.push_back(bad);
  v1::StreamRequest unregister;
  unregister.set_request_id(9);
  unregister.mutable_unregister_buffer()->set_name("never-registered");
  requests.push_back(unregister);
  requests.push_back(GatherRequest(3));

  grpc::ClientContext ctx;
  StreamResult result = RunStream(s->stub(), &ctx, requests);
  ASSERT_OK(result.status);
  ASSERT_EQ(result.responses.size(), 5u);
  EXPECT_EQ(result.responses[0].code(), 0);
  EXPECT_EQ(result.responses[1].request_id(), 7u);
  EXPECT_EQ(result.responses[1].code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(result.responses[1].message(), ::testing::HasSubstr("request"));
  EXPECT_EQ(result.responses[2].code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(result.responses[2].message(), ::testing::HasSubstr("indices"));
  EXPECT_FALSE(result.responses[2].has_op());
  EXPECT_EQ(result.responses[3].code(), static_cast<int>(absl::StatusCode::kNotFound));
  EXPECT_EQ(result.responses[4].code(), 0);
  EXPECT_EQ(FromBytes<int32_t>(result.responses[4].op().outputs(0).tensor().inline_data()),
            ExpectedFor(3));
}

TEST(StreamTest, StreamScopedSessionEndsWithTheStream) {
  auto s = StartServer();
  ASSERT_NE(s, nullptr);
  {
    grpc::ClientContext ctx;
    StreamResult result = RunStream(s->stub(), &ctx, {GatherRequest(1)});
    ASSERT_OK(result.status);
  }
  // OnDone (which closes the session) runs just after the client sees the
  // status; wait for it without a time bound on correctness.
  for (const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
       s->server().sessions().count() != 0 && std::chrono::steady_clock::now() < deadline;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(s->server().sessions().count(), 0u);
}

TEST(StreamTest, SessionFromMetadataIsUsedAndKeptOpen) {
  auto s = StartServer();
  ASSERT_NE(s, nullptr);
  const std::string session = s->OpenSession();
  {
    auto ctx = InProcessServer::Context(session);
    StreamResult result = RunStream(s->stub(), ctx.get(), {GatherRequest(5)});
    ASSERT_OK(result.status);
    ASSERT_EQ(result.responses.size(), 1u);
    EXPECT_EQ(result.responses[0].code(), 0);
  }
  EXPECT_EQ(s->server().sessions().count(), 1u);
  auto ctx = InProcessServer::Context(session);
  v1::KeepAliveResponse response;
  EXPECT_OK(ToAbsl(s->stub().KeepAlive(ctx.get(), v1::KeepAliveRequest(), &response)));
}

TEST(StreamTest, UnknownSessionEndsTheStreamWithNotFound) {
  auto s = StartServer();
  ASSERT_NE(s, nullptr);
  auto ctx = InProcessServer::Context("ffffffffffffffffffffffffffffffff");
  StreamResult result = RunStream(s->stub(), ctx.get(), {GatherRequest(0)});
  EXPECT_THAT(result.status, StatusIs(absl::StatusCode::kNotFound));
  EXPECT_TRUE(result.responses.empty());
}

TEST(StreamTest, FullAdmissionIsAnsweredPerRequest) {
  ServerOptions options;
  options.max_inflight = 1;
  auto s = StartServer(options);
  ASSERT_NE(s, nullptr);
  absl::StatusOr<core::Admission::Ticket> held = s->server().admission().Admit();
  ASSERT_OK(held);
  grpc::ClientContext ctx;
  StreamResult result = RunStream(s->stub(), &ctx, {GatherRequest(0), GatherRequest(1)});
  ASSERT_OK(result.status);
  ASSERT_EQ(result.responses.size(), 2u);
  for (const v1::StreamResponse& r : result.responses) {
    EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
  }
  *held = core::Admission::Ticket();
  // Requests queued on a stream count as in flight, so with one slot only a
  // single request at a time is admitted.
  grpc::ClientContext ctx2;
  result = RunStream(s->stub(), &ctx2, {GatherRequest(1)});
  ASSERT_OK(result.status);
  ASSERT_EQ(result.responses.size(), 1u);
  EXPECT_EQ(result.responses[0].code(), 0);
}

TEST(StreamTest, ClientCancelEndsTheStream) {
  auto s = StartServer();
  ASSERT_NE(s, nullptr);
  grpc::ClientContext ctx;
  auto stream = s->stub().Stream(&ctx);
  ASSERT_TRUE(stream->Write(GatherRequest(0)));
  v1::StreamResponse response;
  ASSERT_TRUE(stream->Read(&response));
  EXPECT_EQ(response.code(), 0);
  ctx.TryCancel();
  EXPECT_THAT(ToAbsl(stream->Finish()), StatusIs(absl::StatusCode::kCancelled));
  for (const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
       s->server().sessions().count() != 0 && std::chrono::steady_clock::now() < deadline;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(s->server().sessions().count(), 0u);
}

}  // namespace
}  // namespace tokensel::server
