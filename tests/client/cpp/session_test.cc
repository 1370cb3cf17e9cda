// Session against a real tokensel-server: lifecycle, keep-alive past the
// lease, manual Reopen after the server restarts on the same socket, and the
// automatic re-open (after a SIGKILLed server is replaced, and after the
// lease runs out), with ops on the re-registered shm buffer checked against
// the CPU oracle (kernels/cpu).
#include "tokensel/client/session.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "tests/server/integration/client_util.h"
#include "tests/testing/http_get.h"
#include "tests/testing/server_process.h"
#include "tests/testing/status_matchers.h"
#include "tokensel/client/client.h"
#include "tokensel/client/shared_region.h"
#include "tokensel/client/tensor_ref.h"

namespace tokensel::client {
namespace {

using ::tokensel::testing::ServerOptions;
using ::tokensel::testing::ServerProcess;
using ::tokensel::testing::StatusIs;

std::unique_ptr<ServerProcess> StartServer(std::vector<std::string> extra_args = {}) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start({.extra_args = std::move(extra_args)});
  EXPECT_OK(server.status());
  return server.ok() ? std::move(server).value() : nullptr;
}

Client ConnectTo(const std::string& target, absl::Duration deadline = absl::Seconds(20)) {
  absl::StatusOr<Client> client = Client::Connect(target, {.deadline = deadline});
  EXPECT_OK(client.status());
  return *client;
}

// A unix socket path that outlives one server process, so that a restarted
// server is reachable under the same target.
class StableSocket {
 public:
  StableSocket() {
    char dir_template[] = "/tmp/tokensel-ct-XXXXXX";
    if (mkdtemp(dir_template) == nullptr) {
      ADD_FAILURE() << "mkdtemp: " << std::strerror(errno);
      return;
    }
    dir_ = dir_template;
    path_ = dir_ + "/stable.sock";
  }
  ~StableSocket() {  // a SIGKILLed server leaves its socket file behind
    unlink(path_.c_str());
    rmdir(dir_.c_str());
  }
  std::string target() const { return "unix://" + path_; }
  std::vector<std::string> args() const { return {"--listen=" + target()}; }

 private:
  std::string dir_, path_;
};

// A GatherTokens of activations and indices that live in registered buffer
// `buffer` (a shm region), with the output inline; Expected() runs the CPU
// oracle on the region's current bytes.
struct GatherCase {
  static constexpr int64_t kB = 2, kS = 64, kC = 16, kR = 24;

  explicit GatherCase(std::string buffer, uint64_t region_bytes) : arena(region_bytes) {
    act = arena.Place(kernels::DType::kFloat32, {kB, kS, kC});
    idx = arena.Place(kernels::DType::kInt32, {kB, kR});
    *req.mutable_activations() = act.Ref(buffer);
    *req.mutable_indices() = idx.Ref(buffer);
    *req.mutable_out() = TensorRef::InlineOutput().ToProto();
    req.set_batch_first(true);
  }
  // New random activations and indices in the region.
  void Fill(uint8_t* base, std::mt19937_64& rng) const {
    itest::FillBytes(base + act.offset, act.extent_bytes, rng);
    itest::FillIndices(idx.View(base), kS, /*unique=*/false, rng);
  }
  std::vector<float> Expected(uint8_t* base) const {
    std::vector<float> out(kB * kR * kC);
    const itest::Placed local_out =
        itest::Arena(out.size() * sizeof(float)).Place(kernels::DType::kFloat32, {kB, kR, kC});
    const absl::Status status =
        kernels::cpu::GatherTokens({act.View(base), idx.View(base),
                                    local_out.View(reinterpret_cast<uint8_t*>(out.data())), true},
                                   nullptr);
    EXPECT_OK(status);
    return out;
  }

  itest::Arena arena;
  itest::Placed act, idx;
  v1::GatherTokensRequest req;
};

// The gathered floats of `response`, compared bytewise (random bytes may be
// NaNs) with the oracle's.
void ExpectSameFloats(const absl::StatusOr<v1::OpResponse>& response,
                      const std::vector<float>& expected) {
  ASSERT_OK(response.status());
  absl::StatusOr<std::vector<float>> got = OutputValues<float>(*response, "out");
  ASSERT_OK(got.status());
  ASSERT_EQ(got->size(), expected.size());
  EXPECT_EQ(0, std::memcmp(got->data(), expected.data(), expected.size() * sizeof(float)));
}

std::optional<double> Gauge(const ServerProcess& server, absl::string_view series) {
  absl::StatusOr<::tokensel::testing::HttpResponse> page =
      ::tokensel::testing::HttpGet(server.metrics_port(), "/metrics");
  if (!page.ok()) return std::nullopt;
  return ::tokensel::testing::MetricValue(page->body, series);
}

TEST(SessionTest, OpenUseClose) {
  std::unique_ptr<ServerProcess> server = StartServer();
  ASSERT_NE(server, nullptr);
  const Client client = ConnectTo(server->unix_target());
  absl::StatusOr<v1::ServerInfo> info = client.GetServerInfo();
  ASSERT_OK(info.status());
  EXPECT_EQ(info->backend(), "cpu");
  EXPECT_EQ(info->shm_prefix(), server->shm_prefix());
  EXPECT_OK(client.Ping());
  // Session calls without a session: the server names the missing metadata.
  EXPECT_THAT(client.ListBuffers().status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "tokensel-session"));

  absl::StatusOr<std::unique_ptr<Session>> session =
      Session::Open(client, {.client_name = "session-test", .lease_ttl = absl::Seconds(30)});
  ASSERT_OK(session.status());
  const std::string id = (*session)->id();
  EXPECT_FALSE(id.empty());
  EXPECT_EQ((*session)->lease_ttl(), absl::Seconds(30));
  EXPECT_EQ((*session)->client().session_id(), id);
  absl::StatusOr<v1::ListBuffersResponse> buffers = (*session)->client().ListBuffers();
  ASSERT_OK(buffers.status());
  EXPECT_EQ(buffers->buffers_size(), 0);

  EXPECT_OK((*session)->Close());
  EXPECT_OK((*session)->Close());  // idempotent
  EXPECT_THAT(client.WithSession(id).ListBuffers().status(), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT((*session)->WaitUntilOpen(absl::Seconds(1)),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT((*session)->Reopen(), StatusIs(absl::StatusCode::kFailedPrecondition));
}

// RegisterCudaVmmFd sends FD_KIND_CUDA_VMM with the device UUID: this CPU
// server has no VMM mapper (whatever the host) and answers
// FAILED_PRECONDITION. Nothing is registered; host memory still registers.
TEST(SessionTest, CudaVmmRegistrationGetsAPreciseError) {
  std::unique_ptr<ServerProcess> server = StartServer();
  ASSERT_NE(server, nullptr);
  const Client client = ConnectTo(server->unix_target());
  absl::StatusOr<std::unique_ptr<Session>> session = Session::Open(client, {});
  ASSERT_OK(session.status());
  const Client& c = (*session)->client();
  const int memfd = memfd_create("vmm-test", MFD_CLOEXEC);
  ASSERT_GE(memfd, 0);
  ASSERT_EQ(ftruncate(memfd, 4096), 0);
  EXPECT_THAT(c.RegisterCudaVmmFd("v", memfd, 0, 4096, "", 0).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "device_uuid"));
  EXPECT_THAT(
      c.RegisterCudaVmmFd("v", memfd, 0, 4096, "GPU-00000000-0000-0000-0000-000000000000", 2 << 20)
          .status(),
      StatusIs(absl::StatusCode::kFailedPrecondition, "cuda_vmm: "));
  // Several allocations: each descriptor goes as FD_KIND_CUDA_VMM (the CPU
  // server refuses the first on arrival); the arguments are checked first.
  const int second = memfd_create("vmm-test-2", MFD_CLOEXEC);
  ASSERT_GE(second, 0);
  using Segment = Client::CudaVmmSegment;
  EXPECT_THAT(
      c.RegisterCudaVmmFds("v", {{memfd, 2 << 20}, {second, 2 << 20}}, 0, 4096, "").status(),
      StatusIs(absl::StatusCode::kInvalidArgument, "device_uuid"));
  EXPECT_THAT(c.RegisterCudaVmmFds("v", std::vector<Segment>{}, 0, 4096,
                                   "GPU-00000000-0000-0000-0000-000000000000")
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "segments"));
  EXPECT_THAT(c.RegisterCudaVmmFds("v", {{memfd, 2 << 20}, {second, 2 << 20}}, 0, 4096,
                                   "GPU-00000000-0000-0000-0000-000000000000")
                  .status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "cuda_vmm: "));
  close(second);
  absl::StatusOr<v1::BufferInfo> host = c.RegisterFd("h", memfd, 0, 4096);
  ASSERT_OK(host.status());
  EXPECT_EQ(host->kind(), "host_shm");
  absl::StatusOr<v1::ListBuffersResponse> buffers = c.ListBuffers();
  ASSERT_OK(buffers.status());
  EXPECT_EQ(buffers->buffers_size(), 1);
  close(memfd);
}

// Counted, not timed: wait (bounded generously) for the renewals that show
// the kept session outlived several leases, and sleep only for a lower bound
// (the idle session's lease must have run out; the server compares times, so
// a late wake-up cannot make that flake).
TEST(SessionTest, KeepAliveOutlivesTheLease) {
  constexpr absl::Duration kTtl = absl::Milliseconds(1500);
  std::unique_ptr<ServerProcess> server = StartServer({"--session_ttl=1500ms"});
  ASSERT_NE(server, nullptr);
  const Client client = ConnectTo(server->unix_target());
  absl::StatusOr<std::unique_ptr<Session>> kept = Session::Open(client);
  ASSERT_OK(kept.status());
  absl::StatusOr<std::unique_ptr<Session>> idle = Session::Open(client, {.keep_alive = false});
  ASSERT_OK(idle.status());
  const absl::Time idle_opened = absl::Now();  // its last contact with the server
  EXPECT_EQ((*kept)->lease_ttl(), kTtl);
  // A renewal begun after the call succeeds.
  EXPECT_OK((*kept)->WaitUntilOpen(absl::Seconds(20)));
  EXPECT_THAT((*idle)->WaitUntilOpen(absl::Seconds(1)),
              StatusIs(absl::StatusCode::kFailedPrecondition, "keep_alive"));

  // 4 renewals (every ~500 ms): more than a lease of nothing but keep-alives.
  for (const absl::Time deadline = absl::Now() + absl::Seconds(60);
       (*kept)->keep_alive_count() < 4 && absl::Now() < deadline;) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_GE((*kept)->keep_alive_count(), 4);
  // And at least a lease plus a margin since the idle session's last call.
  absl::SleepFor(idle_opened + kTtl + absl::Milliseconds(200) - absl::Now());
  EXPECT_OK((*kept)->client().ListBuffers().status());
  EXPECT_OK((*kept)->last_keep_alive_status());
  EXPECT_EQ((*kept)->reopen_count(), 0);
  EXPECT_THAT((*idle)->client().ListBuffers().status(), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ((*idle)->keep_alive_count(), 0);
}

TEST(SessionTest, RegistrationsAreRemembered) {
  std::unique_ptr<ServerProcess> server = StartServer();
  ASSERT_NE(server, nullptr);
  const Client client = ConnectTo(server->unix_target());
  absl::StatusOr<std::unique_ptr<Session>> session = Session::Open(client);
  ASSERT_OK(session.status());
  absl::StatusOr<SharedRegion> region =
      SharedRegion::Create(SharedRegion::UniqueName(server->shm_prefix(), "r"), 4096,
                           {.required_prefix = server->shm_prefix()});
  ASSERT_OK(region.status());
  ASSERT_OK((*session)->RegisterBuffer(region->RegisterRequest("a", 0, 1024)).status());
  ASSERT_OK((*session)->RegisterBuffer(region->RegisterRequest("b", 1024, 1024)).status());
  // A failed registration is not remembered.
  EXPECT_THAT((*session)->RegisterBuffer(region->RegisterRequest("a")).status(),
              StatusIs(absl::StatusCode::kAlreadyExists, "a"));
  ASSERT_EQ((*session)->registrations().size(), 2u);
  EXPECT_OK((*session)->UnregisterBuffer("a"));
  ASSERT_EQ((*session)->registrations().size(), 1u);
  EXPECT_EQ((*session)->registrations()[0].name(), "b");
}

// The server dies (SIGKILL: no cleanup) and a new one starts on the same
// socket path. The old session is gone (NOT_FOUND); Reopen opens a new one
// and re-registers the buffer, and an op on it sees the region's bytes.
// auto_reopen is off so that the NOT_FOUND is deterministic.
TEST(SessionTest, ReopenAfterServerRestart) {
  const StableSocket socket;
  std::unique_ptr<ServerProcess> server = StartServer(socket.args());
  ASSERT_NE(server, nullptr);
  const Client client = ConnectTo(socket.target(), absl::Seconds(20));
  absl::StatusOr<std::unique_ptr<Session>> session = Session::Open(client, {.auto_reopen = false});
  ASSERT_OK(session.status());
  absl::StatusOr<SharedRegion> region =
      SharedRegion::Create(SharedRegion::UniqueName(server->shm_prefix(), "reopen"), 4096,
                           {.required_prefix = server->shm_prefix()});
  ASSERT_OK(region.status());
  const std::vector<float> acts = {0, 1, 2, 3, 10, 11, 12, 13};  // [1, 4, 2]
  std::memcpy(region->data(), acts.data(), acts.size() * sizeof(float));
  ASSERT_OK((*session)->RegisterBuffer(region->RegisterRequest("acts")).status());

  v1::GatherTokensRequest req;
  *req.mutable_activations() =
      TensorRef::InBuffer("acts").Dtype(v1::DTYPE_FLOAT32).Shape({1, 4, 2}).ToProto();
  *req.mutable_indices() = TensorRef::InlineValues<int32_t>({3, 1}, {1, 2}).ToProto();
  *req.mutable_out() = TensorRef::InlineOutput().ToProto();
  const std::vector<float> expected = {12, 13, 2, 3};
  absl::StatusOr<v1::OpResponse> before = (*session)->client().GatherTokens(req);
  ASSERT_OK(before.status());
  EXPECT_EQ(OutputValues<float>(*before, "out").value_or(std::vector<float>{}), expected);

  const std::string old_id = (*session)->id();
  ASSERT_OK(server->Signal(SIGKILL));
  EXPECT_THAT(server->WaitForExit(absl::Seconds(10)).status(),
              StatusIs(absl::StatusCode::kInternal, "signal 9"));
  server = StartServer(socket.args());
  ASSERT_NE(server, nullptr);

  EXPECT_THAT((*session)->client().GatherTokens(req).status(),
              StatusIs(absl::StatusCode::kNotFound));
  ASSERT_OK((*session)->Reopen());
  EXPECT_NE((*session)->id(), old_id);
  EXPECT_EQ((*session)->reopen_count(), 1);
  absl::StatusOr<v1::ListBuffersResponse> buffers = (*session)->client().ListBuffers();
  ASSERT_OK(buffers.status());
  ASSERT_EQ(buffers->buffers_size(), 1);
  EXPECT_EQ(buffers->buffers(0).name(), "acts");
  absl::StatusOr<v1::OpResponse> after = (*session)->client().GatherTokens(req);
  ASSERT_OK(after.status());
  EXPECT_EQ(OutputValues<float>(*after, "out").value_or(std::vector<float>{}), expected);

  session->reset();
  server.reset();
}

// The same restart with no Reopen() call: while no server listens, a call
// with wait_for_ready off fails UNAVAILABLE and the session cannot be
// confirmed open; once a new server listens on the same path the keep-alive
// thread re-opens and re-registers by itself, and ops on the re-registered
// buffer (fresh data written by the owner) match the oracle.
TEST(SessionTest, ReopensByItselfAfterServerRestart) {
  const StableSocket socket;
  std::unique_ptr<ServerProcess> server = StartServer(socket.args());
  ASSERT_NE(server, nullptr);
  const Client client = ConnectTo(socket.target(), absl::Seconds(20));
  absl::StatusOr<std::unique_ptr<Session>> session =
      Session::Open(client, {.keep_alive_interval = absl::Milliseconds(100)});
  ASSERT_OK(session.status());
  constexpr uint64_t kRegionBytes = 64 << 10;
  absl::StatusOr<SharedRegion> region =
      SharedRegion::Create(SharedRegion::UniqueName(server->shm_prefix(), "auto"), kRegionBytes,
                           {.required_prefix = server->shm_prefix()});
  ASSERT_OK(region.status());
  std::mt19937_64 rng(7);
  const GatherCase gather("acts", kRegionBytes);
  gather.Fill(region->data(), rng);
  ASSERT_OK((*session)->RegisterBuffer(region->RegisterRequest("acts")).status());
  ExpectSameFloats((*session)->client().GatherTokens(gather.req), gather.Expected(region->data()));

  const std::string old_id = (*session)->id();
  ASSERT_OK(server->Signal(SIGKILL));
  EXPECT_THAT(server->WaitForExit(absl::Seconds(10)).status(),
              StatusIs(absl::StatusCode::kInternal, "signal 9"));
  EXPECT_THAT((*session)->client().WithWaitForReady(false).GatherTokens(gather.req).status(),
              StatusIs(absl::StatusCode::kUnavailable));
  // Nothing answers, so no renewal can succeed.
  EXPECT_THAT((*session)->WaitUntilOpen(absl::Milliseconds(600)),
              StatusIs(absl::StatusCode::kDeadlineExceeded, "not confirmed open"));
  EXPECT_EQ((*session)->reopen_count(), 0);
  EXPECT_FALSE((*session)->last_keep_alive_status().ok());

  server = StartServer(socket.args());
  ASSERT_NE(server, nullptr);
  ASSERT_OK((*session)->WaitUntilOpen(absl::Seconds(30)));
  EXPECT_EQ((*session)->reopen_count(), 1);
  EXPECT_OK((*session)->last_reopen_status());
  EXPECT_NE((*session)->id(), old_id);
  absl::StatusOr<v1::ListBuffersResponse> buffers = (*session)->client().ListBuffers();
  ASSERT_OK(buffers.status());
  ASSERT_EQ(buffers->buffers_size(), 1);
  EXPECT_EQ(buffers->buffers(0).name(), "acts");
  EXPECT_EQ(buffers->buffers(0).size(), kRegionBytes);
  EXPECT_EQ(Gauge(*server, "tokensel_sessions"), 1.0);
  EXPECT_EQ(Gauge(*server, "tokensel_registered_buffers"), 1.0);
  EXPECT_EQ(Gauge(*server, "tokensel_registered_bytes"), static_cast<double>(kRegionBytes));

  gather.Fill(region->data(), rng);  // the new server reads the live region
  ExpectSameFloats((*session)->client().GatherTokens(gather.req), gather.Expected(region->data()));
  EXPECT_OK((*session)->Close());
  EXPECT_EQ(Gauge(*server, "tokensel_sessions"), 0.0);
}

// A lease that runs out between renewals (interval > lease): the renewal
// finds the session gone and the thread re-opens it with its buffer; with
// auto_reopen off the session stays lost.
TEST(SessionTest, ReopensByItselfAfterTheLeaseRanOut) {
  std::unique_ptr<ServerProcess> server = StartServer({"--session_ttl=1s"});
  ASSERT_NE(server, nullptr);
  const Client client = ConnectTo(server->unix_target());
  const SessionOptions slow = {.keep_alive_interval = absl::Milliseconds(2500)};
  absl::StatusOr<std::unique_ptr<Session>> session = Session::Open(client, slow);
  ASSERT_OK(session.status());
  SessionOptions manual = slow;
  manual.auto_reopen = false;
  absl::StatusOr<std::unique_ptr<Session>> stays_lost = Session::Open(client, manual);
  ASSERT_OK(stays_lost.status());
  constexpr uint64_t kRegionBytes = 64 << 10;
  absl::StatusOr<SharedRegion> region =
      SharedRegion::Create(SharedRegion::UniqueName(server->shm_prefix(), "lease"), kRegionBytes,
                           {.required_prefix = server->shm_prefix()});
  ASSERT_OK(region.status());
  std::mt19937_64 rng(11);
  const GatherCase gather("acts", kRegionBytes);
  gather.Fill(region->data(), rng);
  ASSERT_OK((*session)->RegisterBuffer(region->RegisterRequest("acts")).status());
  const std::string old_id = (*session)->id();

  // The first renewal (2.5 s after Open, past the 1 s lease) answers
  // NOT_FOUND; the re-open is part of the same attempt.
  ASSERT_OK((*session)->WaitUntilOpen(absl::Seconds(30)));
  EXPECT_GE((*session)->reopen_count(), 1);
  EXPECT_NE((*session)->id(), old_id);
  ExpectSameFloats((*session)->client().GatherTokens(gather.req), gather.Expected(region->data()));

  EXPECT_THAT((*stays_lost)->WaitUntilOpen(absl::Seconds(3)),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_EQ((*stays_lost)->reopen_count(), 0);
  EXPECT_THAT((*stays_lost)->last_keep_alive_status(), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_OK((*stays_lost)->Close());  // NOT_FOUND of a lost session is not an error
}

// Registrations from two threads race Reopen() calls from a third and a
// keep-alive thread renewing every 10 ms (readers of id()/client() too):
// every registration that succeeded and was not unregistered is both
// remembered and present in the final server session, nothing else is. A
// registration lost between a re-open's snapshot and its publication, or a
// data race on the session state (run under TSan: label client), fails here.
TEST(SessionTest, ConcurrentRegistrationsAndReopensLoseNothing) {
  std::unique_ptr<ServerProcess> server = StartServer();
  ASSERT_NE(server, nullptr);
  const Client client = ConnectTo(server->unix_target());
  absl::StatusOr<std::unique_ptr<Session>> opened =
      Session::Open(client, {.keep_alive_interval = absl::Milliseconds(10)});
  ASSERT_OK(opened.status());
  Session& session = **opened;
  absl::StatusOr<SharedRegion> region =
      SharedRegion::Create(SharedRegion::UniqueName(server->shm_prefix(), "race"), 4096,
                           {.required_prefix = server->shm_prefix()});
  ASSERT_OK(region.status());

  constexpr int kWriters = 2, kPerWriter = 12, kReopens = 6;
  std::vector<std::vector<std::string>> kept(kWriters);
  std::vector<std::thread> threads;
  for (int w = 0; w < kWriters; ++w) {
    threads.emplace_back([&, w] {
      for (int i = 0; i < kPerWriter; ++i) {
        const std::string name = absl::StrCat("w", w, "-", i);
        const absl::Status registered =
            session.RegisterBuffer(region->RegisterRequest(name, 64 * i, 64)).status();
        EXPECT_OK(registered) << name;
        if (!registered.ok()) continue;
        if (i % 3 == 1) {
          EXPECT_OK(session.UnregisterBuffer(name)) << name;
        } else {
          kept[w].push_back(name);
        }
      }
    });
  }
  threads.emplace_back([&] {
    for (int i = 0; i < kReopens; ++i) {
      EXPECT_OK(session.Reopen());
      EXPECT_FALSE(session.id().empty());
      EXPECT_FALSE(session.client().session_id().empty());
    }
  });
  for (std::thread& t : threads) t.join();

  std::vector<std::string> want;
  for (const std::vector<std::string>& names : kept)
    want.insert(want.end(), names.begin(), names.end());
  std::vector<std::string> remembered;
  for (const v1::RegisterBufferRequest& r : session.registrations()) remembered.push_back(r.name());
  EXPECT_THAT(remembered, ::testing::UnorderedElementsAreArray(want));
  absl::StatusOr<v1::ListBuffersResponse> listed = session.client().ListBuffers();
  ASSERT_OK(listed.status());
  std::vector<std::string> on_server;
  for (const v1::BufferInfo& b : listed->buffers()) on_server.push_back(b.name());
  EXPECT_THAT(on_server, ::testing::UnorderedElementsAreArray(want));
  EXPECT_EQ(session.reopen_count(), kReopens);
  EXPECT_OK(session.WaitUntilOpen(absl::Seconds(20)));
  EXPECT_OK(session.Close());
}

}  // namespace
}  // namespace tokensel::client
