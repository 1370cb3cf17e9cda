// Execute's CUDA IPC events through the gRPC handler (issue 12 item 8),
// without a device: an in-process server whose backend is ChainBackend over
// FakeStreamDevice (tests/server/backends/stream_chain_test.h), owned by
// the test, which lets the fake device progress and polls its completion
// queue between calls (the RPCs are sequential: the fake is never used by
// two threads at once). What the handler adds to RunChain: the handle size
// check, the session's deferred error returned by its next Execute (which
// runs nothing), and the no-op Execute that waits for the session's async
// work within its deadline.
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/backends/stream_chain_test.h"
#include "tests/server/grpc/grpc_test_util.h"
#include "tests/testing/eventually.h"
#include "tests/testing/status_matchers.h"

namespace tokensel::server::testing {
namespace {

using ::tokensel::testing::ChainBackend;
using ::tokensel::testing::FakeStreamDevice;
using ::tokensel::testing::LeasePools;
using ::tokensel::testing::StatusIs;

// The server's backend: forwards to the test's ChainBackend.
class Forward final : public core::Backend {
 public:
  explicit Forward(ChainBackend* b) : b_(b) {}
  absl::string_view name() const override { return "cuda"; }
  core::IpcEventSupport ipc_events() const override { return b_->ipc_events(); }
  bool CanAccess(core::MemoryKind kind) const override { return b_->CanAccess(kind); }
  absl::StatusOr<std::unique_ptr<core::RequestLease>> BeginRequest() override {
    return b_->BeginRequest();
  }
  absl::StatusOr<std::unique_ptr<core::RequestChain>> BeginChain(const std::string& session,
                                                                 const core::IpcEvents& events,
                                                                 bool async) override {
    return b_->BeginChain(session, events, async);
  }
  void BeginSession(const std::string& session) override { b_->BeginSession(session); }
  void EndSession(const std::string& session) override { b_->EndSession(session); }
  void AbandonPendingWork() override { b_->AbandonPendingWork(); }
  absl::StatusOr<std::unique_ptr<Staging>> AllocateStaging(uint64_t bytes) override {
    return b_->AllocateStaging(bytes);
  }
  absl::Status CopyToStaging(const Staging& dst, const void* src, uint64_t bytes) override {
    return b_->CopyToStaging(dst, src, bytes);
  }
  absl::Status CopyFromStaging(void* dst, const Staging& src, uint64_t bytes) override {
    return b_->CopyFromStaging(dst, src, bytes);
  }
  absl::Status RunOp(core::OpArgs args) override { return b_->RunOp(args); }
  uint64_t OpScratchBytes(core::OpArgs args) const override { return b_->OpScratchBytes(args); }

 private:
  ChainBackend* const b_;
};

class ServerEventsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions options;
    options.make_backend = [this]() -> absl::StatusOr<std::unique_ptr<core::Backend>> {
      return std::unique_ptr<core::Backend>(new Forward(&backend_));
    };
    absl::StatusOr<std::unique_ptr<InProcessServer>> s = InProcessServer::Start(std::move(options));
    ASSERT_OK(s);
    server_ = *std::move(s);
    session_ = server_->OpenSession();
  }
  absl::Status Execute(const v1::ExecuteRequest& req, v1::ExecuteResponse* response,
                       std::chrono::milliseconds deadline = std::chrono::seconds(30)) {
    auto ctx = InProcessServer::Context(session_);
    ctx->set_deadline(std::chrono::system_clock::now() + deadline);
    return ToAbsl(server_->stub().Execute(ctx.get(), req, response));
  }
  // An async Execute (record_event, no op); the stream it left queued
  // (null if it failed).
  FakeStreamDevice::Stream ExecuteAsync() {
    v1::ExecuteRequest async;
    async.set_record_event(std::string(64, 'r'));
    v1::ExecuteResponse response;
    const absl::Status st = Execute(async, &response);
    EXPECT_OK(st);
    return st.ok() && !device_.log.empty() ? device_.log.back().stream : nullptr;
  }
  // An inline GatherTokens (its output comes back inline: a sync request).
  static v1::ExecuteRequest Gather() {
    v1::ExecuteRequest req;
    v1::GatherTokensRequest* g = req.add_ops()->mutable_gather_tokens();
    *g->mutable_activations() =
        InlineTensor(v1::DTYPE_FLOAT32, {1, 3, 1}, Bytes(std::vector<float>{5, 6, 7}));
    *g->mutable_indices() =
        InlineTensor(v1::DTYPE_INT32, {1, 2}, Bytes(std::vector<int32_t>{2, 0}));
    g->set_batch_first(true);
    return req;
  }

  FakeStreamDevice device_;
  LeasePools pools_{64 << 10, 4 << 20};
  ChainBackend backend_{&device_, pools_.pools(), 64};
  std::unique_ptr<InProcessServer> server_;  // after the backend: destroyed first
  std::string session_;
};

TEST_F(ServerEventsTest, ServerInfoSaysEventsAreServedAndTheCaps) {
  grpc::ClientContext ctx;
  v1::ServerInfo info;
  ASSERT_OK(ToAbsl(server_->stub().GetServerInfo(&ctx, v1::GetServerInfoRequest(), &info)));
  EXPECT_TRUE(info.ipc_events());
  EXPECT_EQ(info.limits().max_async_executes_per_session(), 16u);
  EXPECT_EQ(info.limits().max_async_executes(), 256u);
  EXPECT_EQ(info.limits().max_stuck_executes_per_session(), 8u);
  EXPECT_EQ(info.limits().max_stuck_executes(), 256u);
  EXPECT_EQ(info.limits().max_async_executes_per_peer(), 64u);
  EXPECT_EQ(info.limits().max_stuck_executes_per_peer(), 64u);
}

// The wait caps are the server's options (flags --max_waits_per_session,
// --max_waits_per_peer, --max_waits), reported in ServerInfo.limits; caps
// that do not nest (0 < session <= peer <= server) refuse to start.
TEST_F(ServerEventsTest, TheWaitCapsAreOptionsCheckedAtStart) {
  auto start = [this](uint32_t session, uint32_t peer, uint32_t total) {
    ServerOptions options;
    options.make_backend = [this]() -> absl::StatusOr<std::unique_ptr<core::Backend>> {
      return std::unique_ptr<core::Backend>(new Forward(&backend_));
    };
    options.max_waits_per_session = session;
    options.max_waits_per_peer = peer;
    options.max_waits = total;
    return InProcessServer::Start(std::move(options));
  };
  absl::StatusOr<std::unique_ptr<InProcessServer>> custom = start(3, 5, 7);
  ASSERT_OK(custom);
  grpc::ClientContext ctx;
  v1::ServerInfo info;
  ASSERT_OK(ToAbsl((*custom)->stub().GetServerInfo(&ctx, v1::GetServerInfoRequest(), &info)));
  EXPECT_EQ(info.limits().max_stuck_executes_per_session(), 3u);
  EXPECT_EQ(info.limits().max_stuck_executes_per_peer(), 5u);
  EXPECT_EQ(info.limits().max_stuck_executes(), 7u);
  custom->reset();
  EXPECT_THAT(start(9, 8, 256).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "not 9, 8, 256"));
  EXPECT_THAT(start(0, 8, 256).status(), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(start(8, 64, 63).status(), StatusIs(absl::StatusCode::kInvalidArgument));
}

// The per-peer cap reaches the admission through the gRPC layer (the
// session owner's principal in RunOptions::peer): one peer's sessions together hold at most
// max_async_executes_per_peer (64) in flight, whatever their own caps (16).
TEST_F(ServerEventsTest, OnePeersSessionsTogetherHoldAtMostThePeerCap) {
  std::vector<std::string> sessions = {session_};
  for (int i = 0; i < 4; ++i) sessions.push_back(server_->OpenSession());
  int admitted = 0;
  absl::Status refused;
  v1::ExecuteRequest async;
  async.set_record_event(std::string(64, 'r'));
  for (const std::string& s : sessions) {
    session_ = s;
    for (int i = 0; i < 16; ++i) {
      v1::ExecuteResponse response;
      const absl::Status st = Execute(async, &response);
      if (st.ok()) {
        ++admitted;
      } else {
        refused = st;
      }
    }
  }
  EXPECT_EQ(admitted, 64);
  // The in-process server listens on a unix socket: the peer is this uid.
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kResourceExhausted,
                                absl::StrCat("for peer uid:", getuid(), " (all its sessions)")));
  for (const auto& c : device_.log) device_.Progress(c.stream);
  EXPECT_EQ(backend_.queue().Poll(), 64);
}

TEST_F(ServerEventsTest, AHandleOfTheWrongSizeIsInvalidArgument) {
  v1::ExecuteRequest req = Gather();
  req.set_wait_event("abc");
  v1::ExecuteResponse response;
  EXPECT_THAT(Execute(req, &response),
              StatusIs(absl::StatusCode::kInvalidArgument, "wait_event is 3 bytes"));
  req.clear_wait_event();
  req.set_record_event(std::string(65, 'r'));
  EXPECT_THAT(Execute(req, &response),
              StatusIs(absl::StatusCode::kInvalidArgument, "record_event is 65 bytes"));
  EXPECT_TRUE(device_.log.empty()) << "nothing reached the device";
}

TEST_F(ServerEventsTest, TheNextExecuteReturnsTheDeferredErrorAndRunsNothing) {
  v1::ExecuteRequest async;  // no ops: the stream waits and records only
  async.set_wait_event(std::string(64, 'w'));
  async.set_record_event(std::string(64, 'r'));
  v1::ExecuteResponse response;
  ASSERT_OK(Execute(async, &response));
  // The barrier (no ops, no events) waits for it: here past its deadline.
  EXPECT_THAT(Execute(v1::ExecuteRequest(), &response, std::chrono::milliseconds(100)),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  // The client gave up; the server's handler may still be in its wait for a
  // moment (it checks the call every few ms). Whenever it notices, it must
  // not take the error with it: the test lets the work complete only after
  // the handler is gone, as a real client's next call would come after.
  EXPECT_TRUE(
      tokensel::testing::Eventually([&] { return server_->server().admission().inflight() == 0; }));
  // The device fails the request's work after the reply.
  device_.fail_event_query = true;
  EXPECT_EQ(backend_.queue().Poll(), 1);
  device_.fail_event_query = false;
  const size_t calls = device_.log.size();
  v1::ExecuteRequest gather = Gather();
  EXPECT_THAT(Execute(gather, &response),
              StatusIs(absl::StatusCode::kInternal,
                       "deferred from async Execute #1 of this session: the request's device work "
                       "failed"));
  EXPECT_EQ(device_.log.size(), calls) << "the Execute that reports it runs nothing";
  // Reported once: the same Execute now runs.
  ASSERT_OK(Execute(gather, &response));
  ASSERT_EQ(response.results_size(), 1);
  EXPECT_EQ(FromBytes<float>(response.results(0).outputs(0).tensor().inline_data()),
            (std::vector<float>{7, 5}));
  // The barrier returns at once when nothing is in flight.
  EXPECT_OK(Execute(v1::ExecuteRequest(), &response));
}

TEST_F(ServerEventsTest, TheBarrierReturnsOnceTheSessionsWorkCompleted) {
  v1::ExecuteRequest async;
  async.set_record_event(std::string(64, 'r'));
  v1::ExecuteResponse response;
  ASSERT_OK(Execute(async, &response));
  device_.Progress(device_.log.back().stream);
  EXPECT_EQ(backend_.queue().Poll(), 1);
  EXPECT_OK(Execute(v1::ExecuteRequest(), &response, std::chrono::milliseconds(1000)));
  EXPECT_EQ(pools_.InUse(), 0u);
}

TEST_F(ServerEventsTest, ShutdownWaitsForTheAsyncWorkBeforeTearingDown) {
  const FakeStreamDevice::Stream s = ExecuteAsync();
  ASSERT_NE(s, nullptr);
  // The device gets there later, while the server shuts down (the server's
  // own threads do not touch the fake until the work completed).
  std::thread device([this, s] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    device_.Progress(s);
    backend_.queue().Poll();
  });
  server_.reset();
  EXPECT_EQ(device_.free_streams(), 1u) << "the server waited for the work before going";
  device.join();
}

// A client event that never completes must not hold the server's shutdown
// for ever: after the grace it leaks what the stuck work holds and returns,
// and the backend's completion queue stops waiting too (the item abandoned:
// nothing keeps polling the device while the process exits).
TEST_F(ServerEventsTest, ShutdownGivesUpOnStuckAsyncWorkAfterTheGrace) {
  const FakeStreamDevice::Stream s = ExecuteAsync();
  ASSERT_NE(s, nullptr);
  const auto start = std::chrono::steady_clock::now();
  server_->server().Shutdown(absl::Milliseconds(50));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(backend_.queue().pending(), 0u) << "the queue stopped waiting for it";
  EXPECT_EQ(backend_.queue().abandoned(), 1u);
  server_.reset();
  // The work completing later touches nothing: nobody polls.
  device_.Progress(s);
  EXPECT_EQ(backend_.queue().Poll(), 0);
}

}  // namespace
}  // namespace tokensel::server::testing
