// The whole server in-process: unary RPCs, sessions, buffers, health,
// reflection, admission and metrics, over a unix socket.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "tests/server/grpc/grpc_test_util.h"
#include "tests/testing/status_matchers.h"
#include "tokensel/client/fd_channel.h"

namespace tokensel::server {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
using ::tokensel::server::testing::Bytes;
using ::tokensel::server::testing::FromBytes;
using ::tokensel::server::testing::HealthCheck;
using ::tokensel::server::testing::InlineTensor;
using ::tokensel::server::testing::InProcessServer;
using ::tokensel::server::testing::ReflectionListServices;
using ::tokensel::testing::StatusIs;

using ::tokensel::server::testing::kNotServing;
using ::tokensel::server::testing::kServing;
using ::tokensel::server::testing::StartServer;
using ::tokensel::server::testing::ToAbsl;

// act[b,s,c] = 100b + 10s + c (fp32 [B,S,C]); indices int32 [B,R].
struct GatherCase {
  int64_t b = 2, s = 5, c = 3, r = 2;
  std::vector<float> act;
  std::vector<int32_t> idx;
  GatherCase(std::vector<int32_t> indices) : idx(std::move(indices)) {
    for (int64_t i = 0; i < b; ++i)
      for (int64_t j = 0; j < s; ++j)
        for (int64_t k = 0; k < c; ++k) act.push_back(static_cast<float>(100 * i + 10 * j + k));
  }
  v1::GatherTokensRequest InlineRequest() const {
    v1::GatherTokensRequest req;
    *req.mutable_activations() = InlineTensor(v1::DTYPE_FLOAT32, {b, s, c}, Bytes(act));
    *req.mutable_indices() = InlineTensor(v1::DTYPE_INT32, {b, r}, Bytes(idx));
    req.set_batch_first(true);
    return req;
  }
  // The naive reference: out[b,r,:] = act[b, idx[b,r], :].
  std::vector<float> Expected() const {
    std::vector<float> out;
    for (int64_t i = 0; i < b; ++i)
      for (int64_t j = 0; j < r; ++j)
        for (int64_t k = 0; k < c; ++k) out.push_back(act[(i * s + idx[i * r + j]) * c + k]);
    return out;
  }
};

TEST(ServerTest, PingAndServerInfoNeedNoSession) {
  ServerOptions options;
  options.max_inflight = 7;
  options.max_buffers = 5;
  options.session_ttl = absl::Seconds(42);
  auto s = StartServer(options);
  ASSERT_NE(s, nullptr);
  {
    grpc::ClientContext ctx;
    v1::PingResponse response;
    EXPECT_OK(ToAbsl(s->stub().Ping(&ctx, v1::PingRequest(), &response)));
  }
  grpc::ClientContext ctx;
  v1::ServerInfo info;
  ASSERT_OK(ToAbsl(s->stub().GetServerInfo(&ctx, v1::GetServerInfoRequest(), &info)));
  EXPECT_EQ(info.backend(), "cpu");
  EXPECT_FALSE(info.version().empty());
  EXPECT_EQ(info.limits().max_inflight(), 7u);
  EXPECT_EQ(info.limits().max_buffers_per_session(), 5u);
  EXPECT_EQ(info.limits().session_ttl_ms(), 42000u);
  EXPECT_EQ(info.limits().max_message_bytes(), 64u << 20);
  EXPECT_EQ(info.limits().max_rank(), 6u);
  EXPECT_EQ(info.shm_prefix(), "/tokensel");
  EXPECT_THAT(info.memory_kinds(), Contains("host_shm"));
  EXPECT_EQ(info.devices_size(), 0);
  EXPECT_FALSE(info.ipc_events()) << "the CPU backend serves no IPC events";
  EXPECT_EQ(info.limits().max_async_executes_per_session(), 0u);
}

TEST(ServerTest, SessionLifecycle) {
  auto s = StartServer();
  ASSERT_NE(s, nullptr);
  const std::string session = s->OpenSession();
  ASSERT_FALSE(session.empty());
  EXPECT_EQ(s->server().sessions().count(), 1u);
  {
    auto ctx = InProcessServer::Context(session);
    v1::KeepAliveResponse response;
    ASSERT_OK(ToAbsl(s->stub().KeepAlive(ctx.get(), v1::KeepAliveRequest(), &response)));
    EXPECT_EQ(response.lease_ttl_ms(), 60000u);
  }
  {
    auto ctx = InProcessServer::Context(session);
    v1::ListBuffersResponse response;
    ASSERT_OK(ToAbsl(s->stub().ListBuffers(ctx.get(), v1::ListBuffersRequest(), &response)));
    EXPECT_EQ(response.buffers_size(), 0);
  }
  {
    auto ctx = InProcessServer::Context(session);
    v1::CloseSessionResponse response;
    ASSERT_OK(ToAbsl(s->stub().CloseSession(ctx.get(), v1::CloseSessionRequest(), &response)));
  }
  EXPECT_EQ(s->server().sessions().count(), 0u);
  auto ctx = InProcessServer::Context(session);
  v1::KeepAliveResponse response;
  EXPECT_THAT(ToAbsl(s->stub().KeepAlive(ctx.get(), v1::KeepAliveRequest(), &response)),
              StatusIs(absl::StatusCode::kNotFound));
}

TEST(ServerTest, MissingOrUnknownSessionMetadata) {
  auto s = StartServer();
  ASSERT_NE(s, nullptr);
  const GatherCase g({0, 1, 2, 3});
  {
    grpc::ClientContext ctx;  // no metadata
    v1::OpResponse response;
    EXPECT_THAT(ToAbsl(s->stub().GatherTokens(&ctx, g.InlineRequest(), &response)),
                StatusIs(absl::StatusCode::kInvalidArgument, "missing tokensel-session metadata"));
  }
  auto ctx = InProcessServer::Context("0123456789abcdef0123456789abcdef");
  v1::OpResponse response;
  EXPECT_THAT(ToAbsl(s->stub().GatherTokens(ctx.get(), g.InlineRequest(), &response)),
              StatusIs(absl::StatusCode::kNotFound));
  // Still serving.
  grpc::ClientContext ping;
  v1::PingResponse pong;
  EXPECT_OK(ToAbsl(s->stub().Ping(&ping, v1::PingRequest(), &pong)));
}

TEST(ServerTest, InlineGatherTokensMatchesTheReference) {
  auto s = StartServer();
  ASSERT_NE(s, nullptr);
  const std::string session = s->OpenSession();
  const GatherCase g({4, 0, 3, 3});
  auto ctx = InProcessServer::Context(session);
  v1::OpResponse response;
  ASSERT_OK(ToAbsl(s->stub().GatherTokens(ctx.get(), g.InlineRequest(), &response)));
  ASSERT_EQ(response.outputs_size(), 1);
  EXPECT_EQ(response.outputs(0).name(), "out");
  const v1::Tensor& out = response.outputs(0).tensor();
  EXPECT_EQ(out.dtype(), v1::DTYPE_FLOAT32);
  EXPECT_THAT(out.shape(), ::testing::ElementsAre(2, 2, 3));
  EXPECT_EQ(FromBytes<float>(out.inline_data()), g.Expected());
}

TEST(ServerTest, BadOpInputIsInvalidArgumentAndNothingBreaks) {
  auto s = StartServer();
  ASSERT_NE(s, nullptr);
  const std::string session = s->OpenSession();
  const GatherCase bad({0, 9, 1, 1});  // 9 >= S = 5
  auto ctx = InProcessServer::Context(session);
  v1::OpResponse response;
  const absl::Status status =
      ToAbsl(s->stub().GatherTokens(ctx.get(), bad.InlineRequest(), &response));
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kInvalidArgument, "indices"));
  EXPECT_EQ(response.outputs_size(), 0);
  const GatherCase good({1, 2, 3, 4});
  auto ctx2 = InProcessServer::Context(session);
  EXPECT_OK(ToAbsl(s->stub().GatherTokens(ctx2.get(), good.InlineRequest(), &response)));
}

// A POSIX shm object under the server's prefix, unlinked when destroyed.
class ShmObject {
 public:
  explicit ShmObject(size_t size)
      : name_(absl::StrCat("/tokensel-s3test-", ::getpid())), size_(size) {
    fd_ = ::shm_open(name_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    EXPECT_GE(fd_, 0) << std::strerror(errno);
    EXPECT_EQ(::ftruncate(fd_, static_cast<off_t>(size)), 0);
    data_ = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  }
  ~ShmObject() {
    ::munmap(data_, size_);
    ::close(fd_);
    ::shm_unlink(name_.c_str());
  }
  const std::string& name() const { return name_; }
  int fd() const { return fd_; }
  char* data() const { return static_cast<char*>(data_); }

 private:
  std::string name_;
  size_t size_;
  void* data_;
  int fd_ = -1;
};

TEST(ServerTest, BuffersRegisterGatherByReferenceAndUnregister) {
  auto s = StartServer();
  ASSERT_NE(s, nullptr);
  const std::string session = s->OpenSession();
  ShmObject shm(4096);
  const GatherCase g({2, 2, 0, 4});
  std::memcpy(shm.data(), g.act.data(), g.act.size() * sizeof(float));
  constexpr uint64_t kIdxOffset = 1024, kOutOffset = 2048;
  std::memcpy(shm.data() + kIdxOffset, g.idx.data(), g.idx.size() * sizeof(int32_t));

  {
    // By name: refused (the server would open it with its own rights).
    v1::RegisterBufferRequest req;
    req.set_name("arena");
    req.mutable_host_shm()->set_shm_name(shm.name());
    req.mutable_host_shm()->set_size(4096);
    auto ctx = InProcessServer::Context(session);
    v1::RegisterBufferResponse response;
    EXPECT_THAT(ToAbsl(s->stub().RegisterBuffer(ctx.get(), req, &response)),
                StatusIs(absl::StatusCode::kPermissionDenied, "registration by name is refused"));
    // By descriptor, over the fd channel beside the socket.
    absl::StatusOr<v1::FdChannelReply> reply = client::SendFd(
        client::FdChannelPath(s->address()), session, v1::FD_KIND_HOST_MEMORY, shm.fd());
    ASSERT_OK(reply);
    EXPECT_EQ(reply->object_size(), 4096u);
    EXPECT_FALSE(reply->sealed());
    req.mutable_fd()->set_ticket(reply->ticket());
    req.mutable_fd()->set_size(4096);
    auto ctx2 = InProcessServer::Context(session);
    ASSERT_OK(ToAbsl(s->stub().RegisterBuffer(ctx2.get(), req, &response)));
    EXPECT_EQ(response.buffer().name(), "arena");
    EXPECT_EQ(response.buffer().kind(), "host_shm");
    EXPECT_EQ(response.buffer().size(), 4096u);
    // A ticket is good once.
    auto ctx3 = InProcessServer::Context(session);
    req.set_name("again");
    EXPECT_THAT(ToAbsl(s->stub().RegisterBuffer(ctx3.get(), req, &response)),
                StatusIs(absl::StatusCode::kNotFound, "fd.ticket"));
  }
  {
    auto ctx = InProcessServer::Context(session);
    v1::ListBuffersResponse response;
    ASSERT_OK(ToAbsl(s->stub().ListBuffers(ctx.get(), v1::ListBuffersRequest(), &response)));
    ASSERT_EQ(response.buffers_size(), 1);
    EXPECT_EQ(response.buffers(0).name(), "arena");
  }
  {
    auto slice = [](v1::DType dtype, std::vector<int64_t> shape, uint64_t offset) {
      v1::Tensor t;
      t.set_dtype(dtype);
      for (int64_t d : shape) t.add_shape(d);
      t.mutable_buffer()->set_buffer("arena");
      t.mutable_buffer()->set_byte_offset(offset);
      return t;
    };
    v1::GatherTokensRequest req;
    *req.mutable_activations() = slice(v1::DTYPE_FLOAT32, {g.b, g.s, g.c}, 0);
    *req.mutable_indices() = slice(v1::DTYPE_INT32, {g.b, g.r}, kIdxOffset);
    *req.mutable_out() = slice(v1::DTYPE_FLOAT32, {g.b, g.r, g.c}, kOutOffset);
    req.set_batch_first(true);
    auto ctx = InProcessServer::Context(session);
    v1::OpResponse response;
    ASSERT_OK(ToAbsl(s->stub().GatherTokens(ctx.get(), req, &response)));
    EXPECT_EQ(response.outputs_size(), 0);  // written into the buffer
    std::vector<float> out(g.b * g.r * g.c);
    std::memcpy(out.data(), shm.data() + kOutOffset, out.size() * sizeof(float));
    EXPECT_EQ(out, g.Expected());
  }
  {
    v1::UnregisterBufferRequest req;
    req.set_name("arena");
    auto ctx = InProcessServer::Context(session);
    v1::UnregisterBufferResponse response;
    ASSERT_OK(ToAbsl(s->stub().UnregisterBuffer(ctx.get(), req, &response)));
    auto ctx2 = InProcessServer::Context(session);
    EXPECT_THAT(ToAbsl(s->stub().UnregisterBuffer(ctx2.get(), req, &response)),
                StatusIs(absl::StatusCode::kNotFound));
  }
}

TEST(ServerTest, RegisterWithoutSourceNamesTheField) {
  auto s = StartServer();
  ASSERT_NE(s, nullptr);
  const std::string session = s->OpenSession();
  v1::RegisterBufferRequest req;
  req.set_name("x");
  auto ctx = InProcessServer::Context(session);
  v1::RegisterBufferResponse response;
  EXPECT_THAT(ToAbsl(s->stub().RegisterBuffer(ctx.get(), req, &response)),
              StatusIs(absl::StatusCode::kInvalidArgument, "source"));
}

TEST(ServerTest, ExecuteRunsOpsInOrderAndRefusesEventsOnCpu) {
  auto s = StartServer();
  ASSERT_NE(s, nullptr);
  const std::string session = s->OpenSession();
  const GatherCase a({0, 1, 2, 3}), b({4, 4, 1, 0});
  v1::ExecuteRequest req;
  *req.add_ops()->mutable_gather_tokens() = a.InlineRequest();
  *req.add_ops()->mutable_gather_tokens() = b.InlineRequest();
  {
    auto ctx = InProcessServer::Context(session);
    v1::ExecuteResponse response;
    ASSERT_OK(ToAbsl(s->stub().Execute(ctx.get(), req, &response)));
    ASSERT_EQ(response.results_size(), 2);
    EXPECT_EQ(FromBytes<float>(response.results(0).outputs(0).tensor().inline_data()),
              a.Expected());
    EXPECT_EQ(FromBytes<float>(response.results(1).outputs(0).tensor().inline_data()),
              b.Expected());
  }
  {
    req.add_ops();  // ops[2] without an operator
    auto ctx = InProcessServer::Context(session);
    v1::ExecuteResponse response;
    EXPECT_THAT(ToAbsl(s->stub().Execute(ctx.get(), req, &response)),
                StatusIs(absl::StatusCode::kInvalidArgument, "ops[2]"));
  }
  req.mutable_ops()->RemoveLast();
  req.set_wait_event(std::string(64, '\0'));
  auto ctx = InProcessServer::Context(session);
  v1::ExecuteResponse response;
  EXPECT_THAT(ToAbsl(s->stub().Execute(ctx.get(), req, &response)),
              StatusIs(absl::StatusCode::kFailedPrecondition, "CUDA IPC events need the cuda"));
}

TEST(ServerTest, HealthAndReflection) {
  auto s = StartServer();
  ASSERT_NE(s, nullptr);
  absl::StatusOr<int> overall = HealthCheck(s->channel(), "");
  ASSERT_OK(overall);
  EXPECT_EQ(*overall, kServing);
  absl::StatusOr<int> service = HealthCheck(s->channel(), "tokensel.v1.TokenSelect");
  ASSERT_OK(service);
  EXPECT_EQ(*service, kServing);
  EXPECT_THAT(HealthCheck(s->channel(), "no.such.Service"), StatusIs(absl::StatusCode::kNotFound));

  absl::StatusOr<std::vector<std::string>> services = ReflectionListServices(s->channel());
  ASSERT_OK(services);
  EXPECT_THAT(*services, Contains("tokensel.v1.TokenSelect"));
  EXPECT_THAT(*services, Contains("grpc.health.v1.Health"));
}

TEST(ServerTest, FullAdmissionIsResourceExhaustedRightAway) {
  ServerOptions options;
  options.max_inflight = 1;
  auto s = StartServer(options);
  ASSERT_NE(s, nullptr);
  const std::string session = s->OpenSession();
  const GatherCase g({0, 1, 2, 3});
  {
    // The test takes the only slot, as a long op would.
    absl::StatusOr<core::Admission::Ticket> held = s->server().admission().Admit();
    ASSERT_OK(held);
    auto ctx = InProcessServer::Context(session);
    v1::OpResponse response;
    EXPECT_THAT(ToAbsl(s->stub().GatherTokens(ctx.get(), g.InlineRequest(), &response)),
                StatusIs(absl::StatusCode::kResourceExhausted));
  }
  auto ctx = InProcessServer::Context(session);
  v1::OpResponse response;
  EXPECT_OK(ToAbsl(s->stub().GatherTokens(ctx.get(), g.InlineRequest(), &response)));
  EXPECT_EQ(s->server().admission().inflight(), 0u);
}

TEST(ServerTest, DrainingIsNotServingAndUnavailable) {
  auto s = StartServer();
  ASSERT_NE(s, nullptr);
  const std::string session = s->OpenSession();
  absl::StatusOr<core::Admission::Ticket> held = s->server().admission().Admit();
  ASSERT_OK(held);
  // Shutdown waits (up to the grace period) for the held request.
  std::thread shutdown([&] { s->server().Shutdown(absl::Seconds(30)); });
  while (!s->server().admission().draining()) std::this_thread::yield();
  // Health flips before draining starts.
  absl::StatusOr<int> health = HealthCheck(s->channel(), "tokensel.v1.TokenSelect");
  ASSERT_OK(health);
  EXPECT_EQ(*health, kNotServing);
  auto ctx = InProcessServer::Context(session);
  v1::OpResponse response;
  EXPECT_THAT(ToAbsl(s->stub().GatherTokens(ctx.get(), GatherCase({0, 0, 0, 0}).InlineRequest(),
                                            &response)),
              StatusIs(absl::StatusCode::kUnavailable));
  *held = core::Admission::Ticket();  // the in-flight request finishes
  shutdown.join();
  EXPECT_EQ(s->server().sessions().count(), 0u);
}

// The value of `name{labels}` in the server's registry, or -1.
double MetricValue(Server& server, const std::string& name, const std::string& method,
                   const std::string& code) {
  for (const prometheus::MetricFamily& family : server.metrics().registry()->Collect()) {
    if (family.name != name) continue;
    for (const prometheus::ClientMetric& metric : family.metric) {
      bool m = false, c = false;
      for (const prometheus::ClientMetric::Label& label : metric.label) {
        m |= label.name == "method" && label.value == method;
        c |= label.name == "code" && label.value == code;
      }
      if (m && c) {
        return family.type == prometheus::MetricType::Histogram
                   ? static_cast<double>(metric.histogram.sample_count)
                   : metric.counter.value;
      }
    }
  }
  return -1;
}

TEST(ServerTest, EveryRpcIsCountedByMethodAndCode) {
  ServerOptions options;
  options.metrics_address = "127.0.0.1:0";
  auto s = StartServer(options);
  ASSERT_NE(s, nullptr);
  EXPECT_THAT(s->server().metrics_address(), HasSubstr("127.0.0.1:"));
  EXPECT_NE(s->server().metrics_address(), "127.0.0.1:0");
  for (int i = 0; i < 3; ++i) {
    grpc::ClientContext ctx;
    v1::PingResponse response;
    ASSERT_OK(ToAbsl(s->stub().Ping(&ctx, v1::PingRequest(), &response)));
  }
  grpc::ClientContext ctx;
  v1::KeepAliveResponse response;
  (void)s->stub().KeepAlive(&ctx, v1::KeepAliveRequest(), &response);
  EXPECT_EQ(MetricValue(s->server(), "tokensel_requests_total", "Ping", "OK"), 3);
  EXPECT_EQ(MetricValue(s->server(), "tokensel_rpc_duration_seconds", "Ping", "OK"), 3);
  EXPECT_EQ(MetricValue(s->server(), "tokensel_requests_total", "KeepAlive", "INVALID_ARGUMENT"),
            1);
}

TEST(ServerTest, UnixSocketIsGroupOnlyAndRemovedOnShutdown) {
  auto s = StartServer();
  ASSERT_NE(s, nullptr);
  const std::string path = s->address().substr(std::string("unix://").size());
  struct stat st;
  ASSERT_EQ(::lstat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  s->server().Shutdown(absl::Seconds(5));
  EXPECT_NE(::lstat(path.c_str(), &st), 0);
}

}  // namespace
}  // namespace tokensel::server
