// Session against a real tokensel-server: lifecycle, keep-alive past the
// lease, and Reopen after the server restarts on the same socket.
#include "tokensel/client/session.h"

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
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
}

TEST(SessionTest, KeepAliveOutlivesTheLease) {
  std::unique_ptr<ServerProcess> server = StartServer({"--session_ttl=600ms"});
  ASSERT_NE(server, nullptr);
  const Client client = ConnectTo(server->unix_target());
  absl::StatusOr<std::unique_ptr<Session>> kept = Session::Open(client);
  ASSERT_OK(kept.status());
  absl::StatusOr<std::unique_ptr<Session>> idle = Session::Open(client, {.keep_alive = false});
  ASSERT_OK(idle.status());
  EXPECT_EQ((*kept)->lease_ttl(), absl::Milliseconds(600));

  absl::SleepFor(absl::Milliseconds(2000));  // > 3 leases, no other traffic
  EXPECT_OK((*kept)->client().ListBuffers().status());
  EXPECT_GE((*kept)->keep_alive_count(), 4);  // every ~200 ms
  EXPECT_OK((*kept)->last_keep_alive_status());
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
TEST(SessionTest, ReopenAfterServerRestart) {
  char dir_template[] = "/tmp/tokensel-ct-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr) << std::strerror(errno);
  const std::string dir = dir_template;
  const std::string socket_path = dir + "/stable.sock";
  struct RemoveDir {  // a SIGKILLed server leaves its socket file behind
    ~RemoveDir() {
      unlink(socket.c_str());
      rmdir(dir.c_str());
    }
    std::string socket, dir;
  } remove_dir{socket_path, dir};
  const std::string target = "unix://" + socket_path;
  const std::vector<std::string> args = {"--listen=" + target};

  std::unique_ptr<ServerProcess> server = StartServer(args);
  ASSERT_NE(server, nullptr);
  const Client client = ConnectTo(target, absl::Seconds(20));
  absl::StatusOr<std::unique_ptr<Session>> session = Session::Open(client);
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
  server = StartServer(args);
  ASSERT_NE(server, nullptr);

  EXPECT_THAT((*session)->client().GatherTokens(req).status(),
              StatusIs(absl::StatusCode::kNotFound));
  ASSERT_OK((*session)->Reopen());
  EXPECT_NE((*session)->id(), old_id);
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

}  // namespace
}  // namespace tokensel::client
