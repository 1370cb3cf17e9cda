// What operators see of a real server: the Prometheus /metrics page over a
// real HTTP GET (counters, histograms and gauges move with traffic), the
// grpc.health.v1 service (Check and Watch, NOT_SERVING or end of stream
// after SIGTERM) and server reflection.
#include <csignal>
#include <functional>
#include <string>
#include <vector>

#include "google/protobuf/descriptor.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "tests/server/integration/fixture.h"
#include "tests/server/integration/protos/reflection.grpc.pb.h"
#include "tests/testing/http_get.h"

namespace tokensel::itest {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
using ::tokensel::testing::HttpGet;
using ::tokensel::testing::MetricSum;
using ::tokensel::testing::MetricValue;
using Stub = v1::TokenSelect::Stub;
namespace health = ::grpc::health::v1;
namespace reflection = ::grpc::reflection::v1alpha;

class ObservabilityTest : public ServerFixture {
 protected:
  void SetUp() override { StartServer(); }

  std::string Metrics() {
    auto r = HttpGet(server_->metrics_port(), "/metrics");
    EXPECT_OK(r);
    if (!r.ok()) return "";
    EXPECT_EQ(r->status_code, 200);
    return r->body;
  }
  // Metrics are recorded as calls complete, possibly just after the client
  // saw the response: poll (bounded) until `ready` holds; returns the page.
  std::string WaitForMetrics(const std::function<bool(const std::string&)>& ready) {
    std::string text;
    for (int i = 0; i < 100; ++i) {
      text = Metrics();
      if (ready(text)) return text;
      absl::SleepFor(absl::Milliseconds(50));
    }
    ADD_FAILURE() << "metrics never reached the expected state; last page:\n" << text;
    return text;
  }
};

TEST_F(ObservabilityTest, MetricsMoveWithTraffic) {
  const std::string before = Metrics();
  ASSERT_THAT(before, HasSubstr("tokensel_build_info{"));
  EXPECT_EQ(MetricValue(before, "tokensel_sessions"), 1.0);
  EXPECT_EQ(MetricValue(before, "tokensel_registered_buffers"), 1.0);
  EXPECT_EQ(MetricValue(before, "tokensel_registered_bytes"), static_cast<double>(kArenaBytes));
  const double ok_before =
      MetricSum(before, "tokensel_requests_total", {"GatherTokens\"", "code=\"OK\""});
  const double hist_before =
      MetricSum(before, "tokensel_op_duration_seconds_count", {"op=\"GatherTokens\""});
  const double bytes_before =
      MetricSum(before, "tokensel_bytes_moved_total", {"op=\"GatherTokens\""});

  constexpr int kGathers = 5;
  for (int i = 0; i < kGathers; ++i) ExpectStillServes();
  v1::GatherTokensRequest bad;  // no tensors at all
  v1::OpResponse resp;
  EXPECT_THAT(client_->Call(&Stub::GatherTokens, bad, &resp),
              StatusIs(absl::StatusCode::kInvalidArgument));

  const std::string after = WaitForMetrics([&](const std::string& text) {
    return MetricSum(text, "tokensel_requests_total", {"GatherTokens\"", "code=\"OK\""}) >=
               ok_before + kGathers &&
           MetricSum(text, "tokensel_requests_total",
                     {"GatherTokens\"", "code=\"INVALID_ARGUMENT\""}) >= 1;
  });
  EXPECT_GE(MetricSum(after, "tokensel_op_duration_seconds_count", {"op=\"GatherTokens\""}),
            hist_before + kGathers);
  EXPECT_GT(MetricSum(after, "tokensel_op_duration_seconds_bucket", {"op=\"GatherTokens\""}), 0);
  // Each gather moves at least its output: 2*5*8 fp32 = 320 bytes.
  EXPECT_GE(MetricSum(after, "tokensel_bytes_moved_total", {"op=\"GatherTokens\""}),
            bytes_before + kGathers * 320);
  EXPECT_GE(MetricSum(after, "tokensel_rpc_duration_seconds_count", {"GatherTokens\""}),
            kGathers + 1);
  EXPECT_THAT(after, HasSubstr("tokensel_inflight_requests"));

  // Gauges follow state: a second session with its own buffer, then closed.
  Client other(server_->UnixChannel());
  other.set_fd_channel(server_->fd_channel_path());
  ASSERT_OK(other.Open());
  ASSERT_OK(other.Register("arena", shm_.name(), 4096, 8192));
  WaitForMetrics([](const std::string& text) {
    return MetricValue(text, "tokensel_sessions") == 2.0 &&
           MetricValue(text, "tokensel_registered_buffers") == 2.0;
  });
  v1::CloseSessionResponse closed;
  ASSERT_OK(other.Call(&Stub::CloseSession, v1::CloseSessionRequest(), &closed));
  WaitForMetrics([](const std::string& text) {
    return MetricValue(text, "tokensel_sessions") == 1.0 &&
           MetricValue(text, "tokensel_registered_buffers") == 1.0;
  });
}

TEST_F(ObservabilityTest, HealthCheckOnBothTransports) {
  for (auto channel : {server_->UnixChannel(), server_->TcpChannel()}) {
    auto stub = health::Health::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    health::HealthCheckResponse resp;
    ASSERT_OK(ToAbsl(stub->Check(&ctx, health::HealthCheckRequest(), &resp)));
    EXPECT_EQ(resp.status(), health::HealthCheckResponse::SERVING);
  }
}

TEST_F(ObservabilityTest, HealthWatchSeesServingThenShutdown) {
  auto stub = health::Health::NewStub(server_->TcpChannel());
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
  auto reader = stub->Watch(&ctx, health::HealthCheckRequest());
  health::HealthCheckResponse resp;
  ASSERT_TRUE(reader->Read(&resp));
  EXPECT_EQ(resp.status(), health::HealthCheckResponse::SERVING);

  ASSERT_OK(server_->Signal(SIGTERM));
  // Either an explicit NOT_SERVING, or the stream ends with the server.
  bool saw_not_serving = false;
  for (int i = 0; i < 10 && reader->Read(&resp); ++i) {
    if (resp.status() == health::HealthCheckResponse::NOT_SERVING) {
      saw_not_serving = true;
      break;
    }
  }
  if (!saw_not_serving) {
    const grpc::Status s = reader->Finish();
    EXPECT_NE(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
        << "the Watch stream neither said NOT_SERVING nor ended after SIGTERM";
  } else {
    ctx.TryCancel();
    reader->Finish();
  }
  auto code = server_->WaitForExit(absl::Seconds(15));
  ASSERT_OK(code);
  EXPECT_EQ(*code, 0);
}

TEST_F(ObservabilityTest, ReflectionListsTheService) {
  auto stub = reflection::ServerReflection::NewStub(server_->UnixChannel());
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  auto stream = stub->ServerReflectionInfo(&ctx);

  reflection::ServerReflectionRequest list;
  list.set_list_services("*");
  ASSERT_TRUE(stream->Write(list));
  reflection::ServerReflectionResponse resp;
  ASSERT_TRUE(stream->Read(&resp));
  std::vector<std::string> names;
  for (const auto& s : resp.list_services_response().service()) names.push_back(s.name());
  EXPECT_THAT(names, Contains("tokensel.v1.TokenSelect"));
  EXPECT_THAT(names, Contains("grpc.health.v1.Health"));

  // The service's file descriptor is served too (what grpcurl needs).
  reflection::ServerReflectionRequest file;
  file.set_file_containing_symbol("tokensel.v1.TokenSelect");
  ASSERT_TRUE(stream->Write(file));
  ASSERT_TRUE(stream->Read(&resp));
  ASSERT_TRUE(resp.has_file_descriptor_response()) << resp.DebugString();
  bool found_gather = false;
  for (const std::string& bytes : resp.file_descriptor_response().file_descriptor_proto()) {
    google::protobuf::FileDescriptorProto fd;
    ASSERT_TRUE(fd.ParseFromString(bytes));
    if (fd.package() != "tokensel.v1") continue;
    for (const auto& service : fd.service()) {
      if (service.name() != "TokenSelect") continue;
      for (const auto& method : service.method()) found_gather |= method.name() == "GatherTokens";
    }
  }
  EXPECT_TRUE(found_gather);
  stream->WritesDone();
  EXPECT_OK(ToAbsl(stream->Finish()));
}

}  // namespace
}  // namespace tokensel::itest
